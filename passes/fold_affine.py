"""Fold a per-output-channel scale or shift by a constant into the conv or matmul before it.

    conv(x, w, b) * c  -> conv(x, w * c[:, None, ...], b * c)
    conv(x, w, b) / c  -> conv(x, w / c[:, None, ...], b / c)
    conv(x, w, b) + c  -> conv(x, w, b + c)         (b created when absent)
    conv(x, w, b) - c  -> conv(x, w, b - c)
    gemm(a, B, C) * c  -> gemm(a, B * c (per column of op(B)), beta * C * c, beta=1);  + c likewise
    matmul(a, B) * c   -> matmul(a, B * c);  / c likewise  (no bias slot: Add/Sub stay for the epilogue)

(ConvTranspose and graphc.MatMul likewise.) The anchor's weights and bias must be constants, its
output must feed the Mul/Div/Add/Sub alone, and c must vary along the output-channel axis only
(axis 1 of a conv's output, the last axis of a matmul's), or be a scalar, without growing the
output or changing its dtype. The arithmetic on constants is emitted as nodes; constant folding
evaluates it in the cleanup after this stage.
"""

from __future__ import annotations

import numpy as np

from graphc.ir.graph import Graph, Node, Value
from graphc.passes.fold_common import (
    ConstMath,
    FoldTarget,
    Replacement,
    compute_dtype,
    emit_folded_anchor,
    fold_target,
    per_channel_vector,
    rebuild,
)

AFFINE_OPS = ("Mul", "Div", "Add", "Sub")
COMMUTATIVE = ("Mul", "Add")


def _operands(node: Node) -> list[tuple[Value, Value]]:
    """(anchor side, constant side) orders the op allows."""
    a, c = node.inputs
    if node.op in COMMUTATIVE:
        return [(a, c), (c, a)]
    return [(a, c)]


def _candidate(graph: Graph, node: Node) -> tuple[FoldTarget, Value] | None:
    if node.op not in AFFINE_OPS or node.domain or len(node.inputs) != 2 or any(v is None for v in node.inputs):
        return None
    for y, c in _operands(node):
        data = graph.const(c.name)
        if data is None:
            continue
        target = fold_target(graph, y, sole_consumer=node)
        if target is None or node.outputs[0].type != y.type or data.dtype != y.ttype.dtype.numpy:
            continue
        if node.op in ("Add", "Sub") and target.node.op == "MatMul":
            continue  # no bias slot to fold into
        if not np.all(np.isfinite(data)) or (node.op == "Div" and np.any(data == 0)):
            continue  # inf * w or w / 0 would spread over a whole channel's weights
        if per_channel_vector(data, target):
            return target, c
    return None


def _replacement(node: Node, target: FoldTarget, c: Value) -> Replacement:
    def emit(b, mapv):
        m = ConstMath(b, node.name)
        cd = compute_dtype(c.ttype.dtype)
        vec = m.cast(m.vector(mapv(c)), cd)
        scale = shift = None
        if node.op in ("Mul", "Div"):
            scale = vec
        elif node.op == "Add":
            shift = vec
        else:
            shift = m.op("Neg", [vec])
        ins = [None if v is None else mapv(v) for v in target.node.inputs]
        out = emit_folded_anchor(
            b,
            target,
            ins,
            scale=scale,
            shift=shift,
            scale_op="Div" if node.op == "Div" else "Mul",
            out_name=node.outputs[0].name,
        )
        return [out]

    return Replacement(node.name, emit, (target.node, node))


def fold_affine(graph: Graph) -> Graph:
    replacements = []
    for node in graph.nodes:
        found = _candidate(graph, node)
        if found is not None:
            replacements.append(_replacement(node, *found))
    return rebuild(graph, replacements)
