"""The roi_align family: ONNX RoiAlign (opsets 10 and 16; 10 is read as output_half_pixel when the
model loads) as a direct kernel, one thread per output element (roi, channel, bin row, bin column),
as the numpy reference (graphc/runtime/reference/sampling.py roi_align, ONNX's definition)
computes it: the box scaled by spatial_scale (minus half a pixel under half_pixel; at least 1 x 1
under output_half_pixel), per bin a grid of sampling_ratio (or ceil(bin size)) samples per axis,
each bilinear with the sample clamped to the last pixel at the far edge and counting 0 outside
[-1, size]; avg takes their mean, max the largest of every sample's four weighted corners (ONNX's
definition, not the interpolated values). Coordinates and sums in double, as the reference's
float64; 16-bit X read and written in its storage type. A batch index outside X writes 0 (the CPU
target raises; support.CUDA_CONDITIONS says so).
"""

from __future__ import annotations

from graphc.codegen.cuda_types import cuda_type, dtype_from_numpy_name
from graphc.codegen.expr import lit
from graphc.codegen.families.data import BLOCK
from graphc.codegen.kernel import KernelSource, StepContext, grid_1d, register_family, render
from graphc.ir.types import DType

_FLOATS = (DType.float16, DType.bfloat16, DType.float32, DType.float64)


def _matches(ctx: StepContext) -> bool:
    return ctx.step.op == "RoiAlign" and ctx.step.domain == ""


def _generate(ctx: StepContext) -> list[KernelSource]:
    step = ctx.step
    where = f"{step.kind} node '{step.name}': "
    a = ctx.attrs
    x, rois = ctx.input_spec(0), ctx.input_spec(1)
    assert x is not None and rois is not None
    dt = dtype_from_numpy_name(x.dtype)
    if dt not in _FLOATS or dtype_from_numpy_name(rois.dtype) != dt:
        raise ctx.fail(f"RoiAlign of {dt.name} X and {rois.dtype} rois has no CUDA kernel (one float type)")
    if a.mode not in ("avg", "max"):
        raise ctx.fail(f"RoiAlign mode {a.mode!r} has no CUDA kernel (avg or max)")
    n, c, h, w = (int(d) for d in x.shape)
    r = int(rois.shape[0])
    oh, ow = int(a.output_height), int(a.output_width)
    total = r * c * oh * ow
    if total == 0:
        return []
    name = ctx.kernel_name()
    block = int((ctx.params or {}).get("block", BLOCK))
    source = render(
        "roi_align.cu.j2",
        name=name,
        block=block,
        total=total,
        t=cuda_type(dt, where),
        N=n,
        C=c,
        H=h,
        W=w,
        OH=oh,
        OW=ow,
        scale=lit(float(a.spatial_scale), "double"),
        half_pixel=a.coordinate_transformation_mode == "half_pixel",
        sampling=int(a.sampling_ratio),
        mode=a.mode,
    )
    args = [step.inputs[0], step.inputs[1], step.inputs[2], step.outputs[0]]
    params = {"block": block, "mode": a.mode}
    return [KernelSource("roi_align", name, source, grid_1d(total, block), (block, 1, 1), args, params=params)]


def _search_space(ctx: StepContext) -> list[dict[str, int]]:
    return [{"block": blk} for blk in (128, 256)]


register_family("roi_align", _matches, _generate, _search_space)
