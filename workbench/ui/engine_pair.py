"""The reference/candidate engine pickers the Compare and Repair panels share, and what they say about a choice."""

from __future__ import annotations

import ipywidgets as widgets

VARIANTS = ("fp32", "fp16", "int8")


def spec(engine: str, variant: str) -> str:
    """``ENGINE[:VARIANT]`` as the core takes it."""
    return engine if variant == "fp32" else f"{engine}:{variant}"


def pickable(given: str, side: str, default: str) -> tuple[str, str | None]:
    """(the spec the pickers can show for ``given``, why it was replaced or None). Variants are read in any case
    (``ort:FP16``); an engine or variant the pickers do not have falls back to ``default``, said in one line."""
    from ..engines import available_engines

    engines = [e["name"] for e in available_engines()]
    engine, _, variant = str(given).strip().partition(":")
    variant = variant.strip().lower() or "fp32"
    if engine not in engines:
        return default, (f"unknown {side} engine {engine!r} (in {given!r}): using {default}; pick one of "
                         f"{', '.join(engines)}")
    if variant not in VARIANTS:
        used = spec(engine, "fp32") if side == "reference" else default
        return used, (f"unknown {side} variant {variant!r} (in {given!r}): using {used}; the variants are "
                      f"{', '.join(VARIANTS)}")
    return spec(engine, variant), None


class EnginePair:
    """Four dropdowns (reference engine and variant, candidate engine and variant), filled from what is installed
    here; :meth:`problems` lists why the chosen pair cannot run (an engine unavailable, a variant the engine does
    not have, from each engine's own declared variants)."""

    def __init__(self, reference: str, candidate: str):
        from ..engines import available_engines

        self.engines = {e["name"]: e for e in available_engines()}
        reference = pickable(reference, "reference", "ort")[0]  # what the pickers can show (Workbench says why)
        candidate = pickable(candidate, "candidate", "ort:fp16")[0]
        ref_engine, _, ref_variant = reference.partition(":")
        cand_engine, _, cand_variant = candidate.partition(":")
        self.ref_engine = self._picker("reference", ref_engine)
        self.ref_variant = widgets.Dropdown(options=VARIANTS, value=ref_variant or "fp32",
                                            layout=widgets.Layout(width="90px"))
        self.cand_engine = self._picker("candidate", cand_engine)
        self.cand_variant = widgets.Dropdown(options=VARIANTS, value=cand_variant or "fp32",
                                             layout=widgets.Layout(width="90px"))

    def _picker(self, label: str, value: str) -> widgets.Dropdown:
        options = [(name if e["available"] else f"{name} (not available here)", name)
                   for name, e in self.engines.items()]
        return widgets.Dropdown(options=options, value=value if value in self.engines else "ort", description=label,
                                layout=widgets.Layout(width="330px"))

    @property
    def reference(self) -> str:
        return spec(self.ref_engine.value, self.ref_variant.value)

    @property
    def candidate(self) -> str:
        return spec(self.cand_engine.value, self.cand_variant.value)

    def set(self, reference: str, candidate: str) -> list[str]:
        """Show ``reference`` and ``candidate`` in the pickers; the lines saying what they could not show."""
        said = []
        for side, given, default, engine, variant in (
                ("reference", reference, "ort", self.ref_engine, self.ref_variant),
                ("candidate", candidate, "ort:fp16", self.cand_engine, self.cand_variant)):
            shown, why = pickable(given, side, default)
            if why:
                said.append(why)
            name, _, var = shown.partition(":")
            engine.value, variant.value = name, var or "fp32"
        return said

    def observe(self, handler) -> None:
        for w in (self.ref_engine, self.ref_variant, self.cand_engine, self.cand_variant):
            w.observe(handler, "value")

    def problems(self, model=None, *, candidate_variant: bool = True) -> list[str]:
        """Why the chosen pair cannot run here on ``model`` (a LoadedModel; empty: it can). ``candidate_variant``
        False: the candidate variant picker is ignored (the user's own candidate file is already the variant)."""
        chosen = dict.fromkeys([self.ref_engine.value, self.cand_engine.value])
        out = [f"{name}: {self.engines[name]['reason']}" for name in chosen if not self.engines[name]["available"]]
        if "torch" in chosen and model is not None and getattr(model, "source", None) != "torch":
            out.append("torch: runs torch.nn.Module models only; this model was loaded from ONNX (pick ort, ref or "
                       "openvino, or load the nn.Module)")
        sides = [(self.ref_engine.value, self.ref_variant.value)]
        if candidate_variant:
            sides.append((self.cand_engine.value, self.cand_variant.value))
        for engine, variant in sides:
            variants = self.engines[engine].get("variants") or VARIANTS
            if variant not in variants:
                hint = " (use ort:int8)" if engine == "ref" and variant == "int8" else ""
                out.append(f"{engine}: the engine has no {variant} variant; it runs {', '.join(variants)}{hint}")
        return out


class PairedPanel:
    """A panel that picks its reference and candidate with an :class:`EnginePair` in ``self.pair``, and optionally
    runs the user's own candidate file (``self.cand_file``, made by :meth:`_make_cand_file`): with a file, the
    candidate is its engine alone, the file's own precision wins over the precision picker (as Compare does)."""

    pair: EnginePair
    cand_file: widgets.Text | None = None

    def _make_cand_file(self) -> widgets.Text:
        self.cand_file = widgets.Text(description="cand. file", placeholder="your own candidate .onnx (optional): "
                                      "the candidate engine runs this file", layout=widgets.Layout(width="520px"))
        return self.cand_file

    @property
    def reference(self) -> str:
        return self.pair.reference

    @property
    def candidate(self) -> str:
        """The candidate spec; with a candidate file, its engine alone (the file is already the variant)."""
        return self.pair.cand_engine.value if self._cand_text() else self.pair.candidate

    def _cand_text(self) -> str:
        return self.cand_file.value.strip() if self.cand_file is not None else ""

    def candidate_file(self) -> str | None:
        """The candidate file typed (or uploaded), checked to be a file, or None; a bad path is one line in the
        panel's words."""
        from pathlib import Path

        from ..errors import InputError
        from ..textfmt import printable

        text = self._cand_text()
        if not text:
            return None
        path = Path(text).expanduser()
        if not path.is_file():  # a folder, a FIFO or a device is not "not found": say which
            shown = printable(str(path))
            shown = shown if len(shown) <= MAX_NAME_SHOWN else shown[:MAX_NAME_SHOWN - 3] + "..."
            what = ("not found: it is a folder, not a file" if path.is_dir() else
                    "not found: it is not a regular file (a pipe, device or socket)" if path.exists() else "not found")
            raise InputError(f"candidate file {shown} {what}", "type the path of your converted .onnx, or upload it")
        return str(path)

    def pair_problems(self, model=None) -> list[str]:
        """Why the chosen pair cannot run (the candidate precision picker ignored while a file is chosen)."""
        return self.pair.problems(model, candidate_variant=not self._cand_text())


#: the longest candidate file name shown in a message
MAX_NAME_SHOWN = 120
