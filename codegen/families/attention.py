"""The attention family: ONNX Attention (opset 23+, graphc's IR form) and, as a second family,
RotaryEmbedding.

Attention steps come in the 3-D form (Q, K, V as (batch, seq, heads * head_dim) with q_num_heads /
kv_num_heads; output (batch, seq_q, q_heads * v_head_dim)) or the 4-D form (batch, heads, seq,
head_dim). Both are read in place through (batch, head, row) element strides: no transpose copies.
Grouped-query attention: query head h reads kv head h // (q_heads / kv_heads).

Supported: `scale` (or the 1/sqrt(head_dim) default), an attn_mask (bool: True takes part; or
additive, any other dtype) broadcast to (batch, q_heads, seq_q, seq_k) by index arithmetic, with a
last dim shorter than seq_k masking the keys past it (as the op pads it with -inf), is_causal,
left/right windows, softcap, nonpad_kv_seqlen. Rejected with a CompileError naming the node: past
key/value (a KV cache) and every output but Y (present_key/value, the qk matmul output).

Numerics follow graphc/ops/attention.py: Q.K^T is scaled by sqrt(scale) rounded to T1, squared
(the spec's function body scales Q and K by it), softmax in fp32 (fp64 for float64), and a row
whose every key is masked gives 0, never NaN (with graphc's masked_rows "mean": the mean of V over
all keys, a cold path of the kernels; with "nan": NaN, what the decomposed graph's softmax of a
row of -inf gives, at no cost: 1 / l is NaN instead of 0 there).

Kernel paths (templates/attention.cu.j2):
- "flash": fp16/bf16 with equal Q/K and V head dims, a multiple of 16 up to 128: tensor cores,
  online softmax, K/V tiles double-buffered through shared memory by cp.async.
- "simple": everything else (fp32, fp64, odd head dims, mixed V dtype): one warp per query row.
- "sm90" (templates/attention_sm90.cu.j2): the sm_90 plan of an engine (codegen/build.py asks
  `select_sm90`), fp16/bf16 with head dim 64 or 128 (Q/K and V alike): warpgroup MMA (wgmma) from
  128-byte swizzled shared memory, P from registers; every feature of "flash" (masks, band, GQA,
  nonpad_kv_seqlen, softcap). Other head dims on sm_90 keep "flash".
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from graphc.codegen.cuda_types import cuda_type, dtype_from_numpy_name
from graphc.codegen.expr import lit
from graphc.codegen.kernel import KernelSource, StepContext, ceil_div, grid_1d, register_family, render
from graphc.ir.types import DType
from graphc.ops.registry import get_op

# The machine the heuristic aims to fill (an H200: 132 SMs, 227 KB of shared memory a block).
SM_COUNT = 132
SMEM_PER_BLOCK = 227 * 1024
SMEM_PER_SM = 228 * 1024
MAX_GRID_YZ = 65535

FLASH_DTYPES = (DType.float16, DType.bfloat16)
ATTN_DTYPES = (DType.float16, DType.bfloat16, DType.float32, DType.float64)
LOG2E = 1.4426950408889634
SIMPLE_BN = 32  # keys a tile of the simple kernel: one a lane
SM90_HEAD_DIMS = (64, 128)


# ---- the normalized problem ---------------------------------------------------------------------


@dataclass(frozen=True)
class Layout:
    """Element (batch b, head h, row r, column c) of a tensor at b * sb + h * sh + r * sr + c."""

    sb: int
    sh: int
    sr: int


@dataclass(frozen=True)
class MaskInfo:
    dtype: DType
    boolean: bool  # True: a keep mask; False: added to the logits
    sb: int  # element strides over (batch, head, row); 0 where the mask broadcasts
    sh: int
    sr: int
    length: int  # its last dim: keys at or past it are masked


@dataclass
class AttnProblem:
    dtype: DType  # Q, K and the output (T1)
    vdtype: DType  # V (T2)
    batch: int
    q_heads: int
    kv_heads: int
    sq: int
    sk: int
    d: int  # Q/K head dim
    dv: int  # V head dim
    q: Layout
    k: Layout
    v: Layout
    o: Layout
    scale: float  # what Q.K^T is multiplied by
    softcap: float = 0.0
    causal: bool = False
    left: int = -1  # window sizes (-1: unbounded)
    right: int = -1
    mask: MaskInfo | None = None
    mask_index: int | None = None
    nonpad_index: int | None = None
    mean_rows: bool = False  # masked_rows "mean": a row with no kept key stores the mean of V
    nan_rows: bool = False  # masked_rows "nan": such a row stores NaN

    @property
    def group(self) -> int:
        return self.q_heads // self.kv_heads

    @property
    def kv_limit(self) -> int:
        return min(self.sk, self.mask.length) if self.mask is not None else self.sk

    @property
    def band_hi(self) -> int | None:
        """Keys allowed up to row + off + band_hi (None: no upper limit)."""
        his = ([0] if self.causal else []) + ([self.right] if self.right >= 0 else [])
        return min(his) if his else None

    @property
    def band_lo(self) -> int | None:
        """Keys allowed from row + off - band_lo (None: no lower limit)."""
        return self.left if self.left >= 0 else None


def _attrs(ctx: StepContext):
    return ctx.attrs


def effective_scale(scale: float | None, head: int, dtype: DType) -> float:
    """The factor on Q.K^T: sqrt(scale) rounded to T1, squared (the reference scales Q and K)."""
    s = 1.0 / math.sqrt(head) if scale is None else float(scale)
    r = np.asarray(math.sqrt(s)).astype(dtype.numpy)
    if dtype is DType.float64:
        return float(r) ** 2
    f = np.float32(r.astype(np.float32))
    return float(f) * float(f)


def _contig(shape: tuple[int, ...]) -> list[int]:
    out, s = [], 1
    for d in reversed(shape):
        out.append(s)
        s *= d
    return out[::-1]


def problem_of(ctx: StepContext) -> AttnProblem:
    step = ctx.step
    if (step.domain, step.op) != ("", "Attention"):
        raise ctx.fail("is not an Attention node")
    a = _attrs(ctx)
    ins = list(step.inputs) + [None] * (7 - len(step.inputs))
    if ins[0] is None or ins[1] is None or ins[2] is None:
        raise ctx.fail("Q, K and V are required")
    if ins[4] is not None or ins[5] is not None:
        raise ctx.fail("past_key/past_value (a KV cache) have no CUDA attention kernel yet")
    if len(step.outputs) != 1:
        raise ctx.fail(
            "only output Y has a CUDA attention kernel (present_key, present_value and the qk matmul "
            f"output do not); the node asks for {len(step.outputs)} outputs"
        )
    qs, ks, vs = (ctx.spec(ins[i]) for i in range(3))
    dt = dtype_from_numpy_name(qs.dtype)
    vdt = dtype_from_numpy_name(vs.dtype)
    if dt not in ATTN_DTYPES or vdt not in ATTN_DTYPES:
        raise ctx.fail(f"Attention of {dt.name}/{vdt.name} has no CUDA kernel (float16, bfloat16, float32, float64 do)")
    sq_shape, sk_shape, sv_shape = tuple(qs.shape), tuple(ks.shape), tuple(vs.shape)
    out_shape = tuple(ctx.spec(step.outputs[0]).shape)
    if len(sq_shape) == 3:
        qh, kvh = a.q_num_heads, a.kv_num_heads
        batch, sq, qhid = sq_shape
        _, sk, khid = sk_shape
        vhid = sv_shape[2]
        d, dv = qhid // qh, vhid // kvh
        q = Layout(sq * qhid, d, qhid)
        k = Layout(sk * khid, d, khid)
        v = Layout(sk * vhid, dv, vhid)
        ohid = qh * dv
        o = Layout(sq * ohid, dv, ohid)
        want_out = (batch, sq, ohid)
    elif len(sq_shape) == 4:
        batch, qh, sq, d = sq_shape
        _, kvh, sk, _ = sk_shape
        dv = sv_shape[3]
        q = Layout(qh * sq * d, sq * d, d)
        k = Layout(kvh * sk * d, sk * d, d)
        v = Layout(kvh * sk * dv, sk * dv, dv)
        o = Layout(qh * sq * dv, sq * dv, dv)
        want_out = (batch, qh, sq, dv)
    else:
        raise ctx.fail(f"Q must be 3-D or 4-D, got shape {sq_shape}")
    if out_shape != want_out:
        raise ctx.fail(f"output shape {out_shape} is not the expected {want_out}")
    if qh % kvh:
        raise ctx.fail(f"q_num_heads {qh} is not a multiple of kv_num_heads {kvh}")
    if max(sq, sk) >= 1 << 28:
        raise ctx.fail(f"sequence lengths {sq} and {sk} must be below 2^28")
    prob = AttnProblem(
        dtype=dt,
        vdtype=vdt,
        batch=batch,
        q_heads=qh,
        kv_heads=kvh,
        sq=sq,
        sk=sk,
        d=d,
        dv=dv,
        q=q,
        k=k,
        v=v,
        o=o,
        scale=effective_scale(a.scale, d, dt),
        softcap=float(a.softcap),
        causal=bool(a.is_causal),
        left=int(a.left_window_size),
        right=int(a.right_window_size),
        mean_rows=a.masked_rows == "mean",
        nan_rows=a.masked_rows == "nan",
    )
    if a.masked_rows not in ("zero", "mean", "nan"):
        raise ctx.fail(f"masked_rows {a.masked_rows!r} is not 'zero', 'mean' or 'nan'")
    if ins[3] is not None:
        prob.mask, prob.mask_index = _mask_info(ctx, ctx.spec(ins[3]), prob), 3
    if ins[6] is not None:
        prob.nonpad_index = 6
    return prob


def _mask_info(ctx: StepContext, spec, prob: AttnProblem) -> MaskInfo:
    mdt = dtype_from_numpy_name(spec.dtype)
    shape = tuple(spec.shape)
    if not 1 <= len(shape) <= 4:
        raise ctx.fail(f"attn_mask must have rank 1 to 4, got shape {shape}")
    full = (prob.batch, prob.q_heads, prob.sq)
    padded = (1,) * (4 - len(shape)) + shape
    strides = _contig(padded)
    sb, sh, sr = (0 if padded[i] == 1 else strides[i] for i in range(3))
    for i in range(3):
        if padded[i] not in (1, full[i]):
            raise ctx.fail(f"attn_mask of shape {shape} does not broadcast to {(*full, prob.sk)}")
    if shape[-1] > prob.sk:
        raise ctx.fail(f"attn_mask's last dim {shape[-1]} exceeds the key length {prob.sk}")
    return MaskInfo(mdt, mdt is DType.bool, sb, sh, sr, shape[-1])


# ---- kernel parameters: paths, validity, heuristic, search space ---------------------------------


def flash_ok(prob: AttnProblem) -> bool:
    """The tensor-core kernel: fp16/bf16 throughout, one head dim (a multiple of 16, at most 128),
    rows 16-byte aligned (every stride a multiple of 8 elements)."""
    if prob.dtype not in FLASH_DTYPES or prob.vdtype != prob.dtype:
        return False
    if prob.d != prob.dv or prob.d % 16 or not 16 <= prob.d <= 128:
        return False
    strides = [getattr(lay, s) for lay in (prob.q, prob.k, prob.v, prob.o) for s in ("sb", "sh", "sr")]
    return all(s % 8 == 0 for s in strides)


def sm90_ok(prob: AttnProblem) -> bool:
    """The wgmma kernel: what "flash" takes, with head dim 64 or 128 (one or two 128-byte swizzled
    column blocks)."""
    return flash_ok(prob) and prob.d in SM90_HEAD_DIMS


def path_of(prob: AttnProblem) -> str:
    return "flash" if flash_ok(prob) else "simple"


def shared_bytes(prob: AttnProblem, p: dict[str, Any]) -> int:
    if p["path"] == "sm90":
        # Q, STAGES x (K, V), and 1 KB to align the swizzled tiles
        return (64 * p["WG"] * prob.d + p["STAGES"] * p["BN"] * (prob.d + prob.dv)) * 2 + 1024
    if p["path"] == "flash":
        dp, dvp = prob.d + 8, prob.dv + 8
        return (p["BM"] * dp + 2 * p["BN"] * dp + 2 * p["BN"] * dvp) * 2
    cb = 8 if prob.dtype is DType.float64 else 4
    bn, w = SIMPLE_BN, p["WARPS"]
    return (bn * (prob.d + 1) + bn * prob.dv + w * prob.d + w * bn) * cb


def _acc_floats(prob: AttnProblem, p: dict[str, Any]) -> int:
    """fp32 accumulators a thread of the flash kernel holds (O and S)."""
    mi = p["BM"] // (16 * p["WARPS"])
    return mi * (prob.dv // 2 + p["BN"] // 2)


def valid(prob: AttnProblem, p: dict[str, Any]) -> bool:
    if prob.q_heads > MAX_GRID_YZ or prob.batch > MAX_GRID_YZ:
        return False
    if p["path"] == "simple":
        return p["WARPS"] in (1, 2, 4, 8, 16) and shared_bytes(prob, p) <= SMEM_PER_BLOCK
    if p["path"] == "sm90":
        return sm90_valid(prob, p)
    if not flash_ok(prob):
        return False
    bm, bn, w = p["BM"], p["BN"], p["WARPS"]
    if w not in (1, 2, 4, 8) or bm % (16 * w) or bm // (16 * w) not in (1, 2):
        return False
    if bn % 16 or not 16 <= bn <= 128:
        return False
    # beyond this many live fp32 accumulators a thread spills (255 registers; seen with ptxas -v)
    if _acc_floats(prob, p) > 160:
        return False
    return shared_bytes(prob, p) <= SMEM_PER_BLOCK


def _sm90_registers(prob: AttnProblem, bn: int) -> int:
    """The live fp32 accumulators S and O and the packed P of a thread of the wgmma kernel."""
    return bn // 2 + prob.dv // 2 + bn // 4


def sm90_valid(prob: AttnProblem, p: dict[str, Any]) -> bool:
    if not sm90_ok(prob) or p["WG"] not in (1, 2) or p["BN"] not in (64, 128) or p["STAGES"] not in (1, 2):
        return False
    # MINB: CTAs an SM must hold (__launch_bounds__' second argument: caps registers), 0 for none
    # MINB: CTAs an SM must hold (__launch_bounds__' second argument), so registers are capped at
    # 64K / (MINB x threads): at least the live fp32 accumulators S and O and the packed P a thread
    # (below that ptxas fails: seen at 128 with head dim 128 and 128-key tiles)
    minb = p.get("MINB", 0)
    need = _sm90_registers(prob, p["BN"])
    if minb not in range(9) or (minb and 65536 // (minb * 128 * p["WG"]) < need):
        return False
    # OVERLAP: the schedule with both tiles loaded up front (every key must fit the two stages)
    if p.get("OVERLAP", 0) not in (0, 1) or (p.get("OVERLAP") and (p["STAGES"] != 2 or prob.kv_limit > 2 * p["BN"])):
        return False
    if p["STAGES"] == 1 and prob.kv_limit > p["BN"]:
        return False  # one stage holds one tile: every key must fit in it
    return shared_bytes(prob, p) <= SMEM_PER_BLOCK


# (WG, BN): consumer warpgroups of 64 query rows, keys a tile
SM90_TILES = [(1, 128), (2, 128), (1, 64), (2, 64)]
# Every tile with no register cap and each with the heuristic's, other caps of the one-warpgroup tiles
# (MINB: CTAs an SM must hold), and each tile without the overlapped schedule where the default has
# it (OVERLAP 0). tools/bench_attention.py --sweep times them all.
SM90_SWEEP: list[dict[str, Any]] = [
    *({"WG": w, "BN": b, "MINB": m} for w, b in SM90_TILES for m in (0, None)),
    *({"WG": 1, "BN": b, "MINB": m} for b in (128, 64) for m in (2, 4)),
    *({"WG": w, "BN": b, "OVERLAP": 0} for w, b in SM90_TILES),
]


def sm90_params(
    prob: AttnProblem, wg: int, bn: int, minb: int | None = None, overlap: int | None = None
) -> dict[str, Any]:
    """The wgmma kernel's parameters for a tile: the fewest stages that hold the keys; registers
    capped (MINB) for as many CTAs an SM as shared memory allows, at most 3 for one warpgroup (168
    registers: more, 4 CTAs at 128, spilled in the causal kernel) and 2 for two, where minb is None;
    the overlapped schedule wherever it applies (every key in the two stages), where overlap is None.

    Measured on an H200 (2026-12-02, fp16, d64, 12 heads): the overlapped schedule took ViT s197
    from 0.0282 to 0.0242 ms at batch 32 (cuDNN: 0.0262) and from 0.0047 to 0.0042 at batch 1."""
    p: dict[str, Any] = {"path": "sm90", "WG": wg, "BN": bn, "STAGES": 1 if prob.kv_limit <= bn else 2}
    if minb is None:
        by_smem = SMEM_PER_SM // (shared_bytes(prob, p) + 1024)  # (+ the 1 KB the runtime reserves a CTA)
        minb = min(3 if wg == 1 else 2, by_smem)
        while minb > 1 and 65536 // (minb * 128 * wg) < _sm90_registers(prob, bn):
            minb -= 1
        minb = minb if minb > 1 else 0
    if minb:
        p["MINB"] = minb
    if overlap is None:
        overlap = int(p["STAGES"] == 2 and prob.kv_limit <= 2 * bn)
    if overlap:
        p["OVERLAP"] = 1
    return p


def sm90_candidates(prob: AttnProblem, sweep: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """The valid parameter sets of the wgmma kernel: each tile with the heuristic's register cap and
    schedule, or the variants of `sweep` (SM90_SWEEP; a key left out takes the default), duplicates
    dropped."""
    variants = sweep if sweep is not None else [{"WG": w, "BN": b} for w, b in SM90_TILES]
    out: list[dict[str, Any]] = []
    for v in variants:
        p = sm90_params(prob, v["WG"], v["BN"], v.get("MINB"), v.get("OVERLAP"))
        if valid(prob, p) and p not in out:
            out.append(p)
    return out


def sm90_heuristic(prob: AttnProblem) -> dict[str, Any] | None:
    """The wgmma kernel's default for this problem, or None where it does not apply: 128-key tiles
    (64 for head dim 128: 138 registers a thread against 208), the register cap of sm90_params; one
    warpgroup a CTA for short sequences, two (K and V read once for 128 rows) for long ones with
    enough CTAs to fill the GPU.

    Measured on an H200 (2026-12-02, tools/bench_attention.py --sweep, fp16, d64 unless said):
    one warpgroup fastest for BERT s128, ViT s197 and GPT-2 causal s128 at batch 1 and 32 (two: up
    to 1.3x slower); two for BERT s512 batch 8 (0.0270 against 0.0279 ms), GPT-2 causal s1024 batch
    8 (0.0685 / 0.0710), d128 causal 2x32x2048 (0.248 / 0.284) and d128 1x16x4096 (0.357 / 0.459);
    one for GPT-2 causal s1024 at batch 1 (96 CTAs of two: fewer than the SMs)."""
    if not sm90_ok(prob) or prob.q_heads > MAX_GRID_YZ or prob.batch > MAX_GRID_YZ:
        return None
    wg = 2 if prob.sq > 256 and ceil_div(prob.sq, 128) * prob.batch * prob.q_heads >= SM_COUNT else 1
    for w, b in [(wg, 128 if prob.d <= 64 else 64), *SM90_TILES]:
        p = sm90_params(prob, w, b)
        if valid(prob, p):
            return p
    return None


def select_sm90(ctx: StepContext) -> list[KernelSource]:
    """The sm_90 plan's attention kernels: the wgmma kernel where it applies, else [] (the caller
    then generates the default, "flash" or "simple")."""
    if not _matches(ctx) or ctx.params is not None:
        return []
    prob = problem_of(ctx)
    p = sm90_heuristic(prob)
    return [] if p is None else _generate(ctx.with_params(p))


FLASH_TILES = [  # (BM, BN, WARPS)
    (128, 64, 4),
    (128, 64, 8),
    (128, 128, 8),
    (128, 32, 4),
    (64, 64, 4),
    (64, 128, 4),
    (64, 32, 4),
    (64, 64, 2),
    (32, 64, 2),
    (32, 64, 1),
    (16, 64, 1),
    (16, 32, 1),
]


def candidates(prob: AttnProblem) -> list[dict[str, Any]]:
    """Every parameter set of the search space (valid ones only)."""
    out: list[dict[str, Any]] = []
    if path_of(prob) == "flash":
        for bm, bn, w in FLASH_TILES:
            p = {"path": "flash", "BM": bm, "BN": bn, "WARPS": w}
            if valid(prob, p):
                out.append(p)
    for w in (4, 8, 16):
        p = {"path": "simple", "WARPS": w}
        if valid(prob, p):
            out.append(p)
    return out


def heuristic(prob: AttnProblem) -> dict[str, Any]:
    """Big query tiles (128 rows: K/V read once for many queries) where that still gives the GPU
    a couple of waves of blocks; smaller ones for short or few sequences; the smallest that
    covers a very short query sequence (decode-like).

    Measured on an H200 (driver 580.159.04, NVRTC 13.5, tools/bench_attention.py --tune, fp16):
    128 x 32 with 4 warps (two 16-row slabs a warp) was fastest for head dim 128 (290 against 237
    TFLOP/s for 128 x 64 with 8 warps at 1x16x4096, 220 against 194 causal at 2x32x2048) and for
    non-causal head dim 64 (BERT seq 512: 227 against 207); causal head dim 64 (GPT-2 seq 1024)
    preferred 128 x 64."""
    if path_of(prob) == "simple":
        # 8 rows a block share each K/V tile: about twice as fast as 4 (H200, BERT/GPT-2 shapes)
        p = {"path": "simple", "WARPS": 8 if prob.sq > 4 else 4}
        if not valid(prob, p):
            raise ValueError("no valid attention configuration (head dims too large for shared memory)")
        return p
    heads = prob.batch * prob.q_heads
    if prob.sq <= 16:
        order = [(16, 64, 1)]
    elif prob.sq <= 32:
        order = [(32, 64, 2)]
    elif ceil_div(prob.sq, 128) * heads >= 2 * SM_COUNT:
        causal_d64 = prob.d <= 64 and prob.band_hi is not None
        order = [(128, 64, 4), (128, 32, 4)] if causal_d64 else [(128, 32, 4), (128, 64, 8)]
    else:
        order = [(64, 64, 4)]
    for bm, bn, w in [*order, *FLASH_TILES]:
        p = {"path": "flash", "BM": bm, "BN": bn, "WARPS": w}
        if valid(prob, p):
            return p
    raise ValueError("no valid attention configuration")


def search_space(ctx: StepContext) -> list[dict[str, Any]]:
    return candidates(problem_of(ctx))


# ---- rendering ----------------------------------------------------------------------------------


def _kernel_args(ctx: StepContext, prob: AttnProblem) -> tuple[list[str], list[str]]:
    """(tensor names, parameter declarations): Q, K, V, the mask, nonpad_kv_seqlen, then Y."""
    st, vst = cuda_type(prob.dtype).storage, cuda_type(prob.vdtype).storage
    ins = ctx.step.inputs
    names = [ins[0], ins[1], ins[2]]
    decls = [
        f"const {st}* __restrict__ Q",
        f"const {st}* __restrict__ K",
        f"const {vst}* __restrict__ V",
    ]
    if prob.mask is not None:
        names.append(ins[prob.mask_index])
        decls.append(f"const {cuda_type(prob.mask.dtype).storage}* __restrict__ M")
    if prob.nonpad_index is not None:
        names.append(ins[prob.nonpad_index])
        decls.append("const long long* __restrict__ NP")
    names.append(ctx.step.outputs[0])
    decls.append(f"{st}* __restrict__ O")
    return names, decls


def _choose(ctx: StepContext, prob: AttnProblem) -> dict[str, Any]:
    if not ctx.params:
        return heuristic(prob)
    p = dict(ctx.params)
    p.setdefault("path", path_of(prob))
    if p["path"] == "flash" and not flash_ok(prob):
        raise ctx.fail(f"forced attention path 'flash' does not fit this node ({prob.dtype.name}, head dim {prob.d})")
    if p["path"] == "sm90" and not sm90_ok(prob):
        raise ctx.fail(f"forced attention path 'sm90' does not fit this node ({prob.dtype.name}, head dim {prob.d})")
    if p["path"] not in ("flash", "simple", "sm90") or not valid(prob, p):
        raise ctx.fail(f"forced attention parameters {ctx.params} are not valid for this node")
    return p


def _generate(ctx: StepContext) -> list[KernelSource]:
    prob = problem_of(ctx)
    if prob.batch * prob.q_heads * prob.sq * prob.dv == 0:
        return []  # an empty output: nothing to launch
    p = _choose(ctx, prob)
    name = ctx.kernel_name()
    names, decls = _kernel_args(ctx, prob)
    ct = cuda_type(prob.dtype)
    fp64 = prob.dtype is DType.float64
    cname = "double" if fp64 else "float"
    flash = p["path"] == "flash"
    # exp2 of scale * log2(e) * (score - max), one FFMA a score, unless a float mask or softcap
    # must be applied to scaled logits first (or a zero scale would meet -inf)
    log2 = p["path"] != "simple" and prob.scale > 0 and not prob.softcap and (prob.mask is None or prob.mask.boolean)
    scale = prob.scale * LOG2E if log2 else prob.scale
    mask = None
    if prob.mask is not None:
        mt = cuda_type(prob.mask.dtype)
        mask = {
            "st": mt.storage,
            "boolean": prob.mask.boolean,
            "sb": prob.mask.sb,
            "sh": prob.mask.sh,
            "sr": prob.mask.sr,
            "load": mt.to_compute("Mb[mi_]"),
        }
    hi, lo = prob.band_hi, prob.band_lo
    span = prob.sq + prob.sk + 1  # a window wider than this is no limit (keeps literals small)
    common = {
        "name": name,
        "kparams": decls,
        "st": ct.storage,
        "vst": cuda_type(prob.vdtype).storage,
        "sq": prob.sq,
        "d": prob.d,
        "dv": prob.dv,
        "group": prob.group,
        "q": prob.q,
        "k": prob.k,
        "v": prob.v,
        "o": prob.o,
        "kv_limit": prob.kv_limit,
        "nonpad": prob.nonpad_index is not None,
        "has_hi": hi is not None,
        "hi": min(hi, span) if hi is not None else 0,
        "has_lo": lo is not None,
        "lo": min(lo, span) if lo is not None else 0,
        "mask": mask,
        "scale_lit": lit(scale, cname),
        "softcap_lit": lit(prob.softcap, cname) if prob.softcap > 0 else None,
        "inv_softcap_lit": lit(1.0 / prob.softcap, cname) if prob.softcap > 0 else None,
        "log2": log2,
        "mean_rows": prob.mean_rows,
        # 1 / l for a row with no key (l = 0; its O accumulators are 0): 0, or NaN for "nan"
        "dead_inv": _dead_inv(prob.nan_rows, fp64),
    }
    if prob.mean_rows:  # the mean of V over every key, for the rows with none kept (its only reader)
        vt = cuda_type(prob.vdtype)
        common |= {
            "sk": prob.sk,
            "inv_sk_lit": lit(1.0 / prob.sk if prob.sk else 0.0, cname),
            # flash / sm90 read 16-byte chunks (xv: 8 values), "simple" one value
            "v_mean_load": vt.to_compute("xv[j]")
            if p["path"] != "simple"
            else vt.to_compute(f"Vb[(long long)r * {prob.v.sr}ll + c]"),
        }
    requires = None
    if p["path"] == "sm90":
        threads = p["WG"] * 128
        source = render(
            "attention_sm90.cu.j2",
            threads=threads,
            wg=p["WG"],
            BN=p["BN"],
            stages=p["STAGES"],
            minb=p.get("MINB", 0),
            overlap=bool(p.get("OVERLAP", 0)),
            reverse=hi is not None and prob.nonpad_index is None,
            ab_type="bf16" if prob.dtype is DType.bfloat16 else "f16",
            pack_fn="gc_pack_bf2" if prob.dtype is DType.bfloat16 else "gc_pack_h2",
            **common,
        )
        grid = (ceil_div(prob.sq, 64 * p["WG"]), prob.q_heads, prob.batch)
        requires = "sm_90a"
    elif flash:
        threads = p["WARPS"] * 32
        source = render(
            "attention.cu.j2",
            kind="flash",
            threads=threads,
            BM=p["BM"],
            BN=p["BN"],
            warps=p["WARPS"],
            reverse=hi is not None and prob.nonpad_index is None,
            mma_fn="gc_mma_bf16" if prob.dtype is DType.bfloat16 else "gc_mma_f16",
            pack_fn="gc_pack_bf2" if prob.dtype is DType.bfloat16 else "gc_pack_h2",
            **common,
        )
        grid = (ceil_div(prob.sq, p["BM"]), prob.q_heads, prob.batch)
    else:
        threads = p["WARPS"] * 32
        vt = cuda_type(prob.vdtype)
        source = render(
            "attention.cu.j2",
            kind="simple",
            threads=threads,
            warps=p["WARPS"],
            ct=cname,
            neg_inf="__longlong_as_double(0xfff0000000000000ll)" if fp64 else "__int_as_float(0xff800000)",
            exp_fn="exp" if fp64 else "expf",
            tanh_fn="tanh" if fp64 else "tanhf",
            q_load=ct.to_compute(f"Qb[row * {prob.q.sr}ll + d]"),
            k_load=ct.to_compute(f"Kb[(n0 + r) * {prob.k.sr}ll + d]"),
            v_load=vt.to_compute(f"Vb[(n0 + r) * {prob.v.sr}ll + d]"),
            o_store=ct.to_storage(f"({ct.compute})(acc_o[u] * inv)"),
            o_store_mean=ct.to_storage(f"({ct.compute})vmean[d]"),
            **common,
        )
        grid = (ceil_div(prob.sq, p["WARPS"]), prob.q_heads, prob.batch)
    params = dict(p, d=prob.d, dv=prob.dv, sq=prob.sq, sk=prob.sk, heads=prob.q_heads, kv_heads=prob.kv_heads)
    if requires:
        params["requires_arch"] = requires
    return [KernelSource("attention", name, source, grid, (threads, 1, 1), names, shared_bytes(prob, p), params)]


def _dead_inv(nan_rows: bool, fp64: bool) -> str:
    """The C literal a kernel uses as 1 / l in a row with no key (l = 0): 0, or a quiet NaN."""
    if nan_rows:
        return "__longlong_as_double(0x7ff8000000000000ll)" if fp64 else "__int_as_float(0x7fc00000)"
    return "0.0" if fp64 else "0.f"


def _matches(ctx: StepContext) -> bool:
    return (ctx.step.domain, ctx.step.op) == ("", "Attention")


register_family("attention", _matches, _generate, search_space)


# ---- RotaryEmbedding ----------------------------------------------------------------------------

ROTARY_BLOCK = 256


def _rotary_generate(ctx: StepContext) -> list[KernelSource]:
    step = ctx.step
    a = ctx.attrs
    ins = list(step.inputs) + [None] * (4 - len(step.inputs))
    xs = ctx.spec(ins[0])
    dt = dtype_from_numpy_name(xs.dtype)
    if dt not in (DType.float16, DType.bfloat16, DType.float32):
        raise ctx.fail(f"RotaryEmbedding of {dt.name} has no CUDA kernel (float16, bfloat16, float32 do)")
    shape = tuple(xs.shape)
    if len(shape) == 4:
        _, heads, seq, head = shape
        hidden = heads * head
    elif len(shape) == 3:
        if not a.num_heads:
            raise ctx.fail("a 3-D input needs num_heads")
        _, seq, hidden = shape
        heads = a.num_heads
        head = hidden // heads
    else:
        raise ctx.fail(f"X must be 3-D or 4-D, got shape {shape}")
    rot = a.rotary_embedding_dim or head
    if rot % 2 or rot > head:
        raise ctx.fail(f"rotary dim {rot} must be even and at most the head size {head}")
    total = math.prod(shape)
    if total == 0:
        return []
    ct = cuda_type(dt)
    st = ct.storage
    pos = ins[3] is not None
    decls = [f"const {st}* __restrict__ X", f"const {st}* __restrict__ C", f"const {st}* __restrict__ S"]
    names = [ins[0], ins[1], ins[2]]
    if pos:
        decls.append("const long long* __restrict__ P")
        names.append(ins[3])
    decls.append(f"{st}* __restrict__ Y")
    names.append(step.outputs[0])
    name = ctx.kernel_name()
    source = render(
        "attention.cu.j2",
        kind="rotary",
        name=name,
        kparams=decls,
        total=total,
        head=head,
        rot=rot,
        seq=seq,
        heads=heads,
        hidden=hidden,
        rank=len(shape),
        interleaved=bool(a.interleaved),
        position_ids=pos,
        max_pos=ctx.spec(ins[1]).shape[0] if pos else 0,
        load=lambda e: ct.to_compute(e),
        store=lambda e: ct.to_storage(e),
    )
    grid = grid_1d(total, ROTARY_BLOCK, max_blocks=SM_COUNT * 32)
    params = {"rot": rot, "interleaved": int(bool(a.interleaved)), "position_ids": int(pos)}
    return [KernelSource("rotary", name, source, grid, (ROTARY_BLOCK, 1, 1), names, 0, params)]


def _rotary_matches(ctx: StepContext) -> bool:
    return (ctx.step.domain, ctx.step.op) == ("", "RotaryEmbedding")


register_family("rotary", _rotary_matches, _rotary_generate)


# ---- one-step plans (tests, benchmarks, the tuner) ----------------------------------------------


def standalone_context(
    op: str,
    inputs: list[tuple[tuple[int, ...], DType] | None],
    attrs: Any = None,
    *,
    params: dict[str, Any] | None = None,
) -> StepContext:
    """A one-step plan around an Attention or RotaryEmbedding node: inputs x0, x1, ... (None: an
    omitted optional input), output y0; its type from the op's own inference."""
    from graphc.ir.attrs import attrs_to_json
    from graphc.ir.graph import Node, Value
    from graphc.ir.types import TensorType
    from graphc.ops.registry import InferContext
    from graphc.runtime.plan import Step, TensorSpec

    opdef = get_op(op)
    attrs = attrs if attrs is not None else opdef.attrs()
    types = [None if x is None else TensorType(x[1], tuple(x[0])) for x in inputs]
    (out,) = opdef.infer(InferContext(op, "n0", attrs, types, [None] * len(types), 1))
    tensors = {}
    names: list[str | None] = []
    for i, t in enumerate(types):
        if t is None:
            names.append(None)
            continue
        names.append(f"x{i}")
        tensors[f"x{i}"] = TensorSpec(f"x{i}", t.dtype.numpy.name, list(t.static_shape), t.nbytes)
    tensors["y0"] = TensorSpec("y0", out.dtype.numpy.name, list(out.static_shape), out.nbytes)
    node = Node(
        op,
        "n0",
        tuple(None if n is None else Value(n, t) for n, t in zip(names, types, strict=True)),
        (Value("y0", out),),
        attrs,
    )
    step = Step(0, "n0", op, op, "", attrs_to_json(attrs), names, ["y0"])
    return StepContext(step, node, tensors, {}, params=params)
