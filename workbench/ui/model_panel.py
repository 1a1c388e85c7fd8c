"""Model panel: summary, opset inventory (table and chart), compatibility with chosen targets, problems."""

from __future__ import annotations

import logging
from typing import Any

import ipywidgets as widgets

from ..compat.probe import probe_onnxruntime
from ..compat.tables import check_model, default_targets, list_targets
from ..plots.inventory import inventory_bar
from .figures import show_figure_after_paint
from .jobs import JobControls
from .messages import error_html, fallback_repr, message_html
from .paint import PaintBeacon
from .state import WorkbenchState
from .style import heading, style_tag
from .tables import kv_html, table_html

log = logging.getLogger(__name__)


class ModelPanel(widgets.VBox):
    """``ModelPanel(model)``: what the model is and which runtimes can take it."""

    def __repr__(self) -> str:
        return fallback_repr(self)

    def __init__(self, model: Any = None, *, state: WorkbenchState | None = None, targets: list[str] | None = None,
                 **load_kwargs: Any) -> None:
        self.state = WorkbenchState.of(model, state=state, **load_kwargs)
        self.summary = widgets.HTML()
        # side by side when there is room, one under the other in a narrow window (the row wraps)
        self.chart = widgets.Output(layout=widgets.Layout(flex="1 1 52%", min_width="320px"))
        self.ops_table = widgets.HTML(layout=widgets.Layout(flex="1 1 40%", min_width="260px"))
        names = [t.name for t in list_targets()]
        chosen = targets or [t.name for t in default_targets()]
        self.targets = widgets.SelectMultiple(options=names, value=[t for t in chosen if t in names], rows=6,
                                              description="targets", layout=widgets.Layout(width="330px"))
        self.check_button = widgets.Button(description="Check", icon="check")
        self.check_button.on_click(lambda _: self.check())
        self.compat = widgets.HTML()
        self.probes = widgets.HTML()
        self.jobs = JobControls()
        self.problems = widgets.HTML()
        self.message = widgets.HTML()
        self.beacon = PaintBeacon()
        self.state.observe(lambda _: self.refresh(), "model")
        super().__init__([
            style_tag(), self.beacon, self.message, self.summary,
            heading("Operator inventory"), widgets.HBox([self.chart, self.ops_table]),
            heading("Compatibility"), widgets.HBox([self.targets, self.check_button]), self.compat,
            heading("Runtime probe (a real session is built)"), self.jobs, self.probes,
            heading("Problems (onnx checker and shape inference)"), self.problems,
        ])
        self.add_class("wb-root")
        self.refresh()

    def refresh(self) -> None:
        """Inspect the state's model and show everything."""
        if self.state.model is None:
            self.message.value = message_html("no model loaded", "warn")
            return
        try:
            found = self.state.inspect()
        except Exception as e:  # noqa: BLE001 - shown in the panel
            self.message.value = error_html(e, "inspecting the model")
            return
        self.message.value = ""
        doc = found.to_json()
        m = doc["model"]
        opsets = ", ".join(f"{d} {v}" for d, v in doc["opset_imports"].items())
        self.summary.value = '<div class="wb-title">' + _esc(m["name"]) + "</div>" + kv_html([
            ("nodes", f"{doc['nodes']}" + (f" ({doc['nodes_total']} with those of its subgraphs)"
                                           if doc["nodes_total"] != doc["nodes"] else "")),
            ("parameters", f"{doc['params']['count']:,} ({doc['params']['bytes'] / 1e6:.2f} MB)"),
            ("opset imports", opsets), ("IR version", doc["ir_version"]),
            ("producer", f"{doc['producer']['name']} {doc['producer']['version']}".strip() or "–"),
            ("inputs", "; ".join(f"{i['name']}: {i['dtype']} {i['shape']}" for i in doc["inputs"])),
            ("outputs", "; ".join(f"{o['name']}: {o['dtype']} {o['shape']}" for o in doc["outputs"])),
            ("sha256", m["sha256"]), ("file", m["path"] or m["source"]),
        ])
        show_figure_after_paint(self.chart, inventory_bar(found), self.beacon)
        self.ops_table.value = table_html(
            ["op_type", "domain", "count", "since", "deprecated"],
            [(r["op_type"], r["domain"], r["count"], r["since_version"], r["deprecated"]) for r in doc["ops"]],
            classes=["bad" if r["deprecated"] else "" for r in doc["ops"]])
        self._show_compat(doc["compatibility"])
        self.probe()
        problems = doc["problems"]
        self.problems.value = table_html(
            ["severity", "code", "message", "node"],
            [(p["severity"], p["code"], p["message"], p.get("node")) for p in problems],
            classes=["bad" if p["severity"] == "error" else "" for p in problems], empty="no problems found")

    def probe(self):
        """Build a real ONNX Runtime session on a thread and show whether it accepts the model."""
        found = self.state.inspect()
        if found.probes:
            self._show_probes(found.probes)
            return None
        self.probes.value = message_html("building an ONNX Runtime session...", "info")

        def done(result):
            found.probes.append(result)
            self._show_probes(found.probes)

        return self.jobs.start("runtime probe", lambda _p, _c: probe_onnxruntime(found.model.proto), done)

    def _show_probes(self, probes: list) -> None:
        rows = [p.to_json() for p in probes]
        self.probes.value = table_html(
            ["runtime", "version", "accepts", "error", "rejected node"],
            [(p["runtime"], p["version"], p["ok"], p.get("error"), p.get("rejected_node")) for p in rows],
            classes=["bad" if p["ok"] is False else "" for p in rows], empty="no runtime probe")

    def wait(self, timeout: float | None = None) -> bool:
        return self.jobs.wait(timeout)

    def check(self) -> None:
        """Check the model against the selected targets."""
        try:
            reports = check_model(self.state.require_model().proto, list(self.targets.value))
        except Exception as e:  # noqa: BLE001 - shown in the panel
            self.compat.value = error_html(e, "the compatibility check")
            return
        self._show_compat([r.to_json() for r in reports])

    def _show_compat(self, rows: list[dict]) -> None:
        self.compat.value = table_html(
            ["target", "ok", "model opset", "max opset", "unsupported ops", "opset problems"],
            [(c["target"], c["ok"], c["model_opset"], c["max_opset"],
              ", ".join(f"{u['op_type']} x{u['count']}" for u in c["unsupported"]),
              "; ".join(c.get("opset_problems") or [])) for c in rows],
            classes=["" if c["ok"] else "bad" for c in rows], empty="no targets selected")


def _esc(text: Any) -> str:
    import html

    return html.escape(str(text))
