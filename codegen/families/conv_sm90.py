"""1x1 NHWC convolutions (stride 1, no padding, one group) on the Hopper TMA GEMM (gemm_sm90).

Such a convolution is a GEMM in place: the input [N, H, W, Cin] is A [M = N*H*W, K = Cin] (K
contiguous), the weight [Cout, 1, 1, Cin] is B stored [N = Cout, K] (K-major), the output
[N, H, W, Cout] is [M, Cout] row-major. The conv's bias (its anchor input 2) becomes the first op of
the GEMM's epilogue, followed by the conv's own fused epilogue (residual add, ReLU, ...), so the
GEMM kernel runs every fused op; tensor maps address x and w directly.

Strided 1x1 convolutions (ResNet's downsampling shortcuts) and every other geometry stay on the
conv family's kernels: a strided A needs a gather or an im2col tensor map, not done here.
"""

from __future__ import annotations

import dataclasses
import logging

from graphc.codegen.families import gemm_sm90
from graphc.codegen.families.conv import ConvGeometry, conv_step, geometry
from graphc.codegen.families.gemm import OperandLayout, Problem
from graphc.codegen.kernel import KernelSource, StepContext
from graphc.errors import CompileError
from graphc.ir.types import DType
from graphc.ops.fused import ACC, IN, OP, EpilogueOp, Ref
from graphc.ops.registry import get_op

log = logging.getLogger(__name__)


def why_not(g: ConvGeometry, pads: tuple[int, ...]) -> str | None:
    """Why the convolution is not a GEMM in place, or None."""
    if g.layout != "nhwc":
        return "not NHWC"
    if g.dtype not in (DType.float16, DType.bfloat16):
        return f"{g.dtype.name} (the TMA GEMM takes float16 and bfloat16)"
    if g.kernel != (1, 1) or g.strides != (1, 1) or any(pads) or g.group != 1:
        return f"kernel {g.kernel}, strides {g.strides}, pads {pads}, group {g.group} (1x1, stride 1, no pad, group 1)"
    if g.out_spatial != g.in_spatial:
        return "output and input spatial sizes differ"
    return None


def _shift(r: Ref) -> Ref:
    """A reference of the conv's epilogue in the GEMM's, where op 0 is the bias add."""
    if r.kind == "acc":
        return OP(0)
    return OP(r.index + 1) if r.kind == "op" else r


def gemm_problem(ctx: StepContext) -> Problem | str:
    """The step's GEMM problem, or why it has none."""
    cs = conv_step(ctx)
    if cs is None:
        return "not a convolution"
    g = geometry(ctx, cs)
    a = cs.anchor_attrs
    pads = tuple(a.pads) if cs.anchor_op == "ConvNHWC" else ()
    why = why_not(g, pads)
    if why is not None:
        return why
    step = ctx.step
    epilogue, outputs = tuple(cs.epilogue), tuple(cs.outputs)
    if cs.n_anchor >= 3 and len(step.inputs) > 2 and step.inputs[2] is not None:
        bias = EpilogueOp("Add", get_op("Add").attrs(), (ACC, IN(2)))
        epilogue = (bias,) + tuple(dataclasses.replace(e, args=tuple(_shift(r) for r in e.args)) for e in epilogue)
        outputs = tuple(_shift(r) for r in outputs)
    m, n, k = g.m, g.k, g.c
    return Problem(
        dtype=g.dtype,
        M=m,
        N=n,
        K=k,
        a=OperandLayout(m, k, 1, []),
        b=OperandLayout(n, k, 1, []),
        batch_dims=[],
        out_shape=tuple(ctx.tensors[step.outputs[0]].shape),
        n_anchor=2,
        epilogue=epilogue,
        outputs=outputs,
    )


def generate(ctx: StepContext, params: dict | None = None) -> list[KernelSource]:
    """The TMA GEMM's kernels for a 1x1 convolution step (a CompileError where it is not one)."""
    prob = gemm_problem(ctx)
    if isinstance(prob, str):
        raise ctx.fail(f"no TMA GEMM for this convolution: {prob}")
    ks = gemm_sm90.generate(ctx, params, prob=prob, family="conv")
    for k in ks:
        k.params["variant"] = "tma_gemm"
    return ks


# ---- selection (measured on an H200, 2026-12-01: docs/results/gemm_sm90.md) --------------------
# tools/bench_conv_sm90.py, ResNet-50's 13 distinct stride-1 1x1 convs, fp16, bias (+ residual) + ReLU
# fused, ratio = cuDNN time / ours (the last of two runs, with the epilogue that loads its inputs
# before the shared-memory round):
# - batch 32 (M = 1568 .. 100352): the TMA GEMM 1.04-3.30x on every layer; the conv kernel ("tc")
#   0.47-1.41x.
# - batch 1 (M = 49 .. 3136): TMA 1.23-2.05x, tc 1.14-1.95x; TMA faster on every layer with
#   M >= 196, within 2% at M = 49 (7x7, Cin 512 and 2048).
# -> TMA for M >= 512 or Cin >= 256 (smaller problems with fewer channels: not measured).
# N = 64 fills half of a 128-column tile (TMA zero-fills the rest); fewer than 64 channels: not
# measured.
SELECT_MIN_M = 512
SELECT_MIN_CIN = 256
MIN_CHANNELS = 64


def selected(prob: Problem) -> bool:
    if gemm_sm90.unsupported(prob) is not None or prob.N < MIN_CHANNELS or prob.K < MIN_CHANNELS:
        return False
    return prob.M >= SELECT_MIN_M or prob.K >= SELECT_MIN_CIN


def select(ctx: StepContext) -> list[KernelSource]:
    """The TMA GEMM's kernels for a conv step where the rules choose it; [] elsewhere (the conv
    family's own kernel runs; logged)."""
    if ctx.precision not in ("fp16", "bf16"):
        return []
    try:
        prob = gemm_problem(ctx)
    except CompileError:
        return []
    if isinstance(prob, str):
        log.debug("%s: conv not on the TMA GEMM: %s", ctx.step.name, prob)
        return []
    if not selected(prob):
        log.debug("%s: conv not on the TMA GEMM (M=%d N=%d K=%d)", ctx.step.name, prob.M, prob.N, prob.K)
        return []
    return generate(ctx)
