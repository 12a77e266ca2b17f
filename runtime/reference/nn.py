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

This module holds the numpy kernels (what the interpreter and a CPU engine run); type
inference and traits are in graphc.ops.nn.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

import numpy as np

from graphc.runtime.dtypes import Dim
from graphc.runtime.reference.registry import register_kernel

Fail = Callable[[str], NoReturn]

# im2col buffers above this many elements are built a batch chunk at a time.
_COLS_MAX_ELEMENTS = 1 << 25


def _fail_compute(message: str) -> NoReturn:
    raise ValueError(message)


def acc_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype a float reference computes in: float32 for 16-bit floats, else the dtype."""
    dt = np.dtype(dtype)
    return np.dtype(np.float32) if dt.itemsize < 4 and dt.kind not in "iub" else dt


# ---- window geometry ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Geometry:
    """A sliding window over the spatial axes. A pad is None where it depends on a symbolic dim."""

    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    pads_begin: tuple[int | None, ...]
    pads_end: tuple[int | None, ...]
    out: tuple[Dim, ...]

    @property
    def extent(self) -> tuple[int, ...]:
        """The span of the dilated kernel along each axis."""
        return tuple((k - 1) * d + 1 for k, d in zip(self.kernel, self.dilations, strict=True))

    def slices(self, offset: Sequence[int]) -> tuple[slice, ...]:
        """Slices of the padded input's spatial axes that the kernel tap `offset` reads for
        every output position (all dims must be concrete)."""
        return tuple(
            slice(k * d, k * d + (o - 1) * s + 1, s)
            for k, d, o, s in zip(offset, self.dilations, self.out, self.strides, strict=True)
        )


def _ints(value: Sequence[int] | None, n: int, default: int, name: str, fail: Fail) -> tuple[int, ...]:
    if value is None or len(value) == 0:
        return (default,) * n
    if len(value) != n:
        fail(f"{name} has {len(value)} values, the input has {n} spatial axes")
    return tuple(int(v) for v in value)


def _explicit_out(size: int, pb: int, pe: int, ext: int, s: int, ceil_mode: bool, fail: Fail) -> int:
    span = size + pb + pe - ext
    if span < 0 and not ceil_mode:
        fail(f"the kernel spans {ext} elements, more than the padded input's {size + pb + pe}")
    if not ceil_mode:
        return span // s + 1
    # ceil_mode: ceil(span / s) + 1, also for a kernel larger than the padded input (span < 0):
    # ONNX Runtime and PyTorch then have one window over the whole (clipped) input when
    # ceil(span / s) == 0, which is how some CNN exports write a global pooling.
    out = -(-span // s) + 1
    if out < 1:
        fail(
            f"the kernel spans {ext} elements, {-span} more than the padded input's {size + pb + pe}, "
            f"with stride {s}: no window fits even in ceil_mode"
        )
    # A last window that would start in the end padding is dropped (the spec, PyTorch, ORT).
    if (out - 1) * s >= size + pb:
        out -= 1
    return out


def window_geometry(
    attrs: Any,
    in_spatial: Sequence[Dim],
    kernel: Sequence[int],
    fail: Fail,
    *,
    ceil_mode: bool = False,
) -> Geometry:
    """Resolve strides, dilations, pads and auto_pad of a Conv/pool node over `in_spatial`."""
    n = len(in_spatial)
    kernel = tuple(int(k) for k in kernel)
    if len(kernel) != n:
        fail(f"kernel_shape {list(kernel)} has {len(kernel)} dims, the input has {n} spatial axes")
    strides = _ints(attrs.strides, n, 1, "strides", fail)
    dil = _ints(attrs.dilations, n, 1, "dilations", fail)
    if min(kernel, default=1) < 1 or min(strides, default=1) < 1 or min(dil, default=1) < 1:
        fail(f"kernel {list(kernel)}, strides {list(strides)}, dilations {list(dil)} must be >= 1")
    ext = [(k - 1) * d + 1 for k, d in zip(kernel, dil, strict=True)]
    auto_pad = attrs.auto_pad
    pb: list[int | None] = []
    pe: list[int | None] = []
    out: list[Dim] = []
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        for size, s, e in zip(in_spatial, strides, ext, strict=True):
            if not isinstance(size, int):
                # ceil(size / 1) == size: a symbolic dim survives a stride-1 SAME window.
                out.append(size if s == 1 else None)
                pb.append(None)
                pe.append(None)
                continue
            o = -(-size // s)
            total = max(0, (o - 1) * s + e - size)
            begin = total // 2 if auto_pad == "SAME_UPPER" else total - total // 2
            out.append(o)
            pb.append(begin)
            pe.append(total - begin)
    elif auto_pad in ("VALID", "NOTSET"):
        if auto_pad == "VALID":
            pads = (0,) * (2 * n)
        else:
            pads = _ints(attrs.pads, 2 * n, 0, "pads", fail)
            if min(pads, default=0) < 0:
                fail(f"pads {list(pads)} must be >= 0")
        pb, pe = list(pads[:n]), list(pads[n:])
        for i, size in enumerate(in_spatial):
            if isinstance(size, int):
                out.append(_explicit_out(size, pads[i], pads[n + i], ext[i], strides[i], ceil_mode, fail))
            else:
                same = strides[i] == 1 and pads[i] + pads[n + i] == ext[i] - 1
                out.append(size if same else None)
    else:
        fail(f"auto_pad {auto_pad!r} is not NOTSET, SAME_UPPER, SAME_LOWER or VALID")
    return Geometry(kernel, strides, dil, tuple(pb), tuple(pe), tuple(out))


def pad_spatial(x: np.ndarray, begin: Sequence[int], end: Sequence[int], value: Any) -> np.ndarray:
    """x with its spatial axes (2 on) padded by `begin`/`end` elements of `value`; a negative
    `end` crops the unused tail instead."""
    if not any(begin) and not any(end):
        return x
    sizes = x.shape[2:]
    new = tuple(sz + b + e for sz, b, e in zip(sizes, begin, end, strict=True))
    out = np.full(x.shape[:2] + new, value, dtype=x.dtype)
    src = tuple(slice(0, min(sz, sz + e)) for sz, e in zip(sizes, end, strict=True))
    dst = tuple(slice(b, b + min(sz, sz + e)) for sz, b, e in zip(sizes, begin, end, strict=True))
    out[(..., *dst)] = x[(..., *src)]
    return out


def _padded_for(x: np.ndarray, geom: Geometry, value: Any) -> np.ndarray:
    """x padded just enough for every window of `geom` (a ceil-mode overhang included)."""
    ends = [
        (o - 1) * s + e - sz - b  # type: ignore[operator]
        for o, s, e, sz, b in zip(geom.out, geom.strides, geom.extent, x.shape[2:], geom.pads_begin, strict=True)
    ]
    return pad_spatial(x, geom.pads_begin, ends, value)  # type: ignore[arg-type]


def _offsets(kernel: Sequence[int]):
    return np.ndindex(*kernel)


# ---- Conv --------------------------------------------------------------------------------------


def conv_nd(x: np.ndarray, w: np.ndarray, geom: Geometry, group: int) -> np.ndarray:
    """Grouped N-D cross-correlation of x (N, C, *in) with w (M, C/group, *k), in x's dtype.

    im2col into a (group, C/group * K, N * P) buffer, then one batched matmul over groups."""
    n_batch, channels = x.shape[:2]
    m = w.shape[0]
    cg, mg = channels // group, m // group
    out = tuple(int(o) for o in geom.out)  # type: ignore[arg-type]
    p = math.prod(out)
    k = math.prod(geom.kernel)
    xp = _padded_for(x, geom, 0)
    wm = w.reshape(group, mg, cg * k)
    y = np.empty((n_batch, group, mg, p), dtype=x.dtype)
    chunk = max(1, _COLS_MAX_ELEMENTS // max(channels * k * p, 1))
    for n0 in range(0, n_batch, chunk):
        xs = xp[n0 : n0 + chunk]
        nb = xs.shape[0]
        xg = xs.reshape(nb, group, cg, *xs.shape[2:])
        cols = np.empty((group, cg, k, nb, *out), dtype=x.dtype)
        for ki, off in enumerate(_offsets(geom.kernel)):
            cols[:, :, ki] = np.moveaxis(xg[(..., *geom.slices(off))], 0, 2)
        cols2 = cols.reshape(group, cg * k, nb * p)
        if nb == 1:
            np.matmul(wm, cols2, out=y[n0])
        else:
            y[n0 : n0 + nb] = np.matmul(wm, cols2).reshape(group, mg, nb, p).transpose(2, 0, 1, 3)
    return y.reshape(n_batch, m, *out)


def _conv_compute(ins, attrs, n):
    x, w = ins[0], ins[1]
    b = ins[2] if len(ins) > 2 else None
    dt = acc_dtype(x.dtype)
    geom = window_geometry(attrs, x.shape[2:], w.shape[2:], _fail_compute)
    y = conv_nd(x.astype(dt, copy=False), w.astype(dt, copy=False), geom, attrs.group)
    if b is not None:
        y += b.astype(dt).reshape(-1, *([1] * (x.ndim - 2)))
    return [y.astype(x.dtype, copy=False)]


def int32_sums(y: np.ndarray) -> np.ndarray:
    """Integer sums computed exactly in float64 (every int8/uint8 product sum below 2**53) as
    int32 accumulators hold them: modulo 2**32, as the CUDA int8 kernels' (IMMA/IGMMA without
    .satfinite) and ONNX Runtime's int32 accumulation wrap. A float64 -> int32 cast of a sum
    past 2**31 would instead be undefined (numpy gives INT_MIN)."""
    return np.rint(y).astype(np.int64).astype(np.int32)


def _conv_integer_compute(ins, attrs, n):
    x, w = ins[0], ins[1]
    xz = ins[2] if len(ins) > 2 and ins[2] is not None else None
    wz = ins[3] if len(ins) > 3 and ins[3] is not None else None
    # float64 holds every int8 product sum exactly (|sum| < 2**53) and runs through BLAS.
    xf = x.astype(np.float64)
    wf = w.astype(np.float64)
    if xz is not None:
        xf -= np.float64(np.asarray(xz).reshape(-1)[0])
    if wz is not None:
        wz = np.asarray(wz, dtype=np.float64).reshape(-1)
        # A per-output-channel zero point has one value per filter.
        wf -= wz.reshape(-1, *([1] * (w.ndim - 1))) if wz.size > 1 else wz[0]
    geom = window_geometry(attrs, x.shape[2:], w.shape[2:], _fail_compute)
    # Zero padding after subtracting the zero point is padding with the zero point.
    y = conv_nd(xf, wf, geom, attrs.group)
    return [int32_sums(y)]


# ---- ConvTranspose -----------------------------------------------------------------------------


@dataclass(frozen=True)
class TransposeGeometry:
    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    pads_begin: tuple[int | None, ...]
    out: tuple[Dim, ...]


def conv_transpose_geometry(
    attrs: Any, in_spatial: Sequence[Dim], kernel: Sequence[int], fail: Fail
) -> TransposeGeometry:
    """Output size and begin pad of ConvTranspose per the spec (version 11 on):
    with output_shape (or auto_pad SAME_*, where output_shape = input * strides) the total
    padding is strides * (in - 1) + output_padding + extent - output_shape, split with the odd
    element at the end for SAME_UPPER and at the beginning otherwise."""
    n = len(in_spatial)
    kernel = tuple(int(k) for k in kernel)
    if len(kernel) != n:
        fail(f"kernel_shape {list(kernel)} has {len(kernel)} dims, the input has {n} spatial axes")
    strides = _ints(attrs.strides, n, 1, "strides", fail)
    dil = _ints(attrs.dilations, n, 1, "dilations", fail)
    if min(kernel, default=1) < 1 or min(strides, default=1) < 1 or min(dil, default=1) < 1:
        fail(f"kernel {list(kernel)}, strides {list(strides)}, dilations {list(dil)} must be >= 1")
    opad = _ints(attrs.output_padding, n, 0, "output_padding", fail)
    ext = [(k - 1) * d + 1 for k, d in zip(kernel, dil, strict=True)]
    auto_pad = attrs.auto_pad
    if auto_pad not in ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"):
        fail(f"auto_pad {auto_pad!r} is not NOTSET, SAME_UPPER, SAME_LOWER or VALID")
    target: list[Dim] | None = None
    if attrs.output_shape:
        shape = [int(v) for v in attrs.output_shape]
        if len(shape) == n + 2:  # some exporters include N and C
            shape = shape[2:]
        if len(shape) != n:
            fail(f"output_shape {list(attrs.output_shape)} does not have {n} spatial dims")
        target = list(shape)
    elif auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        target = [
            sz * s if isinstance(sz, int) else (sz if s == 1 else None)
            for sz, s in zip(in_spatial, strides, strict=True)
        ]
    pb: list[int | None] = []
    out: list[Dim] = []
    if target is not None:
        for i, size in enumerate(in_spatial):
            t = target[i]
            if not isinstance(size, int) or not isinstance(t, int):
                pb.append(None)
                out.append(t)
                continue
            total = strides[i] * (size - 1) + opad[i] + ext[i] - t
            pb.append(total // 2 if auto_pad == "SAME_UPPER" else total - total // 2)
            out.append(t)
    else:
        pads = (0,) * (2 * n) if auto_pad == "VALID" else _ints(attrs.pads, 2 * n, 0, "pads", fail)
        if min(pads, default=0) < 0:
            fail(f"pads {list(pads)} must be >= 0")
        for i, size in enumerate(in_spatial):
            pb.append(pads[i])
            if isinstance(size, int):
                o = strides[i] * (size - 1) + opad[i] + ext[i] - pads[i] - pads[n + i]
                if o < 1:
                    fail(f"output size {o} along spatial axis {i} is not positive")
                out.append(o)
            else:
                same = strides[i] == 1 and opad[i] + ext[i] - 1 == pads[i] + pads[n + i]
                out.append(size if same else None)
    return TransposeGeometry(kernel, strides, dil, tuple(pb), tuple(out))


def conv_transpose_nd(x: np.ndarray, w: np.ndarray, geom: TransposeGeometry, group: int) -> np.ndarray:
    """Grouped N-D transposed convolution of x (N, C, *in) with w (C, M/group, *k)."""
    n_batch, channels = x.shape[:2]
    in_sp = x.shape[2:]
    cg, mg = channels // group, w.shape[1]
    k = math.prod(geom.kernel)
    p = math.prod(in_sp)
    wm = w.reshape(group, cg, mg * k).transpose(0, 2, 1)  # (G, Mg*K, Cg)
    xm = x.reshape(n_batch, group, cg, p).transpose(1, 2, 0, 3).reshape(group, cg, n_batch * p)
    cols = np.matmul(wm, xm).reshape(group, mg, k, n_batch, *in_sp)
    # Scatter-add every kernel tap into the full (unpadded) output.
    full = tuple(
        (sz - 1) * s + (kk - 1) * d + 1
        for sz, s, kk, d in zip(in_sp, geom.strides, geom.kernel, geom.dilations, strict=True)
    )
    buf = np.zeros((n_batch, group, mg, *full), dtype=x.dtype)
    for ki, off in enumerate(_offsets(geom.kernel)):
        sl = tuple(
            slice(o * d, o * d + (sz - 1) * s + 1, s)
            for o, d, sz, s in zip(off, geom.dilations, in_sp, geom.strides, strict=True)
        )
        buf[(slice(None), slice(None), slice(None), *sl)] += np.moveaxis(cols[:, :, ki], 2, 0)
    # Output position o is full position o + pads_begin; outside the full range it is zero.
    out_sp = tuple(int(o) for o in geom.out)  # type: ignore[arg-type]
    y = np.zeros((n_batch, group, mg, *out_sp), dtype=x.dtype)
    src, dst = [], []
    for f, o, b in zip(full, out_sp, geom.pads_begin, strict=True):
        lo, hi = max(b, 0), min(f, o + b)  # type: ignore[operator]
        src.append(slice(lo, max(hi, lo)))
        dst.append(slice(lo - b, max(hi, lo) - b))  # type: ignore[operator]
    y[(..., *dst)] = buf[(..., *src)]
    return y.reshape(n_batch, group * mg, *out_sp)


def _conv_transpose_compute(ins, attrs, n):
    x, w = ins[0], ins[1]
    b = ins[2] if len(ins) > 2 else None
    dt = acc_dtype(x.dtype)
    geom = conv_transpose_geometry(attrs, x.shape[2:], w.shape[2:], _fail_compute)
    y = conv_transpose_nd(x.astype(dt, copy=False), w.astype(dt, copy=False), geom, attrs.group)
    if b is not None:
        y += b.astype(dt).reshape(-1, *([1] * (x.ndim - 2)))
    return [y.astype(x.dtype, copy=False)]


def _pool_geometry(x: np.ndarray, attrs: Any) -> Geometry:
    return window_geometry(attrs, x.shape[2:], attrs.kernel_shape, _fail_compute, ceil_mode=bool(attrs.ceil_mode))


def _lowest(dtype: np.dtype) -> Any:
    return np.iinfo(dtype).min if dtype.kind in "iu" else -np.inf


def _axis_valid(geom: Geometry, axis: int, kidx: int, lo: int, hi: int) -> np.ndarray:
    """For kernel tap `kidx` along `axis`: whether each output position reads a padded-input
    position in [lo, hi) (padded coordinates)."""
    o = np.arange(int(geom.out[axis]))  # type: ignore[arg-type]
    pos = o * geom.strides[axis] + kidx * geom.dilations[axis]
    return (pos >= lo) & (pos < hi)


def _maxpool_compute(ins, attrs, n):
    x = ins[0]
    geom = _pool_geometry(x, attrs)
    xp = _padded_for(x, geom, _lowest(x.dtype))
    if n < 2:
        y = None
        for off in _offsets(geom.kernel):
            v = xp[(..., *geom.slices(off))]
            y = v.copy() if y is None else np.maximum(y, v, out=y)
        return [y]
    return list(_maxpool_with_indices(x, xp, geom, attrs.storage_order))


def _maxpool_with_indices(x: np.ndarray, xp: np.ndarray, geom: Geometry, storage_order: int):
    """Values and flat input indices of the first maximum of each window (padding never wins)."""
    spatial = x.shape[2:]
    nsp = len(spatial)
    best = None
    best_k = None
    found = None
    for ki, off in enumerate(_offsets(geom.kernel)):
        v = xp[(..., *geom.slices(off))]
        # Which output positions this tap reads inside the input, not in the padding.
        valid = np.ones((1,) * nsp, dtype=bool)
        for a in range(nsp):
            va = _axis_valid(geom, a, off[a], geom.pads_begin[a], geom.pads_begin[a] + spatial[a])  # type: ignore[operator]
            valid = valid & va.reshape((1,) * a + (-1,) + (1,) * (nsp - a - 1))
        if best is None:
            best = v.copy()
            best_k = np.zeros(v.shape, dtype=np.int64)
            found = np.broadcast_to(valid, v.shape).copy()
            continue
        upd = valid & ((v > best) | ~found)
        best = np.where(upd, v, best)
        best_k = np.where(upd, ki, best_k)
        found |= valid
    # Input coordinates of the winning taps, then a flat index over (N, C, *spatial).
    taps = np.unravel_index(best_k, geom.kernel)
    coords = []
    for a in range(nsp):
        o = np.arange(int(geom.out[a])).reshape((-1,) + (1,) * (nsp - a - 1))  # type: ignore[arg-type]
        coords.append(o * geom.strides[a] + taps[a] * geom.dilations[a] - geom.pads_begin[a])  # type: ignore[operator]
    if storage_order == 0:
        flat = np.ravel_multi_index(tuple(coords), spatial, mode="clip")
    else:
        flat = np.ravel_multi_index(tuple(reversed(coords)), tuple(reversed(spatial)), mode="clip")
    nc = np.arange(x.shape[0] * x.shape[1], dtype=np.int64).reshape(x.shape[0], x.shape[1], *([1] * nsp))
    return best, (flat + nc * math.prod(spatial)).astype(np.int64)


def _window_counts(spatial: Sequence[int], geom: Geometry, include_pad: bool) -> np.ndarray:
    """Elements each window averages over: a product of per-axis counts, since windows are boxes.
    With include_pad the explicit pads count, never a ceil-mode overhang beyond them."""
    count = np.ones((1,) * len(spatial))
    for a, size in enumerate(spatial):
        b = geom.pads_begin[a]
        lo, hi = (0, size + b + geom.pads_end[a]) if include_pad else (b, b + size)  # type: ignore[operator]
        c = sum(_axis_valid(geom, a, k, lo, hi).astype(np.int64) for k in range(geom.kernel[a]))
        count = count * np.asarray(c).reshape((-1,) + (1,) * (len(spatial) - a - 1))
    return count


def _window_sum(xp: np.ndarray, geom: Geometry) -> np.ndarray:
    y = None
    for off in _offsets(geom.kernel):
        v = xp[(..., *geom.slices(off))]
        y = v.copy() if y is None else np.add(y, v, out=y)
    return y  # type: ignore[return-value]


def _avgpool_compute(ins, attrs, n):
    x = ins[0]
    geom = _pool_geometry(x, attrs)
    dt = acc_dtype(x.dtype)
    s = _window_sum(_padded_for(x.astype(dt, copy=False), geom, 0), geom)
    count = _window_counts(x.shape[2:], geom, bool(attrs.count_include_pad))
    # An all-padding window (pads wider than the kernel) counts 0 elements: its average is 0/0.
    return [(s / count.astype(dt)).astype(x.dtype, copy=False)]


def _lp_power(x: np.ndarray, p: int) -> np.ndarray:
    a = np.abs(x)
    return a if p == 1 else a * a if p == 2 else a**p


def _lp_root(s: np.ndarray, p: int) -> np.ndarray:
    return s if p == 1 else np.sqrt(s) if p == 2 else s ** (1.0 / p)


def _lppool_compute(ins, attrs, n):
    x = ins[0]
    geom = _pool_geometry(x, attrs)
    dt = acc_dtype(x.dtype)
    s = _window_sum(_padded_for(_lp_power(x.astype(dt, copy=False), attrs.p), geom, 0), geom)
    return [_lp_root(s, attrs.p).astype(x.dtype, copy=False)]


def _spatial_axes(x: np.ndarray) -> tuple[int, ...]:
    return tuple(range(2, x.ndim))


def _global_lp_compute(ins, attrs, n):
    x = ins[0]
    dt = acc_dtype(x.dtype)
    s = np.sum(_lp_power(x.astype(dt, copy=False), attrs.p), axis=_spatial_axes(x), keepdims=True)
    return [_lp_root(s, attrs.p).astype(x.dtype, copy=False)]


def _lrn_compute(ins, attrs, n):
    x = ins[0]
    dt = acc_dtype(x.dtype)
    xf = x.astype(dt, copy=False)
    sq = xf * xf
    # Channel window [c - floor((size-1)/2), c + ceil((size-1)/2)], zero outside.
    before = (attrs.size - 1) // 2
    after = attrs.size - 1 - before
    c = x.shape[1]
    padded = np.zeros((x.shape[0], c + attrs.size - 1, *x.shape[2:]), dtype=dt)
    padded[:, before : before + c] = sq
    s = padded[:, 0:c].copy()
    for i in range(1, before + after + 1):
        s += padded[:, i : i + c]
    scale = dt.type(attrs.bias) + dt.type(attrs.alpha / attrs.size) * s
    return [(xf / scale ** dt.type(attrs.beta)).astype(x.dtype, copy=False)]


# ---- MaxUnpool ---------------------------------------------------------------------------------


def _unpool_default_shape(attrs: Any, x_shape: Sequence[Dim], fail: Fail) -> tuple[Dim, ...]:
    n = len(x_shape) - 2
    kernel = tuple(int(k) for k in attrs.kernel_shape)
    if len(kernel) != n:
        fail(f"kernel_shape {list(kernel)} has {len(kernel)} dims, the input has {n} spatial axes")
    strides = _ints(attrs.strides, n, 1, "strides", fail)
    pads = _ints(attrs.pads, 2 * n, 0, "pads", fail)
    out: list[Dim] = []
    for i, size in enumerate(x_shape[2:]):
        out.append((size - 1) * strides[i] + kernel[i] - pads[i] - pads[n + i] if isinstance(size, int) else None)
    return (*x_shape[:2], *out)


def _maxunpool_compute(ins, attrs, n):
    x, idx = ins[0], ins[1]
    if len(ins) > 2 and ins[2] is not None:
        shape = tuple(int(d) for d in np.asarray(ins[2]).reshape(-1))
    else:
        shape = _unpool_default_shape(attrs, x.shape, _fail_compute)  # type: ignore[assignment]
    y = np.zeros(math.prod(shape), dtype=x.dtype)  # type: ignore[arg-type]
    flat = idx.reshape(-1)
    if flat.size and (flat.min() < 0 or flat.max() >= y.size):
        raise ValueError(f"an index is outside the output of {y.size} elements")
    y[flat] = x.reshape(-1)
    return [y.reshape(shape)]


register_kernel("Conv", _conv_compute)
register_kernel("ConvInteger", _conv_integer_compute)
register_kernel("ConvTranspose", _conv_transpose_compute)
register_kernel("MaxPool", _maxpool_compute)
register_kernel("AveragePool", _avgpool_compute)
register_kernel("LpPool", _lppool_compute)
register_kernel(
    "GlobalAveragePool",
    lambda ins, a, n: [
        np.mean(ins[0], axis=_spatial_axes(ins[0]), keepdims=True, dtype=acc_dtype(ins[0].dtype)).astype(
            ins[0].dtype, copy=False
        )
    ],
)
register_kernel("GlobalMaxPool", lambda ins, a, n: [np.max(ins[0], axis=_spatial_axes(ins[0]), keepdims=True)])
register_kernel("GlobalLpPool", _global_lp_compute)
register_kernel("LRN", _lrn_compute)
register_kernel("MaxUnpool", _maxunpool_compute)
