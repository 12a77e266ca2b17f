"""Shared by fold_batchnorm and fold_affine: anchors with constant weights, and folding a
per-output-channel affine map y * s + t into them.

An anchor is Conv, ConvTranspose, Gemm, MatMul or graphc.MatMul whose weight (and bias, if any)
is a graph constant. Folding emits the arithmetic on constants as graph nodes (Mul, Reshape,
Add...) and lets constant folding evaluate them, so what runs is exactly the ops' definitions:

    conv(x, w, b) * s + t    -> conv(x, w * s[:, None, ...], b * s + t)
    gemm(a, B, C) * s + t    -> gemm(a, B * s (per column of op(B)), beta * C * s + t, beta=1)
    matmul(a, B) * s + t     -> matmul(a, B * s) + t      (no bias slot: the Add stays, for the
                                                           epilogue to absorb)

s and t are per-output-channel vectors of shape (C,) or one-element vectors (a scalar for every
channel), or None (s = 1, t = 0). The weight is scaled in its own dtype (an up-cast weight would
be twice the bytes, which constant folding declines to materialize); s and t are computed in
float32 (float64 if anything is float64) and cast once.

Also the rebuild driver the folding and fusion passes share: `rebuild` walks the graph once,
drops the nodes a pass replaced, emits replacements at the positions chosen, and keeps
graph.meta["origins"] (provenance) for every node it makes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from graphc.ir.builder import GraphBuilder
from graphc.ir.graph import Graph, Node, Value
from graphc.ir.types import DType, TensorType
from graphc.ops.internal import INTERNAL_DOMAIN
from graphc.passes.rewrite import DROP, RewriteContext, Rewritten, rewrite_graph

ANCHOR_OPS = frozenset({("", "Conv"), ("", "ConvTranspose"), ("", "Gemm"), ("", "MatMul"), (INTERNAL_DOMAIN, "MatMul")})
FLOAT_DTYPES = frozenset({DType.float32, DType.float64, DType.float16, DType.bfloat16})


@dataclass(frozen=True)
class FoldTarget:
    """An anchor whose output can absorb a per-output-channel affine map."""

    node: Node
    weight: Value  # a graph constant
    bias: Value | None  # Conv/ConvTranspose B or Gemm C (a graph constant), or None
    channels: int  # output channels (the size of the channel axis)
    channel_axis: int  # the output's channel axis (non-negative)
    out_rank: int

    @property
    def op(self) -> str:
        return self.node.op if not self.node.domain else f"{self.node.domain}.{self.node.op}"


def _const(graph: Graph, v: Value | None) -> np.ndarray | None:
    return None if v is None else graph.const(v.name)


def fold_target(graph: Graph, v: Value, *, sole_consumer: Node | None = None) -> FoldTarget | None:
    """The anchor making `v` if it has constant weights and `v` is read only by `sole_consumer`
    (and is no graph output), else None."""
    node = graph.producer(v.name)
    if node is None or (node.domain, node.op) not in ANCHOR_OPS or len(node.outputs) != 1:
        return None
    if graph.is_output(v.name):
        return None
    if sole_consumer is not None and any(u is not sole_consumer for u in graph.users(v.name)):
        return None
    t = v.type
    if not isinstance(t, TensorType) or t.shape is None or t.dtype not in FLOAT_DTYPES:
        return None
    rank = len(t.shape)
    w = _const(graph, node.input(1))
    if w is None or w.dtype != t.dtype.numpy:
        return None
    bias = node.input(2)
    if bias is not None and _const(graph, bias) is None:
        return None
    if node.op == "Conv" and not node.domain:
        return FoldTarget(node, node.inputs[1], bias, int(w.shape[0]), 1, rank)
    if node.op == "ConvTranspose":
        if w.ndim < 3:
            return None
        return FoldTarget(node, node.inputs[1], bias, int(w.shape[1]) * int(node.attrs.group), 1, rank)
    if node.op == "Gemm":
        if w.ndim != 2 or rank != 2:
            return None
        if bias is not None and node.attrs.beta == 0.0:
            bias = None  # beta = 0: C is not read
        n = w.shape[0] if node.attrs.transB else w.shape[1]
        return FoldTarget(node, node.inputs[1], bias, int(n), 1, rank)
    # MatMul / graphc.MatMul: the weight's last dim (or second last, transposed) is the channel.
    if w.ndim < 2 or rank < 2:
        return None
    trans_b = bool(node.domain and node.attrs.trans_b)
    n = w.shape[-2] if trans_b else w.shape[-1]
    return FoldTarget(node, node.inputs[1], None, int(n), rank - 1, rank)


def per_channel_vector(c: np.ndarray, target: FoldTarget) -> bool:
    """Whether constant `c`, broadcast against the anchor output, varies along the channel axis
    only (or not at all), and does not grow the output."""
    if c.dtype == object or c.ndim > target.out_rank:
        return False
    offset = target.out_rank - c.ndim
    for i, d in enumerate(c.shape):
        axis = offset + i
        if d == 1:
            continue
        if axis != target.channel_axis or d != target.channels:
            return False
    return True


class ConstMath:
    """Emits arithmetic on constants (for constant folding to evaluate) into a builder."""

    def __init__(self, b: GraphBuilder, name: str):
        self.b = b
        self.name = name

    def op(self, op: str, inputs: Sequence[Value | None], attrs: Mapping | None = None, hint: str = "") -> Value:
        return self.b.op(op, inputs, attrs, name=f"{self.name}/{hint or op}")

    def const(self, data: np.ndarray, hint: str) -> Value:
        return self.b.add_constant(np.asarray(data), f"{self.name}/{hint}")

    def cast(self, v: Value, dtype: DType) -> Value:
        if v.ttype.dtype == dtype:
            return v
        return self.op("Cast", [v], {"to": dtype.value}, "cast")

    def reshape(self, v: Value, shape: Sequence[int], hint: str = "reshape") -> Value:
        return self.op("Reshape", [v, self.const(np.array(list(shape), dtype=np.int64), f"{hint}_shape")], hint=hint)

    def vector(self, v: Value) -> Value:
        """A constant that varies along one axis at most, as a 1-D vector ((C,) or (1,))."""
        return self.reshape(v, [-1], "vector")

    def scalar(self, value: float, dtype: DType, hint: str) -> Value:
        return self.const(np.array(value, dtype=dtype.numpy), hint)


def compute_dtype(*dtypes: DType) -> DType:
    return DType.float64 if DType.float64 in dtypes else DType.float32


def emit_folded_anchor(
    b: GraphBuilder,
    target: FoldTarget,
    inputs: Sequence[Value | None],
    *,
    scale: Value | None,
    shift: Value | None,
    scale_op: str = "Mul",
    out_name: str,
) -> Value:
    """Emit the anchor with `y * s + t` folded in (`y / s + t` with scale_op="Div"); returns the
    value that replaces y * s + t. `inputs` are the anchor's inputs in the new graph; `scale` and
    `shift` are 1-D vectors in the compute dtype (or None)."""
    node = target.node
    wt = target.weight.ttype
    m = ConstMath(b, node.name)
    w = inputs[1]
    assert w is not None
    if scale is not None:
        w = m.op(scale_op, [w, _weight_scale(m, target, m.cast(scale, wt.dtype))], hint="weight")
    bias_dtype = wt.dtype
    cd = compute_dtype(bias_dtype, *(v.ttype.dtype for v in (scale, shift) if v is not None))
    new_inputs = list(inputs)
    new_inputs[1] = w
    attrs = node.attrs
    if node.op in ("Conv", "ConvTranspose") and not node.domain:
        bias = inputs[2] if len(inputs) > 2 else None
        new_bias = _new_bias(m, bias, scale, shift, scale_op, cd, bias_dtype, (target.channels,))
        new_inputs = [*new_inputs[:2], new_bias] if new_bias is not None else new_inputs[:2]
    elif node.op == "Gemm":
        c = inputs[2] if len(inputs) > 2 and target.bias is not None else None
        if c is not None and attrs.beta != 1.0:
            c = m.op("Mul", [m.cast(c, cd), m.scalar(attrs.beta, cd, "beta")], hint="beta_c")
        new_c = _new_bias(m, c, scale, shift, scale_op, cd, bias_dtype, None)
        new_inputs = [*new_inputs[:2], new_c] if new_c is not None else new_inputs[:2]
        attrs = attrs.replace(beta=1.0)
    out = b.add_node(
        node.op, new_inputs, attrs, name=node.name, keep_name=True, outputs=[out_name], domain=node.domain
    ).outputs[0]
    if node.op == "MatMul" and shift is not None:
        # No bias slot: y + t stays an Add (of a constant), which the epilogue absorbs.
        t = m.cast(shift, out.ttype.dtype)
        out = b.op("Add", [out, t], name=f"{node.name}/bias")
    return out


def _weight_scale(m: ConstMath, target: FoldTarget, s: Value) -> Value:
    """s (1-D, weight dtype) shaped to multiply the weight per output channel."""
    node, w = target.node, target.weight.ttype
    rank = len(w.static_shape)
    if node.op == "Conv" and not node.domain:
        return m.reshape(s, [-1] + [1] * (rank - 1), "weight_scale")
    if node.op == "ConvTranspose":
        # W is (C_in, C_out / group, k...): output channel g * (C_out / group) + j is W[g-th
        # block of C_in, j]. Scale per (group, j) on a (group, C_in / group, C_out / group, k...) view.
        group = int(node.attrs.group)
        if group == 1:
            return m.reshape(s, [1, -1] + [1] * (rank - 2), "weight_scale")
        c_in, c_out_g = w.static_shape[0], w.static_shape[1]
        full = m.op("Expand", [s, m.const(np.array([target.channels], dtype=np.int64), "channels")], hint="expand")
        blocks = m.reshape(full, [group, 1, c_out_g], "per_group")
        blocks = m.op("Expand", [blocks, m.const(np.array([group, c_in // group, c_out_g], dtype=np.int64), "blocks")])
        return m.reshape(blocks, [c_in, c_out_g] + [1] * (rank - 2), "weight_scale")
    if node.op == "Gemm":
        return m.reshape(s, [-1, 1] if node.attrs.transB else [1, -1], "weight_scale")
    trans_b = bool(node.domain and node.attrs.trans_b)
    return m.reshape(s, [-1, 1] if trans_b else [1, -1], "weight_scale")


def _new_bias(
    m: ConstMath,
    bias: Value | None,
    scale: Value | None,
    shift: Value | None,
    scale_op: str,
    cd: DType,
    dtype: DType,
    shape: tuple[int, ...] | None,
) -> Value | None:
    """bias * s + t (bias / s + t), in the compute dtype, cast to `dtype`; expanded to `shape`
    where there was no bias (a one-element t must still give one value per channel)."""
    if bias is None and shift is None:
        return None
    out: Value | None = None
    if bias is not None:
        out = m.cast(bias, cd)
        if scale is not None:
            out = m.op(scale_op, [out, scale], hint="bias_scale")
    if shift is not None:
        out = shift if out is None else m.op("Add", [out, shift], hint="bias_shift")
    assert out is not None
    if bias is None and shape is not None:
        out = m.op("Expand", [out, m.const(np.array(shape, dtype=np.int64), "bias_shape")], hint="bias_expand")
    return m.cast(out, dtype)


# ---- the rebuild driver ------------------------------------------------------------------------

Emit = Callable[[GraphBuilder, Callable[[Value], Value]], Sequence[Value]]


@dataclass
class Replacement:
    """At node `at` (its position in the old graph), `emit` builds what replaces `at`'s outputs
    (in order); `absorbed` are the old nodes it stands for (their provenance is merged)."""

    at: str
    emit: Emit
    absorbed: tuple[Node, ...]


def rebuild(graph: Graph, replacements: Sequence[Replacement], *, near_misses: Sequence[str] = ()) -> Graph:
    """The graph with each replacement's absorbed nodes dropped and its emitted nodes placed at
    `at`; every other node kept; `near_misses` added to the meta. Returns `graph` itself when
    there is nothing to replace and no new near miss. (Through passes/rewrite.py's driver.)"""
    by_at = {r.at: r for r in replacements}
    dropped = {n.name for r in replacements for n in r.absorbed} - set(by_at)

    def visit(node: Node, ctx: RewriteContext) -> Rewritten | None:
        r = by_at.get(node.name)
        if r is not None:
            return Rewritten(list(r.emit(ctx.b, ctx.mapv)), r.absorbed)
        return DROP if node.name in dropped else None

    return rewrite_graph(graph, visit, near_misses=near_misses)
