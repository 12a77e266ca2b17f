"""Vendor tactics for GEMM steps: which steps of an engine compiled with `--tactics cublaslt` run
through cuBLASLt (runtime/tactics_cublaslt.py) instead of graphc's kernels, and their records.

A step goes to cuBLASLt when (1) cuBLASLt can compute exactly what the step computes (`lower`:
fp16/bf16 operands, fp32 accumulation, one batch dim at most, contiguous operands, and an epilogue
that is some of: a scalar scale of the product, a per-column bias, a residual of D's shape and
dtype added before any activation, one ReLU or GELU last, a final cast to fp32 where no bias or
C is of another dtype than that fp32 result) and (2) the rule (`prefer_vendor`, from H200
measurements against cuBLAS) says cuBLASLt is faster for its shape. Everything else keeps graphc's
kernels. Off unless named: the CLI's `--tactics cublaslt`, CompileOptions.tactics.

A final cast to fp32: cuBLASLt stores its fp32 accumulator as the fp32 result, where graphc's
epilogue rounds to fp16 first (exact_cast: bit for bit the separate Cast of the fp16 value); the
result differs by at most half an fp16 ulp of the value, towards the exact product.

GELU: cuBLASLt's GELU epilogue is the tanh approximation. A tanh GELU maps exactly. An erf GELU
(BERT's, ViT's) maps too, recorded as `gelu_from_erf`, because the two differ by at most 4.7e-4
in absolute value over the whole real line (at x = 2.70; measured in numpy over [-10, 10] step
1e-5, docs/tactics.md): under half an fp16 ulp (9.8e-4) of any output of magnitude 1 or more,
and below the rounding the fp16 GEMM result itself carries at K >= 768. The compile log and the
report count the steps where it happens, and `tactics_erf_gelu=False` in CompileOptions.extra
keeps those steps on graphc's kernels.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

from graphc.codegen.kernel import StepContext
from graphc.errors import CompileError
from graphc.ir.types import DType
from graphc.ops.fused import ACC, Ref
from graphc.runtime.tactics_cublaslt import VendorGemm

log = logging.getLogger(__name__)

TACTICS = ("cublaslt",)


def check_tactics(names: Any) -> tuple[str, ...]:
    """The tactic names of CompileOptions.tactics / --tactics, checked."""
    out = tuple(str(n).strip().lower() for n in (names or ()) if str(n).strip())
    bad = [n for n in out if n not in TACTICS]
    if bad:
        raise CompileError(f"unknown tactic {bad[0]!r}; the tactics are {', '.join(TACTICS)}")
    return out


def tactic_options(opts: Any) -> dict[str, Any]:
    """select()'s options from CompileOptions.extra: tactics_force (every step cuBLASLt can run, the
    measured rule aside: for benchmarks) and tactics_erf_gelu (map erf GELUs; default True)."""
    extra = getattr(opts, "extra", None) or {}
    prefer = extra.get("tactics_prefer")  # tools/bench_tactics.py: the shapes its own run measured faster
    return {
        "force": bool(extra.get("tactics_force", False)),
        "erf_gelu": bool(extra.get("tactics_erf_gelu", True)),
        "prefer": None if prefer is None else {tuple(k) for k in prefer},
    }


def shape_key(g: VendorGemm) -> tuple:
    """(batch, M, N, K, act, bias?, C?): what the measured rule and the benchmark's table see."""
    return (g.batch, g.m, g.n, g.k, g.act, g.bias is not None, g.c is not None)


@dataclass(frozen=True)
class Epilogue:
    """The epilogue as cuBLASLt runs it: act(alpha * AB + beta * C + bias), then a cast."""

    scale: float = 1.0
    bias: int | None = None  # node input index
    bias_stride: int = 0
    residual: int | None = None
    act: str = "none"
    gelu_from_erf: bool = False
    out_dtype: str | None = None  # a final Cast


def _scalar(ctx: StepContext, r: Ref) -> float | None:
    """The value of an input that is a one-element weight, else None."""
    if r.kind != "in" or r.index >= len(ctx.step.inputs) or ctx.step.inputs[r.index] is None:
        return None
    name = ctx.step.inputs[r.index]
    t = ctx.tensors[name]
    if t.kind != "weight" or math.prod(t.shape) != 1 or name not in ctx.weights:
        return None
    return float(ctx.weights[name].reshape(-1)[0])


def match_epilogue(ctx: StepContext, prob: Any, erf_gelu: bool = True) -> tuple[Epilogue | None, str]:
    """(the epilogue in cuBLASLt's terms, "") or (None, why it does not fit)."""
    ops = prob.epilogue
    cur = ACC
    ep = Epilogue()
    out_shape = tuple(prob.out_shape)
    acc_dtype = prob.dtype.numpy.name
    for j, e in enumerate(ops):
        here = Ref("op", j)
        if ep.out_dtype is not None:
            return None, f"{e.op} after the cast"
        if e.op in ("Relu", "Gelu"):
            if ep.act != "none" or len(e.args) != 1 or e.args[0] != cur:
                return None, f"a second activation or {e.op} of another value"
            if e.op == "Relu":
                ep = _replace(ep, act="relu")
            else:
                erf = getattr(e.attrs, "approximate", "none") != "tanh"
                if erf and not erf_gelu:
                    return None, "an erf GELU (tactics_erf_gelu is off)"
                ep = _replace(ep, act="gelu_tanh", gelu_from_erf=erf)
        elif e.op == "Add" and len(e.args) == 2 and cur in e.args:
            other = e.args[1] if e.args[0] == cur else e.args[0]
            if other.kind != "in" or ep.act != "none":
                return None, "an Add after the activation or of a computed value"
            spec = ctx.input_spec(other.index)
            if spec is None:
                return None, "an Add of a missing input"
            shape = tuple(spec.shape)
            per_batch = (  # a bias per batch of a batched GEMM (horizontally fused linears): [B, 1, N]
                prob.batch > 1 and len(prob.batch_dims) == 1 and shape[-2:] == (1, prob.N)
                and math.prod(shape) == prob.batch * prob.N and len(shape) == len(out_shape)
            )  # fmt: skip
            if (math.prod(shape) == prob.N and shape[-1:] == (prob.N,) or per_batch) and ep.bias is None:
                if spec.dtype != acc_dtype:
                    return None, f"a bias of {spec.dtype}"
                ep = _replace(ep, bias=other.index, bias_stride=prob.N if per_batch else 0)
            elif tuple(spec.shape) == out_shape and spec.dtype == acc_dtype and ep.residual is None:
                ep = _replace(ep, residual=other.index)
            else:
                return None, f"an Add of shape {spec.shape} (neither a bias of N={prob.N} nor a residual)"
        elif e.op == "Mul" and len(e.args) == 2 and cur in e.args and j == 0:
            v = _scalar(ctx, e.args[1] if e.args[0] == cur else e.args[0])
            if v is None:
                return None, "a Mul by a tensor"
            ep = _replace(ep, scale=ep.scale * v)
        elif e.op == "Cast" and len(e.args) == 1 and e.args[0] == cur:
            to = DType(int(e.attrs.to)) if not isinstance(e.attrs.to, DType) else e.attrs.to
            if to not in (DType.float32, prob.dtype):
                return None, f"a cast to {to.name}"
            if ep.residual is not None and to != prob.dtype:
                return None, "a residual of another dtype than the cast result"
            ep = _replace(ep, out_dtype=to.numpy.name)
        else:
            return None, f"a {e.op} epilogue"
        cur = here
    if tuple(prob.outputs) != (cur,):
        return None, "more than one output"
    return ep, ""


def _replace(ep: Epilogue, **kw: Any) -> Epilogue:
    import dataclasses

    return dataclasses.replace(ep, **kw)


def lower(ctx: StepContext, erf_gelu: bool = True) -> tuple[VendorGemm | None, str]:
    """The step's cuBLASLt record, or (None, why not): exact mappings only."""
    from graphc.codegen.families.gemm import problem_of

    try:
        prob = problem_of(ctx)
    except CompileError as e:
        return None, str(e)
    if prob.dtype not in (DType.float16, DType.bfloat16):
        return None, f"{prob.dtype.name} operands"
    if len(prob.batch_dims) > 1:
        return None, "more than one batch dim"
    if prob.c_index is not None and tuple(ctx.spec(ctx.step.inputs[prob.c_index]).shape) != tuple(prob.out_shape):
        return None, "Gemm's C broadcast"
    M, N, K = prob.M, prob.N, prob.K
    a, b = prob.a, prob.b
    a_trans = not a.kcontig
    if (a.sk, a.sr) != ((M, 1) if a_trans else (1, K)):
        return None, "A is not a packed matrix"
    b_trans = b.kcontig
    if (b.sk, b.sr) != ((1, K) if b_trans else (N, 1)):
        return None, "B is not a packed matrix"
    ep, why = match_epilogue(ctx, prob, erf_gelu)
    if ep is None:
        return None, why
    if prob.c_index is not None and ep.residual is not None:
        return None, "both Gemm's C and a residual"
    inputs = ctx.step.inputs
    c_index, beta = (prob.c_index, prob.beta) if prob.c_index is not None else (ep.residual, 1.0)
    out = ctx.step.outputs[0]
    out_dtype = ctx.spec(out).dtype
    if out_dtype != (ep.out_dtype or prob.dtype.numpy.name):
        return None, f"an output of {out_dtype}"
    if c_index is not None and ctx.spec(inputs[c_index]).dtype != out_dtype:
        return None, "C of another dtype than D"
    if ep.bias is not None and ctx.spec(inputs[ep.bias]).dtype != out_dtype:
        return None, "a bias of another dtype than D"
    batch = prob.batch
    strides = (prob.batch_dims[0][1], prob.batch_dims[0][2]) if prob.batch_dims else (0, 0)
    if c_index is not None and batch > 1 and tuple(ctx.spec(inputs[c_index]).shape) != tuple(prob.out_shape):
        return None, "a batched C of another shape than D"
    g = VendorGemm(
        m=M,
        n=N,
        k=K,
        a=inputs[0],
        b=inputs[1],
        d=out,
        batch=batch,
        a_trans=a_trans,
        b_trans=b_trans,
        a_stride=strides[0],
        b_stride=strides[1],
        d_stride=M * N if batch > 1 else 0,
        c=inputs[c_index] if c_index is not None else None,
        c_stride=M * N if (c_index is not None and batch > 1) else 0,
        beta=float(beta) if c_index is not None else 0.0,
        bias=inputs[ep.bias] if ep.bias is not None else None,
        bias_stride=ep.bias_stride,
        alpha=float(prob.alpha * ep.scale),
        act=ep.act,
        gelu_from_erf=ep.gelu_from_erf,
    )
    return g, ""


# ---- the rule ------------------------------------------------------------------------------------

# Where cuBLASLt is the faster GEMM on an H200: the in-engine measurement of tools/bench_tactics.py
# (each layer's GEMM with its own epilogue, 8 copies in one engine, graphc's kernels against the same
# engine with cuBLASLt forced; CUDA-graph replays; fp16; H200 2026-12-01 20:08 UTC;
# docs/results/tactics_h200_2026-12-01_2008.md). cuBLASLt / graphc speed:
#   M in {128, 197, 1024, 4096, 6304}, K = 768 (qkv, proj, ffn1 with bias+GELU): 1.01-2.90x -> cuBLASLt
#   M in {1024, 4096, 6304}, K = 3072 (ffn2, bias + residual): 1.15-1.45x                    -> cuBLASLt
#   M in {128, 197}, K = 3072 (graphc's TMA split-K 8): 0.84x, 0.98x                           -> graphc
#   lm_head M x 50257 x 768, B stored [N, K], M = 128 and 1024: 0.23x, 0.18x                  -> graphc
# (cuBLASLt's heuristic has no fast kernel for an output row of 50257 halves, not 16-byte aligned;
# graphc's TMA GEMM stores it with a masked epilogue.) The earlier rule, from graphc against
# torch.matmul alone (docs/results/gemm_sm90.md, gemm_mid_m_h200_2026-12-01.md,
# gemm_small_m_h200_2026-12-01.md), agreed except at M > 256 for the lm_head, which it gave to
# cuBLASLt: 5.6x slower in the engine at M = 1024.
SMALL_M = 256  # batch-1 linear layers (128 or 197 tokens)
GRAPHC_SPLIT_K_MIN_K = 3072  # at small M and this K graphc's split-K TMA GEMM matches cuBLASLt
GRAPHC_WIDE_N = 8192  # an lm_head with B stored [N, K]: graphc's TMA GEMM is 4-5x cuBLASLt at any M


def prefer_vendor(g: VendorGemm) -> bool:
    """Whether cuBLASLt is the faster choice for this GEMM on the H200 (the rule above)."""
    if g.m <= SMALL_M and g.k >= GRAPHC_SPLIT_K_MIN_K:
        return False
    return not (g.n >= GRAPHC_WIDE_N and g.b_trans)


def select(
    ctx: StepContext,
    tactics: tuple[str, ...],
    *,
    force: bool = False,
    erf_gelu: bool = True,
    prefer: set[tuple] | None = None,
) -> VendorGemm | None:
    """The step's vendor record where a named tactic takes it, else None (graphc's kernels).
    force: every step cuBLASLt can run exactly (benchmarks); erf_gelu: map erf GELUs too."""
    if "cublaslt" not in tactics:
        return None
    g, why = lower(ctx, erf_gelu)
    if g is None:
        log.debug("%s: stays on graphc's kernels (%s)", ctx.step.name, why)
        return None
    if force:
        return g
    if prefer is not None:  # a benchmark's own measurement instead of the rule
        return g if shape_key(g) in prefer else None
    return g if prefer_vendor(g) else None
