"""DeformConv (opsets 19, 22): a 2-D convolution whose every kernel tap reads the input at its own
learned offset (and, with a mask, scales what it reads), as in deformable convolution v1/v2 and
torchvision.ops.deform_conv2d.

For output position (i, j) and tap (a, b) of offset group g the tap reads
X[c] at (i * sh - pad_top + a * dh + dy, j * sw - pad_left + b * dw + dx), where (dy, dx) =
offset[n, g, a, b, :, i, j] (offset's channels are offset_group x kH x kW x 2, y first), by
bilinear interpolation with zero outside the image (each of the four corners outside counts 0, as
GridSample with align_corners=1 and zero padding does in ONNX's reference), times
mask[n, g, a, b, i, j] (1 without a mask). Input channel c belongs to offset group
c // (C / offset_group). The sampled columns then go through a grouped matmul with W, plus B.

Vectorized: one gather per bilinear corner over all (channel, tap, output position), then one
batched matmul over the groups; computed in float64 and cast back once.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from graphc.runtime.reference.registry import register_kernel


def deform_geometry(attrs: Any) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """(strides, dilations, pads [top, left, bottom, right]) of a 2-D DeformConv, defaults filled."""
    strides = tuple(int(v) for v in (attrs.strides or (1, 1)))
    dil = tuple(int(v) for v in (attrs.dilations or (1, 1)))
    pads = tuple(int(v) for v in (attrs.pads or (0, 0, 0, 0)))
    return strides, dil, pads


def deform_out_size(size: int, k: int, s: int, d: int, pb: int, pe: int) -> int:
    """The output length along one axis: (size + pads - dilated kernel) // stride + 1."""
    return (size + pb + pe - ((k - 1) * d + 1)) // s + 1


def deform_conv(ins: list, attrs: Any, n_out: int) -> list[np.ndarray]:
    x, w, offset = ins[0], ins[1], ins[2]
    b = ins[3] if len(ins) > 3 else None
    mask = ins[4] if len(ins) > 4 else None
    n, c, h, wd = x.shape
    oc, cg, kh, kw = w.shape
    groups, og = int(attrs.group), int(attrs.offset_group)
    (sh, sw), (dh, dw), (pt, pl, _pb, _pr) = deform_geometry(attrs)
    oh, ow = offset.shape[2], offset.shape[3]
    k = kh * kw
    f = np.float64
    off = offset.astype(f).reshape(n, og, kh, kw, 2, oh, ow)
    # sample positions [N, OG, kH, kW, oH, oW]
    base_y = (np.arange(kh) * dh)[:, None, None, None] + (np.arange(oh) * sh - pt)[None, None, :, None]
    base_x = (np.arange(kw) * dw)[None, :, None, None] + (np.arange(ow) * sw - pl)[None, None, None, :]
    py = base_y[None, None] + off[:, :, :, :, 0]
    px = base_x[None, None] + off[:, :, :, :, 1]
    y0, x0 = np.floor(py), np.floor(px)
    ly, lx = py - y0, px - x0
    y0, x0 = y0.astype(np.int64), x0.astype(np.int64)
    m = np.ones((n, og, kh, kw, oh, ow), f) if mask is None else mask.astype(f).reshape(n, og, kh, kw, oh, ow)
    cpo = c // og  # channels per offset group
    xs = x.astype(f).reshape(n, og, cpo, h * wd)
    cols = np.zeros((n, og, cpo, k * oh * ow), f)
    for yy, wy in ((y0, 1.0 - ly), (y0 + 1, ly)):
        for xx, wx in ((x0, 1.0 - lx), (x0 + 1, lx)):
            inside = (yy >= 0) & (yy < h) & (xx >= 0) & (xx < wd)
            flat = (np.clip(yy, 0, h - 1) * wd + np.clip(xx, 0, wd - 1)).reshape(n, og, 1, -1)
            weight = (wy * wx * inside * m).reshape(n, og, 1, -1)
            cols += np.take_along_axis(xs, np.broadcast_to(flat, (n, og, cpo, flat.shape[-1])), axis=3) * weight
    # [N, C, k, P] -> per group [N, G, Cg * k, P]; W [G, OCg, Cg * k]
    p = oh * ow
    cols = cols.reshape(n, groups, cg * k, p)
    wg = w.astype(f).reshape(groups, oc // groups, cg * k)
    out = np.einsum("gok,ngkp->ngop", wg, cols).reshape(n, oc, oh, ow)
    if b is not None:
        out += b.astype(f).reshape(1, oc, 1, 1)
    return [out.astype(x.dtype)]


register_kernel("DeformConv", deform_conv)
