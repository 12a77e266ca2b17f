"""Shape ops: Shape, Size, Range, ConstantOfShape, Reshape, Flatten, Squeeze, Unsqueeze, Expand,
Identity.

Shape and Size give their values from static types at build time (value_infer), and every op
here computes small known values, so exporter shape arithmetic resolves once shapes are bound.

This module holds type inference and traits; the numpy kernels are in
graphc.runtime.reference.shape_ops.
"""

from __future__ import annotations

import math

import numpy as np

from graphc.ir.types import DType, TensorType
from graphc.ops.registry import (
    Category,
    InferContext,
    broadcast_shapes,
    register_op,
)
from graphc.runtime.reference.shape_ops import _shape_slice


def _shape_infer(ctx: InferContext):
    if ctx.type(0).shape is None:
        # Unknown rank (an If whose branches differ in rank, e.g. exporters' squeeze-if-dim-is-1):
        # a 1-D shape of unknown length; binding shapes at compile time makes it exact.
        return [TensorType(DType.int64, (None,))]
    rank = ctx.rank(0)
    s, e = _shape_slice(rank, ctx.attrs.start, ctx.attrs.end)
    return [TensorType(DType.int64, (e - s,))]


def _shape_value(ctx: InferContext):
    t = ctx.type(0)
    if t.shape is None:
        return [None]
    s, e = _shape_slice(len(t.shape), ctx.attrs.start, ctx.attrs.end)
    dims = t.shape[s:e]
    if all(isinstance(d, int) for d in dims):
        return [np.array(dims, dtype=np.int64)]
    return [None]


register_op(
    "Shape",
    category=Category.SHAPE,
    infer=_shape_infer,
    value_infer=_shape_value,
)


def _size_value(ctx: InferContext):
    t = ctx.type(0)
    return [np.array(t.numel, dtype=np.int64) if t.is_static else None]


register_op(
    "Size",
    category=Category.SHAPE,
    infer=lambda ctx: [TensorType(DType.int64, ())],
    value_infer=_size_value,
)

# ---- Range, ConstantOfShape --------------------------------------------------------------------


def _range_infer(ctx: InferContext):
    dt = ctx.type(0).dtype
    start, limit, delta = (ctx.value(i) for i in range(3))
    if start is None or limit is None or delta is None:
        return [TensorType(dt, (None,))]
    start, limit, delta = (np.asarray(x).item() for x in (start, limit, delta))
    if delta == 0:
        ctx.fail("delta is 0")
    n = max(int(math.ceil((limit - start) / delta)), 0)
    return [TensorType(dt, (n,))]


register_op("Range", category=Category.SHAPE, infer=_range_infer)


def _cos_dtype(attrs) -> DType:
    v = attrs.value
    return DType.float32 if v is None else DType.from_numpy(v.array.dtype)


def _cos_infer(ctx: InferContext):
    dims = ctx.int_list(0)
    if dims is None:
        t = ctx.type(0)
        n = t.shape[0] if t.shape else None
        return [TensorType(_cos_dtype(ctx.attrs), None if not isinstance(n, int) else (None,) * n)]
    if any(d < 0 for d in dims):
        ctx.fail(f"negative dim in shape {dims}")
    return [TensorType(_cos_dtype(ctx.attrs), tuple(dims))]


register_op("ConstantOfShape", category=Category.SHAPE, infer=_cos_infer)

# ---- Reshape, Flatten --------------------------------------------------------------------------


def reshape_target(in_shape, target: list[int], allowzero: int, fail) -> tuple:
    """Resolve 0 (copy) and -1 (infer) in a Reshape target against the input shape."""
    out: list = []
    for i, d in enumerate(target):
        if d == 0 and not allowzero:
            if in_shape is None or i >= len(in_shape):
                if in_shape is None:
                    out.append(None)
                    continue
                fail(f"target {target} copies dim {i} of a rank-{len(in_shape)} input")
            out.append(in_shape[i])
        else:
            out.append(d)
    if out.count(-1) > 1:
        fail(f"target {target} has more than one -1")
    if -1 in out:
        idx = out.index(-1)
        known = [d for j, d in enumerate(out) if j != idx]
        if (
            in_shape is not None
            and all(isinstance(d, int) for d in in_shape)
            and all(isinstance(d, int) for d in known)
        ):
            total = math.prod(in_shape)
            rest = math.prod(known)
            if rest == 0 or total % rest:
                fail(f"cannot reshape {tuple(in_shape)} to {target}")
            out[idx] = total // rest
        else:
            out[idx] = _symbolic_remaining(in_shape, known)
    if (
        in_shape is not None
        and all(isinstance(d, int) for d in in_shape)
        and all(isinstance(d, int) for d in out)
        and math.prod(in_shape) != math.prod(out)
    ):
        fail(f"cannot reshape {tuple(in_shape)} ({math.prod(in_shape)} elements) to {tuple(out)}")
    return tuple(out)


def _symbolic_remaining(in_shape, known):
    """-1 against symbolic dims: if the known dims cancel all but one symbolic input dim, it is
    that dim (e.g. (batch, 12, 64) -> (-1, 768) gives batch)."""
    if in_shape is None:
        return None
    rem = list(in_shape)
    for d in known:
        if d in rem:
            rem.remove(d)
        elif isinstance(d, int):
            ints = [x for x in rem if isinstance(x, int)]
            prod = math.prod(ints)
            if prod % d if d else True:
                return None
            # divide d out of the int dims
            left = prod // d
            rem = [x for x in rem if not isinstance(x, int)] + ([left] if left != 1 else [])
        else:
            return None
    rem = [x for x in rem if x != 1]
    return rem[0] if len(rem) == 1 else (1 if not rem else None)


def _reshape_infer(ctx: InferContext):
    t = ctx.type(0)
    target = ctx.int_list(1)
    if target is None:
        st = ctx.type(1)
        n = st.shape[0] if st.shape else None
        return [t.with_shape(None if not isinstance(n, int) else (None,) * n)]
    return [t.with_shape(reshape_target(t.shape, target, ctx.attrs.allowzero, ctx.fail))]


register_op(
    "Reshape",
    category=Category.DATA,
    infer=_reshape_infer,
    static_inputs=(1,),
)


def _flatten_dims(shape, axis):
    def prod(ds):
        if all(isinstance(d, int) for d in ds):
            return math.prod(ds)
        non_one = [d for d in ds if d != 1]
        return non_one[0] if len(non_one) == 1 else None

    return (prod(shape[:axis]), prod(shape[axis:]))


def _flatten_infer(ctx: InferContext):
    t = ctx.type(0)
    rank = ctx.rank(0)
    axis = ctx.attrs.axis
    if not -rank <= axis <= rank:
        ctx.fail(f"axis {axis} is out of range for rank {rank}")
    axis = axis + rank if axis < 0 else axis
    return [t.with_shape(_flatten_dims(t.shape, axis))]


register_op("Flatten", category=Category.DATA, infer=_flatten_infer)

# ---- Squeeze, Unsqueeze ------------------------------------------------------------------------


def _squeeze_infer(ctx: InferContext):
    t = ctx.type(0)
    if t.shape is None:
        return [t]
    rank = len(t.shape)
    if ctx.has_input(1):
        axes = ctx.int_list(1)
        if axes is None:
            return [t.with_shape(None)]
        axes = sorted({ctx.axis(a, rank) for a in axes})
        for a in axes:
            if isinstance(t.shape[a], int) and t.shape[a] != 1:
                ctx.fail(f"cannot squeeze axis {a} of size {t.shape[a]}")
    else:
        if any(d is None or isinstance(d, str) for d in t.shape):
            return [t.with_shape(None)]
        axes = [i for i, d in enumerate(t.shape) if d == 1]
    return [t.with_shape(tuple(d for i, d in enumerate(t.shape) if i not in axes))]


register_op("Squeeze", category=Category.DATA, infer=_squeeze_infer, static_inputs=(1,))


def _unsqueeze_infer(ctx: InferContext):
    t = ctx.type(0)
    axes = ctx.int_list(1)
    if axes is None or t.shape is None:
        return [t.with_shape(None)]
    out_rank = len(t.shape) + len(axes)
    norm = sorted(ctx.axis(a, out_rank) for a in axes)
    if len(set(norm)) != len(norm):
        ctx.fail(f"repeated axes {axes}")
    dims = iter(t.shape)
    return [t.with_shape(tuple(1 if i in norm else next(dims) for i in range(out_rank)))]


register_op(
    "Unsqueeze",
    category=Category.DATA,
    infer=_unsqueeze_infer,
    static_inputs=(1,),
)

# ---- Expand, Identity --------------------------------------------------------------------------


def _expand_infer(ctx: InferContext):
    t = ctx.type(0)
    target = ctx.int_list(1)
    if target is None:
        st = ctx.type(1)
        n = st.shape[0] if st.shape else None
        if t.shape is None or not isinstance(n, int):
            return [t.with_shape(None)]
        return [t.with_shape((None,) * max(n, len(t.shape)))]
    return [t.with_shape(broadcast_shapes(ctx, t.shape, tuple(target)))]


register_op("Expand", category=Category.DATA, infer=_expand_infer, static_inputs=(1,))


def _identity_infer(ctx: InferContext):
    t = ctx.input_types[0] if ctx.input_types else None
    if t is None:
        ctx.fail("input 0 is missing")
    return [t]  # tensors and sequences alike


register_op(
    "Identity",
    category=Category.DATA,
    infer=_identity_infer,
)
