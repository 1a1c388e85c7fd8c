"""Reduce a divergence to a standalone bug report: the smallest subgraph around the culprit, on both sides.

``reduce(model, "ort", "ort:fp16", out="bug/")`` compares the two sides, takes the top harmful culprit (or
``node=``) and writes into ``bug/``:

- ``reference.onnx``: the reference node(s) alone; their non-constant inputs become graph inputs, initializers
  and Constant inputs are embedded (no external data);
- ``candidate.onnx``: the candidate's computation of the same tensor(s) from the same boundary: the node plus
  whatever the candidate inserted around it (Casts, Q/DQ), from the precision variant or the user's own file
  (:func:`workbench.compare.isolate.build_isolation`), its inputs renamed to the reference's tensor names;
- ``inputs.npz``: the reference's values of those inputs; ``expected.npz``: the reference's values of the
  outputs;
- ``README.md``: versions, the command, the node(s), the measured divergence and a Python snippet that needs
  only onnxruntime and numpy.

The pair is checked exactly as the README does it: fresh ONNX Runtime CPU sessions (default options) from the
written files, fed ``inputs.npz`` cast to each model's declared input types, compared with ``expected.npz`` and
with each other under the comparison's criterion. When the node alone does not reproduce, the subgraph grows
one producer at a time (the one feeding the input with the worst received error) up to ``max_nodes`` reference
nodes. A candidate engine other than ONNX Runtime runs ``candidate.onnx`` in the check (the README says which
engine shows the divergence and what ONNX Runtime CPU gives).
"""

from .._lazy import callable_package
from .api import Attempt, ReduceResult, check_out, command_line, reduce
from .common import FILES, SCHEMA, ReduceError
from .files import npz_bytes, run_ort
from .readme import readme, snippet

__all__ = ["FILES", "SCHEMA", "Attempt", "ReduceError", "ReduceResult", "check_out", "command_line", "npz_bytes",
           "readme", "reduce", "run_ort", "snippet"]
callable_package(__name__, "workbench.reduce.api", "reduce")  # workbench.reduce(...)
