"""Rotary position embeddings written out, as transformers' apply_rotary_pos_emb exports them,
become one RotaryEmbedding node:

    x * cos + concat(-x[..., d/2:], x[..., :d/2]) * sin  ->  RotaryEmbedding(x, cos', sin')

x is (batch, heads, seq, d); cos and sin are constants broadcasting to (batch, 1, seq, d) whose
two halves are equal (transformers' cat(freqs, freqs)); cos' and sin' are their first halves as
the (batch, seq, d/2) caches of RotaryEmbedding without position_ids (half-split, not
interleaved). The node computes x1 * cos - x2 * sin and x2 * cos + x1 * sin, the same products
and sums as the written-out form, in float32 for every input type.

When x is the head split Transpose(Reshape(y, (B, S, H, d)), (0, 2, 1, 3)) of a projection y
(B, S, H * d), the node takes y itself (RotaryEmbedding's 3-D form, num_heads=H) and the head
split moves after it, where attention fusion finds it again and takes the 3-D form too; so a
LLaMA-style layer keeps no Transpose for Q and K.

Cos and sin computed at run time (position_ids fed as an input) are not matched (a near miss
says so): the caches would have to be sliced at run time.
"""

from __future__ import annotations

import logging

import numpy as np

from graphc.ir.graph import Graph, Node, Value
from graphc.passes.fuse_util import is_float_data, is_onnx
from graphc.passes.rewrite import RewriteContext, Rewritten, rewrite_graph

log = logging.getLogger(__name__)
_HEAD_SPLIT = (0, 2, 1, 3)


def _ints(g: Graph, v: Value | None) -> list[int] | None:
    d = None if v is None else g.const(v.name)
    return None if d is None or d.dtype.kind not in "iu" else [int(x) for x in d.reshape(-1)]


def _half_slice(g: Graph, n: Node | None, x: Value, d: int) -> str | None:
    """ "lo" for x[..., :d/2], "hi" for x[..., d/2:], else None (a Slice of x's last axis)."""
    if not is_onnx(n, "Slice") or n.inputs[0] != x or len(n.inputs) < 4:
        return None
    starts, ends, axes = (_ints(g, n.inputs[i]) for i in (1, 2, 3))
    steps = _ints(g, n.inputs[4]) if len(n.inputs) > 4 and n.inputs[4] is not None else [1]
    if starts is None or ends is None or axes is None or len(axes) != 1 or axes[0] not in (-1, 3) or steps != [1]:
        return None
    s, e = starts[0], ends[0]
    s = s + d if s < 0 else s
    e = e + d if e < 0 else min(e, d)
    if (s, e) == (0, d // 2):
        return "lo"
    if (s, e) == (d // 2, d):
        return "hi"
    return None


def _rotate_half_of(g: Graph, v: Value) -> Value | None:
    """x when v = concat(-x[..., d/2:], x[..., :d/2], axis=-1)."""
    c = g.producer(v.name)
    if not is_onnx(c, "Concat") or len(c.inputs) != 2 or c.attrs.axis not in (-1, 3):
        return None
    neg = g.producer(c.inputs[0].name)
    if not is_onnx(neg, "Neg"):
        return None
    hi = g.producer(neg.inputs[0].name)
    lo = g.producer(c.inputs[1].name)
    if hi is None or lo is None:
        return None
    x = hi.inputs[0]
    shape = x.ttype.shape
    if shape is None or len(shape) != 4 or not isinstance(shape[3], int) or shape[3] % 2:
        return None
    d = shape[3]
    if _half_slice(g, hi, x, d) != "hi" or _half_slice(g, lo, x, d) != "lo":
        return None
    return x


def _cache(data: np.ndarray, batch: int, seq: int, d: int) -> np.ndarray | None:
    """The (batch, seq, d/2) cache of a cos/sin constant broadcasting to (batch, 1, seq, d) with
    equal halves, else None."""
    if not is_float_data(data) or data.ndim > 4 or data.shape[-1] != d:
        return None
    full = data.reshape((1,) * (4 - data.ndim) + data.shape)
    if full.shape[1] != 1 or full.shape[0] not in (1, batch) or full.shape[2] not in (1, seq):
        return None
    if not np.array_equal(full[..., : d // 2], full[..., d // 2 :]):
        return None
    return np.ascontiguousarray(np.broadcast_to(full[:, 0, :, : d // 2], (batch, seq, d // 2)))


def _products(g: Graph, v: Value) -> list[tuple[Value, np.ndarray]]:
    """(operand, constant) for v = operand * constant (either order)."""
    n = g.producer(v.name)
    if not is_onnx(n, "Mul") or g.is_output(v.name) or len(g.users(v.name)) != 1:
        return []
    out = []
    for a, c in ((n.inputs[0], n.inputs[1]), (n.inputs[1], n.inputs[0])):
        data = g.const(c.name)
        if data is not None and a.type == v.type:
            out.append((a, data))
    return out


def _match(g: Graph, node: Node, misses: list[str]):
    if not is_onnx(node, "Add") or node.inputs[0] is None or node.inputs[1] is None:
        return None
    for left, right in ((node.inputs[0], node.inputs[1]), (node.inputs[1], node.inputs[0])):
        for x, cos in _products(g, left):
            for rot, sin in _products(g, right):
                if _rotate_half_of(g, rot) != x or x.type != node.outputs[0].type:
                    continue
                batch, heads, seq, d = x.ttype.shape
                if not all(isinstance(s, int) for s in (batch, heads, seq, d)):
                    continue
                cc, sc = _cache(cos, batch, seq, d), _cache(sin, batch, seq, d)
                if cc is None or sc is None:
                    misses.append(
                        f"Add '{node.name}': rotary embedding not fused: cos/sin are not constants of "
                        f"(batch, 1, seq, {d}) with equal halves"
                    )
                    continue
                mul_l, mul_r = g.producer(left.name), g.producer(right.name)
                return x, cc.astype(x.ttype.dtype.numpy), sc.astype(x.ttype.dtype.numpy), [mul_l, mul_r]
    return None


def _head_split_source(g: Graph, x: Value) -> tuple[Value, int] | None:
    """(y, heads) when x = Transpose(Reshape(y (B, S, H*d) -> (B, S, H, d)), (0, 2, 1, 3))."""
    t = g.producer(x.name)
    if not is_onnx(t, "Transpose") or t.attrs.perm is None or tuple(t.attrs.perm) != _HEAD_SPLIT:
        return None
    r = g.producer(t.inputs[0].name)
    if not is_onnx(r, "Reshape"):
        return None
    y = r.inputs[0]
    ys, xs = y.ttype.shape, r.outputs[0].ttype.shape
    if ys is None or len(ys) != 3 or xs is None or tuple(ys[:2]) != tuple(xs[:2]) or ys[2] != xs[2] * xs[3]:
        return None
    return y, xs[2]


def fuse_rotary(graph: Graph) -> Graph:
    misses: list[str] = []

    def visit(node: Node, ctx: RewriteContext) -> Rewritten | None:
        m = _match(graph, node, misses)
        if m is None:
            return None
        x, cos, sin, muls = m
        b = ctx.b
        hint = node.name.rsplit("/", 1)[0] if "/" in node.name else node.name
        cv = b.add_constant(cos, f"{hint}/rotary_cos")
        sv = b.add_constant(sin, f"{hint}/rotary_sin")
        src = _head_split_source(graph, x)
        if src is None:
            y = b.op("RotaryEmbedding", [ctx.mapv(x), cv, sv], name=f"{hint}/RotaryEmbedding")
            return Rewritten([y], [*muls, node])
        y3, heads = src
        batch, _, seq, d = x.ttype.shape
        r = b.op("RotaryEmbedding", [ctx.mapv(y3), cv, sv], {"num_heads": heads}, name=f"{hint}/RotaryEmbedding")
        shape = b.add_constant(np.array([batch, seq, heads, d], dtype=np.int64), f"{hint}/rotary_heads")
        r = b.op("Reshape", [r, shape], name=f"{hint}/rotary_Reshape")
        y = b.op("Transpose", [r], {"perm": list(_HEAD_SPLIT)}, name=f"{hint}/rotary_Transpose")
        return Rewritten([y], [*muls, node])

    return rewrite_graph(graph, visit, near_misses=misses)
