"""The INT8 GEMM family: MatMulInteger and ConvInteger (plain, or the anchor of a Fused node) on
int8 tensor cores (templates/gemm_int8.cu.j2: mma.sync m16n8k32 s8, int32 accumulators).

passes/quantize_int8.py leaves, on the CUDA target,

    Fused[MatMulInteger | ConvInteger](x_q, w_q) with epilogue
        Add(acc, bias_int32) -> Cast(float32) -> Mul(scale per channel) [-> Relu, residual Add ...]
        [-> Div(s_next) -> Round -> Clip(-128, 127) -> Cast(int8)]     (requantized for the next layer)

and this family renders that epilogue into the GEMM's store hook with acc an int32, so the integer
sum is exact (the CPU target's int32 accumulation gives the same integers) and the float steps are
the CPU's float32 operations one by one (an a * b + c may contract to one FMA: 1 ulp, which after
requantization is at most 1 LSB).

Paths ("path" of the parameters): "mma" (gemm_int8.cu.j2, sm_80+), "wgmma" (gemm_int8_wgmma.cu.j2:
wgmma s8 from a cp.async pipeline, sm_90a) and "tma" (the Hopper TMA GEMM, gemm_sm90.cu.j2 with s8
operands: TMA loads, mbarrier ring, producer + two consumer warpgroups, persistent tiles; see
gemm_sm90.generate_int8). An sm_90 engine asks for {"path": "wgmma"} alone (codegen/build.py); that
request takes the TMA kernel wherever its operands allow (hopper_path), else the cp.async one.

Normalized problems (both operands staged K-contiguous by the kernel):
- MatMulInteger(A [..., M, K], B [K, N]) -> [..., M, N]: the leading dims fold into M; A is read
  in place (K contiguous), B (a [K, N] weight, N contiguous) by byte loads that transpose it.
- ConvInteger(x [N, C, H, W], w [Co, C/g, KH, KW]): a first kernel writes the patch matrix
  col [N, g, OH*OW, KP] (KP: C/g*KH*KW rounded up to 16 bytes) into the workspace; then per image
  and group out[n, group rows] (NCHW) = w[group rows] x col[n, group]^T, a batched GEMM.
- ConvInteger on [M, K, 1, 1] with a 1x1 kernel (how passes/quantize_int8.py writes an int8
  MatMul for CUDA, the weight stored [N, K, 1, 1]): a plain GEMM, both operands K-contiguous.

Grouped convolutions are batches over (image, group). Not covered (a one-line error naming the
node): zero points (uint8 activations or weights with a zero point), a B operand with batch dims,
1-D and 3-D convolutions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from graphc.codegen.cuda_types import dtype_from_numpy_name
from graphc.codegen.epilogue import render_epilogue, step_operands
from graphc.codegen.families.gemm import MMA_TILES, OperandLayout
from graphc.codegen.kernel import KernelSource, StepContext, ceil_div, register_family, render
from graphc.ir.types import DType
from graphc.ops.fused import ACC
from graphc.ops.registry import Category, get_op

ANCHORS = frozenset({("", "MatMulInteger"), ("", "ConvInteger")})
SM_COUNT = 132  # an H200; only the tile choice depends on it
SMEM_PER_SM = 228 * 1024
SMEM_PER_BLOCK = 227 * 1024
MAX_GRID_Z = 65535
# (BM, BN, WM, WN, relative efficiency): the mma.sync GEMM's tiles, less its 16-row one
TILES = [t for t in MMA_TILES if t[0] >= 32]
RATE_PER_SM = 1200e12 / SM_COUNT  # dense int8 tensor-core ops/s of an H200 SM, for the model
EPILOGUE_S_PER_ELEM_SM = 8e-12 * SM_COUNT  # one SM's epilogue time per output element (see estimate_seconds)
KEYS = ("BM", "BN", "BK", "WM", "WN", "STAGES")
WGMMA_KEYS = ("BM", "BN", "STAGES")
# sm_90a warpgroup MMA: (BM, BN, efficiency); a warpgroup per 64 rows, wgmma m64nBNk32
WGMMA_TILES = [
    (128, 256, 1.0),
    (128, 128, 0.9),
    (64, 256, 0.5),
    (64, 128, 0.55),
    (64, 64, 0.4),
]  # 64-row: measured slower


@dataclass(frozen=True)
class ConvPatches:
    """The im2col step of a ConvInteger: its geometry and the patch matrix's row pitch."""

    n: int
    c: int
    hw: tuple[int, int]
    out_hw: tuple[int, int]
    kernel: tuple[int, int]
    strides: tuple[int, int]
    pads: tuple[int, int]
    dilations: tuple[int, int]
    kp: int
    group: int = 1

    @property
    def nbytes(self) -> int:
        return self.n * self.group * self.out_hw[0] * self.out_hw[1] * self.kp


@dataclass
class Int8Problem:
    M: int
    N: int
    K: int
    a: OperandLayout
    b: OperandLayout
    batch_dims: list[tuple[int, int, int]]  # (size, a stride, b stride)
    out_shape: tuple[int, ...]
    epilogue: tuple = ()
    outputs: tuple = (ACC,)
    conv: ConvPatches | None = None
    anchor: str = "MatMulInteger"
    inputs: list[str] = field(default_factory=list)  # the GEMM's A and B tensors ("@workspace": col)

    @property
    def batch(self) -> int:
        return math.prod(s for s, _, _ in self.batch_dims)


def _anchor(ctx: StepContext) -> tuple[str, Any, int, tuple, tuple]:
    step = ctx.step
    if get_op(step.op, step.domain).category is Category.FUSED:
        fa = ctx.attrs
        return fa.anchor_op, fa.anchor_attrs, fa.anchor_inputs, tuple(fa.epilogue), tuple(fa.outputs)
    return step.op, ctx.attrs, len(step.inputs), (), (ACC,)


def problem_of(ctx: StepContext) -> Int8Problem:
    op, attrs, n_anchor, epilogue, outputs = _anchor(ctx)
    step = ctx.step
    if n_anchor < 2 or step.inputs[0] is None or step.inputs[1] is None:
        raise ctx.fail(f"{op} needs two operands")
    if n_anchor > 2 and any(v is not None for v in step.inputs[2:n_anchor]):
        # an fp32 engine lowers most of these (passes/lower_int_quant.py); one that reaches here did not
        hint = "" if ctx.precision == "fp32" else "; an fp32 engine (--precision fp32) runs it as a float op"
        raise ctx.fail(f"{op} with zero points has no CUDA int8 kernel (symmetric int8 without zero points has){hint}")
    xa, wb = ctx.spec(step.inputs[0]), ctx.spec(step.inputs[1])
    for what, spec in (("input", xa), ("weight", wb)):
        if dtype_from_numpy_name(spec.dtype) is not DType.int8:
            raise ctx.fail(f"{op} {what} of {spec.dtype}: the CUDA int8 kernels take int8 (symmetric) operands")
    out_shape = tuple(ctx.spec(step.outputs[0]).shape)
    if op == "MatMulInteger":
        sa, sb = tuple(xa.shape), tuple(wb.shape)
        if len(sb) != 2 or len(sa) < 2:
            raise ctx.fail(f"MatMulInteger of {sa} x {sb}: the CUDA int8 GEMM takes A [..., M, K] and a 2-D B [K, N]")
        K, N = sb
        if sa[-1] != K:
            raise ctx.fail(f"inner dims differ: {sa} x {sb}")
        M = math.prod(sa[:-1])
        prob = Int8Problem(
            M, N, K, OperandLayout(M, K, 1, []), OperandLayout(N, 1, N, []), [], out_shape, epilogue, outputs
        )
        prob.inputs = [step.inputs[0], step.inputs[1]]
        return prob
    # ConvInteger
    if len(xa.shape) != 4:
        raise ctx.fail(f"ConvInteger of rank {len(xa.shape)}: the CUDA int8 kernels cover 2-D convolutions")
    from graphc.ops.nn import window_geometry

    n, c, h, w = xa.shape
    co, _, kh, kw = wb.shape

    def fail(msg: str):
        raise ctx.fail(msg)

    geom = window_geometry(attrs, (h, w), (kh, kw), fail)
    pads = tuple(int(p) for p in geom.pads_begin)
    strides = tuple(attrs.strides) if attrs.strides else (1, 1)
    dil = tuple(attrs.dilations) if attrs.dilations else (1, 1)
    oh, ow = out_shape[2], out_shape[3]
    g = int(attrs.group)
    kg = co // g
    kr = c // g * kh * kw
    if (h, w, kh, kw, oh, ow, g) == (1, 1, 1, 1, 1, 1, 1) and not any(pads):
        # Rows of a matrix (passes/quantize_int8.py writes an int8 MatMul so): out [n, co] =
        # x [n, c] . w [co, c], both K-contiguous, no patch matrix.
        prob = Int8Problem(
            n, co, c, OperandLayout(n, c, 1, []), OperandLayout(co, c, 1, []), [], out_shape, epilogue, outputs
        )
        prob.anchor = "ConvInteger"
        prob.inputs = [step.inputs[0], step.inputs[1]]
        return prob
    kp = ceil_div(kr, 16) * 16
    patches = ConvPatches(n, c, (h, w), (oh, ow), (kh, kw), strides, pads, dil, kp, g)
    p = oh * ow
    # Batches: images (the weight shared), then groups (group gi: weight rows gi * kg.., patch
    # block gi); out [n][gi * kg + co][p] is the batched GEMM's own row-major order.
    dims = [d for d in ((n, 0, g * p * kp), (g, kg * kr, p * kp)) if d[0] > 1]
    prob = Int8Problem(
        kg,
        p,
        kr,
        OperandLayout(kg, kr, 1, [d[1] for d in dims]),
        OperandLayout(p, kp, 1, [d[2] for d in dims]),
        dims,
        out_shape,
        epilogue,
        outputs,
        patches,
        "ConvInteger",
    )
    prob.inputs = [step.inputs[1], "@workspace"]
    return prob


# ---- parameters -----------------------------------------------------------------------------------


def _vec(lay: OperandLayout, k: int) -> bool:
    return lay.vector_ok(k, 16)


def operand_vec(prob: Int8Problem) -> tuple[bool, bool]:
    """Whether A and B can be copied in 16-byte chunks along K. The patch matrix's rows are
    zero-padded to KP (16-byte multiples), so B can be even where K is not a multiple of 16 (the
    weight's byte loads zero every k >= K anyway)."""
    a = prob.a.kcontig and _vec(prob.a, prob.K)
    b = prob.b.kcontig and (_vec(prob.b, prob.K) or prob.conv is not None)
    return a, b


def shared_bytes(p: dict[str, Any]) -> int:
    if p.get("path") == "wgmma":  # swizzled stages (+1 KB to align them to 1024 bytes), or the C tile
        return max(p["STAGES"] * (p["BM"] + p["BN"]) * 128, p["BM"] * (p["BN"] + 8) * 4) + 1024
    pitch = p["BK"] + 16
    return max(p["STAGES"] * (p["BM"] + p["BN"]) * pitch, p["WM"] * 16 * (p["BN"] + 8) * 4)


def threads_of(p: dict[str, Any]) -> int:
    if p.get("path") == "wgmma":
        return p["BM"] // 64 * 128  # a warpgroup per 64 rows
    return p["WM"] * p["WN"] * 32


def hopper_path(prob: Int8Problem) -> str:
    """The sm_90a kernel of an sm_90 engine's int8 GEMM: "tma" wherever the TMA GEMM takes the
    operands (K-major, 16-byte rows, no patch matrix), else "wgmma"."""
    from graphc.codegen.families.gemm_sm90 import int8_unsupported

    return "tma" if int8_unsupported(prob) is None else "wgmma"


def valid(prob: Int8Problem, p: dict[str, Any]) -> bool:
    path = p.get("path", "mma")
    if path == "tma":
        from graphc.codegen.families.gemm_sm90 import int8_valid

        return int8_valid(prob, p)
    keys = WGMMA_KEYS if path == "wgmma" else KEYS
    if path not in ("mma", "wgmma") or any(not isinstance(p.get(k), int) or p[k] <= 0 for k in keys):
        return False
    if prob.batch > MAX_GRID_Z:
        return False
    if path == "wgmma":
        # cp.async only: both operands K-contiguous with 16-byte rows, K in whole 16-byte chunks
        if not all(operand_vec(prob)) or (prob.K % 16 and prob.conv is None):
            return False
        if p["BM"] not in (64, 128) or p["BN"] not in (64, 128, 256) or not 3 <= p["STAGES"] <= 8:
            return False
        return shared_bytes(p) <= SMEM_PER_BLOCK
    bm, bn, bk, wm, wn, st = (p[k] for k in KEYS)
    if bm % (wm * 16) or bn % (wn * 16) or bk % 32 or not 2 <= st <= 8:
        return False
    if threads_of(p) > 1024:
        return False
    return shared_bytes(p) <= SMEM_PER_BLOCK


def estimate_seconds(prob: Int8Problem, p: dict[str, Any]) -> float:
    """The fp16 GEMM's model without split-K (codegen/families/gemm.py): the busiest SM runs
    ceil(tiles / SMs) blocks, up to the occupancy at once, at the full rate only with about 8 warps
    resident; padded tile edges count as work. Only the ranking of tile shapes matters."""
    wgmma = p.get("path") == "wgmma"
    tiles = ceil_div(prob.M, p["BM"]) * ceil_div(prob.N, p["BN"]) * prob.batch
    per_sm_blocks = ceil_div(tiles, SM_COUNT)
    occupancy = max(1, min(SMEM_PER_SM // (shared_bytes(p) + 1024), 2048 // threads_of(p)))
    util = min(1.0, min(per_sm_blocks, occupancy) * threads_of(p) / 32 / 8)
    bk = 128 if wgmma else p["BK"]
    kspan = ceil_div(prob.K, bk) * bk
    rate = RATE_PER_SM * (2 if wgmma else 1)
    t_mma = 2.0 * p["BM"] * p["BN"] * kspan / (p["_eff"] * util * rate)
    # The tile's epilogue runs after its K loop (no overlap within a block): with one block per SM
    # it adds in full; a second resident block runs its K loop meanwhile. Measured on an H200
    # (2026-12-01): about 8 us per million requantized outputs at one 128x256 block per SM.
    t_epi = p["BM"] * p["BN"] * EPILOGUE_S_PER_ELEM_SM * 256 / threads_of(p)  # measured with 256 threads
    return per_sm_blocks * (t_mma + t_epi / min(2, occupancy, per_sm_blocks))


def candidates(prob: Int8Problem, path: str = "mma") -> list[dict[str, Any]]:
    out = []
    if path == "wgmma":
        for bm, bn, eff in WGMMA_TILES:
            for st in (3, 4, 5, 6):
                p = {"path": "wgmma", "BM": bm, "BN": bn, "STAGES": st, "_eff": eff}
                if valid(prob, p):
                    out.append(p)
        return out
    for bm, bn, wm, wn, eff in TILES:
        for bk in (64, 128):
            for st in (3, 4):
                p = {"path": "mma", "BM": bm, "BN": bn, "BK": bk, "WM": wm, "WN": wn, "STAGES": st, "_eff": eff}
                if valid(prob, p):
                    out.append(p)
    return out


def heuristic(prob: Int8Problem, path: str = "mma") -> dict[str, Any]:
    """The cheapest tile by the cost model; mma.sync with BK 64 and a 4-deep pipeline (3 for a
    short K), wgmma with 3 stages."""
    pool = candidates(prob, path)
    if path == "wgmma":
        # 3 stages: measured on an H200 (2026-12-01, docs/results/int8_cuda.md), 128x128 with 3
        # stages (two blocks per SM, so one block's epilogue overlaps the other's K loop) beat 4
        # stages by 1.3-1.5x at 4096x3072x768 and 4096x768x3072.
        want = 3
        best: dict[tuple[int, int], dict[str, Any]] = {}
        for p in pool:
            key = (p["BM"], p["BN"])
            if p["STAGES"] <= want and (key not in best or p["STAGES"] > best[key]["STAGES"]):
                best[key] = p
        pool = list(best.values()) or pool
    else:
        want = 4 if ceil_div(prob.K, 64) >= 4 else 3
        pool = [p for p in pool if p["BK"] == 64 and p["STAGES"] == want] or pool
    if not pool:
        raise ValueError(f"no valid int8 {path} GEMM configuration")
    return min(pool, key=lambda p: (estimate_seconds(prob, p), -p["BM"] * p["BN"]))


def _public(p: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in p.items() if not k.startswith("_")}


def search_space(ctx: StepContext) -> list[dict[str, Any]]:
    """The mma.sync candidates (the wgmma ones are the Hopper build's: codegen/build.py asks for
    {"path": "wgmma"} on sm_90)."""
    return [_public(p) for p in candidates(problem_of(ctx))]


# ---- rendering ------------------------------------------------------------------------------------


def _params(ctx: StepContext, prob: Int8Problem) -> dict[str, Any]:
    """The heuristic's choice, or the forced one: a full tile as given, a partial one such as
    {"path": "wgmma"} completed by that path's heuristic."""
    forced = dict(ctx.params or {})
    path = forced.get("path", "mma")
    if path not in ("mma", "wgmma", "tma"):
        raise ctx.fail(f"int8 GEMM path {path!r} is not one of mma, wgmma, tma")
    if path == "tma":
        return forced  # gemm_sm90.generate_int8 completes and checks them
    try:
        base = _public(heuristic(prob, path))
    except ValueError as e:
        raise ctx.fail(f"no int8 {path} GEMM configuration fits M={prob.M} N={prob.N} K={prob.K}") from e
    p = {**base, **forced}
    if not valid(prob, p):
        raise ctx.fail(f"forced int8 GEMM parameters {ctx.params} are not valid for this problem")
    return {k: p[k] for k in ("path", *(WGMMA_KEYS if path == "wgmma" else KEYS))}


def _im2col(ctx: StepContext, prob: Int8Problem) -> KernelSource:
    cp = prob.conv
    assert cp is not None
    name = ctx.kernel_name("_im2col")
    src = render(
        "conv_int8_im2col.cu.j2",
        name=name,
        N=cp.n,
        C=cp.c,
        G=cp.group,
        H=cp.hw[0],
        W=cp.hw[1],
        OH=cp.out_hw[0],
        OW=cp.out_hw[1],
        KH=cp.kernel[0],
        KW=cp.kernel[1],
        SH=cp.strides[0],
        SW=cp.strides[1],
        PH=cp.pads[0],
        PW=cp.pads[1],
        DH=cp.dilations[0],
        DW=cp.dilations[1],
        KP=cp.kp,
    )
    p_tiles = ceil_div(cp.out_hw[0] * cp.out_hw[1], 64)
    return KernelSource(
        "gemm_int8",
        name,
        src,
        (cp.n * cp.group * p_tiles, ceil_div(cp.kp, 64), 1),  # 64 x 64 tiles of the transpose
        (256, 1, 1),
        [ctx.step.inputs[0], "@workspace"],
        0,
        params={"im2col": True, "KP": cp.kp},
        workspace_bytes=cp.nbytes,
    )


def _generate(ctx: StepContext) -> list[KernelSource]:
    step = ctx.step
    where = f"{step.kind} node '{step.name}'"
    prob = problem_of(ctx)
    if prob.batch * prob.M * prob.N == 0:
        return []
    if ctx.params == {"path": "wgmma"} and hopper_path(prob) == "tma":  # the sm_90 engine's request
        ctx = ctx.with_params({"path": "tma"})
    p = _params(ctx, prob)
    if p["path"] == "tma":
        from graphc.codegen.families.gemm_sm90 import generate_int8

        return generate_int8(ctx, prob, p)
    ops = step_operands(ctx)
    name = ctx.kernel_name()
    out_specs = [ctx.tensors[o] for o in step.outputs]
    rendered = render_epilogue(
        prob.epilogue, prob.outputs, ops, out_specs, prob.out_shape, DType.int32, where=where, name=f"{name}_epi"
    )
    threads = threads_of(p)
    wgmma = p["path"] == "wgmma"
    bk = 128 if wgmma else p["BK"]
    vec = operand_vec(prob)
    opnds = []
    for X, lay, rows_tile, r0, v in (("A", prob.a, p["BM"], "m0", vec[0]), ("B", prob.b, p["BN"], "n0", vec[1])):
        opnds.append(
            {
                "name": X,
                "kcontig": lay.kcontig,
                "vec": v,
                "rows": lay.rows,
                "rows_tile": rows_tile,
                "r0": r0,
                "sr": lay.sr,
                "sk": lay.sk,
                "guard_chunks": (rows_tile * bk // 16) % threads != 0,
            }
        )
    ktiles = ceil_div(prob.K, bk)
    st = "signed char"
    out_names = [step.inputs[i] for i in rendered.inputs] + list(step.outputs)
    tmpl: dict[str, Any] = dict(
        epilogue=rendered,
        epilogue_name=f"{name}_epi",
        st=st,
        ct="int",
        alpha_lit=None,
        c_param=False,
        c_expr=None,
        out_args=list(rendered.args),
        batch_dims=prob.batch_dims,
        name=name,
        kparams=[f"const {st}* __restrict__ A", f"const {st}* __restrict__ B", *rendered.params],
        M=prob.M,
        N=prob.N,
        K=prob.K,
        BM=p["BM"],
        BN=p["BN"],
        STAGES=p["STAGES"],
        threads=threads,
        splits=1,
        kt_per_split=max(1, ktiles),
        batch=prob.batch,
        group_m=8,
        operands=opnds,
    )
    if wgmma:
        source = render("gemm_int8_wgmma.cu.j2", **tmpl)
    else:
        source = render("gemm_int8.cu.j2", **tmpl, BK=p["BK"], WM=p["WM"], WN=p["WN"])
    tiles = ceil_div(prob.M, p["BM"]) * ceil_div(prob.N, p["BN"])
    ws = prob.conv.nbytes if prob.conv is not None else 0
    info = {
        **p,
        "path": "int8_wgmma" if wgmma else "int8_mma",
        "M": prob.M,
        "N": prob.N,
        "K": prob.K,
        "batch": prob.batch,
        "VEC_A": int(opnds[0]["vec"]),
        "VEC_B": int(opnds[1]["vec"]),
    }
    main = KernelSource(
        "gemm_int8",
        name,
        source,
        (tiles, 1, prob.batch),
        (threads, 1, 1),
        [*prob.inputs, *out_names],
        shared_bytes(p),
        params={**info, "requires_arch": "sm_90a"} if wgmma else info,
        workspace_bytes=ws,
    )
    return [_im2col(ctx, prob), main] if prob.conv is not None else [main]


def _matches(ctx: StepContext) -> bool:
    step = ctx.step
    if get_op(step.op, step.domain).category is Category.FUSED:
        fa = ctx.attrs
        return (fa.anchor_domain, fa.anchor_op) in ANCHORS
    return (step.domain, step.op) in ANCHORS


register_family("gemm_int8", _matches, _generate, search_space)
