"""NHWC convolutions on Hopper (sm_90a): 1x1 stride-1 convs on the TMA GEMM (gemm_sm90), every other
one-group fp16/bf16 conv (3x3 stride 1 and 2, the 7x7 stem with 3 channels, strided 1x1) on the
wgmma implicit GEMM (templates/conv_sm90_igemm.cu.j2, "igemm" below).

1x1 NHWC convolutions (stride 1, no padding, one group) on the Hopper TMA GEMM (gemm_sm90).

Such a convolution is a GEMM in place: the input [N, H, W, Cin] is A [M = N*H*W, K = Cin] (K
contiguous), the weight [Cout, 1, 1, Cin] is B stored [N = Cout, K] (K-major), the output
[N, H, W, Cout] is [M, Cout] row-major. The conv's bias (its anchor input 2) becomes the first op of
the GEMM's epilogue, followed by the conv's own fused epilogue (residual add, ReLU, ...), so the
GEMM kernel runs every fused op; tensor maps address x and w directly.

Strided 1x1 convolutions (ResNet's downsampling shortcuts) and every other geometry need a gather:
the implicit GEMM gathers im2col rows of A with cp.async (zero-filled padding), its weights by TMA.
The 3-channel stem: channels are not padded in memory; the gather loads elements (zeros past
R*S*Cin fill the last K tile), so no layout conversion or weight copy changes.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from graphc.codegen.cuda_types import cuda_type
from graphc.codegen.epilogue import render_epilogue, step_operands
from graphc.codegen.families import gemm_sm90
from graphc.codegen.families.conv import ConvGeometry, conv_step, geometry
from graphc.codegen.families.gemm import SM_COUNT, OperandLayout, Problem, _kernel_args, split_reduce_kernel
from graphc.codegen.kernel import KernelSource, StepContext, ceil_div, render
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
    return _problem(ctx, g)


def _problem(ctx: StepContext, g: ConvGeometry) -> Problem:
    """The conv as a GEMM problem [M = N*P*Q, K = R*S*Cin] x [Cout, K]^T, its bias (anchor input 2)
    the first op of the epilogue."""
    cs = conv_step(ctx)
    assert cs is not None
    step = ctx.step
    epilogue, outputs = tuple(cs.epilogue), tuple(cs.outputs)
    if cs.n_anchor >= 3 and len(step.inputs) > 2 and step.inputs[2] is not None:
        bias = EpilogueOp("Add", get_op("Add").attrs(), (ACC, IN(2)))
        epilogue = (bias,) + tuple(dataclasses.replace(e, args=tuple(_shift(r) for r in e.args)) for e in epilogue)
        outputs = tuple(_shift(r) for r in outputs)
    m, n, k = g.m, g.k, g.rsc
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


# ---- partial waves ------------------------------------------------------------------------------
# Both heuristics below (the TMA GEMM's tile for a 1x1 conv, the implicit GEMM's) cost a launch by
# its waves of tiles over the SMs. Counting a partial last wave as a whole one (ceil) made every
# layer of ResNet-50's last three stages change its tile between batch 20 and 22 on an H200: at
# batch 22, 34 row tiles at 14x14 (M = 4312) and 135 at 28x28 (M = 17248) put 136 and 135 tiles
# on 132 SMs, "two waves", so the heuristics fled to thinner or split tiles (BN 192, BN 256 with 3
# K slices, BN 128 at half a wave); the static engine took 1.11 ms against 0.89 at batch 20 (+24%
# for +10% rows; docs/results/h200_profiles_2026-12-01_1729.md). A tail of a few tiles runs on
# otherwise idle SMs with the memory system to itself and costs less than a full wave: measured at
# batch 32 (docs/results/h200_conv_sm90_2026-12-01.jsonl, TMA GEMM, BN 128 against BN 256 of the
# same layer), 1.48 waves of BN 128 tiles cost as 1.81 full ones (14x14 1024 -> 512) and 1.58 as 1.82
# (7x7 512 -> 2048): a tail of fraction f of the SMs costs about TAIL_BASE + (1 - TAIL_BASE) * f of a
# wave, TAIL_BASE = 0.6 (0.79 and 0.83 at these f); the whole-model times at batch 12, 20, 22 and 32
# fit 0.2 better. A launch of one wave or less counts one (the batch-1 and batch-32 rules were
# measured so).
# TAIL_BASE stays 1.0 here, a partial wave counted whole (the plans of main, unchanged), until whole
# engines of the other values are timed: tools/bench_conv_tails.py builds ResNet-50 at chosen batches
# and TAIL_BASE values and times them in one GPU run (its first run failed to build, see its
# docstring). By the model itself the cliff stays: at TAIL_BASE 0.6 the selection at batch 22 costs
# 0.2% less than the ceil one, at 0.2 5%, at 0 12%, against 21% more per row than batch 20
# (docs/dynamic_shapes.md): 128-row tiles on 132 SMs leave batch 22 just over a wave whatever the tile.
TAIL_BASE = 1.0


def waves(tiles: int) -> float:
    """The cost of `tiles` tiles in waves over SM_COUNT SMs, a partial last wave as above."""
    if tiles <= SM_COUNT:
        return 1.0
    full, rest = divmod(tiles, SM_COUNT)
    return full + (TAIL_BASE + (1 - TAIL_BASE) * rest / SM_COUNT if rest else 0.0)


# The TMA GEMM's tile efficiencies and split-K charge, as gemm_sm90.heuristic has them.
_TMA_EFF = {128: 0.86, 192: 0.95, 256: 1.0}


def tma_cost(prob: Problem, bn: int, s: int) -> float:
    """The TMA GEMM's cost of `prob` at tile width `bn` and `s` K slices, in MAC units of the busiest
    SM (split-K charged its fp32 round trip); tma_heuristic minimizes it, graphc/bucket_cost.py sums it."""
    ktiles = ceil_div(prob.K, gemm_sm90.BK)
    cost = waves(gemm_sm90.units(prob, bn, s)) * gemm_sm90.BM * bn * ceil_div(ktiles, s) * gemm_sm90.BK
    cost /= _TMA_EFF[bn]
    if s > 1:
        cost += 2 * s * prob.batch * prob.M * prob.N * 4 * 40 / SM_COUNT + 3e5
    return cost


def tma_heuristic(prob: Problem) -> dict[str, Any]:
    """gemm_sm90.heuristic's choice for a 1x1 conv's GEMM with the partial-wave cost above (its
    ping-pong choice for a costly epilogue unchanged)."""
    base = gemm_sm90.heuristic(prob)
    if base.get("PINGPONG"):
        return base
    ktiles = ceil_div(prob.K, gemm_sm90.BK)
    best, best_cost = None, float("inf")
    for bn in gemm_sm90.BNS:
        for s in (1, 2, 3, 4, 6, 8):
            if s > 1 and ktiles // s < 4:
                continue
            cost = tma_cost(prob, bn, s)
            if cost < best_cost * 0.999:
                best, best_cost = (bn, s), cost
    assert best is not None
    return {"BN": best[0], "SPLITS": best[1], "PINGPONG": 0, "STAGES": gemm_sm90.max_stages(best[0])}


def generate(ctx: StepContext, params: dict | None = None) -> list[KernelSource]:
    """The TMA GEMM's kernels for a 1x1 convolution step (a CompileError where it is not one);
    without `params` (a tuner's candidate) and with TAIL_BASE < 1.0 the tile of tma_heuristic."""
    prob = gemm_problem(ctx)
    if isinstance(prob, str):
        raise ctx.fail(f"no TMA GEMM for this convolution: {prob}")
    if params is None and TAIL_BASE < 1.0:
        # at 1.0 gemm_sm90.generate's own heuristic decides (the same choice), so that a change of
        # gemm_sm90.heuristic reaches 1x1 convs as before
        params = tma_heuristic(prob)
    ks = gemm_sm90.generate(ctx, params, prob=prob, family="conv")
    for k in ks:
        k.params["variant"] = "tma_gemm"
    return ks


# ---- the wgmma implicit GEMM (templates/conv_sm90_igemm.cu.j2) ----------------------------------
IGEMM_BM = 128
IGEMM_BK = 64
IGEMM_BNS = (64, 128, 256)
IGEMM_THREADS = 256  # two consumer warpgroups, 64 rows each; every thread also gathers
IGEMM_SMEM_LIMIT = 227 * 1024
IGEMM_SMEM_2CTA = 113 * 1024  # two blocks per SM (228 KB, less 1 KB reserved per block)
B_MODES = ("tma", "cp", "elem")
CLUSTER_MAX_SPLITS = 8  # the portable cluster size


def igemm_why_not(g: ConvGeometry) -> str | None:
    """Why the implicit-GEMM kernel cannot run this convolution, or None."""
    if g.layout != "nhwc":
        return "not NHWC"
    if g.dtype not in (DType.float16, DType.bfloat16):
        return f"{g.dtype.name} (the wgmma conv takes float16 and bfloat16)"
    if g.group != 1:
        return f"group {g.group} (one group only)"
    if len(g.kernel) != 2:
        return f"{len(g.kernel)}-D"
    if g.m < 1 or g.k < 1 or g.rsc < 1:
        return "an empty problem"
    return None


def igemm_smem(bn: int, stages: int, b_mode: str) -> int:
    main = stages * (IGEMM_BM + bn) * IGEMM_BK * 2
    epi = IGEMM_BM * (bn + 8) * 4  # the fp32 accumulator tile, in the stages after the main loop
    return max(main, epi) + (8 * stages if b_mode == "tma" else 0) + 1024  # + slack to align to 1024


def igemm_max_stages(bn: int, b_mode: str = "tma") -> int:
    st = 3
    while st < 8 and igemm_smem(bn, st + 1, b_mode) <= IGEMM_SMEM_LIMIT:
        st += 1
    return st


def igemm_b_mode(g: ConvGeometry) -> str:
    """TMA for the weights where their rows are 16-byte aligned (R*S*Cin % 8 == 0); element loads
    otherwise (the stem's 147)."""
    return "tma" if g.rsc % 8 == 0 else "elem"


# Relative throughput per tile of each width, fitted to the H200 runs (docs/results/
# conv_sm90_igemm_2026-12-01.md): with these the heuristic picks the fastest measured variant, or one
# within 3% of it, on every layer of the selection comment below. (BN 64 runs at 4 stages, two blocks
# per SM, yet a 64-column tile still costs about 0.7 of a 128-column one: at 14x14, 256 -> 256,
# batch 32, BN 64 took 27.9-28.3 us against 22.3 for BN 128.)
_IGEMM_EFF = {64: 0.65, 128: 0.92, 256: 1.0}


def igemm_cost(m: int, n: int, k: int, bn: int, s: int, cluster: bool = False) -> float:
    """The implicit GEMM's cost of an [m, k] x [k, n] conv at tile width `bn` and `s` K slices, in MAC
    units of the busiest SM (the wave model of igemm_heuristic, which minimizes it before it decides
    on a cluster). `cluster` (CLUSTER 1, for graphc/bucket_cost.py): no second launch; the partials'
    traffic, through DSMEM rather than L2, is still charged as the round trip (not measured apart)."""
    tiles = ceil_div(m, IGEMM_BM) * ceil_div(n, bn) * s
    cost = waves(tiles) * IGEMM_BM * bn * ceil_div(ceil_div(k, IGEMM_BK), s) * IGEMM_BK / _IGEMM_EFF[bn]
    if s > 1:
        cost += 2 * s * m * n * 4 * 40 / SM_COUNT + (0 if cluster else 1e5)
    return cost


def igemm_heuristic(g: ConvGeometry) -> dict[str, Any]:
    """Tile width and K slices by a wave model (the busiest SM's padded tile work over the tile's
    efficiency; split-K charged its fp32 round trip through L2); the pipeline depth and blocks per
    SM as measured (the comment of the selection rules below)."""
    ktiles = ceil_div(g.rsc, IGEMM_BK)
    best, best_cost = None, float("inf")
    for bn in IGEMM_BNS:
        if bn > 64 and g.k <= bn // 2:
            continue  # more than half of the tile would be zero columns
        for s in (1, 2, 3, 4, 6, 8):
            if s > 1 and ktiles // s < 6:
                continue
            cost = igemm_cost(g.m, g.k, g.rsc, bn, s)
            if cost < best_cost * 0.999:
                best, best_cost = {"BN": bn, "SPLITS": s}, cost
    assert best is not None
    mode = igemm_b_mode(g)
    best["B_MODE"] = mode
    best["MINB"] = 1
    if best["BN"] == 64:
        best["STAGES"] = 4  # 96 KB: two blocks per SM (measured faster than 8 stages, one block)
    else:
        best["STAGES"] = igemm_max_stages(best["BN"], mode)
    tiles = ceil_div(g.m, IGEMM_BM) * ceil_div(g.k, best["BN"])
    if g.c % 8 and best["BN"] <= 128 and tiles > SM_COUNT:
        # the element gather (the stem) is latency-bound: two blocks per SM, 128 registers each;
        # the stages that fit two blocks' shared memory (ViT's 16x16 patch conv, Cin = 3, loads its
        # 768-wide weight rows by TMA: 4 stages of BN 128 do not fit twice), else one block as above
        stages = 4
        while stages > 3 and igemm_smem(best["BN"], stages, mode) > IGEMM_SMEM_2CTA:
            stages -= 1
        if igemm_smem(best["BN"], stages, mode) <= IGEMM_SMEM_2CTA:
            best["STAGES"], best["MINB"] = stages, 2
    # K slices reduce in a second launch (the GEMM family's reduce kernel): at batch 1 with 3-8
    # slices the one-launch variant (the last slice reduces) was 0.3-1.5 us slower (7.7-9.0 us
    # against 7.3-7.9); it stays a parameter (SERIAL 1) for the tuner.
    best["SERIAL"] = 0
    best["CLUSTER"] = int(
        CLUSTER_SPLIT_K
        and 1 < best["SPLITS"] <= CLUSTER_MAX_SPLITS
        and best["SPLITS"] * best["BN"] <= CLUSTER_MAX_COLUMNS
    )
    return best


def igemm_valid(g: ConvGeometry, p: dict[str, Any]) -> str | None:
    bn, st, s, mode, minb = p.get("BN"), p.get("STAGES"), p.get("SPLITS", 1), p.get("B_MODE"), p.get("MINB", 1)
    if bn not in IGEMM_BNS or mode not in B_MODES or minb not in (1, 2):
        return f"BN {bn!r} (one of {IGEMM_BNS}), B_MODE {mode!r} (one of {B_MODES}), MINB {minb!r} (1, 2)"
    if mode in ("tma", "cp") and g.rsc % 8:
        return f"B_MODE {mode}: R*S*Cin = {g.rsc} is not a multiple of 8 (16-byte weight rows)"
    if not isinstance(st, int) or not 3 <= st <= 8:
        return f"STAGES {st!r} (3..8)"
    limit = IGEMM_SMEM_2CTA if minb == 2 else IGEMM_SMEM_LIMIT
    if igemm_smem(bn, st, mode) > limit:
        return f"{igemm_smem(bn, st, mode)} bytes of shared memory (at most {limit} with MINB {minb})"
    if minb == 2 and bn > 128:
        return "MINB 2 caps registers at 128 a thread: BN 256 holds 128 accumulators alone"
    if not isinstance(s, int) or s < 1 or s > ceil_div(g.rsc, IGEMM_BK):
        return f"SPLITS {s!r}"
    if p.get("SERIAL", 1) not in (0, 1):
        return f"SERIAL {p.get('SERIAL')!r} (0, 1)"
    if p.get("CLUSTER", 0) not in (0, 1):
        return f"CLUSTER {p.get('CLUSTER')!r} (0, 1)"
    if p.get("CLUSTER") and s > CLUSTER_MAX_SPLITS:
        return f"CLUSTER 1 with SPLITS {s} (a cluster holds at most {CLUSTER_MAX_SPLITS} CTAs, the portable size)"
    if p.get("CLUSTER") and p.get("SERIAL"):
        return "CLUSTER 1 and SERIAL 1 (two one-launch split-K forms; choose one)"
    return None


def igemm_generate(ctx: StepContext, params: dict[str, Any] | None = None) -> list[KernelSource]:
    """The implicit-GEMM kernel (and, with split-K, the GEMM family's reduce kernel) of a conv step."""
    cs = conv_step(ctx)
    if cs is None:
        raise ctx.fail("not a convolution")
    g = geometry(ctx, cs)
    why = igemm_why_not(g)
    if why is not None:
        raise ctx.fail(f"no wgmma implicit-GEMM conv: {why}")
    step = ctx.step
    where = f"{step.kind} node '{step.name}'"
    p = {**igemm_heuristic(g), **{k: v for k, v in (params or {}).items() if k in _IGEMM_KEYS}}
    if p.get("SERIAL") and "CLUSTER" not in (params or {}):
        p["CLUSTER"] = 0  # a SERIAL 1 (a caller's, or a heuristic patched by a test) replaces the cluster
    if "BN" in (params or {}) and "STAGES" not in (params or {}):
        p["STAGES"] = 4 if p["BN"] == 64 else igemm_max_stages(p["BN"], p["B_MODE"])
        if p.get("MINB") == 2:
            while p["STAGES"] > 3 and igemm_smem(p["BN"], p["STAGES"], p["B_MODE"]) > IGEMM_SMEM_2CTA:
                p["STAGES"] -= 1
    bad = igemm_valid(g, p)
    if bad is not None:
        raise ctx.fail(f"wgmma conv parameters {p}: {bad}")
    ktiles = ceil_div(g.rsc, IGEMM_BK)
    kt_per = ceil_div(ktiles, p["SPLITS"])
    splits = ceil_div(ktiles, kt_per)  # no empty slice
    p["SPLITS"] = splits
    # split-K in one launch: across a thread-block cluster (CLUSTER 1, the slices sum each other's
    # partials over DSMEM), or where partials move as float4, the last slice of a tile reduces
    cluster = splits > 1 and bool(p.get("CLUSTER", 0))
    serial = splits > 1 and not cluster and bool(p.get("SERIAL", 0)) and g.k % 4 == 0
    p["SERIAL"] = int(serial)
    p["CLUSTER"] = int(cluster)
    prob = _problem(ctx, g)
    ops = step_operands(ctx)
    name = ctx.kernel_name()
    out_specs = [ctx.tensors[o] for o in step.outputs]
    rendered = render_epilogue(
        prob.epilogue, prob.outputs, ops, out_specs, prob.out_shape, prob.dtype, where=where, name=f"{name}_epi"
    )
    out_names, out_decls = _kernel_args(ctx, prob, rendered, False)
    ct = cuda_type(prob.dtype)
    vec = None
    if p.get("VEC_EPI", 1) and (splits == 1 or serial or cluster):
        vec = gemm_sm90._vec_epilogue_vars(prob, ops, out_specs, rendered, 1, name, where, 1)
    p["VEC_EPI"] = 1 if vec is not None else 0
    st = ct.storage
    mode = p["B_MODE"]
    kparams = [f"const {st}* __restrict__ gc_x"]
    kargs = [step.inputs[0]]
    if mode == "tma":
        kparams.append("const gc_tmap* __restrict__ tB")
        kargs.append("@tmap:0")
    else:
        kparams.append(f"const {st}* __restrict__ gc_w")
        kargs.append(step.inputs[1])
    if splits > 1 and not serial and not cluster:
        kparams.append("float* __restrict__ ws")
        kargs.append("@workspace")
    else:
        kparams += out_decls
        kargs += out_names
        if serial:
            kparams.append("float* __restrict__ ws")
            kargs.append("@workspace")
    h, w = g.in_spatial
    pq, q = g.out_spatial
    common = {
        "epilogue": rendered,
        "epilogue_name": f"{name}_epi",
        "st": st,
        "ct": ct.compute,
        "alpha_lit": None,
        "c_param": False,
        "c_expr": None,
        "out_args": list(rendered.args),
    }
    source = render(
        "conv_sm90_igemm.cu.j2",
        **common,
        name=name,
        kparams=kparams,
        H=h,
        W=w,
        C=g.c,
        P=pq,
        Q=q,
        S=g.kernel[1],
        SH=g.strides[0],
        SW=g.strides[1],
        PH=g.pads[0],
        PW=g.pads[1],
        DH=g.dilations[0],
        DW=g.dilations[1],
        M=g.m,
        N=g.k,
        K=g.rsc,
        BN=p["BN"],
        STAGES=p["STAGES"],
        kt_per_split=kt_per,
        splits=splits,
        serial=serial,
        cluster=cluster,
        tiles=ceil_div(g.m, IGEMM_BM) * ceil_div(g.k, p["BN"]),
        min_blocks=p["MINB"],
        a_vec=g.c % 8 == 0,
        b_mode=mode,
        ab_type="f16" if g.dtype is DType.float16 else "bf16",
        vec=vec,
    )
    kp: dict[str, Any] = {
        "variant": "igemm",
        **p,
        "M": g.m,
        "N": g.k,
        "K": g.rsc,
        "a": "gather16" if g.c % 8 == 0 else "gather1",
        "requires_arch": "sm_90a",
    }
    if mode == "tma":
        e = g.dtype.itemsize
        kp["tmaps"] = [
            {
                "tensor": step.inputs[1],
                "dtype": g.dtype.numpy.name,
                "dims": [g.rsc, g.k, 1],
                "strides": [g.rsc * e, g.rsc * g.k * e],
                "box": [IGEMM_BK, min(p["BN"], 256), 1],
                "swizzle": "128B",
            }
        ]
    tiles = ceil_div(g.m, IGEMM_BM) * ceil_div(g.k, p["BN"])
    total = g.m * g.k
    ws_bytes = splits * total * 4 if splits > 1 and not cluster else 0
    kernels = [
        KernelSource(
            "conv",
            name,
            source,
            (tiles, splits, 1),
            (IGEMM_THREADS, 1, 1),
            kargs,
            igemm_smem(p["BN"], p["STAGES"], mode),
            params=kp,
            workspace_bytes=ws_bytes,
        )
    ]
    if splits > 1 and not serial and not cluster:
        red = split_reduce_kernel("conv", name, common, out_decls, out_names, total, splits, ws_bytes)
        red.params["variant"] = "igemm_reduce"  # every conv launch names its variant
        kernels.append(red)
    return kernels


_IGEMM_KEYS = ("BN", "STAGES", "SPLITS", "B_MODE", "MINB", "VEC_EPI", "SERIAL", "CLUSTER")


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


# The wgmma implicit GEMM (measured on an H200, 2026-12-01: docs/results/conv_sm90_igemm_2026-12-01.md;
# tools/bench_conv_sm90.py --set igemm, fp16, bias (+ ReLU) fused, CUDA-graph replays, ratio = cuDNN
# time / ours, every distinct ResNet-50 conv that is not a stride-1 1x1):
# - batch 32: the heuristic's kernel 0.86-1.97x cuDNN (the conv family's "tc" kernel 0.57-0.90x on
#   the same layers); below 1.0x only stage 4's 3x3 convs (M = 1568, 512 -> 512: 0.86-0.88x);
# - batch 1 (M = 49 .. 12544): 1.38-2.24x cuDNN on every layer, the stem included.
# -> every one-group fp16/bf16 NHWC conv the TMA GEMM does not take. Fewer than 64 output channels
# (a tile more than half empty) was not measured: those stay on the conv family's kernel.
IGEMM_MIN_COUT = 64


# Cluster split-K (CLUSTER 1): the K slices of a tile as one thread-block cluster that sums its
# partials over DSMEM, one launch, no workspace; against the two launches (igemm + reduce kernel).
# Measured on an H200 (2026-12-02, docs/results/conv_sm90_cluster_split_k_2026-12-02.md; tools/
# bench_conv.py --split-k: CUDA-graph replays of the launch pair / the one launch, us, plain / PDL):
# - batch 1, every split 3x3 and strided 1x1 of ResNet-50 (7 shapes): cluster 5.95-6.88 us with PDL
#   against 6.39-7.02 for two launches (plain 6.25-7.20 against 7.28-7.86);
# - batch 8: faster on 4 of 6 shapes (9.35 against 12.57 at 28x28 128); slower at 7x7 512 -> 512
#   and its stride-2 twin (8 slices of 128-column tiles, 230 KB each: 14.9 against 11.5);
# - batch 32 (7x7 512, 2 slices of 128 columns): 23.2 against 26.3.
# -> a cluster where SPLITS * BN <= CLUSTER_MAX_COLUMNS (512); the two launches beyond.
CLUSTER_SPLIT_K = True
CLUSTER_MAX_COLUMNS = 512
# A stride-1 1x1 conv whose TMA GEMM would split K: on the implicit GEMM as a cluster instead, at the
# TMA GEMM's slice count with these parameters (None: the TMA GEMM and its reduce kernel).
# Measured in the same run: at batch 1, every split stride-1 1x1 of ResNet-50 (6 shapes) ran 4.59-5.64
# us with PDL on the implicit GEMM (BN 64, cluster, the TMA GEMM's slice count) against 5.49-5.81 us
# for the TMA GEMM and its reduce kernel; at batch 8 and 32 (more CTAs than SMs) it lost on 4 of 6.
# -> there, where the cluster launch has at most SM_COUNT CTAs. Whole ResNet-50 at batch 1 (graph
# replay): 0.352 ms today, 0.353 with cluster split-K on the implicit GEMM alone, 0.302 with this too.
SPLIT_1X1_ON_IGEMM: dict[str, Any] | None = {"BN": 64}


def split_1x1_params(prob: Problem) -> dict[str, Any] | None:
    """The implicit GEMM's cluster parameters for a stride-1 1x1 conv by the rule above, or None."""
    if SPLIT_1X1_ON_IGEMM is None:
        return None
    s = (tma_heuristic(prob) if TAIL_BASE < 1.0 else gemm_sm90.heuristic(prob))["SPLITS"]
    s = min(s, CLUSTER_MAX_SPLITS)
    if s <= 1 or ceil_div(prob.M, IGEMM_BM) * ceil_div(prob.N, SPLIT_1X1_ON_IGEMM["BN"]) * s > SM_COUNT:
        return None
    return {**SPLIT_1X1_ON_IGEMM, "SPLITS": min(s, CLUSTER_MAX_SPLITS), "CLUSTER": 1}


def igemm_selected(g: ConvGeometry) -> str | None:
    """Why the rules keep this conv off the implicit GEMM, or None (it is selected)."""
    why = igemm_why_not(g)
    if why is not None:
        return why
    if g.k < IGEMM_MIN_COUT:
        return f"Cout = {g.k} < {IGEMM_MIN_COUT}"
    return None


def select(ctx: StepContext) -> list[KernelSource]:
    """The sm_90a kernels for a conv step where the rules choose them: the TMA GEMM (1x1, stride 1),
    else the wgmma implicit GEMM; [] elsewhere (the conv family's own kernel runs; logged)."""
    if ctx.precision not in ("fp16", "bf16"):
        return []
    try:
        prob = gemm_problem(ctx)
    except CompileError:
        return []
    if not isinstance(prob, str):
        if selected(prob):
            split = split_1x1_params(prob)
            return generate(ctx) if split is None else igemm_generate(ctx, split)
        log.debug("%s: conv not on the TMA GEMM (M=%d N=%d K=%d)", ctx.step.name, prob.M, prob.N, prob.K)
    else:
        log.debug("%s: conv not on the TMA GEMM: %s", ctx.step.name, prob)
    cs = conv_step(ctx)
    if cs is None:
        return []
    g = geometry(ctx, cs)
    why = igemm_selected(g)
    if why is not None:
        log.info("%s: conv on the conv family's kernel, not the wgmma implicit GEMM: %s", ctx.step.name, why)
        return []
    return igemm_generate(ctx)
