"""Reductions (Reduce*, ArgMax/ArgMin) and the softmax family (Softmax, LogSoftmax, Hardmax).

IR forms are the newest ONNX versions: every Reduce* takes `axes` as an optional int64 input and
has `noop_with_empty_axes`; Softmax/LogSoftmax/Hardmax work on one axis (opset-13 meaning). The
frontend converts older forms (axes attribute, flatten-at-axis softmax).

Numerics: float16/bfloat16 are accumulated in float32 and cast back once; reductions over an
empty set give the spec's identity (sum 0, prod 1, max -inf or the dtype's minimum, log-sum -inf);
ReduceLogSumExp and the softmax family subtract the maximum first, so large inputs do not
overflow.

This module holds the numpy kernels (what the interpreter and a CPU engine run); type
inference and traits are in graphc.ops.reduction.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from graphc.runtime.dtypes import DType
from graphc.runtime.reference.registry import register_kernel

_LOW_FLOATS = (DType.float16, DType.bfloat16)


def acc_dtype(dt: np.dtype) -> np.dtype:
    """The dtype a float reduction accumulates in: float32 for 16-bit floats, else the input's."""
    d = DType.from_numpy(dt)
    if d in _LOW_FLOATS or (d.is_float and d.itemsize < 4):
        return np.dtype(np.float32)
    return np.dtype(dt)


def _as_acc(x: np.ndarray) -> np.ndarray:
    return x.astype(acc_dtype(x.dtype), copy=False) if x.dtype.kind not in "iub" else x


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


def _reduce_compute(kernel: Callable[[np.ndarray, tuple[int, ...]], np.ndarray]) -> Callable:
    def compute(ins: list, attrs, n: int) -> list[np.ndarray]:
        x = np.asarray(ins[0])
        axes = reduce_axes(x, ins[1] if len(ins) > 1 else None, attrs.noop_with_empty_axes)
        return [_finish(kernel(x, axes), x, axes, attrs.keepdims)]

    return compute


REDUCE_KERNELS: dict[str, Callable[[np.ndarray, tuple[int, ...]], np.ndarray]] = {
    "ReduceSum": _sum,
    "ReduceMean": _mean,
    "ReduceProd": _prod,
    "ReduceL1": _l1,
    "ReduceL2": _l2,
    "ReduceSumSquare": _sum_square,
    "ReduceLogSum": _log_sum,
    "ReduceLogSumExp": _log_sum_exp,
    "ReduceMax": lambda x, a: _extreme(x, a, is_max=True),
    "ReduceMin": lambda x, a: _extreme(x, a, is_max=False),
}
for _op, _kernel in REDUCE_KERNELS.items():
    register_kernel(_op, _reduce_compute(_kernel))
register_kernel("ArgMax", _arg_compute(np.argmax))
register_kernel("ArgMin", _arg_compute(np.argmin))
register_kernel("Softmax", _softmax_compute)
register_kernel("LogSoftmax", _log_softmax_compute)
register_kernel("Hardmax", _hardmax_compute)
