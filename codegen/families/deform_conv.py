"""The deform_conv family: ONNX DeformConv (2-D, opsets 19 and 22) as a direct kernel, one thread
per output element (n, oc, i, j), as the numpy reference (graphc/runtime/reference/deform_conv.py,
ONNX's definition) computes it: for each input channel of the output channel's group and each tap
(a, b), the sample at (i * sh - pad_top + a * dh + dy, j * sw - pad_left + b * dw + dx), (dy, dx)
the offset of the channel's offset group, read by bilinear interpolation with each corner outside
the image counting 0, times the mask (1 without), times W; plus B.

A correctness kernel for the detection models that carry the op (deformable convolution v1/v2),
not a fast one: Cg * kH * kW taps of four gathers per output element, no data reuse. Accumulates
in float32 (double for float64), 16-bit tensors read and written in their storage type.
"""

from __future__ import annotations

from graphc.codegen.cuda_types import cuda_type, dtype_from_numpy_name
from graphc.codegen.expr import lit
from graphc.codegen.families.data import BLOCK
from graphc.codegen.kernel import KernelSource, StepContext, grid_1d, register_family, render
from graphc.ir.types import DType
from graphc.runtime.reference.deform_conv import deform_geometry

_FLOATS = (DType.float16, DType.bfloat16, DType.float32, DType.float64)


def _matches(ctx: StepContext) -> bool:
    return ctx.step.op == "DeformConv" and ctx.step.domain == ""


def _generate(ctx: StepContext) -> list[KernelSource]:
    step = ctx.step
    where = f"{step.kind} node '{step.name}': "
    a = ctx.attrs
    x, w, off = ctx.input_spec(0), ctx.input_spec(1), ctx.input_spec(2)
    assert x is not None and w is not None and off is not None
    b, mask = ctx.input_spec(3), ctx.input_spec(4)
    dt = dtype_from_numpy_name(x.dtype)
    if dt not in _FLOATS:
        raise ctx.fail(f"DeformConv of {dt.name} has no CUDA kernel (float types only)")
    n, c, h, wd = (int(d) for d in x.shape)
    oc, cg, kh, kw = (int(d) for d in w.shape)
    oh, ow = (int(d) for d in off.shape[2:])
    groups, og = int(a.group), int(a.offset_group)
    (sh, sw), (dh, dw), (pt, pl, _pb, _pr) = deform_geometry(a)
    total = n * oc * oh * ow
    if total == 0:
        return []
    work = "double" if dt is DType.float64 else "float"
    t = cuda_type(dt, where)
    name = ctx.kernel_name()
    block = int((ctx.params or {}).get("block", BLOCK))
    source = render(
        "deform_conv.cu.j2",
        name=name,
        block=block,
        total=total,
        t=t,
        w=work,
        zero=lit(0.0, work),
        one=lit(1.0, work),
        has_bias=b is not None,
        has_mask=mask is not None,
        C=c,
        H=h,
        W=wd,
        OC=oc,
        CG=cg,
        OCG=oc // groups,
        KH=kh,
        KW=kw,
        OH=oh,
        OW=ow,
        CPO=c // og,
        SH=sh,
        SW=sw,
        DH=dh,
        DW=dw,
        PT=pt,
        PL=pl,
    )
    args = [step.inputs[0], step.inputs[1], step.inputs[2]]
    args += [step.inputs[3]] if b is not None else []
    args += [step.inputs[4]] if mask is not None else []
    args.append(step.outputs[0])
    params = {"block": block, "taps": cg * kh * kw}
    return [KernelSource("deform_conv", name, source, grid_1d(total, block), (block, 1, 1), args, params=params)]


def _search_space(ctx: StepContext) -> list[dict[str, int]]:
    return [{"block": blk} for blk in (128, 256)]


register_family("deform_conv", _matches, _generate, _search_space)
