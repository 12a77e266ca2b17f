"""Reductions (Reduce*, ArgMax/ArgMin) and the softmax family (Softmax, LogSoftmax, Hardmax).

IR forms are the newest ONNX versions: every Reduce* takes `axes` as an optional int64 input and
has `noop_with_empty_axes`; Softmax/LogSoftmax/Hardmax work on one axis (opset-13 meaning). The
frontend converts older forms (axes attribute, flatten-at-axis softmax).

Numerics: float16/bfloat16 are accumulated in float32 and cast back once; reductions over an
empty set give the spec's identity (sum 0, prod 1, max -inf or the dtype's minimum, log-sum -inf);
ReduceLogSumExp and the softmax family subtract the maximum first, so large inputs do not
overflow.

This module holds type inference and traits; the numpy kernels are in
graphc.runtime.reference.reduction.
"""

from __future__ import annotations

from collections.abc import Callable

from graphc.ir.types import DType, TensorType
from graphc.ops.registry import Category, InferContext, register_op
from graphc.runtime.reference.reduction import reduce_axes as reduce_axes


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


def _register_reduce(op: str, allowed: Callable[[DType], bool], what: str) -> None:
    def infer(ctx: InferContext) -> list[TensorType]:
        return _reduce_infer(ctx, allowed=allowed, what=what)

    register_op(op, category=Category.REDUCTION, infer=infer, static_inputs=(1,), axis_reduction=True)


# The Reduce* ops, the one list the passes and the CUDA reduction family read.
REDUCE_OPS = frozenset(
    {
        "ReduceSum",
        "ReduceMean",
        "ReduceMax",
        "ReduceMin",
        "ReduceProd",
        "ReduceL1",
        "ReduceL2",
        "ReduceSumSquare",
        "ReduceLogSum",
        "ReduceLogSumExp",
    }
)
_NUM = "numeric types: float16/32/64, bfloat16, (u)int32/64"
_register_reduce("ReduceSum", _is_numeric, _NUM)
_register_reduce("ReduceMean", _is_numeric, _NUM)
_register_reduce("ReduceProd", _is_numeric, _NUM)
_register_reduce("ReduceL1", _is_numeric, _NUM)
_register_reduce("ReduceL2", _is_numeric, _NUM)
_register_reduce("ReduceSumSquare", _is_numeric, _NUM)
_register_reduce("ReduceLogSum", _is_log_type, _NUM)
_register_reduce("ReduceLogSumExp", _is_log_type, _NUM)
_MM = _NUM + ", (u)int8, bool"
_register_reduce("ReduceMax", _is_maxmin, _MM)
_register_reduce("ReduceMin", _is_maxmin, _MM)

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


register_op("ArgMax", category=Category.REDUCTION, infer=_arg_infer)
register_op("ArgMin", category=Category.REDUCTION, infer=_arg_infer)

# ---- Softmax, LogSoftmax, Hardmax --------------------------------------------------------------


def _softmax_infer(ctx: InferContext) -> list[TensorType]:
    t = ctx.type(0)
    _check_float(ctx, t.dtype)
    if t.shape is not None:
        if len(t.shape) == 0:
            ctx.fail("input must have rank >= 1")
        ctx.axis(ctx.attrs.axis, len(t.shape))
    return [t]


register_op("Softmax", category=Category.REDUCTION, infer=_softmax_infer)
register_op("LogSoftmax", category=Category.REDUCTION, infer=_softmax_infer)
register_op("Hardmax", category=Category.REDUCTION, infer=_softmax_infer)
