"""QuantizeLinear and DequantizeLinear as elementwise arithmetic, for the kernels that exist.

A QDQ model (ONNX Runtime's and PyTorch's quantization format) carries DequantizeLinear after its
int8 weights and QuantizeLinear -> DequantizeLinear pairs on activations. Constant folding (run
before this pass) already turns DequantizeLinear of a constant weight into a float weight with the
op's own reference; what remains are the activation pairs, which become

    Quantize:   Cast(Clip(Round(Div(x, s)) + zp, lo, hi), T)   (the division in x's and s's type)
    Dequantize: Mul(Sub(Cast(x, float32), zp), s) [-> Cast]     (float32 arithmetic)

with scale and zero point laid out as constants that broadcast along the quantized axis (per-tensor,
per-axis and blocked scales alike). Elementwise and epilogue fusion then fold a pair into the
kernel before it (a conv's epilogue, say): the engine computes in float and reproduces the
quantization error exactly, without integer kernels. That is the semantics of the QDQ format, not
int8 speed; int8 tensor-core GEMMs are not part of graphc yet.

Decomposed: integer types of 8 and 16 bits (and int32 for Dequantize), float inputs, constant
scales and zero points. The rest (float8 and 4-bit types, scales computed at run time) stay
QuantizeLinear/DequantizeLinear nodes: the CPU engine runs them, and the CUDA target reports them
as ops without a kernel. One difference from the op's reference: a NaN input quantizes to the
range's low end there and to whatever the float-to-int conversion of the target gives here.
"""

from __future__ import annotations

import logging

import ml_dtypes
import numpy as np

from graphc.ir.builder import GraphBuilder
from graphc.ir.graph import Graph, Node, Value
from graphc.ir.types import DType
from graphc.ops.quantize import INT_RANGES, broadcast_param, division_dtype
from graphc.passes.rewrite import Const, Match, Op, Rule, Var, apply_rules_counted, static_shape

log = logging.getLogger(__name__)

RULE_Q = "quantize(x, s, zp) -> cast(clip(round(x / s) + zp, lo, hi))"
RULE_DQ = "dequantize(x, s, zp) -> (float(x) - zp) * s"

QUANT_OUT = frozenset({DType.int8, DType.uint8, DType.int16, DType.uint16})
DEQUANT_IN = QUANT_OUT | {DType.int32}
FLOATS = frozenset({DType.float32, DType.float16, DType.bfloat16, DType.float64})


def _zero_point(m: Match) -> np.ndarray | None | bool:
    """The constant zero point, None when the node has none, False when it is not a constant."""
    root: Node = m.root
    if len(root.inputs) < 3 or root.inputs[2] is None:
        return None
    zp = m.graph.const(root.inputs[2].name)
    return False if zp is None else zp


def _quantize(m: Match, b: GraphBuilder) -> Value | None:
    root: Node = m.root
    x = m.value("x")
    out = root.outputs[0].ttype.dtype
    shape = static_shape(root.inputs[0])
    zp = _zero_point(m)
    if out not in QUANT_OUT or x.ttype.dtype not in FLOATS | {DType.int32} or shape is None or zp is False:
        return None
    a = root.attrs
    s = m.const("s")
    div = DType.from_numpy(division_dtype(x.ttype.dtype.numpy, s.dtype, a.precision))
    work = DType.float64 if div is DType.float64 else DType.float32
    name = root.name
    xd = x if x.ttype.dtype is div else b.op("Cast", [x], {"to": div.value}, name=f"{name}/x")
    s_b = np.ascontiguousarray(broadcast_param(s, shape, a.axis, a.block_size).astype(div.numpy))
    q = b.op("Div", [xd, b.add_constant(s_b, f"{name}/scale")], name=f"{name}/div")
    if div is not work:
        q = b.op("Cast", [q], {"to": work.value}, name=f"{name}/widen")
    r = b.op("Round", [q], name=f"{name}/round")
    if zp is not None:
        zp_b = broadcast_param(zp, shape, a.axis, a.block_size).astype(work.numpy)
        r = b.op("Add", [r, b.add_constant(np.ascontiguousarray(zp_b), f"{name}/zero_point")], name=f"{name}/shift")
    lo, hi = INT_RANGES[out]
    lo_c = b.add_constant(np.array(lo, dtype=work.numpy), f"{name}/lo")
    hi_c = b.add_constant(np.array(hi, dtype=work.numpy), f"{name}/hi")
    c = b.op("Clip", [r, lo_c, hi_c], name=f"{name}/saturate")
    return b.op("Cast", [c], {"to": out.value}, name=name)


def _dequantize(m: Match, b: GraphBuilder) -> Value | None:
    root: Node = m.root
    x = m.value("x")
    out = root.outputs[0].ttype.dtype
    shape = static_shape(root.inputs[0])
    zp = _zero_point(m)
    if x.ttype.dtype not in DEQUANT_IN or out not in FLOATS or shape is None or zp is False:
        return None
    a = root.attrs
    s = m.const("s")
    if s.dtype.kind != "f" and s.dtype != np.dtype(ml_dtypes.bfloat16):
        return None
    name = root.name
    y = b.op("Cast", [x], {"to": DType.float32.value}, name=f"{name}/widen")
    if zp is not None:
        zp_b = broadcast_param(zp, shape, a.axis, a.block_size).astype(np.float32)
        y = b.op("Sub", [y, b.add_constant(np.ascontiguousarray(zp_b), f"{name}/zero_point")], name=f"{name}/shift")
    s_b = broadcast_param(s, shape, a.axis, a.block_size).astype(np.float32)
    if out is DType.float32:
        return b.op("Mul", [y, b.add_constant(np.ascontiguousarray(s_b), f"{name}/scale")], name=name)
    y = b.op("Mul", [y, b.add_constant(np.ascontiguousarray(s_b), f"{name}/scale")], name=f"{name}/scaled")
    return b.op("Cast", [y], {"to": out.value}, name=name)


RULES = [
    Rule(RULE_Q, Op("QuantizeLinear", Var("x"), Const("s"), any_inputs=True), _quantize),
    Rule(RULE_DQ, Op("DequantizeLinear", Var("x"), Const("s"), any_inputs=True), _dequantize),
]


def decompose_qdq(graph: Graph, *, fired: list[str] | None = None) -> Graph:
    """The two rewrites above, one sweep (their results hold no Quantize/DequantizeLinear)."""
    return apply_rules_counted(graph, RULES, "Quantize/DequantizeLinear nodes as elementwise ops", fired=fired)
