"""The standalone models of a reduction: the isolated nodes cut out with their inputs, constants folded, names
and types made plain."""

from __future__ import annotations

import logging

import numpy as np
import onnx
from onnx import TensorProto, helper

from ..compare.isolate import IsolationModel
from ..model.walk import subgraphs_of
from .common import _ISO_PREFIX, _NUMPY_TYPES, ReduceError

log = logging.getLogger(__name__)

def _constant_outputs(model: onnx.ModelProto) -> set[str]:
    return {o for n in model.graph.node if n.op_type == "Constant" and not n.domain for o in n.output if o}


def _extra_outputs(iso: IsolationModel, side_targets: list[str], ref_targets: list[str]) -> dict[str, str]:
    """Isolation tensor -> reference target name, for every target the single segment computes (the first is
    its output; the others are further outputs of the same nodes)."""
    produced = {o for n in iso.model.graph.node for o in n.output if o}
    prefix = next(iter(iso.outputs)).split("::", 1)[0] + "::" if iso.outputs else ""
    kept = {}
    for side, ref in zip(side_targets, ref_targets):
        if prefix + side in produced:
            kept[prefix + side] = ref
    return kept


def _spec(name: str, arrays: list[np.ndarray]) -> tuple[np.dtype, list[int | str]]:
    """The dtype and shape of a tensor's values over the feeds: dims that differ between feeds are symbolic."""
    shapes = {np.shape(a) for a in arrays}
    first = np.shape(arrays[0])
    if len(shapes) == 1:
        return np.asarray(arrays[0]).dtype, list(first)
    if len({len(s) for s in shapes}) > 1:
        raise ReduceError(f"tensor {name!r} changes rank between feeds", "reduce with one feed (--feeds 1)")
    dims = [d if all(s[i] == d for s in shapes) else f"{name}:{i}" for i, d in enumerate(first)]
    return np.asarray(arrays[0]).dtype, dims


def _standalone(iso: IsolationModel, outputs: dict[str, str], specs: dict[str, tuple[np.dtype, list]],
                side: str) -> onnx.ModelProto:
    """An isolation model made presentable: Constant nodes folded into initializers, inputs and outputs named
    as the reference's tensors (inputs with the shapes the values have), other tensors and nodes without the
    isolation prefix, only the functions it calls."""
    model = iso.model
    g = model.graph
    _fold_constants(g)
    inits = {t.name for t in g.initializer}
    rename: dict[str, str] = {}
    for vi in g.input:
        rename[vi.name] = iso.boundary[vi.name]
    rename.update(outputs)
    clash = {r for r in rename.values() if r in inits}
    for name in clash:
        rename[name] = f"{name}__{side}_const"
    taken = set(rename.values()) | (inits - clash)
    for node in g.node:
        node.name = _ISO_PREFIX.sub("", node.name)
    for o in [o for n in g.node for o in n.output] + [t.name for t in g.initializer]:
        if o and o not in rename and _ISO_PREFIX.match(o):
            short = _ISO_PREFIX.sub("", o)
            if short not in taken:
                rename[o] = short
                taken.add(short)
    _rename(g, rename)
    # inputs: the side's own type where numpy holds it, the values' shapes
    types = {vi.name: vi.type for vi in g.input}
    del g.input[:]
    casts = []
    for name in (iso.boundary[c] for c in iso.boundary):
        dtype, shape = specs[name]
        tp = types.get(name)
        et = tp.tensor_type.elem_type if tp is not None and tp.HasField("tensor_type") else 0
        own = helper.np_dtype_to_tensor_dtype(dtype)
        if et and et not in _NUMPY_TYPES:
            cast_to = f"{name}::as_{TensorProto.DataType.Name(et).lower()}"
            casts.append(helper.make_node("Cast", [name], [cast_to], name=f"{name}/Cast", to=et))
            _rename_reads(g, {name: cast_to})
            et = own
        g.input.append(helper.make_tensor_value_info(name, et or own, shape))
    for i, node in enumerate(casts):
        g.node.insert(i, node)
    # outputs: keep only the requested ones, typed
    old = {vi.name: vi for vi in g.output}
    del g.output[:]
    for name in outputs.values():
        vi = onnx.ValueInfoProto()
        vi.name = name
        if name in old and old[name].type.WhichOneof("value"):
            vi.type.CopyFrom(old[name].type)
        g.output.append(vi)
    _type_outputs(model, specs)
    used = _used_functions(model)
    kept = [f for f in model.functions if (f.domain, f.name) in used]
    del model.functions[:]
    model.functions.extend(kept)
    g.name = f"workbench_reduce_{side}"
    model.producer_name = "onnx-drift-workbench"
    from .. import __version__

    model.producer_version = __version__
    model.doc_string = f"{side} side of a divergence reduced by `workbench reduce`"
    from ..model.mapped import is_mapped

    for t in g.initializer:  # weights left mapped are written to NAME.onnx.data beside the file
        if (t.data_location == TensorProto.EXTERNAL or t.external_data) and not is_mapped(t):
            raise ReduceError(f"initializer {t.name!r} still points to external data",
                              "load the model with its weight files next to it")
    return model


def _fold_constants(g: onnx.GraphProto) -> None:
    """Constant nodes with a tensor value become initializers."""
    from onnx import numpy_helper

    keep = []
    for node in g.node:
        if node.op_type != "Constant" or node.domain or len(node.attribute) != 1:
            keep.append(node)
            continue
        attr = node.attribute[0]
        if attr.name == "value":
            t = TensorProto()
            t.CopyFrom(attr.t)
        elif attr.name in ("value_float", "value_floats", "value_int", "value_ints"):
            value = helper.get_attribute_value(attr)
            dtype = np.float32 if "float" in attr.name else np.int64
            t = numpy_helper.from_array(np.asarray(value, dtype=dtype))
        else:
            keep.append(node)
            continue
        t.name = node.output[0]
        g.initializer.append(t)
    if len(keep) != len(g.node):
        del g.node[:]
        g.node.extend(keep)


def _rename(g: onnx.GraphProto, rename: dict[str, str]) -> None:
    for vi in list(g.input) + list(g.output):
        vi.name = rename.get(vi.name, vi.name)
    for t in g.initializer:
        t.name = rename.get(t.name, t.name)
    for node in g.node:
        for i, name in enumerate(node.output):
            if name in rename:
                node.output[i] = rename[name]
    _rename_reads(g, rename)


def _rename_reads(g: onnx.GraphProto, rename: dict[str, str]) -> None:
    """Rename what nodes (and their subgraphs, for outer-scope names) read."""
    for node in g.node:
        for i, name in enumerate(node.input):
            if name in rename:
                node.input[i] = rename[name]
        for _, sub in subgraphs_of(node):
            local = {t.name for t in sub.initializer} | {vi.name for vi in sub.input} | {
                o for n in sub.node for o in n.output}
            inner = {k: v for k, v in rename.items() if k not in local}
            if inner:
                _rename_reads(sub, inner)


def _type_outputs(model: onnx.ModelProto, specs: dict[str, tuple[np.dtype, list]]) -> None:
    """Give untyped outputs the type shape inference finds (the value's, for a reference tensor, otherwise)."""
    g = model.graph
    if all(vi.type.WhichOneof("value") for vi in g.output):
        return
    try:
        inferred = {vi.name: vi.type for vi in onnx.shape_inference.infer_shapes(model).graph.output}
    except Exception as e:  # noqa: BLE001 - best effort: a contrib op may stop onnx's inference
        log.debug("shape inference of the reduced model failed: %s", e)
        inferred = {}
    for vi in g.output:
        if vi.type.WhichOneof("value"):
            continue
        if vi.name in inferred and inferred[vi.name].tensor_type.elem_type:
            vi.type.CopyFrom(inferred[vi.name])
        elif vi.name in specs:
            vi.type.CopyFrom(helper.make_tensor_type_proto(helper.np_dtype_to_tensor_dtype(specs[vi.name][0]), None))


def _used_functions(model: onnx.ModelProto) -> set[tuple[str, str]]:
    from ..model.walk import iter_nodes

    defined = {(f.domain, f.name): f for f in model.functions}
    used: set[tuple[str, str]] = set()
    stack = [(n.domain, n.op_type) for n in iter_nodes(model.graph)]
    while stack:
        key = stack.pop()
        if key in defined and key not in used:
            used.add(key)
            stack += [(n.domain, n.op_type) for n in defined[key].node]
    return used


