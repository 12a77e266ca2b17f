"""FP8 engines: MatMul and Gemm with constant weights as FP8 E4M3 GEMMs, everything else fp16.

The int8 pass's candidates and calibration (passes/quantize_int8.py: calibrated_candidates), at the
same place in the pipeline (after folding and attention fusion, before epilogue fusion), in E4M3
floating point instead of integers:

    Div(x, s_x) -> Cast(float8e4m3fn, saturate=1)    the activation: round to nearest even,
                                                     saturating to +-448 (ONNX QuantizeLinear's
                                                     float8 arithmetic); one per tensor (Q, K and
                                                     V projections share theirs)
    graphc.MatMulFp8(x_q, w_q [N, K], alpha = s_x * s_w) -> float32    (fp32 accumulation)
    Add(y, bias)                                     Gemm's beta * C, or a MatMul's bias Add

with s_x = amax / 448 from the calibrator (graphc/calibrate.py; an fp8 compile defaults to
minmax) and one weight scale per tensor, s_w = max|w| / 448. Per-tensor weight scales keep the
whole dequantize in MatMulFp8's alpha, a float attribute no later pass retypes (an epilogue
constant would become fp16 under the precision pass: s_x * s_w is often below fp16's normal range);
E4M3's relative precision is the same across 2**17 of magnitude, so one scale per tensor costs
little against one per channel (the int8 path needs those: its levels are uniform).

The precision pass then stores every float tensor in fp16 (an fp8 engine is an fp16 engine whose
GEMMs read e4m3): MatMulFp8's output becomes fp16 (its `to`, as a Cast to float32 does), the bias,
the activation and residual after it fp16 as in any fp16 engine; epilogue fusion takes them into
the GEMM, and, where the GEMM's output only feeds the next layer's quantize, the Div and Cast too
(the next GEMM's e4m3 input written by this one's epilogue).

Conv stays fp16 (logged, and in the report's `quantization.fp16_convs`): graphc has no FP8
convolution kernel. s_x is rounded up to an fp16 value (at least 2**-24) so that the quantize's
divisor, which the precision pass stores in fp16, is the s_x of alpha.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import numpy as np

from graphc.ir.builder import GraphBuilder
from graphc.ir.graph import Graph, Node, Value
from graphc.ir.types import DType
from graphc.passes.quantize_int8 import Candidate, calibrated_candidates
from graphc.passes.rewrite import RewriteContext, Rewritten, rewrite_graph
from graphc.passes.target import Target
from graphc.runtime.reference.elementwise import cast_to
from graphc.runtime.reference.internal import INTERNAL_DOMAIN

log = logging.getLogger(__name__)

E4M3_MAX = 448.0  # float8e4m3fn's largest finite value
FP8_OPS = frozenset({"MatMul", "Gemm"})
TMA_K_ALIGN = 16  # the CUDA FP8 GEMM reads e4m3 rows through TMA: 16-byte aligned, K % 16 == 0
_FP16_TINY = float(np.finfo(np.float16).smallest_subnormal)


def activation_scale(amax: float) -> np.float32:
    """amax / 448, rounded up to the nearest fp16 value (at least fp16's smallest subnormal): the
    fp16 divisor of an fp16 engine's quantize is then this value exactly."""
    s = max(np.float32(amax / E4M3_MAX), np.float32(_FP16_TINY))
    h = np.float16(s)
    if np.float32(h) < s:
        h = np.nextafter(h, np.float16(np.inf))
    return np.float32(h)


def quantize_weight_fp8(w: np.ndarray) -> tuple[np.ndarray, np.float32]:
    """Per-tensor E4M3: (w / s_w rounded to nearest even in float8e4m3fn, s_w = max|w| / 448)."""
    w = np.asarray(w, np.float32)
    amax = float(np.max(np.abs(w))) if w.size else 0.0
    s = np.float32(amax / E4M3_MAX) if amax > 0 else np.float32(1.0)
    return cast_to(w / s, DType.float8e4m3fn, saturate=True), s


def quantize_activation(b: GraphBuilder, x: Value, scale: np.float32) -> Value:
    """x / scale in E4M3 (round to nearest even, saturating): the elementwise ops the CUDA
    epilogues and elementwise kernels render, and the CPU references run."""
    q = b.op("Div", [x, b.add_constant(np.float32(scale), f"{x.name}/fp8_scale")], name=f"{x.name}/fp8_div")
    return b.op("Cast", [q], {"to": DType.float8e4m3fn.value, "saturate": 1}, name=f"{x.name}/fp8_quantize")


def _emit(b: GraphBuilder, cand: Candidate, x_q: Value, s_x: np.float32) -> Value:
    node = cand.node
    w_q, s_w = quantize_weight_fp8(np.ascontiguousarray(cand.w.T))  # [N, K]: K-major, as the wgmma reads it
    alpha = float(np.float32(np.float64(s_x) * np.float64(s_w) * cand.alpha))
    w = b.add_constant(np.ascontiguousarray(w_q), f"{node.name}/w_fp8")
    y = b.add_node("MatMulFp8", [x_q, w], {"alpha": alpha}, name=f"{node.name}/fp8", domain=INTERNAL_DOMAIN).outputs[0]
    if cand.bias is not None:
        bias = np.ascontiguousarray(cand.bias.astype(np.float32))
        y = b.op("Add", [y, b.add_constant(bias, f"{node.name}/bias")], name=f"{node.name}/bias")
    return y


def quantize_fp8(graph: Graph, target: Target) -> Graph:
    """The float MatMul/Gemm with constant weights, as E4M3 GEMMs with calibrated activation scales."""
    if target.calibrator is None:
        return graph
    for n in fp16_convs(graph):
        log.info("fp8: Conv '%s' stays fp16 (no FP8 convolution kernel)", n)
    found, folded, amax = calibrated_candidates(graph, target, FP8_OPS, "fp8")
    if not found:
        return graph
    quant_x: dict[str, Value] = {}

    def visit(node: Node, ctx: RewriteContext) -> Rewritten | None:
        if node.name in folded:
            return None  # its bias Add takes it in
        cand = found.get(node.name)
        if cand is None:
            return None
        k = cand.w.shape[0]
        if target.is_cuda and k % TMA_K_ALIGN:
            log.info(
                "fp8: %s '%s' stays fp16: K=%d is not a multiple of %d (TMA rows)", node.op, node.name, k, TMA_K_ALIGN
            )
            return None
        a = float(amax.get(cand.x.name, 0.0))
        if not np.isfinite(a) or not a > 0:
            log.info("fp8: %s '%s' stays fp16: its input '%s' has amax %s", node.op, node.name, cand.x.name, a)
            return None
        s_x = activation_scale(a)
        x_q = quant_x.get(cand.x.name)
        if x_q is None:  # shared: the same tensor, the same amax, so the same scale
            x_q = quant_x[cand.x.name] = quantize_activation(ctx.b, ctx.new(cand.x), s_x)
        return Rewritten([_emit(ctx.b, cand, x_q, s_x)], cand.absorbed)

    return rewrite_graph(graph, visit)


def _anchor(n: Node) -> tuple[str | None, str]:
    if n.op == "Fused" and n.domain == INTERNAL_DOMAIN:
        return n.attrs.anchor_op, n.attrs.anchor_domain or ""
    return n.op, n.domain


def fp16_convs(graph: Graph) -> list[str]:
    """The convolutions (plain, fused or channels-last) an fp8 engine keeps in fp16."""
    return [n.name for n in graph.nodes if _anchor(n)[0] in ("Conv", "ConvNHWC")]


def fp8_report(graph: Graph, thresholds: Mapping[str, float]) -> dict[str, Any]:
    """The report's fp8 summary of an optimized graph: its E4M3 GEMMs; where the activations'
    quantize runs (in the epilogue of the kernel that makes the activation, or a kernel of its own);
    the convolutions kept fp16; each calibrated tensor's amax and E4M3 scale."""
    gemms = sum(_anchor(n) == ("MatMulFp8", INTERNAL_DOMAIN) for n in graph.nodes)
    in_epilogue, own = 0, 0
    for n in graph.nodes:
        casts = [n] if n.op == "Cast" and not n.domain else []
        if n.op == "Fused" and n.domain == INTERNAL_DOMAIN:
            casts = [e for e in n.attrs.epilogue if e.op == "Cast"]
        for c in casts:
            if c.attrs.to == DType.float8e4m3fn.value:
                if n.op == "Fused" and n.attrs.anchor_op is not None:
                    in_epilogue += 1
                else:
                    own += 1
    return {
        "fp8_gemms": gemms,
        "activation_quantize": {"in_producer_epilogue": in_epilogue, "own_kernel": own},
        "fp16_convs": fp16_convs(graph),
        "weight_scales": "per-tensor",
        "tensors": {
            k: {"amax": v, "scale": float(activation_scale(v))} for k, v in sorted(thresholds.items()) if v > 0
        },
    }


__all__ = ["quantize_fp8", "activation_scale", "quantize_weight_fp8", "fp16_convs", "fp8_report", "E4M3_MAX"]
