"""Data movement ops: Transpose, Tile, Concat, Split, Slice, Gather, GatherElements, GatherND,
ScatterElements, ScatterND, NonZero, OneHot, Pad, Trilu, DepthToSpace, SpaceToDepth, TopK,
CumSum, CumProd, ReverseSequence, Compress, EyeLike, Unique, CenterCropPad (Resize lives in
graphc/ops/resize.py and registers itself from here).

Sizes that come from inputs (Slice bounds, Pad pads, Tile repeats, Split sizes, TopK k, OneHot
depth...) give exact output shapes when their values are known at build time; those inputs are
listed in `static_inputs`, since codegen needs them as constants.

This module holds the numpy kernels (what the interpreter and a CPU engine run); type
inference and traits are in graphc.ops.data_movement.
"""

from __future__ import annotations

import math

import numpy as np

from graphc.runtime.dtypes import Dim, DType
from graphc.runtime.reference.registry import register_kernel


def norm_axis(axis: int, rank: int) -> int:
    return axis + rank if axis < 0 else axis


def _ints(x: np.ndarray | None) -> list[int] | None:
    return None if x is None else [int(v) for v in np.asarray(x).reshape(-1)]


def _transpose_compute(ins, attrs, n):
    x = ins[0]
    perm = attrs.perm if attrs.perm is not None else tuple(range(x.ndim - 1, -1, -1))
    return [np.transpose(x, perm)]


def _tile_compute(ins, attrs, n):
    return [np.tile(ins[0], _ints(ins[1]))]


def _concat_compute(ins, attrs, n):
    return [np.concatenate(ins, axis=attrs.axis)]


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


def _split_compute(ins, attrs, n):
    x = ins[0]
    axis = norm_axis(attrs.axis, x.ndim)
    split = _ints(ins[1]) if len(ins) > 1 else None

    def fail(msg):
        raise ValueError(msg)

    sizes = split_sizes(x.shape[axis], split, attrs.num_outputs, n, fail)
    return np.split(x, np.cumsum(sizes)[:-1], axis=axis)


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


def _gather_compute(ins, attrs, n):
    x, idx = ins
    axis = norm_axis(attrs.axis, x.ndim)
    return [np.take(x, idx.astype(np.int64), axis=axis)]


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


def _scatter_elements_compute(ins, attrs, n):
    x, idx, upd = ins
    axis = norm_axis(attrs.axis, x.ndim)
    return [_scatter(x.copy(), _element_index(idx, axis, x.shape[axis]), upd, attrs.reduction)]


def _scatternd_compute(ins, attrs, n):
    x, idx, upd = ins
    k = idx.shape[-1]
    flat = idx.reshape(-1, k).astype(np.int64)
    dims = np.array(x.shape[:k], dtype=np.int64)
    flat = np.where(flat < 0, flat + dims, flat)
    index = tuple(flat[:, j] for j in range(k))
    upd = upd.reshape((flat.shape[0],) + x.shape[k:])
    return [_scatter(x.copy(), index, upd, attrs.reduction)]


# ---- NonZero, OneHot ---------------------------------------------------------------------------


def _nonzero_compute(ins, attrs, n):
    x = ins[0]
    if x.ndim == 0:
        return [np.zeros((0, int(bool(x))), dtype=np.int64)]
    return [np.array(np.nonzero(x), dtype=np.int64).reshape(x.ndim, -1)]


def _onehot_compute(ins, attrs, n):
    idx, depth, values = ins
    depth = int(np.asarray(depth).reshape(-1)[0])
    idx = np.asarray(idx).astype(np.int64)
    idx = np.where(idx < 0, idx + depth, idx)
    axis = norm_axis(attrs.axis, idx.ndim + 1)
    hot = np.expand_dims(idx, axis) == np.arange(depth).reshape((-1,) + (1,) * (idx.ndim - axis))
    values = values.reshape(-1)
    return [np.where(hot, values[1], values[0]).astype(values.dtype)]


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


def _ccp_axes(attrs, rank: int, fail) -> list[int]:
    axes = list(range(rank)) if attrs.axes is None else [norm_axis(a, rank) for a in attrs.axes]
    if any(not 0 <= a < rank for a in axes) or len(set(axes)) != len(axes):
        fail(f"axes {list(attrs.axes)} are out of range or repeated for rank {rank}")
    return axes


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


def _trilu_compute(ins, attrs, n):
    x = ins[0]
    k = int(np.asarray(ins[1]).reshape(-1)[0]) if len(ins) > 1 and ins[1] is not None else 0
    rows = np.arange(x.shape[-2])[:, None]
    cols = np.arange(x.shape[-1])[None, :]
    keep = (cols - rows >= k) if attrs.upper else (cols - rows <= k)
    return [np.where(keep, x, np.zeros((), x.dtype))]


def _eyelike_dtype(ctx_attrs, in_dtype: DType) -> DType:
    return in_dtype if ctx_attrs.dtype is None else DType.from_onnx(ctx_attrs.dtype)


def _eyelike_compute(ins, attrs, n):
    x = ins[0]
    dtype = _eyelike_dtype(attrs, DType.from_numpy(x.dtype)).numpy
    return [np.eye(x.shape[0], x.shape[1], k=attrs.k, dtype=dtype)]


def _d2s_compute(ins, attrs, n):
    x = ins[0]
    b = attrs.blocksize
    nb, c, h, w = x.shape
    if attrs.mode == "DCR":
        y = x.reshape(nb, b, b, c // (b * b), h, w).transpose(0, 3, 4, 1, 5, 2)
    else:
        y = x.reshape(nb, c // (b * b), b, b, h, w).transpose(0, 1, 4, 2, 5, 3)
    return [y.reshape(nb, c // (b * b), h * b, w * b)]


def _s2d_compute(ins, attrs, n):
    x = ins[0]
    b = attrs.blocksize
    nb, c, h, w = x.shape
    y = x.reshape(nb, c, h // b, b, w // b, b)
    perm = (0, 3, 5, 1, 2, 4) if attrs.mode == "DCR" else (0, 1, 3, 5, 2, 4)
    return [y.transpose(perm).reshape(nb, c * b * b, h // b, w // b)]


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


def _compress_compute(ins, attrs, n):
    x, cond = ins
    axis = attrs.axis
    size = x.size if axis is None else x.shape[norm_axis(axis, x.ndim)]
    cond = np.asarray(cond).reshape(-1)[:size].astype(bool)
    return [np.compress(cond, x, axis=axis)]


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


def _tensor_scatter_positions(write: np.ndarray, seq: int, max_len: int, circular: bool) -> np.ndarray:
    """[batch, seq] cache positions of TensorScatter's update rows: write[b] + s, modulo the cache
    length in circular mode. In linear mode a position past the cache is an error (ONNX's
    reference indexes out of range there), named with its batch row."""
    pos = write.astype(np.int64).reshape(-1, 1) + np.arange(seq, dtype=np.int64)
    if circular:
        return np.mod(pos, max_len)
    bad = np.argwhere((pos < 0) | (pos >= max_len))
    if bad.size:
        b = int(bad[0][0])
        raise ValueError(
            f"write_indices[{b}] = {int(write.reshape(-1)[b])} with {seq} update rows leaves the cache's "
            f"{max_len} positions (mode linear; mode circular wraps)"
        )
    return pos


def _tensor_scatter_compute(ins, attrs, n):
    past, upd = ins[0], ins[1]
    write = ins[2] if len(ins) > 2 and ins[2] is not None else np.zeros(past.shape[0], np.int64)
    axis = norm_axis(attrs.axis, past.ndim)
    pos = _tensor_scatter_positions(write, upd.shape[axis], past.shape[axis], attrs.mode == "circular")
    out = past.copy()
    # move the sequence axis next to the batch axis: out_v[b, s, ...] is out[b, ..., s, ...]
    out_v, upd_v = np.moveaxis(out, axis, 1), np.moveaxis(upd, axis, 1)
    rows = np.arange(past.shape[0])[:, None]
    out_v[rows, pos] = upd_v  # (axis 0, the batch axis itself, is refused by shape inference)
    return [out]


register_kernel("Transpose", _transpose_compute)
register_kernel("Tile", _tile_compute)
register_kernel("Concat", _concat_compute)
register_kernel("Split", _split_compute)
register_kernel("Slice", _slice_compute)
register_kernel("Gather", _gather_compute)
register_kernel("GatherElements", _gather_elements_compute)
register_kernel("GatherND", _gathernd_compute)
register_kernel("ScatterElements", _scatter_elements_compute)
register_kernel("ScatterND", _scatternd_compute)
register_kernel("TensorScatter", _tensor_scatter_compute)
register_kernel("NonZero", _nonzero_compute)
register_kernel("OneHot", _onehot_compute)
register_kernel("Pad", _pad_compute)
register_kernel("CenterCropPad", _ccp_compute)
register_kernel("Trilu", _trilu_compute)
register_kernel("EyeLike", _eyelike_compute)
register_kernel("DepthToSpace", _d2s_compute)
register_kernel("SpaceToDepth", _s2d_compute)
register_kernel("TopK", _topk_compute)
register_kernel("CumSum", lambda ins, a, n: [_cumulative(ins[0], ins[1], a, np.add, 0)])
register_kernel("CumProd", lambda ins, a, n: [_cumulative(ins[0], ins[1], a, np.multiply, 1)])
register_kernel("ReverseSequence", _revseq_compute)
register_kernel("Compress", _compress_compute)
register_kernel("Unique", _unique_compute)
