"""Human-readable rendering of an :class:`~workbench.inspection.Inspection` for the CLI."""

from __future__ import annotations

from .inspection import Inspection
from .textfmt import human_bytes, printable, safe_name, table


def _shape(shape) -> str:
    return "?" if shape is None else "[" + ",".join("?" if d is None else str(d) for d in shape) + "]"


def render(result: Inspection) -> str:
    """The CLI's default output: summary, I/O, op inventory, compatibility, probe, problems."""
    doc = result.to_json()
    m = doc["model"]
    lines = [
        f"{printable(m['name'])}  sha256 {m['sha256'][:16]}  IR {doc['ir_version']}  "
        f"producer {printable(doc['producer']['name'] or '?')} {printable(doc['producer']['version'] or '')}".rstrip(),
        f"nodes: {doc['nodes']}"
        + (f" ({doc['nodes_total']} with those of its subgraphs)" if doc["nodes_total"] != doc["nodes"] else "")
        + "   "
        f"params: {doc['params']['count']:,} ({human_bytes(doc['params']['bytes'])})",
        "opsets: " + ", ".join(f"{printable(d)} {v}" for d, v in sorted(doc["opset_imports"].items())),
    ]
    if m["external_data"]:
        lines.append("external data: " + ", ".join(m["external_data"]))
    if m["export"]:
        e = m["export"]
        lines.append(f"exported by torch {e['torch_version']} ({e['exporter']} exporter): "
                     f"opset {e['actual_opset']} (asked {e['requested_opset']})")
    for label in ("inputs", "outputs"):
        lines.append(f"{label}:")
        lines += [f"  {printable(t['name'])}  {t['dtype'] or '?'}  {_shape(t['shape'])}" for t in doc[label]]
    lines += ["", "operators:", table(
        ["op_type", "domain", "count", "since", "in subgraphs", "deprecated"],
        [[r["op_type"], r["domain"], r["count"], r["since_version"], r["in_subgraphs"] or None,
          "yes" if r["deprecated"] else None] for r in doc["ops"]],
    )]
    if doc["subgraphs"]:
        lines += ["", "subgraphs:", table(["node", "op_type", "attribute", "nodes", "depth"], [
            [s["node"], s["op_type"], s["attribute"], s["nodes"], s["depth"]] for s in doc["subgraphs"]])]
    if doc["compatibility"]:
        rows = []
        for c in doc["compatibility"]:
            missing = ", ".join(f"{safe_name(u['op_type'])}" for u in c.get("unsupported", [])) or None
            top = c.get("max_opset")
            rows.append([c["target"], f"{c.get('model_opset')}/{top if top is not None else '?'}",
                         "yes" if c["ok"] else "NO", missing, "; ".join(c.get("opset_problems") or []) or None])
        lines += ["", "compatibility (from the package's tables):",
                  table(["target", "opset/max", "ok", "unsupported ops", "other problems"], rows)]
    for p in doc["probes"]:
        verdict = "ok" if p["ok"] else ("not installed" if p["ok"] is None else "REJECTED")
        where = f" at node {p['rejected_node']!r} ({p['rejected_op_type']})" if p.get("rejected_node") else ""
        used = f" [{', '.join(p.get('providers_used') or [])}]" if p.get("providers_used") else ""
        lines.append(f"probe: {p['runtime']} {p.get('version') or ''}{used}: {verdict}{where}")
        if p.get("error") and not p["ok"]:
            lines.append(f"  {printable(p['error'])}")
    lines += ["", f"problems: {len(doc['problems']) or 'none'}"]
    lines += [f"  {p['severity']:<7} {p['code']}: {printable(p['message'])}"
              + (f" [{printable(p['node'])}]" if p["node"] else "")
              for p in doc["problems"]]
    return "\n".join(lines)
