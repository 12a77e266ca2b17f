"""Data movement ops: Transpose, Tile, Concat, Split, Slice, Gather, GatherElements, GatherND,
ScatterElements, ScatterND, NonZero, OneHot, Pad, Trilu, DepthToSpace, SpaceToDepth, TopK,
CumSum, CumProd, ReverseSequence, Compress, EyeLike, Unique, CenterCropPad (Resize lives in
graphc/ops/resize.py and registers itself from here).

Sizes that come from inputs (Slice bounds, Pad pads, Tile repeats, Split sizes, TopK k, OneHot
depth...) give exact output shapes when their values are known at build time; those inputs are
listed in `static_inputs`, since codegen needs them as constants.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from graphc.ir.types import Dim, DType, TensorType
from graphc.ops.registry import Category, InferContext, register_op

# ---- dim helpers -------------------------------------------------------------------------------


def merge_dims(ctx: InferContext, dims: Sequence[Dim], what: str) -> Dim:
    """The one dim that several dims, required to be equal, must be: an int if any is an int
    (all ints must agree), else a symbol if all are the same symbol, else unknown."""
    ints = {d for d in dims if isinstance(d, int)}
    if len(ints) > 1:
        ctx.fail(f"{what}: dims {sorted(ints)} differ")
    if ints:
        return ints.pop()
    syms = set(dims)
    return syms.pop() if len(syms) == 1 else None


def add_dims(dims: Sequence[Dim]) -> Dim:
    """Sum of dims: exact when all are ints; a lone symbol plus zeros stays that symbol."""
    if all(isinstance(d, int) for d in dims):
        return sum(dims)  # type: ignore[arg-type]
    rest = [d for d in dims if d != 0]
    return rest[0] if len(rest) == 1 else None


def mul_dim(d: Dim, k: int) -> Dim:
    if isinstance(d, int):
        return d * k
    if k == 1:
        return d
    return 0 if k == 0 else None


def norm_axis(axis: int, rank: int) -> int:
    return axis + rank if axis < 0 else axis


def _static(values: Sequence[Dim]) -> bool:
    return all(isinstance(d, int) for d in values)


def _not_one_element(t: TensorType) -> bool:
    """Whether a static type surely holds other than one element (a scalar input's check)."""
    return t.is_static and t.numel != 1


def _ints(x: np.ndarray | None) -> list[int] | None:
    return None if x is None else [int(v) for v in np.asarray(x).reshape(-1)]


# ---- Transpose ---------------------------------------------------------------------------------


def _perm(ctx: InferContext, rank: int) -> tuple[int, ...]:
    perm = ctx.attrs.perm
    if perm is None:
        return tuple(range(rank - 1, -1, -1))
    if sorted(perm) != list(range(rank)):
        ctx.fail(f"perm {list(perm)} is not a permutation of the {rank} axes")
    return tuple(perm)


def _transpose_infer(ctx: InferContext):
    t = ctx.type(0)
    if t.shape is None:
        if ctx.attrs.perm is None:
            return [t]
        _perm(ctx, len(ctx.attrs.perm))
        return [t.with_shape((None,) * len(ctx.attrs.perm))]
    perm = _perm(ctx, len(t.shape))
    return [t.with_shape(tuple(t.shape[p] for p in perm))]


def _transpose_compute(ins, attrs, n):
    x = ins[0]
    perm = attrs.perm if attrs.perm is not None else tuple(range(x.ndim - 1, -1, -1))
    return [np.transpose(x, perm)]


register_op("Transpose", category=Category.DATA, infer=_transpose_infer, compute=_transpose_compute)

# ---- Tile --------------------------------------------------------------------------------------


def _tile_infer(ctx: InferContext):
    t = ctx.type(0)
    reps = ctx.int_list(1)
    if reps is None:
        return [t.with_shape(None if t.shape is None else (None,) * len(t.shape))]
    if t.shape is not None and len(reps) != len(t.shape):
        ctx.fail(f"repeats {reps} must have one entry per axis of the rank-{len(t.shape)} input")
    if any(r < 0 for r in reps):
        ctx.fail(f"repeats {reps} must be non-negative")
    shape = t.shape if t.shape is not None else (None,) * len(reps)
    return [t.with_shape(tuple(mul_dim(d, r) for d, r in zip(shape, reps, strict=True)))]


def _tile_compute(ins, attrs, n):
    return [np.tile(ins[0], _ints(ins[1]))]


register_op("Tile", category=Category.DATA, infer=_tile_infer, compute=_tile_compute, static_inputs=(1,))

# ---- Concat ------------------------------------------------------------------------------------


def _concat_infer(ctx: InferContext):
    types = [ctx.type(i) for i in range(len(ctx.input_types))]
    if not types:
        ctx.fail("needs at least one input")
    dtype = types[0].dtype
    if any(t.dtype != dtype for t in types):
        ctx.fail(f"inputs have different dtypes {[t.dtype.name for t in types]}")
    shapes = [t.shape for t in types if t.shape is not None]
    if not shapes:
        return [TensorType(dtype, None)]
    rank = len(shapes[0])
    if any(len(s) != rank for s in shapes):
        ctx.fail(f"inputs have different ranks: {[len(s) for s in shapes]}")
    if rank == 0:
        ctx.fail("cannot concatenate scalars")
    axis = ctx.axis(ctx.attrs.axis, rank)
    out: list[Dim] = []
    for i in range(rank):
        dims = [s[i] for s in shapes]
        if i == axis:
            out.append(add_dims(dims) if len(shapes) == len(types) else None)
        else:
            out.append(merge_dims(ctx, dims, f"axis {i}"))
    return [TensorType(dtype, tuple(out))]


def _concat_compute(ins, attrs, n):
    return [np.concatenate(ins, axis=attrs.axis)]


register_op("Concat", category=Category.DATA, infer=_concat_infer, compute=_concat_compute)

# ---- Split -------------------------------------------------------------------------------------


def split_sizes(dim: Dim, split: list[int] | None, num_outputs: int | None, n: int, fail) -> list[Dim]:
    """Sizes of Split's outputs along the axis. `split` is the split input (None if omitted or
    unknown), `num_outputs` the attribute; without either the dim splits into n equal parts."""
    if split is not None:
        if len(split) != n:
            fail(f"split {split} has {len(split)} entries for {n} outputs")
        if any(s < 0 for s in split):
            fail(f"split {split} has negative sizes")
        if isinstance(dim, int) and sum(split) != dim:
            fail(f"split {split} does not sum to the axis size {dim}")
        return list(split)
    if n == 1:
        return [dim]
    if not isinstance(dim, int):
        return [None] * n
    if num_outputs is not None:
        if num_outputs != n:
            fail(f"num_outputs is {num_outputs} but the node has {n} outputs")
        # The spec: equal chunks of ceil(dim / n), the last one smaller.
        chunk = -(-dim // n)
        last = dim - chunk * (n - 1)
        if last < 0:
            fail(f"cannot split {dim} into {n} chunks of {chunk}")
        return [chunk] * (n - 1) + [last]
    if dim % n:
        fail(f"axis size {dim} does not split into {n} equal parts")
    return [dim // n] * n


def _split_infer(ctx: InferContext):
    t = ctx.type(0)
    n = ctx.num_outputs
    if t.shape is None:
        return [t] * n
    rank = len(t.shape)
    axis = ctx.axis(ctx.attrs.axis, rank)
    split = ctx.int_list(1)
    if ctx.has_input(1) and split is None:
        sizes: list[Dim] = [None] * n
    else:
        sizes = split_sizes(t.shape[axis], split, ctx.attrs.num_outputs, n, ctx.fail)
    return [t.with_shape(t.shape[:axis] + (s,) + t.shape[axis + 1 :]) for s in sizes]


def _split_compute(ins, attrs, n):
    x = ins[0]
    axis = norm_axis(attrs.axis, x.ndim)
    split = _ints(ins[1]) if len(ins) > 1 else None

    def fail(msg):
        raise ValueError(msg)

    sizes = split_sizes(x.shape[axis], split, attrs.num_outputs, n, fail)
    return np.split(x, np.cumsum(sizes)[:-1], axis=axis)


register_op("Split", category=Category.DATA, infer=_split_infer, compute=_split_compute, static_inputs=(1,))

# ---- Slice -------------------------------------------------------------------------------------


def slice_axis(dim: int, start: int, end: int, step: int) -> tuple[slice, int]:
    """The numpy slice and output size of one sliced axis, clamped exactly as the spec says."""
    if start < 0:
        start += dim
    if end < 0:
        end += dim
    if step > 0:
        start = min(max(start, 0), dim)
        end = min(max(end, 0), dim)
        size = max(0, -(-(end - start) // step))
    else:
        start = min(max(start, 0), dim - 1)
        end = min(max(end, -1), dim - 1)
        size = max(0, -(-(start - end) // -step))
    if size == 0:
        return slice(0, 0), 0
    return slice(start, None if end < 0 else end, step), size


def _full_range(start: int, end: int, step: int) -> bool:
    """Whether a slice keeps a whole axis of any size (so a symbolic dim passes through)."""
    big = 1 << 30
    if step == 1:
        return start == 0 and end >= big
    if step == -1:
        return (start == -1 or start >= big) and end <= -big
    return False


def _slice_params(ctx: InferContext, rank: int):
    """(axes, starts, ends, steps) known at build time, or None where not known."""
    starts, ends = ctx.int_list(1), ctx.int_list(2)
    axes = ctx.int_list(3) if ctx.has_input(3) else None
    steps = ctx.int_list(4) if ctx.has_input(4) else None
    if ctx.has_input(3) and axes is None:
        return None
    n = None
    for v in (starts, ends, axes, steps):
        if v is not None:
            n = len(v)
            break
    if n is None:
        st = ctx.type(1).shape
        n = st[0] if st is not None and len(st) == 1 and isinstance(st[0], int) else None
    if n is None:
        return None
    if axes is None:
        axes = list(range(n))
    for name, v in (("starts", starts), ("ends", ends), ("axes", axes), ("steps", steps)):
        if v is not None and len(v) != n:
            ctx.fail(f"{name} has {len(v)} entries, expected {n}")
    axes = [ctx.axis(a, rank) for a in axes]
    if len(set(axes)) != len(axes):
        ctx.fail(f"repeated axes {axes}")
    if steps is None and not ctx.has_input(4):
        steps = [1] * n
    if steps is not None and 0 in steps:
        ctx.fail("a step is 0")
    return axes, starts, ends, steps


def _slice_infer(ctx: InferContext):
    t = ctx.type(0)
    if t.shape is None:
        return [t]
    rank = len(t.shape)
    params = _slice_params(ctx, rank)
    if params is None:
        return [t.with_shape((None,) * rank)]
    axes, starts, ends, steps = params
    out = list(t.shape)
    for i, a in enumerate(axes):
        d = t.shape[a]
        if starts is None or ends is None or steps is None:
            out[a] = None
        elif isinstance(d, int):
            out[a] = slice_axis(d, starts[i], ends[i], steps[i])[1]
        else:
            out[a] = d if _full_range(starts[i], ends[i], steps[i]) else None
    return [t.with_shape(tuple(out))]


def _slice_compute(ins, attrs, n):
    x = ins[0]
    starts, ends = _ints(ins[1]), _ints(ins[2])
    axes = _ints(ins[3]) if len(ins) > 3 and ins[3] is not None else list(range(len(starts)))
    steps = _ints(ins[4]) if len(ins) > 4 and ins[4] is not None else [1] * len(starts)
    index = [slice(None)] * x.ndim
    for a, s, e, st in zip(axes, starts, ends, steps, strict=True):
        a = norm_axis(a, x.ndim)
        index[a] = slice_axis(x.shape[a], s, e, st)[0]
    return [x[tuple(index)]]


register_op(
    "Slice",
    category=Category.DATA,
    infer=_slice_infer,
    compute=_slice_compute,
    static_inputs=(1, 2, 3, 4),
)

# ---- Gather, GatherElements, GatherND ----------------------------------------------------------


def _gather_infer(ctx: InferContext):
    t, it = ctx.type(0), ctx.type(1)
    if t.shape is None or it.shape is None:
        return [t.with_shape(None)]
    rank = len(t.shape)
    if rank == 0:
        ctx.fail("data must have rank >= 1")
    axis = ctx.axis(ctx.attrs.axis, rank)
    return [t.with_shape(t.shape[:axis] + it.shape + t.shape[axis + 1 :])]


def _gather_compute(ins, attrs, n):
    x, idx = ins
    axis = norm_axis(attrs.axis, x.ndim)
    return [np.take(x, idx.astype(np.int64), axis=axis)]


register_op("Gather", category=Category.DATA, infer=_gather_infer, compute=_gather_compute)


def _gather_elements_infer(ctx: InferContext):
    t, it = ctx.type(0), ctx.type(1)
    if t.shape is not None and it.shape is not None:
        if len(t.shape) != len(it.shape):
            ctx.fail(f"data {t} and indices {it} must have the same rank")
        ctx.axis(ctx.attrs.axis, len(t.shape))
    return [t.with_shape(it.shape)]


def _element_index(idx: np.ndarray, axis: int, dim: int) -> tuple[np.ndarray, ...]:
    """Index tuple that puts idx (negatives wrapped) on `axis` and each element's own position
    on every other axis (GatherElements / ScatterElements)."""
    idx = idx.astype(np.int64)
    idx = np.where(idx < 0, idx + dim, idx)
    grids = list(np.ogrid[tuple(slice(0, s) for s in idx.shape)])
    grids[axis] = idx
    return tuple(grids)


def _gather_elements_compute(ins, attrs, n):
    x, idx = ins
    axis = norm_axis(attrs.axis, x.ndim)
    return [x[_element_index(idx, axis, x.shape[axis])]]


register_op(
    "GatherElements",
    category=Category.DATA,
    infer=_gather_elements_infer,
    compute=_gather_elements_compute,
)


def _gathernd_infer(ctx: InferContext):
    t, it = ctx.type(0), ctx.type(1)
    b = ctx.attrs.batch_dims
    if t.shape is None or it.shape is None or not isinstance(it.shape[-1] if it.shape else 0, int):
        return [t.with_shape(None)]
    r, q = len(t.shape), len(it.shape)
    if r < 1 or q < 1:
        ctx.fail("data and indices must have rank >= 1")
    if not 0 <= b < min(q, r):
        ctx.fail(f"batch_dims {b} must be in [0, min(rank(data), rank(indices)))")
    k = it.shape[-1]
    if not 1 <= k <= r - b:
        ctx.fail(f"indices' last dim {k} must be in [1, {r - b}]")
    for i in range(b):
        merge_dims(ctx, [t.shape[i], it.shape[i]], f"batch dim {i}")
    return [t.with_shape(it.shape[:-1] + t.shape[b + k :])]


def _gathernd_compute(ins, attrs, n):
    x, idx = ins
    b = attrs.batch_dims
    k = idx.shape[-1]
    batch = math.prod(x.shape[:b])
    xb = x.reshape((batch,) + x.shape[b:])
    ib = idx.reshape(batch, -1, k).astype(np.int64)
    dims = np.array(x.shape[b : b + k], dtype=np.int64)
    ib = np.where(ib < 0, ib + dims, ib)
    picked = xb[(np.arange(batch)[:, None],) + tuple(ib[..., j] for j in range(k))]
    return [picked.reshape(idx.shape[:-1] + x.shape[b + k :])]


register_op("GatherND", category=Category.DATA, infer=_gathernd_infer, compute=_gathernd_compute)

# ---- ScatterElements, ScatterND ----------------------------------------------------------------

_SCATTER_UFUNCS = {
    "add": np.add,
    "mul": np.multiply,
    "max": np.maximum,
    "min": np.minimum,
}


def _scatter(out: np.ndarray, index: tuple, updates: np.ndarray, reduction: str) -> np.ndarray:
    """out[index] (op)= updates, in place on a copy; duplicates combine under a reduction (and
    the last one wins without one, as a sequential loop would do)."""
    if reduction == "none":
        out[index] = updates
        return out
    ufunc = _SCATTER_UFUNCS.get(reduction)
    if ufunc is None:
        raise ValueError(f"unknown reduction {reduction!r}")
    if out.dtype == np.bool_ and reduction in ("add", "mul"):
        ufunc = np.logical_or if reduction == "add" else np.logical_and
    ufunc.at(out, index, updates)
    return out


def _scatter_reduction_check(ctx: InferContext) -> None:
    if ctx.attrs.reduction not in ("none", *_SCATTER_UFUNCS):
        ctx.fail(f"reduction {ctx.attrs.reduction!r} is not one of none, add, mul, max, min")


def _scatter_elements_infer(ctx: InferContext):
    t, it, ut = ctx.type(0), ctx.type(1), ctx.type(2)
    _scatter_reduction_check(ctx)
    if ut.dtype != t.dtype:
        ctx.fail(f"updates dtype {ut.dtype.name} != data dtype {t.dtype.name}")
    if t.shape is not None:
        ctx.axis(ctx.attrs.axis, len(t.shape))
        for s in (it.shape, ut.shape):
            if s is not None and len(s) != len(t.shape):
                ctx.fail(f"data {t}, indices {it} and updates {ut} must have the same rank")
    return [t]


def _scatter_elements_compute(ins, attrs, n):
    x, idx, upd = ins
    axis = norm_axis(attrs.axis, x.ndim)
    return [_scatter(x.copy(), _element_index(idx, axis, x.shape[axis]), upd, attrs.reduction)]


register_op(
    "ScatterElements",
    category=Category.DATA,
    infer=_scatter_elements_infer,
    compute=_scatter_elements_compute,
)


def _scatternd_infer(ctx: InferContext):
    t, it, ut = ctx.type(0), ctx.type(1), ctx.type(2)
    _scatter_reduction_check(ctx)
    if ut.dtype != t.dtype:
        ctx.fail(f"updates dtype {ut.dtype.name} != data dtype {t.dtype.name}")
    if t.shape is not None and it.shape is not None and isinstance(it.shape[-1], int):
        k = it.shape[-1]
        if not 1 <= k <= len(t.shape):
            ctx.fail(f"indices' last dim {k} must be in [1, {len(t.shape)}]")
        want = it.shape[:-1] + t.shape[k:]
        if ut.shape is not None:
            if len(ut.shape) != len(want):
                ctx.fail(f"updates {ut} must have shape {want}")
            for i, (a, w) in enumerate(zip(ut.shape, want, strict=True)):
                merge_dims(ctx, [a, w], f"updates dim {i}")
    return [t]


def _scatternd_compute(ins, attrs, n):
    x, idx, upd = ins
    k = idx.shape[-1]
    flat = idx.reshape(-1, k).astype(np.int64)
    dims = np.array(x.shape[:k], dtype=np.int64)
    flat = np.where(flat < 0, flat + dims, flat)
    index = tuple(flat[:, j] for j in range(k))
    upd = upd.reshape((flat.shape[0],) + x.shape[k:])
    return [_scatter(x.copy(), index, upd, attrs.reduction)]


register_op("ScatterND", category=Category.DATA, infer=_scatternd_infer, compute=_scatternd_compute)

# ---- NonZero, OneHot ---------------------------------------------------------------------------


def _nonzero_compute(ins, attrs, n):
    x = ins[0]
    if x.ndim == 0:
        return [np.zeros((0, int(bool(x))), dtype=np.int64)]
    return [np.array(np.nonzero(x), dtype=np.int64).reshape(x.ndim, -1)]


def _nonzero_infer(ctx: InferContext):
    t = ctx.type(0)
    v = ctx.value(0)
    if v is not None:
        return [TensorType(DType.int64, _nonzero_compute([np.asarray(v)], None, 1)[0].shape)]
    return [TensorType(DType.int64, (None if t.shape is None else len(t.shape), None))]


register_op("NonZero", category=Category.DATA, infer=_nonzero_infer, compute=_nonzero_compute)


def _onehot_infer(ctx: InferContext):
    it, dt, vt = ctx.type(0), ctx.type(1), ctx.type(2)
    if vt.shape is not None and vt.shape not in ((2,), (None,)) and _static(vt.shape):
        ctx.fail(f"values must be a 2-element tensor [off, on], got {vt}")
    if _not_one_element(dt):
        ctx.fail(f"depth must hold one value, got {dt}")
    depth_v = ctx.value(1)
    depth: Dim = None if depth_v is None else int(np.asarray(depth_v).reshape(-1)[0])
    if isinstance(depth, int) and depth < 1:
        ctx.fail(f"depth {depth} must be positive")
    if it.shape is None:
        return [TensorType(vt.dtype, None)]
    rank = len(it.shape) + 1
    axis = ctx.axis(ctx.attrs.axis, rank)
    return [TensorType(vt.dtype, it.shape[:axis] + (depth,) + it.shape[axis:])]


def _onehot_compute(ins, attrs, n):
    idx, depth, values = ins
    depth = int(np.asarray(depth).reshape(-1)[0])
    idx = np.asarray(idx).astype(np.int64)
    idx = np.where(idx < 0, idx + depth, idx)
    axis = norm_axis(attrs.axis, idx.ndim + 1)
    hot = np.expand_dims(idx, axis) == np.arange(depth).reshape((-1,) + (1,) * (idx.ndim - axis))
    values = values.reshape(-1)
    return [np.where(hot, values[1], values[0]).astype(values.dtype)]


register_op("OneHot", category=Category.DATA, infer=_onehot_infer, compute=_onehot_compute, static_inputs=(1,))

# ---- Pad, CenterCropPad ------------------------------------------------------------------------


def pad_widths(rank: int, pads: list[int], axes: list[int] | None, fail) -> list[tuple[int, int]]:
    """(begin, end) pads of every axis from the pads input (and the optional axes input)."""
    if axes is None:
        axes = list(range(rank))
    axes = [norm_axis(a, rank) for a in axes]
    if any(not 0 <= a < rank for a in axes) or len(set(axes)) != len(axes):
        fail(f"axes {axes} are out of range or repeated for rank {rank}")
    if len(pads) != 2 * len(axes):
        fail(f"pads {pads} must have 2 entries per padded axis ({len(axes)} axes)")
    widths = [(0, 0)] * rank
    for i, a in enumerate(axes):
        widths[a] = (pads[i], pads[len(axes) + i])
    return widths


_PAD_MODES = ("constant", "reflect", "edge", "wrap")


def _pad_infer(ctx: InferContext):
    t = ctx.type(0)
    if ctx.attrs.mode not in _PAD_MODES:
        ctx.fail(f"mode {ctx.attrs.mode!r} is not one of {', '.join(_PAD_MODES)}")
    if t.shape is None:
        return [t]
    rank = len(t.shape)
    pads = ctx.int_list(1)
    axes = ctx.int_list(3) if ctx.has_input(3) else None
    if pads is None or (ctx.has_input(3) and axes is None):
        return [t.with_shape((None,) * rank)]
    widths = pad_widths(rank, pads, axes, ctx.fail)
    out = []
    for d, (b, e) in zip(t.shape, widths, strict=True):
        if isinstance(d, int):
            if d + b + e < 0 or d + min(b, 0) + min(e, 0) < 0:
                ctx.fail(f"pads {pads} remove more than the {d} elements of an axis")
            out.append(d + b + e)
        else:
            out.append(d if b == e == 0 else None)
    return [t.with_shape(tuple(out))]


def _pad_compute(ins, attrs, n):
    x, pads = ins[0], _ints(ins[1])
    value = ins[2] if len(ins) > 2 and ins[2] is not None and np.asarray(ins[2]).size else None
    axes = _ints(ins[3]) if len(ins) > 3 and ins[3] is not None else None

    def fail(msg):
        raise ValueError(msg)

    widths = pad_widths(x.ndim, pads, axes, fail)
    # Negative pads crop first; the rest pads the cropped tensor (ONNX Runtime's order).
    crop = tuple(slice(max(-b, 0), x.shape[i] - max(-e, 0)) for i, (b, e) in enumerate(widths))
    x = x[crop]
    grow = [(max(b, 0), max(e, 0)) for b, e in widths]
    if attrs.mode == "constant":
        cv = np.zeros((), x.dtype) if value is None else np.asarray(value).reshape(-1)[0]
        return [np.pad(x, grow, mode="constant", constant_values=cv).astype(x.dtype, copy=False)]
    return [np.pad(x, grow, mode=attrs.mode)]


register_op("Pad", category=Category.DATA, infer=_pad_infer, compute=_pad_compute, static_inputs=(1, 2, 3))


def _ccp_axes(attrs, rank: int, fail) -> list[int]:
    axes = list(range(rank)) if attrs.axes is None else [norm_axis(a, rank) for a in attrs.axes]
    if any(not 0 <= a < rank for a in axes) or len(set(axes)) != len(axes):
        fail(f"axes {list(attrs.axes)} are out of range or repeated for rank {rank}")
    return axes


def _ccp_infer(ctx: InferContext):
    t = ctx.type(0)
    if t.shape is None:
        return [t]
    axes = _ccp_axes(ctx.attrs, len(t.shape), ctx.fail)
    shape = ctx.int_list(1)
    out = list(t.shape)
    if shape is None:
        for a in axes:
            out[a] = None
        return [t.with_shape(tuple(out))]
    if len(shape) != len(axes):
        ctx.fail(f"shape {shape} must have one entry per axis {axes}")
    for a, s in zip(axes, shape, strict=True):
        out[a] = s
    return [t.with_shape(tuple(out))]


def _ccp_compute(ins, attrs, n):
    x, shape = ins[0], _ints(ins[1])

    def fail(msg):
        raise ValueError(msg)

    axes = _ccp_axes(attrs, x.ndim, fail)
    src = [slice(None)] * x.ndim
    dst = [slice(None)] * x.ndim
    out_shape = list(x.shape)
    for a, s in zip(axes, shape, strict=True):
        d = x.shape[a]
        out_shape[a] = s
        # Centered; an odd difference puts the extra element at the end.
        if s < d:
            off = (d - s) // 2
            src[a] = slice(off, off + s)
        elif s > d:
            off = (s - d) // 2
            dst[a] = slice(off, off + d)
    out = np.zeros(out_shape, dtype=x.dtype)
    out[tuple(dst)] = x[tuple(src)]
    return [out]


register_op(
    "CenterCropPad",
    category=Category.DATA,
    infer=_ccp_infer,
    compute=_ccp_compute,
    static_inputs=(1,),
)

# ---- Trilu, EyeLike ----------------------------------------------------------------------------


def _trilu_infer(ctx: InferContext):
    t = ctx.type(0)
    if t.shape is not None and len(t.shape) < 2:
        ctx.fail(f"input {t} must have rank >= 2")
    if ctx.has_input(1) and _not_one_element(ctx.type(1)):
        ctx.fail(f"k must be a scalar, got {ctx.type(1)}")
    return [t]


def _trilu_compute(ins, attrs, n):
    x = ins[0]
    k = int(np.asarray(ins[1]).reshape(-1)[0]) if len(ins) > 1 and ins[1] is not None else 0
    rows = np.arange(x.shape[-2])[:, None]
    cols = np.arange(x.shape[-1])[None, :]
    keep = (cols - rows >= k) if attrs.upper else (cols - rows <= k)
    return [np.where(keep, x, np.zeros((), x.dtype))]


register_op("Trilu", category=Category.DATA, infer=_trilu_infer, compute=_trilu_compute, static_inputs=(1,))


def _eyelike_dtype(ctx_attrs, in_dtype: DType) -> DType:
    return in_dtype if ctx_attrs.dtype is None else DType.from_onnx(ctx_attrs.dtype)


def _eyelike_infer(ctx: InferContext):
    t = ctx.type(0)
    if t.shape is not None and len(t.shape) != 2:
        ctx.fail(f"input {t} must have rank 2")
    try:
        dtype = _eyelike_dtype(ctx.attrs, t.dtype)
    except ValueError as e:
        ctx.fail(str(e))
    return [TensorType(dtype, t.shape)]


def _eyelike_compute(ins, attrs, n):
    x = ins[0]
    dtype = _eyelike_dtype(attrs, DType.from_numpy(x.dtype)).numpy
    return [np.eye(x.shape[0], x.shape[1], k=attrs.k, dtype=dtype)]


register_op("EyeLike", category=Category.DATA, infer=_eyelike_infer, compute=_eyelike_compute)

# ---- DepthToSpace, SpaceToDepth ----------------------------------------------------------------


def _check_mode(ctx: InferContext) -> None:
    if ctx.attrs.mode not in ("DCR", "CRD"):
        ctx.fail(f"mode {ctx.attrs.mode!r} must be DCR or CRD")


def _d2s_infer(ctx: InferContext):
    t = ctx.type(0)
    _check_mode(ctx)
    b = ctx.attrs.blocksize
    if b < 1:
        ctx.fail(f"blocksize {b} must be positive")
    if t.shape is None:
        return [t.with_shape((None,) * 4)]
    if len(t.shape) != 4:
        ctx.fail(f"input {t} must have rank 4 (N, C, H, W)")
    n, c, h, w = t.shape
    if isinstance(c, int) and c % (b * b):
        ctx.fail(f"channels {c} are not divisible by blocksize^2 = {b * b}")
    c_out = c // (b * b) if isinstance(c, int) else (c if b == 1 else None)
    return [t.with_shape((n, c_out, mul_dim(h, b), mul_dim(w, b)))]


def _d2s_compute(ins, attrs, n):
    x = ins[0]
    b = attrs.blocksize
    nb, c, h, w = x.shape
    if attrs.mode == "DCR":
        y = x.reshape(nb, b, b, c // (b * b), h, w).transpose(0, 3, 4, 1, 5, 2)
    else:
        y = x.reshape(nb, c // (b * b), b, b, h, w).transpose(0, 1, 4, 2, 5, 3)
    return [y.reshape(nb, c // (b * b), h * b, w * b)]


register_op("DepthToSpace", category=Category.DATA, infer=_d2s_infer, compute=_d2s_compute)


def _s2d_infer(ctx: InferContext):
    t = ctx.type(0)
    _check_mode(ctx)
    b = ctx.attrs.blocksize
    if b < 1:
        ctx.fail(f"blocksize {b} must be positive")
    if t.shape is None:
        return [t.with_shape((None,) * 4)]
    if len(t.shape) != 4:
        ctx.fail(f"input {t} must have rank 4 (N, C, H, W)")
    n, c, h, w = t.shape
    out: list[Dim] = [n, mul_dim(c, b * b)]
    for name, d in (("height", h), ("width", w)):
        if isinstance(d, int) and d % b:
            ctx.fail(f"{name} {d} is not divisible by blocksize {b}")
        out.append(d // b if isinstance(d, int) else (d if b == 1 else None))
    return [t.with_shape(tuple(out))]


def _s2d_compute(ins, attrs, n):
    x = ins[0]
    b = attrs.blocksize
    nb, c, h, w = x.shape
    y = x.reshape(nb, c, h // b, b, w // b, b)
    perm = (0, 3, 5, 1, 2, 4) if attrs.mode == "DCR" else (0, 1, 3, 5, 2, 4)
    return [y.transpose(perm).reshape(nb, c * b * b, h // b, w // b)]


register_op("SpaceToDepth", category=Category.DATA, infer=_s2d_infer, compute=_s2d_compute)

# ---- TopK --------------------------------------------------------------------------------------


def _topk_infer(ctx: InferContext):
    t = ctx.type(0)
    k = ctx.int_list(1)
    if k is not None and (len(k) != 1 or k[0] < 0):
        ctx.fail(f"K must be one non-negative value, got {k}")
    if t.shape is None:
        return [t, TensorType(DType.int64, None)]
    axis = ctx.axis(ctx.attrs.axis, len(t.shape))
    d = t.shape[axis]
    if k is not None and isinstance(d, int) and k[0] > d:
        ctx.fail(f"K = {k[0]} is larger than the axis size {d}")
    shape = t.shape[:axis] + (None if k is None else k[0],) + t.shape[axis + 1 :]
    return [t.with_shape(shape), TensorType(DType.int64, shape)]


def _topk_compute(ins, attrs, n):
    x = ins[0]
    k = int(np.asarray(ins[1]).reshape(-1)[0])
    axis = norm_axis(attrs.axis, x.ndim)
    if attrs.largest:
        # Descending with ties in ascending index order: a stable ascending sort of the reversed
        # axis, read backwards, puts the lower original index first among equals.
        rev = np.flip(x, axis)
        order = np.flip(np.argsort(rev, axis=axis, kind="stable"), axis)
        order = x.shape[axis] - 1 - order
    else:
        order = np.argsort(x, axis=axis, kind="stable")
    idx = np.take(order, np.arange(k), axis=axis).astype(np.int64)
    return [np.take_along_axis(x, idx, axis=axis), idx]


register_op("TopK", category=Category.DATA, infer=_topk_infer, compute=_topk_compute, static_inputs=(1,))

# ---- CumSum, CumProd ---------------------------------------------------------------------------


def _cum_infer(ctx: InferContext):
    t = ctx.type(0)
    at = ctx.type(1)
    if _not_one_element(at):
        ctx.fail(f"axis must be a scalar, got {at}")
    axis = ctx.int_list(1)
    if axis is not None and t.shape is not None:
        ctx.axis(axis[0], len(t.shape))
    return [t]


def _cumulative(x: np.ndarray, axis_in, attrs, ufunc: np.ufunc, identity: int) -> np.ndarray:
    axis = norm_axis(int(np.asarray(axis_in).reshape(-1)[0]), x.ndim)
    # Accumulate low-precision floats in float32; integers wrap in their own type.
    acc = np.float32 if x.dtype.kind == "f" and x.dtype.itemsize < 4 else x.dtype
    if x.dtype.name == "bfloat16":
        acc = np.float32
    y = x.astype(acc, copy=False)
    if attrs.reverse:
        y = np.flip(y, axis)
    if attrs.exclusive:
        head = np.full(y.shape[:axis] + (1,) + y.shape[axis + 1 :], identity, dtype=acc)
        body = np.take(y, np.arange(y.shape[axis] - 1), axis=axis)
        y = np.concatenate([head, body], axis=axis)
    y = ufunc.accumulate(y, axis=axis, dtype=acc)
    if attrs.reverse:
        y = np.flip(y, axis)
    return y.astype(x.dtype, copy=False)


register_op(
    "CumSum",
    category=Category.DATA,
    infer=_cum_infer,
    compute=lambda ins, a, n: [_cumulative(ins[0], ins[1], a, np.add, 0)],
    static_inputs=(1,),
)
register_op(
    "CumProd",
    category=Category.DATA,
    infer=_cum_infer,
    compute=lambda ins, a, n: [_cumulative(ins[0], ins[1], a, np.multiply, 1)],
    static_inputs=(1,),
)

# ---- ReverseSequence, Compress -----------------------------------------------------------------


def _revseq_infer(ctx: InferContext):
    t, lt = ctx.type(0), ctx.type(1)
    if t.shape is None:
        return [t]
    if len(t.shape) < 2:
        ctx.fail(f"input {t} must have rank >= 2")
    b = ctx.axis(ctx.attrs.batch_axis, len(t.shape))
    tm = ctx.axis(ctx.attrs.time_axis, len(t.shape))
    if {b, tm} != {0, 1}:
        ctx.fail(f"batch_axis {b} and time_axis {tm} must be 0 and 1 in some order")
    if lt.shape is not None:
        if len(lt.shape) != 1:
            ctx.fail(f"sequence_lens {lt} must have rank 1")
        merge_dims(ctx, [lt.shape[0], t.shape[b]], "sequence_lens vs batch size")
    return [t]


def _revseq_compute(ins, attrs, n):
    x, lens = ins
    b = norm_axis(attrs.batch_axis, x.ndim)
    tm = norm_axis(attrs.time_axis, x.ndim)
    steps = np.arange(x.shape[tm])[None, :]
    lens = lens.astype(np.int64)[:, None]
    src = np.where(steps < lens, lens - 1 - steps, steps)  # (batch, time)
    if b > tm:
        src = src.T
    grids = list(np.ogrid[tuple(slice(0, s) for s in x.shape)])
    grids[b] = np.arange(x.shape[b]).reshape([-1 if i == b else 1 for i in range(x.ndim)])
    shape2 = [x.shape[i] if i in (b, tm) else 1 for i in range(x.ndim)]
    grids[tm] = src.reshape(shape2)
    return [x[tuple(grids)]]


register_op("ReverseSequence", category=Category.DATA, infer=_revseq_infer, compute=_revseq_compute)


def _compress_count(cond: np.ndarray, size: int) -> int:
    return int(np.count_nonzero(np.asarray(cond).reshape(-1)[:size]))


def _compress_infer(ctx: InferContext):
    t, ct = ctx.type(0), ctx.type(1)
    if ct.shape is not None and len(ct.shape) != 1:
        ctx.fail(f"condition {ct} must have rank 1")
    cond = ctx.value(1)
    axis = ctx.attrs.axis
    if axis is None:
        if cond is not None and t.is_static:
            return [t.with_shape((_compress_count(cond, t.numel),))]
        return [t.with_shape((None,))]
    if t.shape is None:
        return [t]
    a = ctx.axis(axis, len(t.shape))
    d = t.shape[a]
    count = _compress_count(cond, d) if cond is not None and isinstance(d, int) else None
    return [t.with_shape(t.shape[:a] + (count,) + t.shape[a + 1 :])]


def _compress_compute(ins, attrs, n):
    x, cond = ins
    axis = attrs.axis
    size = x.size if axis is None else x.shape[norm_axis(axis, x.ndim)]
    cond = np.asarray(cond).reshape(-1)[:size].astype(bool)
    return [np.compress(cond, x, axis=axis)]


register_op(
    "Compress",
    category=Category.DATA,
    infer=_compress_infer,
    compute=_compress_compute,
    static_inputs=(1,),
)

# ---- Unique ------------------------------------------------------------------------------------


def _unique_compute(ins, attrs, n):
    x = ins[0]
    axis = attrs.axis
    if axis is None:
        y, first, inverse, counts = np.unique(x.reshape(-1), return_index=True, return_inverse=True, return_counts=True)
        take_axis = 0
    else:
        take_axis = norm_axis(axis, x.ndim)
        y, first, inverse, counts = np.unique(
            x, return_index=True, return_inverse=True, return_counts=True, axis=take_axis
        )
    inverse = inverse.reshape(-1)
    if not attrs.sorted:
        # Order by first occurrence; renumber the inverse map to match.
        perm = np.argsort(first, kind="stable")
        rank = np.empty_like(perm)
        rank[perm] = np.arange(perm.size)
        y = np.take(y, perm, axis=take_axis)
        first, counts, inverse = first[perm], counts[perm], rank[inverse]
    outs = [y, first.astype(np.int64), inverse.astype(np.int64), counts.astype(np.int64)]
    return outs[: max(n, 1)]


def _unique_infer(ctx: InferContext):
    t = ctx.type(0)
    v = ctx.value(0)
    if v is not None:
        outs = _unique_compute([np.asarray(v)], ctx.attrs, 4)
        types = [TensorType.of(o) for o in outs]
        return [types[0].with_dtype(t.dtype)] + types[1:]
    axis = ctx.attrs.axis
    i64 = DType.int64
    if axis is None:
        numel: Dim = t.numel if t.is_static else None
        return [t.with_shape((None,)), TensorType(i64, (None,)), TensorType(i64, (numel,))] + [TensorType(i64, (None,))]
    if t.shape is None:
        return [t, TensorType(i64, (None,)), TensorType(i64, (None,)), TensorType(i64, (None,))]
    a = ctx.axis(axis, len(t.shape))
    y = t.with_shape(t.shape[:a] + (None,) + t.shape[a + 1 :])
    return [y, TensorType(i64, (None,)), TensorType(i64, (t.shape[a],)), TensorType(i64, (None,))]


register_op("Unique", category=Category.DATA, infer=_unique_infer, compute=_unique_compute)

# Resize is long enough for a module of its own; importing it registers it.
from graphc.ops import resize as _resize  # noqa: E402, F401
