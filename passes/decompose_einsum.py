"""Einsum as Transpose / Reshape / ReduceSum / MatMul, for the CUDA target (which has GEMM kernels,
not an Einsum kernel).

Operands are combined left to right. For a pair with subscripts a and b, each letter is one of

    batch     in a, in b, and wanted later (by the output or a later operand): a batch dim
    contract  in a and b, wanted by nobody else: summed by the matrix product
    left      in a only (and wanted): rows;  right: in b only (and wanted): columns
    (a letter that only one operand has and nobody wants is summed out of that operand first)

so the pair becomes Transpose(a) -> Reshape [*batch, L, K], Transpose(b) -> Reshape [*batch, K, R],
MatMul, Reshape [*batch, *left, *right]; a last Transpose puts the letters in the output's order.
Transposes next to the MatMul then fold into its operand flags (passes/transpose.py), so
"bhqd,bhkd->bhqk" ends as one batched GEMM reading K transposed in place.

Declined (the node stays; the CUDA target then names it): non-float types, dynamic shapes, a
letter repeated within one operand (a diagonal), and a shared letter whose sizes differ (broadcast
of size-1 dims). Ellipses are spelled out into letters first.
"""

from __future__ import annotations

import logging
import math
import string

import numpy as np

from graphc.ir.builder import GraphBuilder
from graphc.ir.graph import Graph, Node, Value
from graphc.ir.types import DType
from graphc.passes.rewrite import Match, Op, Rule, apply_rules, static_shape

log = logging.getLogger(__name__)

RULE = "einsum(a, b, ...) -> matmul(reshape(transpose(a)), reshape(transpose(b)))..."
FLOATS = frozenset({DType.float32, DType.float16, DType.bfloat16, DType.float64})


def parse_equation(equation: str, ranks: list[int]) -> tuple[list[str], str] | None:
    """Each operand's letters and the output's, ellipses replaced by letters the equation does not
    use (aligned from the right, as numpy broadcasts them); None when the equation is malformed."""
    eq = equation.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        return None
    free = [c for c in string.ascii_letters if c not in eq]
    widest = max((r - (len(t) - 3) for t, r in zip(terms, ranks, strict=True) if "..." in t), default=0)
    if widest < 0 or widest > len(free):
        return None
    ell = "".join(free[:widest])
    out_terms = []
    for t, r in zip(terms, ranks, strict=True):
        if "..." in t:
            k = r - (len(t) - 3)
            if k < 0:
                return None
            t = t.replace("...", ell[widest - k :])
        if len(t) != r or not t.isalpha():
            return None
        out_terms.append(t)
    if arrow:
        out = rhs.replace("...", ell)
    else:
        counts = {c: sum(t.count(c) for t in out_terms) for c in set("".join(out_terms))}
        out = ell + "".join(sorted(c for c, n in counts.items() if n == 1 and c not in ell))
    if not out.isalpha() and out != "":
        return None
    return out_terms, out


class _Operand:
    def __init__(self, value: Value, letters: str, sizes: dict[str, int]):
        self.value, self.letters, self.sizes = value, letters, sizes


def _const(b: GraphBuilder, data: list[int], name: str) -> Value:
    return b.add_constant(np.array(data, np.int64), name)


def _transpose(b: GraphBuilder, op: _Operand, order: str, name: str) -> _Operand:
    if order == op.letters:
        return op
    perm = [op.letters.index(c) for c in order]
    v = b.op("Transpose", [op.value], {"perm": perm}, name=name)
    return _Operand(v, order, op.sizes)


def _reshape(b: GraphBuilder, v: Value, shape: list[int], name: str) -> Value:
    if list(v.ttype.shape) == shape:  # type: ignore[arg-type]
        return v
    return b.op("Reshape", [v, _const(b, shape, f"{name}/shape")], name=name)


def _sum_out(b: GraphBuilder, op: _Operand, keep: set[str], name: str) -> _Operand:
    drop = [i for i, c in enumerate(op.letters) if c not in keep]
    if not drop:
        return op
    v = b.op("ReduceSum", [op.value, _const(b, drop, f"{name}/axes")], {"keepdims": 0}, name=name)
    return _Operand(v, "".join(c for c in op.letters if c in keep), op.sizes)


def _pair(b: GraphBuilder, x: _Operand, y: _Operand, wanted: set[str], name: str) -> _Operand:
    x = _sum_out(b, x, wanted | set(y.letters), f"{name}/sum_a")
    y = _sum_out(b, y, wanted | set(x.letters), f"{name}/sum_b")
    batch = [c for c in x.letters if c in y.letters and c in wanted]
    contract = [c for c in x.letters if c in y.letters and c not in wanted]
    left = [c for c in x.letters if c not in y.letters]
    right = [c for c in y.letters if c not in x.letters]
    size = x.sizes

    def prod(cs: list[str]) -> int:
        return math.prod(size[c] for c in cs)

    xt = _transpose(b, x, "".join(batch + left + contract), f"{name}/a_t")
    yt = _transpose(b, y, "".join(batch + contract + right), f"{name}/b_t")
    bs = [size[c] for c in batch]
    xm = _reshape(b, xt.value, [*bs, prod(left), prod(contract)], f"{name}/a_2d")
    ym = _reshape(b, yt.value, [*bs, prod(contract), prod(right)], f"{name}/b_2d")
    z = b.op("MatMul", [xm, ym], name=f"{name}/matmul")
    z = _reshape(b, z, [*bs, *(size[c] for c in left), *(size[c] for c in right)], f"{name}/unfold")
    return _Operand(z, "".join(batch + left + right), size)


def _rewrite(m: Match, b: GraphBuilder) -> Value | None:
    root: Node = m.root
    ins = root.inputs
    if not ins or any(v is None for v in ins):
        return None
    shapes = [static_shape(v) for v in ins]
    if any(s is None for s in shapes):
        return None
    if ins[0].ttype.dtype not in FLOATS:
        return None
    parsed = parse_equation(root.attrs.equation, [len(s) for s in shapes])  # type: ignore[arg-type]
    if parsed is None:
        return None
    terms, out = parsed
    sizes: dict[str, int] = {}
    for t, s in zip(terms, shapes, strict=True):
        if len(set(t)) != len(t):
            return None  # a diagonal
        for c, d in zip(t, s, strict=True):  # type: ignore[arg-type]
            if sizes.setdefault(c, d) != d:
                return None  # broadcast of a size-1 dim: not written out here
    if len(set(out)) != len(out) or any(c not in sizes for c in out):
        return None
    ops = [_Operand(m.new(v), t, sizes) for v, t in zip(ins, terms, strict=True)]  # type: ignore[arg-type]
    name = root.name
    acc = ops[0]
    for i, nxt in enumerate(ops[1:], start=1):
        wanted = set(out).union(*(o.letters for o in ops[i + 1 :]))
        acc = _pair(b, acc, nxt, wanted, f"{name}/pair{i}")
    acc = _sum_out(b, acc, set(out), f"{name}/sum")
    if acc.letters == out:
        return b.op("Identity", [acc.value], name=name)
    return b.op("Transpose", [acc.value], {"perm": [acc.letters.index(c) for c in out]}, name=name)


RULES = [Rule(RULE, Op("Einsum", any_inputs=True), _rewrite)]


def decompose_einsum(graph: Graph, *, fired: list[str] | None = None) -> Graph:
    """Every Einsum that the rules above can write out."""
    return apply_rules(graph, RULES, fired=fired)
