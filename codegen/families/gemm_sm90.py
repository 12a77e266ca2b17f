"""The Hopper GEMM (templates/gemm_sm90.cu.j2): TMA loads through tensor maps into 128-byte
swizzled stages, mbarrier pipeline, one producer warpgroup and two wgmma consumer warpgroups with
setmaxnreg, persistent CTAs over a grouped tile order (cooperative or ping-pong consumers), split-K
through fp32 partials in the workspace and the GEMM family's "reduce" kernel.

It takes the same normalized Problem as the other GEMM kernels (gemm.problem_of) and the same
rendered epilogue. Its operands are described to the runtime as tensor-map specs
(runtime/tensormap.py) in `params["tmaps"]`, passed as the arguments "@tmap:0" (A) and "@tmap:1" (B).

Parameters: BN (tile columns: 128, 192, 256; BM is 128), STAGES (as many as shared memory holds by
default), SPLITS (K slices, for problems of too few tiles), PINGPONG (0: the two consumer
warpgroups split each tile's rows; 1: each takes whole tiles in turn, BN 128 or 192), VEC_EPI
(1, the default where the problem allows it: each epilogue thread takes 8 consecutive columns of a
row, loads the epilogue's inputs once per 8 elements (16-byte vectors, or one value for an input
broadcast along the row) and stores 8 outputs with one 16-byte store; 0: one element per call, the
inputs loaded and the output stored element by element, as the other GEMM templates do),
OVERLAP (1: cooperative with the epilogue of each tile run in chunks during the next tile's main
loop, from a second accumulator array; BN 128 or 192, one K slice, VEC_EPI 1), WARP_EPI (1: the
cooperative or ping-pong epilogue done by each warp for its own 16 rows, no barrier across warps;
VEC_EPI 1).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from graphc.codegen.cuda_types import cuda_type, dtype_from_numpy_name
from graphc.codegen.epilogue import broadcast_index, render_epilogue, step_operands
from graphc.codegen.expr import lit
from graphc.codegen.families.gemm import (
    SM_COUNT,
    OperandLayout,
    Problem,
    _c_expr,
    _generate,
    _kernel_args,
    cluster_heuristic,
    problem_of,
    public,
    split_reduce_kernel,
)
from graphc.codegen.families.gemm import (
    valid as gemm_valid,
)
from graphc.codegen.kernel import KernelSource, StepContext, ceil_div, render
from graphc.errors import CompileError
from graphc.ir.types import DType
from graphc.ops.fused import ACC

log = logging.getLogger(__name__)

BM = 128  # the default tile height; BM 192: three consumer warpgroups (cooperative only)
BMS = (128, 192)
BK = 64
BNS = (128, 192, 256)  # the widths heuristic() weighs and conv_sm90 / gemm_fp8 take
# BN 64: twice the tiles of BN 128 for the mid-M shapes (1024 x 768: 48 tiles of 128 x 128 leave
# 84 of 132 SMs idle); the mid-M tile rule (mid_tile_bn) takes it, heuristic()'s wave-model loop
# over BNS does not.
NARROW_BN = 64
TMA_BNS = (NARROW_BN, *BNS)
PINGPONG_BNS = (NARROW_BN, 128, 192)
OVERLAP_BNS = (NARROW_BN, 128, 192)  # the accumulators twice in registers: BN 256 would need 256 of them
THREADS = 384  # producer warpgroup + two consumer warpgroups (BM 128)
SMEM_LIMIT = 227 * 1024
_EP_BYTES = 64 * 40 * 4  # a consumer warpgroup's fp32 epilogue buffer
# setmaxnreg (producer, consumer) per consumer warpgroup count: 65536 registers a CTA of
# 128 * (1 + consumers) threads, each count a multiple of 8 (128 * 40 + 384 * 152 = 63488).
# (ptxas still compiles a 512-thread kernel for 128 registers a thread: the wgmma of BN 256 needs
# 154 at BM 192, so that tile is refused, C7602.)
REGS = {2: (40, 232), 3: (40, 152)}
BM192_BNS = (128, 192)


def consumers(bm: int) -> int:
    """Consumer warpgroups of a BM-row tile (64 rows each; BM 128 ping-pong: 2 as well)."""
    return bm // 64


def threads(bm: int = BM) -> int:
    return 128 * (1 + consumers(bm))


def shared_bytes(bn: int, stages: int, bm: int = BM) -> int:
    ep = consumers(bm) * _EP_BYTES
    return stages * (bm + bn) * BK * 2 + ep + 16 * stages + 16 + 1024  # + slack to align to 1024


def max_stages(bn: int, bm: int = BM) -> int:
    return min(8, (SMEM_LIMIT - consumers(bm) * _EP_BYTES - 1024 - 144) // ((bm + bn) * BK * 2))


def unsupported(prob: Problem) -> str | None:
    """Why this kernel cannot run the problem, or None."""
    if prob.dtype not in (DType.float16, DType.bfloat16):
        return f"{prob.dtype.name} (the TMA GEMM takes float16 and bfloat16)"
    if len(prob.batch_dims) > 1:
        return "more than one batch dimension after merging"
    for name, lay in (("A", prob.a), ("B", prob.b)):
        rows_used = lay.rows if lay.kcontig else prob.K
        if (rows_used > 1 and lay.pitch % 8) or any(s % 8 for s in lay.batch_strides):
            return f"{name}'s rows are not 16-byte aligned (TMA needs 16-byte strides)"
    if prob.K < 1 or prob.M < 1 or prob.N < 1:
        return "an empty problem"
    return None


def units(prob: Problem, bn: int, splits: int, bm: int = BM) -> int:
    return ceil_div(prob.M, bm) * ceil_div(prob.N, bn) * prob.batch * splits


def tile_cost(prob: Problem, bn: int, s: int, bm: int = BM) -> float:
    """The wave model of heuristic() at tile width `bn` and `s` K slices, in MAC units of the busiest
    SM: its (padded) tiles' work over the tile's efficiency, split-K charged its workspace round trip
    and second launch. heuristic() minimizes it over 128-row tiles; graphc/bucket_cost.py sums it over
    a plan with each launch's own tile height `bm` (BM 192 tiles: the same per-element efficiency, not
    measured separately)."""
    waves = ceil_div(units(prob, bn, s, bm), SM_COUNT)
    cost = waves * bm * bn * ceil_div(ceil_div(prob.K, BK), s) * BK / _EFF[bn]
    if s > 1:  # fp32 partials written and read back, a second launch (in MAC units)
        cost += 2 * s * prob.batch * prob.M * prob.N * 4 * 40 / SM_COUNT + 3e5
    return cost


# Per-element speed of each tile width (fewer operand bytes a FLOP); BN 64's fitted by the mid-M
# tile rule below (graphc/bucket_cost.py prices every launch, BN 64 ones too, with tile_cost).
_EFF = {64: 0.75, 128: 0.86, 192: 0.95, 256: 1.0}


def heuristic(prob: Problem, vec_ok: bool = True, residual: bool = False) -> dict[str, Any]:
    """Tile width and split count by a wave model: the busiest SM's share of (padded) tile work,
    the wider tiles a little faster per element (fewer operand bytes per FLOP), split-K charged its
    workspace round trip; then the OVERLAP rule (overlap_rule) and the tall rule (tall_rule; with
    `residual`, an epilogue input of the output's shape) where the problem can have the 8-column
    vector epilogue (`vec_ok`). Measured rules: see docs/results/gemm_sm90.md and
    docs/results/gemm_sm90_epilogue_2026-12-01.md."""
    ktiles = ceil_div(prob.K, BK)
    best, best_cost = None, float("inf")
    for bn in BNS:
        for s in (1, 2, 3, 4, 6, 8):
            if s > 1 and ktiles // s < 4:
                continue
            cost = tile_cost(prob, bn, s)
            if cost < best_cost * 0.999:
                best, best_cost = {"BN": bn, "SPLITS": s}, cost
    assert best is not None
    if best["SPLITS"] == 1 and any(e.op in PINGPONG_EPILOGUE_OPS for e in prob.epilogue):
        # An epilogue that costs as much as a good part of the main loop: ping-pong overlaps one
        # warpgroup's epilogue with the other's main loop (measured: see PINGPONG_EPILOGUE_OPS).
        best = {"BN": 128, "SPLITS": 1}
        best["PINGPONG"] = 1
    else:
        best["PINGPONG"] = 0
    if vec_ok and (mid_bn := mid_tile_bn(prob)) is not None:
        gelu = any(e.op in PINGPONG_EPILOGUE_OPS for e in prob.epilogue)
        best = {"BN": mid_bn, "SPLITS": 1, "PINGPONG": 0, ("WARP_EPI" if gelu else "OVERLAP"): 1}
    if vec_ok and overlap_rule(prob, best):
        best = {"BN": OVERLAP_RULE_BN, "SPLITS": 1, "PINGPONG": 0, "OVERLAP": 1}
    if not vec_ok and wide_element_wise_rule(prob, best):
        best = {"BN": OVERLAP_RULE_BN, "SPLITS": 1, "PINGPONG": 0, "OVERLAP": 1}
    if vec_ok and tall_rule(prob, best, residual):
        gelu = any(e.op in PINGPONG_EPILOGUE_OPS for e in prob.epilogue)
        heavy = gelu or residual
        bn = 192 if not heavy or wave_fill(prob, 192, 192) >= wave_fill(prob, 192, 128) else 128
        best = {"BM": 192, "BN": bn, "SPLITS": 1, "PINGPONG": 0, "WARP_EPI": 1}
    best["STAGES"] = max_stages(best["BN"], best.get("BM", BM))
    return best


def wave_fill(prob: Problem, bm: int, bn: int) -> float:
    """The share of the SMs' tile slots that does useful work with bm x bn tiles in one K slice: the
    last wave's idle slots and the rows and columns padded past M and N counted as lost."""
    tiles = units(prob, bn, 1, bm)
    fill = tiles / (ceil_div(tiles, SM_COUNT) * SM_COUNT)
    return fill * prob.M / (ceil_div(prob.M, bm) * bm) * prob.N / (ceil_div(prob.N, bn) * bn)


# Mid-M tiles (256 < rows < 4096 with the batches folded in, N and K in 768..3072: BERT-base and
# GPT-2 at batch 3-24 of 128 tokens), measured on an H200 (2026-12-04, tools/bench_gemm_sm90.py
# --mid --layout k, fp16, CUDA-graph replays, us, cuBLAS through torch.matmul in the same run;
# docs/results/gemm_sm90_mid_2026-12-04.md). At 1024 rows the wave model's split-K choices lost to
# one K slice on every shape (the fp32 partials and the reduce launch cost 4-10 us):
#   1024x768x768   BN 64 OVERLAP 5.6 (cuBLAS 4.6; the heuristic's BN 128 split 2 9.8, BN 128 unsplit 8.1)
#   1024x768x3072  BN 64 12.6-12.7 (cuBLAS 9.8; BN 128 split 2 15.7, BN 192 split 3 19.8)
#   1024x2304x768  BN 192 OVERLAP 10.2 (cuBLAS 8.3; BN 64 11.6-12.6, BN 128 12.0-13.6)
#   1024x3072x768  BN 192 OVERLAP 10.6 (cuBLAS 10.1; BN 64 11.8-12.9, BN 128 12.4-14.0)
#   bias + residual: 1024x768x768 BN 64 OVERLAP 6.3 (BN 128 split 2 9.9), 1024x768x3072 13.2 (BN 192 split 4 15.7)
#   bias + Gelu: 1024x3072x768 BN 192 WARP_EPI 13.9 (OVERLAP 13.9; ping-pong BN 128 17.9, BN 64 15.9-16.6)
# -> one K slice, BN by the wave model with BN 64's per-element speed fitted (_EFF: the fewest
# waves of the narrowest tile unless a wider one needs as few), OVERLAP (Gelu: the per-warp
# epilogue, as the tall rule takes for it). Checked in a second run at 384, 512, 1024, 2048 and
# 3072 rows (tools/bench_gemm_small_m.py --mid, B [K, N], against every TMA width and split, the
# cp.async wgmma kernel with and without cluster split-K, and mma.sync): the rule's choice was the
# fastest variant on 19 of the 20 shapes (at 384 and 512 x 768x768, BN 64 OVERLAP 5.3 against the
# cluster kernel's 5.8 / 6.2); where K = 3072 and the one-slice tile leaves more than half the SMs
# idle the wave model's split stays (384x768x3072: split 6 9.7, the fastest, BN 64 12.0;
# 512x768x3072: split 8 11.9, the one miss, split 4 10.9). With bias + residual at 2048 and 3072 rows and bias +
# Gelu at 384, 2048 and 3072 (B [N, K]) the rule's choice was the fastest or within 3%.
MID_TILE_MAX_ROWS = 4096
MID_TILE_SHALLOW_K = 768
MID_BNS = (NARROW_BN, 128, 192)


def mid_tile_bn(prob: Problem) -> int | None:
    """The mid-M rule's tile width (above), or None where the rule does not apply: outside its
    ranges, or where K is deep and that width's one K slice would leave more than half the SMs idle
    (384 and 512 rows at K = 3072: the wave model's split-K is faster there)."""
    lo, hi = OVERLAP_RULE_NK
    rows = prob.batch * prob.M
    if not (SMALL_M_MAX < rows < MID_TILE_MAX_ROWS and lo <= prob.N <= hi and lo <= prob.K <= hi and prob.N % 8 == 0):
        return None
    bn = min(MID_BNS, key=lambda w: ceil_div(units(prob, w, 1), SM_COUNT) * w / _EFF[w])
    return bn if prob.K <= MID_TILE_SHALLOW_K or 2 * units(prob, bn, 1) >= SM_COUNT else None


# BM 192 (three consumer warpgroups, per-warp epilogue) as the default, measured on an H200
# (2026-12-02, tools/bench_gemm_sm90.py --sweep, fp16, B [K, N], CUDA-graph replays, cuBLAS / ours;
# docs/results/gemm_sm90_2026-12-02.md). Plain, BM 192 BN 192 WARP_EPI against OVERLAP BN 192:
#   6304 x 768x768 0.94 (0.83), 3072x768 0.96 (0.93), 768x3072 0.99 (0.80), 2304x768 0.99 (0.99);
#   4096 x 768x768 0.71 (0.95), 2304x768 0.93 (1.01), 3072x768 0.89 (1.06), 768x3072 0.76 (0.98).
# bias + residual at 6304x768x3072: 0.0461 ms against 0.0650. The 6304 shapes that won gain
# 0.14-0.25 of wave fill (wave_fill), 2304x768 0.10 (a tie), the 4096 ones none -> a gain of 0.12.
# bias + Gelu: BM 192 BN 128 WARP_EPI 0.0444 ms at 4096x3072x768 (ping-pong BN 128 0.0466),
# BN 192 0.0643 at 6304x3072x768 (ping-pong 0.0745) -> for Gelu every M >= 4096 with N, K in
# 768..3072, BN 192 where it fills the waves as well as BN 128.
# bias + residual (a residual [M, N] input: attention's output projection and the FFN's second GEMM),
# B [N, K] (2026-12-03, --sweep --epilogue bias-res --layout k): BM 192 BN 128 WARP_EPI 0.0325 ms at
# 4096x768x3072 against OVERLAP BN 192's 0.0354, 0.0119 against 0.0131 at 4096x768x768 (2026-12-02,
# B [K, N]: 0.0327 against 0.0350); at 6304x768x3072 BM 192 BN 192 WARP_EPI (0.0468) as the wave
# fill already chose -> with a residual, as with Gelu, every M >= 4096 with N, K in 768..3072.
TALL_RULE_MIN_GAIN = 0.12
TALL_RULE_MIN_M = 4096


def tall_rule(prob: Problem, best: dict[str, Any], residual: bool = False) -> bool:
    """Whether the heuristic takes BM 192 over its 128-row choice `best` (rule above; `residual`:
    an epilogue input of the output's shape)."""
    lo, hi = OVERLAP_RULE_NK
    if best["SPLITS"] != 1 or prob.batch * prob.M < TALL_RULE_MIN_M or prob.N % 8:
        return False
    if not (lo <= prob.N <= hi and lo <= prob.K <= hi):
        return False
    if residual or any(e.op in PINGPONG_EPILOGUE_OPS for e in prob.epilogue):
        return True
    return wave_fill(prob, 192, 192) >= wave_fill(prob, BM, best["BN"]) + TALL_RULE_MIN_GAIN


# OVERLAP as the default, measured on an H200 (2026-12-01, tools/bench_gemm_sm90.py --overlap,
# fp16, B [K, N], CUDA-graph replays, ratio = cuBLAS / ours; docs/results/gemm_sm90_epilogue_2026-12-01.md):
# plain GEMMs, OVERLAP BN 192 against the heuristic's cooperative tile before:
#   4096 x {768x768, 2304x768, 3072x768, 768x3072}: 0.96 / 1.02 / 1.04 / 0.97x (before 0.86 / 0.88 / 0.91 / 0.95x)
#   6304 x the same: 0.81 / 1.00 / 0.92 / 0.82x (before 0.71 / 0.85 / 0.83 / 0.76x)
# and the fastest variant on all eight. Not taken: 4096^3 (cooperative BN 256 0.96x, OVERLAP BN 192
# 0.73x, BN 128 0.87x), so N and K stay within the measured 768..3072; a Gelu epilogue (bias + Gelu
# at 4096x3072x768: OVERLAP BN 128 0.0512 ms, BN 192 0.0764 (NVRTC 13.0 spilled it), the ping-pong
# default 0.0470); split-K problems (the reduce kernel runs the epilogue).
OVERLAP_RULE_BN = 192
OVERLAP_RULE_MIN_M = 4096
OVERLAP_RULE_NK = (768, 3072)


def overlap_rule(prob: Problem, best: dict[str, Any]) -> bool:
    """Whether the heuristic takes OVERLAP BN 192 over its cooperative choice `best` (rule above)."""
    lo, hi = OVERLAP_RULE_NK
    return (
        best["SPLITS"] == 1
        and not best.get("PINGPONG")
        and prob.batch * prob.M >= OVERLAP_RULE_MIN_M
        and lo <= prob.N <= hi
        and lo <= prob.K <= hi
        and prob.N % 8 == 0
        and not any(e.op in PINGPONG_EPILOGUE_OPS for e in prob.epilogue)
    )


# OVERLAP with the element-wise stores (ov_chunk_scalar) for a wide output without the vector
# epilogue, measured on an H200 (2026-12-03, tools/bench_gemm_sm90.py --sweep --shape
# 4096x50257x768 --layout k, fp16, CUDA-graph replays; docs/results/gemm_sm90_odd_n_2026-12-03.md):
# GPT-2's LM head (N = 50257 odd, no bias) OVERLAP BN 192 0.570 ms against the cooperative BN 256
# default's 0.679 (OVERLAP BN 128 0.644, cooperative BN 192 0.658, ping-pong BN 192 0.677, BM 192
# BN 192 per-warp 0.664; cuBLAS through torch.matmul 3.06). At 128 rows (the small-M rule's
# shape) OVERLAP BN 128 0.0283 ms ties the rule's cooperative BN 128 (28.4-28.9 us), so that rule
# stays. Narrower N (the vector epilogue's 768..3072 rules) was not measured without it.
# From 1024 rows since 2026-12-04 (--sweep --shape 1024x50257x768 --shape 2048x50257x768 --layout k;
# docs/results/gemm_sm90_mid_2026-12-04.md): OVERLAP BN 192 0.1415 / 0.294 ms against the
# cooperative BN 256 default's 0.156 / 0.326 (GPT-2's LM head at batch 8 and 16); at 1024 rows
# ping-pong BN 192 was faster still (0.135), at 2048 not (0.321), so one rule for both.
WIDE_RULE_MIN_M = 1024


def wide_element_wise_rule(prob: Problem, best: dict[str, Any]) -> bool:
    """Whether the heuristic takes OVERLAP BN 192 for a problem without the vector epilogue (rule
    above)."""
    return best["SPLITS"] == 1 and prob.batch * prob.M >= WIDE_RULE_MIN_M and prob.N >= WIDE_N


# Epilogue ops that make the heuristic take the ping-pong schedule (BN 128). Measured on an H200
# (2026-12-01, tools/bench_gemm_sm90.py --epilogue bias-gelu, CUDA-graph replays): bias + GELU at
# 4096x3072x768 0.0466 ms against 0.0489 cooperative BN 256 (BN 192 ping-pong 0.0462), at
# 6304x3072x768 0.0751 against 0.0794 (BN 192 ping-pong 0.0769). Plain GEMMs stay cooperative
# (ping-pong won only at 6304x2304x768 there, by 3%). Other costly ops (Erf, Tanh, Sigmoid...) are
# not measured, so not listed.
PINGPONG_EPILOGUE_OPS = frozenset({"Gelu"})


def overlap_every(ktiles: int, bn: int) -> int:
    """K steps per epilogue chunk with OVERLAP: the BN / 32 chunks spread over the main loop (at
    most 3 steps apart, so the unrolled part of the loop stays small)."""
    return max(1, min(3, ktiles // (bn // 32)))


def valid(prob: Problem, p: dict[str, Any]) -> bool:
    bn, st, s, bm = p.get("BN"), p.get("STAGES"), p.get("SPLITS", 1), p.get("BM", BM)
    if bn not in TMA_BNS or bm not in BMS or not isinstance(st, int) or not isinstance(s, int):
        return False
    if bm != BM and (p.get("PINGPONG", 0) or p.get("OVERLAP", 0) or bn not in BM192_BNS):
        return False  # 512 threads: ptxas compiles for 128 registers, one accumulator array of BN / 2
    if p.get("PINGPONG", 0) not in (0, 1) or (p.get("PINGPONG") and (bn not in PINGPONG_BNS or s > 1)):
        return False  # a ping-pong warpgroup holds the whole 128 x BN accumulator; never won split
    ov = p.get("OVERLAP", 0)
    if ov not in (0, 1) or (ov and (bn not in OVERLAP_BNS or s > 1 or p.get("PINGPONG", 0))):
        return False
    if not 2 <= st <= max_stages(bn, bm) or s < 1 or s > max(1, ceil_div(prob.K, BK)):
        return False
    return unsupported(prob) is None


def _schedule(ctx: StepContext, p: dict[str, Any]) -> tuple[int, int]:
    """OVERLAP and WARP_EPI taken out of `p` (and put back only where set, so the parameters and
    cache keys of the other forms stay as they were), checked against the epilogue p["VEC_EPI"]:
    their per-warp chunks take the 8-column vector epilogue or the element-wise one (N % 8 != 0),
    not the accumulator-layout one."""
    overlap, warp_epi = int(p.pop("OVERLAP", 0)), int(p.pop("WARP_EPI", 0))
    for key, on in (("OVERLAP", overlap), ("WARP_EPI", warp_epi)):
        if on not in (0, 1):
            raise ctx.fail(f"TMA GEMM parameter {key}={on!r} (0, 1)")
        if on:
            p[key] = 1
        if on and p["VEC_EPI"] == 2:
            raise ctx.fail(
                f"TMA GEMM {key}=1 takes the 8-column vector epilogue (VEC_EPI 1) or the element-wise one (0)"
            )
    return overlap, warp_epi


# Output columns per call of the vector epilogue: VEC_EPI 1 reads 8 from the shared-memory buffer;
# VEC_EPI 2 takes the 2 consecutive columns each thread holds in the wgmma accumulator layout.
WIDTHS = {1: 8, 2: 2}


@dataclass
class VecInput:
    index: int  # node input index
    row: bool  # broadcast along the output row: one value serves all W columns
    storage: str  # its CUDA storage type
    vtype: str  # the vector type of W elements (row: unused)
    nv: int  # vectors per W elements
    offset: str  # its element offset for the first of the W outputs (an expression of `base`)


def _vec_type(itemsize: int, width: int) -> tuple[str, int]:
    """The vector type that moves `width` elements of `itemsize` bytes, and how many of it."""
    nbytes = width * itemsize
    if nbytes >= 16:
        return "uint4", nbytes // 16
    return {8: "uint2", 4: "unsigned", 2: "unsigned short"}[nbytes], 1


def vector_epilogue(prob: Problem, ops: dict, splits: int, width: int = 8) -> list[VecInput] | str:
    """The vector epilogue's inputs, or why the problem cannot have it. Each call stores `width`
    consecutive output columns of one row (N % width == 0, so they never cross a row); an epilogue
    input broadcast to the output either varies along the row (its last dim is N: `width`
    consecutive elements, aligned to their size since the offset of the first is a multiple of
    `width`) or not (last dim 1)."""
    if splits > 1:
        return "split-K (the reduce kernel runs the epilogue)"
    if prob.N % width:
        return f"N={prob.N} is not a multiple of {width}"
    out_shape = tuple(prob.out_shape)
    if not out_shape or out_shape[-1] != prob.N:
        return f"output shape {out_shape} does not end in N={prob.N}"
    used = {r.index for e in prob.epilogue for r in e.args if r.kind == "in"}
    used |= {r.index for r in prob.outputs if r.kind == "in"}
    got = []
    for i in sorted(used):
        op = ops.get(i)
        if op is None or (op.const is not None and op.const.size == 1):
            continue  # omitted, or baked in as a literal
        shape = tuple(op.shape)
        last = shape[-1] if shape else 1
        if last not in (1, prob.N):
            return f"epilogue input {i} of shape {shape} does not broadcast along rows of {prob.N}"
        ct = cuda_type(op.dtype)
        vtype, nv = _vec_type(op.dtype.itemsize, width)
        got.append(VecInput(i, last == 1, ct.storage, vtype, nv, broadcast_index(shape, out_shape, "base")))
    return got


def has_residual(prob: Problem, ops: dict) -> bool:
    """Whether the fused epilogue reads an input of the output's own shape (a residual)."""
    used = {r.index for e in prob.epilogue for r in e.args if r.kind == "in"}
    return any(
        (op := ops.get(i)) is not None and op.const is None and tuple(op.shape) == tuple(prob.out_shape) for i in used
    )


def pingpong_wide(p: dict[str, Any], bn: int) -> bool:
    """A ping-pong warpgroup with the per-warp epilogue holds two BN / 2 accumulator arrays as
    OVERLAP does: from BN 192 its epilogue inputs are loaded late (ov_late in the template)."""
    return bool(p.get("PINGPONG")) and bn > 128


def vec_epilogue_ok(prob: Problem, ops: dict, out_specs, byte_outputs: bool = False) -> bool:
    """Whether a one-slice launch of the problem gets the 8-column vector epilogue (VEC_EPI 1):
    its inputs broadcast along rows (vector_epilogue) and every output 2 or 4 bytes wide (or 1,
    with `byte_outputs`: the int8 GEMM's requantized outputs)."""
    if isinstance(vector_epilogue(prob, ops, 1, WIDTHS[1]), str):
        return False
    sizes = (1, 2, 4) if byte_outputs else (2, 4)
    return all(dtype_from_numpy_name(s.dtype).itemsize in sizes for s in out_specs)


def _tmap(tensor: str, dtype: DType, lay, k: int, tile_rows: int, batch: int) -> tuple[dict[str, Any], bool]:
    """The tensor-map spec of one operand and whether its batch coordinate moves. A box row is one
    128-byte swizzled line: BK elements of K (128 for 1-byte operands, which the map reads as raw
    bytes, "uint8": runtime/tensormap.py)."""
    e = dtype.itemsize
    bk = 128 // e
    bstride = lay.batch_strides[0] if lay.batch_strides else 0
    nb = batch if bstride else 1
    if lay.kcontig:
        dims, box = [k, lay.rows, nb], [bk, tile_rows, 1]
    else:
        dims, box = [lay.rows, k, nb], [64, bk, 1]
    plane = bstride * e if bstride else dims[1] * lay.pitch * e
    return {
        "tensor": tensor,
        "dtype": dtype.numpy.name if e > 1 else "uint8",
        "dims": dims,
        "strides": [lay.pitch * e, plane],
        "box": box,
        "swizzle": "128B",
    }, bool(bstride)


def _fast_gelu(function: str) -> str:
    """The epilogue function with GELU through sm90.cuh's gc_gelu_fast (erf form) and
    gc_gelu_tanh_fast (tanh form) instead of common.cuh's erff and tanhf (see there for their
    errors); the split-K reduce kernel keeps erff and tanhf."""
    return function.replace("gc_gelu(", "gc_gelu_fast(").replace("gc_gelu_tanh(", "gc_gelu_tanh_fast(")


def _vec_epilogue_vars(
    prob,
    ops,
    out_specs,
    rendered,
    splits: int,
    name: str,
    where: str,
    mode: int = 1,
    acc_dtype: DType | None = None,
    byte_outputs: bool = False,
    fast_div: bool = False,
) -> dict | None:
    """The template variables of the vector epilogue (VEC_EPI `mode`), or None (logged) where it
    does not apply. `acc_dtype`: the accumulator's type as the epilogue sees it (default: the
    problem's dtype; int32 for the int8 GEMM); `byte_outputs`: 1-byte outputs are packed too;
    `fast_div`: also a version with the divisions by constants through gc_div_const ("fast", or
    None where there is none)."""
    width = WIDTHS[mode]
    vins = vector_epilogue(prob, ops, splits, width)
    if isinstance(vins, str):
        if splits == 1:
            log.info("%s: element-wise epilogue stores: %s", where, vins)
        return None
    fn = render_epilogue(
        prob.epilogue,
        prob.outputs,
        ops,
        out_specs,
        prob.out_shape,
        prob.dtype if acc_dtype is None else acc_dtype,
        where=where,
        name=f"{name}_epi_v",
        value_inputs=frozenset(v.index for v in vins),
        out_index="0",
    )
    by_index = {v.index: v for v in vins}
    call = []
    for a in fn.args:  # s<i>: a loaded value; out<k>: the k-th output's register slot
        if a.startswith("s"):
            v = by_index[int(a[1:])]
            call.append(f"L.r{v.index}" if v.row else f"L.r{v.index}.e[k]")
        elif a.startswith("out"):
            call.append(f"w{a[3:]} + k")
        else:
            raise CompileError(f"{where}: vector epilogue argument {a} is neither a value nor an output")
    outs = []
    for k, spec in enumerate(out_specs):
        dt = dtype_from_numpy_name(spec.dtype)
        quads = _packed_words(f"w{k}", cuda_type(dt).storage, dt.itemsize, width, byte_outputs)
        if quads is None:
            log.info("%s: element-wise epilogue stores: output %d is %s", where, k, dt.name)
            return None
        outs.append({"storage": cuda_type(dt).storage, "quads": quads, "itemsize": dt.itemsize})
    fast = _fast_div_function(fn.function, f"{name}_epi_v") if fast_div else None
    return {"function": fn, "call": call, "inputs": vins, "outputs": outs, "width": width, "mode": mode, "fast": fast}


# A division by a float literal as codegen/expr.py renders it in an epilogue: ((v2) / (0.05f)).
_DIV_BY_LITERAL = re.compile(r"\(\(([vx]\d+)\) / \(([0-9][0-9.eE+-]*f)\)\)")


def _fast_div_function(function: str, name: str) -> str | None:
    """`function` (the vector epilogue NAME(...)) as NAME + "f"(..., bool& bad), its divisions by
    float literals c through gc_div_const with y = RN(1/c) (a hex literal, exact); None where it has
    none, or a divisor outside gc_div_const's range."""
    head = f"void {name}("
    if head not in function:
        return None

    def sub(m: re.Match) -> str:
        c = np.float32(float(m.group(2)[:-1]))
        if not 2.0**-60 <= abs(float(c)) <= 2.0**60:
            raise _NoFastDiv
        y = np.float32(1.0) / c  # IEEE: RN(1/c)
        return f"gc_div_const({m.group(1)}, {m.group(2)}, {float(y).hex()}f, bad)"

    try:
        body, n = _DIV_BY_LITERAL.subn(sub, function)
    except _NoFastDiv:
        return None
    if n == 0:
        return None
    first, rest = body.split("\n", 1)
    assert first.endswith(") {"), first
    return first.replace(head, f"void {name}f(")[: -len(") {")] + ", bool& bad) {\n" + rest


class _NoFastDiv(Exception):
    pass


def _packed_words(
    var: str, storage: str, itemsize: int, width: int, byte_outputs: bool = False
) -> list[list[str]] | None:
    """The 32-bit words of the `width` elements var[0..], at most four per store (one 4-, 8- or
    16-byte store per group). Packed by shifts: a union of a vector and the elements would be split
    by the compiler into 16-bit stores. 1-byte elements only with `byte_outputs` (4 a word)."""
    if itemsize == 1 and byte_outputs and width % 4 == 0:
        b = [f"(unsigned)(unsigned char){var}[{j}]" for j in range(width)]
        w = ["(" + " | ".join(f"({b[4 * j + i]} << {8 * i})" for i in range(4)) + ")" for j in range(width // 4)]
    elif itemsize == 2:
        w = [
            f"((unsigned)(unsigned short){var}[{2 * j}] | ((unsigned)(unsigned short){var}[{2 * j + 1}] << 16))"
            for j in range(width // 2)
        ]
    elif itemsize == 4:
        w = [f"__float_as_uint({var}[{j}])" if storage == "float" else f"(unsigned){var}[{j}]" for j in range(width)]
    else:
        return None
    return [w[i : i + 4] for i in range(0, len(w), 4)]


@dataclass(frozen=True)
class Elem:
    """The operand element type as the kernel's wgmma reads it: a stage row is one 128-byte
    swizzled line (BK = 128 / itemsize elements of K), one wgmma takes 32 bytes of K."""

    ptx: str  # the wgmma operand type: f16, bf16, s8, e4m3
    itemsize: int
    acc: str  # the accumulators' C type: float (f32) or int (s32)

    @property
    def bk(self) -> int:
        return 128 // self.itemsize

    @property
    def wk(self) -> int:
        return 32 // self.itemsize

    def wgmma_imm(self, trans_a: int, trans_b: int) -> str:
        """The wgmma operands after scale-d: imm-scale-a/b (1: no negation) and, for 16-bit types,
        the transpose flags; s8 takes none, e4m3 no transpose (K-major operands only)."""
        if self.ptx in ("f16", "bf16"):
            return f", 1, 1, {trans_a}, {trans_b}"
        return "" if self.ptx == "s8" else ", 1, 1"


ELEMS = {
    DType.float16: Elem("f16", 2, "float"),
    DType.bfloat16: Elem("bf16", 2, "float"),
    DType.int8: Elem("s8", 1, "int"),
}
E4M3 = Elem("e4m3", 1, "float")


def _render(
    common: dict[str, Any],
    name: str,
    kparams: list[str],
    prob,
    elem: Elem,
    p: dict[str, Any],
    vec: dict | None,
    *,
    overlap: int,
    warp_epi: int,
    ktiles: int,
    kt_per: int,
    a_batched: bool,
    b_batched: bool,
) -> str:
    """The kernel source of gemm_sm90.cu.j2 for a problem of `elem` operands (fp16/bf16: the same
    source as before the element type became a parameter)."""
    bn, bm = p["BN"], p.get("BM", BM)
    trans_a, trans_b = int(not prob.a.kcontig), int(not prob.b.kcontig)
    return render(
        "gemm_sm90.cu.j2",
        **common,
        name=name,
        kparams=kparams,
        M=prob.M,
        N=prob.N,
        K=prob.K,
        BM=bm,
        nc=consumers(bm),
        threads=threads(bm),
        regs=REGS[consumers(bm)],
        BN=bn,
        STAGES=p["STAGES"],
        splits=p["SPLITS"],
        kt_per_split=kt_per,
        batch=prob.batch,
        group_m=8,
        pingpong=bool(p.get("PINGPONG", 0)),
        overlap=bool(overlap),
        warp_epi=bool(warp_epi and not overlap),  # OVERLAP's epilogue is per warp already
        ov_late=bool(vec and vec["inputs"] and (overlap and bn > 128 or pingpong_wide(p, bn))),
        overlap_every=overlap_every(ktiles, bn),
        a_kcontig=prob.a.kcontig,
        b_kcontig=prob.b.kcontig,
        ab_type=elem.ptx,
        d_type="f32" if elem.acc == "float" else "s32",
        acc_t=elem.acc,
        acc_c="f" if elem.acc == "float" else "r",
        zero="0.f" if elem.acc == "float" else "0",
        BK=elem.bk,
        ES=elem.itemsize,
        WK=elem.wk,
        wgmma_imm=elem.wgmma_imm(trans_a, trans_b),
        a_batched=a_batched,
        b_batched=b_batched,
        vec=vec,
    )


def generate(
    ctx: StepContext, params: dict[str, Any] | None = None, prob: Problem | None = None, family: str = "gemm"
) -> list[KernelSource]:
    """The kernels of the step (its GEMM problem: problem_of, unless another family gives one, as
    conv_sm90 does for a 1x1 convolution; A is the step's input 0 and B its input 1)."""
    step = ctx.step
    where = f"{step.kind} node '{step.name}'"
    prob = prob if prob is not None else problem_of(ctx)
    why = unsupported(prob)
    if why is not None:
        raise ctx.fail(f"no TMA GEMM: {why}")
    params = {
        k: v
        for k, v in (params or {}).items()
        if k in ("BM", "BN", "STAGES", "SPLITS", "PINGPONG", "OVERLAP", "WARP_EPI", "VEC_EPI", "FAST_GELU")
    }
    vec_epi, fast_gelu = params.pop("VEC_EPI", 1), params.pop("FAST_GELU", 1)
    if vec_epi not in (0, 1, 2) or fast_gelu not in (0, 1):
        raise ctx.fail(f"TMA GEMM parameters VEC_EPI={vec_epi!r} (0, 1, 2), FAST_GELU={fast_gelu!r} (0, 1)")
    ops = step_operands(ctx)
    out_specs = [ctx.tensors[o] for o in step.outputs]
    if "BN" in params:  # a forced tile: one K slice, cooperative, the deepest ring unless named
        bm = params.get("BM", BM)
        p = {
            "SPLITS": 1,
            "PINGPONG": 0,
            "OVERLAP": 0,
            "STAGES": max_stages(params["BN"], bm) if params["BN"] in TMA_BNS and bm in BMS else 0,
            **params,
        }
    else:
        vec_ok = vec_epi == 1 and vec_epilogue_ok(prob, ops, out_specs)
        p = {**heuristic(prob, vec_ok, has_residual(prob, ops)), **params}
    if not valid(prob, p):
        raise ctx.fail(f"TMA GEMM parameters {p} are not valid for M={prob.M} N={prob.N} K={prob.K}")
    bn, stages, bm = p["BN"], p["STAGES"], p.pop("BM", BM)
    if bm != BM:  # put back only where set: the 128-row forms keep their parameters and cache keys
        p["BM"] = bm
    ktiles = ceil_div(prob.K, BK)
    kt_per = ceil_div(ktiles, p["SPLITS"])
    splits = ceil_div(ktiles, kt_per)  # no empty slice
    p["SPLITS"] = splits
    name = ctx.kernel_name()
    rendered = render_epilogue(
        prob.epilogue, prob.outputs, ops, out_specs, prob.out_shape, prob.dtype, where=where, name=f"{name}_epi"
    )
    fast_gelu = int(fast_gelu and splits == 1)  # the reduce kernel (split-K) has no sm90.cuh
    if fast_gelu:
        rendered.function = _fast_gelu(rendered.function)
    c_expr, c_ptr = _c_expr(ctx, prob, ops)
    out_names, out_decls = _kernel_args(ctx, prob, rendered, c_ptr)
    out_args = (["Cm"] if c_ptr else []) + list(rendered.args)
    ct = cuda_type(prob.dtype)
    vec = _vec_epilogue_vars(prob, ops, out_specs, rendered, splits, name, where, vec_epi) if vec_epi else None
    if vec is not None and fast_gelu:
        vec["function"].function = _fast_gelu(vec["function"].function)
    p["VEC_EPI"] = vec["mode"] if vec is not None else 0
    overlap, warp_epi = _schedule(ctx, p)
    p["FAST_GELU"] = fast_gelu
    ta, a_batched = _tmap(step.inputs[0], prob.dtype, prob.a, prob.K, bm, prob.batch)
    tb, b_batched = _tmap(step.inputs[1], prob.dtype, prob.b, prob.K, bn, prob.batch)
    common = {
        "epilogue": rendered,
        "epilogue_name": f"{name}_epi",
        "st": ct.storage,
        "ct": ct.compute,
        "alpha_lit": None if prob.alpha == 1.0 else lit(prob.alpha, ct.compute),
        "c_param": c_ptr,
        "c_expr": c_expr,
        "out_args": out_args,
    }
    tparams = ["const gc_tmap* __restrict__ tA", "const gc_tmap* __restrict__ tB"]
    if splits > 1:  # fp32 partials to the workspace; the family's "reduce" kernel runs the epilogue
        kparams, kargs = [*tparams, "float* __restrict__ ws"], ["@tmap:0", "@tmap:1", "@workspace"]
    else:
        kparams, kargs = tparams + out_decls, ["@tmap:0", "@tmap:1", *out_names]
    source = _render(
        common,
        name,
        kparams,
        prob,
        ELEMS[prob.dtype],
        p,
        vec,
        overlap=overlap,
        warp_epi=warp_epi,
        ktiles=ktiles,
        kt_per=kt_per,
        a_batched=a_batched,
        b_batched=b_batched,
    )
    n_units = units(prob, bn, splits, bm)
    kp = {
        "path": "tma",
        **p,
        "M": prob.M,
        "N": prob.N,
        "K": prob.K,
        "batch": prob.batch,
        "a": "k" if prob.a.kcontig else "mn",
        "b": "k" if prob.b.kcontig else "mn",
        "requires_arch": "sm_90a",
        "tmaps": [ta, tb],
        # the grid is min(work units, 132 SMs of an H100/H200 SXM); the runtime lowers it to the
        # device's SM count (an H100 PCIe has 114), which the unit loop (stride gridDim.x) allows
        "persistent": True,
    }
    total = prob.batch * prob.M * prob.N
    ws_bytes = splits * total * 4 if splits > 1 else 0
    kernels = [
        KernelSource(
            family,
            name,
            source,
            (min(n_units, SM_COUNT), 1, 1),
            (threads(bm), 1, 1),
            kargs,
            shared_bytes(bn, stages, bm),
            params=kp,
            workspace_bytes=ws_bytes,
        )
    ]
    if splits > 1:
        kernels.append(split_reduce_kernel(family, name, common, out_decls, out_names, total, splits, ws_bytes))
    return kernels


# ---- selection (measured on an H200: docs/results/gemm_sm90.md) ----------------------------------
# fp16/bf16, CUDA-graph replays, ratio = cuBLAS time / ours, same run:
# - M >= 4096 (batches folded in; BERT/GPT-2 at batch 32, ViT-B/16's 6304), N, K in 768..3072, and
#   4096^3 / 8192^3: the TMA GEMM 0.68-0.99x, the cp.async wgmma path 0.41-0.72x, mma.sync
#   0.26-0.43x. -> TMA.
# - M <= 256 (batch 1) with K >= 3072: TMA with split-K (8 slices) 0.99-1.01x, wgmma 0.79-0.98x. -> TMA.
# - M <= 256 with K = 768: the wgmma path as fast or faster (0.56-0.75x against 0.60-0.75x, 128-row
#   tiles leave most SMs idle) -> not TMA (the older rule decides).
# - 256 < M < 4096 (batch 3-24 of a 128-token model), N, K in 768..3072: the rules below
#   (MID_M_*, measured 2026-12-01 16:16 UTC, tools/bench_gemm_small_m.py --mid,
#   docs/results/gemm_mid_m_h200_2026-12-01.md).
# The tile choice inside (heuristic()) matched the best measured variant within 4% on every M >= 4096
# shape; the ping-pong schedule won only at 6304x2304x768 (+3%), so the heuristic stayed cooperative;
# later the OVERLAP rule (overlap_rule, beside heuristic()) replaced it at N, K in 768..3072.
SELECT_MIN_M = 4096
SMALL_M_MAX = 256
SMALL_M_MIN_K = 3072


def selected(prob: Problem) -> bool:
    """Whether an sm_90 engine runs this problem on the TMA GEMM rather than the older paths."""
    if unsupported(prob) is not None or prob.N < 128 or prob.K < 128:
        return False
    if mid_m(prob):
        return True
    return prob.M >= SELECT_MIN_M or (prob.M <= SMALL_M_MAX and prob.K >= SMALL_M_MIN_K)


# 256 < M < 4096 on an H200 (fp16, B [K, N], us per launch, CUDA-graph replays; the engine's path
# before: mma.sync below M = 512, the cp.async wgmma heuristic above):
# - the TMA GEMM's heuristic was the fastest variant, or within 11% of it, on 23 of the 28 shapes and
#   1.3-2.8x faster than the old path on all of them: 1536x3072x768 18.6 (old 32.7, cuBLAS 13.6),
#   2048x2304x768 18.9 (32.5; 13.7), 3072x768x3072 27.3 (44.1; 22.7), 384x768x3072 9.7 (27.4; 8.4).
# - N = K = 768 with M <= 1024 then took the cp.async wgmma kernel with cluster split-K (the
#   small-M rule): 384 5.7, 512 6.3, 1024 7.9 against TMA's 7.7 / 8.1 / 9.6 at BN 128 or wider.
#   Since 2026-12-04 the TMA GEMM's BN 64 tile (heuristic()'s mid-M tile rule) is faster there in
#   the same run (tools/bench_gemm_small_m.py --mid; docs/results/gemm_sm90_mid_2026-12-04.md):
#   384 5.3 against the cluster kernel's 5.8, 512 5.25 against 6.2, 1024 5.4 against 8.0 (cuBLAS
#   4.3 / 4.7 / 4.9), so every mid-M problem runs on the TMA GEMM. (That cluster rule had also
#   counted one batch only: BERT-base's batched Q/K/V GEMM at batch 8, 3 x 1024x768x768, ran the
#   wgmma kernel unsplit, 576 tiles of 64 x 64; graphc was 1.2x torch.compile on BERT-base and GPT-2
#   at batch 8, docs/results/h200_vs_torch_b8_2026-12-03.md, 0.94 and 1.02 after both changes.)
# Shapes with N or K below 768 were not measured and keep the older paths.
MID_M_MIN_NK = 768


def mid_m(prob: Problem) -> bool:
    """Whether the 256 < M < 4096 rules above decide (fp16/bf16, N and K at least MID_M_MIN_NK)."""
    return (
        prob.dtype in (DType.float16, DType.bfloat16)
        and SMALL_M_MAX < prob.M < SELECT_MIN_M
        and min(prob.N, prob.K) >= MID_M_MIN_NK
    )


# Small-M GEMMs (M <= SMALL_M_MAX with batches folded in: batch-1 linear layers) on an sm_90 engine,
# measured on an H200 (2026-12-01, tools/bench_gemm_small_m.py [--rules], fp16, CUDA-graph replays,
# us per launch, docs/results/gemm_small_m_h200_2026-12-01.md). Main's default before: mma.sync with
# one-launch (serial) split-K, 10.7-17.6 us at K = 768.
# - K >= 3072 (128/197 x 768 x 3072): TMA with 8 K slices 8.2-8.4 / 8.6-8.7 (cuBLAS 8.1 / 8.6-8.7);
#   wgmma with cluster split-K 8.0 / 8.9, within noise. -> TMA (the rule above). Re-measured
#   2026-12-02 (docs/results/h200_gemm_small_m_k3072_2026-12-02.txt): at 128 rows the wgmma cluster
#   with S 8 is 6.9 us alone (TMA 8.2, cuBLAS 7.3), at 197 rows 11.5 (S 4 8.8, TMA 8.6); in the
#   whole zoo BERT-base / ViT-B/16 at batch 1 it saved 12 launches but no time (replay 0.448 /
#   0.547 ms against the rule's 0.446 / 0.533): cluster kernels launch without PDL. -> TMA stays.
# - N >= 8192 (GPT-2's lm_head, 128 x 50257 x 768, B [N, K]): TMA BN 128 without split 28.4-28.9
#   (the default mma.sync 70.0-70.4, cuBLAS 144-145 through torch.matmul). -> TMA, BN 128, no
#   split. With B [K, N] and N odd (no TMA, no wgmma: rows not 16-byte aligned) mma.sync 128 x 64
#   without split 156-157 against 262 for the default 128 x 128. -> that tile.
# - otherwise (N 768..3072, K 768): the cp.async wgmma kernel, 64 x 64 tiles, split-K across a
#   cluster of S CTAs: 128x768x768 4.5 (S 4; cuBLAS 3.9, two-launch split 7.2, main 16.1),
#   197x768x768 5.3 (S 4; cuBLAS 4.3), 128x2304x768 6.1 (S 3; unsplit 6.8, cuBLAS 4.9),
#   128x3072x768 6.7 (S 2; unsplit 6.9, cuBLAS 4.9), 197x2304x768 7.7 and 197x3072x768 7.8 (S 2;
#   TMA unsplit 8.0 / 8.1, cuBLAS 4.8 / 5.3). S is the largest of 4, 3, 2 that keeps tiles * S
#   within 2 waves of CTAs (S 4 at 128x2304 was 6.5, S 3 at 128x3072 6.8) and 3 K tiles a slice;
#   more than 2 waves of tiles: no split (not measured). -> WGMMA_CLUSTER_*.
# - where the wgmma kernel cannot take the operands (rows not 16-byte aligned): mma.sync with
#   cluster split-K (gemm.cluster_heuristic, its latency model): 5.2-5.3 / 6.3-6.4 us at N = K = 768.
WIDE_N = 8192
# K >= SMALL_M_MIN_K on the wgmma kernel with 8 K slices as one cluster (deep_k_cluster_params; one
# launch instead of the TMA GEMM and its reduce kernel) instead of the TMA rule above: off, as it saved
# launches but no time while cluster kernels launch plain; tools/bench_small_m_rule.py times it with
# GEMM clusters under PDL (runtime/pdl.py GRAPHC_PDL_CLUSTERS), not yet run.
DEEP_K_CLUSTER = False
WGMMA_CLUSTER_TILE = (64, 64)
WGMMA_CLUSTER_SPLITS = (4, 3, 2)


def wgmma_cluster_params(prob: Problem) -> dict[str, Any] | None:
    """The wgmma kernel with cluster split-K by the rule above, or None where it does not apply."""
    bm, bn = WGMMA_CLUSTER_TILE
    tiles = ceil_div(prob.M, bm) * ceil_div(prob.N, bn) * prob.batch
    ktiles = ceil_div(prob.K, 64)
    splits = 1
    if tiles <= 2 * SM_COUNT:
        fits = [s for s in WGMMA_CLUSTER_SPLITS if tiles * s <= 2 * SM_COUNT and ktiles // s >= 3]
        splits = fits[0] if fits else (2 if ktiles >= 6 else 1)
    p: dict[str, Any] = {"path": "wgmma", "BM": bm, "BN": bn, "BK": 64, "STAGES": 4 if splits > 1 else 6}
    p["SPLITS"] = splits
    if splits > 1:
        p["CLUSTER"] = 1
    return p if gemm_valid(prob, p) else None


# Row-norm epilogues (passes/fuse_residual_norm.py: GEMM + residual + LayerNorm/RMSNorm, batch-1-like
# rows) on sm_90: the TMA GEMM has no such epilogue, so the cp.async wgmma kernel with cluster split-K,
# whose last cluster to store a band of 64 rows normalizes it with all its CTAs (gemm_common.cu.j2
# rownorm_finish), by the small-M rule above; with K >= SMALL_M_MIN_K 8 K slices where 8 CTAs a tile
# stay within 2 waves (128 x 768 x 3072: the cluster with S 8 6.9 us alone, the TMA GEMM with its
# reduce launch 8.2, the rule above). Before this, such steps ran on mma.sync (10.7-17.6 us).
ROWNORM_DEEP_K_SPLITS = 8


def deep_k_cluster_params(prob: Problem) -> dict[str, Any] | None:
    """The wgmma kernel with ROWNORM_DEEP_K_SPLITS K slices as one cluster, for K >= SMALL_M_MIN_K
    where 8 CTAs a tile stay within 2 waves and each slice keeps 3 K tiles; else None."""
    p = wgmma_cluster_params(prob)
    if p is None:
        return None
    bm, bn = WGMMA_CLUSTER_TILE
    tiles = ceil_div(prob.M, bm) * ceil_div(prob.N, bn) * prob.batch
    s = ROWNORM_DEEP_K_SPLITS
    if prob.K >= SMALL_M_MIN_K and tiles * s <= 2 * SM_COUNT and ceil_div(prob.K, 64) // s >= 3:
        deep = {**p, "SPLITS": s, "CLUSTER": 1, "STAGES": 4}
        if gemm_valid(prob, deep):
            return deep
    return None


def rownorm_params(prob: Problem) -> dict[str, Any] | None:
    """The wgmma cluster parameters of a GEMM with a row-norm epilogue on sm_90, or None (the
    default path: mma.sync with one-launch split-K)."""
    return deep_k_cluster_params(prob) or wgmma_cluster_params(prob)


def select_rownorm(ctx: StepContext) -> list[KernelSource]:
    """The kernel of an sm_90 engine's GEMM step with a row-norm epilogue by the rule above; []
    where it does not apply (the caller takes the default path)."""
    prob = _half_problem(ctx)
    p = None if prob is None else rownorm_params(prob)
    if p is None:
        return []
    try:
        return _generate(ctx.with_params(p))
    except CompileError as e:
        log.info("%s: no wgmma row-norm GEMM (%s); the default path instead", ctx.step.name, e)
        return []


def small_m_params(prob: Problem) -> tuple[str, dict[str, Any]]:
    """("tma" | "gemm", parameters) of a small-M problem on sm_90 by the rules above."""
    tma_ok = unsupported(prob) is None and prob.N >= 128 and prob.K >= 128
    if tma_ok and prob.K >= SMALL_M_MIN_K:
        deep = deep_k_cluster_params(prob) if DEEP_K_CLUSTER else None
        if deep is not None:
            return "gemm", deep
        return "tma", heuristic(prob)
    if prob.N >= WIDE_N:
        if tma_ok:
            return "tma", {"BN": 128, "STAGES": max_stages(128), "SPLITS": 1, "PINGPONG": 0}
        return "gemm", {"path": "mma", "BM": 128, "BN": 64, "BK": 32, "WM": 2, "WN": 2, "STAGES": 4, "SPLITS": 1}
    wg = wgmma_cluster_params(prob)
    if wg is not None:
        return "gemm", wg
    return "gemm", public(cluster_heuristic(prob))


def _half_problem(ctx: StepContext) -> Problem | None:
    """The step's GEMM problem where the sm_90 rules may take it (fp16/bf16 engines), else None."""
    if ctx.precision not in ("fp16", "bf16"):
        return None
    try:
        return problem_of(ctx)
    except CompileError:
        return None


def select(ctx: StepContext) -> list[KernelSource]:
    """The kernels of an sm_90 engine's GEMM step where the measured rules choose a Hopper path
    (the TMA GEMM; for small M also the wgmma kernel or cluster split-K); [] elsewhere (the caller
    takes the default path, which is logged)."""
    prob = _half_problem(ctx)
    if prob is None:
        return []
    if small_m(prob):
        kind, p = small_m_params(prob)
        log.debug("%s: small-M GEMM on %s %s", ctx.step.name, kind, p)
        return generate(ctx, p) if kind == "tma" else _generate(ctx.with_params(p))
    if not selected(prob) and not narrow_mlp(prob):
        log.debug("%s: not on the TMA GEMM (M=%d N=%d K=%d)", ctx.step.name, prob.M, prob.N, prob.K)
        return []
    return generate(ctx)


# MatMuls with many rows and one of N, K narrow (ConvNeXt-T's and Swin-T's stage-0/1 MLPs: 96..768
# channels, 4x expansion), measured on an H200 (2026-12-03, tools/bench_gemm_sm90.py --lean, fp16, B
# [N, K], CUDA-graph replays, cuBLAS time / ours; docs/results/gemm_sm90_narrow_mlp_2026-12-03.md):
# the TMA heuristic against the default path (mma.sync) the engine ran before:
#   100352x384x96 0.72 (0.30), 100352x96x384 0.96 (0.40)   (batch 32, stage 0)
#   3136x384x96 0.75 (0.51), 3136x96x384 0.65 (0.49), 784x768x192 0.72 (0.49), 784x192x768 0.59 (0.32)
# ConvNeXt-T at batch 32 went from 3.14 to 2.09 ms. 1x1 convolutions keep their own rules
# (conv_sm90.select calls selected() only): not measured with these channel counts.
NARROW_MLP_MIN_M = 784
NARROW_MLP_MIN_NK = 96


def narrow_mlp(prob: Problem) -> bool:
    """Whether a MatMul outside selected()'s measured ranges takes the TMA GEMM by the rule above."""
    return (
        unsupported(prob) is None
        and prob.dtype in (DType.float16, DType.bfloat16)
        and prob.batch * prob.M >= NARROW_MLP_MIN_M
        and min(prob.N, prob.K) >= NARROW_MLP_MIN_NK
        and not mid_m(prob)
    )


# Smaller N or K than this keep the default path: the rules were measured from 768 up.
SMALL_M_MIN_NK = 256


def small_m(prob: Problem) -> bool:
    """Whether the small-M rules (small_m_params) decide: fp16/bf16 with M <= SMALL_M_MAX (batches
    folded in) and N, K >= SMALL_M_MIN_NK."""
    return (
        prob.dtype in (DType.float16, DType.bfloat16)
        and prob.M <= SMALL_M_MAX
        and min(prob.N, prob.K) >= SMALL_M_MIN_NK
    )


# ---- int8: s8 x s8 -> s32 (the gemm_int8 family's problems) -----------------------------------
# The same kernel with wgmma m64nBNk32.s32.s8.s8: a 128-byte stage row is 128 K values, both
# operands K-major (how passes/quantize_int8.py lays out an int8 MatMul: rows [M, K], weight
# [N, K]), int32 accumulators through an int32 epilogue buffer into the int8 family's fused
# epilogue (int32 bias, per-channel dequantize, activation, residual, requantize), rendered with an
# int32 accumulator as gemm_int8.py does, so the integer sums stay exact. One K slice (a split would
# need int32 partials and a reduce kernel of its own). Convolutions through a patch matrix in the
# workspace keep gemm_int8's cp.async kernels (the workspace has no tensor map).

INT8_KEYS = ("BN", "STAGES", "PINGPONG", "OVERLAP", "WARP_EPI", "VEC_EPI", "FAST_DIV")
INT8_BK = ELEMS[DType.int8].bk


def int8_unsupported(prob) -> str | None:
    """Why the TMA GEMM cannot run an int8 problem (gemm_int8.Int8Problem), or None."""
    if prob.conv is not None:
        return "a convolution through its patch matrix (the workspace has no tensor map)"
    if prob.batch_dims:
        return "a batched int8 GEMM"
    if not (prob.a.kcontig and prob.b.kcontig):
        return "an operand that is not K-contiguous (int8 wgmma reads K-major operands only)"
    for name, lay in (("A", prob.a), ("B", prob.b)):
        if lay.rows > 1 and lay.pitch % 16:
            return f"{name}'s rows are not 16-byte aligned (TMA needs 16-byte strides)"
    if prob.K < 1 or prob.M < 1 or prob.N < 1:
        return "an empty problem"
    return None


def int8_valid(prob, p: dict[str, Any]) -> bool:
    bn, st = p.get("BN"), p.get("STAGES")
    if bn not in BNS or not isinstance(st, int) or not 2 <= st <= max_stages(bn) or p.get("SPLITS", 1) != 1:
        return False
    if p.get("PINGPONG", 0) not in (0, 1) or (p.get("PINGPONG") and bn not in PINGPONG_BNS):
        return False
    ov = p.get("OVERLAP", 0)
    if ov not in (0, 1) or (ov and (bn not in OVERLAP_BNS or p.get("PINGPONG", 0))):
        return False
    return int8_unsupported(prob) is None


# The 1-byte schedules, measured on an H200 (2026-12-02, tools/bench_int8.py --tma-sweep and
# tools/bench_fp8.py --sweep, single launches, ms; docs/results/int8_cuda.md). int8 with the
# requantizing epilogue (bias, per-channel dequantize, Relu, QuantizeLinear), FAST_DIV on:
#   4096 x 3072 x 768: ping-pong BN 192 0.0415, BN 128 0.0423; cooperative BN 128 0.0459, BN 192
#     0.0467; OVERLAP BN 192 0.0550 (3.9 tiles a CTA)
#   4096 x 2304 x 768: cooperative BN 192 0.0371; ping-pong BN 192 0.0380; OVERLAP 0.0458 (2.9 a CTA)
#   4096 x 768 x 3072: cooperative BN 192 0.0255; ping-pong 0.0288; OVERLAP 0.0300 (one tile a CTA)
#   4096 x 768 x 768: cooperative BN 192 0.0180; OVERLAP 0.0196; ping-pong 0.0210
#   8192^3: OVERLAP BN 192 0.917 (the only schedule measured there)
# -> ping-pong BN 192 from INT8_PINGPONG_TILES tiles (of BN 192) a CTA with K within the measured
# 3072, OVERLAP BN 192 for larger K from two tiles a CTA, else cooperative at the wave model's
# width (BN 192 at the shapes above but 4096 x 3072 x 768, where it takes 256).
# FP8 (fp16 out, no epilogue inputs) behaves as fp16 does: OVERLAP BN 192 was the fastest or within
# 6% at every shape with two or more tiles a CTA (4096 x 2304 x 768 0.0338 against 0.0406-0.0428
# for the others), the cooperative BN 192 otherwise (4096 x 768 x 3072 0.0361).
INT8_PINGPONG_TILES = 3.5
INT8_PINGPONG_MAX_K = 3072


def int8_heuristic(prob, vec_ok: bool = True, light_epilogue: bool = False) -> dict[str, Any]:
    """The tile width by the wave model of heuristic() (K steps of 128), then the schedule by the
    rules above (`light_epilogue`: FP8's, else int8's); OVERLAP only where the vector epilogue
    applies (`vec_ok`)."""
    ktiles = ceil_div(prob.K, INT8_BK)
    best, best_cost = 0, float("inf")
    for bn in BNS:
        cost = ceil_div(units(prob, bn, 1), SM_COUNT) * BM * bn * ktiles / _EFF[bn]
        if cost < best_cost * 0.999:
            best, best_cost = bn, cost
    p: dict[str, Any] = {"BN": best, "SPLITS": 1, "PINGPONG": 0}
    per_cta = units(prob, OVERLAP_RULE_BN, 1) / SM_COUNT
    overlap_ok = vec_ok and prob.N % 8 == 0 and per_cta >= 2
    if light_epilogue or prob.K > INT8_PINGPONG_MAX_K:
        if overlap_ok:
            p = {"BN": OVERLAP_RULE_BN, "SPLITS": 1, "PINGPONG": 0, "OVERLAP": 1}
    elif per_cta >= INT8_PINGPONG_TILES:
        p = {"BN": OVERLAP_RULE_BN, "SPLITS": 1, "PINGPONG": 1}
    p["STAGES"] = max_stages(p["BN"])
    return p


def _rows_view(prob, ops: dict) -> tuple[Any, dict]:
    """The problem and its operands with the output's trailing unit dims dropped: an int8 MatMul's
    rows [M, N, 1, 1] (passes/quantize_int8.py) seen as [M, N], its bias [N, 1, 1] as [N], so that
    the vector epilogue finds N last. The same linear indices (the dropped dims are all 1)."""
    from dataclasses import replace

    shape = tuple(prob.out_shape)
    t = 0
    while len(shape) - t > 1 and shape[len(shape) - 1 - t] == 1:
        t += 1
    if t == 0:
        return prob, ops
    view = {}
    for i, op in ops.items():
        d = min(t, len(op.shape))
        assert all(x == 1 for x in op.shape[len(op.shape) - d :]), (op.shape, shape)
        view[i] = replace(op, shape=tuple(op.shape[: len(op.shape) - d]))
    return replace(prob, out_shape=shape[: len(shape) - t]), view


def generate_int8(ctx: StepContext, prob, params: dict[str, Any] | None = None) -> list[KernelSource]:
    """The int8 TMA GEMM of a gemm_int8 step (`prob`: its gemm_int8.Int8Problem); `params` forces
    INT8_KEYS (a BN alone: cooperative, the deepest ring), else int8_heuristic."""
    step = ctx.step
    why = int8_unsupported(prob)
    if why is not None:
        raise ctx.fail(f"no int8 TMA GEMM: {why}")
    params = {k: v for k, v in (params or {}).items() if k in INT8_KEYS}
    vec_epi, fast_div = params.pop("VEC_EPI", 1), params.pop("FAST_DIV", 1)
    if vec_epi not in (0, 1, 2) or fast_div not in (0, 1):
        raise ctx.fail(f"int8 TMA GEMM parameters VEC_EPI={vec_epi!r} (0, 1, 2), FAST_DIV={fast_div!r} (0, 1)")
    prob, ops = _rows_view(prob, step_operands(ctx))
    out_specs = [ctx.tensors[o] for o in step.outputs]
    if "BN" in params:
        stages = max_stages(params["BN"]) if params["BN"] in BNS else 0
        p = {"SPLITS": 1, "PINGPONG": 0, "OVERLAP": 0, "STAGES": stages, **params}
    else:
        vec_ok = vec_epi == 1 and vec_epilogue_ok(prob, ops, out_specs, byte_outputs=True)
        p = {**int8_heuristic(prob, vec_ok), **params}
    if not int8_valid(prob, p):
        raise ctx.fail(f"int8 TMA GEMM parameters {p} are not valid for M={prob.M} N={prob.N} K={prob.K}")
    return one_byte_kernel(
        ctx,
        prob,
        ops,
        p,
        vec_epi,
        fast_div,
        elem=ELEMS[DType.int8],
        acc_dtype=DType.int32,
        types={"st": "signed char", "ct": "int", "alpha_lit": None},
        family="gemm_int8",
        path="int8_tma",
        extra={"VEC_A": 1, "VEC_B": 1},
    )


def one_byte_kernel(
    ctx: StepContext,
    prob,
    ops: dict,
    p: dict[str, Any],
    vec_epi: int,
    fast_div: int,
    *,
    elem: Elem,
    acc_dtype: DType,
    types: dict[str, Any],
    family: str,
    path: str,
    extra: dict[str, Any],
) -> list[KernelSource]:
    """The TMA GEMM kernel of a step on 1-byte K-major operands (int8, e4m3) with the chosen
    parameters `p` (int8 and gemm_fp8 choose them): `acc_dtype` is the accumulator's type as the
    epilogue sees it (int32 for int8, the anchor's output for e4m3), `types` the template's st / ct /
    alpha_lit; the launch's parameters are `path`, the schedule, the shape and `extra`."""
    step = ctx.step
    where = f"{step.kind} node '{step.name}'"
    bn, stages = p["BN"], p["STAGES"]
    ktiles = ceil_div(prob.K, elem.bk)
    name = ctx.kernel_name()
    out_specs = [ctx.tensors[o] for o in step.outputs]
    rendered = render_epilogue(
        prob.epilogue, prob.outputs, ops, out_specs, prob.out_shape, acc_dtype, where=where, name=f"{name}_epi"
    )
    out_names = [step.inputs[i] for i in rendered.inputs] + list(step.outputs[: len(rendered.outputs)])
    vec = None
    if vec_epi:
        vec = _vec_epilogue_vars(
            prob,
            ops,
            out_specs,
            rendered,
            1,
            name,
            where,
            vec_epi,
            acc_dtype=acc_dtype,
            byte_outputs=True,
            fast_div=bool(fast_div),
        )
    p["VEC_EPI"] = vec["mode"] if vec is not None else 0
    p["FAST_DIV"] = int(vec is not None and vec["fast"] is not None)
    overlap, warp_epi = _schedule(ctx, p)
    ta, _ = _tmap(prob.inputs[0], DType.int8, prob.a, prob.K, BM, 1)  # 1-byte maps read raw bytes
    tb, _ = _tmap(prob.inputs[1], DType.int8, prob.b, prob.K, bn, 1)
    common = {
        "epilogue": rendered,
        "epilogue_name": f"{name}_epi",
        **types,
        "c_param": False,
        "c_expr": None,
        "out_args": list(rendered.args),
    }
    kparams = ["const gc_tmap* __restrict__ tA", "const gc_tmap* __restrict__ tB", *rendered.params]
    source = _render(
        common,
        name,
        kparams,
        prob,
        elem,
        p,
        vec,
        overlap=overlap,
        warp_epi=warp_epi,
        ktiles=ktiles,
        kt_per=ktiles,
        a_batched=False,
        b_batched=False,
    )
    kp = {
        "path": path,
        **p,
        "M": prob.M,
        "N": prob.N,
        "K": prob.K,
        "batch": 1,
        **extra,
        "requires_arch": "sm_90a",
        "tmaps": [ta, tb],
        "persistent": True,  # the grid: see generate()
    }
    return [
        KernelSource(
            family,
            name,
            source,
            (min(units(prob, bn, 1), SM_COUNT), 1, 1),
            (THREADS, 1, 1),
            ["@tmap:0", "@tmap:1", *out_names],
            shared_bytes(bn, stages),
            params=kp,
        )
    ]


# ---- FP8 E4M3 outside any plan (tools/bench_fp8.py; engines: codegen/families/gemm_fp8.py) ------


class KMajorOperands:
    """The operand layouts of out [M, N] = A [M, K] . B [N, K]^T, both K-major and unbatched (the
    1-byte GEMMs' only layout), for a problem class with M, N and K."""

    M: int
    N: int
    K: int

    @property
    def a(self) -> OperandLayout:
        return OperandLayout(self.M, self.K, 1, [])

    @property
    def b(self) -> OperandLayout:
        return OperandLayout(self.N, self.K, 1, [])


@dataclass
class RowsProblem(KMajorOperands):
    """A GEMM of K-major operands outside any plan: out [M, N] = A [M, K] . B [N, K]^T."""

    M: int
    N: int
    K: int
    epilogue: tuple = ()
    outputs: tuple = (ACC,)
    batch_dims: tuple = ()
    conv: None = None
    batch: int = 1

    @property
    def out_shape(self) -> tuple[int, int]:
        return (self.M, self.N)


@dataclass(frozen=True)
class _OutSpec:
    dtype: str  # numpy name: what render_epilogue reads of an output's TensorSpec


def fp8_gemm(
    M: int, N: int, K: int, out_dtype: DType = DType.float16, alpha: float = 1.0, params: dict | None = None
) -> KernelSource:
    """The TMA GEMM on FP8 E4M3 operands: out [M, N] (fp16 or bf16) = alpha * A [M, K] . B [N, K]^T
    with wgmma m64nBNk32.f32.e4m3.e4m3 (fp32 accumulators); A and B raw e4m3 bytes, K-major, read
    through 1-byte tensor maps ("uint8") of the tensors named "a" and "b"; alpha folds in the
    per-tensor scales of A and B (scale_a * scale_b). Arguments: "@tmap:0", "@tmap:1", "out".
    `params`: INT8_KEYS, else int8_heuristic (the same K steps of 128 bytes). Not yet an engine
    step (no fp8 dtype in the IR): tools/bench_fp8.py launches it."""
    if out_dtype not in (DType.float16, DType.bfloat16):
        raise CompileError(f"FP8 GEMM output {out_dtype.name}: float16 or bfloat16")
    prob = RowsProblem(M, N, K)
    why = int8_unsupported(prob)
    if why is not None:
        raise CompileError(f"no FP8 TMA GEMM: {why}")
    where = f"FP8 GEMM {M}x{N}x{K}"
    params = {k: v for k, v in (params or {}).items() if k in INT8_KEYS}
    vec_epi = params.pop("VEC_EPI", 1)
    out_specs = [_OutSpec(out_dtype.numpy.name)]
    if "BN" in params:
        stages = max_stages(params["BN"]) if params["BN"] in BNS else 0
        p = {"SPLITS": 1, "PINGPONG": 0, "OVERLAP": 0, "STAGES": stages, **params}
    else:
        p = {
            **int8_heuristic(prob, vec_epi == 1 and vec_epilogue_ok(prob, {}, out_specs), light_epilogue=True),
            **params,
        }
    if not int8_valid(prob, p):
        raise CompileError(f"{where}: TMA GEMM parameters {p} are not valid")
    name = f"gc_gemm_fp8_{M}x{N}x{K}"
    rendered = render_epilogue((), (ACC,), {}, out_specs, prob.out_shape, out_dtype, where=where, name=f"{name}_epi")
    vec = None
    if vec_epi:
        vec = _vec_epilogue_vars(prob, {}, out_specs, rendered, 1, name, where, vec_epi, acc_dtype=out_dtype)
    p["VEC_EPI"] = vec["mode"] if vec is not None else 0
    overlap, warp_epi = int(p.pop("OVERLAP", 0)), int(p.pop("WARP_EPI", 0))
    if (overlap or warp_epi) and p["VEC_EPI"] != 1:
        raise CompileError(f"{where}: OVERLAP / WARP_EPI need the 8-column vector epilogue (N % 8 == 0)")
    p.update({k: 1 for k, on in (("OVERLAP", overlap), ("WARP_EPI", warp_epi)) if on})
    ct = cuda_type(out_dtype)
    common = {
        "epilogue": rendered,
        "epilogue_name": f"{name}_epi",
        "st": ct.storage,
        "ct": ct.compute,
        "alpha_lit": None if alpha == 1.0 else lit(alpha, ct.compute),
        "c_param": False,
        "c_expr": None,
        "out_args": list(rendered.args),
    }
    kparams = ["const gc_tmap* __restrict__ tA", "const gc_tmap* __restrict__ tB", *rendered.params]
    ktiles = ceil_div(K, E4M3.bk)
    source = _render(
        common,
        name,
        kparams,
        prob,
        E4M3,
        p,
        vec,
        overlap=overlap,
        warp_epi=warp_epi,
        ktiles=ktiles,
        kt_per=ktiles,
        a_batched=False,
        b_batched=False,
    )
    ta, _ = _tmap("a", DType.int8, prob.a, K, BM, 1)
    tb, _ = _tmap("b", DType.int8, prob.b, K, p["BN"], 1)
    kp = {"path": "fp8_tma", **p, "M": M, "N": N, "K": K, "alpha": alpha, "requires_arch": "sm_90a", "tmaps": [ta, tb]}
    return KernelSource(
        "gemm_fp8",
        name,
        source,
        (min(units(prob, p["BN"], 1), SM_COUNT), 1, 1),
        (THREADS, 1, 1),
        ["@tmap:0", "@tmap:1", "out"],
        shared_bytes(p["BN"], p["STAGES"]),
        params=kp,
    )
