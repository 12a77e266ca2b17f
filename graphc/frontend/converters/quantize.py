"""Converters of QuantizeLinear and DequantizeLinear.

Every version from 10 reads as the newest: 13 added `axis` (per-axis scales), 19 `saturate` and
float8, 21 `block_size`, `output_dtype` and the 4- and 16-bit types, 23 `precision` (Quantize) and
`output_dtype` (Dequantize); later versions only added types. An older node leaves those attributes
out, and their defaults (axis 1, saturate 1, block_size 0, no output_dtype or precision) give the
older meaning: a scalar scale is per-tensor whatever the axis.

QLinearMatMul and QLinearConv (below) become DequantizeLinear -> MatMul/Conv -> QuantizeLinear.
"""

from __future__ import annotations

from graphc.frontend.context import ConvertContext
from graphc.frontend.registry import converter, passthrough
from graphc.ir.graph import Value

passthrough("QuantizeLinear", "DequantizeLinear", since=10)


# ---- QLinearMatMul, QLinearConv: dequantize, compute in float, quantize -------------------------
#
# ONNX defines both with an exact integer accumulation, then one rescale by
# a_scale * b_scale / y_scale and a rounding. graphc has no integer GEMM or convolution kernels, so
# they become DequantizeLinear -> MatMul/Conv -> QuantizeLinear, the QDQ form ONNX Runtime's
# quantizer writes for the same models, which then fuses like any QDQ graph. The float sum can
# differ from the integer one in its last bits, so an output on a rounding boundary may land one
# quantization step away from the integer definition (tests/graphc/ops/test_quantize.py measures it).


def _output_type_attrs(ctx: ConvertContext, zero_point: Value | None, like: Value) -> dict[str, int]:
    """Without a zero point the output has the quantized input's type (the ops' definition), where
    QuantizeLinear would default to uint8."""
    return {} if zero_point is not None else {"output_dtype": like.ttype.dtype.value}


@converter("QLinearMatMul", since=10)
def _qlinear_matmul(ctx: ConvertContext) -> list[Value]:
    a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp = (ctx.input(i) for i in range(8))
    # a and y are quantized per row (axis -2) where their scales are 1-D, b per column (axis -1).
    ad = ctx.op("DequantizeLinear", [a, a_scale, a_zp], {"axis": -2}, name=f"{ctx.name}/a")
    bd = ctx.op("DequantizeLinear", [b, b_scale, b_zp], {"axis": -1}, name=f"{ctx.name}/b")
    y = ctx.op("MatMul", [ad, bd], name=f"{ctx.name}/matmul")
    attrs = {"axis": -2, **_output_type_attrs(ctx, y_zp, a)}
    node = ctx.emit("QuantizeLinear", [y, y_scale, y_zp], attrs, outputs=ctx.output_names[:1], name=ctx.name)
    return [node.outputs[0]]


@converter("QLinearConv", since=10)
def _qlinear_conv(ctx: ConvertContext) -> list[Value]:
    x, x_scale, x_zp, w, w_scale, w_zp, y_scale, y_zp = (ctx.input(i) for i in range(8))
    bias = ctx.input(8)
    xd = ctx.op("DequantizeLinear", [x, x_scale, x_zp], name=f"{ctx.name}/x")
    wd = ctx.op("DequantizeLinear", [w, w_scale, w_zp], {"axis": 0}, name=f"{ctx.name}/w")
    bd = None
    if bias is not None:  # int32 in units of x_scale * w_scale (per output channel), no zero point
        b_scale = ctx.op("Mul", [x_scale, w_scale], name=f"{ctx.name}/bias_scale")
        bd = ctx.op("DequantizeLinear", [bias, b_scale], {"axis": 0}, name=f"{ctx.name}/bias")
    y = ctx.op("Conv", [xd, wd, bd], dict(ctx.attrs), name=f"{ctx.name}/conv")
    node = ctx.emit(
        "QuantizeLinear",
        [y, y_scale, y_zp],
        _output_type_attrs(ctx, y_zp, x),
        outputs=ctx.output_names[:1],
        name=ctx.name,
    )
    return [node.outputs[0]]
