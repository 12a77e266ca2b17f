"""NN ops: Conv, ConvTranspose, ConvInteger; MaxPool, AveragePool, LpPool and their Global
forms; LRN; MaxUnpool.

Every windowed op shares one geometry (`window_geometry`): kernel, strides, dilations, the
resolved begin/end pads (auto_pad included) and the output size, so inference and compute can
never disagree.

The references are vectorized over tensors; their only Python loops run over kernel offsets (9 for
a 3x3 kernel) or batch chunks. Conv is im2col: one copy of the shifted input per kernel offset
into a (group, C/group * K, N * P) buffer and one batched matmul over the groups (depthwise
convolutions with hundreds of groups are one matmul call, not a loop). ConvTranspose is the
adjoint: one batched matmul, then a scatter-add per kernel offset. float16/bfloat16 compute in
float32 and are cast back once.

This module holds type inference and traits; the numpy kernels are in
graphc.runtime.reference.nn.
"""

from __future__ import annotations

from graphc.ir.types import Dim, DType, TensorType
from graphc.ops.registry import Category, InferContext, register_op
from graphc.runtime.reference.nn import Geometry, _unpool_default_shape
from graphc.runtime.reference.nn import acc_dtype as acc_dtype
from graphc.runtime.reference.nn import conv_transpose_geometry as conv_transpose_geometry
from graphc.runtime.reference.nn import window_geometry as window_geometry

_CONV_FLOATS = frozenset({DType.float16, DType.bfloat16, DType.float32, DType.float64})
_MAXPOOL_TYPES = _CONV_FLOATS | {DType.int8, DType.uint8}
_INT8S = frozenset({DType.int8, DType.uint8})


def _kernel_of(ctx: InferContext, w: TensorType, n: int) -> tuple[int, ...] | None:
    ks = ctx.attrs.kernel_shape
    wk = None if w.shape is None else w.shape[2:]
    if ks:
        ks = tuple(int(v) for v in ks)
        if len(ks) != n:
            ctx.fail(f"kernel_shape {list(ks)} has {len(ks)} dims, the input has {n} spatial axes")
        if wk is not None and any(isinstance(a, int) and a != b for a, b in zip(wk, ks, strict=True)):
            ctx.fail(f"kernel_shape {list(ks)} does not match the weight's spatial dims {list(wk)}")
        return ks
    if wk is None or not all(isinstance(d, int) for d in wk):
        return None
    return tuple(wk)  # type: ignore[arg-type]


def _with_rank(ctx: InferContext, x: TensorType, w: TensorType) -> TensorType | None:
    """x, with unknown dims of the rank the weight or kernel_shape implies where x's rank is
    unknown; None if nothing tells the rank."""
    if x.shape is not None:
        return x
    if w.shape is not None:
        return x.with_shape((None,) * len(w.shape))
    if ctx.attrs.kernel_shape:
        return x.with_shape((None,) * (len(ctx.attrs.kernel_shape) + 2))
    return None


def _conv_common(
    ctx: InferContext, x: TensorType, w: TensorType, *, transposed: bool
) -> tuple[int, tuple[int, ...] | None, Dim]:
    """Checks shared by Conv, ConvInteger and ConvTranspose: (spatial rank, kernel, out channels)."""
    rank = len(x.shape)  # type: ignore[arg-type]
    if rank < 3:
        ctx.fail(f"the input must have rank >= 3 (N, C, spatial...), got {x}")
    if w.shape is not None and len(w.shape) != rank:
        ctx.fail(f"the weight {w} must have the input's rank {rank}")
    n = rank - 2
    group = ctx.attrs.group
    if group < 1:
        ctx.fail(f"group {group} must be >= 1")
    c = x.shape[1]  # type: ignore[index]
    w0 = w.shape[0] if w.shape is not None else None
    w1 = w.shape[1] if w.shape is not None else None
    if transposed:
        # W is (C, M/group, *k).
        if isinstance(c, int) and isinstance(w0, int) and c != w0:
            ctx.fail(f"the input has {c} channels, the weight {w} takes {w0}")
        if isinstance(c, int) and c % group:
            ctx.fail(f"{c} input channels do not split into {group} groups")
        m: Dim = w1 * group if isinstance(w1, int) else None
    else:
        # W is (M, C/group, *k).
        if isinstance(c, int) and isinstance(w1, int) and c != w1 * group:
            ctx.fail(f"the input has {c} channels, the weight {w} with group {group} takes {w1 * group}")
        if isinstance(w0, int) and w0 % group:
            ctx.fail(f"{w0} output channels do not split into {group} groups")
        m = w0
    return n, _kernel_of(ctx, w, n), m


def _check_bias(ctx: InferContext, i: int, m: Dim, dtype: DType) -> None:
    if not ctx.has_input(i):
        return
    b = ctx.type(i)
    if b.dtype != dtype:
        ctx.fail(f"the bias is {b.dtype.name}, the input {dtype.name}")
    if b.shape is not None and (
        len(b.shape) != 1 or (isinstance(m, int) and isinstance(b.shape[0], int) and b.shape[0] != m)
    ):
        ctx.fail(f"the bias {b} must have shape ({m},)")


def _conv_infer(ctx: InferContext):
    x, w = ctx.type(0), ctx.type(1)
    if x.dtype not in _CONV_FLOATS:
        ctx.fail(f"{x.dtype.name} is not a float type")
    if w.dtype != x.dtype:
        ctx.fail(f"the input is {x.dtype.name}, the weight {w.dtype.name}")
    xr = _with_rank(ctx, x, w)
    if xr is None:
        return [TensorType(x.dtype, None)]
    x = xr
    n, kernel, m = _conv_common(ctx, x, w, transposed=False)
    _check_bias(ctx, 2, m, x.dtype)
    spatial = x.shape[2:]  # type: ignore[index]
    out = (None,) * n if kernel is None else window_geometry(ctx.attrs, spatial, kernel, ctx.fail).out
    return [TensorType(x.dtype, (x.shape[0], m, *out))]  # type: ignore[index]


register_op("Conv", category=Category.CONV, infer=_conv_infer)

# ---- ConvInteger -------------------------------------------------------------------------------


def _conv_integer_infer(ctx: InferContext):
    x, w = ctx.type(0), ctx.type(1)
    if x.dtype not in _INT8S or w.dtype not in _INT8S:
        ctx.fail(f"takes int8/uint8 inputs, got {x.dtype.name} and {w.dtype.name}")
    for i, ref in ((2, x), (3, w)):
        if ctx.has_input(i) and ctx.type(i).dtype != ref.dtype:
            ctx.fail(f"zero point {i} is {ctx.type(i).dtype.name}, its tensor {ref.dtype.name}")
    xr = _with_rank(ctx, x, w)
    if xr is None:
        return [TensorType(DType.int32, None)]
    x = xr
    n, kernel, m = _conv_common(ctx, x, w, transposed=False)
    spatial = x.shape[2:]  # type: ignore[index]
    out = (None,) * n if kernel is None else window_geometry(ctx.attrs, spatial, kernel, ctx.fail).out
    return [TensorType(DType.int32, (x.shape[0], m, *out))]  # type: ignore[index]


register_op("ConvInteger", category=Category.CONV, infer=_conv_integer_infer)


def _conv_transpose_infer(ctx: InferContext):
    x, w = ctx.type(0), ctx.type(1)
    if x.dtype not in _CONV_FLOATS:
        ctx.fail(f"{x.dtype.name} is not a float type")
    if w.dtype != x.dtype:
        ctx.fail(f"the input is {x.dtype.name}, the weight {w.dtype.name}")
    xr = _with_rank(ctx, x, w)
    if xr is None:
        return [TensorType(x.dtype, None)]
    x = xr
    n, kernel, m = _conv_common(ctx, x, w, transposed=True)
    _check_bias(ctx, 2, m, x.dtype)
    spatial = x.shape[2:]  # type: ignore[index]
    if kernel is None:
        out: tuple[Dim, ...] = (None,) * n
    else:
        out = conv_transpose_geometry(ctx.attrs, spatial, kernel, ctx.fail).out
    return [TensorType(x.dtype, (x.shape[0], m, *out))]  # type: ignore[index]


register_op("ConvTranspose", category=Category.CONV, infer=_conv_transpose_infer)

# ---- MaxPool, AveragePool, LpPool --------------------------------------------------------------


def _pool_infer_geometry(ctx: InferContext, types: frozenset[DType]) -> tuple[TensorType, Geometry]:
    x = ctx.type(0)
    if x.dtype not in types:
        ctx.fail(f"{x.dtype.name} is not supported (takes {sorted(t.name for t in types)})")
    if x.shape is None:  # the kernel gives the rank
        x = x.with_shape((None,) * (len(ctx.attrs.kernel_shape) + 2))
    if len(x.shape) < 3:  # type: ignore[arg-type]
        ctx.fail(f"the input must have rank >= 3 (N, C, spatial...), got {x}")
    geom = window_geometry(
        ctx.attrs,
        x.shape[2:],
        ctx.attrs.kernel_shape,
        ctx.fail,
        ceil_mode=bool(ctx.attrs.ceil_mode),  # type: ignore[index]
    )
    return x, geom


def _maxpool_infer(ctx: InferContext):
    x, geom = _pool_infer_geometry(ctx, _MAXPOOL_TYPES)
    if ctx.attrs.storage_order not in (0, 1):
        ctx.fail(f"storage_order {ctx.attrs.storage_order} is not 0 or 1")
    shape = (*x.shape[:2], *geom.out)  # type: ignore[index]
    return [TensorType(x.dtype, shape), TensorType(DType.int64, shape)][: max(ctx.num_outputs, 1)]


register_op("MaxPool", category=Category.POOL, infer=_maxpool_infer)


def _avgpool_infer(ctx: InferContext):
    x, geom = _pool_infer_geometry(ctx, _CONV_FLOATS)
    return [TensorType(x.dtype, (*x.shape[:2], *geom.out))]  # type: ignore[index]


register_op("AveragePool", category=Category.POOL, infer=_avgpool_infer)


def _lppool_infer(ctx: InferContext):
    x, geom = _pool_infer_geometry(ctx, _CONV_FLOATS)
    if ctx.attrs.p < 1:
        ctx.fail(f"p {ctx.attrs.p} must be >= 1")
    return [TensorType(x.dtype, (*x.shape[:2], *geom.out))]  # type: ignore[index]


register_op("LpPool", category=Category.POOL, infer=_lppool_infer)

# ---- Global pools ------------------------------------------------------------------------------


def _global_infer(ctx: InferContext):
    x = ctx.type(0)
    if x.dtype not in _CONV_FLOATS:
        ctx.fail(f"{x.dtype.name} is not a float type")
    if x.shape is None:
        return [x]
    rank = len(x.shape)
    if rank < 3:
        ctx.fail(f"the input must have rank >= 3 (N, C, spatial...), got {x}")
    return [TensorType(x.dtype, (*x.shape[:2], *([1] * (rank - 2))))]


register_op(
    "GlobalAveragePool",
    category=Category.POOL,
    infer=_global_infer,
)
register_op(
    "GlobalMaxPool",
    category=Category.POOL,
    infer=_global_infer,
)


register_op("GlobalLpPool", category=Category.POOL, infer=_global_infer)

# ---- LRN ---------------------------------------------------------------------------------------


def _lrn_infer(ctx: InferContext):
    x = ctx.type(0)
    if x.dtype not in _CONV_FLOATS:
        ctx.fail(f"{x.dtype.name} is not a float type")
    if x.shape is not None and len(x.shape) < 3:
        ctx.fail(f"the input must have rank >= 3 (N, C, spatial...), got {x}")
    if ctx.attrs.size < 1:
        ctx.fail(f"size {ctx.attrs.size} must be >= 1")
    return [x]


register_op("LRN", category=Category.POOL, infer=_lrn_infer)


def _maxunpool_infer(ctx: InferContext):
    x, idx = ctx.type(0), ctx.type(1)
    if x.dtype not in _CONV_FLOATS:
        ctx.fail(f"{x.dtype.name} is not a float type")
    if idx.dtype != DType.int64:
        ctx.fail(f"the indices are {idx.dtype.name}, not int64")
    if x.shape is None:  # the kernel gives the rank
        x = x.with_shape((None,) * (len(ctx.attrs.kernel_shape) + 2))
    rank = len(x.shape)  # type: ignore[arg-type]
    if rank < 3:
        ctx.fail(f"the input must have rank >= 3 (N, C, spatial...), got {x}")
    if ctx.has_input(2):
        shape = ctx.int_list(2)
        if shape is None:
            return [TensorType(x.dtype, (None,) * rank)]
        if len(shape) != rank:
            ctx.fail(f"output_shape {shape} must have the input's rank {rank}")
        return [TensorType(x.dtype, tuple(shape))]
    return [TensorType(x.dtype, _unpool_default_shape(ctx.attrs, x.shape, ctx.fail))]  # type: ignore[arg-type]


register_op(
    "MaxUnpool",
    category=Category.DATA,
    infer=_maxunpool_infer,
    static_inputs=(2,),
)
