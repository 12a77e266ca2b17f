"""The pool family: ONNX MaxPool / AveragePool (NCHW, 1-D to 3-D; MaxPool's Indices output too) and
the channels-last internal ops graphc.MaxPoolNHWC, graphc.AveragePoolNHWC,
graphc.GlobalAveragePoolNHWC, graphc.GlobalMaxPoolNHWC; plain or as a Fused node's anchor.

ONNX GlobalAveragePool / GlobalMaxPool (NCHW) are reductions over the spatial axes: the reduction
family's, not this one's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from graphc.codegen.cuda_types import cuda_type, dtype_from_numpy_name
from graphc.codegen.epilogue import render_epilogue
from graphc.codegen.families.elementwise import operands
from graphc.codegen.kernel import KernelSource, StepContext, ceil_div, grid_1d, register_family, render
from graphc.ir.types import DType
from graphc.ops.fused import ACC, EpilogueOp, Ref
from graphc.ops.layout_ops import LAYOUT_DOMAIN
from graphc.ops.nn import window_geometry

_WINDOW = {
    ("MaxPool", ""): ("max", "nchw"),
    ("AveragePool", ""): ("avg", "nchw"),
    ("MaxPoolNHWC", LAYOUT_DOMAIN): ("max", "nhwc"),
    ("AveragePoolNHWC", LAYOUT_DOMAIN): ("avg", "nhwc"),
}
_GLOBAL = {
    ("GlobalMaxPoolNHWC", LAYOUT_DOMAIN): "max",
    ("GlobalAveragePoolNHWC", LAYOUT_DOMAIN): "avg",
}
_LOWEST = {DType.int8: "-128", DType.uint8: "0"}


@dataclass(frozen=True)
class PoolStep:
    op: str
    domain: str
    attrs: Any
    epilogue: tuple[EpilogueOp, ...]
    outputs: tuple[Ref, ...]
    fused: bool


def pool_step(ctx: StepContext) -> PoolStep | None:
    step = ctx.step
    if step.op == "Fused" and step.domain == "graphc":
        fa = ctx.attrs
        key = (fa.anchor_op, fa.anchor_domain)
        if key not in _WINDOW and key not in _GLOBAL:
            return None
        return PoolStep(fa.anchor_op, fa.anchor_domain, fa.anchor_attrs, fa.epilogue, fa.outputs, True)
    key = (step.op, step.domain)
    if key not in _WINDOW and key not in _GLOBAL:
        return None
    attrs = ctx.attrs
    return PoolStep(step.op, step.domain, attrs, (), (ACC,), False)


def _matches(ctx: StepContext) -> bool:
    return pool_step(ctx) is not None


def _generate(ctx: StepContext) -> list[KernelSource]:
    ps = pool_step(ctx)
    assert ps is not None
    step = ctx.step
    where = f"{step.kind} node '{step.name}': "
    x = ctx.input_spec(0)
    assert x is not None
    dtype = dtype_from_numpy_name(x.dtype)
    ct = cuda_type(dtype, where)
    name = ctx.kernel_name()
    epi_name = f"{name}_epi"
    # MaxPool's Indices (a plain ONNX MaxPool with two outputs) are stored by the template itself.
    indices = not ps.fused and ps.op == "MaxPool" and len(step.outputs) > 1
    value_outputs = step.outputs[:1] if indices else step.outputs
    out_specs = [ctx.tensors[o] for o in value_outputs]
    out_shape = tuple(out_specs[0].shape)
    rendered = render_epilogue(
        ps.epilogue, ps.outputs, operands(ctx), out_specs, out_shape, dtype, where=where, name=epi_name
    )
    common = {
        "name": name,
        "epilogue": rendered,
        "epi_name": epi_name,
        "T": ct.storage,
        "ct": ct.compute,
        "load_v": ct.to_compute("v"),
        "acc_t": "double" if dtype is DType.float64 else "float",
        "indices": indices,
    }
    args = [step.inputs[0]] + [step.inputs[i] for i in rendered.inputs] + list(value_outputs)
    key = (ps.op, ps.domain)
    if key in _GLOBAL:
        if dtype not in (DType.float16, DType.bfloat16, DType.float32):
            raise ctx.fail(f"{ps.op} of {dtype.name} has no CUDA kernel")
        n, h, w, c = x.shape
        source = render("pool.cu.j2", variant="global", op=_GLOBAL[key], C=c, HW=h * w, **common)
        grid = (ceil_div(c, 32), n, 1)
        return [KernelSource("pool", name, source, grid, (32, 8, 1), args, params={"variant": "global"})]
    op, layout = _WINDOW[key]
    if indices:
        args.append(step.outputs[1])
    if op == "max" and dtype not in (DType.float16, DType.bfloat16, DType.float32, DType.float64, *_LOWEST):
        raise ctx.fail(f"MaxPool of {dtype.name} has no CUDA kernel")
    geo = _window_vars(ctx, ps, layout, tuple(x.shape))
    lowest = _LOWEST.get(dtype, "(-__int_as_float(0x7f800000))" if ct.compute == "float" else "(-1.0/0.0)")
    total = math.prod(out_shape)
    source = render(
        "pool.cu.j2",
        variant="window",
        op=op,
        layout=layout,
        lowest=lowest,
        storage_order=int(getattr(ps.attrs, "storage_order", 0) or 0),
        total=total,
        **geo,
        **common,
    )
    return [KernelSource("pool", name, source, grid_1d(total, 256), (256, 1, 1), args, params={"variant": "window"})]


def _window_vars(ctx: StepContext, ps: PoolStep, layout: str, x_shape: tuple[int, ...]) -> dict[str, Any]:
    a = ps.attrs
    if layout == "nhwc":
        c = x_shape[3]
        spatial = tuple(x_shape[1:3])
        pb, pe = tuple(a.pads[:2]), tuple(a.pads[2:])
        kernel, strides, dil = tuple(a.kernel_shape), tuple(a.strides), tuple(a.dilations)
        out = tuple(ctx.tensors[ctx.step.outputs[0]].shape[1:3])
    else:
        c = x_shape[1]
        spatial = tuple(x_shape[2:])
        if len(spatial) > 3:
            raise ctx.fail(f"{len(spatial)}-D pooling has no CUDA kernel")

        def fail(msg: str):
            raise ctx.fail(msg)

        geom = window_geometry(a, spatial, a.kernel_shape, fail, ceil_mode=bool(a.ceil_mode))
        pb, pe = tuple(geom.pads_begin), tuple(geom.pads_end)
        kernel, strides, dil = geom.kernel, geom.strides, geom.dilations
        out = tuple(int(o) for o in geom.out)
    nd = len(spatial)

    def pad3(t, fill: int) -> list[int]:
        return [fill] * (3 - nd) + [int(v) for v in t]

    include = bool(getattr(a, "count_include_pad", 0))
    lo = [-b if include else 0 for b in pad3(pb, 0)]
    hi = [s + e if include else s for s, e in zip(pad3(spatial, 1), pad3(pe, 0), strict=True)]
    return {
        "C": c,
        "in_sp": pad3(spatial, 1),
        "out_sp": pad3(out, 1),
        "ker": pad3(kernel, 1),
        "strides": pad3(strides, 1),
        "pads": pad3(pb, 0),
        "pads_end": pad3(pe, 0),
        "dils": pad3(dil, 1),
        "lo_d": lo[0],
        "lo_h": lo[1],
        "lo_w": lo[2],
        "hi_d": hi[0],
        "hi_h": hi[1],
        "hi_w": hi[2],
    }


register_family("pool", _matches, _generate)
