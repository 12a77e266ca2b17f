"""Transpose - Reshape - Transpose chains that leave every element where it was become one Reshape.

Rule (named by its algebra):

- TRANSPOSE_SANDWICH  transpose(reshape(transpose(x, p), s), q) -> reshape(x, shape) when the
  three ops together keep x's elements in memory order. The three ops move contiguous blocks
  of x (the atoms of the common refinement of transpose(x, p)'s shape and s, each a block of one
  dim of x); the chain is a reshape exactly when q's order of s's dims lists the atoms in x's
  own order. Size-1 dims are ignored (they never move an element).

Where it comes from: the channels-last layout pass (passes/layout.py) runs a patch-embedding
convolution in NHWC and puts back NCHW after it (Transpose 0,3,1,2); the model then flattens the
patches and swaps them before the channels (ViT's, CLIP's and Swin's
``conv(x).flatten(2).transpose(1, 2)``: Reshape (B, C, HW) and Transpose 0,2,1). The three are one
free reshape of the NHWC output, (B, H, W, C) -> (B, HW, C), but no single rule of transpose
elimination sees that: the transpose pair is not adjacent and neither one alone passes through
the Reshape. The pass runs right after the layout pass (for_cuda), whose transposes appear only
there.
"""

from __future__ import annotations

import logging

import numpy as np

from graphc.ir.graph import Graph, Node
from graphc.passes.canonicalize import _refine
from graphc.passes.fuse_util import is_onnx, static_dims
from graphc.passes.rewrite import RewriteContext, Rewritten, rewrite_graph

log = logging.getLogger(__name__)

RULE = "transpose(reshape(transpose(x, p), s), q) -> reshape(x) when order-preserving"


def _perm(node: Node, rank: int) -> tuple[int, ...]:
    p = node.attrs.perm
    return tuple(p) if p is not None else tuple(reversed(range(rank)))


def keeps_order(xs: tuple[int, ...], p: tuple[int, ...], s: tuple[int, ...], q: tuple[int, ...]) -> bool:
    """Whether transpose(reshape(transpose(x, p), s), q) lists x's elements in x's own order."""
    ys = [xs[i] for i in p]

    def in_order(shape, perm) -> bool:  # the transpose moves no element (only size-1 dims)
        moved = [i for i in perm if shape[i] != 1]
        return moved == sorted(moved)

    if in_order(xs, p) and in_order(s, q):
        return True
    y_dims = [i for i, d in enumerate(ys) if d != 1]
    s_dims = [i for i, d in enumerate(s) if d != 1]
    ref = _refine([ys[i] for i in y_dims], [s[i] for i in s_dims])
    if ref is None:
        return False
    _, ry, rs = ref
    key: dict[int, tuple[int, int]] = {}  # atom -> (its dim of x, its place within that dim)
    for k, yi in enumerate(y_dims):
        for j, atom in enumerate(ry[k]):
            key[atom] = (p[yi], j)
    rank_of = {si: k for k, si in enumerate(s_dims)}
    order = [key[a] for si in q if s[si] != 1 for a in rs[rank_of[si]]]
    return order == sorted(order)


def _transpose_sandwich(g: Graph, node: Node, ctx: RewriteContext) -> Rewritten | None:
    if not is_onnx(node, "Transpose"):
        return None
    r = g.producer(node.inputs[0].name)
    if not is_onnx(r, "Reshape") or g.is_output(r.outputs[0].name) or len(g.users(r.outputs[0].name)) != 1:
        return None
    t = g.producer(r.inputs[0].name)
    if not is_onnx(t, "Transpose"):
        return None
    x = t.inputs[0]
    xs, s, zs = static_dims(x), static_dims(r.outputs[0]), static_dims(node.outputs[0])
    if xs is None or s is None or zs is None:
        return None
    if not keeps_order(xs, _perm(t, len(xs)), s, _perm(node, len(s))):
        return None
    shape = ctx.b.add_constant(np.array(zs, dtype=np.int64), f"{node.name}/shape")
    y = ctx.b.op("Reshape", [ctx.mapv(x), shape], name=f"{node.name}/reshape")
    t_alone = len(g.users(t.outputs[0].name)) == 1 and not g.is_output(t.outputs[0].name)
    absorbed = [t, r, node] if t_alone else [r, node]
    return Rewritten([y], absorbed)


def cancel_view_chains(graph: Graph) -> Graph:
    """TRANSPOSE_SANDWICH everywhere it applies."""

    def visit(node: Node, ctx: RewriteContext) -> Rewritten | None:
        return _transpose_sandwich(graph, node, ctx)

    return rewrite_graph(graph, visit)
