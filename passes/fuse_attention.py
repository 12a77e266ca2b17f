"""Fuse scaled dot-product attention, Softmax(Q @ K^T * scale + mask) @ V, into one Attention node.

What is recognized, walking back from each Softmax over the last axis of a 4-D tensor (scores
computed by 3-D batched matmuls over (batch * heads), viewed 4-D only around the mask and the
Softmax, as DeBERTa-v2 and BLOOM export them, are first rewritten to 4-D throughout by
passes/canonicalize_bmm_attention.py):

- scores: MatMul(Q, K^T), or graphc.MatMul with trans flags and alpha (transpose elimination
  folds a Transpose of K's last two dims into trans_b=1; affine folding may put the scale into
  alpha). K^T is K's Transpose(0,2,3,1) of the (batch, seq, heads, head_dim) Reshape, or
  Transpose(0,2,1,3) then a swap of the last two dims (merged or not), or trans_b=1.
- scale: Mul or Div by scalar constants, on the scores or on Q and/or K before the matmul (also
  between their Reshape and Transpose); the product becomes Attention's `scale`, always set
  explicitly (1 when there is none, not the op's 1/sqrt(head_dim) default).
- mask: Add of any value broadcastable to the scores (an additive float mask, e.g. BERT's, made
  at run time from attention_mask: it stays an input, computed as before), and/or
  Where(cond, scores, fill) with fill -inf or a large negative constant (finfo.min, -1e4...):
  cond is a boolean "keep" mask, as Attention's bool attn_mask is (Where(cond, fill, scores)
  keeps Not(cond)). An additive mask that only adds 0 or -inf or a fill that absorbs the scores
  (transformers' Where(keep, 0, finfo.min), a constant of 0 / -inf) is the same boolean mask and
  becomes one (see Exactness for the rows it masks wholly). Constant
  terms of a boolean mask's And are dropped when all True, and turned into is_causal=1 when they
  are the causal pattern (GPT-2's causal & padding mask: is_causal=1 plus the padding mask).
  Several masks combine into one attn_mask: additive ones are summed, boolean ones joined with
  And, and both together become Where(keep, sum, -inf). A constant added to every score goes
  (softmax ignores it).
- softcap: c * tanh(scores / c) between the scale and the mask -> Attention's `softcap`.
- output: Softmax feeds only the P @ V matmul, possibly through the "safe softmax"
  Where(row attends nothing, 0, P) that ONNX's own Attention function writes (Attention zeroes
  such rows itself), so an inlined Attention function fuses back into one node; or through
  torch's NaN guard Where(IsNaN(P), 0, P), dropped under the condition `_nan_guard` states.

Layout: when Q, K and V come from (batch, seq, heads, head_dim) tensors through
Transpose(0,2,1,3) (the Reshape-then-Transpose split of heads) the node takes Attention's 3-D
form, (batch, seq, heads * head_dim) with q_num_heads / kv_num_heads, and the head split
disappears; when the output goes through Transpose(0,2,1,3) (and a Reshape merging heads), that
goes too. Otherwise the 4-D form (batch, heads, seq, head_dim) is used.

Exactness: the rewrite is exact up to float rounding on every row that attends to at least one
key. A row whose every key is masked (a padding query whose window holds only padding keys, a
left-padded row under a causal mask) is where the mask's fill matters:
- a finite fill replacing the scores (Where(keep, scores, finfo.min)), or added to them and so
  large that it absorbs every score (Where(keep, 0, finfo.min) + scores: score + fill == fill
  below -1e30), makes such a row uniform: the decomposed graph (and ONNX Runtime) gives the mean
  of V over all keys. Attention gives 0 there unless told otherwise: the fused node gets
  graphc's masked_rows="mean" (graphc.ops.attention), and its kernels store mean(V) into a row
  with no kept key (a cold path, taken only by a block that has such a row). Left at "zero" when
  the mask is a constant with no such row. The bool mask and is_causal stay, so the kernels keep
  their fast paths, and no node is added.
- an added finite fill that does not absorb the scores (-1e4, -1e9) leaves such a row a softmax
  of the scores plus the fill: that mask stays additive (a float mask), which Attention adds as
  the decomposed graph did.
- a -inf fill gives NaN rows in the decomposed graph: under the "safe softmax" or NaN guard
  forms below those rows are 0, Attention's default; without either, the fused node gets
  masked_rows="nan" (so do float masks computed at run time, which may hold -inf) whenever the
  masks may leave a row no key, and stores NaN there as the decomposed graph does.
A finite-fill keep mask that can wholly mask a row must be the only mask term (one Where or one
added mask; an And of conditions inside it is fine) besides float biases bounded by construction
(constants, gathers from constant tables, integers cast to float, their views, sums and products: a
relative-position bias, BLOOM's ALiBi from a CumSum of the mask, `_bound`), which the fill absorbs
as it does the scores, or biases made from the activations by matmuls inside that Where, which
replaces them with the scores (DeBERTa's Where(keep, scores + c2p + p2c, finfo.min),
`_inside_the_fill`); either becomes Where(keep, bias, -inf), a float mask. Combined with other
terms (a -inf Where, a float mask fed at run time, a second fill) such a row averages V over some
subset of the keys, which this form does not express, so the Softmax is not fused. A constant term that leaves
every row a key (the causal pattern) counts as a plain boolean one (is_causal) when it is alone,
or its fill is -inf, or the other terms are biases too small to bring a row's kept keys down to its
fill. Otherwise (legacy GPT-2's Where(causal, scores, finfo.min) + (1 - mask) * finfo.min) a
left-padded row's kept keys tie with the keys the causal term drops, and the decomposed graph
averages V over both: an absorbing fill then joins the float mask as Where(causal, 0, fill), which
is exact (score + fill == fill), and a fill that does not absorb (masked_bias -1e4) is not fused.

Attention nodes already in the model are left as they are.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import ml_dtypes
import numpy as np

from graphc.ir.builder import GraphBuilder
from graphc.ir.graph import Graph, Node, Value
from graphc.ir.types import DType, TensorType
from graphc.ops.internal import INTERNAL_DOMAIN
from graphc.passes.fuse_util import is_float_data, is_onnx, scalar
from graphc.passes.rewrite import RewriteContext, Rewritten, rewrite_graph

# A Where fill at or below this is "masked": exp(fill - row max) is 0 in float32 for any
# realistic score, so replacing it by -inf changes nothing on rows that attend somewhere.
MASK_FILL_MAX = -1e4
# An added fill at or below this absorbs every realistic score (score + fill == fill exactly in
# float32 for |score| < 3e22; finfo(float32).min is -3.4e38), so a row it masks wholly is uniform.
# float16's finfo.min (-65504) is no such fill: it stays an additive mask.
ABSORBING_FILL = -1e30
_HEAD_SPLIT = (0, 2, 1, 3)  # (batch, seq, heads, dim) <-> (batch, heads, seq, dim)
_IDENTITY = (0, 1, 2, 3)
_SWAP_LAST = (0, 1, 3, 2)


class _Decline(Exception):
    """Not fused; the message (if any) is a near miss worth telling the user."""

    def __init__(self, message: str | None = None):
        super().__init__(message)
        self.message = message


# ---- tracing operands back through layout and scale ops ------------------------------------------


def _compose(inner: tuple[int, ...], outer: tuple[int, ...]) -> tuple[int, ...]:
    """transpose(transpose(x, inner), outer) == transpose(x, result)."""
    return tuple(inner[j] for j in outer)


@dataclass
class _Operand:
    """The logical 4-D operand = scale * transpose(base, perm)."""

    base: Value
    perm: tuple[int, ...]
    scale: float = 1.0
    walked: list[Node] = field(default_factory=list)
    view: tuple[int, ...] | None = None  # base reshaped to this 4-D shape first (an alias)

    def shape(self) -> tuple:
        s = self.view or self.base.ttype.shape
        return tuple(s[p] for p in self.perm)


def _scalar_factor(g: Graph, node: Node) -> tuple[Value, float] | None:
    """(x, f) when node is x * c, c * x or x / c with c a scalar float constant and the result
    of x's shape and dtype; the node's value is x * f."""
    if not is_onnx(node, "Mul", "Div") or len(node.inputs) != 2:
        return None
    a, c = node.inputs
    order = [(a, c)] if node.op == "Div" else [(a, c), (c, a)]
    for x, k in order:
        if x is None or k is None:
            continue
        data = g.const(k.name)
        if data is None or not is_float_data(data) or x.type != node.outputs[0].type:
            continue
        s = scalar(data)
        if s is None or not math.isfinite(s) or s == 0:
            continue
        return x, (s if node.op == "Mul" else 1.0 / s)
    return None


def _trace(g: Graph, v: Value, perm: tuple[int, ...], *, scales: bool) -> _Operand:
    """Walk back from v (logically transpose(v, perm)) through Transposes and, with `scales`,
    scalar Mul/Div, to the value where the layout starts."""
    op = _Operand(v, perm)
    while True:
        n = g.producer(op.base.name)
        if is_onnx(n, "Transpose") and n.inputs[0] is not None and n.inputs[0].ttype.shape is not None:
            p = n.attrs.perm
            p = tuple(p) if p is not None else tuple(reversed(range(len(n.inputs[0].ttype.shape))))
            if len(p) != 4:
                break
            op.perm = _compose(p, op.perm)
            op.base = n.inputs[0]
            op.walked.append(n)
            continue
        if scales and n is not None:
            f = _scalar_factor(g, n)
            if f is not None:
                op.base, factor = f
                op.scale *= factor
                op.walked.append(n)
                continue
        break
    return op


def _repeat_kv(g: Graph, op: _Operand) -> _Operand:
    """The operand with transformers' repeat_kv looked through: base = Reshape(Expand(
    Unsqueeze(kv, 2) to (B, kvh, n, S, D)) to (B, kvh * n, S, D)), the n-fold copy of each kv
    head that grouped-query attention reads. Attention takes kv with kvh heads itself (query head
    h reads kv head h // n, the same copy), so the operand becomes kv, traced on through its own
    layout ops; the copies are never made. Unchanged when the base is not such a copy or the
    logical heads axis is not the copy's axis 1."""
    if op.perm[1] != 1:
        return op
    r = g.producer(op.base.name)
    if not is_onnx(r, "Reshape"):
        return op
    e = g.producer(r.inputs[0].name)
    if not is_onnx(e, "Expand"):
        return op
    u = g.producer(e.inputs[0].name)
    if not is_onnx(u, "Reshape", "Unsqueeze"):
        return op
    kv = u.inputs[0]
    s_out, s_exp, s_in, s_kv = (t.ttype.shape for t in (r.outputs[0], e.outputs[0], e.inputs[0], kv))
    if any(s is None or not all(isinstance(d, int) for d in s) for s in (s_out, s_exp, s_in, s_kv)):
        return op
    if len(s_exp) != 5 or len(s_in) != 5:
        return op
    b, kvh, one, sk, d = s_in
    n = s_exp[2]
    if one != 1 or tuple(s_exp) != (b, kvh, n, sk, d) or tuple(s_out) != (b, kvh * n, sk, d):
        return op
    walked = [*op.walked, r, e, u]
    if tuple(s_kv) != (b, kvh, sk, d):
        # Cleanup merged the head split into the unsqueeze (a single kv head's transpose only
        # moves a size-1 axis and became a reshape): any reshape keeps the element order, so kv
        # viewed as (B, kvh, S, D) is the tensor the copies were made of.
        return _Operand(kv, op.perm, op.scale, walked, view=(b, kvh, sk, d))
    inner = _trace(g, kv, op.perm, scales=False)
    return _Operand(inner.base, inner.perm, op.scale, [*walked, *inner.walked])


def _matmul_flags(node: Node) -> tuple[int, int, float] | None:
    """(trans_a, trans_b, alpha) of an ONNX MatMul or a graphc.MatMul; None for anything else."""
    if node.op != "MatMul":
        return None
    if not node.domain:
        return 0, 0, 1.0
    if node.domain == INTERNAL_DOMAIN:
        return node.attrs.trans_a, node.attrs.trans_b, node.attrs.alpha
    return None


# ---- the scores chain between the QK matmul and the Softmax ------------------------------------


@dataclass
class _Chain:
    qk: Node
    nodes: list[Node] = field(default_factory=list)  # from the matmul outward, the Softmax excluded
    kinds: list[str] = field(default_factory=list)  # per node: "scale", "softcap" or "mask"
    scale: float = 1.0
    softcap: float = 0.0
    additive: list[Value] = field(default_factory=list)
    keep: list[tuple[Value, bool, float]] = field(default_factory=list)  # (cond, inverted, fill)
    # per keep: how many of `additive` are inside its Where (added to the scores it keeps)
    inside: list[int] = field(default_factory=list)


def _rank4(v: Value | None) -> bool:
    return v is not None and isinstance(v.type, TensorType) and v.type.shape is not None and len(v.type.shape) == 4


def _fill(g: Graph, v: Value | None) -> float | None:
    """The masking fill v holds (a scalar constant at or below MASK_FILL_MAX, -inf included)."""
    data = None if v is None else g.const(v.name)
    if data is None or not is_float_data(data):
        return None
    s = scalar(data)
    return s if s is not None and s <= MASK_FILL_MAX else None


def _softcap(g: Graph, n: Node) -> tuple[Value, float, list[Node]] | None:
    """(x, c, nodes) when n computes c * tanh(x / c) (Gemma's logit softcapping), with x / c
    written as a Div or a Mul by 1/c."""
    outer = _scalar_factor(g, n)
    if outer is None or outer[1] <= 0:
        return None
    t = g.producer(outer[0].name)
    if not is_onnx(t, "Tanh"):
        return None
    d = g.producer(t.inputs[0].name)
    inner = None if d is None else _scalar_factor(g, d)
    if inner is None or not math.isclose(inner[1] * outer[1], 1.0, rel_tol=1e-6):
        return None
    return inner[0], outer[1], [d, t, n]


def _find_chain(g: Graph, v: Value, depth: int = 0) -> _Chain | None:
    """The chain from a QK matmul to v through scale and mask ops (v = the Softmax input), or
    None if v is not one. Add's operands are tried both ways (a mask may be made by Adds too)."""
    if depth > 8 or not _rank4(v):
        return None
    n = g.producer(v.name)
    if n is None:
        return None
    flags = _matmul_flags(n)
    if flags is not None:
        return _Chain(qk=n) if _rank4(n.inputs[0]) and _rank4(n.inputs[1]) else None
    if n.domain:
        return None
    cap = _softcap(g, n)
    if cap is not None:
        chain = _find_chain(g, cap[0], depth + 1)
        if chain is not None:
            if chain.softcap:
                return None  # two softcaps: not Attention's form
            chain.nodes += cap[2]
            chain.kinds += ["softcap"] * len(cap[2])
            chain.softcap = cap[1]
        return chain
    f = _scalar_factor(g, n)
    if f is not None:
        chain = _find_chain(g, f[0], depth + 1)
        if chain is not None:
            chain.nodes.append(n)
            chain.kinds.append("scale")
            chain.scale *= f[1]
        return chain
    if n.op == "Add" and len(n.inputs) == 2:
        for inner, mask in ((n.inputs[0], n.inputs[1]), (n.inputs[1], n.inputs[0])):
            if inner is None or mask is None or inner.type != n.outputs[0].type:
                continue
            chain = _find_chain(g, inner, depth + 1)
            if chain is not None:
                chain.nodes.append(n)
                chain.kinds.append("mask")
                chain.additive.append(mask)
                return chain
        return None
    if n.op == "Where" and len(n.inputs) == 3:
        cond, a, b = n.inputs
        for inner, other, inverted in ((a, b, False), (b, a, True)):
            fill = _fill(g, other)
            if inner is None or inner.type != n.outputs[0].type or fill is None:
                continue
            chain = _find_chain(g, inner, depth + 1)
            if chain is not None:
                chain.nodes.append(n)
                chain.kinds.append("mask")
                chain.keep.append((cond, inverted, fill))
                chain.inside.append(len(chain.additive))
                return chain
        return None
    return None


# ---- analysis: one plan per Softmax ------------------------------------------------------------


@dataclass
class _Plan:
    root: Node  # the node whose output the Attention result replaces
    softmax: Node
    q: _Operand
    k: _Operand
    v: _Operand
    additive: list[Value | np.ndarray]
    keep: list[tuple[Value | np.ndarray, bool]]  # (keep mask, inverted); arrays are new constants
    is_causal: bool
    # A finite fill may leave a row no key: such rows are the mean of V (masked_rows "mean").
    mean_rows: bool
    # A -inf mask with no NaN guard may leave a row no key: such rows are NaN (masked_rows "nan").
    nan_rows: bool
    scale: float
    softcap: float
    three_d: bool
    heads: tuple[int, int]  # (q heads, kv heads) for the 3-D form
    dims: dict[str, object]
    absorbed: tuple[Node, ...] = ()


def _other_reader(g: Graph, v: Value, user: Node) -> str | None:
    """None when `user` is v's only reader and v is no graph output, else who else reads it."""
    if g.is_output(v.name):
        return "the graph outputs"
    for u in g.users(v.name):
        if u is not user:
            return _name(u)
    return None


def _name(n: Node) -> str:
    return f"{n.op} '{n.name}'" if not n.domain else f"{n.domain}.{n.op} '{n.name}'"


def _nan_guard(g: Graph, p: Value) -> tuple[Node, Node] | None:
    """(IsNaN, Where) when P is read only by Where(IsNaN(P), 0, P), the NaN -> 0 guard that
    torch's exporters write after the Softmax of scaled_dot_product_attention with a boolean
    mask (both the TorchScript symbolic and dynamo's torchlib, torch 2.1 to 2.14 at least).

    Dropping it is exact when Q @ K^T is finite (no NaN or inf in Q or K, no overflow): then a
    row of P is NaN exactly when every one of its scores is -inf, i.e. when the mask masks the
    whole row, and Attention zeroes such a row itself (decided on the mask, in the reference and
    in the CUDA kernel), which is what the guard writes. Only where Q or K already hold NaN/inf
    do the two differ: the guard zeroes those rows, Attention passes the NaN on."""
    users = g.users(p.name)
    if len(users) != 2 or g.is_output(p.name):
        return None
    isnan = next((u for u in users if is_onnx(u, "IsNaN")), None)
    w = next((u for u in users if is_onnx(u, "Where")), None)
    if isnan is None or w is None or len(w.inputs) != 3:
        return None
    nan = isnan.outputs[0]
    if g.is_output(nan.name) or len(g.users(nan.name)) != 1 or w.inputs[0] != nan or w.inputs[2] != p:
        return None
    zero = g.const(w.inputs[1].name) if w.inputs[1] is not None else None
    if zero is None or zero.size != 1 or not is_float_data(zero) or float(zero.reshape(())) != 0.0:
        return None
    return (isnan, w) if w.outputs[0].type == p.type else None


def _safe_softmax(g: Graph, p: Value, chain: _Chain) -> Node | None:
    """P's only reader when it is Where(dead, 0, P) zeroing the rows that attend nothing, which
    Attention does itself: dead is a constant all-False (nothing to zero), or, as ONNX's own
    Attention function writes it, Equal(ReduceMax(mask, last axis), -inf) of the only mask."""
    users = g.users(p.name)
    if len(users) != 1 or g.is_output(p.name):
        return None
    w = users[0]
    if not is_onnx(w, "Where") or w.inputs[2] != p or w.outputs[0].type != p.type:
        return None
    zero = g.const(w.inputs[1].name) if w.inputs[1] is not None else None
    if zero is None or zero.size != 1 or not is_float_data(zero) or float(zero.reshape(())) != 0.0:
        return None
    dead = w.inputs[0]
    data = g.const(dead.name)
    if data is not None:
        return w if data.dtype == np.bool_ and not data.any() else None
    if chain.keep or len(chain.additive) != 1:
        return None
    eq = g.producer(dead.name)
    if not is_onnx(eq, "Equal"):
        return None
    for mx, ninf in ((eq.inputs[0], eq.inputs[1]), (eq.inputs[1], eq.inputs[0])):
        c = g.const(ninf.name)
        r = g.producer(mx.name)
        if c is None or c.size != 1 or not np.isneginf(c).all() or not is_onnx(r, "ReduceMax"):
            continue
        axes = g.const(r.inputs[1].name) if len(r.inputs) > 1 and r.inputs[1] is not None else None
        rank = len(r.inputs[0].ttype.shape or ())
        if (
            r.inputs[0] == chain.additive[0]
            and r.attrs.keepdims == 1
            and axes is not None
            and axes.size == 1
            and int(axes.reshape(())) in (-1, rank - 1)
        ):
            return w
    return None


def _analyze(g: Graph, softmax: Node) -> _Plan | None:
    x = softmax.inputs[0]
    if not _rank4(x) or softmax.attrs.axis not in (-1, 3):
        return None
    chain = _find_chain(g, x)
    if chain is None:
        return None
    where = f"Softmax '{softmax.name}' not fused into Attention"
    # The P @ V matmul (after a "safe softmax" Where that zeroes fully masked rows, if any).
    p = softmax.outputs[0]
    safe = _safe_softmax(g, p, chain)
    guard = _nan_guard(g, p) if safe is None else None
    if safe is not None:
        p = safe.outputs[0]
    elif guard is not None:
        p = guard[1].outputs[0]
    users = g.users(p.name)
    if not users:
        return None
    pv = next((u for u in users if _matmul_flags(u) is not None), users[0])
    other = _other_reader(g, p, pv)
    if other is not None:
        raise _Decline(f"{where}: the probabilities are also used by {other}")
    pv_flags = _matmul_flags(pv)
    if pv_flags is None or pv.inputs[0] != p or pv_flags[0] or pv_flags[2] != 1.0:
        raise _Decline(f"{where}: the probabilities feed {_name(pv)}, not a P @ V matmul")
    # Interior values: each read only by the next node of the chain.
    seq = [chain.qk, *chain.nodes, softmax] + ([safe] if safe is not None else [])
    # (The guard's Softmax output has two readers, IsNaN and Where, both absorbed.)
    for prev, nxt in zip(seq, seq[1:], strict=False):
        other = _other_reader(g, prev.outputs[0], nxt)
        if other is not None:
            raise _Decline(f"{where}: the scores '{prev.outputs[0].name}' are also used by {other}")
    # Attention's order: scale, then softcap, then the mask.
    order = {"scale": 0, "softcap": 1, "mask": 2}
    for (n, kind), prev in zip(zip(chain.nodes, chain.kinds, strict=True), [None, *chain.kinds], strict=False):
        if prev is not None and order[kind] < order[prev]:
            raise _Decline(f"{where}: the {kind} {_name(n)} comes after the {prev}")
    # Q, K, V in the logical (batch, heads, seq, dim) layout.
    ta, tb, alpha = _matmul_flags(chain.qk)
    q = _trace(g, chain.qk.inputs[0], _SWAP_LAST if ta else _IDENTITY, scales=True)
    kt = _trace(g, chain.qk.inputs[1], _SWAP_LAST if tb else _IDENTITY, scales=True)
    k = _Operand(kt.base, _compose(kt.perm, _SWAP_LAST), kt.scale, kt.walked)
    v = _trace(g, pv.inputs[1], _SWAP_LAST if pv_flags[1] else _IDENTITY, scales=False)
    k, v = _repeat_kv(g, k), _repeat_kv(g, v)
    scale = chain.scale * alpha * q.scale * k.scale
    if not scale > 0:
        raise _Decline(f"{where}: the scale {scale} is not positive")
    dims = _check_shapes(q, k, v, chain.qk.outputs[0], where)
    for c, _, _ in chain.keep:
        if c.ttype.dtype != DType.bool:
            raise _Decline(f"{where}: the Where condition '{c.name}' is not boolean")
    additive, keep, is_causal, uniform = _refine_masks(g, chain, dims, where)
    _check_masks([*additive, *(c for c, _ in keep)], dims, where)
    # The layout: 3-D when every operand is a head split of a (batch, seq, heads, dim) tensor.
    three_d = all(o.perm == _HEAD_SPLIT and o.view is None or _single_head_3d(o) for o in (q, k, v)) and all(
        isinstance(dims[d], int) for d in ("heads", "kv_heads", "dim", "vdim")
    )
    root = pv
    if three_d:
        t = g.users(pv.outputs[0].name)
        if (
            len(t) == 1
            and not g.is_output(pv.outputs[0].name)
            and is_onnx(t[0], "Transpose")
            and t[0].attrs.perm is not None
            and tuple(t[0].attrs.perm) == _HEAD_SPLIT
        ):
            root = t[0]
    plan = _Plan(
        root=root,
        softmax=softmax,
        q=q,
        k=k,
        v=v,
        additive=additive,
        keep=keep,
        is_causal=is_causal,
        mean_rows=bool(uniform),
        nan_rows=not uniform and safe is None and guard is None and _may_die(g, additive, keep, is_causal, dims),
        scale=scale,
        softcap=chain.softcap,
        three_d=three_d,
        heads=(dims["heads"], dims["kv_heads"]),
        dims=dims,
    )
    core = [chain.qk, *chain.nodes, softmax, pv] + ([root] if root is not pv else [])
    core += [safe] if safe is not None else []
    core += list(guard) if guard is not None else []
    plan.absorbed = _absorbed(g, core, [q, k, v])
    return plan


def _same(*dims) -> bool:
    """All equal and known (a None dim is unknown, and two unknowns may differ)."""
    return all(d is not None for d in dims) and len(set(dims)) == 1


def _agree(*dims) -> bool:
    """The known ones are equal: for dims a matmul's inner or outer size ties at run time anyway."""
    return len({d for d in dims if d is not None}) <= 1


def _check_shapes(q: _Operand, k: _Operand, v: _Operand, scores: Value, where: str) -> dict[str, object]:
    for name, o in (("Q", q), ("K", k), ("V", v)):
        if len(o.shape()) != 4 or not o.base.ttype.dtype.is_float:
            raise _Decline(f"{where}: {name} is not a 4-D float tensor")
    (qb, qh, sq, qd), (kb, kh, skv, kd), (vb, vh, vskv, vd) = q.shape(), k.shape(), v.shape()
    sb, sh, ssq, sskv = scores.ttype.shape
    # Batch and head dims must be known equal: MatMul would broadcast a 1 where Attention would
    # not (except fewer KV heads dividing the query heads: Attention's grouped-query form, query
    # head h reading kv head h // (qh / kvh), which is what repeat_kv's copies give). The
    # sequence and head sizes are tied by the two matmuls themselves.
    ok = (
        _same(qb, kb, vb, sb)
        and _same(qh, sh)
        and _same(kh, vh)
        and (kh == qh or (isinstance(kh, int) and isinstance(qh, int) and kh > 0 and qh % kh == 0))
        and _agree(sq, ssq)
        and _agree(skv, vskv, sskv)
        and _agree(qd, kd)
    )
    if not ok:
        raise _Decline(
            f"{where}: Q {q.shape()}, K {k.shape()} and V {v.shape()} do not line up as (batch, heads, seq, head_dim)"
        )
    known = [d for d in (skv, vskv, sskv) if d is not None]
    return {
        "batch": qb,
        "heads": qh,
        "kv_heads": kh,
        "q_seq": sq if sq is not None else ssq,
        "kv_seq": known[0] if known else None,
        "dim": qd if qd is not None else kd,
        "vdim": vd,
    }


def _check_masks(masks: list[Value | np.ndarray], dims: dict[str, object], where: str) -> None:
    """Each mask term broadcasts to the scores with a known key length (Attention pads a short
    key axis with -inf instead of broadcasting it; a 1 is expanded, which needs the length)."""
    skv = dims["kv_seq"]
    for m in masks:
        if isinstance(m, np.ndarray):
            shape, what = m.shape, f"a constant {m.dtype}{list(m.shape)}"
        else:
            t = m.type
            shape = t.shape if isinstance(t, TensorType) else None
            what = f"'{m.name}' ({t})"
        if shape is None or not 1 <= len(shape) <= 4:
            raise _Decline(f"{where}: the mask {what} is not of rank 1 to 4")
        last = shape[-1]
        if last is None or (last == 1 and skv != 1 and not isinstance(skv, int)):
            raise _Decline(f"{where}: the mask {what} has an unknown key length")


def _may_die(g: Graph, additive, keep, is_causal: bool, dims: dict[str, object]) -> bool:
    """The refined masks may leave some row no key (its whole bias -inf): any term computed at run
    time may; constant terms only where together (with is_causal) they do."""
    consts = [_const_or(g, m) for m in additive] + [_const_or(g, c) for c, _ in keep]
    if any(not isinstance(c, np.ndarray) for c in consts):
        return True
    bias = np.zeros(1, np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        for m in consts[: len(additive)]:
            bias = bias + m.astype(np.float32)
        for (_, inv), c in zip(keep, consts[len(additive) :], strict=True):
            bias = bias + np.where(c != inv, np.float32(0), np.float32(-np.inf))
    if is_causal and isinstance(dims["q_seq"], int) and dims["q_seq"] == dims["kv_seq"]:
        n = dims["q_seq"]
        bias = bias + np.where(np.tril(np.ones((n, n), bool)), np.float32(0), np.float32(-np.inf))
    return _dead_rows(~np.isneginf(bias))


def _dead_rows(keep: np.ndarray) -> bool:
    """Some row of the constant keep mask keeps no key."""
    keep = np.atleast_1d(keep)
    return bool(keep.size) and not bool(np.all(np.any(keep, axis=-1)))


def _keep_of_additive(g: Graph, m: Value) -> tuple[Value | np.ndarray, bool, float] | None:
    """An additive mask that only ever adds 0 or a masking fill, as a boolean keep mask with its
    fill: Where(cond, 0, fill) -> cond, Where(cond, fill, 0) -> not cond, a constant of 0 / fill
    -> (m == 0). Adding a fill of -1e4 or less is masking, as Where(..., -inf) is. None where the
    mask must stay additive to be exact on rows it masks wholly: a finite fill that does not
    absorb the scores (those rows are then a softmax of the scores, not uniform), or a constant
    with such rows and fills of more than one kind."""
    data = g.const(m.name)
    if data is not None:
        if not is_float_data(data):
            return None
        data = np.asarray(data, np.float64)  # bfloat16 compares as its values
        with np.errstate(invalid="ignore"):
            masked = data <= MASK_FILL_MAX
            if not np.all((data == 0) | masked):
                return None
        keep = data == 0
        if not _dead_rows(keep):
            return keep, False, -np.inf  # no row is wholly masked: the fill does not matter
        fills = data[masked]
        if np.all(np.isneginf(fills)):
            return keep, False, -np.inf
        if np.all(np.isfinite(fills)) and np.all(fills <= ABSORBING_FILL):
            return keep, False, float(fills.max())
        return None
    n = g.producer(m.name)
    if not is_onnx(n, "Where") or len(n.inputs) != 3 or n.inputs[0].ttype.dtype != DType.bool:
        return None
    cond, a, b = n.inputs
    if cond.type.shape != m.type.shape:
        return None  # the zero or the fill broadcast the mask bigger than its condition

    def zero(v: Value | None) -> bool:
        d = None if v is None else g.const(v.name)
        return d is not None and d.size == 1 and is_float_data(d) and float(d.reshape(())) == 0.0

    for fill_v, other, inverted in ((b, a, False), (a, b, True)):
        fill = _fill(g, fill_v)
        if fill is None or not zero(other):
            continue
        if math.isinf(fill) or fill <= ABSORBING_FILL:
            return cond, inverted, fill
        return None
    return None


def _conjuncts(g: Graph, v: Value | np.ndarray, depth: int = 0) -> list[Value | np.ndarray]:
    """The terms of v = a & b & ..., through And nodes; constants as arrays."""
    if isinstance(v, np.ndarray):
        return [v]
    data = g.const(v.name)
    if data is not None:
        return [data]
    n = g.producer(v.name)
    if depth < 4 and is_onnx(n, "And") and len(n.inputs) == 2:
        return _conjuncts(g, n.inputs[0], depth + 1) + _conjuncts(g, n.inputs[1], depth + 1)
    return [v]


def _is_causal_const(c: np.ndarray, q_seq: object, kv_seq: object) -> bool:
    """c is the causal mask (key j <= query i) over its last two dims, the same in every slice:
    what Attention's is_causal=1 applies when there is no past (queries and keys aligned)."""
    if not (isinstance(q_seq, int) and q_seq == kv_seq) or c.dtype != np.bool_ or c.ndim < 2:
        return False
    if c.shape[-2:] != (q_seq, kv_seq):
        return False
    tril = np.tril(np.ones((q_seq, kv_seq), dtype=bool))
    return bool(np.all(c == tril))


def _refine_masks(g: Graph, chain: _Chain, dims: dict[str, object], where: str):
    """The masks in their cheapest exact form: boolean where they only mask, constant all-True
    terms and constant shifts dropped, a constant causal term turned into is_causal=1; and the
    keep masks of a finite fill (see the module notes), whose wholly masked rows are uniform."""
    additive: list[Value | np.ndarray] = []
    keep: list[tuple[Value | np.ndarray, bool, float]] = list(chain.keep)
    for m in chain.additive:
        c = g.const(m.name)
        if c is not None and c.size == 1 and is_float_data(c) and np.isfinite(c).all():
            continue  # softmax(x + c) == softmax(x): a constant shift of every score goes
        k = _keep_of_additive(g, m)
        if k is None:
            additive.append(m)
        else:
            keep.append(k)
    # A constant keep mask that leaves every row a key: its fill never shows, unless a float mask
    # also added can bring a row's kept keys down to the fill: where it masks every kept key of a row
    # with a fill of its own (legacy GPT-2's (1 - mask) * finfo.min on a left-padded row), the
    # dropped keys' fill ties with them and the decomposed graph averages over both. A bias bounded
    # by `bias` cannot, where fill + twice the bias (its widest spread) is still a masking fill.
    bias = _bias_bound(g, additive)
    covered = _inside_the_fill(g, chain, additive, keep)
    resolved: list[tuple[Value | np.ndarray, bool, float]] = []
    folded = False
    for c, inv, fill in keep:
        c = _const_or(g, c)
        if isinstance(c, np.ndarray) and not _dead_rows(c != inv):
            if math.isfinite(fill) and (bias is None or fill + 2 * bias > MASK_FILL_MAX):
                if fill > ABSORBING_FILL:
                    raise _Decline(
                        f"{where}: a Where with the finite fill {fill:g} combined with a float mask "
                        "(rows the float mask masks wholly mix the fill with the scores)"
                    )
                # Where(keep, s, fill) + a == s + (Where(keep, 0, fill) + a) exactly, as fill
                # absorbs s: one float mask (legacy GPT-2's causal Where plus its padding mask)
                dtype = chain.qk.outputs[0].ttype.dtype.numpy
                additive.append(np.where(c != inv, 0.0, fill).astype(dtype))
                folded = True
                continue
            fill = -np.inf
        resolved.append((c, inv, fill))
    keep = resolved
    uniform = _uniform_terms(g, [(c, inv) for c, inv, fill in keep if math.isfinite(fill)])
    # A bounded float bias (a relative-position bias: MPNet, T5; BLOOM's ALiBi) beside the one
    # finite-fill keep mask leaves its wholly masked rows uniform over every key (fill + score + bias
    # == fill), as masked_rows "mean" gives; an unbounded one (a -inf mask) could drop keys from the
    # average. So does a bias inside that mask's Where, replaced by the fill with the scores
    # (DeBERTa's, `_inside_the_fill`).
    bounded = (bias is not None or covered) and not folded
    if uniform and (len(keep) > 1 or (additive and not bounded)):
        raise _Decline(
            f"{where}: a finite-fill mask combined with other masks (its wholly masked rows average "
            "over a subset of the keys)"
        )
    is_causal = False
    refined: list[tuple[Value | np.ndarray, bool]] = []
    for cond, inverted, _ in keep:
        if inverted:
            refined.append((cond, True))
            continue
        terms = _conjuncts(g, cond)
        kept = []
        for t in terms:
            if isinstance(t, np.ndarray) and t.dtype == np.bool_ and bool(np.all(t)):
                continue  # keeps everything
            if isinstance(t, np.ndarray) and _is_causal_const(t, dims["q_seq"], dims["kv_seq"]):
                is_causal = True
                continue
            kept.append(t)
        if len(kept) == len(terms):
            refined.append((cond, False))  # nothing to drop: the mask as it was computed
        else:
            refined += [(t, False) for t in kept]
    return additive, refined, is_causal, uniform


# A float bias whose magnitude stays below this is absorbed by an absorbing fill (fill + score +
# bias == fill in float32 for |score + bias| < 1e30 or so): such a bias cannot change which keys a
# wholly masked row averages over.
BOUNDED_BIAS = 1e20
_BOUND_VIEWS = frozenset({"Reshape", "Transpose", "Unsqueeze", "Squeeze", "Expand", "Slice", "Identity", "Flatten"})


def _bound(g: Graph, v: Value | np.ndarray, depth: int = 0) -> float | None:
    """An upper bound of |v| when v is finite and below BOUNDED_BIAS by construction: a constant, a
    Gather from a constant table, views of them, and sums and products of such; else None."""
    data = v if isinstance(v, np.ndarray) else g.const(v.name)
    if data is not None:
        if not is_float_data(data) or data.size == 0:
            return None
        with np.errstate(invalid="ignore", over="ignore"):
            d = np.asarray(data, np.float64)
            b = float(np.abs(d).max())
        return b if math.isfinite(b) and b <= BOUNDED_BIAS else None
    n = g.producer(v.name)
    if n is None or n.domain or depth > 12:
        return None
    if n.op == "Cast" and n.outputs[0].ttype.dtype.is_float and n.inputs[0] is not None:
        src = n.inputs[0]
        cast = _cast_bound(src.ttype.dtype, n.outputs[0].ttype.dtype)
        if cast is not None:
            return cast
    if n.op in _BOUND_VIEWS or n.op == "Gather" or (n.op == "Cast" and n.outputs[0].ttype.dtype.is_float):
        src = n.inputs[0]
        return None if src is None else _bound(g, src, depth + 1)
    if n.op in ("Add", "Sub", "Mul") and len(n.inputs) == 2 and all(i is not None for i in n.inputs):
        a, b = (_bound(g, i, depth + 1) for i in n.inputs)
        if a is None or b is None:
            return None
        r = a + b if n.op != "Mul" else a * b
        return r if r <= BOUNDED_BIAS else None
    if n.op == "Neg" and n.inputs[0] is not None:
        return _bound(g, n.inputs[0], depth + 1)
    return None


def _inside_the_fill(
    g: Graph, chain: _Chain, additive: list[Value | np.ndarray], keep: list[tuple[Value | np.ndarray, bool, float]]
) -> bool:
    """The float masks `additive` are all inside the one finite-fill Where of the chain, its last
    mask op (Where(keep, scores + bias, finfo.min): DeBERTa's c2p / p2c relative-position bias), and
    made from the activations as the scores are (`_score_like`). Then a key the Where masks is the
    fill whatever the bias, so a row it masks wholly is uniform over every key (masked_rows "mean"),
    and a kept key is score + bias, as Where(keep, bias, -inf) added by Attention gives. Exact where
    the scores and the bias are finite (no inf in the activations, no overflow: `_nan_guard`'s
    condition for Q and K); a bias that may hold -inf by design (a float mask fed as an input, or
    built with a fill) would leave a row only -inf kept keys, which the decomposed graph averages
    over its masked keys: such a bias is not score-like."""
    if len(chain.keep) != 1 or len(keep) != 1 or not additive:
        return False
    _, _, fill = chain.keep[0]
    if not math.isfinite(fill) or chain.inside[0] != len(chain.additive):
        return False
    return all(_score_like(g, m) for m in additive)


# Ops through which a value made from the activations stays one (a view, a gather of its elements).
_SCORE_VIEWS = _BOUND_VIEWS | {"Gather", "GatherElements"}


def _score_like(g: Graph, v: Value | np.ndarray, depth: int = 0) -> bool:
    """v is computed from the activations by matmuls, as the scores are: a MatMul, views and
    gathers of one, scalar scales, sums with such terms or with bounded ones (`_bound`). Finite
    wherever the matmuls' inputs are; never a mask (no Where, no graph input, no fill)."""
    if _bound(g, v) is not None:
        return True
    if isinstance(v, np.ndarray):
        return False
    n = g.producer(v.name)
    if n is None or depth > 12:
        return False
    if _matmul_flags(n) is not None:
        return all(i is not None and i.ttype.dtype.is_float for i in n.inputs[:2])
    if n.domain:
        return False
    src = n.inputs[0] if n.inputs else None
    if src is None:
        return False
    if n.op in _SCORE_VIEWS or (n.op == "Cast" and n.outputs[0].ttype.dtype.is_float and src.ttype.dtype.is_float):
        return _score_like(g, src, depth + 1)
    if n.op in ("Add", "Sub") and len(n.inputs) == 2:
        return all(i is not None and _score_like(g, i, depth + 1) for i in n.inputs)
    if n.op == "Neg":
        return _score_like(g, src, depth + 1)
    f = _scalar_factor(g, n)
    return f is not None and _score_like(g, f[0], depth + 1)


def _cast_bound(src: DType, dst: DType) -> float | None:
    """|x| for x an integer (or bool) of dtype `src` cast to the float `dst`, when that is finite
    and below BOUNDED_BIAS (2**63 for int64): whatever integer arithmetic made it, a cast integer is
    bounded by its type (BLOOM's ALiBi, slopes times a CumSum of the attention mask). None for a
    float source or where the integers can overflow `dst` (int32 in float16)."""
    if src == DType.bool:
        return 1.0
    try:
        info = np.iinfo(src.numpy)
        top = float(ml_dtypes.finfo(dst.numpy).max)  # numpy's finfo knows no bfloat16
    except (TypeError, ValueError):
        return None
    b = float(max(-int(info.min), int(info.max)))
    return b if b <= top and b <= BOUNDED_BIAS else None


def _bias_bound(g: Graph, additive: list[Value | np.ndarray]) -> float | None:
    """A bound of |sum of the float masks `additive`| (0 for none), or None where one is unbounded."""
    total = 0.0
    for m in additive:
        b = _bound(g, m)
        if b is None:
            return None
        total += b
    return total if total <= BOUNDED_BIAS else None


def _uniform_terms(g: Graph, keeps: list[tuple[Value | np.ndarray, bool]]) -> list[tuple[Value | np.ndarray, bool]]:
    """The finite-fill keep masks as the terms of one And (all-True constants dropped), or []
    when they are all constant and leave every row a key."""
    terms: list[tuple[Value | np.ndarray, bool]] = []
    for c, inverted in keeps:
        parts = [c] if inverted else _conjuncts(g, c)
        for t in parts:
            if not inverted and isinstance(t, np.ndarray) and t.dtype == np.bool_ and bool(np.all(t)):
                continue
            terms.append((t, inverted))
    if all(isinstance(t, np.ndarray) for t, _ in terms):
        together = functools.reduce(np.logical_and, [t != inv for t, inv in terms], np.ones(1, bool))
        if not _dead_rows(together):
            return []
    return terms


def _const_or(g: Graph, v: Value | np.ndarray) -> Value | np.ndarray:
    """v's constant data where it has one, else v."""
    if isinstance(v, np.ndarray):
        return v
    data = g.const(v.name)
    return v if data is None else data


def _absorbed(g: Graph, core: list[Node], operands: list[_Operand]) -> tuple[Node, ...]:
    """The nodes the Attention node replaces (in graph order): the core, and the layout and scale
    nodes of Q, K, V whose results nobody else reads."""
    inside = {id(n) for n in core}
    nodes = list(core)
    for o in operands:
        for n in o.walked:  # from the matmul outward: each one's readers are inside already
            if g.is_output(n.outputs[0].name) or any(id(u) not in inside for u in g.users(n.outputs[0].name)):
                break
            inside.add(id(n))
            nodes.append(n)
    order = {id(n): i for i, n in enumerate(g.nodes)}
    nodes.sort(key=lambda n: order[id(n)])
    return tuple(nodes)


# ---- emission ----------------------------------------------------------------------------------


def _prefix(n: Node) -> str:
    return n.name.rsplit("/", 1)[0] if "/" in n.name else n.name


def _i64(b: GraphBuilder, values, hint: str) -> Value:
    return b.add_constant(np.array(values, dtype=np.int64), hint)


def _single_head_3d(o: _Operand) -> bool:
    """A one-head view (B, 1, S, D) of a (B, S, D) base: already the 3-D form's (B, S, 1 * D)."""
    s = o.base.ttype.shape
    return o.view is not None and o.view[1] == 1 and o.perm == _IDENTITY and len(s) == 3 and s[2] == o.view[3]


def _to_3d(g: Graph, b: GraphBuilder, o: _Operand, mapv, hint: str) -> Value:
    """(batch, seq, heads * dim) from the (batch, seq, heads, dim) base: the Reshape's own input
    when that already has this shape, else a new Reshape (an alias)."""
    if o.view is not None:
        return mapv(o.base)  # _single_head_3d
    batch, seq, heads, dim = o.base.ttype.shape
    r = g.producer(o.base.name)
    if is_onnx(r, "Reshape") and r.inputs[0] is not None and not r.attrs.allowzero:
        src = r.inputs[0]
        target = g.const(r.inputs[1].name) if r.inputs[1] is not None else None
        s = src.ttype.shape
        if s is not None and len(s) == 3 and s[2] == heads * dim:

            def same(i: int, d) -> bool:
                copied = target is not None and target.size == 4 and int(target[i]) == 0
                return copied or (d is not None and s[i] == d)

            if same(0, batch) and same(1, seq):
                return mapv(src)
    shape = _i64(b, [0, 0, heads * dim], f"{hint}/shape")
    return b.op("Reshape", [mapv(o.base), shape], name=f"{hint}/Reshape")


def _to_4d(b: GraphBuilder, o: _Operand, mapv, hint: str) -> Value:
    base = mapv(o.base)
    if o.view is not None:
        base = b.op("Reshape", [base, _i64(b, list(o.view), f"{hint}/view")], name=f"{hint}/Reshape")
    if o.perm == _IDENTITY:
        return base
    return b.op("Transpose", [base], {"perm": list(o.perm)}, name=f"{hint}/Transpose")


def _emit_mask(b: GraphBuilder, plan: _Plan, mapv, hint: str, dtype: DType) -> Value | None:
    def val(x: Value | np.ndarray) -> Value:
        return mapv(x) if isinstance(x, Value) else b.add_constant(x, f"{hint}/mask_const")

    add: Value | None = None
    for m in plan.additive:
        add = val(m) if add is None else b.op("Add", [add, val(m)], name=f"{hint}/mask_add")
    keep: Value | None = None
    for c, inverted in plan.keep:
        c = val(c)
        if inverted:
            c = b.op("Not", [c], name=f"{hint}/mask_not")
        keep = c if keep is None else b.op("And", [keep, c], name=f"{hint}/mask_and")
    if keep is not None and add is not None:
        ninf = b.add_constant(np.array(-np.inf, dtype=dtype.numpy), f"{hint}/ninf")
        mask = b.op("Where", [keep, add, ninf], name=f"{hint}/mask")
    else:
        mask = keep if keep is not None else add
    if mask is None:
        return None
    # Attention pads a short key axis with -inf rather than broadcasting it: expand a 1.
    skv = plan.dims["kv_seq"]
    if mask.ttype.shape[-1] == 1 and skv != 1:
        shape = _i64(b, [1] * (len(mask.ttype.shape) - 1) + [skv], f"{hint}/mask_shape")
        mask = b.op("Expand", [mask, shape], name=f"{hint}/mask_expand")
    return mask


def _emit(g: Graph, b: GraphBuilder, plan: _Plan, mapv) -> Value:
    hint = _prefix(plan.softmax)
    dtype = plan.q.base.ttype.dtype
    attrs: dict[str, object] = {"scale": float(plan.scale)}
    if plan.is_causal:
        attrs["is_causal"] = 1
    if plan.softcap:
        attrs["softcap"] = float(plan.softcap)
    if plan.mean_rows:
        attrs["masked_rows"] = "mean"
    elif plan.nan_rows:
        attrs["masked_rows"] = "nan"
    if plan.three_d:
        q = _to_3d(g, b, plan.q, mapv, f"{hint}/q")
        k = _to_3d(g, b, plan.k, mapv, f"{hint}/k")
        v = _to_3d(g, b, plan.v, mapv, f"{hint}/v")
        attrs["q_num_heads"], attrs["kv_num_heads"] = plan.heads
    else:
        q = _to_4d(b, plan.q, mapv, f"{hint}/q")
        k = _to_4d(b, plan.k, mapv, f"{hint}/k")
        v = _to_4d(b, plan.v, mapv, f"{hint}/v")
    mask = _emit_mask(b, plan, mapv, hint, dtype)
    y = b.op("Attention", [q, k, v, mask], attrs, name=f"{hint}/Attention")
    if plan.three_d:
        # Back to the (batch, seq, heads, vdim) the output Transpose gave (a Reshape merging the
        # heads after it collapses with this one), or to (batch, heads, seq, vdim) for the P @ V
        # output itself when its consumers need that layout.
        split = _i64(b, [0, 0, plan.heads[0], plan.dims["vdim"]], f"{hint}/out_shape")
        y = b.op("Reshape", [y, split], name=f"{hint}/out_Reshape")
        if plan.root.op != "Transpose":
            y = b.op("Transpose", [y], {"perm": list(_HEAD_SPLIT)}, name=f"{hint}/out_Transpose")
    return y


# ---- the pass ----------------------------------------------------------------------------------


def fuse_attention(graph: Graph) -> Graph:
    plans: dict[str, _Plan] = {}
    misses: list[str] = []
    for node in graph.nodes:
        if not is_onnx(node, "Softmax"):
            continue
        try:
            plan = _analyze(graph, node)
        except _Decline as d:
            if d.message:
                misses.append(d.message)
            continue
        if plan is not None:
            plans[plan.root.name] = plan

    def visit(node: Node, ctx: RewriteContext) -> Rewritten | None:
        plan = plans.get(node.name)
        if plan is None:
            return None
        return Rewritten([_emit(graph, ctx.b, plan, ctx.mapv)], plan.absorbed)

    return rewrite_graph(graph, visit, near_misses=misses)
