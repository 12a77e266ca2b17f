"""GridSample (opset 20+ form, N-D), Col2Im and DFT (opset 20 form): numpy references.

GridSample follows the ONNX reference implementation's rules (the node tests' expected outputs),
except cubic with border padding, where it follows ONNX Runtime (see below):
grid coordinates are denormalized per spatial axis (grid[..., 0] is the last axis), nearest
rounds half to even; a coordinate outside [x_min, x_max] (the pixel-edge or pixel-centre bounds,
by align_corners) is first clamped (border) or reflected (reflection); then each tap outside the
input reads 0 (zeros), the clamped pixel (border) or the reflected pixel (reflection). linear
and cubic (Keys, a = -0.75) are tensor products of 1-D weights, vectorized over every output
location; only the loop over taps (2**n or 4**n) is Python.

Col2Im sums each block column back into the padded image (a loop over the block's offsets).
DFT works on the interleaved real/imaginary last axis (size 1 for a real signal, 2 for complex);
onesided keeps the first n//2+1 frequencies; inverse with onesided is the inverse real FFT.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np

from graphc.runtime.dtypes import DType
from graphc.runtime.reference.registry import register_kernel

_CUBIC_A = -0.75


def _reflect(x: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """Reflect by the nearer border until within [lo, hi] (the reference's _gs_reflect)."""
    rng = hi - lo
    out = x.copy()
    if rng <= 0:
        return np.where((x < lo) | (x > hi), lo, x)
    below, above = x < lo, x > hi
    dx = np.where(below, lo - x, x - hi)
    n = np.floor(dx / rng)
    r = dx - n * rng
    even = (n % 2) == 0
    out = np.where(below, np.where(even, lo + r, hi - r), out)
    out = np.where(above, np.where(even, hi - r, lo + r), out)
    return out


def _cubic_weights(t: np.ndarray) -> list[np.ndarray]:
    a = _CUBIC_A
    x = np.abs(t)
    return [
        ((a * (x + 1) - 5 * a) * (x + 1) + 8 * a) * (x + 1) - 4 * a,
        ((a + 2) * x - (a + 3)) * x * x + 1,
        ((a + 2) * (1 - x) - (a + 3)) * (1 - x) * (1 - x) + 1,
        ((a * (2 - x) - 5 * a) * (2 - x) + 8 * a) * (2 - x) - 4 * a,
    ]


def _tap_index(i: np.ndarray, size: int, lo: float, hi: float, padding: str) -> tuple[np.ndarray, np.ndarray]:
    """An integer tap index per location, made valid, and whether it reads a pixel (zeros: not
    outside the input)."""
    if padding == "zeros":
        valid = (i >= 0) & (i < size)
        return np.clip(i, 0, size - 1), valid
    if padding == "border":
        return np.clip(i, 0, size - 1), np.ones(i.shape, bool)
    r = _reflect(i.astype(np.float64), lo, hi).astype(np.int64)  # int() truncates, as the reference
    return np.clip(r, 0, size - 1), np.ones(i.shape, bool)


def grid_sample(ins: list, attrs: Any, n_out: int) -> list[np.ndarray]:
    x, grid = ins[0], ins[1]
    mode, padding, align = attrs.mode, attrs.padding_mode, bool(attrs.align_corners)
    if mode not in ("nearest", "linear", "cubic"):
        raise ValueError(f"GridSample: mode {mode!r} is not nearest, linear or cubic")
    if padding not in ("zeros", "border", "reflection"):
        raise ValueError(f"GridSample: padding_mode {padding!r} is not zeros, border or reflection")
    dims = x.shape[2:]
    nd = len(dims)
    if grid.shape[-1] != nd or grid.ndim != nd + 2:
        raise ValueError(f"GridSample: grid {list(grid.shape)} does not match {nd} spatial axes of X {list(x.shape)}")
    if mode == "cubic" and nd != 2:
        raise ValueError("GridSample: cubic mode is defined for 2-D inputs only")
    out_sp = grid.shape[1:-1]
    y = np.zeros((x.shape[0], x.shape[1], *out_sp), dtype=x.dtype)
    if y.size == 0:
        return [y]
    g = grid.astype(np.float64)
    for b in range(x.shape[0]):
        coords, bounds = [], []
        for i, size in enumerate(dims):
            v = g[b, ..., nd - 1 - i]  # grid[..., 0] is the last spatial axis
            c = (v + 1) / 2 * (size - 1) if align else ((v + 1) * size - 1) / 2
            if mode == "nearest":
                c = np.rint(c)
            lo, hi = (0.0, size - 1.0) if align else (-0.5, size - 0.5)
            out = (c < lo) | (c > hi)
            if padding == "border" and mode != "cubic":
                # cubic + border: the taps are clamped, not the coordinate (ONNX Runtime and
                # PyTorch; the ONNX reference clamps the coordinate too, and no node test has it)
                c = np.where(out, np.clip(c, 0, size - 1), c)
            elif padding == "reflection":
                c = np.where(out, _reflect(c, lo, hi), c)
            coords.append(c)
            bounds.append((lo, hi))
        # per axis: the taps (integer index) and their weights
        taps: list[list[tuple[np.ndarray, np.ndarray]]] = []
        for c in coords:
            if mode == "nearest":
                taps.append([(c.astype(np.int64), np.ones_like(c))])
                continue
            f = np.floor(c)
            t = c - f
            if mode == "linear":
                taps.append([(f.astype(np.int64), 1 - t), (f.astype(np.int64) + 1, t)])
            else:
                w = _cubic_weights(t)
                taps.append([(f.astype(np.int64) + k - 1, w[k]) for k in range(4)])
        xb = x[b].astype(np.float64)
        acc = np.zeros((x.shape[1], *out_sp), np.float64)
        for combo in itertools.product(*taps):
            index, weight, valid = [], np.ones(out_sp, np.float64), np.ones(out_sp, bool)
            for axis, (i, w) in enumerate(combo):
                ii, ok = _tap_index(i, dims[axis], *bounds[axis], padding)
                index.append(ii)
                weight = weight * w
                valid &= ok
            acc += xb[(slice(None), *index)] * np.where(valid, weight, 0.0)
        y[b] = acc.astype(x.dtype)
    return [y]


def col2im(ins: list, attrs: Any, n_out: int) -> list[np.ndarray]:
    x = ins[0]
    image = [int(v) for v in np.asarray(ins[1]).reshape(-1)]
    block = [int(v) for v in np.asarray(ins[2]).reshape(-1)]
    nd = len(image)
    dil = list(attrs.dilations or ()) or [1] * nd
    strides = list(attrs.strides or ()) or [1] * nd
    pads = list(attrs.pads or ()) or [0] * (2 * nd)
    n, ck, length = x.shape
    kprod = int(np.prod(block))
    if ck % kprod:
        raise ValueError(f"Col2Im: input dim 1 ({ck}) is not a multiple of the block size {kprod}")
    c = ck // kprod
    padded = [image[d] + pads[d] + pads[d + nd] for d in range(nd)]
    counts = [(padded[d] - (dil[d] * (block[d] - 1) + 1)) // strides[d] + 1 for d in range(nd)]
    if int(np.prod(counts)) != length:
        raise ValueError(f"Col2Im: {length} blocks given, the image and block shapes make {int(np.prod(counts))}")
    cols = x.reshape(n, c, *block, *counts)
    out = np.zeros((n, c, *padded), dtype=x.dtype)
    for k in itertools.product(*(range(b) for b in block)):
        sl = tuple(
            slice(k[d] * dil[d], k[d] * dil[d] + strides[d] * (counts[d] - 1) + 1, strides[d]) for d in range(nd)
        )
        out[(slice(None), slice(None), *sl)] += cols[(slice(None), slice(None), *k)]
    crop = tuple(slice(pads[d], pads[d] + image[d]) for d in range(nd))
    return [np.ascontiguousarray(out[(slice(None), slice(None), *crop)])]


def dft(ins: list, attrs: Any, n_out: int) -> list[np.ndarray]:
    x = ins[0]
    length = ins[1] if len(ins) > 1 else None
    axis_in = ins[2] if len(ins) > 2 else None
    axis = -2 if axis_in is None else int(np.asarray(axis_in).reshape(()))
    axis = axis % x.ndim
    if axis == x.ndim - 1:
        raise ValueError("DFT: axis may not be the last (real/imaginary) axis")
    if x.shape[-1] not in (1, 2):
        raise ValueError(f"DFT: the last axis must have size 1 (real) or 2 (complex), got {x.shape[-1]}")
    inverse, onesided = bool(attrs.inverse), bool(attrs.onesided)
    # in the input's precision (numpy's FFT keeps float32), as the ONNX reference computes it
    sig = x[..., 0] if x.shape[-1] == 1 else x[..., 0] + 1j * x[..., 1]
    if length is None:
        n = 2 * (x.shape[axis] - 1) if inverse and onesided else x.shape[axis]
    else:
        n = int(np.asarray(length).reshape(()))
    if inverse:
        if onesided:
            return [np.fft.irfft(sig, n=n, axis=axis)[..., None].astype(x.dtype)]
        r = np.fft.ifft(sig, n=n, axis=axis)
    else:
        r = np.fft.fft(sig, n=n, axis=axis)
        if onesided:
            r = np.take(r, np.arange(n // 2 + 1), axis=axis)
    return [np.stack([r.real, r.imag], axis=-1).astype(x.dtype)]


register_kernel("GridSample", grid_sample)
register_kernel("Col2Im", col2im)
register_kernel("DFT", dft)


def _iou_suppresses(box: np.ndarray, kept: np.ndarray, center: bool, threshold: float) -> bool:
    """Whether `box` overlaps any of `kept` by IoU > threshold (the ONNX reference's rule:
    corners may come in either order; an empty intersection or area never suppresses)."""
    if not len(kept):
        return False
    both = np.vstack([box[None], kept]).astype(np.float64)
    if center:
        x0, x1 = both[:, 0] - both[:, 2] / 2, both[:, 0] + both[:, 2] / 2
        y0, y1 = both[:, 1] - both[:, 3] / 2, both[:, 1] + both[:, 3] / 2
    else:
        x0, x1 = np.minimum(both[:, 1], both[:, 3]), np.maximum(both[:, 1], both[:, 3])
        y0, y1 = np.minimum(both[:, 0], both[:, 2]), np.maximum(both[:, 0], both[:, 2])
    iw = np.minimum(x1[0], x1[1:]) - np.maximum(x0[0], x0[1:])
    ih = np.minimum(y1[0], y1[1:]) - np.maximum(y0[0], y0[1:])
    inter = np.where((iw > 0) & (ih > 0), iw * ih, 0.0)
    area = (x1 - x0) * (y1 - y0)
    union = area[0] + area[1:] - inter
    ok = (inter > 0) & (area[0] > 0) & (area[1:] > 0) & (union > 0)
    iou = np.where(ok, inter / np.where(union > 0, union, 1.0), 0.0)
    return bool(np.any(ok & (iou > threshold)))


def non_max_suppression(ins: list, attrs: Any, n_out: int) -> list[np.ndarray]:
    boxes, scores = ins[0], ins[1]

    def scalar(i: int, default: float) -> float:
        v = ins[i] if len(ins) > i else None
        return default if v is None or np.asarray(v).size == 0 else np.asarray(v).reshape(-1)[0].item()

    max_out = max(int(scalar(2, 0)), 0)
    iou_t = float(scalar(3, 0.0))
    has_score_t = len(ins) > 4 and ins[4] is not None and np.asarray(ins[4]).size
    score_t = float(scalar(4, 0.0))
    center = bool(attrs.center_point_box)
    out: list[tuple[int, int, int]] = []
    for b in range(boxes.shape[0]):
        for c in range(scores.shape[1]):
            s = scores[b, c]
            cand = np.flatnonzero(s > score_t) if has_score_t else np.arange(s.shape[0])
            # highest score first; equal scores by lower box index
            order = cand[np.lexsort((cand, -s[cand].astype(np.float64)))]
            kept: list[int] = []
            for i in order:
                if len(kept) >= max_out:
                    break
                if not _iou_suppresses(boxes[b, i], boxes[b, kept], center, iou_t):
                    kept.append(int(i))
                    out.append((b, c, int(i)))
    return [np.array(out, dtype=np.int64).reshape(-1, 3)]


register_kernel("NonMaxSuppression", non_max_suppression)


def stft(ins: list, attrs: Any, n_out: int) -> list[np.ndarray]:
    """STFT-17: frames of the window's length (or frame_length) every frame_step samples, each
    weighted by the window (ones when absent) and transformed with frame_length points."""
    x = ins[0]
    step = int(np.asarray(ins[1]).reshape(()))
    window = ins[2] if len(ins) > 2 else None
    fl = ins[3] if len(ins) > 3 else None
    if fl is not None:
        length = int(np.asarray(fl).reshape(()))
    else:
        length = window.shape[0] if window is not None else x.shape[-2]
    if window is None:
        window = np.ones((length,), x.dtype)
    ws = window.shape[0]
    if step <= 0 or ws > x.shape[1] or length <= 0:
        raise ValueError(f"STFT: frame_step {step} and frame length {ws} do not fit a signal of {x.shape[1]} samples")
    frames_n = 1 + (x.shape[1] - length) // step
    frames = np.stack([x[:, f * step : f * step + ws, :] for f in range(frames_n)], axis=1)  # [B, F, ws, c]
    frames = frames * window.reshape(1, 1, ws, 1).astype(x.dtype)
    sig = frames[..., 0] if x.shape[-1] == 1 else frames[..., 0] + 1j * frames[..., 1]
    r = np.fft.fft(sig, n=length, axis=2)
    if attrs.onesided:
        r = r[:, :, : length // 2 + 1]
    return [np.stack([r.real, r.imag], axis=-1).astype(x.dtype)]


def mel_weight_matrix(ins: list, attrs: Any, n_out: int) -> list[np.ndarray]:
    """MelWeightMatrix-17 as the ONNX reference computes it (triangles between mel-spaced bins)."""
    num_mel, dft_len, rate = (int(np.asarray(v).reshape(())) for v in ins[:3])
    lo_hz, hi_hz = (float(np.asarray(v).reshape(())) for v in ins[3:5])
    bins_n = dft_len // 2 + 1
    lo_mel = 2595 * np.log1p(lo_hz / 700) / np.log(10)
    hi_mel = 2595 * np.log1p(hi_hz / 700) / np.log(10)
    points = np.arange(0, num_mel + 2)
    step = (hi_mel - lo_mel) / points.shape[0]
    hz = 700 * np.expm1((points * step + lo_mel) / 2595 * np.log(10))
    edges = (((dft_len + 1) * hz) // rate).astype(int)
    out = np.zeros((bins_n, num_mel))
    for i in range(num_mel):
        left, center, right = edges[i], edges[i + 1], edges[i + 2]
        if center == left:
            out[center, i] = 1
        else:
            j = np.arange(left, center + 1)
            out[j, i] = (j - left) / (center - left)
        if right > center:
            j = np.arange(center, right)
            out[j, i] = (right - j) / (right - center)
    return [out.astype(DType.from_onnx(attrs.output_datatype).numpy)]


def _roi_axis(start: float, bin_size: float, bins: int, grid: int, size: int):
    """Along one axis of a ROI: for every (bin, sample) the low and high source index and the weight
    of the high one, and whether the sample lies within [-1, size] (else its weights are 0), as
    ONNX's reference RoiAlign computes them (clamped to the last index at the edge)."""
    k = np.arange(bins)[:, None] + (np.arange(grid)[None, :] + 0.5) / grid  # [bins, grid]
    pos = start + k * bin_size
    inside = (pos >= -1.0) & (pos <= size)
    pos = np.maximum(pos, 0.0)
    low = np.floor(pos).astype(np.int64)
    edge = low >= size - 1
    low = np.where(edge, size - 1, low)
    high = np.where(edge, size - 1, low + 1)
    frac = np.where(edge, 0.0, pos - low)
    return low, high, frac, inside


def roi_align(ins, attrs, n):
    """RoiAlign-16 as ONNX's reference computes it: per bin a grid of bilinear samples (sampling_ratio,
    or ceil(bin size) per axis), averaged (mode avg) or the largest of each sample's four weighted
    corners taken (mode max, ONNX's definition); samples outside [-1, size] count as 0."""
    x, rois, idx = ins
    r, c = rois.shape[0], x.shape[1]
    h, w = x.shape[2], x.shape[3]
    oh, ow = attrs.output_height, attrs.output_width
    half = attrs.coordinate_transformation_mode == "half_pixel"
    out = np.zeros((r, c, oh, ow), np.float64)
    bad = np.argwhere((idx < 0) | (idx >= x.shape[0]))
    if bad.size:
        i = int(bad[0][0])
        raise ValueError(f"batch_indices[{i}] = {int(idx[i])} is not a batch index of X (batch {x.shape[0]})")
    for i in range(r):
        x1, y1, x2, y2 = (float(v) * attrs.spatial_scale - (0.5 if half else 0.0) for v in rois[i])
        rw, rh = x2 - x1, y2 - y1
        if not half:
            rw, rh = max(rw, 1.0), max(rh, 1.0)
        bh, bw = rh / oh, rw / ow
        gh = attrs.sampling_ratio if attrs.sampling_ratio > 0 else int(np.ceil(rh / oh))
        gw = attrs.sampling_ratio if attrs.sampling_ratio > 0 else int(np.ceil(rw / ow))
        if gh <= 0 or gw <= 0:
            continue  # no samples: 0, as the reference leaves it
        ylo, yhi, ly, yin = _roi_axis(y1, bh, oh, gh, h)
        xlo, xhi, lx, xin = _roi_axis(x1, bw, ow, gw, w)
        valid = (yin[:, :, None, None] & xin[None, None, :, :]).astype(np.float64)  # [oh, gh, ow, gw]
        wy = [(1.0 - ly)[:, :, None, None], ly[:, :, None, None]]
        wx = [(1.0 - lx)[None, None, :, :], lx[None, None, :, :]]
        img = x[int(idx[i])].astype(np.float64)  # [C, H, W]
        terms = []
        for yy, ay in ((ylo, 0), (yhi, 1)):
            for xx, ax in ((xlo, 0), (xhi, 1)):
                v = img[:, yy[:, :, None, None], xx[None, None, :, :]]  # [C, oh, gh, ow, gw]
                terms.append(v * (wy[ay] * wx[ax] * valid))
        if attrs.mode == "avg":
            out[i] = sum(terms).sum(axis=(2, 4)) / max(gh * gw, 1)
        else:
            out[i] = np.max(np.maximum.reduce(terms), axis=(2, 4))
    return [out.astype(x.dtype)]


register_kernel("STFT", stft)
register_kernel("RoiAlign", roi_align)
register_kernel("MelWeightMatrix", mel_weight_matrix)
