"""``compare()``: where (first divergent tensor) and why (which node introduces the error) two runs part ways.

The setup lives in :class:`~workbench.compare.plan.ComparisonPlan` and the options in
:class:`~workbench.compare.options.CompareOptions`; ``compare()`` is the keyword-friendly front door.
"""

from __future__ import annotations

import threading
from typing import Any

from ..core.arguments import checked
from ..core.feeds import cast_feeds  # noqa: F401 - re-exported (older callers import it from here)
from ..core.progress import Progress
from ..core.shapes import infer_shapes_lenient  # noqa: F401 - re-exported
from ..engines.base import Engine
from ..engines.spec import EngineSpec
from .options import MODES, CompareOptions  # noqa: F401 - MODES re-exported
from .plan import ComparisonPlan, make_engine  # noqa: F401 - make_engine re-exported
from .result import CompareResult


@checked()
def compare(
    model: Any,
    reference: str | EngineSpec = "ort",
    candidate: str | EngineSpec = "ort:fp16",
    options: CompareOptions | dict | None = None,
    *,
    feeds: Any = None,
    cand_model: Any = None,
    example_inputs: Any = None,
    progress: Progress | None = None,
    cancel: threading.Event | None = None,
    reference_engine: Engine | None = None,
    candidate_engine: Engine | None = None,
    **option_overrides: Any,
) -> CompareResult:
    """Compare ``reference`` and ``candidate`` (``ENGINE[:VARIANT]`` specs) on ``model`` layer by layer.

    ``feeds``: a dict, a list of dicts, a .npz, a folder of .npz or a Polygraphy inputs JSON (random seeded
    feeds when None). ``cand_model``: the candidate runs this file instead (the user's own FP16/QDQ export;
    tensors matched by name; its precision is read from the file). ``options``: a :class:`CompareOptions` (or
    its fields as keywords: ``mode``, ``criterion``, ``memory_budget``, ``seed``, ``feed_count``,
    ``input_shapes``, ``val_ranges``, ``keep_fp32``, ``calibration_feeds``, ``culprits``, ``max_culprits``,
    ``impact``, ``fail_on_internal_dips``, ``isolate``, ``timeout_s``, ``engine_options``, ``stream``, ...).
    ``stream``: "auto" (default; when the model file's weights exceed the memory budget), "on" or "off": compare
    segment by segment, never holding the model (:mod:`workbench.compare.stream`; ``segment_size`` caps the weights
    of one segment).

    The verdict is about the outputs: ``result.diverged`` when a graph output fails the criterion (default: that
    of the lossier side's inferred precision) beyond its precision floor, or holds inf/NaN the reference does not.
    Internal tensors under the criterion while the outputs pass are internal dips. Culprits: every node also runs
    alone on the candidate with the reference's inputs; nodes are ranked by the error they introduce beyond their
    floor, and the top ones (``impact``) by what fixing each gains on the outputs (harmless ones rank last).
    A ``torch.nn.Module`` model needs ``example_inputs``: it is exported and the ``torch`` engine runs the module.
    ``reference_engine``/``candidate_engine``: an :class:`Engine` instance used instead of the one the spec names
    (the spec still picks the variant), e.g. a recorded Polygraphy run (:mod:`workbench.report.recorded`).
    """
    opts = CompareOptions.build(options, **option_overrides)
    if reference_engine is None and candidate_engine is None and example_inputs is None:
        from .stream import StreamPlan, should_stream

        if should_stream(model, reference, candidate, cand_model, opts):
            return StreamPlan(model, reference, candidate, feeds=feeds, options=opts).run(progress=progress,
                                                                                            cancel=cancel)
    plan = ComparisonPlan(model, reference, candidate, feeds=feeds, cand_model=cand_model, options=opts,
                          example_inputs=example_inputs, reference_engine=reference_engine,
                          candidate_engine=candidate_engine)
    plan.release_weights()  # sessions map the weights written once; the result's plan keeps only skeletons
    return plan.run(progress=progress, cancel=cancel)
