"""Fold inference-mode BatchNormalization into the conv or matmul before it.

    bn(y) = (y - mean) / sqrt(var + eps) * gamma + beta = y * s + t,
    s = gamma / sqrt(var + eps),  t = beta - mean * s                 (per channel, axis 1)

    bn(conv(x, w, b))   -> conv(x, w * s[:, None, None, None], b * s + t)
    bn(gemm(a, B, C))   -> gemm(a, B * s (per column of op(B)), C * s + t)
    bn(matmul(a, B))    -> matmul(a, B * s) + t                       (2-D output only: BN's
                                                                        channel axis is then B's
                                                                        last dim)

when the anchor's weights (and bias) are constants and its output feeds the BN alone. The
arithmetic is emitted as nodes on constants; constant folding (the cleanup after this stage)
evaluates it. A BN that cannot be folded becomes y * s' + t' with s', t' per-channel constants of
shape (C, 1, ..., 1), which epilogue or elementwise fusion absorbs; where a fold was only blocked
by another reader of the anchor's output, a near miss says so.
"""

from __future__ import annotations

from graphc.ir.graph import Graph, Node, Value
from graphc.ir.types import TensorType
from graphc.passes.fold_common import (
    FLOAT_DTYPES,
    ConstMath,
    FoldTarget,
    Replacement,
    compute_dtype,
    emit_folded_anchor,
    fold_target,
    rebuild,
)


def _is_inference_bn(graph: Graph, node: Node) -> bool:
    if node.op != "BatchNormalization" or node.domain or len(node.outputs) != 1 or node.attrs.training_mode:
        return False
    if len(node.inputs) != 5 or any(v is None or graph.const(v.name) is None for v in node.inputs[1:]):
        return False
    x = node.inputs[0]
    t = x.type if x is not None else None
    return isinstance(t, TensorType) and t.shape is not None and len(t.shape) >= 2 and t.dtype in FLOAT_DTYPES


def _scale_shift(m: ConstMath, node: Node, params: list[Value]) -> tuple[Value, Value]:
    """s = gamma / sqrt(var + eps) and t = beta - mean * s, as nodes on constants."""
    cd = compute_dtype(*(p.ttype.dtype for p in params))
    gamma, beta, mean, var = (m.cast(p, cd) for p in params)
    eps = m.scalar(node.attrs.epsilon, cd, "epsilon")
    s = m.op("Div", [gamma, m.op("Sqrt", [m.op("Add", [var, eps], hint="var_eps")], hint="std")], hint="scale")
    t = m.op("Sub", [beta, m.op("Mul", [mean, s], hint="mean_scale")], hint="shift")
    return s, t


def _fold(node: Node, target: FoldTarget) -> Replacement:
    def emit(b, mapv):
        m = ConstMath(b, node.name)
        s, t = _scale_shift(m, node, [mapv(v) for v in node.inputs[1:]])
        ins = [None if v is None else mapv(v) for v in target.node.inputs]
        out = emit_folded_anchor(b, target, ins, scale=s, shift=t, out_name=node.outputs[0].name)
        return [out]

    return Replacement(node.name, emit, (target.node, node))


def _to_mul_add(node: Node) -> Replacement:
    """bn(x) -> x * s' + t' with per-channel constants shaped (C, 1, ..., 1)."""
    x = node.inputs[0]
    rank = len(x.ttype.shape)

    def emit(b, mapv):
        m = ConstMath(b, node.name)
        s, t = _scale_shift(m, node, [mapv(v) for v in node.inputs[1:]])
        dt = x.ttype.dtype
        shape = [-1] + [1] * (rank - 2)
        s = m.cast(m.reshape(s, shape, "scale_channels"), dt)
        t = m.cast(m.reshape(t, shape, "shift_channels"), dt)
        y = b.op("Mul", [mapv(x), s], name=f"{node.name}/mul")
        out = b.add_node("Add", [y, t], name=node.name, keep_name=True, outputs=[node.outputs[0].name])
        return list(out.outputs)

    return Replacement(node.name, emit, (node,))


def fold_batchnorm(graph: Graph) -> Graph:
    replacements: list[Replacement] = []
    misses: list[str] = []
    for node in graph.nodes:
        if not _is_inference_bn(graph, node):
            continue
        x = node.inputs[0]
        target = fold_target(graph, x, sole_consumer=node)
        c = graph.const(node.inputs[1].name).size
        if target is not None and target.channel_axis == 1 and target.channels == c:
            replacements.append(_fold(node, target))
            continue
        replacements.append(_to_mul_add(node))
        loose = fold_target(graph, x)
        if loose is not None and loose.channel_axis == 1 and not graph.is_output(x.name):
            others = [u.name for u in graph.users(x.name) if u is not node]
            if others:
                misses.append(
                    f"BatchNormalization '{node.name}' not folded into {loose.op} '{loose.node.name}': "
                    f"its output is also used by '{others[0]}'"
                )
    return rebuild(graph, replacements, near_misses=misses)
