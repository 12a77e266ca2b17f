"""Attention written with 3-D batched matmuls over (batch * heads) becomes the 4-D form.

Rule (named by its algebra), at each Softmax over the last axis of a (B, H, Sq, Sk) tensor:

    reshape(f(bmm(q3, k3)), (B, H, Sq, Sk)) -> f4(matmul(q4, k4))
    reshape(softmax(...), (B * H, Sq, Sk)) @ v3 -> reshape(softmax(...) @ v4, (B * H, Sq, Dv))

where q3, k3, v3 are (B * H, S, D) (k3 possibly as its Transpose(0, 2, 1) or through graphc.MatMul's
trans flags), f is a chain of elementwise ops on the scores (scale, bias Add, Where), and x4 is x
viewed as (B, H, ...). Every operand of f that is (B * H, ...) is viewed as (B, H, ...); a leading 1
becomes (1, 1, ...); one of lower rank broadcasts the same way in 4-D. The 4-D ops between the
first reshape and the Softmax (the padding mask, which is (B, 1, Sq, Sk)) stay as they are.

Where it comes from: DeBERTa-v2 and BLOOM compute attention scores with torch.bmm / baddbmm on
(batch * heads, q, k) tensors (DeBERTa adds its c2p / p2c relative-position bias there, BLOOM its
ALiBi bias), view them as (batch, heads, q, k) for the mask and the Softmax, and back to 3-D for
the bmm with V. Attention fusion (passes/fuse_attention.py) reads 4-D scores throughout; after
this rewrite, cleanup cancels q4's, k4's and v4's reshapes against the head split they came from
(Reshape(Transpose(x), (B * H, S, D)) viewed as (B, H, S, D) is the Transpose itself), and the
out-reshape against the model's own view back to (B, H, Sq, Dv).

Exact on any input: a reshape that splits only the leading axis commutes with elementwise ops (on
operands viewed alike) and with batched matmuls; no arithmetic changes. Each 3-D node rewritten
must have the chain as its only reader, so nothing is computed twice.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from graphc.ir.builder import GraphBuilder
from graphc.ir.graph import Graph, Node, Value
from graphc.ops.internal import INTERNAL_DOMAIN
from graphc.passes.fuse_util import is_onnx, static_dims
from graphc.passes.rewrite import RewriteContext, Rewritten, rewrite_graph

log = logging.getLogger(__name__)

RULE = "reshape(f(bmm(q3, k3)), (B, H, S, S)) -> f(matmul(q4, k4)); reshape(p4, (BH, S, S)) @ v3 -> reshape(p4 @ v4)"

# Elementwise ops a scores chain is made of (scale, softcap, bias, mask); operands broadcast.
_ELEMENTWISE = frozenset({"Add", "Sub", "Mul", "Div", "Where", "Tanh", "Neg"})
_MAX_DEPTH = 12


def _sole_reader(g: Graph, v: Value, user: Node) -> bool:
    return not g.is_output(v.name) and all(u is user for u in g.users(v.name))


def _matmul(n: Node | None) -> bool:
    """An ONNX MatMul, or graphc.MatMul with trans flags and alpha (both keep batch axes as they are)."""
    return n is not None and n.op == "MatMul" and n.domain in ("", INTERNAL_DOMAIN)


@dataclass
class _Split:
    """Viewing (B * H, ...) values of one attention block as (B, H, ...)."""

    b: int
    h: int

    def shape(self, s: tuple[int, ...]) -> tuple[int, ...] | None:
        """The 4-D view of a shape as an operand of a (B * H, x, y) result broadcasts: None when it
        cannot be split (a leading dim that is neither B * H nor 1)."""
        if len(s) < 3:
            return s  # broadcasts from the right alike in 3-D and 4-D
        if len(s) != 3:
            return None
        if s[0] == self.b * self.h:
            return (self.b, self.h, *s[1:])
        if s[0] == 1:
            return (1, 1, *s[1:])
        return None


def _scores_path(g: Graph, v: Value, split: _Split, depth: int = 0) -> list[Node] | None:
    """The nodes from the QK bmm to v's producer (matmul first), each read only by the next; v is
    (B * H, Sq, Sk). None when v is not such a chain."""
    n = g.producer(v.name)
    s = static_dims(v)
    if n is None or s is None or len(s) != 3 or s[0] != split.b * split.h or depth > _MAX_DEPTH:
        return None
    if _matmul(n):
        a, b = (static_dims(i) for i in n.inputs[:2])
        if a is None or b is None or len(a) != 3 or len(b) != 3 or a[0] != s[0] or b[0] != s[0]:
            return None
        return [n]
    if not is_onnx(n, *_ELEMENTWISE):
        return None
    if any(i is None or (sh := static_dims(i)) is None or split.shape(sh) is None for i in n.inputs):
        return None
    for i in n.inputs:
        if i.type != v.type:
            continue  # a bias, a mask or a constant, not the scores
        inner = _scores_path(g, i, split, depth + 1)
        if inner is not None and _sole_reader(g, i, n):
            return [*inner, n]
    return None


@dataclass
class _Plan:
    split: _Split
    path: list[Node]  # the 3-D scores chain, matmul first; its last node feeds `split_in`
    split_in: Node  # Reshape (B * H, Sq, Sk) -> (B, H, Sq, Sk)
    softmax: Node
    merge_out: Node  # Reshape (B, H, Sq, Sk) -> (B * H, Sq, Sk) of the probabilities
    pv: Node  # the bmm of the probabilities with v3


def _plan(g: Graph, softmax: Node) -> _Plan | None:
    x = softmax.inputs[0]
    xs = static_dims(x)
    if xs is None or len(xs) != 4 or softmax.attrs.axis not in (-1, 3):
        return None
    b, h, sq, sk = xs
    split = _Split(b, h)
    p = softmax.outputs[0]
    users = g.users(p.name)
    if g.is_output(p.name) or len(users) != 1 or not is_onnx(users[0], "Reshape"):
        return None
    merge = users[0]
    if static_dims(merge.outputs[0]) != (b * h, sq, sk):
        return None
    readers = g.users(merge.outputs[0].name)
    if g.is_output(merge.outputs[0].name) or len(readers) != 1 or not _matmul(readers[0]):
        return None
    pv = readers[0]
    vs = static_dims(pv.inputs[1])
    if pv.inputs[0] != merge.outputs[0] or vs is None or len(vs) != 3 or vs[0] != b * h:
        return None
    if pv.domain and pv.attrs.trans_a:
        return None
    # Back from the Softmax through the 4-D mask ops to the reshape that splits (B * H).
    split_in = _find_split(g, x, split, 0)
    if split_in is None:
        return None
    path = _scores_path(g, split_in.inputs[0], split)
    if path is None or not _sole_reader(g, path[-1].outputs[0], split_in):
        return None
    return _Plan(split, path, split_in, softmax, merge, pv)


def _find_split(g: Graph, v: Value, split: _Split, depth: int) -> Node | None:
    """The Reshape from (B * H, Sq, Sk) to v's (B, H, Sq, Sk) that v is computed from through
    elementwise ops of v's shape (the mask), each read only by the next."""
    n = g.producer(v.name)
    if n is None or depth > _MAX_DEPTH:
        return None
    if is_onnx(n, "Reshape"):
        src = static_dims(n.inputs[0])
        out = static_dims(n.outputs[0])
        if src is not None and out is not None and len(src) == 3 and src == (split.b * split.h, *out[2:]):
            return n
        return None
    if not is_onnx(n, *_ELEMENTWISE):
        return None
    for i in n.inputs:
        if i is not None and static_dims(i) == static_dims(v) and _sole_reader(g, i, n):
            found = _find_split(g, i, split, depth + 1)
            if found is not None:
                return found
    return None


# ---- building the 4-D form ---------------------------------------------------------------------


def _view(
    g: Graph, b: GraphBuilder, v: Value, mapv: Callable[[Value], Value], shape: tuple[int, ...], hint: str
) -> Value:
    """v (in the new graph) viewed as `shape`: the Reshape's own input where v is a Reshape of a
    tensor of that shape already (the head split v was merged from), else a new Reshape."""
    if static_dims(v) == shape:
        return mapv(v)
    r = g.producer(v.name)
    if is_onnx(r, "Reshape") and static_dims(r.inputs[0]) == shape:
        return mapv(r.inputs[0])
    target = b.add_constant(np.array(shape, dtype=np.int64), f"{hint}/shape")
    return b.op("Reshape", [mapv(v), target], name=f"{hint}/view4d")


def _operand4(g: Graph, b: GraphBuilder, v: Value, mapv: Callable[[Value], Value], split: _Split, hint: str) -> Value:
    """A (B * H, S, D) matmul operand as (B, H, S, D), looking through what attention fusion reads
    through (a scale by a scalar constant, a swap of the last two axes), so that the view lands on
    the head split it came from."""
    s = static_dims(v)
    four = split.shape(s)
    n = g.producer(v.name)
    alone = n is not None and not g.is_output(v.name) and len(g.users(v.name)) == 1
    if alone and is_onnx(n, "Transpose") and tuple(n.attrs.perm or ()) == (0, 2, 1):
        inner = _operand4(g, b, n.inputs[0], mapv, split, hint)
        return b.op("Transpose", [inner], {"perm": [0, 1, 3, 2]}, name=f"{n.name}/4d")
    if alone and is_onnx(n, "Mul", "Div") and len(n.inputs) == 2:
        for k, (x, c) in enumerate(((n.inputs[0], n.inputs[1]), (n.inputs[1], n.inputs[0]))):
            if k == 1 and n.op == "Div":
                break  # c / x is no scale of x
            data = None if c is None else g.const(c.name)
            if x is None or static_dims(x) != s or data is None or data.size != 1:
                continue
            inner = _operand4(g, b, x, mapv, split, hint)
            args = [inner, mapv(c)] if k == 0 else [mapv(c), inner]  # c broadcasts alike in 4-D
            return b.op(n.op, args, name=f"{n.name}/4d")
    return _view(g, b, v, mapv, four, hint)


def _emit_scores(g: Graph, b: GraphBuilder, plan: _Plan, mapv: Callable[[Value], Value]) -> Value:
    """The scores chain rebuilt on 4-D values; returns its last value (the split reshape's output)."""
    split = plan.split
    done: dict[str, Value] = {}
    for n in plan.path:
        hint = f"{n.name}/4d"
        if _matmul(n):
            ins = [_operand4(g, b, i, mapv, split, f"{n.name}/in{k}") for k, i in enumerate(n.inputs[:2])]
        else:
            ins = []
            for k, i in enumerate(n.inputs):
                if i.name in done:
                    ins.append(done[i.name])
                else:
                    ins.append(_view(g, b, i, mapv, split.shape(static_dims(i)), f"{n.name}/in{k}"))
        out = b.add_node(n.op, ins, n.attrs, name=hint, domain=n.domain).outputs[0]
        done[n.outputs[0].name] = out
    return done[plan.path[-1].outputs[0].name]


def _emit_pv(g: Graph, b: GraphBuilder, plan: _Plan, mapv: Callable[[Value], Value]) -> Value:
    pv = plan.pv
    v4 = _operand4(g, b, pv.inputs[1], mapv, plan.split, f"{pv.name}/v")
    y = b.add_node(pv.op, [mapv(plan.softmax.outputs[0]), v4], pv.attrs, name=f"{pv.name}/4d", domain=pv.domain)
    shape = b.add_constant(np.array(static_dims(pv.outputs[0]), dtype=np.int64), f"{pv.name}/shape")
    return b.op("Reshape", [y.outputs[0], shape], name=f"{pv.name}/merge")


def bmm_attention_to_4d(graph: Graph) -> Graph:
    """The rule above at every Softmax it applies to."""
    roots: dict[str, tuple[str, _Plan]] = {}
    for node in graph.nodes:
        if is_onnx(node, "Softmax"):
            plan = _plan(graph, node)
            if plan is not None:
                roots[plan.split_in.name] = ("scores", plan)
                roots[plan.pv.name] = ("pv", plan)
    if not roots:
        return graph
    log.info("%s: %d", RULE, len(roots) // 2)

    def visit(node: Node, ctx: RewriteContext) -> Rewritten | None:
        found = roots.get(node.name)
        if found is None:
            return None
        kind, plan = found
        if kind == "scores":
            return Rewritten([_emit_scores(graph, ctx.b, plan, ctx.mapv)], [*plan.path, plan.split_in])
        return Rewritten([_emit_pv(graph, ctx.b, plan, ctx.mapv)], [plan.merge_out, plan.pv])

    return rewrite_graph(graph, visit)
