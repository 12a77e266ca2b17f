"""Data movement ops: Transpose, Tile, Concat, Split, Slice, Gather, GatherElements, GatherND,
ScatterElements, ScatterND, NonZero, OneHot, Pad, Trilu, DepthToSpace, SpaceToDepth, TopK,
CumSum, CumProd, ReverseSequence, Compress, EyeLike, Unique, CenterCropPad (Resize lives in
graphc/ops/resize.py and registers itself from here).

Sizes that come from inputs (Slice bounds, Pad pads, Tile repeats, Split sizes, TopK k, OneHot
depth...) give exact output shapes when their values are known at build time; those inputs are
listed in `static_inputs`, since codegen needs them as constants.

This module holds type inference and traits; the numpy kernels are in
graphc.runtime.reference.data_movement.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from graphc.ir.types import Dim, DType, TensorType
from graphc.ops.registry import Category, InferContext, register_op
from graphc.runtime.reference.data_movement import (
    _SCATTER_UFUNCS,
    _ccp_axes,
    _eyelike_dtype,
    _nonzero_compute,
    _unique_compute,
    split_sizes,
)
from graphc.runtime.reference.data_movement import pad_widths as pad_widths
from graphc.runtime.reference.data_movement import slice_axis as slice_axis

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


def _static(values: Sequence[Dim]) -> bool:
    return all(isinstance(d, int) for d in values)


def _not_one_element(t: TensorType) -> bool:
    """Whether a static type surely holds other than one element (a scalar input's check)."""
    return t.is_static and t.numel != 1


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


register_op("Transpose", category=Category.DATA, infer=_transpose_infer)

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


register_op("Tile", category=Category.DATA, infer=_tile_infer, static_inputs=(1,))

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


register_op("Concat", category=Category.DATA, infer=_concat_infer)


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


register_op("Split", category=Category.DATA, infer=_split_infer, static_inputs=(1,))


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


register_op(
    "Slice",
    category=Category.DATA,
    infer=_slice_infer,
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


register_op("Gather", category=Category.DATA, infer=_gather_infer)


def _gather_elements_infer(ctx: InferContext):
    t, it = ctx.type(0), ctx.type(1)
    if t.shape is not None and it.shape is not None:
        if len(t.shape) != len(it.shape):
            ctx.fail(f"data {t} and indices {it} must have the same rank")
        ctx.axis(ctx.attrs.axis, len(t.shape))
    return [t.with_shape(it.shape)]


register_op(
    "GatherElements",
    category=Category.DATA,
    infer=_gather_elements_infer,
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


register_op("GatherND", category=Category.DATA, infer=_gathernd_infer)


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


register_op(
    "ScatterElements",
    category=Category.DATA,
    infer=_scatter_elements_infer,
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


register_op("ScatterND", category=Category.DATA, infer=_scatternd_infer)


def _tensor_scatter_infer(ctx: InferContext):
    """TensorScatter (opset 24, a KV-cache write): past_cache and update alike but in the sequence
    axis, where the update is no longer; write_indices one per batch row."""
    t, ut = ctx.type(0), ctx.type(1)
    if ctx.attrs.mode not in ("linear", "circular"):
        ctx.fail(f"mode {ctx.attrs.mode!r} is not linear or circular")
    if ut.dtype != t.dtype:
        ctx.fail(f"update dtype {ut.dtype.name} != past_cache dtype {t.dtype.name}")
    if ctx.has_input(2) and ctx.type(2).dtype != DType.int64:
        ctx.fail(f"write_indices must be int64, got {ctx.type(2).dtype.name}")
    if t.shape is not None and ut.shape is not None:
        if len(ut.shape) != len(t.shape):
            ctx.fail(f"past_cache {t} and update {ut} must have the same rank")
        axis = ctx.axis(ctx.attrs.axis, len(t.shape))
        if axis == 0:
            ctx.fail("axis 0 is the batch axis; the sequence axis must come after it")
        for i, (a, b) in enumerate(zip(t.shape, ut.shape, strict=True)):
            if i != axis:
                merge_dims(ctx, [a, b], f"dim {i}")
            elif isinstance(a, int) and isinstance(b, int) and b > a:
                ctx.fail(f"update's {b} rows along axis {axis} exceed the cache's {a}")
        if ctx.has_input(2):
            w = ctx.type(2)
            if w.shape is not None and (len(w.shape) != 1):
                ctx.fail(f"write_indices must be 1-D [batch], got {w}")
            elif w.shape is not None:
                merge_dims(ctx, [w.shape[0], t.shape[0]], "write_indices' length (the batch)")
    return [t]


register_op("TensorScatter", category=Category.DATA, infer=_tensor_scatter_infer)


def _nonzero_infer(ctx: InferContext):
    t = ctx.type(0)
    v = ctx.value(0)
    if v is not None:
        return [TensorType(DType.int64, _nonzero_compute([np.asarray(v)], None, 1)[0].shape)]
    return [TensorType(DType.int64, (None if t.shape is None else len(t.shape), None))]


register_op("NonZero", category=Category.DATA, infer=_nonzero_infer)


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


register_op("OneHot", category=Category.DATA, infer=_onehot_infer, static_inputs=(1,))


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


register_op("Pad", category=Category.DATA, infer=_pad_infer, static_inputs=(1, 2, 3))


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


register_op(
    "CenterCropPad",
    category=Category.DATA,
    infer=_ccp_infer,
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


register_op("Trilu", category=Category.DATA, infer=_trilu_infer, static_inputs=(1,))


def _eyelike_infer(ctx: InferContext):
    t = ctx.type(0)
    if t.shape is not None and len(t.shape) != 2:
        ctx.fail(f"input {t} must have rank 2")
    try:
        dtype = _eyelike_dtype(ctx.attrs, t.dtype)
    except ValueError as e:
        ctx.fail(str(e))
    return [TensorType(dtype, t.shape)]


register_op("EyeLike", category=Category.DATA, infer=_eyelike_infer)

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


register_op("DepthToSpace", category=Category.DATA, infer=_d2s_infer)


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


register_op("SpaceToDepth", category=Category.DATA, infer=_s2d_infer)

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


register_op("TopK", category=Category.DATA, infer=_topk_infer, static_inputs=(1,))

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


register_op(
    "CumSum",
    category=Category.DATA,
    infer=_cum_infer,
    static_inputs=(1,),
)
register_op(
    "CumProd",
    category=Category.DATA,
    infer=_cum_infer,
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


register_op("ReverseSequence", category=Category.DATA, infer=_revseq_infer)


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


register_op(
    "Compress",
    category=Category.DATA,
    infer=_compress_infer,
    static_inputs=(1,),
)


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


register_op("Unique", category=Category.DATA, infer=_unique_infer)

# Resize is long enough for a module of its own; importing it registers it.
from graphc.ops import resize as _resize  # noqa: E402, F401
