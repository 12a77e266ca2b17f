"""Converters of control flow: If, Loop and Scan (from opset 9; Scan-8's batched form is not read).

Each subgraph attribute becomes a closed IR graph (graphc.frontend.convert.convert_subgraph); the
outer values it reads become its captures and the node's trailing inputs (If: the then-branch's,
then the else-branch's). Later versions of these ops only widened their types.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np

from graphc.frontend.context import ConvertContext
from graphc.frontend.registry import converter
from graphc.ir.graph import Value
from graphc.ir.types import DType, TensorType, ValueType

log = logging.getLogger(__name__)


def _graph_attr(ctx: ConvertContext, name: str):
    import onnx

    g = ctx.attr(name)
    if not isinstance(g, onnx.GraphProto):
        raise ctx.fail(f"attribute '{name}' must be a graph")
    return g


def _rank_only(t: ValueType | None) -> ValueType | None:
    """A loop-carried value keeps its dtype and rank, not necessarily its dims."""
    if not isinstance(t, TensorType) or t.shape is None:
        return t
    return TensorType(t.dtype, tuple(None for _ in t.shape))


def _declared_has_shape(gp, i: int) -> bool:
    if i >= len(gp.input):
        return False
    tp = gp.input[i].type
    return tp.WhichOneof("value") == "tensor_type" and tp.tensor_type.HasField("shape")


@converter("If", since=1)
def _if(ctx: ConvertContext) -> Sequence[Value]:
    from graphc.frontend.convert import convert_subgraph, inline_subgraph

    cond = ctx.known(0)
    if cond is not None and np.asarray(cond).size == 1:
        # Known while loading (a constant, or shape arithmetic on static shapes): only the taken
        # branch is converted, inline; passes/fold_control_flow.py does the same for conditions
        # that become known later (shapes bound at compile time).
        taken = "then_branch" if bool(np.asarray(cond).reshape(())) else "else_branch"
        log.info("If node '%s': condition known while loading; %s inlined", ctx.name, taken)
        return inline_subgraph(ctx.builder, _graph_attr(ctx, taken), f"{ctx.name}/{taken.split('_')[0]}")
    then_g, then_caps = convert_subgraph(ctx.builder, _graph_attr(ctx, "then_branch"), f"If node '{ctx.name}' then")
    else_g, else_caps = convert_subgraph(ctx.builder, _graph_attr(ctx, "else_branch"), f"If node '{ctx.name}' else")
    node = ctx.emit(
        "If",
        [ctx.input(0), *then_caps, *else_caps],
        {"then_branch": then_g, "else_branch": else_g},
        outputs=ctx.output_names,
        name=ctx.name,
    )
    return node.outputs


@converter("Loop", since=1)
def _loop(ctx: ConvertContext) -> Sequence[Value]:
    from graphc.frontend.convert import convert_subgraph

    gp = _graph_attr(ctx, "body")
    carried = list(ctx.inputs[2:])
    types: list[ValueType | None] = [TensorType(DType.int64, ()), TensorType(DType.bool, ())]
    for j, v in enumerate(carried):
        # The declared type where it has a shape (the exporter knows what varies), else the
        # initial value's dtype and rank.
        types.append(None if _declared_has_shape(gp, 2 + j) or v is None else _rank_only(v.type))
    body, caps = convert_subgraph(ctx.builder, gp, f"Loop node '{ctx.name}' body", types)
    ins = list(ctx.inputs[:2]) + [None] * (2 - len(ctx.inputs[:2])) + carried
    node = ctx.emit("Loop", [*ins, *caps], {"body": body}, outputs=ctx.output_names, name=ctx.name)
    return node.outputs


@converter("Scan", since=9)
def _scan(ctx: ConvertContext) -> Sequence[Value]:
    from graphc.frontend.convert import convert_subgraph

    gp = _graph_attr(ctx, "body")
    m = int(ctx.attr("num_scan_inputs"))
    n = len(ctx.inputs) - m
    axes = list(ctx.attr("scan_input_axes") or [0] * m)
    types: list[ValueType | None] = []
    for v in ctx.inputs[:n]:
        types.append(None if v is None else v.type)  # a state keeps its type (the spec says so)
    for j, v in enumerate(ctx.inputs[n:]):
        t = None if v is None else v.type
        if isinstance(t, TensorType) and t.shape is not None:
            a = axes[j] + len(t.shape) if axes[j] < 0 else axes[j]
            t = TensorType(t.dtype, t.shape[:a] + t.shape[a + 1 :])
        types.append(t if isinstance(t, TensorType) and t.shape is not None else None)
    body, caps = convert_subgraph(ctx.builder, gp, f"Scan node '{ctx.name}' body", types)
    attrs = dict(ctx.attrs)
    attrs["body"] = body
    node = ctx.emit("Scan", [*ctx.inputs, *caps], attrs, outputs=ctx.output_names, name=ctx.name)
    return node.outputs
