"""The convolution family: graphc.ConvNHWC and ONNX Conv, plain or as the anchor of a Fused node.

Variants (templates/conv.cu.j2 says how each works):
- "tc": NHWC implicit GEMM on tensor cores, for float16/bfloat16 (and float32 as TF32 where
  allow_tf32), whenever the per-group output channels fill an MMA tile (K/group >= 8).
- "simt": NHWC implicit GEMM on CUDA cores: float32/float64, and grouped convolutions whose
  groups are too narrow for tensor cores.
- "depthwise": NHWC, C/group == 1 (depthwise, with any channel multiplier).
- "nchw": a direct kernel for ONNX Conv left in NCHW (1-D, 3-D, opt_level 0, float64...), so no
  Conv is ever without a kernel.

Tensor-core tiles are template parameters (`search_space` lists them; `heuristic_params` picks a
default by a wave-quantization cost model); StepContext.params forces a choice.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from graphc.codegen.cuda_types import cuda_type, dtype_from_numpy_name
from graphc.codegen.epilogue import render_epilogue
from graphc.codegen.families.elementwise import operands
from graphc.codegen.kernel import KernelSource, StepContext, ceil_div, grid_1d, register_family, render
from graphc.errors import CompileError
from graphc.ir.types import DType
from graphc.ops.fused import ACC, EpilogueOp, Ref
from graphc.ops.layout_ops import LAYOUT_DOMAIN

# Multiprocessors the tile model assumes (H100/H200: 132; A100: 108).
ASSUMED_SMS = 132
# Tensor-core tiles: (BM, BN, WM, WN); warps = (BM / WM) * (BN / WN).
TC_TILES = ((128, 128, 64, 32), (128, 64, 64, 32), (64, 128, 32, 64), (64, 64, 32, 32))
# Relative throughput of a tile shape per unit of work (bigger tiles reuse more operands).
_TILE_EFFICIENCY = {(128, 128): 1.0, (128, 64): 0.9, (64, 128): 0.85, (64, 64): 0.85}
# (k-tile chunks, stages) per tile: each within 48 KB of shared memory. Deeper pipelines were up
# to 12% faster on an H200 (64x64 with 8 chunks and 4 stages: 64 KB), but a kernel above 48 KB
# needs the executor to raise its limit, which runtime/cuda.py cannot do on cupy 14 yet; the
# search space has them for the tuner.
_PIPELINE = {(128, 128): (4, 3), (128, 64): (4, 4), (64, 128): (4, 4), (64, 64): (8, 3)}
MAX_SMEM = 100 * 1024
MAX_SPLITS = 16


@dataclass(frozen=True)
class ConvGeometry:
    layout: str  # "nhwc" | "nchw"
    n: int
    c: int
    k: int
    group: int
    in_spatial: tuple[int, ...]
    out_spatial: tuple[int, ...]
    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    pads: tuple[int, ...]  # begin pads
    dilations: tuple[int, ...]
    dtype: DType

    @property
    def cg(self) -> int:
        return self.c // self.group

    @property
    def kg(self) -> int:
        return self.k // self.group

    @property
    def m(self) -> int:
        return self.n * math.prod(self.out_spatial)

    @property
    def rsc(self) -> int:
        return math.prod(self.kernel) * self.cg


@dataclass(frozen=True)
class ConvStep:
    anchor_op: str
    anchor_domain: str
    anchor_attrs: Any
    n_anchor: int
    epilogue: tuple[EpilogueOp, ...]
    outputs: tuple[Ref, ...]


def conv_step(ctx: StepContext) -> ConvStep | None:
    """The conv anchor of a step (a plain conv, or a Fused node's anchor), else None."""
    step = ctx.step
    if step.op == "Fused" and step.domain == "graphc":
        fa = ctx.attrs
        if not _is_conv(fa.anchor_op, fa.anchor_domain):
            return None
        return ConvStep(fa.anchor_op, fa.anchor_domain, fa.anchor_attrs, fa.anchor_inputs, fa.epilogue, fa.outputs)
    if not _is_conv(step.op, step.domain):
        return None
    attrs = ctx.attrs
    return ConvStep(step.op, step.domain, attrs, len(step.inputs), (), (ACC,))


def _is_conv(op: str | None, domain: str) -> bool:
    return (op, domain) in (("Conv", ""), ("ConvNHWC", LAYOUT_DOMAIN))


def geometry(ctx: StepContext, cs: ConvStep) -> ConvGeometry:
    x = ctx.input_spec(0)
    w = ctx.input_spec(1)
    assert x is not None and w is not None
    a = cs.anchor_attrs
    dtype = dtype_from_numpy_name(x.dtype)
    if cs.anchor_op == "ConvNHWC":
        n, h, wd, c = x.shape
        k, r, s, _ = w.shape
        nd = 2
        pads = tuple(a.pads[:nd])
        in_sp = (h, wd)
        kernel = (r, s)
    else:
        from graphc.ops.nn import window_geometry

        n, c = x.shape[:2]
        k = w.shape[0]
        in_sp = tuple(x.shape[2:])
        kernel = tuple(w.shape[2:])

        def fail(msg: str):
            raise ctx.fail(msg)

        geom = window_geometry(a, in_sp, kernel, fail)
        pads = tuple(int(p) for p in geom.pads_begin)
    nd = len(in_sp)
    strides = tuple(a.strides) if a.strides else (1,) * nd
    dil = tuple(a.dilations) if a.dilations else (1,) * nd
    out = ctx.tensors[_anchor_output(ctx, cs)].shape
    out_sp = tuple(out[1:3]) if cs.anchor_op == "ConvNHWC" else tuple(out[2:])
    return ConvGeometry(
        "nhwc" if cs.anchor_op == "ConvNHWC" else "nchw",
        n,
        c,
        k,
        int(a.group),
        tuple(in_sp),
        out_sp,
        kernel,
        strides,
        pads,
        dil,
        dtype,
    )


def _anchor_output(ctx: StepContext, cs: ConvStep) -> str:
    # Every output of a conv step has the conv's shape (the layout pass and fusion keep it so).
    return ctx.step.outputs[0]


# ---- variant choice and parameters ------------------------------------------------------------


def variant(ctx: StepContext, g: ConvGeometry) -> str:
    if g.layout == "nchw":
        return "nchw"
    if g.cg == 1:
        return "depthwise"
    tc_types = (DType.float16, DType.bfloat16) + ((DType.float32,) if ctx.allow_tf32 else ())
    if g.dtype in tc_types and g.kg >= 8:
        return "tc"
    return "simt"


def _elem(g: ConvGeometry) -> int:
    return g.dtype.itemsize


def search_space(ctx: StepContext) -> list[dict[str, Any]]:
    cs = conv_step(ctx)
    if cs is None:
        return []
    g = geometry(ctx, cs)
    var = variant(ctx, g)
    if var == "depthwise":
        return depthwise_space(g)
    if var != "tc":
        return [{}]
    out = []
    for bm, bn, wm, wn in TC_TILES:
        for bkc in (4, 8):
            for stages in (3, 4):
                p = {"bm": bm, "bn": bn, "wm": wm, "wn": wn, "bkc": bkc, "stages": stages}
                if _smem_bytes(p, _elem(g)) > MAX_SMEM:
                    continue
                k_tiles = ceil_div(g.rsc, bkc * 16 // g.dtype.itemsize)
                options = {1, split_k(g, p)} | {s for s in (2, 4, 8) if k_tiles // s >= 4}
                for splits in sorted(options):
                    out.append({**p, "splits": splits})
    return out


def _smem_bytes(p: dict[str, Any], elem: int) -> int:
    return p["stages"] * (p["bm"] + p["bn"]) * p["bkc"] * 16 + 0 * elem


def heuristic_params(g: ConvGeometry) -> dict[str, Any]:
    """The tile that keeps the busiest multiprocessor's work least: blocks spread over ASSUMED_SMS,
    so an SM runs ceil(blocks / SMs) tiles, each costing its area over the tile's efficiency
    (plus the padding of an N tile wider than the channels). Pipeline depth and k-tile: the
    fastest of each tile's 48 KB configurations on an H200 (ResNet-50's 3x3 layers at batch 32)."""
    best = None
    for bm, bn, wm, wn in TC_TILES:
        blocks = ceil_div(g.m, bm) * ceil_div(g.kg, bn) * g.group
        cost = ceil_div(blocks, ASSUMED_SMS) * bm * bn / _TILE_EFFICIENCY[(bm, bn)]
        cost *= ceil_div(g.kg, bn) * bn / g.kg
        if best is None or cost < best[0]:
            best = (cost, bm, bn, wm, wn)
    assert best is not None
    _, bm, bn, wm, wn = best
    bkc, stages = _PIPELINE[(bm, bn)]
    if g.cg % (16 // g.dtype.itemsize) or g.rsc < bkc * 8:
        bkc, stages = 4, 3  # the element path or a shallow reduction: short k-tiles
    p = {"bm": bm, "bn": bn, "wm": wm, "wn": wn, "bkc": bkc, "stages": stages}
    p["splits"] = split_k(g, p)
    return p


def split_k(g: ConvGeometry, p: dict[str, Any]) -> int:
    """k-splits for a grid that does not fill the GPU once over a deep reduction. Far too few
    tiles (ResNet-50's last stage at batch 1: 8 output tiles for 132 SMs): enough splits to fill
    the SMs, each keeping at least 4 k-tiles. Under one wave (the same stage at batch 32: 104
    tiles): 2 splits, so that two blocks share each SM and hide each other's latency (measured on
    an H200: 65 -> 53 us)."""
    blocks = ceil_div(g.m, p["bm"]) * ceil_div(g.kg, p["bn"]) * g.group
    k_tiles = ceil_div(g.rsc, p["bkc"] * 16 // g.dtype.itemsize)
    if blocks * 2 <= ASSUMED_SMS and k_tiles >= 8:
        return max(1, min(ceil_div(ASSUMED_SMS, blocks), k_tiles // 4, MAX_SPLITS))
    if blocks < ASSUMED_SMS and k_tiles >= 16:
        return 2
    return 1


# ---- generation --------------------------------------------------------------------------------


def _matches(ctx: StepContext) -> bool:
    return conv_step(ctx) is not None


def _generate(ctx: StepContext) -> list[KernelSource]:
    cs = conv_step(ctx)
    assert cs is not None
    step = ctx.step
    where = f"{step.kind} node '{step.name}': "
    g = geometry(ctx, cs)
    if g.dtype not in (DType.float16, DType.bfloat16, DType.float32, DType.float64):
        raise ctx.fail(f"convolution of {g.dtype.name} has no CUDA kernel")
    var = variant(ctx, g)
    if var == "tc" and g.dtype is DType.float64:
        var = "simt"
    name = ctx.kernel_name()
    epi_name = f"{name}_epi"
    out_specs = [ctx.tensors[o] for o in step.outputs]
    out_shape = tuple(out_specs[0].shape)
    ops = operands(ctx)
    rendered = render_epilogue(cs.epilogue, cs.outputs, ops, out_specs, out_shape, g.dtype, where=where, name=epi_name)
    ct = cuda_type(g.dtype, where)
    has_bias = cs.n_anchor >= 3 and len(step.inputs) > 2 and step.inputs[2] is not None
    common = {
        "variant": var,
        "name": name,
        "epilogue": rendered,
        "epi_name": epi_name,
        "T": ct.storage,
        "ct": ct.compute,
        "load_v": ct.to_compute("v"),
        "has_bias": has_bias,
        "elem": g.dtype.itemsize,
    }
    args = [step.inputs[0], step.inputs[1]] + ([step.inputs[2]] if has_bias else [])
    args += [step.inputs[i] for i in rendered.inputs] + list(step.outputs)
    shared = 0
    params: dict[str, Any] = {"variant": var}
    if var == "nchw":
        if len(g.in_spatial) > 3:
            raise ctx.fail(f"{len(g.in_spatial)}-D convolution has no CUDA kernel")
        ctx_vars, grid, block = _nchw_vars(g, out_shape)
    else:
        ctx_vars = _nhwc_vars(g)
        if var == "tc":
            p = dict(ctx.params) if ctx.params else heuristic_params(g)
            vec = 16 // g.dtype.itemsize
            threads = (p["bm"] // p["wm"]) * (p["bn"] // p["wn"]) * 32
            ctx_vars.update(p)
            ctx_vars.update(
                threads=threads,
                vec=vec,
                mma={DType.float16: "f16", DType.bfloat16: "bf16", DType.float32: "tf32"}[g.dtype],
                a_vec=g.cg % vec == 0,
                b_vec=g.rsc % vec == 0,
            )
            p.setdefault("splits", 1)
            grid = (ceil_div(g.m, p["bm"]), ceil_div(g.kg, p["bn"]), g.group * p["splits"])
            block = (threads, 1, 1)
            shared = _smem_bytes(p, g.dtype.itemsize)
            params.update(p)
            if p["splits"] > 1:
                return _split_k_sources(ctx, g, common, ctx_vars, grid, block, shared, params, rendered)
        elif var == "simt":
            grid = (ceil_div(g.m, 64), ceil_div(g.kg, 64), g.group)
            block = (256, 1, 1)
        else:
            dw = _depthwise_params(g, ctx.params, where)
            ctx_vars.update(dw)
            ctx_vars["epv"] = None
            if dw["vc"] > 1 and not dw["tail"]:
                # the same epilogue storing into registers (out<k>[0] of a per-element pointer),
                # so that the kernel writes each pixel's VC channels as one vector per output
                vec = render_epilogue(
                    cs.epilogue, cs.outputs, ops, out_specs, out_shape, g.dtype, where=where, name=f"{name}_epv",
                    out_index="0",
                )  # fmt: skip
                n_out = len(out_specs)
                ctx_vars["epv"] = {
                    "function": vec.function,
                    "in_args": vec.args[:-n_out],
                    "outs": [
                        (arg, cuda_type(dt, where).storage, dt.itemsize)
                        for arg, dt in zip(
                            vec.args[-n_out:], [dtype_from_numpy_name(spec.dtype) for spec in out_specs], strict=True
                        )
                    ],
                }
            grid = (ceil_div(dw["strips"], dw["pix"]), ceil_div(ceil_div(g.k, dw["vc"]), dw["cvb"]), 1)
            block = (dw["cvb"], dw["pix"], 1)
            params.update(dw)
    source = render("conv.cu.j2", **common, **ctx_vars)
    return [KernelSource("conv", name, source, grid, block, args, shared_bytes=shared, params=params)]


def _split_k_sources(ctx, g, common, ctx_vars, grid, block, shared, params, rendered) -> list[KernelSource]:
    """One launch whose last block per tile sums the partials and runs the epilogue (serial
    split-K, the default); with params["serial"] = 0, two: the split GEMM (partial sums into the
    workspace), then the reduction that adds them, the bias and the epilogue."""
    step = ctx.step
    name = common["name"]
    splits = params["splits"]
    ws_bytes = splits * g.m * g.k * 4
    if params.setdefault("serial", 1):
        tiles = grid[0] * grid[1] * g.group
        source = render("conv.cu.j2", **common, **{**ctx_vars, "serial": True, "tiles": tiles})
        args = [step.inputs[0], step.inputs[1]] + ([step.inputs[2]] if common["has_bias"] else [])
        args += [step.inputs[i] for i in rendered.inputs] + list(step.outputs) + ["@workspace"]
        return [KernelSource("conv", name, source, grid, block, args, shared, params, ws_bytes)]
    partial = render("conv.cu.j2", **common, **{**ctx_vars, "serial": False})
    first = KernelSource(
        "conv", name, partial, grid, block, [step.inputs[0], step.inputs[1], "@workspace"], shared, params, ws_bytes
    )
    total = g.m * g.k
    reduce_common = {**common, "variant": "splitk_reduce", "name": f"{name}_r", "epi_name": f"{name}_epi"}
    source = render("conv.cu.j2", **reduce_common, splits=splits, total=total, K=g.k)
    args = ["@workspace"] + ([step.inputs[2]] if common["has_bias"] else [])
    args += [step.inputs[i] for i in rendered.inputs] + list(step.outputs)
    second = KernelSource(
        "conv", f"{name}_r", source, grid_1d(total, 256), (256, 1, 1), args, 0, {"variant": "splitk_reduce"}, ws_bytes
    )
    return [first, second]


def _nhwc_vars(g: ConvGeometry) -> dict[str, Any]:
    h, w = g.in_spatial
    p, q = g.out_spatial
    r, s = g.kernel
    return {
        "H": h,
        "W": w,
        "C": g.c,
        "P": p,
        "Q": q,
        "K": g.k,
        "R": r,
        "S": s,
        "CG": g.cg,
        "KG": g.kg,
        "SH": g.strides[0],
        "SW": g.strides[1],
        "PH": g.pads[0],
        "PW": g.pads[1],
        "DH": g.dilations[0],
        "DW": g.dilations[1],
        "M": g.m,
        "RSC": g.rsc,
    }


# Depthwise register blocking: a thread keeps acc[QT][VC] and the filter row's weights wr[S][VC]
# in registers, and the compiler hoists the row's JW input vectors (raw) ahead of their use. At
# most this many 32-bit registers for them: on NVRTC 13 for sm_90, float16/32/64 with S in
# 3, 5, 7, strides 1-2 and dilations 1-2 then fit the 128 registers of two 256-thread blocks a
# multiprocessor without spilling (cuobjdump --dump-resource-usage), and so does bfloat16.
DW_REG_BUDGET = 128
DW_MAX_QT = 6
# Below this many threads the GPU is under-filled: fewer pixels a strip, smaller blocks.
DW_MIN_THREADS = ASSUMED_SMS * 128


def depthwise_space(g: ConvGeometry) -> list[dict[str, Any]]:
    """The tuner's candidates for a depthwise step besides its default (the tuner times that
    itself): strip lengths QT up to DW_MAX_QT + 2 at the default channel vector and QT 4..8 at half
    of it (fewer registers a pixel), the ones nearest the default first (`--tune fast` takes the
    first few). On the H200 ConvNeXt-T's stage-0 7x7 at batch 32 ran 61.6 us at the default QT 4,
    50.1 at QT 5 (over the register budget) and 51.9 at VC 4 / QT 6
    (docs/results/h200_dwconv_2026-12-01.md)."""
    base = _depthwise_params(g)
    q, qt0 = g.out_spatial[1], base["qt"]
    cands = [{"qt": t} for t in range(1, min(DW_MAX_QT + 2, q) + 1) if t != qt0]
    if base["vc"] >= 4 and not base["tail"]:
        cands += [{"vc": base["vc"] // 2, "qt": t} for t in range(4, min(8, q) + 1)]
    return sorted(cands, key=lambda p: (abs(p["qt"] - qt0) + (1 if "vc" in p else 0), p["qt"]))


def _depthwise_params(g: ConvGeometry, forced: dict[str, Any] | None = None, where: str = "") -> dict[str, Any]:
    """A thread computes VC channels of QT consecutive output pixels along W (a strip): per filter
    row it loads the (QT-1)*SW + (S-1)*DW + 1 input vectors of that row once and does the QT*S
    multiply-adds per channel from registers, instead of loading each input vector R*S times.
    `forced` (the tuner's or a test's params) may set "vc" and "qt"; other keys are ignored."""
    forced = forced or {}
    vc = 1
    if g.kg == 1:  # one output channel per input channel: channel vectors are contiguous
        for cand in (16 // g.dtype.itemsize, 8 // g.dtype.itemsize, 4 // g.dtype.itemsize, 2):
            if cand > 1 and g.c % cand == 0:
                vc = cand
                break
    if "vc" in forced:
        vc = int(forced["vc"])
        if vc < 1 or vc & (vc - 1) or vc * g.dtype.itemsize > 16 or (vc > 1 and g.kg != 1):
            raise CompileError(f"{where}depthwise vc={vc}: a power of two, at most 16 bytes, 1 with a multiplier")
    r, s = g.kernel
    p, q = g.out_spatial
    words = 2 if g.dtype is DType.float64 else 1  # 32-bit registers per accumulator
    cv = ceil_div(g.k, vc)

    def strips(qt: int) -> int:
        return g.n * p * ceil_div(q, qt)

    if "qt" in forced:
        qt = int(forced["qt"])
        if qt < 1:
            raise CompileError(f"{where}depthwise qt={qt} must be at least 1")
    else:

        def jw(qt: int) -> int:  # input columns a strip's filter row spans
            return (qt - 1) * g.strides[1] + (s - 1) * g.dilations[1] + 1

        def regs(qt: int) -> int:
            return (qt + s) * vc * words + jw(qt) * ceil_div(vc * g.dtype.itemsize, 4)

        def cost(qt: int) -> int:
            # per strip and filter row: JW vector loads (and VC conversions each), the S weight
            # vectors from shared memory, QT*S*VC multiply-adds; over the ceil(Q/QT) strips a
            # row, so that a QT leaving a mostly empty last strip loses to a smaller one
            return ceil_div(q, qt) * (jw(qt) * (vc + 1) + s * vc + qt * s * vc)

        fits = [t for t in range(1, min(DW_MAX_QT, q) + 1) if t == 1 or regs(t) <= DW_REG_BUDGET]
        qt = min(fits, key=lambda t: (cost(t), -t))
        # a small problem: more threads beat longer strips
        while qt > 1 and strips(qt) * cv < DW_MIN_THREADS:
            qt = max(1, qt // 2)
    cvb = min(cv, 32)
    taps = r * s
    while cvb > 1 and taps * cvb * vc * 4 * words > 32 * 1024:
        cvb //= 2
    pix = max(1, 256 // cvb)
    n_strips = strips(qt)
    # fill the multiprocessors before filling blocks (but keep two warps a block)
    while pix > 1 and cvb * pix > 64 and ceil_div(n_strips, pix) * ceil_div(cv, cvb) < ASSUMED_SMS:
        pix = ceil_div(pix, 2)
    # two blocks a multiprocessor (at most 128 registers a thread at 256 threads): the compiler
    # otherwise spends up to 140 on long strips and leaves one block of 8 warps to hide latency
    min_blocks = 2 if qt > 1 else 1
    tail = g.k % vc != 0
    return {"vc": vc, "cvb": cvb, "pix": pix, "qt": qt, "min_blocks": min_blocks, "strips": n_strips, "tail": tail}


def _nchw_vars(g: ConvGeometry, out_shape: tuple[int, ...]) -> tuple[dict[str, Any], tuple, tuple]:
    nd = len(g.in_spatial)

    def pad3(t: tuple[int, ...], fill: int) -> list[int]:
        return [fill] * (3 - nd) + list(t)

    total = math.prod(out_shape)
    ctx_vars = {
        "C": g.c,
        "K": g.k,
        "CG": g.cg,
        "KG": g.kg,
        "in_sp": pad3(g.in_spatial, 1),
        "out_sp": pad3(g.out_spatial, 1),
        "ker": pad3(g.kernel, 1),
        "strides": pad3(g.strides, 1),
        "pads": pad3(g.pads, 0),
        "dils": pad3(g.dilations, 1),
        "total": total,
    }
    return ctx_vars, grid_1d(total, 256), (256, 1, 1)


register_family("conv", _matches, _generate, search_space)
