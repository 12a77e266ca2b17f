"""Shape ops: Shape, Size, Range, ConstantOfShape, Reshape, Flatten, Squeeze, Unsqueeze, Expand,
Identity.

Shape and Size give their values from static types at build time (value_infer), and every op
here computes small known values, so exporter shape arithmetic resolves once shapes are bound.

This module holds the numpy kernels (what the interpreter and a CPU engine run); type
inference and traits are in graphc.ops.shape_ops.
"""

from __future__ import annotations

import math

import numpy as np

from graphc.runtime.reference.registry import register_kernel

# ---- Shape, Size -------------------------------------------------------------------------------


def _shape_slice(rank: int, start: int, end: int | None) -> tuple[int, int]:
    s = start + rank if start < 0 else start
    e = rank if end is None else (end + rank if end < 0 else end)
    s = min(max(s, 0), rank)
    e = min(max(e, 0), rank)
    return s, max(e, s)


def _shape_compute(ins, attrs, n):
    rank = ins[0].ndim
    s, e = _shape_slice(rank, attrs.start, attrs.end)
    return [np.array(ins[0].shape[s:e], dtype=np.int64)]


def _range_compute(ins, attrs, n):
    start, limit, delta = (np.asarray(x).item() for x in ins)
    dt = ins[0].dtype
    count = max(int(math.ceil((limit - start) / delta)), 0)
    # start + i*delta in the input dtype, as the spec's loop computes it.
    return [(np.asarray(start, dtype=dt) + np.arange(count, dtype=dt) * np.asarray(delta, dtype=dt)).astype(dt)]


def _cos_compute(ins, attrs, n):
    shape = tuple(int(d) for d in np.asarray(ins[0]).reshape(-1))
    if attrs.value is None:
        return [np.zeros(shape, dtype=np.float32)]
    v = attrs.value.array.reshape(-1)[0]
    return [np.full(shape, v, dtype=attrs.value.array.dtype)]


def _reshape_compute(ins, attrs, n):
    x = ins[0]
    target = [int(d) for d in np.asarray(ins[1]).reshape(-1)]
    if not attrs.allowzero:
        target = [x.shape[i] if d == 0 else d for i, d in enumerate(target)]
    return [x.reshape(target)]


def _flatten_compute(ins, attrs, n):
    x = ins[0]
    axis = attrs.axis + x.ndim if attrs.axis < 0 else attrs.axis
    return [
        x.reshape(math.prod(x.shape[:axis]), -1)
        if x.size
        else x.reshape(math.prod(x.shape[:axis]), math.prod(x.shape[axis:]))
    ]


def _squeeze_compute(ins, attrs, n):
    x = ins[0]
    if len(ins) > 1 and ins[1] is not None:
        axes = tuple(int(a) for a in np.asarray(ins[1]).reshape(-1))
        return [np.squeeze(x, axis=axes) if axes else x]
    return [np.squeeze(x)]


def _unsqueeze_compute(ins, attrs, n):
    x = ins[0]
    axes = [int(a) for a in np.asarray(ins[1]).reshape(-1)]
    out_rank = x.ndim + len(axes)
    norm = sorted(a + out_rank if a < 0 else a for a in axes)
    return [np.expand_dims(x, tuple(norm))]


def _expand_compute(ins, attrs, n):
    x = ins[0]
    target = tuple(int(d) for d in np.asarray(ins[1]).reshape(-1))
    shape = np.broadcast_shapes(x.shape, target)
    return [np.broadcast_to(x, shape).copy()]


register_kernel("Shape", _shape_compute)
register_kernel("Size", lambda ins, a, n: [np.array(ins[0].size, dtype=np.int64)])
register_kernel("Range", _range_compute)
register_kernel("ConstantOfShape", _cos_compute)
register_kernel("Reshape", _reshape_compute)
register_kernel("Flatten", _flatten_compute)
register_kernel("Squeeze", _squeeze_compute)
register_kernel("Unsqueeze", _unsqueeze_compute)
register_kernel("Expand", _expand_compute)
register_kernel("Identity", lambda ins, a, n: [ins[0]])
