"""Fold a per-output-channel scale or shift by a constant into the conv or matmul before it.

    conv(x, w, b) * c  -> conv(x, w * c[:, None, ...], b * c)
    conv(x, w, b) / c  -> conv(x, w / c[:, None, ...], b / c)
    conv(x, w, b) + c  -> conv(x, w, b + c)         (b created when absent)
    conv(x, w, b) - c  -> conv(x, w, b - c)
    gemm(a, B, C) * c  -> gemm(a, B * c (per column of op(B)), beta * C * c, beta=1);  + c likewise
    matmul(a, B) * c   -> matmul(a, B * c);  / c likewise  (no bias slot: Add/Sub stay for the epilogue)
    (matmul(a, B) + b) * c -> matmul(a, B * c) + b * c;  / c likewise
        (b and c constant per-column vectors: a bias Add between the matmul and a scale, as
        ConvNeXt's and CaiT's layer scale `gamma * (x @ W + b)` export; without it the Mul stays
        in the epilogue, which keeps cuBLASLt (--tactics cublaslt) from taking the GEMM)

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


def _biased_matmul(graph: Graph, y: Value, node: Node) -> tuple[FoldTarget, Node, Value] | None:
    """y = matmul(a, B) + b (b a constant per-column vector, y read by `node` alone): the matmul's
    fold target, the Add, and b; else None."""
    add = graph.producer(y.name)
    if add is None or add.op != "Add" or add.domain or len(add.inputs) != 2 or any(v is None for v in add.inputs):
        return None
    if graph.is_output(y.name) or any(u is not node for u in graph.users(y.name)):
        return None
    for y0, b in _operands(add):
        data = graph.const(b.name)
        if data is None:
            continue
        target = fold_target(graph, y0, sole_consumer=add)
        if target is None or target.node.op != "MatMul" or y.type != y0.type or data.dtype != y0.ttype.dtype.numpy:
            continue
        if np.all(np.isfinite(data)) and per_channel_vector(data, target):
            return target, add, b
    return None


def _candidate(graph: Graph, node: Node) -> tuple[FoldTarget, Value] | tuple[FoldTarget, Value, Node, Value] | None:
    if node.op not in AFFINE_OPS or node.domain or len(node.inputs) != 2 or any(v is None for v in node.inputs):
        return None
    for y, c in _operands(node):
        data = graph.const(c.name)
        if data is None:
            continue
        if node.op in ("Mul", "Div") and np.all(np.isfinite(data)) and not (node.op == "Div" and np.any(data == 0)):
            biased = _biased_matmul(graph, y, node)
            if (
                biased is not None
                and node.outputs[0].type == y.type
                and data.dtype == y.ttype.dtype.numpy
                and per_channel_vector(data, biased[0])
            ):
                return biased[0], c, biased[1], biased[2]
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


def _replacement(
    node: Node, target: FoldTarget, c: Value, add: Node | None = None, bias: Value | None = None
) -> Replacement:
    """`add`/`bias`: the Add of a constant between a MatMul and this Mul/Div ((y + b) * c)."""

    def emit(b, mapv):
        m = ConstMath(b, node.name)
        cd = compute_dtype(c.ttype.dtype)
        vec = m.cast(m.vector(mapv(c)), cd)
        scale = shift = None
        if bias is not None:  # (y + b) * c = y * c + b * c; (y + b) / c = y / c + b / c
            scale = vec
            shift = m.op(node.op, [m.cast(m.vector(mapv(bias)), cd), vec], hint="bias_scaled")
        elif node.op in ("Mul", "Div"):
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

    absorbed = (target.node, add, node) if add is not None else (target.node, node)
    return Replacement(node.name, emit, absorbed)


def fold_affine(graph: Graph) -> Graph:
    replacements = []
    for node in graph.nodes:
        found = _candidate(graph, node)
        if found is not None:
            replacements.append(_replacement(node, *found))
    return rebuild(graph, replacements)
