"""The GEMM family: MatMul, graphc.MatMul (trans flags, alpha), Gemm (trans, alpha, beta, C) and
Fused nodes anchored on them.

Every step is normalized to a batched problem

    out[b, m, n] = epilogue(alpha * sum_k A[b, m, k] * B[b, k, n] + beta * C[m, n])

with each operand in one of two layouts, read in place (no transpose copies):
"k"  (K contiguous: A [M, K] row-major, B stored [N, K], i.e. a transposed B) or
"mn" (M or N contiguous: A stored [K, M], B [K, N] row-major, the usual weight).
Batch dims broadcast by stride 0; when B is shared by every batch and A's batches are contiguous
rows, the batch folds into M (one big GEMM).

Kernel paths, one template each (templates/gemm_<path>.cu.j2, their shared pieces in
gemm_common.cu.j2): fp16/bf16 on tensor cores (gemm_mma: mma.sync m16n8k16, cp.async pipeline,
ldmatrix; gemm_wgmma: sm_90a warpgroup MMA); fp32 as SIMT register tiles (gemm_simt), or TF32
tensor cores when allowed (gemm_mma); fp64 SIMT. Split-K has three forms, and the epilogue always
sees each element once, after the full sum: serial (SERIAL 1, the default: fp32 partials in the
workspace, the last CTA of a tile to arrive sums them under an atomic counter), two-launch
(SERIAL 0: a second kernel, gemm_reduce, sums them) and, on sm_90, across a thread-block cluster
(CLUSTER 1: the K slices of a tile are one cluster's CTAs and sum their partials from each other's
shared memory; gemm_sm90.small_m_params chooses it). split_seconds charges each what it costs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from graphc.codegen.cuda_types import cuda_type, dtype_from_numpy_name
from graphc.codegen.epilogue import Operand, RenderedEpilogue, broadcast_index, render_epilogue, step_operands
from graphc.codegen.expr import lit
from graphc.codegen.kernel import KernelSource, StepContext, ceil_div, grid_1d, register_family, render
from graphc.ir.types import DType
from graphc.ops.fused import ACC, FusedAttrs, Ref
from graphc.ops.registry import Category, get_op

# The machine the heuristic aims to fill (an H200: 132 SMs, 228 KB shared memory per SM).
SM_COUNT = 132
SMEM_PER_SM = 228 * 1024
SMEM_PER_BLOCK = 227 * 1024
MAX_GRID_Z = 65535

ANCHORS = {("", "MatMul"), ("graphc", "MatMul"), ("", "Gemm")}
TC_DTYPES = (DType.float16, DType.bfloat16)
SIMT_DTYPES = (DType.float32, DType.float64)


# ---- the normalized problem ---------------------------------------------------------------------


@dataclass
class OperandLayout:
    """One GEMM operand as the kernel reads it: element (r, k) at offset + r * sr + k * sk, with
    r the row (m for A, n for B)."""

    rows: int  # M or N
    sr: int  # stride of a row step
    sk: int  # stride of a k step
    batch_strides: list[int]  # per output batch dim (0: broadcast)

    @property
    def kcontig(self) -> bool:
        return self.sk == 1

    @property
    def pitch(self) -> int:
        return self.sr if self.kcontig else self.sk

    def vector_ok(self, k: int, vec: int) -> bool:
        """Can 16-byte chunks along the contiguous dim be copied: the contiguous extent, the row
        pitch and every batch offset are multiples of `vec` elements (bases are 256-byte aligned)."""
        extent = k if self.kcontig else self.rows
        if extent % vec:
            return False
        rows_used = self.rows if self.kcontig else k
        if rows_used > 1 and self.pitch % vec:
            return False
        return all(s % vec == 0 for s in self.batch_strides)


@dataclass
class Problem:
    dtype: DType
    M: int
    N: int
    K: int
    a: OperandLayout
    b: OperandLayout
    batch_dims: list[tuple[int, int, int]]  # (size, a stride, b stride), outer to inner
    out_shape: tuple[int, ...]
    alpha: float = 1.0
    beta: float = 0.0
    c_index: int | None = None  # node input index of Gemm's C (read when beta != 0)
    c_shape: tuple[int, ...] = ()
    n_anchor: int = 2
    epilogue: tuple = ()
    outputs: tuple = (ACC,)
    folded_batch: int = 1  # batches folded into M

    @property
    def batch(self) -> int:
        return math.prod(s for s, _, _ in self.batch_dims)


def _anchor(ctx: StepContext):
    """(op, domain, attrs, anchor input count, epilogue, outputs) of the step."""
    step = ctx.step
    opdef = get_op(step.op, step.domain)
    if opdef.category is Category.FUSED:
        fa = ctx.attrs
        return fa.anchor_op, fa.anchor_domain, fa.anchor_attrs, fa.anchor_inputs, fa.epilogue, fa.outputs
    attrs = ctx.attrs
    return step.op, step.domain, attrs, len(step.inputs), (), (ACC,)


def _contig_strides(shape: tuple[int, ...]) -> list[int]:
    out, s = [], 1
    for d in reversed(shape):
        out.append(s)
        s *= d
    return out[::-1]


def problem_of(ctx: StepContext) -> Problem:
    op, domain, attrs, n_anchor, epilogue, outputs = _anchor(ctx)
    step = ctx.step
    if n_anchor < 2 or step.inputs[0] is None or step.inputs[1] is None:
        raise ctx.fail("a GEMM needs two operands")
    sa = tuple(ctx.spec(step.inputs[0]).shape)
    sb = tuple(ctx.spec(step.inputs[1]).shape)
    dt = dtype_from_numpy_name(ctx.spec(step.inputs[0]).dtype)
    if dt not in TC_DTYPES + SIMT_DTYPES:
        raise ctx.fail(f"GEMM of {dt.name} has no CUDA kernel (float16, bfloat16, float32, float64 do)")
    trans_a = trans_b = 0
    alpha, beta, c_index = 1.0, 0.0, None
    if (domain, op) == ("", "MatMul"):
        if len(sa) == 0 or len(sb) == 0:
            raise ctx.fail("matmul of a scalar")
        if len(sa) == 1:
            sa = (1, *sa)
        if len(sb) == 1:
            sb = (*sb, 1)
    elif (domain, op) == ("graphc", "MatMul"):
        trans_a, trans_b, alpha = attrs.trans_a, attrs.trans_b, float(attrs.alpha)
    elif (domain, op) == ("", "Gemm"):
        trans_a, trans_b, alpha, beta = attrs.transA, attrs.transB, float(attrs.alpha), float(attrs.beta)
        if n_anchor > 2 and len(step.inputs) > 2 and step.inputs[2] is not None and beta != 0.0:
            c_index = 2
    else:
        raise ctx.fail(f"{domain + '.' if domain else ''}{op} is not a GEMM")
    if len(sa) < 2 or len(sb) < 2:
        raise ctx.fail(f"operands must have rank 2 or more, got {sa} and {sb}")
    # Element strides of the stored operands, then the logical (m, k) / (k, n) views.
    a_r, a_c = sa[-2], sa[-1]
    b_r, b_c = sb[-2], sb[-1]
    if trans_a:  # stored [K, M]
        M, K, a_sr, a_sk = a_c, a_r, 1, a_c
    else:  # stored [M, K]
        M, K, a_sr, a_sk = a_r, a_c, a_c, 1
    if trans_b:  # stored [N, K]
        N, kb, b_sr, b_sk = b_r, b_c, b_c, 1
    else:  # stored [K, N]
        N, kb, b_sr, b_sk = b_c, b_r, 1, b_c
    if kb != K:
        raise ctx.fail(f"inner dims differ: {sa} @ {sb} (trans_a={trans_a}, trans_b={trans_b})")
    # A size-1 dim has no stride that matters: call the operand K-contiguous where it can be.
    if M == 1:
        a_sr, a_sk = max(K, 1), 1
    if N == 1:
        b_sr, b_sk = max(K, 1), 1
    # Batch dims: numpy broadcasting of sa[:-2] and sb[:-2].
    ba, bb = sa[:-2], sb[:-2]
    rank = max(len(ba), len(bb))
    ba = (1,) * (rank - len(ba)) + ba
    bb = (1,) * (rank - len(bb)) + bb
    a_full = _contig_strides(sa)[: len(sa) - 2]
    b_full = _contig_strides(sb)[: len(sb) - 2]
    a_full = [0] * (rank - len(a_full)) + a_full
    b_full = [0] * (rank - len(b_full)) + b_full
    dims = []
    for d in range(rank):
        if ba[d] != bb[d] and ba[d] != 1 and bb[d] != 1:
            raise ctx.fail(f"batch dims do not broadcast: {sa} @ {sb}")
        size = max(ba[d], bb[d])
        if size == 1:
            continue
        dims.append([size, a_full[d] if ba[d] != 1 else 0, b_full[d] if bb[d] != 1 else 0])
    # Merge adjacent dims that step through memory as one.
    merged: list[list[int]] = []
    for size, s_a, s_b in dims:
        if merged and merged[-1][1] == s_a * size and merged[-1][2] == s_b * size:
            merged[-1] = [merged[-1][0] * size, s_a, s_b]
        else:
            merged.append([size, s_a, s_b])
    folded = 1
    # B shared by every batch and A's batches contiguous rows of K-contiguous A: one tall GEMM.
    if len(merged) == 1 and merged[0][2] == 0 and a_sk == 1 and merged[0][1] == M * a_sr and merged[0][1] != 0:
        folded = merged[0][0]
        M *= folded
        merged = []
    out_shape = tuple(ctx.spec(step.outputs[0]).shape)
    prob = Problem(
        dtype=dt,
        M=M,
        N=N,
        K=K,
        a=OperandLayout(M, a_sr, a_sk, [d[1] for d in merged]),
        b=OperandLayout(N, b_sr, b_sk, [d[2] for d in merged]),
        batch_dims=[tuple(d) for d in merged],
        out_shape=out_shape,
        alpha=alpha,
        beta=beta,
        c_index=c_index,
        c_shape=tuple(ctx.spec(step.inputs[2]).shape) if c_index is not None else (),
        n_anchor=n_anchor,
        epilogue=tuple(epilogue),
        outputs=tuple(outputs),
        folded_batch=folded,
    )
    total = prob.batch * M * N
    for o in step.outputs:
        if math.prod(ctx.spec(o).shape) != total:
            raise ctx.fail(f"output {o} has shape {ctx.spec(o).shape}, the GEMM has {total} elements")
    return prob


# ---- kernel parameters: validity, cost, heuristic, search space ---------------------------------


def path_of(prob: Problem, allow_tf32: bool) -> str:
    if prob.dtype in TC_DTYPES:
        return "mma"
    if prob.dtype is DType.float32 and allow_tf32:
        return "tf32"
    return "simt"


# (BM, BN, WM, WN, relative efficiency of the tile shape)
MMA_TILES = [
    (128, 256, 2, 4, 1.0),
    (256, 128, 4, 2, 1.0),
    (128, 128, 2, 2, 0.93),
    (128, 64, 2, 2, 0.8),
    (64, 128, 2, 2, 0.8),
    (64, 64, 2, 2, 0.62),
    (32, 64, 1, 2, 0.45),
    (16, 64, 1, 2, 0.3),
]
# sm_90a warpgroup MMA: (BM, BN, efficiency); a warpgroup per 64 rows, wgmma m64nBNk16
WGMMA_TILES = [(128, 256, 1.0), (128, 128, 0.9), (128, 192, 0.95), (64, 256, 0.8), (64, 128, 0.7), (64, 64, 0.5)]
# (BM, BN, TM, TN, efficiency)
SIMT_TILES = [
    (128, 128, 8, 8, 1.0),
    (128, 64, 8, 4, 0.85),
    (64, 128, 4, 8, 0.85),
    (64, 64, 4, 4, 0.6),
    (32, 64, 4, 4, 0.45),
    (16, 64, 4, 4, 0.3),
]


def _elem_bytes(prob: Problem) -> int:
    return prob.dtype.itemsize


def _pitches(prob: Problem, path: str, bm: int, bn: int, bk: int) -> tuple[int, int, int, int]:
    """(A pitch, A stage elems, B pitch, B stage elems) of the padded shared-memory tiles."""
    fp32 = path == "tf32"
    kpad, mnpad = (4, 8) if fp32 else (8, 8)
    if prob.a.kcontig:
        ap, ast = bk + kpad, bm * (bk + kpad)
    else:
        ap, ast = bm + mnpad, bk * (bm + mnpad)
    if prob.b.kcontig:
        bp, bst = bk + kpad, bn * (bk + kpad)
    else:
        bp, bst = bn + mnpad, bk * (bn + mnpad)
    return ap, ast, bp, bst


def shared_bytes(prob: Problem, p: dict[str, Any]) -> int:
    path = p["path"]
    if path == "wgmma":  # swizzled stages (+1 KB to align them to 1024 bytes), or the fp32 C tile
        stats = 16 * p["BM"] if p.get("LNFOLD") else 0  # the LayerNorm fold's row sums and statistics
        return max(p["STAGES"] * (p["BM"] + p["BN"]) * 64 * 2, p["BM"] * (p["BN"] + 8) * 4 + stats) + 1024
    if path == "simt":
        cb = 8 if prob.dtype is DType.float64 else 4
        ty = p["BM"] // p["TM"]
        return max(2 * p["BK"] * (p["BM"] + p["BN"]), ty * (p["BN"] + 4)) * cb
    _, ast, _, bst = _pitches(prob, path, p["BM"], p["BN"], p["BK"])
    eb = 4 if path == "tf32" else 2
    rows = p["BM"] if p.get("CLUSTER") else p["WM"] * 16  # cluster split-K stages the whole tile
    return max(p["STAGES"] * (ast + bst) * eb, rows * (p["BN"] + 8) * 4)


def threads_of(p: dict[str, Any]) -> int:
    if p["path"] == "wgmma":
        return p["BM"] // 64 * 128  # a warpgroup per 64 rows
    if p["path"] == "simt":
        return (p["BM"] // p["TM"]) * (p["BN"] // p["TN"])
    return p["WM"] * p["WN"] * 32


_KEYS = {
    "mma": ("BM", "BN", "BK", "WM", "WN", "STAGES"),
    "tf32": ("BM", "BN", "BK", "WM", "WN", "STAGES"),
    "wgmma": ("BM", "BN", "BK", "STAGES"),
    "simt": ("BM", "BN", "BK", "TM", "TN"),
}


def valid(prob: Problem, p: dict[str, Any]) -> bool:
    path = p.get("path")
    if path not in _KEYS or any(not isinstance(p.get(k), int) or p[k] <= 0 for k in _KEYS[path]):
        return False
    bm, bn, bk, s = p["BM"], p["BN"], p["BK"], p.get("SPLITS", 1)
    if s < 1 or s > max(1, ceil_div(prob.K, bk)):
        return False
    if s > 1 and prob.dtype is DType.float64:
        return False  # fp32 partials would lose fp64 precision
    if prob.batch * s > MAX_GRID_Z:
        return False
    if p.get("CLUSTER", 0) not in (0, 1) or (p.get("CLUSTER") and not (path != "simt" and 2 <= s <= 8)):
        return False  # cluster split-K: tensor-core kernels, 2..8 K slices (the portable cluster size)
    if path == "wgmma":
        if prob.dtype not in TC_DTYPES or bk != 64 or bm not in (64, 128) or bn not in (64, 128, 192, 256):
            return False
        if not 3 <= p["STAGES"] <= 8 or not (prob.a.vector_ok(prob.K, 8) and prob.b.vector_ok(prob.K, 8)):
            return False  # no element-load path: operands must allow 16-byte copies
    elif path == "simt":
        tm, tn = p["TM"], p["TN"]
        if tm % 4 or tn % 4 or bm % tm or bn % tn:
            return False
        if threads_of(p) > 1024 or threads_of(p) < 32:
            return False
    else:
        wm, wn, st = p["WM"], p["WN"], p["STAGES"]
        kstep = 8 if path == "tf32" else 16
        if bm % (wm * 16) or bn % (wn * 16) or bk % kstep or bk % 8 or not 2 <= st <= 8:
            return False
        if threads_of(p) > 1024:
            return False
    # split-K's arrival flag takes a few bytes of static shared memory beside the dynamic tiles
    return shared_bytes(prob, p) + (16 if s > 1 else 0) <= SMEM_PER_BLOCK


def _blocks_per_sm(prob: Problem, p: dict[str, Any]) -> int:
    threads = threads_of(p)
    if p["path"] == "wgmma":
        regs = p["BN"] // 2 + 40
    elif p["path"] == "simt":
        regs = p["TM"] * p["TN"] * (2 if prob.dtype is DType.float64 else 1) + 40
    else:
        regs = (p["BM"] // p["WM"]) * (p["BN"] // p["WN"]) // 32 + 48
    regs = min(255, -(-regs // 8) * 8)
    by_regs = 65536 // (regs * threads)
    by_smem = SMEM_PER_SM // max(1, shared_bytes(prob, p) + 1024)
    return max(1, min(by_regs, by_smem, 2048 // threads, 32))


# Rough rates for the cost model (H200): only ratios matter.
_RATE = {"wgmma": 700e12, "mma": 330e12, "tf32": 150e12, "simt": 45e12}
_BW = 4.0e12


def estimate_seconds(prob: Problem, p: dict[str, Any]) -> float:
    """A cost model good enough to rank tile shapes and split counts. The busiest SM runs
    ceil(tiles / SMs) blocks, up to `blocks_per_sm` at once; its tensor (or FMA) rate is only
    reached with about 8 warps resident; padded tile edges count as work. The memory floor and the
    split-K round trip through the workspace (and its second launch) are added."""
    bm, bn, bk, s = p["BM"], p["BN"], p["BK"], p.get("SPLITS", 1)
    eff = p.get("_eff", 0.7)
    tiles = ceil_div(prob.M, bm) * ceil_div(prob.N, bn) * prob.batch * s
    per_sm_blocks = ceil_div(tiles, SM_COUNT)
    concurrent = min(per_sm_blocks, _blocks_per_sm(prob, p))
    util = min(1.0, concurrent * threads_of(p) / 32 / 8)
    kspan = ceil_div(ceil_div(prob.K, bk), s) * bk
    per_sm = _RATE[p["path"]] / SM_COUNT
    t_math = per_sm_blocks * 2.0 * bm * bn * kspan / (eff * per_sm * util)
    e = prob.dtype.itemsize
    t_mem = (prob.batch * (prob.M * prob.K + prob.K * prob.N) * e + prob.batch * prob.M * prob.N * e) / _BW
    return max(t_math, t_mem) + split_seconds(prob, p)


# What each split-K form costs on top of its main loop, fitted by least squares to the mma.sync rows
# of tools/bench_gemm_small_m.py on an H200 (docs/results/gemm_small_m_h200_2026-12-01.md).
# Serial (one launch): the last CTA of a tile sums the partials alone, one element per thread per
# round, each round an L2 round trip (~0.28 us: BM * BN / THREADS rounds, 32 for a 64 x 64 tile), so
# it costs 7-10 us at 64 x 64 whatever S is; that, not the fp32 traffic, made it 1.5-2x slower than
# the two-launch split. Two-launch: a second launch (~1 us) and the partials' round trip.
# Cluster: the tile's partials read from the peers' shared memory between two cluster barriers.
_SERIAL_ROUND = 0.28e-6
_SERIAL_PER_SPLIT = 0.26e-6
_TWO_LAUNCH = 0.97e-6
_TWO_LAUNCH_PER_MB = 0.25e-6  # per MB of fp32 partials (S * M * N * 4 bytes)
_CLUSTER_PER_10KB = 0.73e-6  # per 10 KB of fp32 tile (BM * BN * 4 bytes)
_CLUSTER_MIN = 0.3e-6


def split_seconds(prob: Problem, p: dict[str, Any]) -> float:
    """The split-K reduction as it runs (see the constants above): serial (one launch, the default
    off sm_90), two-launch (SERIAL 0) or across a cluster (CLUSTER 1)."""
    s = p.get("SPLITS", 1)
    if s <= 1:
        return 0.0
    partial_mb = s * prob.batch * prob.M * prob.N * 4 / 1e6
    if p.get("CLUSTER"):
        return max(_CLUSTER_MIN, _CLUSTER_PER_10KB * p["BM"] * p["BN"] * 4 / 1e4 - 0.35e-6)
    if p.get("SERIAL", 1):
        return _SERIAL_ROUND * p["BM"] * p["BN"] / threads_of(p) + _SERIAL_PER_SPLIT * s
    return _TWO_LAUNCH + _TWO_LAUNCH_PER_MB * partial_mb


# A latency model of the mma.sync kernels at small M (microseconds), fitted by least squares to the
# same H200 rows (307 mma.sync variants of 8 shapes, rms error 1.6 us): a fixed cost, per wave of
# resident CTAs, per K tile a CTA runs (and its MMA work, times the CTAs sharing an SM), per CTA
# launched, per MB that the CTAs read from L2 (every tile column re-reads A, every tile row B),
# plus the split-K form. The throughput model (estimate_seconds) ranks large problems; this one
# ranks the small-M configurations of an sm_90 engine (cluster_heuristic), where launch, pipeline
# fill and reduction latencies, not tensor-core throughput, set the time.
_LAT = {"const": 1.79, "wave": 0.25, "ktile": 0.24, "work": 0.61, "cta": 0.64, "l2_mb": 0.052}


def small_m_seconds(prob: Problem, p: dict[str, Any]) -> float:
    bm, bn, bk, s = p["BM"], p["BN"], p["BK"], p.get("SPLITS", 1)
    ctas = ceil_div(prob.M, bm) * ceil_div(prob.N, bn) * prob.batch * s
    resident = _blocks_per_sm(prob, p)
    waves = ceil_div(ctas, SM_COUNT * resident)
    kt = ceil_div(ceil_div(prob.K, bk), s)
    sharing = min(ceil_div(ctas, SM_COUNT), resident)
    l2_mb = prob.batch * (ceil_div(prob.N, bn) * prob.M + ceil_div(prob.M, bm) * prob.N) * prob.K * 2 / 1e6
    us = (
        _LAT["const"]
        + waves * (_LAT["wave"] + kt * (_LAT["ktile"] * bk / 32 + _LAT["work"] * bm * bn * bk * sharing / 1e6))
        + _LAT["cta"] * ctas / SM_COUNT
        + _LAT["l2_mb"] * l2_mb
    )
    return us * 1e-6 + split_seconds(prob, p)


def _split_options(prob: Problem, bk: int) -> list[int]:
    ktiles = ceil_div(prob.K, bk)
    out = [1]
    for s in (2, 3, 4, 6, 8, 12, 16, 24, 32):
        if ktiles // s >= 4:  # each split keeps at least 4 K tiles for the pipeline
            out.append(s)
    return out


def candidates(prob: Problem, path: str) -> list[dict[str, Any]]:
    """Every parameter set of the search space for this problem (valid ones only)."""
    out: list[dict[str, Any]] = []
    if path == "simt":
        for bm, bn, tm, tn, eff in SIMT_TILES:
            for s in _split_options(prob, 8):
                p = {"path": path, "BM": bm, "BN": bn, "BK": 8, "TM": tm, "TN": tn, "SPLITS": s, "_eff": eff}
                if valid(prob, p):
                    out.append(p)
        return out
    if path == "wgmma":
        for bm, bn, eff in WGMMA_TILES:
            for st in (3, 4, 5, 6):
                for s in _split_options(prob, 64):
                    p = {"path": path, "BM": bm, "BN": bn, "BK": 64, "STAGES": st, "SPLITS": s, "_eff": eff}
                    if valid(prob, p):
                        out.append(p)
        return out
    bks = (16, 32) if path == "tf32" else (32, 64)
    for bm, bn, wm, wn, eff in MMA_TILES:
        for bk in bks:
            for st in (2, 3, 4):
                for s in _split_options(prob, bk):
                    p = {
                        "path": path,
                        "BM": bm,
                        "BN": bn,
                        "BK": bk,
                        "WM": wm,
                        "WN": wn,
                        "STAGES": st,
                        "SPLITS": s,
                        "_eff": eff,
                    }
                    if valid(prob, p):
                        out.append(p)
    return out


def heuristic(prob: Problem, path: str) -> dict[str, Any]:
    """The default: the cheapest by the cost model, with the usual BK and the deepest pipeline
    (up to 4 stages) that the K loop can use and shared memory holds."""
    pool = candidates(prob, path)
    if not pool:
        raise ValueError("no valid GEMM configuration")
    if path != "simt":
        bk = {"tf32": 16, "mma": 32, "wgmma": 64}[path]
        lo, hi = (3, 6) if path == "wgmma" else (2, 4)
        deep = [p for p in pool if p["BK"] == bk] or pool
        best: dict[tuple, dict[str, Any]] = {}
        for p in deep:
            key = (p["BM"], p["BN"], p["SPLITS"])
            ktiles = ceil_div(ceil_div(prob.K, p["BK"]), p["SPLITS"])
            want = max(lo, min(hi, ktiles))
            if p["STAGES"] <= want and (key not in best or p["STAGES"] > best[key]["STAGES"]):
                best[key] = p
        pool = list(best.values()) or pool
    return min(pool, key=lambda p: (estimate_seconds(prob, p), p.get("SPLITS", 1), -p["BM"] * p["BN"]))


# Tiles of the cluster split-K search (sm_90): MMA_TILES' small ones and a 64 x 32 tile (cuBLAS runs
# 64 x 16 and 64 x 32 tiles at these shapes).
CLUSTER_TILES = [(128, 128, 2, 2), (128, 64, 2, 2), (64, 128, 2, 2), (64, 64, 2, 2), (64, 32, 2, 2), (32, 64, 1, 2)]


def cluster_candidates(prob: Problem) -> list[dict[str, Any]]:
    """mma.sync parameter sets with split-K across a thread-block cluster (2..8 K slices), and the
    same tiles without split, for an sm_90 engine."""
    out = []
    for bm, bn, wm, wn in CLUSTER_TILES:
        for bk in (32, 64):
            ktiles = ceil_div(prob.K, bk)
            for s in (1, 2, 3, 4, 6, 8):
                if s > 1 and ceil_div(prob.K, 32) // s < 6:
                    continue  # measured: K = 768 (24 K tiles of 32) was fastest at 2-4 slices everywhere
                p = {"path": "mma", "BM": bm, "BN": bn, "BK": bk, "WM": wm, "WN": wn, "SPLITS": s}
                p["STAGES"] = max(2, min(4 if bk == 32 else 3, ceil_div(ktiles, s)))
                if s > 1:
                    p["CLUSTER"] = 1
                if valid(prob, p):
                    out.append(p)
    return out


def cluster_heuristic(prob: Problem) -> dict[str, Any]:
    """The cheapest cluster split-K (or unsplit) mma.sync configuration by the small-M latency model."""
    pool = cluster_candidates(prob)
    if not pool:
        raise ValueError("no valid cluster GEMM configuration")
    return min(pool, key=lambda p: (small_m_seconds(prob, p), p["SPLITS"], -p["BM"] * p["BN"]))


def public(p: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in p.items() if not k.startswith("_")}


def search_space(ctx: StepContext) -> list[dict[str, Any]]:
    prob = problem_of(ctx)
    return [public(p) for p in candidates(prob, path_of(prob, ctx.allow_tf32))]


# ---- rendering ----------------------------------------------------------------------------------


def _c_expr(ctx: StepContext, prob: Problem, ops: dict[int, Operand]) -> tuple[str | None, bool]:
    """beta * C[broadcast index] as a CUDA expression of `idx`, and whether C is a pointer."""
    if prob.c_index is None:
        return None, False
    op = ops[prob.c_index]
    ct = cuda_type(prob.dtype)
    if op.const is not None and op.const.size == 1:
        v = float(op.const.reshape(-1)[0]) * prob.beta
        return lit(v, ct.compute), False
    load = ct.to_compute(f"Cm[{broadcast_index(op.shape, (prob.M, prob.N), 'idx')}]")
    return (load if prob.beta == 1.0 else f"{lit(prob.beta, ct.compute)} * {load}"), True


NORM_OPS = ("LayerNormalization", "RMSNormalization")
ROWNORM_MAX_N = 1024  # a row in registers: N / 32 values a lane


def rownorm_split(epilogue: tuple, outputs: tuple) -> tuple[tuple, Any, Any] | None:
    """(the epilogue before the norm, the ref of h, the norm op) where the epilogue ends in a row
    norm of h with outputs (h, norm(h)) (passes/fuse_residual_norm.py makes these); else None."""
    if not epilogue or epilogue[-1].op not in NORM_OPS or len(outputs) != 2:
        return None
    norm = epilogue[-1]
    if outputs[1] != Ref("op", len(epilogue) - 1) or outputs[0] != norm.args[0]:
        return None
    return epilogue[:-1], outputs[0], norm


def has_rownorm(ctx: StepContext) -> bool:
    """Whether the step is a GEMM with a row-norm epilogue (the mma.sync, SIMT and cp.async wgmma
    kernels, split-K in one launch or across a cluster; the TMA GEMM has no such epilogue)."""
    a = ctx.node.attrs
    return isinstance(a, FusedAttrs) and rownorm_split(a.epilogue, a.outputs) is not None


def _rownorm(ctx: StepContext, prob: Problem, norm: Any) -> tuple[dict[str, Any], list[str], list[str]]:
    """The row-norm template context, its kernel parameters and their tensor names."""
    rank = len(prob.out_shape)
    if norm.attrs.axis not in (-1, rank - 1):
        raise ctx.fail(f"a {norm.op} epilogue over axis {norm.attrs.axis} (only the last axis is fused)")
    if prob.N > ROWNORM_MAX_N:
        raise ctx.fail(f"a {norm.op} epilogue over {prob.N} columns (at most {ROWNORM_MAX_N})")
    out = ctx.tensors[ctx.step.outputs[1]]
    oct_ = cuda_type(dtype_from_numpy_name(out.dtype))
    hct = cuda_type(prob.dtype)
    refs = [r for r in norm.args[1:] if r.kind == "in" and r.index < len(ctx.step.inputs) and ctx.step.inputs[r.index]]
    names = [ctx.step.outputs[1]]
    decls = [f"{oct_.storage}* __restrict__ gc_norm_out"]
    loads = {}
    for what, r in zip(("scale", "bias"), refs, strict=False):
        spec = ctx.tensors[ctx.step.inputs[r.index]]
        if math.prod(spec.shape) != prob.N:
            raise ctx.fail(f"{norm.op} {what} of shape {spec.shape} for {prob.N} columns")
        ct = cuda_type(dtype_from_numpy_name(spec.dtype))
        names.append(ctx.step.inputs[r.index])
        decls.append(f"const {ct.storage}* __restrict__ gc_norm_{what}")
        loads[what] = ct.to_compute(f"gc_norm_{what}[c]")
    if "scale" not in loads:
        raise ctx.fail(f"a {norm.op} epilogue without its scale")
    h_load = "__ldcg(out0 + row + c)"  # L2: the band's other tiles were stored by other blocks
    info = {
        "op": norm.op,
        "eps": lit(float(norm.attrs.epsilon), "float"),
        "vals": ceil_div(prob.N, 32),
        "load_h": hct.to_compute(h_load),
        "load_scale": loads["scale"],
        "load_bias": loads.get("bias", ""),
        "has_bias": "bias" in loads and norm.op == "LayerNormalization",
        "store_y": oct_.to_storage("y"),
    }
    return info, decls, names


# The LayerNorm fold (docs/layernorm_fold.md; params LNFOLD 1 and LN_EPS): A holds the raw rows h of
# a LayerNorm over K, B = diag(g) W, and the kernel sums each row of h from its A tiles, so that the
# stored value is rstd * (acc - mean * colsum(B)) + (b W + c) = LayerNorm(h) W + c, before the epilogue.
# Three more arguments: colsum(B) and b W + c (fp32, N each) and the row statistics it stores for
# other readers of the normalized rows (fp32 [batch * M, 2]: mean, rstd). Only the cp.async wgmma
# kernel has it (K-major A, one K slice or cluster split-K); nothing in the compiler asks for it yet.
LNFOLD_ARGS = ("ln_colsum", "ln_shift", "ln_stats")


def _lnfold(
    ctx: StepContext, prob: Problem, p: dict[str, Any], path: str, splits: int, cluster: bool, rownorm: bool
) -> tuple[dict[str, Any] | None, list[str], list[str]]:
    """The fold's template context, kernel parameters and argument names, or (None, [], [])."""
    if not p.get("LNFOLD"):
        return None, [], []
    if path != "wgmma" or not prob.a.kcontig:
        raise ctx.fail("the LayerNorm fold needs the wgmma kernel with a K-major A")
    if splits > 1 and not cluster:
        raise ctx.fail("the LayerNorm fold needs one K slice or cluster split-K (CLUSTER 1)")
    if rownorm or prob.alpha != 1.0 or prob.c_index is not None:
        raise ctx.fail("the LayerNorm fold takes no row-norm epilogue, alpha or C")
    eps = float(p.get("LN_EPS", 1e-5))
    info = {"eps": lit(eps, "float"), "k": prob.K, "load": cuda_type(prob.dtype).to_compute("e[i]")}
    decls = [
        "const float* __restrict__ gc_ln_cs",
        "const float* __restrict__ gc_ln_cp",
        "float* __restrict__ gc_ln_stats",
    ]
    return info, decls, [f"{ctx.step.name}/{a}" for a in LNFOLD_ARGS]


def _kernel_args(
    ctx: StepContext, prob: Problem, rendered: RenderedEpilogue, c_ptr: bool
) -> tuple[list[str], list[str]]:
    """(tensor names, parameter declarations) of the store hook: C, the epilogue's pointer inputs,
    the outputs."""
    st = cuda_type(prob.dtype).storage
    names, decls = [], []
    if c_ptr:
        names.append(ctx.step.inputs[prob.c_index])
        decls.append(f"const {st}* __restrict__ Cm")
    names += [ctx.step.inputs[i] for i in rendered.inputs] + list(ctx.step.outputs[: len(rendered.outputs)])
    decls += list(rendered.params)
    return names, decls


def _generate(ctx: StepContext) -> list[KernelSource]:
    step = ctx.step
    where = f"{step.kind} node '{step.name}'"
    prob = problem_of(ctx)
    total = prob.batch * prob.M * prob.N
    if total == 0:
        return []  # an empty output: nothing to launch
    path = path_of(prob, ctx.allow_tf32)
    if prob.batch > MAX_GRID_Z:
        raise ctx.fail(f"a batch of {prob.batch} GEMMs is more than one launch takes ({MAX_GRID_Z})")
    if ctx.params:
        # A full tile choice is taken as given (SPLITS 1 unless named); a partial one, such as
        # {"path": "wgmma"} to use the sm_90a variant, is completed by that path's heuristic.
        forced = dict(ctx.params)
        fpath = forced.get("path", path)
        if fpath != path and (fpath, path) not in (("simt", "tf32"), ("wgmma", "mma")):
            raise ctx.fail(f"forced GEMM path {fpath!r} does not fit {prob.dtype.name} (expects {path!r})")
        if "BM" in forced:
            p = {"path": fpath, "SPLITS": 1, **forced}
        else:
            try:
                p = {**public(heuristic(prob, fpath)), **forced}
            except ValueError:
                p = {"path": fpath, **forced}
        if not valid(prob, p):
            raise ctx.fail(f"forced GEMM parameters {ctx.params} are not valid for this problem")
        path = fpath
    else:
        try:
            p = heuristic(prob, path)
        except ValueError as e:
            raise ctx.fail(f"no GEMM kernel configuration fits M={prob.M} N={prob.N} K={prob.K}") from e
    p = public(p)
    ops = step_operands(ctx)
    name = ctx.kernel_name()
    out_specs = [ctx.tensors[o] for o in step.outputs]
    split_norm = rownorm_split(prob.epilogue, prob.outputs)
    rownorm, norm_decls, norm_names = None, [], []
    if split_norm is not None:  # the epilogue stores h; the last block of each row band normalizes it
        pre, h_ref, norm = split_norm
        rownorm, norm_decls, norm_names = _rownorm(ctx, prob, norm)
        rendered = render_epilogue(
            pre, (h_ref,), ops, out_specs[:1], prob.out_shape, prob.dtype, where=where, name=f"{name}_epi"
        )
    else:
        rendered = render_epilogue(
            prob.epilogue, prob.outputs, ops, out_specs, prob.out_shape, prob.dtype, where=where, name=f"{name}_epi"
        )
    c_expr, c_ptr = _c_expr(ctx, prob, ops)
    out_names, out_decls = _kernel_args(ctx, prob, rendered, c_ptr)
    out_args = (["Cm"] if c_ptr else []) + list(rendered.args)
    ct = cuda_type(prob.dtype)
    splits = p.get("SPLITS", 1)
    ktiles = ceil_div(prob.K, p["BK"])
    kt_per_split = max(1, ceil_div(ktiles, splits))
    splits = max(1, ceil_div(ktiles, kt_per_split)) if ktiles else 1  # no empty split
    p["SPLITS"] = splits
    common = {
        "epilogue": rendered,
        "epilogue_name": f"{name}_epi",
        "st": ct.storage,
        "ct": ct.compute,
        "alpha_lit": None if prob.alpha == 1.0 else lit(prob.alpha, ct.compute),
        "c_param": c_ptr,
        "c_expr": c_expr,
        "out_args": out_args,
        "batch_dims": prob.batch_dims,
    }
    st = ct.storage
    ab = [f"const {st}* __restrict__ A", f"const {st}* __restrict__ B"]
    ab_names = [step.inputs[0], step.inputs[1]]
    # Split-K sums its fp32 partials in the same launch (the last block of a tile to finish does it:
    # templates' split_finish), unless SERIAL is 0, which keeps the second kernel (gemm_reduce).
    # CLUSTER 1: the K slices of a tile are the CTAs of one thread-block cluster and reduce through
    # distributed shared memory (sm_90+; no workspace, no counters, one launch).
    cluster = splits > 1 and bool(p.get("CLUSTER", 0))
    serial = splits > 1 and not cluster and bool(p.get("SERIAL", 1))
    if rownorm is not None and splits > 1 and not (serial or cluster):
        raise ctx.fail("a row-norm epilogue needs split-K in one launch (SERIAL 1 or CLUSTER 1)")
    lnfold, ln_decls, ln_names = _lnfold(ctx, prob, p, path, splits, cluster, rownorm is not None)
    p.pop("CLUSTER", None)
    if cluster:
        p.pop("SERIAL", None)
        p["CLUSTER"] = 1
        p["requires_arch"] = "sm_90"
        kparams = ab + out_decls + norm_decls + ln_decls
        kargs = ab_names + out_names + norm_names + ln_names
    elif serial:
        p["SERIAL"] = 1
        kparams = [*ab, *out_decls, *norm_decls, "float* __restrict__ ws"]
        kargs = [*ab_names, *out_names, *norm_names, "@workspace"]
    elif splits > 1:
        p["SERIAL"] = 0
        kparams = [*ab, "float* __restrict__ ws"]
        kargs = [*ab_names, "@workspace"]
    else:
        kparams = ab + out_decls + norm_decls + ln_decls
        kargs = ab_names + out_names + norm_names + ln_names
    tiles = ceil_div(prob.M, p["BM"]) * ceil_div(prob.N, p["BN"])
    grid = (tiles, 1, prob.batch * splits)
    threads = threads_of(p)
    smem = shared_bytes(prob, p)
    main_ctx = dict(
        common,
        name=name,
        kind={"tf32": "mma"}.get(path, path),
        kparams=kparams,
        M=prob.M,
        N=prob.N,
        K=prob.K,
        BM=p["BM"],
        BN=p["BN"],
        BK=p["BK"],
        threads=threads,
        splits=splits,
        serial=serial,
        cluster=cluster,
        tiles=tiles,
        rownorm=rownorm,
        lnfold=lnfold,
        tiles_m=ceil_div(prob.M, p["BM"]),
        kt_per_split=kt_per_split,
        batch=prob.batch,
        group_m=8,
    )
    if path == "wgmma":
        opnds = [
            {"name": X, "kcontig": lay.kcontig, "rows": lay.rows, "rows_tile": rt, "r0": r0, "ld": lay.pitch}
            for X, lay, rt, r0 in (("A", prob.a, p["BM"], "m0"), ("B", prob.b, p["BN"], "n0"))
        ]
        main_ctx.update(
            STAGES=p["STAGES"],
            operands=opnds,
            a_kcontig=prob.a.kcontig,
            b_kcontig=prob.b.kcontig,
            trans_a=int(not prob.a.kcontig),
            trans_b=int(not prob.b.kcontig),
            ab_type="f16" if prob.dtype is DType.float16 else "bf16",
        )
        p["requires_arch"] = "sm_90a"
    elif path == "simt":
        main_ctx.update(
            TM=p["TM"],
            TN=p["TN"],
            a_kcontig=prob.a.kcontig,
            b_kcontig=prob.b.kcontig,
            a_sr=prob.a.sr,
            a_sk=prob.a.sk,
            b_sr=prob.b.sr,
            b_sk=prob.b.sk,
        )
    else:
        tf32 = path == "tf32"
        vec = 4 if tf32 else 8
        ap, ast, bp, bst = _pitches(prob, path, p["BM"], p["BN"], p["BK"])
        opnds = []
        for X, lay, rows_tile, r0, ld in (("A", prob.a, p["BM"], "m0", ap), ("B", prob.b, p["BN"], "n0", bp)):
            chunks = rows_tile * p["BK"] // vec
            opnds.append(
                {
                    "name": X,
                    "kcontig": lay.kcontig,
                    "vec": lay.vector_ok(prob.K, vec),
                    "rows": lay.rows,
                    "rows_tile": rows_tile,
                    "r0": r0,
                    "ld": lay.pitch,
                    "sr": lay.sr,
                    "sk": lay.sk,
                    "guard_chunks": chunks % threads != 0,
                }
            )
            del ld
        p["VEC_A"], p["VEC_B"] = int(opnds[0]["vec"]), int(opnds[1]["vec"])
        main_ctx.update(
            WM=p["WM"],
            WN=p["WN"],
            STAGES=p["STAGES"],
            vec=vec,
            kstep=8 if tf32 else 16,
            tf32=tf32,
            a_pitch=ap,
            a_stage=ast,
            b_pitch=bp,
            b_stage=bst,
            a_kcontig=prob.a.kcontig,
            b_kcontig=prob.b.kcontig,
            operands=opnds,
            mma_fn={DType.float16: "gc_mma_f16", DType.bfloat16: "gc_mma_bf16", DType.float32: "gc_mma_tf32"}[
                prob.dtype
            ],
        )
    p.update({"M": prob.M, "N": prob.N, "K": prob.K, "batch": prob.batch, "a": _lay(prob.a), "b": _lay(prob.b)})
    source = render(f"gemm_{main_ctx['kind']}.cu.j2", **main_ctx)
    ws_bytes = splits * prob.batch * prob.M * prob.N * 4 if splits > 1 and not cluster else 0
    kernels = [
        KernelSource("gemm", name, source, grid, (threads, 1, 1), kargs, smem, params=p, workspace_bytes=ws_bytes)
    ]
    if splits > 1 and not serial and not cluster:
        kernels.append(split_reduce_kernel("gemm", name, common, out_decls, out_names, total, splits, ws_bytes))
    return kernels


def split_reduce_kernel(
    family: str,
    name: str,
    common: dict[str, Any],
    out_decls: list[str],
    out_names: list[str],
    total: int,
    splits: int,
    ws_bytes: int,
) -> KernelSource:
    """The second launch of a two-launch split-K: gemm_reduce.cu.j2 sums the fp32 partials in the
    workspace and runs the epilogue (the mma.sync/wgmma GEMMs and the Hopper TMA GEMM share it)."""
    rname = f"{name}_reduce"
    rsrc = render(
        "gemm_reduce.cu.j2",
        **dict(common, name=rname, kparams=[*out_decls, "const float* __restrict__ ws"], total=total, splits=splits),
    )
    return KernelSource(
        family,
        rname,
        rsrc,
        grid_1d(total, 256, max_blocks=SM_COUNT * 16),
        (256, 1, 1),
        [*out_names, "@workspace"],
        0,
        params={"reduce": True, "SPLITS": splits},
        workspace_bytes=ws_bytes,
    )


def standalone_context(
    op: str,
    shapes: list[tuple[int, ...]],
    dtype: DType,
    *,
    domain: str = "",
    attrs: Any = None,
    n_anchor: int | None = None,
    epilogue: tuple = (),
    outputs: tuple = (ACC,),
    allow_tf32: bool = False,
    params: dict[str, Any] | None = None,
    weights: dict[str, Any] | None = None,
) -> StepContext:
    """A one-step plan around a GEMM (inputs x0, x1, ...; output y0, ...), for tests, benchmarks
    and the tuner. With an epilogue or n_anchor set, the step is a Fused node anchored on `op`:
    inputs [0, n_anchor) feed the anchor, the rest are the epilogue's."""
    from graphc.ir.attrs import attrs_to_json
    from graphc.ir.graph import Node, Value
    from graphc.ir.types import TensorType
    from graphc.ops.registry import InferContext
    from graphc.runtime.plan import Step, TensorSpec

    opdef = get_op(op, domain)
    attrs = attrs if attrs is not None else opdef.attrs()
    names = [f"x{i}" for i in range(len(shapes))]
    types = [TensorType(dtype, tuple(s)) for s in shapes]
    fused = bool(epilogue) or n_anchor is not None or tuple(outputs) != (ACC,)
    if fused:
        fa = FusedAttrs(
            anchor_op=op,
            anchor_domain=domain,
            anchor_attrs=attrs,
            anchor_inputs=len(shapes) if n_anchor is None else n_anchor,
            epilogue=tuple(epilogue),
            outputs=tuple(outputs),
        )
        fdef = get_op("Fused", "graphc")
        out_types = fdef.infer(InferContext("Fused", "n0", fa, types, [None] * len(types), len(outputs)))
        node_attrs, kind, sop, sdom = fa, fa.kind_name(), "Fused", "graphc"
    else:
        out_types = opdef.infer(InferContext(op, "n0", attrs, types, [None] * len(types), 1))
        node_attrs, kind, sop, sdom = attrs, op, op, domain
    outs = [f"y{k}" for k in range(len(out_types))]
    tensors = {}
    for n, t in [*zip(names, types, strict=True), *zip(outs, out_types, strict=True)]:
        kind_t = "weight" if weights and n in weights else "arena"
        tensors[n] = TensorSpec(n, t.dtype.numpy.name, list(t.static_shape), t.nbytes, kind_t)
    node = Node(
        sop,
        "n0",
        tuple(Value(n, t) for n, t in zip(names, types, strict=True)),
        tuple(Value(n, t) for n, t in zip(outs, out_types, strict=True)),
        node_attrs,
        sdom,
    )
    step = Step(0, "n0", kind, sop, sdom, attrs_to_json(node_attrs), list(names), outs)
    return StepContext(step, node, tensors, dict(weights or {}), allow_tf32=allow_tf32, params=params)


def _lay(x: OperandLayout) -> str:
    return "k" if x.kcontig else "mn"


def _matches(ctx: StepContext) -> bool:
    step = ctx.step
    opdef = get_op(step.op, step.domain)
    if opdef.category is Category.FUSED:
        fa = ctx.attrs
        return (fa.anchor_domain, fa.anchor_op) in ANCHORS
    return (step.domain, step.op) in ANCHORS


register_family("gemm", _matches, _generate, search_space)
