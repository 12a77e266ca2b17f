"""The grid_sample family: ONNX GridSample (opset 20+ form) on N-D inputs [N, C, *in] with a grid
[N, *out, nd], one thread per output element (a memory-bound gather), as the numpy reference
(graphc/runtime/reference/sampling.py, the ONNX node tests' rules) computes it:

- grid[..., 0] is the last spatial axis; a coordinate is denormalized per axis,
  align_corners=1: (v + 1) / 2 * (size - 1), align_corners=0: ((v + 1) * size - 1) / 2;
- nearest rounds half to even (rint);
- a coordinate outside [lo, hi] (pixel centres 0 .. size-1 with align_corners=1, pixel edges
  -0.5 .. size-0.5 without) is clamped to [0, size-1] (border; not for cubic, whose taps are
  clamped instead) or reflected by the nearer border until inside (reflection);
- each tap (nearest 1, linear 2, cubic 4 per axis: Keys' kernel with a = -0.75) outside the input
  reads 0 (zeros: its weight is 0, the clamped pixel still read, as the reference multiplies it
  by 0), the clamped pixel (border) or the reflected pixel (reflection, the tap index reflected
  by the same bounds and truncated);
- weights are the product of the axes' 1-D weights, the taps summed with the last axis fastest.

Nearest and linear take any number of spatial axes (cubic is 2-D only, as the op's type inference
and the reference define it). Coordinates are computed in double as the reference computes them
in float64, op for op with no fma contraction, so the rounding of nearest (ties included), the
clamps and reflections and the choice of taps are the reference's exactly (a float32 coordinate
could round a grid value a float32 rounding away from a tie the other way). Weights and the sum
are float32 (double for float64 X or grid), 16-bit X read and written as its storage type: the
result is the reference's to float32 rounding, nearest's a copy of the sampled element.
"""

from __future__ import annotations

import math

from graphc.codegen.cuda_types import cuda_type, dtype_from_numpy_name
from graphc.codegen.expr import lit
from graphc.codegen.families.data import BLOCK, strides_of
from graphc.codegen.kernel import KernelSource, StepContext, grid_1d, register_family, render
from graphc.ir.types import DType

MODES = ("nearest", "linear", "cubic")
PADDINGS = ("zeros", "border", "reflection")
_FLOATS = (DType.float16, DType.bfloat16, DType.float32, DType.float64)


def _matches(ctx: StepContext) -> bool:
    return ctx.step.op == "GridSample" and ctx.step.domain == ""


def _generate(ctx: StepContext) -> list[KernelSource]:
    step = ctx.step
    where = f"{step.kind} node '{step.name}': "
    a = ctx.attrs
    mode, padding, align = a.mode, a.padding_mode, bool(a.align_corners)
    if mode not in MODES:
        raise ctx.fail(f"GridSample mode {mode!r} has no CUDA kernel (nearest, linear or cubic)")
    if padding not in PADDINGS:
        raise ctx.fail(f"GridSample padding_mode {padding!r} has no CUDA kernel (zeros, border or reflection)")
    x, grid = ctx.input_spec(0), ctx.input_spec(1)
    assert x is not None and grid is not None
    xdt, gdt = dtype_from_numpy_name(x.dtype), dtype_from_numpy_name(grid.dtype)
    if xdt not in _FLOATS or gdt not in _FLOATS:
        raise ctx.fail(f"GridSample of {xdt.name} X and {gdt.name} grid has no CUDA kernel (float types only)")
    xshape = tuple(int(d) for d in x.shape)
    gshape = tuple(int(d) for d in grid.shape)
    yshape = tuple(int(d) for d in ctx.spec(step.outputs[0]).shape)
    nd = len(xshape) - 2
    if nd < 1 or len(gshape) != nd + 2 or gshape[-1] != nd:
        raise ctx.fail(f"GridSample grid {list(gshape)} does not match X {list(xshape)} ({nd} spatial axes)")
    if mode == "cubic" and nd != 2:
        raise ctx.fail(f"GridSample cubic mode is defined for 2-D inputs only, this one has {nd} spatial axes")
    total = math.prod(yshape)
    if total == 0:
        return []  # nothing to write
    in_sp = xshape[2:]
    if math.prod(in_sp) == 0:
        raise ctx.fail(f"GridSample of an empty input ({list(xshape)}) has no CUDA kernel")
    work = "double" if DType.float64 in (xdt, gdt) else "float"
    taps = {"nearest": 1, "linear": 2, "cubic": 4}[mode]
    axes = []
    for d, (size, stride) in enumerate(zip(in_sp, strides_of(in_sp), strict=True)):
        lo, hi = (0.0, size - 1.0) if align else (-0.5, size - 0.5)
        axes.append(
            {
                "d": d,
                "comp": nd - 1 - d,  # grid[..., 0] is the last spatial axis
                "size": lit(size, "double"),  # coordinates are double (the reference's float64)
                "size_m1": lit(size - 1, "double"),
                "lo": lit(lo, "double"),
                "hi": lit(hi, "double"),
                "last": size - 1,
                "stride": stride,
            }
        )
    name = ctx.kernel_name()
    block = int((ctx.params or {}).get("block", BLOCK))
    xt, gt = cuda_type(xdt, where), cuda_type(gdt, where)
    source = render(
        "grid_sample.cu.j2",
        name=name,
        block=block,
        total=total,
        mode=mode,
        padding=padding,
        align=align,
        taps=taps,
        axes=axes,
        nd=nd,
        channels=xshape[1],
        in_sp=math.prod(in_sp),
        out_sp=math.prod(gshape[1:-1]),
        w=work,
        xt=xt,
        gt=gt,
        one=lit(1.0, work),
        two=lit(2.0, work),
        zero=lit(0.0, work),
    )
    params = {"mode": mode, "padding_mode": padding, "align_corners": int(align), "nd": nd, "block": block}
    args = [step.inputs[0], step.inputs[1], step.outputs[0]]
    return [KernelSource("grid_sample", name, source, grid_1d(total, block), (block, 1, 1), args, params=params)]


def _search_space(ctx: StepContext) -> list[dict[str, int]]:
    return [{"block": b} for b in (128, 256, 512)]


register_family("grid_sample", _matches, _generate, _search_space)
