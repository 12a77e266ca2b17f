"""The FP8 GEMM family: graphc.MatMulFp8 (plain, or the anchor of a Fused node) on the Hopper TMA
GEMM (templates/gemm_sm90.cu.j2 with Elem e4m3: wgmma m64nBNk32.f32.e4m3.e4m3, fp32 accumulators).

passes/quantize_fp8.py leaves, in an fp8 engine (fp16 storage),

    Fused[graphc.MatMulFp8](x_q [..., K] e4m3, w_q [N, K] e4m3; alpha) with epilogue
        [Add(bias)] [-> activation] [-> residual Add] [-> Div(s_next) -> Cast(float8e4m3fn)]

Both operands are K-major, the only layout the e4m3 wgmma reads (the int8 path writes its MatMuls
as a 1x1 ConvInteger of the rows for the same reason; MatMulFp8 takes [N, K] weights itself, so its
output is [..., N] with no view). The leading dims of A fold into M; A and B are read through
1-byte ("uint8") tensor maps. The kernel multiplies the fp32 accumulator by alpha (the dequantize
scale s_x * s_w, a literal), then runs the fused epilogue in fp32 as the fp16 GEMMs do, with the
accumulator typed as the anchor's output (fp16): the CPU engine's arithmetic (graphc.MatMulFp8's
reference: e4m3 products summed in fp32, times alpha, then the epilogue's ops) up to the order of
the fp32 sums and the epilogue's fp16 roundings between ops (the fused kernel keeps fp32 there).
An epilogue that ends in the next layer's quantize stores e4m3 bytes (cuda_types: a saturating,
round-to-nearest-even conversion).

sm_90a only: an fp8 engine for any other arch is refused before code generation
(check_fp8_archs). Not covered (a one-line error naming the node): K not a multiple of 16 (TMA
rows must be 16-byte aligned; passes/quantize_fp8.py keeps such layers fp16 on CUDA).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from graphc.codegen.cuda_types import cuda_type, dtype_from_numpy_name
from graphc.codegen.epilogue import step_operands
from graphc.codegen.expr import lit
from graphc.codegen.families import gemm_sm90 as sm90
from graphc.codegen.kernel import KernelSource, StepContext, register_family
from graphc.errors import CompileError
from graphc.ir.types import DType
from graphc.ops.fused import ACC
from graphc.ops.registry import Category, get_op

ANCHOR = ("graphc", "MatMulFp8")
# The archs an fp8 CUDA engine is built for: the e4m3 wgmma is sm_90a's (sm_89 has FP8 mma.sync, for
# which graphc has no kernel; sm_80/86 have no FP8 tensor cores at all).
FP8_ARCHS = ("sm_90",)


def check_fp8_archs(archs: Sequence[str]) -> None:
    """A one-line error naming the first arch an fp8 engine cannot be built for."""
    for a in archs:
        if a in FP8_ARCHS:
            continue
        major_minor = int("".join(ch for ch in a if ch.isdigit()) or 0)
        why = (
            "has FP8 tensor cores (mma.sync), but graphc's FP8 GEMM is the sm_90a wgmma kernel"
            if major_minor == 89
            else "has no FP8 tensor cores (FP8 needs sm_89+)"
            if major_minor < 89
            else "cannot load sm_90a (wgmma) kernels"
        )
        raise CompileError(f"precision fp8: arch {a} {why}; build the fp8 engine with --arch sm_90")


@dataclass
class Fp8Problem(sm90.KMajorOperands):
    """out [..., N] = epilogue(alpha * A [M, K] . B [N, K]^T), A's leading dims folded into M."""

    M: int
    N: int
    K: int
    alpha: float
    dtype: DType  # the anchor's output: the accumulator's type as the epilogue sees it
    out_shape: tuple[int, ...]
    epilogue: tuple = ()
    outputs: tuple = (ACC,)
    inputs: list[str] = field(default_factory=list)
    batch_dims: tuple = ()
    conv: None = None
    batch: int = 1


def problem_of(ctx: StepContext) -> Fp8Problem:
    step = ctx.step
    if get_op(step.op, step.domain).category is Category.FUSED:
        fa = ctx.attrs
        attrs, epilogue, outputs = fa.anchor_attrs, tuple(fa.epilogue), tuple(fa.outputs)
    else:
        attrs, epilogue, outputs = ctx.attrs, (), (ACC,)
    if len(step.inputs) < 2 or step.inputs[0] is None or step.inputs[1] is None:
        raise ctx.fail("MatMulFp8 needs two operands")
    xa, wb = ctx.spec(step.inputs[0]), ctx.spec(step.inputs[1])
    for what, spec in (("input", xa), ("weight", wb)):
        if dtype_from_numpy_name(spec.dtype) is not DType.float8e4m3fn:
            raise ctx.fail(f"MatMulFp8 {what} of {spec.dtype}: the FP8 GEMM takes float8e4m3fn operands")
    sa, sb = tuple(xa.shape), tuple(wb.shape)
    if len(sb) != 2 or not sa or sa[-1] != sb[1]:
        raise ctx.fail(f"MatMulFp8 of {sa} . {sb}^T: A [..., K] and B [N, K]")
    out_dtype = DType(attrs.to)
    return Fp8Problem(
        math.prod(sa[:-1]),
        sb[0],
        sb[1],
        float(attrs.alpha),
        out_dtype,
        tuple(ctx.spec(step.outputs[0]).shape),
        epilogue,
        outputs,
        [step.inputs[0], step.inputs[1]],
    )


KEYS = sm90.INT8_KEYS  # the 1-byte schedules' parameters (BN, STAGES, PINGPONG, OVERLAP, ...)


def _generate(ctx: StepContext) -> list[KernelSource]:
    """The e4m3 TMA GEMM of the step; ctx.params may force KEYS (a BN alone: cooperative, the
    deepest ring), else the 1-byte heuristic (gemm_sm90.int8_heuristic; FP8's rules where every
    output is 16-bit, int8's where the epilogue requantizes to one byte)."""
    step = ctx.step
    where = f"{step.kind} node '{step.name}'"
    prob = problem_of(ctx)
    if prob.M * prob.N == 0:
        return []
    why = sm90.int8_unsupported(prob)
    if why is not None:
        raise ctx.fail(f"no FP8 TMA GEMM: {why}")
    params = {k: v for k, v in (ctx.params or {}).items() if k in KEYS}
    vec_epi, fast_div = params.pop("VEC_EPI", 1), params.pop("FAST_DIV", 1)
    if vec_epi not in (0, 1, 2) or fast_div not in (0, 1):
        raise ctx.fail(f"FP8 TMA GEMM parameters VEC_EPI={vec_epi!r} (0, 1, 2), FAST_DIV={fast_div!r} (0, 1)")
    ops = step_operands(ctx)
    out_specs = [ctx.tensors[o] for o in step.outputs]
    byte_out = any(dtype_from_numpy_name(s.dtype).itemsize == 1 for s in out_specs)
    if "BN" in params:
        stages = sm90.max_stages(params["BN"]) if params["BN"] in sm90.BNS else 0
        p = {"SPLITS": 1, "PINGPONG": 0, "OVERLAP": 0, "STAGES": stages, **params}
    else:
        vec_ok = vec_epi == 1 and sm90.vec_epilogue_ok(prob, ops, out_specs, byte_outputs=True)
        p = {**sm90.int8_heuristic(prob, vec_ok, light_epilogue=not byte_out), **params}
    if not sm90.int8_valid(prob, p):
        raise ctx.fail(f"FP8 TMA GEMM parameters {p} are not valid for M={prob.M} N={prob.N} K={prob.K}")
    ct = cuda_type(prob.dtype, where)
    return sm90.one_byte_kernel(
        ctx,
        prob,
        ops,
        p,
        vec_epi,
        fast_div,
        elem=sm90.E4M3,
        acc_dtype=prob.dtype,
        types={
            "st": ct.storage,
            "ct": ct.compute,
            "alpha_lit": None if prob.alpha == 1.0 else lit(prob.alpha, ct.compute),
        },
        family="gemm_fp8",
        path="fp8_tma",
        extra={"alpha": prob.alpha},
    )


def _matches(ctx: StepContext) -> bool:
    step = ctx.step
    if get_op(step.op, step.domain).category is Category.FUSED:
        fa = ctx.attrs
        return (fa.anchor_domain, fa.anchor_op) == ANCHOR
    return (step.domain, step.op) == ANCHOR


def search_space(ctx: StepContext) -> list[dict[str, Any]]:
    """The tile widths and schedules the 1-byte TMA GEMM takes for this problem."""
    prob = problem_of(ctx)
    out = []
    for bn in sm90.BNS:
        for pp, ov in ((0, 0), (1, 0), (0, 1)):
            p = {"BN": bn, "STAGES": sm90.max_stages(bn), "SPLITS": 1, "PINGPONG": pp, "OVERLAP": ov}
            if sm90.int8_valid(prob, p):
                out.append({k: v for k, v in p.items() if k != "SPLITS"})
    return out


register_family("gemm_fp8", _matches, _generate, search_space)
