"""Activations a quantizer folded into Q/DQ ranges, restored where Q/DQ removal lets float values through.

ONNX Runtime's ``quantize_static`` removes a Relu/Clip after a quantized node: it renames the producer's output to
the activation's and lets the QuantizeLinear's range clip instead. A node dequantized back to float then reads (or
writes) that tensor before its pair, unclipped. :func:`folded_activations` finds those activations in the reference
model; :func:`activation_node` rebuilds one on a float tensor (its bound constants copied from the reference).
"""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper

FOLDABLE = ("Relu", "Clip")


def folded_activations(candidate: onnx.ModelProto, reference: onnx.ModelProto) -> dict[str, onnx.NodeProto]:
    """Candidate tensor -> the reference's Relu/Clip that produced it and that the candidate lacks (by name)."""
    names = {n.name for n in candidate.graph.node if n.name}
    produced = {o: n for n in candidate.graph.node for o in n.output if o}
    found = {}
    for n in reference.graph.node:
        if n.op_type in FOLDABLE and n.name and n.name not in names and n.output and n.output[0] in produced \
                and produced[n.output[0]].op_type not in ("QuantizeLinear", "DequantizeLinear", n.op_type):
            found[n.output[0]] = n
    return found


def activation_node(ref: onnx.NodeProto, source: str, out: str, name: str, consts: dict[str, TensorProto],
                    fresh) -> tuple[onnx.NodeProto, list[TensorProto]]:
    """(``ref`` applied to ``source`` -> ``out``, new initializers for its bound inputs). ``fresh(name)``: an
    unused tensor name."""
    inputs, inits = [source], []
    for name_in in ref.input[1:]:
        if not name_in or name_in not in consts:
            inputs.append("")
            continue
        t = TensorProto()
        t.CopyFrom(consts[name_in])
        t.name = fresh(f"{name_in}::bound")
        inits.append(t)
        inputs.append(t.name)
    while inputs and inputs[-1] == "":
        inputs.pop()
    node = helper.make_node(ref.op_type, inputs, [out], name=name)
    node.attribute.extend(ref.attribute)
    return node, inits
