"""Transpose elimination: cancel, merge, absorb and push down Transposes (all numerically exact).

Rules (each named by its algebra; `p∘q` is the perm that Transpose(Transpose(x, p), q) applies):

- MERGE    transpose(transpose(x, p), q) -> transpose(x, p∘q), or x when p∘q is the identity.
           Done also when the inner transpose has other consumers: it stays for them, and the
           outer one costs no more than before.
- UNIT     transpose(x, p) that only moves size-1 dims -> reshape(x) (the planner's free alias),
           except a head transpose that only matmuls read (attention fusion looks for it).
- MATMUL   matmul(transpose(a), b) -> graphc.MatMul(a, b, trans_a=1) (likewise b; a transpose of
           the last two dims only; graphc.MatMul flips a flag already set), and
           gemm(transpose(A), B) -> gemm(A, B, transA=!transA). Transposes of constants are left to
           constant folding, which transposes the weight itself.
- MATMUL_T transpose(matmul(a, b)) -> graphc.MatMul(b, a, trans_a=!trans_b, trans_b=!trans_a)
           ((AB)^T = B^T A^T), and transpose(gemm(A, B, C)) -> gemm(B, A, C^T, ...).
- PUSH     f(transpose(x, p), transpose(y, p), c) -> transpose(f(x, y, c'), p) for elementwise f,
           with c' = transpose(c, p^-1) (after rank alignment) for a constant c, or a reshape of
           a value c whose transposition moves only size-1 dims (e.g. a bias of lower rank);
           reduce(transpose(x, p), axes) -> transpose(reduce(x, p[axes]), p') and
           softmax(transpose(x, p), axis) -> transpose(softmax(x, p[axis]), p).

Transposes only move down (toward consumers), so the pass reaches a fixed point. A push happens
only where the count of transposes executed at run time goes down in the end: `_Analysis.value`
looks ahead along the consumers for the transposes a push would cancel (MERGE to the identity or
to a reshape) or let a matmul absorb, and for the other transposed inputs it would retire. A
transpose with several consumers moves into all of them only where that pays off in total; into
some of them only where each of those pays off on its own.

Near misses go into the compile report: a transpose pair that would cancel but for one
elementwise op in between (an input that would need a transpose of its own, a broadcast that
would grow the transpose). `cancellable_pairs` lists pairs the pass should have removed (none).

Shapes of the attention pattern stay recognizable for attention fusion: a transpose is never
moved above the Reshape that splits heads, so K^T stays either Transpose(perm 0,2,3,1) of the
reshaped K or a graphc.MatMul(trans_b=1).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from graphc.ir.builder import GraphBuilder
from graphc.ir.graph import Graph, Node, Value
from graphc.ir.types import TensorType
from graphc.ops.internal import INTERNAL_DOMAIN
from graphc.ops.registry import has_op
from graphc.passes.constant_folding import FOLD_SMALL_BYTES
from graphc.passes.op_traits import is_axes_reduction, is_pointwise
from graphc.passes.report import add_near_miss
from graphc.passes.rewrite import RewriteContext, Rewritten, checkpoint, rewrite_graph, rollback
from graphc.passes.transpose_perm import (
    Perm,
    compose,
    inverse,
    is_identity,
    is_last_two_swap,
    moves_only_unit_dims,
    perm_of,
    permute,
    unpermute,
)

log = logging.getLogger(__name__)

RULE_MERGE = "transpose(transpose(x, p), q) -> transpose(x, p∘q) | x"
RULE_UNIT = "transpose(x, p moving only size-1 dims) -> reshape(x)"
RULE_MATMUL = "matmul(transpose(a), transpose(b)) -> graphc.matmul(a, b, trans_a, trans_b)"
RULE_GEMM = "gemm(transpose(A), transpose(B), C) -> gemm(A, B, C, !transA, !transB)"
RULE_MATMUL_T = "transpose(matmul(a, b)) -> graphc.matmul(b, a, !trans_b, !trans_a)"
RULE_GEMM_T = "transpose(gemm(A, B, C)) -> gemm(B, A, C^T, !transB, !transA)"
RULE_PUSH = "f(transpose(x, p), c) -> transpose(f(x, transpose(c, p^-1)), p)"
RULE_PUSH_REDUCE = "reduce(transpose(x, p), axes) -> transpose(reduce(x, p[axes]), p')"
RULE_PUSH_SOFTMAX = "softmax(transpose(x, p), axis) -> transpose(softmax(x, p[axis]), p)"

MAX_SWEEPS = 64
MAX_LOOKAHEAD_DEPTH = 64

_SOFTMAX_OPS = frozenset({"Softmax", "LogSoftmax"})


def eliminate_transposes(graph: Graph, *, fired: list[str] | None = None) -> Graph:
    """Sweep the rules to a fixed point; returns `graph` itself when nothing changed."""
    g = graph
    for _ in range(MAX_SWEEPS):
        new = _sweep(g, fired)
        if new is g:
            break
        g = new
    else:
        log.warning("eliminate_transposes: no fixed point after %d sweeps", MAX_SWEEPS)
    return _with_near_misses(g)


def _with_near_misses(graph: Graph) -> Graph:
    """Record transpose pairs that would cancel but for one op in between (once: the same graph
    comes back when every message is there already, so the pass manager's fixed point holds)."""
    have = list(graph.meta.get("near_misses", ()))
    fresh = [m for m in _near_misses(graph) if m not in have]
    if not fresh:
        return graph
    meta = dict(graph.meta)
    for m in fresh:
        add_near_miss(meta, m)
    return graph.with_nodes(graph.nodes, meta=meta)


def _near_misses(graph: Graph) -> list[str]:
    a = _Analysis(graph)
    out = []
    for t, partner, blocker in _transpose_pairs(graph, a):
        if blocker is not None:
            out.append(f"Transposes '{t.name}' and '{partner.name}' would cancel, but {blocker}")
    return out


def cancellable_pairs(graph: Graph) -> list[tuple[str, str]]:
    """Transposes that would cancel along a chain of single-consumer ops they commute with
    (none is left once this pass has run): a check for tests and reports."""
    return [(t.name, p.name) for t, p, blocker in _transpose_pairs(graph, _Analysis(graph)) if blocker is None]


def _transpose_pairs(graph: Graph, a: _Analysis):
    """Follow each transpose down its chain of single consumers (elementwise ops, and reductions
    and softmax it can pass) to a transpose it would cancel with; yield (transpose, partner, why
    they stay apart or None)."""
    for t in graph.nodes:
        first = a.transposed(t.outputs[0]) if _is_onnx(t, "Transpose") else None
        if first is None:
            continue
        p, v, blocker = first[1], t.outputs[0], None
        for _ in range(MAX_LOOKAHEAD_DEPTH):
            users = graph.users(v.name)
            if len(users) != 1 or graph.is_output(v.name):
                break
            (c,) = users
            if _is_onnx(c, "Transpose"):
                q = perm_of(c)
                if q is not None and len(q) == len(p) and _trivial(compose(p, q), unpermute(_shape(v), p)):
                    yield t, c, blocker
                break
            if c.domain != "" or len(c.outputs) != 1 or not has_op(c.op):
                break
            push = a.pushable(c, (v.name, p))
            if not is_pointwise(c.op, c.domain):
                if push is None:
                    break
                p = push.out_perm
            elif push is None and blocker is None:
                blocker = _why_not(a, c, v, p)
            v = c.outputs[0]
            vs = _shape(v)
            if vs is None or len(vs) != len(p):
                break  # a broadcast grew the rank: p no longer describes v's dims


def _why_not(a: _Analysis, node: Node, v: Value, p: Perm) -> str:
    """Why elementwise `node` cannot take a Transpose(p) on its input `v`."""
    out = _shape(node.outputs[0])
    if _shape(v) != out:
        return f"{node.op} '{node.name}' broadcasts the transposed value to a bigger shape {out}"
    for u in node.inputs:
        if (
            u is not None
            and u.name != v.name
            and a._perm_in(u, (v.name, p)) != p
            and a.convertible(u, p, len(p)) is None
        ):
            return f"input '{u.name}' of {node.op} '{node.name}' would need a transpose of its own"
    return f"{node.op} '{node.name}' does not take it"


# ---- analysis of the old graph ------------------------------------------------------------------


def _is_onnx(node: Node, *ops: str) -> bool:
    return node.domain == "" and node.op in ops


def _is_internal_matmul(node: Node) -> bool:
    return node.domain == INTERNAL_DOMAIN and node.op == "MatMul"


def _shape(v: Value | None) -> tuple | None:
    if v is None or not isinstance(v.type, TensorType):
        return None
    return v.type.shape


def _static(shape: Sequence | None) -> bool:
    return shape is not None and all(isinstance(d, int) for d in shape)


def _trivial(p: Perm, in_shape: Sequence | None) -> bool:
    """A transpose with perm p of a value of `in_shape` costs nothing (it is no transpose, or a
    reshape once UNIT has run)."""
    return is_identity(p) or (_static(in_shape) and moves_only_unit_dims(p, in_shape))


def _folds(node: Node) -> bool:
    """Constant folding materializes this node's outputs once its inputs are constants."""
    types = [v.type for v in (*node.inputs, *node.outputs) if v is not None]
    if not all(isinstance(t, TensorType) and t.is_static for t in types):
        return False
    in_bytes = sum(v.type.nbytes for v in node.inputs if v is not None)
    return all(o.type.nbytes <= max(FOLD_SMALL_BYTES, in_bytes) for o in node.outputs)


@dataclass(frozen=True)
class _Push:
    """How a node can take transposed inputs: the perm p they share, the perm of the transpose
    after the node, which inputs are read through their transpose, how the others convert."""

    perm: Perm
    out_perm: Perm
    t_slots: tuple[int, ...]
    convert: dict[int, str] = field(default_factory=dict)  # slot -> "keep" | "const" | "reshape"
    axes: tuple[int, ...] | None = None  # reductions: the axes of the pre-transpose input
    axis: int | None = None  # softmax: the axis of the pre-transpose input


class _Analysis:
    """Facts about one graph, computed lazily and memoized for one sweep."""

    def __init__(self, graph: Graph):
        self.g = graph
        # Values constant folding will turn into constants (mirroring its size policy): a
        # transpose of one costs nothing at run time, and is not this pass's to move.
        self.const_derived: set[str] = set(graph.constants)
        for n in graph.nodes:
            present = [v for v in n.inputs if v is not None]
            if present and all(v.name in self.const_derived for v in present) and _folds(n):
                self.const_derived.update(o.name for o in n.outputs)
        self._value: dict[tuple[str, Perm], int] = {}

    # -- transposes --
    def transposed(self, v: Value | None) -> tuple[Node, Perm] | None:
        """(the Transpose node, its perm) if `v` is a Transpose of a non-constant value that moves
        data (one that moves only size-1 dims is a Reshape, see RULE_UNIT)."""
        if v is None:
            return None
        n = self.g.producer(v.name)
        if n is None or not _is_onnx(n, "Transpose") or n.inputs[0].name in self.const_derived:
            return None
        p = perm_of(n)
        return None if p is None or _trivial(p, _shape(n.inputs[0])) else (n, p)

    def _perm_in(self, v: Value | None, assume: tuple[str, Perm] | None) -> Perm | None:
        if v is None:
            return None
        if assume is not None and v.name == assume[0]:
            return assume[1]
        t = self.transposed(v)
        return None if t is None else t[1]

    # -- which inputs convert for free --
    def convertible(self, v: Value, p: Perm, rank: int) -> str | None:
        """How input `v` of a node whose other inputs lose their transpose p becomes v' with
        transpose(v', p) == v (broadcast-aligned to `rank`): "keep" when v broadcasts the same
        either way, "const" for a constant (constant folding transposes it), "reshape" when the
        transposition moves only size-1 dims; None when it would cost a transpose at run time."""
        shape = _shape(v)
        if shape is None or len(shape) > rank:
            return None
        if all(d == 1 for d in shape):
            return "keep"
        aligned = (1,) * (rank - len(shape)) + tuple(shape)
        if v.name in self.const_derived:
            return "const" if _static(shape) else None
        if not _static(shape) or not moves_only_unit_dims(inverse(p), aligned):
            return None
        # Moving only size-1 dims keeps the data in order: equal shapes are the same tensor.
        return "keep" if permute(aligned, inverse(p)) == aligned else "reshape"

    # -- how a node takes transposed inputs --
    def pushable(self, node: Node, assume: tuple[str, Perm] | None = None) -> _Push | None:
        """How `node` takes its transposed inputs (with `assume`: value name -> perm, a transpose
        not there yet, for the lookahead), or None if it cannot."""
        if node.domain != "" or len(node.outputs) != 1:
            return None
        out = _shape(node.outputs[0])
        if out is None:
            return None
        if is_axes_reduction(node):
            return self._pushable_reduce(node, assume, out)
        if node.op in _SOFTMAX_OPS:
            p = self._perm_in(node.inputs[0], assume)
            if p is None:
                return None
            axis = node.attrs.axis + len(p) if node.attrs.axis < 0 else node.attrs.axis
            return _Push(p, p, (0,), axis=p[axis])
        if not is_pointwise(node.op):
            return None
        rank = len(out)
        p = None
        for v in node.inputs:
            q = self._perm_in(v, assume)
            # The transpose after the node must be no bigger than one it replaces.
            if q is not None and len(q) == rank and _shape(v) == out:
                p = q
                break
        if p is None:
            return None
        t_slots, convert = [], {}
        for i, v in enumerate(node.inputs):
            if v is None:
                continue
            if self._perm_in(v, assume) == p:
                t_slots.append(i)
                continue
            how = self.convertible(v, p, rank)
            if how is None:
                return None
            convert[i] = how
        return _Push(p, p, tuple(t_slots), convert)

    def _pushable_reduce(self, node: Node, assume, out) -> _Push | None:
        p = self._perm_in(node.inputs[0], assume)
        x_shape = _shape(node.inputs[0])
        if p is None or x_shape is None or len(x_shape) != len(p):
            return None
        rank = len(p)
        axes_v = node.input(1)
        if axes_v is None:
            axes = []
        else:
            data = self.g.const(axes_v.name)
            if data is None:
                return None
            axes = [int(a) for a in np.asarray(data).reshape(-1)]
        if not axes:
            if node.attrs.noop_with_empty_axes:
                return None
            axes = list(range(rank))
        axes = sorted({a + rank if a < 0 else a for a in axes})
        if node.attrs.keepdims:
            out_perm = p
        else:
            src = [p[i] for i in range(rank) if i not in axes]
            order = sorted(src)
            out_perm = tuple(order.index(s) for s in src)
        return _Push(p, out_perm, (0,), axes=tuple(sorted(p[a] for a in axes)))

    # -- matmuls that absorb a transpose of the last two dims --
    def absorbs(self, node: Node, v: Value, p: Perm) -> bool:
        if not is_last_two_swap(p):
            return False
        if _is_internal_matmul(node):
            return True
        if _is_onnx(node, "MatMul"):
            return all((s := _shape(x)) is not None and len(s) >= 2 for x in node.inputs)
        if _is_onnx(node, "Gemm"):
            return node.input(2) is None or node.input(2).name != v.name
        return False

    # -- the lookahead --
    def value(self, v: Value, p: Perm, depth: int = 0) -> int:
        """How many transposes executed at run time go away, at best, if a Transpose(p) sitting
        on `v` moves on into v's consumers (0: it stays where it is)."""
        key = (v.name, p)
        if key in self._value:
            return self._value[key]
        result = 0
        if depth < MAX_LOOKAHEAD_DEPTH:
            takes = [self.take(c, v, p, depth) for c in self.g.users(v.name)]
            partial = sum(t for t in takes if t is not None and t > 0)
            result = max(0, partial)
            if takes and all(t is not None for t in takes) and not self.g.is_output(v.name):
                result = max(result, 1 + sum(takes))  # the transpose at v itself goes
        self._value[key] = result
        return result

    def take(self, node: Node, v: Value, p: Perm, depth: int = 0) -> int | None:
        """The change in transposes executed when consumer `node` takes the Transpose(p) on its
        input `v` (None: it cannot), not counting the transpose at v itself."""
        if _is_onnx(node, "Transpose"):
            q = perm_of(node)
            if q is None or len(q) != len(p) or _shape(v) is None:
                return None
            src = unpermute(_shape(v), p)
            return 1 if _trivial(compose(p, q), src) else 0
        if self.absorbs(node, v, p):
            return 0
        push = self.pushable(node, (v.name, p))
        if push is None:
            return None
        gain = len(self._retired(node, push, exclude=v)) - 1  # a transpose after the node
        out = node.outputs[0]
        if _trivial(push.out_perm, unpermute(_shape(out), push.out_perm)):
            return gain + 1
        return gain + self.value(out, push.out_perm, depth + 1)

    def _retired(self, node: Node, push: _Push, exclude: Value | None = None) -> list[Value]:
        """The transposed inputs of `node` that a push retires (node is their only consumer)."""
        out = []
        for i in push.t_slots:
            v = node.inputs[i]
            if exclude is not None and v.name == exclude.name or any(v.name == o.name for o in out):
                continue
            if self.g.users(v.name) == [node] and not self.g.is_output(v.name):
                out.append(v)
        return out

    def should_push(self, node: Node, push: _Push) -> bool:
        """Whether the best plan for one of node's transposed inputs moves it into `node`."""
        seen = set()
        for i in push.t_slots:
            v = node.inputs[i]
            if v.name in seen or self.transposed(v) is None:
                continue
            seen.add(v.name)
            users = self.g.users(v.name)
            takes = {u.name: self.take(u, v, push.perm) for u in users}
            mine = takes[node.name]
            if mine is None:
                continue
            partial = sum(t for t in takes.values() if t is not None and t > 0)
            full = None
            if all(t is not None for t in takes.values()) and not self.g.is_output(v.name):
                full = 1 + sum(takes.values())
            if full is not None and full > max(partial, 0):
                return True  # every consumer takes it, this one included
            if mine > 0:
                return True
        return False


# ---- the sweep ----------------------------------------------------------------------------------


@dataclass
class _Ctx:
    a: _Analysis
    b: GraphBuilder
    new: Callable[[Value | None], Value | None]

    def is_const(self, v: Value) -> bool:
        return v.name in self.a.const_derived


@dataclass
class _Result:
    """What a rule built: the root's replacement outputs, the old nodes it absorbed (provenance
    of every new node, unless `origins` names the old nodes of a new node by its name)."""

    outputs: list[Value]
    matched: list[Node]
    origins: dict[str, list[Node]] | None = None


Rewrite = Callable[[Node, _Ctx], "_Result | tuple[list[Value], list[Node]] | None"]


def _sweep(graph: Graph, fired: list[str] | None) -> Graph:
    """One sweep of the rules through passes/rewrite.py's driver."""
    rc = RewriteContext(graph)
    ctx = _Ctx(_Analysis(graph), rc.b, rc.new)

    def visit(node: Node, _: RewriteContext) -> Rewritten | None:
        for name, rule in _rules_for(node):
            mark = checkpoint(rc.b)
            res = rule(node, ctx)
            if isinstance(res, tuple):
                res = _Result(*res)
            if res is not None and any(n.type != o.type for n, o in zip(res.outputs, node.outputs, strict=True)):
                log.warning("%s at '%s' declined: it would change an output type", name, node.name)
                res = None
            if res is None:
                rollback(rc.b, mark)  # the next rule starts from a clean builder
                continue
            if fired is not None:
                fired.append(f"{name} at '{node.name}'")
            log.debug("rule %s fired at %s", name, node.name)
            origins = {k: list(v) for k, v in (res.origins or {}).items()}
            return Rewritten(res.outputs, (node, *res.matched), origins)
        return None

    return rewrite_graph(graph, visit, context=rc)


def _rules_for(node: Node) -> list[tuple[str, Rewrite]]:
    if node.domain == "":
        if node.op == "Transpose":
            return [
                (RULE_MERGE, _merge),
                (RULE_UNIT, _unit_to_reshape),
                (RULE_MATMUL_T, _transpose_of_matmul),
                (RULE_GEMM_T, _transpose_of_gemm),
            ]
        if node.op == "MatMul":
            return [(RULE_MATMUL, _absorb_into_matmul)]
        if node.op == "Gemm":
            return [(RULE_GEMM, _absorb_into_gemm)]
        if is_axes_reduction(node):
            return [(RULE_PUSH_REDUCE, _push)]
        if node.op in _SOFTMAX_OPS:
            return [(RULE_PUSH_SOFTMAX, _push)]
        return [(RULE_PUSH, _push)]
    if _is_internal_matmul(node):
        return [(RULE_MATMUL, _absorb_into_matmul)]
    return []


# ---- rules --------------------------------------------------------------------------------------


def _transpose(c: _Ctx, x: Value, p: Perm, name: str, keep_name: bool = False) -> Value:
    """`keep_name`: the node replaces the rule's root, whose name is still free in the builder."""
    if is_identity(p):
        return x
    return c.b.add_node("Transpose", [x], {"perm": list(p)}, name=name, keep_name=keep_name).outputs[0]


def _reshape(c: _Ctx, x: Value, shape: Sequence[int], name: str, keep_name: bool = False) -> Value:
    target = c.b.add_constant(np.array(shape, dtype=np.int64), f"{name}/shape")
    return c.b.add_node("Reshape", [x, target], name=name, keep_name=keep_name).outputs[0]


def _merge(node: Node, c: _Ctx):
    t = c.a.g.producer(node.inputs[0].name)
    if t is None or not _is_onnx(t, "Transpose"):
        return None
    p, q = perm_of(t), perm_of(node)
    if p is None or q is None:
        return None
    x = c.new(t.inputs[0])
    return [_transpose(c, x, compose(p, q), node.name, keep_name=True)], [t]


def _unit_to_reshape(node: Node, c: _Ctx):
    p = perm_of(node)
    shape = _shape(node.inputs[0])
    if p is None or not _static(shape) or not moves_only_unit_dims(p, shape):
        return None
    users = c.a.g.users(node.outputs[0].name)
    if not is_last_two_swap(p) and users and all(_is_onnx(u, "MatMul") or _is_internal_matmul(u) for u in users):
        # Attention's head transposes of Q, K, V move only size-1 dims when a dim is 1 (one token
        # while decoding, one head): keep them for attention fusion, which looks for them.
        return None
    return [_reshape(c, c.new(node.inputs[0]), permute(shape, p), node.name, keep_name=True)], []


def _single_use(c: _Ctx, v: Value, user: Node) -> bool:
    return c.a.g.users(v.name) == [user] and not c.a.g.is_output(v.name)


def _emit_matmul(
    c: _Ctx, a: Value, b: Value, ta: int, tb: int, alpha: float, name: str, consts=(False, False), keep_name=False
) -> Value:
    """graphc.MatMul(a, b) with flags; plain MatMul when it needs none. A transposed constant
    operand gets an explicit Transpose instead of a flag: constant folding lays out the weight."""
    if ta and consts[0]:
        a, ta = _transpose(c, a, _swap(a), f"{name}/a_t"), 0
    if tb and consts[1]:
        b, tb = _transpose(c, b, _swap(b), f"{name}/b_t"), 0
    if not ta and not tb and alpha == 1.0:
        return c.b.add_node("MatMul", [a, b], name=name, keep_name=keep_name).outputs[0]
    attrs = {"trans_a": int(ta), "trans_b": int(tb), "alpha": float(alpha)}
    return c.b.add_node("MatMul", [a, b], attrs, name=name, domain=INTERNAL_DOMAIN, keep_name=keep_name).outputs[0]


def _swap(v: Value) -> Perm:
    n = len(_shape(v))
    return (*range(n - 2), n - 1, n - 2)


def _matmul_flags(node: Node) -> tuple[int, int, float]:
    if _is_internal_matmul(node):
        return int(node.attrs.trans_a), int(node.attrs.trans_b), float(node.attrs.alpha)
    return 0, 0, 1.0


def _merges_first(c: _Ctx, t: Node) -> bool:
    """Transpose `t` reads a transpose that only it reads: MERGE makes them one this sweep; the
    matmul decides on the merged perm next sweep. (The K^T of attention, split by exporters into
    (0,2,1,3) then (0,1,3,2), becomes one Transpose(0,2,3,1) rather than a half-folded pair.)"""
    inner = c.a.g.producer(t.inputs[0].name)
    return inner is not None and _is_onnx(inner, "Transpose") and _single_use(c, t.inputs[0], t)


def _absorb_into_matmul(node: Node, c: _Ctx):
    if _is_onnx(node, "MatMul") and not all((s := _shape(v)) is not None and len(s) >= 2 for v in node.inputs):
        return None  # graphc.MatMul has no vector operands
    flags = list(_matmul_flags(node)[:2])
    alpha = _matmul_flags(node)[2]
    operands, matched = [], []
    for i, v in enumerate(node.inputs[:2]):
        t = c.a.transposed(v)
        if t is not None and is_last_two_swap(t[1]) and not _merges_first(c, t[0]):
            operands.append(c.new(t[0].inputs[0]))
            flags[i] ^= 1
            matched.append(t[0])
        else:
            operands.append(c.new(v))
    if not matched:
        return None
    y = _emit_matmul(c, operands[0], operands[1], flags[0], flags[1], alpha, node.name, keep_name=True)
    return [y], matched


def _absorb_into_gemm(node: Node, c: _Ctx):
    attrs, ins, matched = node.attrs, [c.new(v) for v in node.inputs], []
    for i, flag in ((0, "transA"), (1, "transB")):
        t = c.a.transposed(node.inputs[i])
        if t is not None and t[1] == (1, 0) and not _merges_first(c, t[0]):
            ins[i] = c.new(t[0].inputs[0])
            attrs = attrs.replace(**{flag: 1 - getattr(attrs, flag)})
            matched.append(t[0])
    if not matched:
        return None
    return [c.b.add_node("Gemm", ins, attrs, name=node.name, keep_name=True).outputs[0]], matched


def _transpose_of_matmul(node: Node, c: _Ctx):
    p = perm_of(node)
    m = c.a.g.producer(node.inputs[0].name)
    if p is None or not is_last_two_swap(p) or m is None or not _single_use(c, node.inputs[0], node):
        return None
    if not (_is_internal_matmul(m) or _is_onnx(m, "MatMul")):
        return None
    a, b = m.inputs
    if any((s := _shape(v)) is None or len(s) < 2 for v in (a, b)):
        return None
    ta, tb, alpha = _matmul_flags(m)
    # (op(a) op(b))^T = op(b)^T op(a)^T
    y = _emit_matmul(c, c.new(b), c.new(a), 1 - tb, 1 - ta, alpha, m.name, (c.is_const(b), c.is_const(a)))
    return [y], [m]


def _transpose_of_gemm(node: Node, c: _Ctx):
    g = c.a.g.producer(node.inputs[0].name)
    if perm_of(node) != (1, 0) or g is None or not _is_onnx(g, "Gemm") or not _single_use(c, node.inputs[0], node):
        return None
    a, b = g.inputs[0], g.inputs[1]
    cv = g.input(2)
    new_c = None
    if cv is not None:
        new_c = _convert(c, cv, (1, 0), 2, f"{g.name}/c")
        if new_c is None:
            return None
    ta, tb = g.attrs.transA, g.attrs.transB
    # (op(A) op(B))^T = op(B)^T op(A)^T; a constant operand keeps its flag off (folded layout)
    ins, flags = [], []
    for v, flag in ((b, 1 - tb), (a, 1 - ta)):
        if flag and c.is_const(v):
            ins.append(_transpose(c, c.new(v), (1, 0), f"{g.name}/w_t"))
            flags.append(0)
        else:
            ins.append(c.new(v))
            flags.append(flag)
    attrs = g.attrs.replace(transA=flags[0], transB=flags[1])
    return [c.b.add_node("Gemm", [*ins, new_c], attrs, name=g.name).outputs[0]], [g]


def _convert(c: _Ctx, v: Value, p: Perm, rank: int, name: str) -> Value | None:
    """v' with transpose(v', p) == v broadcast-aligned to `rank` (see _Analysis.convertible)."""
    how = c.a.convertible(v, p, rank)
    if how is None:
        return None
    nv = c.new(v)
    if how == "keep":
        return nv
    shape = _shape(v)
    aligned = (1,) * (rank - len(shape)) + tuple(shape)
    if how == "reshape":
        return _reshape(c, nv, permute(aligned, inverse(p)), f"{name}/reshape")
    # A constant: emit the arithmetic, constant folding evaluates it.
    if len(aligned) != len(shape):
        nv = _reshape(c, nv, aligned, f"{name}/align")
    return _transpose(c, nv, inverse(p), f"{name}/transpose")


def _push(node: Node, c: _Ctx):
    push = c.a.pushable(node)
    if push is None or not c.a.should_push(node, push):
        return None
    rank = len(push.perm)
    ins: list[Value | None] = []
    retired = []
    for i, v in enumerate(node.inputs):
        if v is None:
            ins.append(None)
        elif i in push.t_slots:
            t = c.a.transposed(v)
            ins.append(c.new(t[0].inputs[0]))
            retired.append(t[0])
        elif push.axes is not None or push.axis is not None:
            break  # a reduction's axes are rebuilt below; softmax has one input
        else:
            nv = _convert(c, v, push.perm, rank, f"{node.name}/in{i}")
            if nv is None:
                return None
            ins.append(nv)
    attrs = node.attrs
    if push.axes is not None:
        ins = [ins[0], c.b.add_constant(np.array(push.axes, dtype=np.int64), f"{node.name}/axes")]
    if push.axis is not None:
        attrs = attrs.replace(axis=push.axis)
    y = c.b.add_node(node.op, ins, attrs, name=node.name, keep_name=True)
    out = _transpose(c, y.outputs[0], push.out_perm, f"{node.name}/transpose")
    # The node stands for itself; the transpose after it for the transposes it replaces.
    retired = list(dict.fromkeys(retired))
    origins = {y.name: [node]} if out is y.outputs[0] else {y.name: [node], c.b.nodes[-1].name: retired}
    return _Result([out], retired, origins)
