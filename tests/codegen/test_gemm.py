"""The GEMM family without a GPU: problem normalization (layouts, batch broadcast and folding,
1-D operands), the heuristic and search space, and render + NVRTC compile of every template
variant for sm_80 and sm_90 (a handful of instantiations: CI compile time matters)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from graphc.codegen.families.gemm import (
    candidates,
    heuristic,
    path_of,
    problem_of,
    search_space,
    shared_bytes,
    standalone_context,
    valid,
)
from graphc.codegen.kernel import family_for
from graphc.errors import CompileError
from graphc.ir.types import DType
from graphc.ops.fused import ACC, IN, OP, EpilogueOp
from graphc.ops.registry import get_op

F16, BF16, F32, F64 = DType.float16, DType.bfloat16, DType.float32, DType.float64


def _nvrtc_ok() -> bool:
    try:
        from graphc.codegen.nvrtc import nvrtc_version

        nvrtc_version()
        return True
    except Exception:
        return False


needs_nvrtc = pytest.mark.skipif(not _nvrtc_ok(), reason="NVRTC (cuda-bindings) is not installed")


def bias_gelu_residual(n_anchor: int = 2) -> dict:
    """y = Gelu(acc + in[n_anchor]) + in[n_anchor + 1]"""
    add, gelu = get_op("Add").attrs(), get_op("Gelu").attrs()
    return {
        "n_anchor": n_anchor,
        "epilogue": (
            EpilogueOp("Add", add, (ACC, IN(n_anchor))),
            EpilogueOp("Gelu", gelu, (OP(0),)),
            EpilogueOp("Add", add, (OP(1), IN(n_anchor + 1))),
        ),
        "outputs": (OP(2),),
    }


def gen(op, shapes, dtype, domain="", attrs=None, **kw):
    a = get_op(op, domain).attrs(**(attrs or {}))
    ctx = standalone_context(op, shapes, dtype, domain=domain, attrs=a, **kw)
    return ctx, family_for(ctx).generate(ctx)


# ---- normalization -------------------------------------------------------------------------------


def test_layouts_follow_storage():
    ctx = standalone_context("MatMul", [(64, 32), (32, 48)], F16)
    p = problem_of(ctx)
    assert (p.M, p.N, p.K) == (64, 48, 32)
    assert p.a.kcontig and not p.b.kcontig  # activation [M, K], weight [K, N]
    ctx = standalone_context(
        "MatMul",
        [(32, 64), (48, 32)],
        F16,
        domain="graphc",
        attrs=get_op("MatMul", "graphc").attrs(trans_a=1, trans_b=1),
    )
    p = problem_of(ctx)
    assert (p.M, p.N, p.K) == (64, 48, 32)
    assert not p.a.kcontig and p.b.kcontig
    assert p.a.pitch == 64 and p.b.pitch == 32


def test_gemm_attrs_and_c():
    attrs = get_op("Gemm").attrs(transA=1, alpha=0.5, beta=2.0)
    p = problem_of(standalone_context("Gemm", [(32, 16), (32, 8), (8,)], F32, attrs=attrs))
    assert (p.M, p.N, p.K, p.alpha, p.beta, p.c_index) == (16, 8, 32, 0.5, 2.0, 2)
    # beta = 0: C is never read
    attrs = get_op("Gemm").attrs(beta=0.0)
    assert problem_of(standalone_context("Gemm", [(4, 3), (3, 5), (4, 5)], F32, attrs=attrs)).c_index is None


def test_batch_broadcast_and_fold():
    # B shared by every batch, A contiguous: the batch folds into M
    p = problem_of(standalone_context("MatMul", [(2, 3, 7, 16), (16, 24)], F16))
    assert (p.M, p.batch, p.folded_batch) == (42, 1, 6)
    # broadcast batch dims get stride 0; adjacent dims merge where memory allows
    p = problem_of(standalone_context("MatMul", [(3, 1, 33, 64), (5, 64, 40)], F16))
    assert p.batch == 15 and p.M == 33
    assert p.batch_dims == [(3, 33 * 64, 0), (5, 0, 64 * 40)]
    p = problem_of(standalone_context("MatMul", [(2, 3, 8, 4), (2, 3, 4, 8)], F32))
    assert p.batch_dims == [(6, 32, 32)]
    # A broadcast over B's batches: no fold
    p = problem_of(standalone_context("MatMul", [(33, 96), (4, 96, 72)], F16))
    assert p.batch_dims == [(4, 0, 96 * 72)] and p.M == 33


def test_one_d_operands():
    p = problem_of(standalone_context("MatMul", [(127,), (127, 40)], F16))
    assert (p.M, p.N, p.K) == (1, 40, 127) and p.out_shape == (40,)
    p = problem_of(standalone_context("MatMul", [(2, 40, 128), (128,)], F16))
    assert (p.M, p.N, p.K) == (80, 1, 128) and p.b.kcontig  # a [K, 1] column reads as K-contiguous
    p = problem_of(standalone_context("MatMul", [(1000,), (1000,)], F32))
    assert (p.M, p.N, p.K) == (1, 1, 1000) and p.out_shape == ()


def test_vector_path_needs_alignment():
    p = problem_of(standalone_context("MatMul", [(64, 40), (40, 48)], F16))
    assert p.a.vector_ok(p.K, 8) and p.b.vector_ok(p.K, 8)
    p = problem_of(standalone_context("MatMul", [(64, 33), (33, 48)], F16))
    assert not p.a.vector_ok(p.K, 8)  # rows of 33 halves: not 16-byte aligned
    assert p.b.vector_ok(p.K, 8)  # B [33, 48]: rows of 48 halves are
    p = problem_of(standalone_context("MatMul", [(64, 32), (32, 44)], F32))
    assert p.b.vector_ok(p.K, 4) and not p.b.vector_ok(p.K, 8)


def test_paths():
    assert path_of(problem_of(standalone_context("MatMul", [(8, 8), (8, 8)], F16)), False) == "mma"
    assert path_of(problem_of(standalone_context("MatMul", [(8, 8), (8, 8)], BF16)), False) == "mma"
    assert path_of(problem_of(standalone_context("MatMul", [(8, 8), (8, 8)], F32)), False) == "simt"
    assert path_of(problem_of(standalone_context("MatMul", [(8, 8), (8, 8)], F32)), True) == "tf32"
    assert path_of(problem_of(standalone_context("MatMul", [(8, 8), (8, 8)], F64)), True) == "simt"


def test_unsupported_dtype_fails_clearly():
    ctx = standalone_context("MatMul", [(8, 8), (8, 8)], DType.int32)
    with pytest.raises(CompileError, match="int32"):
        family_for(ctx).generate(ctx)


# ---- heuristic and search space ------------------------------------------------------------------


@pytest.mark.parametrize(
    "mnk,dtype,tf32",
    [
        ((4096, 4096, 4096), F16, False),
        ((128, 768, 768), F16, False),
        ((64, 64, 8192), BF16, False),
        ((1, 4096, 4096), F16, False),
        ((1000, 1000, 1000), F32, False),
        ((1000, 1000, 1000), F32, True),
        ((7, 33, 127), F64, False),
    ],
)
def test_heuristic_is_valid_and_in_space(mnk, dtype, tf32):
    m, n, k = mnk
    ctx = standalone_context("MatMul", [(m, k), (k, n)], dtype, allow_tf32=tf32)
    prob = problem_of(ctx)
    path = path_of(prob, tf32)
    p = heuristic(prob, path)
    assert valid(prob, p)
    space = search_space(ctx)
    assert space and all(valid(prob, q) for q in space)
    assert {k: v for k, v in p.items() if not k.startswith("_")} in space
    assert shared_bytes(prob, p) <= 227 * 1024


def test_heuristic_fills_the_machine():
    # a big square GEMM takes big tiles; a small M*N with a long K splits K
    prob = problem_of(standalone_context("MatMul", [(4096, 4096), (4096, 4096)], F16))
    p = heuristic(prob, "mma")
    assert p["BM"] * p["BN"] >= 128 * 128 and p["SPLITS"] == 1
    prob = problem_of(standalone_context("MatMul", [(64, 8192), (8192, 64)], F16))
    p = heuristic(prob, "mma")
    assert p["SPLITS"] > 1


def test_fp64_never_splits():
    prob = problem_of(standalone_context("MatMul", [(16, 8192), (8192, 16)], F64))
    assert all(p["SPLITS"] == 1 for p in candidates(prob, "simt"))


def test_forced_params_are_checked():
    ctx = standalone_context(
        "MatMul", [(64, 64), (64, 64)], F16, params={"BM": 48, "BN": 64, "BK": 32, "WM": 2, "WN": 2, "STAGES": 3}
    )
    with pytest.raises(CompileError, match="not valid"):
        family_for(ctx).generate(ctx)


# ---- kernels: launch geometry, arguments, the store hook ----------------------------------------


def test_kernel_args_and_geometry():
    ctx, ks = gen(
        "MatMul",
        [(100, 256), (256, 72), (72,), (100, 72)],
        F16,
        **bias_gelu_residual(),
        params={"BM": 64, "BN": 64, "BK": 32, "WM": 2, "WN": 2, "STAGES": 3},
    )
    (k,) = ks
    assert k.args == ["x0", "x1", "x2", "x3", "y0"]
    assert k.grid == (2 * 2, 1, 1) and k.block == (128, 1, 1)
    assert k.workspace_bytes == 0 and k.shared_bytes >= 3 * (64 * 40 + 32 * 72) * 2
    # the epilogue is rendered into the store hook and called from the store path
    assert "gc_gelu(" in k.source
    store = k.source[k.source.index('extern "C" __global__') :]
    assert f"{k.name}_out(v, " in store and f"{k.name}_epi(v, idx" in k.source


def test_split_k_sums_and_runs_the_epilogue_in_the_same_launch():
    # serial split-K (the default): one kernel; the last block of each tile sums the 5 partials in
    # split order and runs the store hook, so the epilogue still sees each element once
    _, ks = gen(
        "Gemm",
        [(50, 3000), (3000, 70), (50, 70), (70,), (50, 70)],
        F16,
        attrs={"alpha": 2.0, "beta": -1.0},
        **bias_gelu_residual(3),
        params={"BM": 64, "BN": 64, "BK": 32, "WM": 2, "WN": 2, "STAGES": 3, "SPLITS": 5},
    )
    (main,) = ks
    assert main.params["SERIAL"] == 1 and main.grid == (2, 1, 5)
    assert main.args == ["x0", "x1", "x2", "x3", "x4", "y0", "@workspace"]
    assert main.workspace_bytes == 5 * 50 * 70 * 4
    body = main.source[main.source.index('extern "C" __global__') :]
    assert "ws[" in body and "atomicAdd(&" in body and "__ldcg(ws + p * 3500ll + o)" in body
    assert f"{main.name}_out(s, " in body  # the store hook after the sum, once per element
    # one arrival counter per (batch, tile), a module global the last block resets
    assert f"__device__ unsigned int {main.name}_arrived[2];" in main.source
    assert "v = v * 2.0f" in main.source and "-1.0f * gc_h2f(Cm[" in main.source


def test_split_k_runs_the_epilogue_once_in_the_reduce_kernel():
    ctx, ks = gen(
        "Gemm",
        [(50, 3000), (3000, 70), (50, 70), (70,), (50, 70)],
        F16,
        attrs={"alpha": 2.0, "beta": -1.0},
        **bias_gelu_residual(3),
        params={"BM": 64, "BN": 64, "BK": 32, "WM": 2, "WN": 2, "STAGES": 3, "SPLITS": 5, "SERIAL": 0},
    )
    main, red = ks
    assert main.args == ["x0", "x1", "@workspace"] and main.grid[2] == 5
    assert main.workspace_bytes == red.workspace_bytes == 5 * 50 * 70 * 4
    assert red.args == ["x2", "x3", "x4", "y0", "@workspace"]
    main_body = main.source[main.source.index('extern "C" __global__') :]
    assert "_out(" not in main_body and "ws[" in main_body  # partials only
    red_body = red.source[red.source.index('extern "C" __global__') :]
    assert f"{red.name}_out(s, idx" in red_body
    assert "v = v * 2.0f" in red.source and "-1.0f * gc_h2f(Cm[" in red.source


def test_batch_offsets_are_baked():
    _, (k,) = gen("MatMul", [(3, 1, 33, 64), (5, 64, 40)], F16)
    assert "% 5ll" in k.source and "c * 2112ll" in k.source and "c * 2560ll" in k.source
    assert k.grid[2] == 15


def test_empty_output_launches_nothing():
    _, ks = gen("MatMul", [(0, 8), (8, 4)], F32)
    assert ks == []


# ---- NVRTC: every template variant compiles for sm_80 and sm_90 ---------------------------------

VARIANTS = {
    # fp16 tensor cores, vector (cp.async) path, A [M,K] x B [K,N], fused bias + Gelu + residual
    "fp16-mma-epi": dict(
        op="MatMul",
        shapes=[(100, 256), (256, 72), (72,), (100, 72)],
        dtype=F16,
        kw=dict(bias_gelu_residual(), params={"BM": 128, "BN": 128, "BK": 32, "WM": 2, "WN": 2, "STAGES": 4}),
    ),
    # bf16, both operands transposed (ldmatrix.trans on A, non-trans on B), odd K: safe loads, split-K
    "bf16-mma-trans-split": dict(
        op="Gemm",
        shapes=[(1001, 36), (72, 1001), (72,)],
        dtype=BF16,
        attrs={"transA": 1, "transB": 1, "alpha": 0.5},
        kw=dict(params={"BM": 64, "BN": 64, "BK": 64, "WM": 2, "WN": 2, "STAGES": 2, "SPLITS": 4}),
    ),
    # the same with the two-kernel split-K (partials, then the gemm_reduce kernel)
    "bf16-mma-trans-split-reduce": dict(
        op="Gemm",
        shapes=[(1001, 36), (72, 1001), (72,)],
        dtype=BF16,
        attrs={"transA": 1, "transB": 1, "alpha": 0.5},
        kw=dict(params={"BM": 64, "BN": 64, "BK": 64, "WM": 2, "WN": 2, "STAGES": 2, "SPLITS": 4, "SERIAL": 0}),
    ),
    # fp32 SIMT with serial split-K and the epilogue
    "fp32-simt-split": dict(
        op="MatMul",
        shapes=[(40, 2048), (2048, 72), (72,), (40, 72)],
        dtype=F32,
        kw=dict(
            bias_gelu_residual(), params={"path": "simt", "BM": 32, "BN": 32, "BK": 8, "TM": 4, "TN": 4, "SPLITS": 4}
        ),
    ),
    # TF32 tensor cores, batched attention-like Q @ K^T
    "tf32-batched": dict(
        op="MatMul",
        shapes=[(2, 12, 128, 64), (2, 12, 128, 64)],
        dtype=F32,
        domain="graphc",
        attrs={"trans_b": 1, "alpha": 0.125},
        kw=dict(allow_tf32=True),
    ),
    # SIMT fp32 with the epilogue
    "fp32-simt-epi": dict(
        op="MatMul", shapes=[(300, 136), (136, 264), (264,), (300, 264)], dtype=F32, kw=bias_gelu_residual()
    ),
    # fp64 SIMT, broadcast batch
    "fp64-simt-bcast": dict(op="MatMul", shapes=[(3, 1, 33, 64), (5, 64, 40)], dtype=F64, kw={}),
}


@needs_nvrtc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_compiles(variant, arch, tmp_path):
    from graphc.codegen.nvrtc import compile_cubin

    v = VARIANTS[variant]
    _, ks = gen(v["op"], v["shapes"], v["dtype"], domain=v.get("domain", ""), attrs=v.get("attrs"), **v["kw"])
    for k in ks:
        cubin = compile_cubin(k.source, k.name, arch)
        assert len(cubin) > 1000
        if k.params.get("path") in ("mma", "tf32"):
            assert re.search(r"mma\.sync\.aligned\.m16n8k(16|8)", k.source)
            assert "cp.async" in k.source or not (k.params["VEC_A"] or k.params["VEC_B"])


def test_variants_cover_the_template():
    """The compiled variants above cover each kernel kind and operand path."""
    seen = set()
    for v in VARIANTS.values():
        _, ks = gen(v["op"], v["shapes"], v["dtype"], domain=v.get("domain", ""), attrs=v.get("attrs"), **v["kw"])
        for k in ks:
            if k.params.get("reduce"):
                seen.add("reduce")
                continue
            seen.add(k.params["path"])
            if k.params["path"] != "simt":
                seen.add(f"a-{k.params['a']}-vec{k.params['VEC_A']}")
                seen.add(f"b-{k.params['b']}-vec{k.params['VEC_B']}")
    assert {"mma", "tf32", "simt", "reduce"} <= seen
    assert {"a-k-vec1", "a-mn-vec0", "b-k-vec0", "b-k-vec1", "b-mn-vec1"} <= seen, seen


def test_numpy_reference_shapes_match_generation():
    # the output spec inferred for the step has the element count the kernels write
    ctx, ks = gen("MatMul", [(2, 7, 96), (96, 72)], F32)
    assert int(np.prod(ctx.tensors["y0"].shape)) == 2 * 7 * 72


@needs_nvrtc
def test_wgmma_variant_compiles_for_sm90a_only():
    from graphc.codegen.nvrtc import compile_cubin

    _, ks = gen(
        "MatMul",
        [(200, 520), (520, 136), (136,), (200, 136)],
        F16,
        **bias_gelu_residual(),
        params={"path": "wgmma", "BM": 128, "BN": 128, "BK": 64, "STAGES": 4},
    )
    (k,) = ks
    assert k.params["requires_arch"] == "sm_90a" and k.block == (256, 1, 1)
    assert "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16" in k.source
    assert f"{k.name}_out(v, " in k.source[k.source.index('extern "C" __global__') :]
    assert len(compile_cubin(k.source, k.name, "sm_90a")) > 1000
    with pytest.raises(CompileError, match="compile it for sm_90a"):
        compile_cubin(k.source, k.name, "sm_80")


def test_wgmma_needs_aligned_operands():
    prob = problem_of(standalone_context("MatMul", [(64, 33), (33, 64)], F16))
    assert not valid(prob, {"path": "wgmma", "BM": 128, "BN": 128, "BK": 64, "STAGES": 4})
    assert not candidates(prob, "wgmma")


def test_k_zero_still_writes_the_output():
    _, ks = gen("Gemm", [(5, 0), (0, 7), (7,)], F32)
    (k,) = ks
    assert k.grid[2] == 1 and k.workspace_bytes == 0 and "Cm[" in k.source


def test_too_many_batches_fail_clearly():
    ctx = standalone_context("MatMul", [(70000, 2, 8), (70000, 8, 2)], F32)
    with pytest.raises(CompileError, match="batch of 70000"):
        family_for(ctx).generate(ctx)


def test_partial_params_complete_from_the_heuristic():
    _, (k,) = gen("MatMul", [(4096, 1024), (1024, 4096)], F16, params={"path": "wgmma"})
    assert k.params["path"] == "wgmma" and k.params["BM"] in (64, 128) and k.params["requires_arch"] == "sm_90a"
    _, ks = gen("MatMul", [(64, 8192), (8192, 64)], F16, params={"SPLITS": 1})
    assert ks[0].params["SPLITS"] == 1 and len(ks) == 1
    ctx = standalone_context("MatMul", [(64, 33), (33, 64)], F16, params={"path": "wgmma"})
    with pytest.raises(CompileError, match="not valid"):  # rows of 33 halves: no wgmma variant
        family_for(ctx).generate(ctx)
    ctx = standalone_context("MatMul", [(8, 8), (8, 8)], F32, params={"path": "mma"})
    with pytest.raises(CompileError, match="does not fit"):
        family_for(ctx).generate(ctx)


@needs_nvrtc
def test_wgmma_serial_split_k_compiles_for_sm90a():
    from graphc.codegen.nvrtc import compile_cubin

    _, ks = gen(
        "MatMul",
        [(256, 4096), (4096, 256), (256,), (256, 256)],
        F16,
        **bias_gelu_residual(),
        params={"path": "wgmma", "BM": 128, "BN": 128, "BK": 64, "STAGES": 4, "SPLITS": 4},
    )
    (k,) = ks  # no reduce kernel
    assert k.params["SERIAL"] == 1 and k.params["requires_arch"] == "sm_90a"
    assert len(compile_cubin(k.source, k.name, "sm_90a")) > 1000
