"""Canonicalize before matching: exporters' spellings of one computation rewritten to one form.

The fusion matchers (attention, LayerNorm, GELU) then match that one form. Every rule here is
exact algebra on any input (up to float rounding where stated), so it runs whether or not a
fusion follows; the rules that are exact only because a fused op behaves a certain way (dropping
torch's NaN guard after an attention Softmax) live in the matcher that creates that op
(passes/fuse_attention.py, `_nan_guard`).

Rules (named by their algebra):

- RESHAPE_SANDWICH  reshape(transpose(reshape(x, s1), p), s2) -> transpose(reshape(x, w), q)
  [-> reshape]: the three ops move whole blocks of x (the common refinement of x's and s1's
  shapes), and every dim of s2 is a run of blocks contiguous in x too; w is those runs in x's
  order (no reshape when w is x's shape). Dynamo's torchlib writes every
  swap of a 4-D tensor's last two axes this way (K^T in scaled_dot_product_attention: K reshaped
  to (-1, S, D), Transpose(0, 2, 1), reshaped to (B, H, D, S)); as one Transpose it cancels
  against its neighbours (transpose elimination) and attention fusion reads it as K^T; after
  cleanup merged repeat_kv's reshape into the first one, w restores the (B, H, S, D) view the
  attention matcher looks through. Size-1 axes may sit anywhere; a final reshape (a free alias)
  puts them where s2 has them.
- SPLIT_SCALE  matmul(a * c1, b * c2) -> matmul(a, b) * (c1 * c2) for scalar constants c1, c2:
  torch's exporters scale Q and K each by sqrt(scale) before Q @ K^T; one scale on the scores is
  the form the attention matcher takes as Attention's `scale`, and one Mul instead of two. Done
  only when the product feeds a Softmax (through the score chain's Add / Where / Mul / Div), so
  that an unscaled product cannot overflow fp16 anywhere but inside what becomes Attention.
- SPATIAL_MEAN  reduce_mean(x, axes = every axis after the second, keepdims) -> global_average_pool(x)
  for x of rank 4 or more:
  the dynamo exporter writes adaptive_avg_pool2d(x, 1) and x.mean((2, 3), keepdim=True) (the
  squeeze-excitation blocks of EfficientNet, RegNet, MobileNetV3) as ReduceMean where TorchScript
  writes GlobalAveragePool; as the pool, the layout pass keeps it in the convolutions' NHWC layout
  instead of wrapping it in Transposes (EfficientNet-B0's dynamo export: 10 Transposes left). The
  same mean (up to the order of the float sums).
- NARROW_FLAG_CUMSUM  cumsum(cast(cast(b, intN), intM), axis) -> cast(cumsum(cast(b, intN), axis), intM)
  for a bool b, integer types intN narrower than intM, and an axis of static length L <= intN's
  maximum: the partial sums of 0/1 flags lie in [0, L], so the narrow sums are exact. RoBERTa's
  (XLM-R's, MPNet's) position ids, cumsum(mask.int(), 1): torch promotes the int32 cumsum to
  int64, so the dynamo exporter writes a Cast to int64 before the CumSum (a kernel of its own)
  where TorchScript sums the int32 flags; in the narrow form the Cast after the CumSum folds into
  the elementwise kernel that reads it.
"""

from __future__ import annotations

import logging
import math

import numpy as np

from graphc.ir.graph import Graph, Node, Value
from graphc.ir.types import DType
from graphc.passes.fuse_util import is_float_data, is_onnx, scalar, static_dims
from graphc.passes.rewrite import RewriteContext, Rewritten, rewrite_graph

log = logging.getLogger(__name__)


# ---- RESHAPE_SANDWICH --------------------------------------------------------------------------


def _refine(a: list[int], b: list[int]) -> tuple[list[int], list[list[int]], list[list[int]]] | None:
    """The common refinement of two factorizations of one size (no 1s in either): atom sizes,
    and for each dim of a and of b the indices of its atoms; None when there is none."""
    atoms: list[int] = []
    ra: list[list[int]] = [[] for _ in a]
    rb: list[list[int]] = [[] for _ in b]
    i = j = 0
    x, y = (a[0], b[0]) if a and b else (1, 1)
    while i < len(a) and j < len(b):
        step = min(x, y)
        if max(x, y) % step:
            return None
        ra[i].append(len(atoms))
        rb[j].append(len(atoms))
        atoms.append(step)
        x, y = x // step, y // step
        if x == 1:
            i += 1
            x = a[i] if i < len(a) else 1
        if y == 1:
            j += 1
            y = b[j] if j < len(b) else 1
    if i != len(a) or j != len(b):
        return None
    return atoms, ra, rb


def _sandwich_perm(
    xs: tuple[int, ...], ys: tuple[int, ...], p: tuple[int, ...], zs: tuple[int, ...]
) -> tuple[list[int], list[int]] | None:
    """(w, q) such that reshape(transpose(reshape(x, ys), p), zs) equals
    transpose(reshape(x, w), q) up to size-1 axes (w has none), or None.

    The three ops move contiguous blocks of x's elements: the atoms of the common refinement of
    x's and y's shapes, permuted by p. The result is one transpose when every dim of z is a run
    of atoms that are contiguous and in order in x as well; w is those runs in x's order."""
    ref = _refine([d for d in xs if d != 1], [d for d in ys if d != 1])
    if ref is None:
        return None
    atoms, _, ry = ref
    ynon1 = [i for i, d in enumerate(ys) if d != 1]
    rank_of = {axis: k for k, axis in enumerate(ynon1)}
    order = [a for axis in p if ys[axis] != 1 for a in ry[rank_of[axis]]]  # atoms after the transpose
    z1 = [d for d in zs if d != 1]
    zref = _refine([atoms[a] for a in order], z1)
    if zref is None:
        return None
    _, rperm, rz = zref
    if any(len(r) != 1 for r in rperm):
        return None  # z splits an atom: not a transpose of whole blocks
    groups = [[order[k] for k in run] for run in rz]  # z's dims as atom runs
    if any(g != list(range(g[0], g[0] + len(g))) for g in groups):
        return None  # a run of z is not contiguous in x's order
    by_start = sorted(range(len(groups)), key=lambda i: groups[i][0])
    w = [int(np.prod([atoms[a] for a in groups[i]])) for i in by_start]
    q = [by_start.index(i) for i in range(len(groups))]
    return w, q


def _reshape_sandwich(g: Graph, node: Node, ctx: RewriteContext) -> Rewritten | None:
    if not is_onnx(node, "Reshape") or node.inputs[1] is None:
        return None
    t = g.producer(node.inputs[0].name)
    if not is_onnx(t, "Transpose") or g.is_output(t.outputs[0].name) or len(g.users(t.outputs[0].name)) != 1:
        return None
    r = g.producer(t.inputs[0].name)
    if not is_onnx(r, "Reshape"):
        return None
    x = r.inputs[0]
    xs, ys, zs = static_dims(x), static_dims(r.outputs[0]), static_dims(node.outputs[0])
    if xs is None or ys is None or zs is None:
        return None
    p = tuple(t.attrs.perm) if t.attrs.perm is not None else tuple(reversed(range(len(ys))))
    found = _sandwich_perm(xs, ys, p, zs)
    if found is None:
        return None
    w, q = found
    transposed = [w[i] for i in q]
    if tuple(w) != xs and tuple(transposed) != zs:
        return None  # reshape, transpose, reshape again: nothing simpler (and would loop)
    b = ctx.b
    y = ctx.mapv(x)
    if tuple(w) != xs:  # a free alias
        shape = b.add_constant(np.array(w, dtype=np.int64), f"{node.name}/blocks")
        y = b.op("Reshape", [y, shape], name=f"{node.name}/blocks")
    if q != sorted(q):
        y = b.op("Transpose", [y], {"perm": q}, name=f"{node.name}/transpose")
    if tuple(y.ttype.shape) != zs:  # only size-1 axes differ: another free alias
        shape = b.add_constant(np.array(zs, dtype=np.int64), f"{node.name}/shape")
        y = b.op("Reshape", [y, shape], name=f"{node.name}/reshape")
    absorbed = [r, t, node] if len(g.users(r.outputs[0].name)) == 1 else [t, node]
    return Rewritten([y], absorbed)


# ---- SPLIT_SCALE -------------------------------------------------------------------------------

_SCORE_CHAIN = ("Add", "Where", "Mul", "Div")


def _scalar_mul(g: Graph, v: Value | None) -> tuple[Value, float, Node] | None:
    """(x, c, node) when v = x * c (either order) with c a finite scalar float constant, v of x's
    type, and v read by one node only."""
    n = None if v is None else g.producer(v.name)
    if not is_onnx(n, "Mul") or g.is_output(v.name) or len(g.users(v.name)) != 1:
        return None
    for x, k in ((n.inputs[0], n.inputs[1]), (n.inputs[1], n.inputs[0])):
        data = None if k is None else g.const(k.name)
        if x is None or data is None or not is_float_data(data) or x.type != v.type:
            continue
        c = scalar(data)
        if c is not None and math.isfinite(c):
            return x, c, n
    return None


def _feeds_softmax(g: Graph, v: Value, depth: int = 0) -> bool:
    users = g.users(v.name)
    if depth > 4 or len(users) != 1 or g.is_output(v.name):
        return False
    u = users[0]
    if is_onnx(u, "Softmax"):
        return True
    return is_onnx(u, *_SCORE_CHAIN) and _feeds_softmax(g, u.outputs[0], depth + 1)


def _split_scale(g: Graph, node: Node, ctx: RewriteContext) -> Rewritten | None:
    if not is_onnx(node, "MatMul"):
        return None
    a, b_ = _scalar_mul(g, node.inputs[0]), _scalar_mul(g, node.inputs[1])
    if a is None or b_ is None or not _feeds_softmax(g, node.outputs[0]):
        return None
    dtype = node.outputs[0].ttype.dtype.numpy
    c = np.array(a[1] * b_[1], dtype=dtype)
    b = ctx.b
    mm = b.op("MatMul", [ctx.mapv(a[0]), ctx.mapv(b_[0])], name=node.name)
    y = b.op("Mul", [mm, b.add_constant(c, f"{node.name}/scale")], name=f"{node.name}/scale")
    return Rewritten([y], [a[2], b_[2], node])


# ---- SPATIAL_MEAN ------------------------------------------------------------------------------


def _spatial_mean(g: Graph, node: Node, ctx: RewriteContext) -> Rewritten | None:
    if not is_onnx(node, "ReduceMean") or len(node.inputs) != 2 or node.inputs[1] is None:
        return None
    x = node.inputs[0]
    shape = None if x is None else x.ttype.shape
    # images only (N, C, H, W[, D]): a rank-3 mean over the last axis is a sequence model's
    # LayerNorm or RMSNorm statistic, which their matchers look for as ReduceMean
    if shape is None or len(shape) < 4 or node.attrs.keepdims != 1 or not x.ttype.dtype.is_float:
        return None
    axes = g.const(node.inputs[1].name)
    if axes is None or axes.dtype.kind not in "iu":
        return None
    rank = len(shape)
    norm = sorted(int(a) + rank if int(a) < 0 else int(a) for a in axes.reshape(-1))
    if norm != list(range(2, rank)):
        return None
    y = ctx.b.op("GlobalAveragePool", [ctx.mapv(x)], name=node.name)
    return Rewritten([y], [node])


def _narrow_flag_cumsum(g: Graph, node: Node, ctx: RewriteContext) -> Rewritten | None:
    if not is_onnx(node, "CumSum") or len(node.inputs) != 2 or node.inputs[0] is None or node.inputs[1] is None:
        return None
    wide = g.producer(node.inputs[0].name)
    if not is_onnx(wide, "Cast") or wide.inputs[0] is None:
        return None
    y = wide.inputs[0]
    flags = g.producer(y.name)
    if not is_onnx(flags, "Cast") or flags.inputs[0] is None or flags.inputs[0].ttype.dtype is not DType.bool:
        return None
    nt, wt = y.ttype.dtype, node.inputs[0].ttype.dtype
    if not (nt.is_int and wt.is_int and nt.is_signed and wt.is_signed and nt.itemsize < wt.itemsize):
        return None
    axis, shape = g.const(node.inputs[1].name), static_dims(y)
    if axis is None or axis.size != 1 or shape is None:
        return None
    a = int(axis.reshape(-1)[0])
    if not -len(shape) <= a < len(shape) or shape[a] > np.iinfo(nt.numpy).max:
        return None
    b = ctx.b
    s = b.op("CumSum", [ctx.mapv(y), ctx.mapv(node.inputs[1])], node.attrs, name=f"{node.name}/narrow")
    out = b.op("Cast", [s], {"to": wt.value}, name=node.name)
    log.debug("%s: cumsum of %s flags in %s, then cast to %s", node.name, nt.name, nt.name, wt.name)
    return Rewritten([out], [node])


# ---- the pass ----------------------------------------------------------------------------------

RULES = (_reshape_sandwich, _split_scale, _spatial_mean, _narrow_flag_cumsum)


def canonicalize(graph: Graph) -> Graph:
    def visit(node: Node, ctx: RewriteContext) -> Rewritten | None:
        for rule in RULES:
            res = rule(graph, node, ctx)
            if res is not None:
                return res
        return None

    return rewrite_graph(graph, visit)
