"""The attention family without a GPU: problem normalization (3-D and 4-D layouts, grouped-query
heads, mask broadcast strides, the effective scale), what is rejected, the heuristic and search
space, and render + NVRTC compile of each template variant for sm_80 and sm_90 (a handful of
instantiations: CI compile time matters). RotaryEmbedding too."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from graphc.codegen.families.attention import (
    candidates,
    effective_scale,
    heuristic,
    path_of,
    problem_of,
    search_space,
    shared_bytes,
    standalone_context,
    valid,
)
from graphc.codegen.kernel import family_for
from graphc.errors import CompileError, ShapeError
from graphc.ir.types import DType
from graphc.ops.registry import get_op

F16, BF16, F32, F64, BOOL = DType.float16, DType.bfloat16, DType.float32, DType.float64, DType.bool


def _nvrtc_ok() -> bool:
    try:
        from graphc.codegen.nvrtc import nvrtc_version

        nvrtc_version()
        return True
    except Exception:
        return False


needs_nvrtc = pytest.mark.skipif(not _nvrtc_ok(), reason="NVRTC (cuda-bindings) is not installed")


def attn3(b, sq, sk, qh, kvh, d, dt, *, dv=None, mask=None, extra=(), params=None, **attrs):
    """A 3-D Attention step: Q (b, sq, qh*d), K (b, sk, kvh*d), V (b, sk, kvh*dv)."""
    dv = dv or d
    ins = [((b, sq, qh * d), dt), ((b, sk, kvh * d), dt), ((b, sk, kvh * dv), dt)]
    if mask is not None or extra:
        ins.append(mask)
    ins += list(extra)
    a = get_op("Attention").attrs(q_num_heads=qh, kv_num_heads=kvh, **attrs)
    return standalone_context("Attention", ins, a, params=params)


def attn4(b, sq, sk, qh, kvh, d, dt, *, dv=None, mask=None, params=None, **attrs):
    dv = dv or d
    ins = [((b, qh, sq, d), dt), ((b, kvh, sk, d), dt), ((b, kvh, sk, dv), dt)]
    if mask is not None:
        ins.append(mask)
    return standalone_context("Attention", ins, get_op("Attention").attrs(**attrs), params=params)


def rope(shape, dt, *, pos=False, **attrs):
    a = get_op("RotaryEmbedding").attrs(**attrs)
    head = shape[3] if len(shape) == 4 else shape[2] // a.num_heads
    half = (a.rotary_embedding_dim or head) // 2
    if pos:
        ins = [
            (shape, dt),
            ((64, half), dt),
            ((64, half), dt),
            ((shape[0], shape[-2 if len(shape) == 4 else 1]), DType.int64),
        ]
    else:
        seq = shape[2] if len(shape) == 4 else shape[1]
        ins = [(shape, dt), ((shape[0], seq, half), dt), ((shape[0], seq, half), dt)]
    return standalone_context("RotaryEmbedding", ins, a)


def gen(ctx):
    return family_for(ctx).generate(ctx)


# ---- normalization -------------------------------------------------------------------------------


def test_3d_layout_and_gqa():
    p = problem_of(attn3(2, 7, 9, 12, 4, 64, F16))
    assert (p.batch, p.q_heads, p.kv_heads, p.sq, p.sk, p.d, p.dv, p.group) == (2, 12, 4, 7, 9, 64, 64, 3)
    # (batch, seq, heads * dim): head h at h * d, rows heads * d apart
    assert (p.q.sb, p.q.sh, p.q.sr) == (7 * 768, 64, 768)
    assert (p.k.sb, p.k.sh, p.k.sr) == (9 * 256, 64, 256)
    assert (p.o.sb, p.o.sh, p.o.sr) == (7 * 768, 64, 768)


def test_4d_layout_and_v_head_dim():
    p = problem_of(attn4(3, 5, 11, 4, 2, 64, F32, dv=32))
    assert (p.q.sb, p.q.sh, p.q.sr) == (4 * 5 * 64, 5 * 64, 64)
    assert (p.v.sb, p.v.sh, p.v.sr) == (2 * 11 * 32, 11 * 32, 32)
    assert (p.o.sb, p.o.sh, p.o.sr) == (4 * 5 * 32, 5 * 32, 32)


@pytest.mark.parametrize(
    "shape,strides,length",
    [
        ((2, 1, 1, 9), (9, 0, 0), 9),  # padding mask per batch, broadcast over heads and rows
        ((1, 1, 7, 9), (0, 0, 9), 9),  # one pattern for every batch and head
        ((7, 9), (0, 0, 9), 9),  # rank 2
        ((2, 12, 7, 9), (12 * 63, 63, 9), 9),  # full
        ((2, 1, 1, 5), (5, 0, 0), 5),  # a short key axis: keys 5.. are masked
        ((9,), (0, 0, 0), 9),
    ],
)
def test_mask_broadcast_strides(shape, strides, length):
    p = problem_of(attn3(2, 7, 9, 12, 4, 64, F16, mask=(shape, BOOL)))
    assert (p.mask.sb, p.mask.sh, p.mask.sr) == strides
    assert p.mask.length == length and p.kv_limit == min(9, length)
    assert p.mask.boolean
    p = problem_of(attn3(2, 7, 9, 12, 4, 64, F16, mask=(shape, F16)))
    assert not p.mask.boolean


def test_effective_scale_rounds_sqrt_to_t1():
    # the reference multiplies Q and K by sqrt(scale) rounded to T1
    s16 = float(np.float16(math.sqrt(0.3)))
    assert effective_scale(0.3, 64, F16) == pytest.approx(s16 * s16, rel=1e-12)
    assert effective_scale(None, 64, F32) == pytest.approx(0.125, rel=1e-7)
    assert effective_scale(None, 80, F64) == pytest.approx(1 / math.sqrt(80), rel=1e-15)
    p = problem_of(attn3(1, 3, 3, 1, 1, 64, BF16, scale=0.125))
    assert p.scale == effective_scale(0.125, 64, BF16)


def test_band():
    p = problem_of(attn3(1, 9, 9, 1, 1, 64, F16, is_causal=1))
    assert (p.band_hi, p.band_lo) == (0, None)
    p = problem_of(attn3(1, 9, 9, 1, 1, 64, F16, is_causal=1, right_window_size=3, left_window_size=4))
    assert (p.band_hi, p.band_lo) == (0, 4)
    p = problem_of(attn3(1, 9, 9, 1, 1, 64, F16, right_window_size=3))
    assert (p.band_hi, p.band_lo) == (3, None)


def test_paths():
    assert path_of(problem_of(attn3(1, 8, 8, 2, 2, 64, F16))) == "flash"
    assert path_of(problem_of(attn3(1, 8, 8, 2, 2, 128, BF16))) == "flash"
    assert path_of(problem_of(attn3(1, 8, 8, 2, 2, 80, F16))) == "flash"
    assert path_of(problem_of(attn3(1, 8, 8, 2, 2, 64, F32))) == "simple"
    assert path_of(problem_of(attn3(1, 8, 8, 2, 2, 72, F16))) == "simple"  # not a multiple of 16
    assert path_of(problem_of(attn3(1, 8, 8, 2, 2, 256, F16))) == "simple"
    assert path_of(problem_of(attn4(1, 8, 8, 2, 2, 64, F16, dv=32))) == "simple"


# ---- what is rejected ----------------------------------------------------------------------------


def test_kv_cache_is_rejected_naming_the_node():
    past = ((1, 2, 4, 64), F16)
    ctx = attn3(1, 3, 3, 2, 2, 64, F16, extra=[past, past])
    with pytest.raises(CompileError, match=r"Attention node 'n0'.*past_key"):
        gen(ctx)


def test_extra_outputs_are_rejected():
    ctx = attn3(1, 3, 3, 2, 2, 64, F16)
    ctx.step.outputs.append("present_key")
    with pytest.raises(CompileError, match=r"Attention node 'n0'.*only output Y"):
        gen(ctx)


def test_forced_params_are_checked():
    ctx = attn3(1, 8, 8, 2, 2, 64, F32, params={"path": "flash", "BM": 64, "BN": 64, "WARPS": 4})
    with pytest.raises(CompileError, match="flash"):
        gen(ctx)
    ctx = attn3(1, 8, 8, 2, 2, 64, F16, params={"path": "flash", "BM": 48, "BN": 64, "WARPS": 4})
    with pytest.raises(CompileError, match="not valid"):
        gen(ctx)


def test_empty_output_launches_nothing():
    assert gen(attn3(1, 0, 8, 2, 2, 64, F16)) == []


# ---- heuristic and search space ------------------------------------------------------------------


@pytest.mark.parametrize(
    "b,sq,sk,h,d,dt",
    [
        (8, 128, 128, 12, 64, F16),  # BERT-base
        (8, 512, 512, 12, 64, F16),
        (1, 1024, 1024, 12, 64, BF16),  # GPT-2
        (4, 2048, 2048, 32, 128, BF16),
        (1, 1, 500, 8, 128, F16),  # decode-like
        (2, 30, 30, 4, 80, F16),
        (2, 77, 77, 12, 64, F32),
        (1, 7, 7, 1, 72, F16),
    ],
)
def test_heuristic_is_valid_and_in_space(b, sq, sk, h, d, dt):
    ctx = attn3(b, sq, sk, h, h, d, dt)
    prob = problem_of(ctx)
    p = heuristic(prob)
    assert valid(prob, p) and p in search_space(ctx)
    assert all(valid(prob, q) for q in candidates(prob))
    assert shared_bytes(prob, p) <= 227 * 1024
    if p["path"] == "flash" and sq <= 16:
        assert p["BM"] == 16  # a short query sequence takes the smallest tile


def test_kernel_geometry_and_args():
    ctx = attn3(
        2,
        77,
        90,
        12,
        4,
        64,
        F16,
        mask=((2, 1, 1, 90), BOOL),
        is_causal=1,
        params={"path": "flash", "BM": 64, "BN": 64, "WARPS": 4},
    )
    (k,) = gen(ctx)
    assert k.args == ["x0", "x1", "x2", "x3", "y0"]
    assert k.grid == (2, 12, 2) and k.block == (128, 1, 1)
    assert k.shared_bytes == (64 * 72 + 4 * 64 * 72) * 2
    assert "hk = h / 3" in k.source  # grouped-query: 3 query heads a kv head
    assert "gridDim.x - 1 - blockIdx.x" in k.source  # causal: longest rows first
    ctx = attn3(2, 77, 90, 12, 4, 64, F32, mask=((2, 1, 1, 90), F32), extra=[None, None, ((2,), DType.int64)])
    (k,) = gen(ctx)
    assert k.args == ["x0", "x1", "x2", "x3", "x6", "y0"]
    assert k.params["path"] == "simple" and k.grid == (ceil(77, 8), 12, 2) and k.block == (256, 1, 1)


def ceil(a, b):
    return -(-a // b)


# ---- NVRTC: every template variant compiles for sm_80 and sm_90 ---------------------------------

VARIANTS = {
    # fp16 flash, 3-D GQA, bool keep mask (batch, 1, seq_q, seq_k), causal: log2 units, one slab a warp
    "fp16-flash-gqa-bool-causal": lambda: attn3(
        2,
        77,
        77,
        12,
        4,
        64,
        F16,
        mask=((2, 1, 77, 77), BOOL),
        is_causal=1,
        params={"path": "flash", "BM": 64, "BN": 64, "WARPS": 4},
    ),
    # bf16 flash, 4-D, head dim 128, additive bf16 mask (1, 1, q, k) and softcap: natural units
    "bf16-flash-d128-add-softcap": lambda: attn4(
        2,
        100,
        130,
        4,
        4,
        128,
        BF16,
        mask=((1, 1, 100, 130), BF16),
        softcap=30.0,
        params={"path": "flash", "BM": 128, "BN": 64, "WARPS": 8},
    ),
    # fp16 flash, two 16-row slabs a warp, no mask, windows
    "fp16-flash-mi2-window": lambda: attn3(
        8,
        512,
        512,
        12,
        12,
        64,
        F16,
        left_window_size=100,
        right_window_size=3,
        params={"path": "flash", "BM": 128, "BN": 64, "WARPS": 4},
    ),
    # fp32 simple: additive mask (q, k), causal, nonpad_kv_seqlen, grouped-query
    "fp32-simple-add-nonpad": lambda: attn3(
        3,
        33,
        65,
        6,
        2,
        40,
        F32,
        mask=((33, 65), F32),
        extra=[None, None, ((3,), DType.int64)],
        is_causal=1,
    ),
    # fp16 simple (head dim 72) with a bool mask; fp64 simple
    "fp16-simple-d72-bool": lambda: attn4(2, 50, 70, 2, 1, 72, F16, mask=((2, 1, 1, 70), BOOL)),
    "fp64-simple": lambda: attn4(1, 9, 9, 2, 2, 16, F64, is_causal=1),
    # masked_rows "mean" (rows with no kept key store the mean of V): fp16 flash GQA causal with a
    # bool mask, bf16 flash with more threads than DV; fp32 simple GQA with nonpad, fp64 simple
    # with DV > threads
    "fp16-flash-gqa-bool-causal-mean": lambda: attn3(
        2,
        77,
        77,
        12,
        4,
        64,
        F16,
        mask=((2, 1, 77, 77), BOOL),
        is_causal=1,
        masked_rows="mean",
        params={"path": "flash", "BM": 64, "BN": 64, "WARPS": 4},
    ),
    "bf16-flash-d32-mean": lambda: attn4(
        2,
        40,
        50,
        2,
        2,
        32,
        BF16,
        mask=((2, 1, 1, 50), BOOL),
        masked_rows="mean",
        params={"path": "flash", "BM": 128, "BN": 64, "WARPS": 8},
    ),
    "fp32-simple-nonpad-mean": lambda: attn3(
        3, 33, 65, 6, 2, 40, F32, extra=[None, None, ((3,), DType.int64)], is_causal=1, masked_rows="mean"
    ),
    "fp64-simple-dv96-mean": lambda: attn4(
        1, 9, 9, 2, 2, 16, F64, dv=96, is_causal=1, masked_rows="mean", params={"path": "simple", "WARPS": 2}
    ),
    # masked_rows "nan" (a row with no kept key stores NaN): flash, simple fp64
    "fp16-flash-bool-nan": lambda: attn3(
        2,
        77,
        77,
        4,
        4,
        64,
        F16,
        mask=((2, 1, 1, 77), BOOL),
        masked_rows="nan",
        params={"path": "flash", "BM": 64, "BN": 64, "WARPS": 4},
    ),
    "fp64-simple-nan": lambda: attn4(
        1, 9, 9, 2, 2, 16, F64, is_causal=1, masked_rows="nan", params={"path": "simple", "WARPS": 2}
    ),
    # RotaryEmbedding: 3-D interleaved with position ids; 4-D half-split, partial
    "rope-fp16-3d-pos-interleaved": lambda: rope((2, 7, 192), F16, pos=True, num_heads=3, interleaved=1),
    "rope-bf16-4d-partial": lambda: rope((3, 2, 5, 80), BF16, rotary_embedding_dim=32),
}


@needs_nvrtc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_compiles(variant, arch):
    from graphc.codegen.nvrtc import compile_cubin

    (k,) = gen(VARIANTS[variant]())
    cubin = compile_cubin(k.source, k.name, arch)
    assert len(cubin) > 1000
    if k.params.get("path") == "flash":
        assert re.search(r"mma\.sync\.aligned\.m16n8k16\.row\.col\.f32\.(f16|bf16)", k.source)
        assert "cp.async" in k.source and "ldmatrix" in k.source
    # no system headers: the kernels are self-contained
    assert "#include" not in k.source


def test_variants_cover_the_template():
    seen = set()
    for make in VARIANTS.values():
        (k,) = gen(make())
        src = k.source
        path = k.params.get("path", "rotary")
        seen.add(path)
        if path == "flash":
            seen.add("log2" if "fmaf(s[mi][j][e]" in src else "natural")
            seen.add(f"mi{k.params['BM'] // (16 * k.params['WARPS'])}")
        if "Mb[mi_]" in src:
            seen.add(f"{path}-mask-{'bool' if '!(' in src.split('Mb[mi_]')[0][-40:] else 'add'}")
        if "NP[b]" in src:
            seen.add(f"{path}-nonpad")
        if "__syncthreads_or" in src:
            seen.add(f"{path}-mean")
    assert {"flash", "simple", "rotary", "log2", "natural", "mi1", "mi2"} <= seen, seen
    assert {"flash-mean", "simple-mean"} <= seen, seen
    assert {"flash-mask-bool", "flash-mask-add", "simple-mask-add", "simple-mask-bool", "simple-nonpad"} <= seen, seen


@pytest.mark.parametrize(
    "make",
    [
        lambda **a: attn3(2, 77, 77, 12, 4, 64, F16, mask=((2, 1, 77, 77), BOOL), is_causal=1, **a),
        lambda **a: attn4(1, 9, 9, 2, 2, 16, F64, is_causal=1, **a),
    ],
    ids=["flash", "simple"],
)
def test_masked_rows_mean_is_a_cold_path_of_its_own(make):
    # "zero" (the default) is the kernel as it was: the same source, the same cubin; "mean" adds
    # the mean of V (summed over all keys from global memory) behind one block-wide test.
    (zero,) = gen(make())
    (explicit,) = gen(make(masked_rows="zero"))
    (mean,) = gen(make(masked_rows="mean"))
    assert explicit.source == zero.source
    assert "__syncthreads_or" not in zero.source and "vmean" not in zero.source
    assert mean.source.count("__syncthreads_or") == 1 and mean.source != zero.source
    assert "r < 9;" in mean.source or "r < 77;" in mean.source  # every key of the (batch, kv head)
    assert mean.shared_bytes == zero.shared_bytes and mean.grid == zero.grid


@pytest.mark.parametrize(
    "make",
    [
        lambda **a: attn3(2, 77, 77, 12, 4, 64, F16, mask=((2, 1, 77, 77), BOOL), is_causal=1, **a),
        lambda **a: attn4(1, 9, 9, 2, 2, 16, F64, is_causal=1, **a),
        lambda **a: attn4(1, 9, 9, 2, 2, 16, F32, mask=((1, 1, 9, 9), F32), **a),
    ],
    ids=["flash", "simple-fp64", "simple-fp32"],
)
def test_masked_rows_nan_is_the_zero_kernel_with_a_nan_for_1_over_l(make):
    # "nan": the row with no key (l = 0, its accumulators 0) is O * (1 / l) with 1 / l a quiet
    # NaN instead of 0; nothing else of the kernel changes.
    (zero,) = gen(make())
    (nan,) = gen(make(masked_rows="nan"))
    nan_lit = (
        "__longlong_as_double(0x7ff8000000000000ll)" if "(ct)(0.0)" in zero.source else "__int_as_float(0x7fc00000)"
    )
    assert nan.source.count(nan_lit) == zero.source.count(nan_lit) + 1  # (common.cuh has NaN literals too)
    assert "__syncthreads_or" not in nan.source
    dead = re.compile(r"(1 / row_l : \(ct\)\(|1\.f / l : )(0\.f|0\.0)")
    assert len(dead.findall(zero.source)) == 1
    dead_nan = re.compile(r"(1 / row_l : \(ct\)\(|1\.f / l : )" + re.escape(nan_lit))
    assert dead_nan.sub(r"\1DEAD", nan.source) == dead.sub(r"\1DEAD", zero.source)
    assert nan.shared_bytes == zero.shared_bytes and nan.grid == zero.grid


def test_masked_rows_other_values_are_rejected():
    with pytest.raises(ShapeError, match="masked_rows"):
        gen(attn4(1, 9, 9, 2, 2, 16, F32, masked_rows="one"))


def test_rotary_kernel():
    (k,) = gen(rope((2, 7, 192), F16, pos=True, num_heads=3, interleaved=1))
    assert k.args == ["x0", "x1", "x2", "x3", "y0"] and k.family == "rotary"
    assert "pos >= 64ll" in k.source  # position ids outside the cache give NaN, never a stray read
    (k,) = gen(rope((3, 2, 5, 80), BF16, rotary_embedding_dim=32))
    assert k.args == ["x0", "x1", "x2", "y0"]
    assert "ROT = 32" in k.source and "HD = 80" in k.source


# ---- the whole compiler: an ONNX model to a cuda engine -------------------------------------------


@needs_nvrtc
def test_graphc_compile_builds_attention_and_rotary(tmp_path):
    import graphc
    from helpers import make_node_model

    q = np.zeros((2, 9, 4 * 64), np.float16)
    kv = np.zeros((2, 9, 2 * 64), np.float16)
    m = make_node_model(
        "Attention", {"q": q, "k": kv, "v": kv}, {"q_num_heads": 4, "kv_num_heads": 2, "is_causal": 1}, opset=23
    )
    engine = graphc.compile(m, target="cuda", arch=["sm_90"], cache_dir=tmp_path)
    assert engine.report["cuda"]["families"] == {"attention": 1}
    x = np.zeros((1, 3, 4, 32), np.float32)
    cs = np.zeros((1, 4, 16), np.float32)
    m = make_node_model("RotaryEmbedding", {"x": x, "c": cs, "s": cs}, opset=23)
    engine = graphc.compile(m, target="cuda", arch=["sm_90"], cache_dir=tmp_path)
    assert engine.report["cuda"]["families"] == {"rotary": 1}
