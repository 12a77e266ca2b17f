"""Resize (opset 19 form): nearest, N-linear and N-cubic interpolation, every coordinate
transformation mode, roi for tf_crop_and_resize, scales or sizes, axes, keep_aspect_ratio_policy
and antialias.

Where the ONNX reference implementation and ONNX Runtime disagree, graphc follows the spec's text
and ONNX Runtime: `length_resized` is the integer output length (see `source_coords`), and
pytorch_half_pixel maps a length-1 output to coordinate 0 (the reference uses -0.5).

Interpolation is separable, so the reference resizes one axis at a time: per axis it computes, for
every output coordinate, the source coordinate, a window of taps and their weights, and sums the
taps (a loop over a few taps, vectorized over the whole tensor). Coordinates and weights follow the
ONNX reference formulas (windows are edge-clamped; `exclude_outside` drops taps outside the input
and renormalizes). Output sizes from scales are floor(float32(in) * float32(scale)), the float32
product ONNX Runtime and ONNX shape inference compute.

This module holds the numpy kernels (what the interpreter and a CPU engine run); type
inference and traits are in graphc.ops.resize.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from graphc.runtime.dtypes import Dim, Shape
from graphc.runtime.reference.registry import register_kernel


@dataclass(frozen=True)
class ResizePlan:
    """Per axis of the input: output size, scale, and (start, end) of the roi."""

    out_shape: tuple[Dim, ...]
    scales: tuple[float | None, ...]
    roi: tuple[tuple[float, float], ...]
    axes: tuple[int, ...]


def _given(v: np.ndarray | None) -> bool:
    """Opset 11 passes an empty tensor for an unused roi/scales/sizes; treat it as omitted."""
    return v is not None and np.asarray(v).size > 0


def resize_plan(
    in_shape: Shape,
    attrs,
    roi: np.ndarray | None,
    scales: np.ndarray | None,
    sizes: np.ndarray | None,
    fail,
    *,
    unknown: bool = False,
) -> ResizePlan:
    """Output shape, scales and roi of every axis. `scales`/`sizes` are the known input values
    (None if omitted); `unknown` says that one of them is given but not known at build time."""
    rank = len(in_shape)
    axes = list(range(rank)) if attrs.axes is None else [a + rank if a < 0 else a for a in attrs.axes]
    if any(not 0 <= a < rank for a in axes) or len(set(axes)) != len(axes):
        fail(f"axes {attrs.axes} are out of range or repeated for rank {rank}")
    out: list[Dim] = list(in_shape)
    scl: list[float | None] = [1.0] * rank
    if _given(scales):
        s = [float(v) for v in np.asarray(scales, dtype=np.float32).reshape(-1)]
        if len(s) != len(axes):
            fail(f"scales {s} must have one entry per resized axis ({len(axes)})")
        if any(not v > 0 for v in s):
            fail(f"scales {s} must be positive")
        for a, v in zip(axes, s, strict=True):
            d = in_shape[a]
            scl[a] = v
            if isinstance(d, int):
                out[a] = int(math.floor(np.float32(d) * np.float32(v)))
            else:
                out[a] = d if v == 1.0 else None
    elif _given(sizes):
        z = [int(v) for v in np.asarray(sizes).reshape(-1)]
        if len(z) != len(axes):
            fail(f"sizes {z} must have one entry per resized axis ({len(axes)})")
        if any(v < 0 for v in z):
            fail(f"sizes {z} must be non-negative")
        policy = attrs.keep_aspect_ratio_policy
        if policy == "stretch":
            for a, v in zip(axes, z, strict=True):
                d = in_shape[a]
                out[a] = v
                scl[a] = float(np.float32(v) / np.float32(d)) if isinstance(d, int) and d > 0 else None
        else:
            dims = [in_shape[a] for a in axes]
            if all(isinstance(d, int) and d > 0 for d in dims):
                ratios = [v / d for v, d in zip(z, dims, strict=True)]  # type: ignore[operator]
                scale = min(ratios) if policy == "not_larger" else max(ratios)
                for a, d in zip(axes, dims, strict=True):
                    out[a] = int(scale * d + 0.5)  # type: ignore[operator]
                    scl[a] = scale
            else:
                for a in axes:
                    out[a], scl[a] = None, None
    elif unknown:
        for a in axes:
            out[a], scl[a] = None, None
    else:
        fail("one of scales and sizes must be given")
    rois = [(0.0, 1.0)] * rank
    if _given(roi):
        r = [float(v) for v in np.asarray(roi).reshape(-1)]
        if len(r) != 2 * len(axes):
            fail(f"roi {r} must have 2 entries per resized axis ({len(axes)})")
        for i, a in enumerate(axes):
            rois[a] = (r[i], r[len(axes) + i])
    return ResizePlan(tuple(out), tuple(scl), tuple(rois), tuple(axes))


# ---- one axis ----------------------------------------------------------------------------------


def source_coords(
    mode: str, out_len: int, in_len: int, scale: float, roi: tuple[float, float]
) -> tuple[np.ndarray, np.ndarray | None]:
    """Source coordinate of each output index along one axis, and for tf_crop_and_resize the
    mask of coordinates outside the input.

    Coordinates are computed in float32 in ONNX Runtime's order of operations, so that nearest
    rounding at exact half-way points (e.g. 1.5 / 0.6 - 0.5) lands on the same side.
    `length_resized` in the spec's formulas is the integer length of the resized axis (as in ONNX
    Runtime and PyTorch); only half_pixel_symmetric uses the fractional target length
    in_len * scale. (The ONNX reference uses the fractional length everywhere, which differs
    when in_len * scale is not an integer.)"""
    f = np.float32
    y = np.arange(out_len, dtype=f)
    s, n_in, n_out = f(scale), f(in_len), f(out_len)
    half = f(0.5)
    extrapolated = None
    if mode == "align_corners":
        x = np.zeros(out_len, f) if out_len == 1 else y * (n_in - 1) / (n_out - 1)
    elif mode == "asymmetric":
        x = y / s
    elif mode == "tf_crop_and_resize":
        start, end = f(roi[0]), f(roi[1])
        if out_len == 1:
            x = np.full(out_len, 0.5 * float(start + end) * float(n_in - 1), dtype=f)
        else:
            x = start * (n_in - 1) + (y * (end - start) * (n_in - 1)) / (n_out - 1)
        extrapolated = (x < 0) | (x > n_in - 1)
    elif mode == "pytorch_half_pixel":
        x = (y + half) / s - half if out_len > 1 else np.zeros(out_len, f)
    elif mode == "half_pixel":
        x = (y + half) / s - half
    elif mode == "half_pixel_symmetric":
        adjustment = n_out / (s * n_in)
        offset = n_in / f(2) * (f(1) - adjustment)
        # ONNX Runtime finishes this one in double precision before rounding to float.
        x = (float(offset) + (y.astype(np.float64) + 0.5) / float(s) - 0.5).astype(f)
    else:
        raise ValueError(f"unknown coordinate_transformation_mode {mode!r}")
    return x.astype(np.float64), extrapolated


def nearest_index(x: np.ndarray, mode: str, in_len: int) -> np.ndarray:
    xf = np.floor(x)
    frac = x - xf
    if mode == "round_prefer_floor":
        idx = xf + (frac > 0.5)
    elif mode == "round_prefer_ceil":
        idx = xf + (frac >= 0.5)
    elif mode == "floor":
        idx = xf
    else:
        idx = xf + (frac > 0)
    return np.clip(idx, 0, in_len - 1).astype(np.intp)


def _cubic_kernel(d: np.ndarray, a: float) -> np.ndarray:
    """Keys' cubic convolution kernel at distances d."""
    d = np.abs(d)
    d2, d3 = d * d, d * d * d
    near = (a + 2) * d3 - (a + 3) * d2 + 1
    far = a * d3 - 5 * a * d2 + 8 * a * d - 4 * a
    return np.where(d <= 1, near, np.where(d < 2, far, 0.0))


def tap_weights(ratio: np.ndarray, scale: float, attrs) -> tuple[np.ndarray, int]:
    """Weights (out_len, n) of the n taps around each source coordinate, whose fractional part
    is `ratio` in (0, 1] (1 at integers: the window then ends at the coordinate)."""
    r = ratio[:, None]
    if attrs.mode == "linear":
        if not attrs.antialias:
            return np.concatenate([1 - r, r], axis=1), 2
        s = min(scale, 1.0)  # antialias stretches the filter only when downscaling
        start = int(math.floor(-1 / s) + 1)
        n = 2 - 2 * start
        d = (np.arange(start, start + n)[None, :] - r) * s
        w = np.clip(1 - np.abs(d), 0, 1)
        return w / w.sum(axis=1, keepdims=True), n
    a = attrs.cubic_coeff_a
    if not attrs.antialias:
        return _cubic_kernel(np.arange(-1, 3)[None, :] - r, a), 4
    s = min(scale, 1.0)
    start = int(math.floor(-2 / s) + 1)
    n = 2 - 2 * start
    w = _cubic_kernel(s * (np.arange(start, start + n)[None, :] - r), a)
    return w / w.sum(axis=1, keepdims=True), n


def interp_window(x: np.ndarray, in_len: int, scale: float, attrs) -> tuple[np.ndarray, np.ndarray]:
    """Input indices (clipped into range) and weights, both (len(x), taps), of the interpolation
    window of each source coordinate x. The CUDA Resize kernel bakes these same tables."""
    xf = np.floor(x)
    ratio = np.where(x == xf, 1.0, x - xf)
    w, n = tap_weights(ratio, scale, attrs)
    # The window holds the n nearest input indices, ties to the lower one (ONNX reference).
    pad = -(-n // 2)
    xp = x + pad
    p = np.floor(xp)
    frac = xp - p
    if n % 2 == 0:
        off = np.where(frac == 0, -(n // 2), -(n // 2) + 1)
    else:
        base = -((n - 1) // 2)
        off = np.where(frac <= 0.5, base, base + 1)
    idx = (p + off - pad).astype(np.int64)[:, None] + np.arange(n)[None, :]
    if attrs.exclude_outside:
        w = np.where((idx < 0) | (idx >= in_len), 0.0, w)
        total = w.sum(axis=1, keepdims=True)
        w = w / np.where(total == 0, 1.0, total)
    return np.clip(idx, 0, in_len - 1), w


def _interp_axis(data: np.ndarray, axis: int, x: np.ndarray, scale: float, attrs) -> np.ndarray:
    idx, w = interp_window(x, data.shape[axis], scale, attrs)
    n = idx.shape[1]
    bshape = [1] * data.ndim
    bshape[axis] = len(x)
    w = w.astype(data.dtype)
    out = None
    for j in range(n):
        term = np.take(data, idx[:, j], axis=axis) * w[:, j].reshape(bshape)
        out = term if out is None else out + term
    return out


def _resize_compute(ins, attrs, n):
    x = ins[0]
    roi = ins[1] if len(ins) > 1 else None
    scales = ins[2] if len(ins) > 2 else None
    sizes = ins[3] if len(ins) > 3 else None

    def fail(msg):
        raise ValueError(msg)

    plan = resize_plan(x.shape, attrs, roi, scales, sizes, fail)
    nearest = attrs.mode == "nearest"
    if nearest:
        y = x
    else:
        # float32 math for float32 and narrower floats, float64 for float64 and integers.
        work = np.float32 if x.dtype.kind == "f" and x.dtype.itemsize <= 4 else np.float64
        if x.dtype.name == "bfloat16":
            work = np.float32
        y = x.astype(work)
    ctm = attrs.coordinate_transformation_mode
    for a in plan.axes:
        in_len, out_len, scale = x.shape[a], plan.out_shape[a], plan.scales[a]
        roi_a = plan.roi[a]
        identity = scale == 1.0 and out_len == in_len
        if identity and (ctm != "tf_crop_and_resize" or roi_a == (0.0, 1.0)):
            continue
        if out_len == 0 or in_len == 0:
            shape = list(y.shape)
            shape[a] = out_len
            y = np.zeros(shape, dtype=y.dtype)
            continue
        coords, extrapolated = source_coords(ctm, out_len, in_len, scale, roi_a)
        if nearest:
            y = np.take(y, nearest_index(coords, attrs.nearest_mode, in_len), axis=a)
        else:
            y = _interp_axis(y, a, coords, scale, attrs)
        if extrapolated is not None and extrapolated.any():
            mshape = [1] * y.ndim
            mshape[a] = out_len
            fill = np.asarray(attrs.extrapolation_value).astype(y.dtype)
            y = np.where(extrapolated.reshape(mshape), fill, y)
    if y.dtype == x.dtype:
        return [y]
    if x.dtype.kind in "iu":
        info = np.iinfo(x.dtype)
        return [np.clip(np.round(y), info.min, info.max).astype(x.dtype)]
    return [y.astype(x.dtype)]


register_kernel("Resize", _resize_compute)
