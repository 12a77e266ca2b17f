"""Reductions (Reduce*, ArgMax/ArgMin) and the softmax family (Softmax, LogSoftmax, Hardmax).

IR forms are the newest ONNX versions: every Reduce* takes `axes` as an optional int64 input and
has `noop_with_empty_axes`; Softmax/LogSoftmax/Hardmax work on one axis (opset-13 meaning). The
frontend converts older forms (axes attribute, flatten-at-axis softmax).

Numerics: float16/bfloat16 are accumulated in float32 and cast back once; reductions over an
empty set give the spec's identity (sum 0, prod 1, max -inf or the dtype's minimum, log-sum -inf);
ReduceLogSumExp and the softmax family subtract the maximum first, so large inputs do not
overflow.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from graphc.ir.types import DType, TensorType
from graphc.ops.registry import Category, InferContext, register_op

_LOW_FLOATS = (DType.float16, DType.bfloat16)


def acc_dtype(dt: np.dtype) -> np.dtype:
    """The dtype a float reduction accumulates in: float32 for 16-bit floats, else the input's."""
    d = DType.from_numpy(dt)
    if d in _LOW_FLOATS or (d.is_float and d.itemsize < 4):
        return np.dtype(np.float32)
    return np.dtype(dt)


def _check_float(ctx: InferContext, dt: DType, what: str = "input") -> None:
    if not dt.is_float:
        ctx.fail(f"{what} must be a float tensor, got {dt.name}")


# ---- Reduce* -----------------------------------------------------------------------------------


def _reduce_axes_infer(ctx: InferContext, rank: int) -> tuple[int, ...] | None:
    """The normalized reduced axes (sorted), () for a no-op, or None when not known at build time."""
    if ctx.has_input(1):
        axes = ctx.int_list(1)
        if axes is None:
            at = ctx.type(1)
            if at.shape is not None and len(at.shape) == 1 and at.shape[0] == 0:
                axes = []
            else:
                return None
    else:
        axes = []
    if not axes:
        return () if ctx.attrs.noop_with_empty_axes else tuple(range(rank))
    if rank == 0:
        # A scalar has no axis; like ONNX Runtime, accept 0/-1 as naming the scalar itself.
        if any(a not in (0, -1) for a in axes):
            ctx.fail(f"axes {axes} are out of range for a rank-0 input")
        return ()
    norm = [ctx.axis(a, rank) for a in axes]
    if len(set(norm)) != len(norm):
        ctx.fail(f"axes {axes} repeat an axis")
    return tuple(sorted(set(norm)))


def _reduce_infer(ctx: InferContext, *, allowed: Callable[[DType], bool], what: str) -> list[TensorType]:
    t = ctx.type(0)
    if not allowed(t.dtype):
        ctx.fail(f"input dtype {t.dtype.name} is not supported ({what})")
    if ctx.has_input(1) and ctx.type(1).dtype != DType.int64:
        ctx.fail(f"axes must be int64, got {ctx.type(1).dtype.name}")
    if t.shape is None:
        return [t]
    rank = len(t.shape)
    axes = _reduce_axes_infer(ctx, rank)
    keep = bool(ctx.attrs.keepdims)
    if axes is None:
        if keep:
            return [t.with_shape((None,) * rank)]
        at = ctx.type(1)
        n = at.shape[0] if at.shape is not None and len(at.shape) == 1 else None
        if isinstance(n, int) and n > 0:
            return [t.with_shape((None,) * (rank - n))]
        return [t.with_shape(None)]
    if rank == 0:
        return [t]
    if keep:
        return [t.with_shape(tuple(1 if i in axes else d for i, d in enumerate(t.shape)))]
    return [t.with_shape(tuple(d for i, d in enumerate(t.shape) if i not in axes))]


def reduce_axes(x: np.ndarray, axes_in: np.ndarray | None, noop_with_empty_axes: int) -> tuple[int, ...]:
    """The axes a Reduce* node reduces at run time (normalized); () means no reduction."""
    axes = [] if axes_in is None else [int(a) for a in np.asarray(axes_in).reshape(-1)]
    if not axes:
        return () if noop_with_empty_axes else tuple(range(x.ndim))
    if x.ndim == 0:
        return ()
    return tuple(sorted({a + x.ndim if a < 0 else a for a in axes}))


def _finish(res: np.ndarray, x: np.ndarray, axes: tuple[int, ...], keepdims: int) -> np.ndarray:
    """Cast a keepdims=True result back to the input dtype and drop reduced dims if asked."""
    res = np.asarray(res)
    if res.dtype != x.dtype:
        if x.dtype.kind in "iu" and res.dtype.kind == "f":
            # Float results of int reductions (L2, LogSum) truncate towards zero like a C cast.
            res = np.trunc(res)
        res = res.astype(x.dtype)
    if not keepdims and axes:
        res = res.reshape(tuple(d for i, d in enumerate(x.shape) if i not in axes))
    return res


def _as_acc(x: np.ndarray) -> np.ndarray:
    return x.astype(acc_dtype(x.dtype), copy=False) if x.dtype.kind not in "iub" else x


def _sum(x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    return np.sum(_as_acc(x), axis=axes, keepdims=True)


def _mean(x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    count = int(np.prod([x.shape[a] for a in axes], dtype=np.int64))
    if x.dtype.kind in "iu":
        s = np.sum(x, axis=axes, keepdims=True, dtype=np.int64 if x.dtype.kind == "i" else np.uint64)
        if count == 0:
            return np.zeros_like(s)
        # Integer mean divides like C: truncation towards zero.
        q = np.abs(s) // count
        return np.where(s < 0, -q, q) if x.dtype.kind == "i" else q
    return np.sum(_as_acc(x), axis=axes, keepdims=True) / np.asarray(count, dtype=acc_dtype(x.dtype))


def _extreme(x: np.ndarray, axes: tuple[int, ...], *, is_max: bool) -> np.ndarray:
    if x.dtype == np.bool_:
        init: object = not is_max
    elif x.dtype.kind in "iu":
        info = np.iinfo(x.dtype)
        init = info.min if is_max else info.max
    else:
        init = -np.inf if is_max else np.inf
    xa = _as_acc(x)
    fn = np.max if is_max else np.min
    return fn(xa, axis=axes, keepdims=True, initial=init)


def _prod(x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    return np.prod(_as_acc(x), axis=axes, keepdims=True)


def _l1(x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    return np.sum(np.abs(_as_acc(x)), axis=axes, keepdims=True)


def _sum_square(x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    xa = _as_acc(x)
    return np.sum(xa * xa, axis=axes, keepdims=True)


def _float_of(x: np.ndarray) -> np.ndarray:
    """Float view of the input for reductions with a float result (ints go through float64)."""
    return x.astype(np.float64) if x.dtype.kind in "iu" else _as_acc(x)


def _l2(x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    xa = _float_of(x)
    return np.sqrt(np.sum(xa * xa, axis=axes, keepdims=True))


def _log_sum(x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    return np.log(np.sum(_float_of(x), axis=axes, keepdims=True))


def _log_sum_exp(x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    xa = _float_of(x)
    m = np.max(xa, axis=axes, keepdims=True, initial=-np.inf)
    # Shift by the max where it is finite: an all -inf row gives log(0) = -inf, a row holding
    # +inf gives +inf, and an empty set gives -inf, all without inf - inf = NaN.
    shift = np.where(np.isfinite(m), m, 0).astype(xa.dtype)
    return np.log(np.sum(np.exp(xa - shift), axis=axes, keepdims=True)) + shift


_NUMERIC = (
    DType.float32,
    DType.float16,
    DType.float64,
    DType.bfloat16,
    DType.int32,
    DType.int64,
    DType.uint32,
    DType.uint64,
)
_MAX_MIN_TYPES = (*_NUMERIC, DType.int8, DType.uint8, DType.bool)


def _is_numeric(d: DType) -> bool:
    return d in _NUMERIC


def _is_maxmin(d: DType) -> bool:
    return d in _MAX_MIN_TYPES


def _is_log_type(d: DType) -> bool:
    # Opset 28 allows floats only; opsets 18-27 also allowed ints, which we run through float64.
    return d in _NUMERIC


def _register_reduce(
    op: str,
    kernel: Callable[[np.ndarray, tuple[int, ...]], np.ndarray],
    allowed: Callable[[DType], bool],
    what: str,
) -> None:
    def infer(ctx: InferContext) -> list[TensorType]:
        return _reduce_infer(ctx, allowed=allowed, what=what)

    def compute(ins: list, attrs, n: int) -> list[np.ndarray]:
        x = np.asarray(ins[0])
        axes = reduce_axes(x, ins[1] if len(ins) > 1 else None, attrs.noop_with_empty_axes)
        return [_finish(kernel(x, axes), x, axes, attrs.keepdims)]

    register_op(
        op, category=Category.REDUCTION, infer=infer, compute=compute, static_inputs=(1,), axis_reduction=True
    )


_NUM = "numeric types: float16/32/64, bfloat16, (u)int32/64"
_register_reduce("ReduceSum", _sum, _is_numeric, _NUM)
_register_reduce("ReduceMean", _mean, _is_numeric, _NUM)
_register_reduce("ReduceProd", _prod, _is_numeric, _NUM)
_register_reduce("ReduceL1", _l1, _is_numeric, _NUM)
_register_reduce("ReduceL2", _l2, _is_numeric, _NUM)
_register_reduce("ReduceSumSquare", _sum_square, _is_numeric, _NUM)
_register_reduce("ReduceLogSum", _log_sum, _is_log_type, _NUM)
_register_reduce("ReduceLogSumExp", _log_sum_exp, _is_log_type, _NUM)
_MM = _NUM + ", (u)int8, bool"
_register_reduce("ReduceMax", lambda x, a: _extreme(x, a, is_max=True), _is_maxmin, _MM)
_register_reduce("ReduceMin", lambda x, a: _extreme(x, a, is_max=False), _is_maxmin, _MM)

# ---- ArgMax, ArgMin ----------------------------------------------------------------------------

_ARG_TYPES = (
    DType.float32,
    DType.float16,
    DType.float64,
    DType.bfloat16,
    DType.int8,
    DType.int16,
    DType.int32,
    DType.int64,
    DType.uint8,
    DType.uint16,
    DType.uint32,
    DType.uint64,
)


def _arg_infer(ctx: InferContext) -> list[TensorType]:
    t = ctx.type(0)
    if t.dtype not in _ARG_TYPES:
        ctx.fail(f"input dtype {t.dtype.name} is not supported")
    if t.shape is None:
        return [TensorType(DType.int64, None)]
    rank = len(t.shape)
    if rank == 0:
        ctx.fail("input must have rank >= 1")
    axis = ctx.axis(ctx.attrs.axis, rank)
    if t.shape[axis] == 0:
        ctx.fail(f"axis {ctx.attrs.axis} has size 0; there is no index to return")
    if ctx.attrs.keepdims:
        shape = tuple(1 if i == axis else d for i, d in enumerate(t.shape))
    else:
        shape = tuple(d for i, d in enumerate(t.shape) if i != axis)
    return [TensorType(DType.int64, shape)]


def _arg_compute(fn: Callable) -> Callable:
    def compute(ins: list, attrs, n: int) -> list[np.ndarray]:
        x = np.asarray(ins[0])
        if x.dtype.kind == "f" or acc_dtype(x.dtype) != x.dtype:
            x = x.astype(acc_dtype(x.dtype))  # exact for 16-bit floats; numpy lacks bf16 argmax
        axis = attrs.axis + x.ndim if attrs.axis < 0 else attrs.axis
        if attrs.select_last_index:
            idx = x.shape[axis] - 1 - fn(np.flip(x, axis), axis=axis, keepdims=True)
        else:
            idx = fn(x, axis=axis, keepdims=True)
        idx = idx.astype(np.int64)
        return [idx if attrs.keepdims else np.squeeze(idx, axis=axis)]

    return compute


register_op("ArgMax", category=Category.REDUCTION, infer=_arg_infer, compute=_arg_compute(np.argmax))
register_op("ArgMin", category=Category.REDUCTION, infer=_arg_infer, compute=_arg_compute(np.argmin))

# ---- Softmax, LogSoftmax, Hardmax --------------------------------------------------------------


def _softmax_infer(ctx: InferContext) -> list[TensorType]:
    t = ctx.type(0)
    _check_float(ctx, t.dtype)
    if t.shape is not None:
        if len(t.shape) == 0:
            ctx.fail("input must have rank >= 1")
        ctx.axis(ctx.attrs.axis, len(t.shape))
    return [t]


def _softmax_compute(ins: list, attrs, n: int) -> list[np.ndarray]:
    x = np.asarray(ins[0])
    xa = _as_acc(x)
    axis = attrs.axis
    shifted = xa - np.max(xa, axis=axis, keepdims=True, initial=-np.inf)
    e = np.exp(shifted)
    return [(e / np.sum(e, axis=axis, keepdims=True)).astype(x.dtype)]


def _log_softmax_compute(ins: list, attrs, n: int) -> list[np.ndarray]:
    x = np.asarray(ins[0])
    xa = _as_acc(x)
    axis = attrs.axis
    shifted = xa - np.max(xa, axis=axis, keepdims=True, initial=-np.inf)
    lse = np.log(np.sum(np.exp(shifted), axis=axis, keepdims=True))
    return [(shifted - lse).astype(x.dtype)]


def _hardmax_compute(ins: list, attrs, n: int) -> list[np.ndarray]:
    x = np.asarray(ins[0])
    y = np.zeros_like(x)
    if x.size == 0:
        return [y]
    axis = attrs.axis + x.ndim if attrs.axis < 0 else attrs.axis
    idx = np.argmax(_as_acc(x), axis=axis, keepdims=True)  # the first maximum
    np.put_along_axis(y, idx, np.ones((), dtype=x.dtype), axis=axis)
    return [y]


register_op("Softmax", category=Category.REDUCTION, infer=_softmax_infer, compute=_softmax_compute)
register_op("LogSoftmax", category=Category.REDUCTION, infer=_softmax_infer, compute=_log_softmax_compute)
register_op("Hardmax", category=Category.REDUCTION, infer=_softmax_infer, compute=_hardmax_compute)
