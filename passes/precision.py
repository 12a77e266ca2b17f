"""Reduced precision (fp16, bf16) for the CUDA target.

Float32 weights become the target type at compile time (saturating: a constant beyond fp16's range,
like the -3.4e38 of an attention mask, becomes -65504, not -inf, so that 0 * mask stays 0);
float32 values inside the graph follow. Graph inputs and outputs keep the model's dtypes: a Cast
at each edge. Reductions, LayerNorm, Softmax and variances still accumulate in fp32 (the ops'
references and the kernels do that for 16-bit storage). Inputs that must stay exact (static
inputs such as Resize scales) are left in fp32.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from graphc.errors import CompileError
from graphc.ir.attrs import TensorAttr
from graphc.ir.builder import GraphBuilder
from graphc.ir.graph import Graph, Value
from graphc.ir.types import DType, TensorType
from graphc.ops.fused import EpilogueOp, FusedAttrs
from graphc.ops.registry import Category, get_op
from graphc.passes.target import Target

TARGETS = {"fp16": DType.float16, "bf16": DType.bfloat16}


def _convert_array(data: np.ndarray, dt: DType) -> np.ndarray:
    if dt is DType.float16:
        lim = float(np.finfo(np.float16).max)
        data = np.clip(data, -lim, lim)  # NaN passes through
    return data.astype(dt.numpy)


def _retype_attrs(op: str, attrs, target: DType):
    if op == "Cast" and attrs.to == DType.float32.value:
        return attrs.replace(to=target.value)
    if op == "ConstantOfShape" and attrs.value is not None and attrs.value.array.dtype == np.float32:
        return attrs.replace(value=TensorAttr(_convert_array(attrs.value.array, target)))
    if isinstance(attrs, FusedAttrs):
        epi = tuple(EpilogueOp(e.op, _retype_attrs(e.op, e.attrs, target), e.args) for e in attrs.epilogue)
        anchor = attrs.anchor_attrs
        if anchor is not None and attrs.anchor_op is not None:
            anchor = _retype_attrs(attrs.anchor_op, anchor, target)
        return dataclasses.replace(attrs, epilogue=epi, anchor_attrs=anchor)
    return attrs


def _keep_fp32(b: GraphBuilder, node, subst: dict[str, Value], target: DType, precision: str) -> None:
    """An If/Loop/Scan left here (data-dependent) keeps its subgraphs' fp32 boundary: its float
    inputs cast back to fp32 and its float outputs to the target type. Each branch is then
    converted inside as a graph of its own (graphc/host_if.py optimizes it for the same target),
    with the same Casts at its edges as any graph."""
    ins = []
    for v in node.inputs:
        nv = None if v is None else subst[v.name]
        if nv is not None and isinstance(v.type, TensorType) and v.type.dtype is DType.float32 and nv.type != v.type:
            nv = b.op("Cast", [nv], {"to": DType.float32.value}, name=f"{node.name}/{v.name}/to_fp32")
        ins.append(nv)
    new = b.add_node(
        node.op, ins, node.attrs, name=node.name, outputs=list(node.output_names), domain=node.domain, keep_name=True
    )
    for old, nv in zip(node.outputs, new.outputs, strict=True):
        if isinstance(nv.type, TensorType) and nv.type.dtype is DType.float32:
            nv = b.op("Cast", [nv], {"to": target.value}, name=f"{node.name}/{old.name}/to_{precision}")
        subst[old.name] = nv


def precision_pass(graph: Graph, target: Target) -> Graph:
    """The pipeline's form: the target's precision."""
    return convert_precision(graph, target.precision)


def convert_precision(graph: Graph, precision: str) -> Graph:
    if precision == "fp32":
        return graph
    try:
        target = TARGETS[precision]
    except KeyError:
        raise CompileError(f"precision must be fp32, fp16 or bf16, got {precision!r}") from None
    b = GraphBuilder(graph.name, graph.opset, graph.meta)
    b._reserved_values = set(graph.values)
    subst: dict[str, Value] = {}
    for v in graph.inputs:
        nv = b.add_input(v.name, v.type)
        if isinstance(v.type, TensorType) and v.type.dtype is DType.float32:
            subst[v.name] = b.op("Cast", [nv], {"to": target.value}, name=f"{v.name}/to_{precision}")
        else:
            subst[v.name] = nv
    static_uses: set[str] = set()
    for node in graph.nodes:
        opdef = get_op(node.op, node.domain)
        for i in opdef.static_inputs:
            v = node.input(i)
            if v is not None:
                static_uses.add(v.name)
    converted: dict[str, Value] = {}
    for name, c in graph.constants.items():
        kept = b.add_constant(c.data, name, keep_name=True)
        subst[name] = kept
        if c.data.dtype == np.float32:
            converted[name] = b.add_constant(_convert_array(c.data, target), f"{name}/{precision}")
    for node in graph.nodes:
        opdef = get_op(node.op, node.domain)
        if opdef.category is Category.CONTROL_FLOW:
            _keep_fp32(b, node, subst, target, precision)
            continue
        ins = []
        for i, v in enumerate(node.inputs):
            if v is None:
                ins.append(None)
            elif v.name in converted and i not in opdef.static_inputs:
                ins.append(converted[v.name])
            else:
                ins.append(subst[v.name])
        attrs = _retype_attrs(node.op, node.attrs, target)
        new = b.add_node(
            node.op, ins, attrs, name=node.name, outputs=list(node.output_names), domain=node.domain, keep_name=True
        )
        for old, nv in zip(node.outputs, new.outputs, strict=True):
            subst[old.name] = nv
    outs = []
    for v in graph.outputs:
        nv = subst[v.name]
        if isinstance(v.type, TensorType) and v.type.dtype is DType.float32 and nv.type.dtype is not DType.float32:
            nv = b.op("Cast", [nv], {"to": DType.float32.value}, name=f"{v.name}/to_fp32")
        outs.append(nv)
    b.set_outputs(outs, graph.output_names)
    from graphc.passes.cse import eliminate_common_subexpressions
    from graphc.passes.dce import eliminate_dead_code
    from graphc.passes.simplify import simplify

    return eliminate_dead_code(eliminate_common_subexpressions(simplify(b.build())))
