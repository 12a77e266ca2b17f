"""DeformConv (opsets 19, 22): type inference with one-line errors; the numpy reference is
graphc.runtime.reference.deform_conv. 2-D only (as ONNX's reference and ONNX Runtime); explicit
pads (the op has no auto_pad)."""

from __future__ import annotations

from graphc.ir.types import DType, TensorType
from graphc.ops.registry import Category, InferContext, register_op
from graphc.runtime.reference.deform_conv import deform_geometry, deform_out_size

_FLOATS = frozenset({DType.float16, DType.bfloat16, DType.float32, DType.float64})


def _static(t: TensorType) -> bool:
    return t.shape is not None and all(isinstance(d, int) for d in t.shape)


def _deform_conv_infer(ctx: InferContext) -> list[TensorType]:
    """X [N, C, H, W], W [OC, C/group, kH, kW], offset [N, OG*2*kH*kW, oH, oW], B [OC]?,
    mask [N, OG*kH*kW, oH, oW]? -> [N, OC, oH, oW]."""
    x, w, off = ctx.type(0), ctx.type(1), ctx.type(2)
    a = ctx.attrs
    if x.dtype not in _FLOATS:
        ctx.fail(f"X is {x.dtype.name}, not a float type")
    for what, i in (("W", 1), ("offset", 2), ("B", 3), ("mask", 4)):
        if ctx.has_input(i) and ctx.type(i).dtype != x.dtype:
            ctx.fail(f"{what} is {ctx.type(i).dtype.name}, X {x.dtype.name}")
    for what, t, rank in (("X", x, 4), ("W", w, 4), ("offset", off, 4)):
        if t.shape is not None and len(t.shape) != rank:
            ctx.fail(f"{what} {t} must have rank 4 (graphc's DeformConv is 2-D)")
    group, og = int(a.group), int(a.offset_group)
    if group < 1 or og < 1:
        ctx.fail(f"group {group} and offset_group {og} must be >= 1")
    strides, dil, pads = deform_geometry(a)
    if len(strides) != 2 or len(dil) != 2 or len(pads) != 4:
        ctx.fail(f"strides {list(strides)}, dilations {list(dil)}, pads {list(pads)} must have 2, 2 and 4 values")
    if min(strides) < 1 or min(dil) < 1 or min(pads) < 0:
        ctx.fail(f"strides {list(strides)}, dilations {list(dil)} must be >= 1 and pads {list(pads)} >= 0")
    if not _static(w):
        ctx.fail(f"W {w} must have a static shape")
    oc, cg, kh, kw = w.shape  # type: ignore[misc]
    if a.kernel_shape and tuple(int(v) for v in a.kernel_shape) != (kh, kw):
        ctx.fail(f"kernel_shape {list(a.kernel_shape)} does not match W's spatial dims {[kh, kw]}")
    if oc % group:
        ctx.fail(f"{oc} output channels do not split into {group} groups")
    n = x.shape[0] if x.shape is not None else None
    c = x.shape[1] if x.shape is not None else None
    if isinstance(c, int):
        if c != cg * group:
            ctx.fail(f"X has {c} channels, W {w} with group {group} takes {cg * group}")
        if c % og:
            ctx.fail(f"{c} input channels do not split into {og} offset groups")
    if off.shape is not None and isinstance(off.shape[1], int) and off.shape[1] != og * 2 * kh * kw:
        ctx.fail(f"offset {off} must have offset_group * 2 * kH * kW = {og * 2 * kh * kw} channels")
    out = [None, None]
    if x.shape is not None:
        for i in range(2):
            size = x.shape[2 + i]
            if isinstance(size, int):
                o = deform_out_size(size, (kh, kw)[i], strides[i], dil[i], pads[i], pads[2 + i])
                if o < 1:
                    ctx.fail(f"the dilated kernel {[kh, kw]} does not fit X {x} with pads {list(pads)}")
                out[i] = o
    if off.shape is not None:
        for i in range(2):
            d = off.shape[2 + i]
            if isinstance(d, int) and isinstance(out[i], int) and d != out[i]:
                ctx.fail(f"offset {off} has spatial dims {list(off.shape[2:])}, the output is {out}")
            if out[i] is None and isinstance(d, int):
                out[i] = d
    if ctx.has_input(3):
        bt = ctx.type(3)
        if bt.shape is not None and tuple(bt.shape) not in ((oc,), (None,)):
            ctx.fail(f"B {bt} must have shape ({oc},)")
    if ctx.has_input(4):
        mt = ctx.type(4)
        if mt.shape is not None and (len(mt.shape) != 4 or mt.shape[1] not in (og * kh * kw, None)):
            ctx.fail(f"mask {mt} must be [N, offset_group * kH * kW = {og * kh * kw}, oH, oW]")
    return [TensorType(x.dtype, (n, oc, *out))]


register_op("DeformConv", category=Category.CONV, infer=_deform_conv_infer)
