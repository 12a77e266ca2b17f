"""A Gather or GatherND with constant indices that reads every element of its data once, in order,
is a Reshape: a view, no kernel.

Rules (named by their algebra):

- GATHER_ARANGE     gather(x, c, axis) -> reshape(x, out) when c, flattened, is 0, 1, ..., n - 1
  with n = x.shape[axis] (negative indices counted from the end)
- GATHER_ND_ARANGE  gather_nd(x, c) (batch_dims 0) -> reshape(x, out) when the index tuples of c,
  in row-major order, are every index of x's first k dims in row-major order

- SLICES_CONCAT     concat(slice(x, a), slice(x, b), ..., axis) -> gather(x, [a; b; ...], axis) when
  every input is a step-1 slice of the same x along `axis` only, read by the Concat alone: one
  kernel instead of one per slice and one per concatenated input (Swin's torch.roll of the
  shifted windows: two slices and a concat per rolled axis, 4 launches, become 1). A concat
  that puts x back in order is a reshape, by the first rule.

- GATHER_ND_OF_TRANSPOSE  gather_nd(transpose(x, p), c) (batch_dims 0, index tuples of length 1)
  -> gather(x, c[..., 0], axis=p[0]) then a reshape (a transpose where the order of the kept
  axes changes) to gather_nd's shape: the dynamo exporter's ``x[..., k, :]`` on a 5-D view
  (Falcon's grouped K and V: a Transpose bringing the axis first, a GatherND of [[k]], a Reshape),
  which TorchScript writes as one Gather. The Transpose, read by those GatherNDs only, goes.

- SLICES_SPLIT  slice(x, [a0, a1)), slice(x, [a1, a2)), ... along one axis -> split(x, sizes) when
  the step-1 Slices of x along that axis partition it and x is a GEMM's output (through views and
  a bias Add; rotate_half's halves stay the rotary matcher's): TorchScript's q, k, v of a fused QKV
  projection (GPT-NeoX, Phi-3's qkv_proj and gate_up_proj) are Slices where dynamo writes a Split;
  as a Split of a GEMM's output they become the slab views of a batched GEMM (passes/fuse_horizontal.py).
  Also three or more such Slices of a Transpose of a GEMM's output (TorchScript's GPT-NeoX q, k, v
  of its transposed QKV projection; dynamo writes a Split there): one Split kernel, not three.

Where they come from: the exporters spell the attention mask's broadcast
``mask[:, None, None, :]`` as index arithmetic that constant folding turns into such a gather
(the TorchScript export of BERT and GPT-2: a Gather of the flattened mask by arange(seq); the
dynamo export: a GatherND by all the (0, j) pairs). Each was a kernel of its own at every run.
"""

from __future__ import annotations

import logging

import numpy as np

from graphc.ir.graph import Graph, Node
from graphc.ir.types import TensorType
from graphc.passes.rewrite import RewriteContext, Rewritten, rewrite_graph

log = logging.getLogger(__name__)


def _static_shape(v) -> tuple[int, ...] | None:
    t = v.type
    if not isinstance(t, TensorType):  # a sequence or an optional
        return None
    return tuple(t.shape) if t.shape is not None and all(isinstance(d, int) for d in t.shape) else None


def reads_in_order(op: str, data_shape: tuple[int, ...], idx: np.ndarray, axis: int = 0) -> bool:
    """Whether Gather (op "Gather", along `axis`) or GatherND (batch_dims 0) with indices `idx` on
    data of `data_shape` lists every element of the data once, in the data's own order."""
    idx = np.asarray(idx).astype(np.int64)
    if op == "Gather":
        n = data_shape[axis]
        flat = idx.reshape(-1)
        flat = np.where(flat < 0, flat + n, flat)
        return flat.size == n and bool(np.array_equal(flat, np.arange(n)))
    if idx.ndim < 1:
        return False
    k = idx.shape[-1]
    if k < 1 or k > len(data_shape):
        return False
    dims = np.array(data_shape[:k], dtype=np.int64)
    tuples = idx.reshape(-1, k)
    tuples = np.where(tuples < 0, tuples + dims, tuples)
    want = np.indices(data_shape[:k]).reshape(k, -1).T
    return tuples.shape == want.shape and bool(np.array_equal(tuples, want))


def _gather_to_reshape(g: Graph, node: Node, ctx: RewriteContext) -> Rewritten | None:
    if node.domain or node.op not in ("Gather", "GatherND") or len(node.outputs) != 1:
        return None
    x, ids = node.inputs[0], node.inputs[1]
    idx = g.const(ids.name)
    xs, ys = _static_shape(x), _static_shape(node.outputs[0])
    if idx is None or xs is None or ys is None or not idx.size:
        return None
    if node.op == "Gather":
        axis = node.attrs.axis + len(xs) if node.attrs.axis < 0 else node.attrs.axis
        if not reads_in_order("Gather", xs, idx, axis):
            return None
    elif node.attrs.batch_dims != 0 or not reads_in_order("GatherND", xs, idx):
        return None
    b = ctx.b
    shape = b.add_constant(np.array(ys, dtype=np.int64), f"{node.name}/shape")
    y = b.op("Reshape", [ctx.mapv(x), shape], name=f"{node.name}/view")
    log.debug("%s: %s reads its data in order -> Reshape", node.name, node.op)
    return Rewritten([y], [node])


def _slice_indices(g: Graph, node: Node, shape: tuple[int, ...], axis: int) -> np.ndarray | None:
    """The indices along `axis` that a step-1 Slice with constant operands keeps, when it keeps
    every index of every other axis; else None."""
    if node.domain or node.op != "Slice" or len(node.outputs) != 1:
        return None
    consts = [None if v is None else g.const(v.name) for v in node.inputs[1:]]
    starts, ends = consts[0], consts[1] if len(consts) > 1 else None
    if (
        starts is None
        or ends is None
        or any(v is not None and c is None for v, c in zip(node.inputs[1:], consts, strict=True))
    ):
        return None
    axes = consts[2] if len(consts) > 2 and consts[2] is not None else np.arange(len(starts))
    steps = consts[3] if len(consts) > 3 and consts[3] is not None else np.ones(len(starts), np.int64)
    keep = {d: np.arange(n) for d, n in enumerate(shape)}
    for st, en, ax, sp in zip(starts.tolist(), ends.tolist(), axes.tolist(), steps.tolist(), strict=True):
        if sp != 1:
            return None
        ax = ax + len(shape) if ax < 0 else ax
        keep[ax] = keep[ax][slice(st, en)]
    if any(d != axis and len(k) != shape[d] for d, k in keep.items()):
        return None
    return keep[axis]


def _slices_concat_to_gather(g: Graph, node: Node, ctx: RewriteContext) -> Rewritten | None:
    if node.domain or node.op != "Concat" or len(node.inputs) < 2:
        return None
    producers = [g.producer(v.name) for v in node.inputs]
    if any(p is None or p.op != "Slice" or p.domain for p in producers):
        return None
    x = producers[0].inputs[0]
    xs = _static_shape(x)
    if xs is None or any(p.inputs[0].name != x.name for p in producers):
        return None
    for v in node.inputs:
        if g.is_output(v.name) or len(g.users(v.name)) != 1:
            return None
    axis = node.attrs.axis + len(xs) if node.attrs.axis < 0 else node.attrs.axis
    parts = [_slice_indices(g, p, xs, axis) for p in producers]
    if any(q is None for q in parts):
        return None
    idx = ctx.b.add_constant(np.concatenate(parts).astype(np.int64), f"{node.name}/indices")
    y = ctx.b.op("Gather", [ctx.mapv(x), idx], {"axis": axis}, name=f"{node.name}/gather")
    log.debug("%s: a concat of slices of %s -> one Gather", node.name, x.name)
    return Rewritten([y], [node, *producers])


def _gather_nd_of_transpose(g: Graph, node: Node, ctx: RewriteContext) -> Rewritten | None:
    if node.domain or node.op != "GatherND" or node.attrs.batch_dims != 0 or len(node.outputs) != 1:
        return None
    t = g.producer(node.inputs[0].name)
    idx = g.const(node.inputs[1].name)
    if t is None or t.domain or t.op != "Transpose" or idx is None or idx.ndim < 1 or idx.shape[-1] != 1:
        return None
    x = t.inputs[0]
    xs, ys = _static_shape(x), _static_shape(node.outputs[0])
    if xs is None or ys is None or t.attrs.perm is None:
        return None
    p = [int(a) for a in t.attrs.perm]
    a, j = p[0], idx.ndim - 1  # the gathered axis of x, and the index dims the result starts with
    # Gather(x, idx[..., 0], axis=a) is x.shape[:a] + idx dims + x.shape[a + 1:]; GatherND's result
    # is the idx dims, then x's axes in the order p[1:]
    pos = [q if q < a else q + j - 1 for q in p[1:]]
    perm = list(range(a, a + j)) + pos
    b = ctx.b
    ids = b.add_constant(np.ascontiguousarray(idx[..., 0].astype(np.int64)), f"{node.name}/indices")
    y = b.op("Gather", [ctx.mapv(x), ids], {"axis": a}, name=f"{node.name}/gather")
    gshape = (*xs[:a], *idx.shape[:-1], *xs[a + 1 :])
    kept = [ax for ax in perm if gshape[ax] != 1]
    if kept == sorted(kept):  # only unit axes move: the same element order, a view
        shape = b.add_constant(np.array(ys, dtype=np.int64), f"{node.name}/shape")
        y = b.op("Reshape", [y, shape], name=f"{node.name}/view")
    else:
        y = b.op("Transpose", [y], {"perm": perm}, name=f"{node.name}/transpose")
    log.debug("%s: GatherND of a Transpose -> Gather along axis %d", node.name, a)
    return Rewritten([y], [node])


def _axis_range(g: Graph, node: Node, shape: tuple[int, ...]) -> tuple[int, int, int] | None:
    """(axis, start, stop) of a step-1 Slice with constant operands along one axis, keeping every
    index of the others and a non-empty contiguous range of that axis; else None."""
    if node.domain or node.op != "Slice" or len(node.inputs) < 4 or node.inputs[3] is None:
        return None
    axes = g.const(node.inputs[3].name)
    if axes is None or axes.size != 1:
        return None
    axis = int(axes.reshape(-1)[0]) + (len(shape) if int(axes.reshape(-1)[0]) < 0 else 0)
    if not 0 <= axis < len(shape):
        return None
    kept = _slice_indices(g, node, shape, axis)
    if kept is None or not kept.size or not np.array_equal(kept, np.arange(kept[0], kept[0] + kept.size)):
        return None
    return axis, int(kept[0]), int(kept[0] + kept.size)


def _from_gemm(g: Graph, v, depth: int = 0) -> bool:
    """v is a GEMM's output, through views and a bias Add: a fused projection's result. (Other
    slices are left to their matchers: rotate_half's two halves are rotary's, passes/canonicalize_rotary.py.)"""
    n = g.producer(v.name)
    if n is None or depth > 3:
        return False
    if n.op in ("MatMul", "Gemm") and n.domain in ("", "graphc"):
        return True
    if n.domain or n.op not in ("Reshape", "Add") or not n.inputs or n.inputs[0] is None:
        return False
    if n.op == "Add":
        consts = [i for i in n.inputs if i is not None and g.const(i.name) is not None]
        others = [i for i in n.inputs if i is not None and g.const(i.name) is None]
        return len(consts) == 1 and len(others) == 1 and _from_gemm(g, others[0], depth + 1)
    return _from_gemm(g, n.inputs[0], depth + 1)


def _qkv_of_transposed_gemm(g: Graph, x, slices: list[Node]) -> bool:
    """x is a Transpose of a GEMM's output (through views and a bias Add) and three or more Slices
    read it: TorchScript's GPT-NeoX slices q, k and v out of its fused projection transposed to
    [batch, heads, seq, 3 * head_dim], where dynamo writes one Split of the same transpose. (Two
    slices of a transposed projection are rotate_half's halves of q or k: the rotary matcher's.)"""
    t = g.producer(x.name)
    if t is None or t.domain or t.op != "Transpose" or len(slices) < 3:
        return False
    return _from_gemm(g, t.inputs[0])


def _slices_split(g: Graph, node: Node, ctx: RewriteContext, made: dict) -> Rewritten | None:
    if node.name in made:  # a sibling made the Split
        return Rewritten([made.pop(node.name)], [node])
    x = node.inputs[0] if node.inputs else None
    xs = None if x is None else _static_shape(x)
    if xs is None or _axis_range(g, node, xs) is None:
        return None
    slices = [u for u in g.users(x.name) if u.op == "Slice" and not u.domain and u.inputs[0].name == x.name]
    if not (_from_gemm(g, x) or _qkv_of_transposed_gemm(g, x, slices)):
        return None
    ranges = [(_axis_range(g, u, xs), u) for u in slices]
    if len(ranges) < 2 or any(r is None for r, _ in ranges) or len({r[0] for r, _ in ranges}) != 1:
        return None
    ranges.sort(key=lambda ru: ru[0][1])
    axis = ranges[0][0][0]
    bounds = [(r[1], r[2]) for r, _ in ranges]
    gaps = any(prev[1] != nxt[0] for prev, nxt in zip(bounds, bounds[1:], strict=False))
    if bounds[0][0] != 0 or bounds[-1][1] != xs[axis] or gaps:
        return None  # not a partition of the axis
    b = ctx.b
    sizes = b.add_constant(np.array([hi - lo for lo, hi in bounds], dtype=np.int64), f"{node.name}/split_sizes")
    outs = b.add_node("Split", [ctx.mapv(x), sizes], {"axis": axis}, name=f"{node.name}/split", outputs=len(bounds))
    for (_, u), v in zip(ranges, outs.outputs, strict=True):
        made[u.name] = v
    log.debug("%s: %d slices of %s partition axis %d -> one Split", node.name, len(bounds), x.name, axis)
    return Rewritten([made.pop(node.name)], [node])


def gathers_to_views(graph: Graph) -> Graph:
    """GATHER_ARANGE, GATHER_ND_ARANGE, SLICES_CONCAT, GATHER_ND_OF_TRANSPOSE and SLICES_SPLIT
    everywhere they apply (the Gather that SLICES_CONCAT makes becomes a Reshape on the next run of the fixed point,
    if it is one)."""

    made: dict[str, object] = {}  # SLICES_SPLIT: a Slice's name -> its output of the Split made

    def visit(node: Node, ctx: RewriteContext) -> Rewritten | None:
        return (
            _gather_to_reshape(graph, node, ctx)
            or _slices_concat_to_gather(graph, node, ctx)
            or _gather_nd_of_transpose(graph, node, ctx)
            or _slices_split(graph, node, ctx, made)
        )

    return rewrite_graph(graph, visit)
