"""The Hopper TMA GEMM without a GPU: its tensor-map specs and their validation (in the runtime and in
the engine loader), the parameters it accepts, and the selection rules measured on an H200."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from graphc.codegen.epilogue import step_operands
from graphc.codegen.families import gemm_sm90
from graphc.codegen.families.gemm import problem_of, standalone_context
from graphc.errors import CompileError
from graphc.ir.types import DType
from graphc.ops.fused import ACC, IN, OP, EpilogueOp
from graphc.ops.registry import get_op
from graphc.runtime.errors import EngineError
from graphc.runtime.tensormap import spec_from_json, validate_launch


def _ctx(m: int, n: int, k: int, dtype: DType = DType.float16, b_layout: str = "mn"):
    if b_layout == "k":
        attrs = get_op("MatMul", "graphc").attrs(trans_b=1)
        return standalone_context("MatMul", [(m, k), (n, k)], dtype, domain="graphc", attrs=attrs)
    return standalone_context("MatMul", [(m, k), (k, n)], dtype)


GOOD = {"tensor": "x0", "dtype": "float16", "dims": [768, 4096, 1], "strides": [1536, 6291456], "box": [64, 128, 1]}


def test_specs_of_a_launch():
    ctx = _ctx(4096, 768, 768)
    (k,) = gemm_sm90.generate(ctx)
    assert k.args == ["@tmap:0", "@tmap:1", "y0"] and k.block == (384, 1, 1)
    specs = validate_launch(k.params, k.args, ctx.tensors, "t")
    a, b = specs
    assert (a.tensor, a.dims, a.strides, a.box) == ("x0", (768, 4096, 1), (1536, 6291456), (64, 128, 1))
    # B stored [K, N] (N contiguous): 64-column boxes over 64 K rows
    assert (b.tensor, b.dims, b.box) == ("x1", (768, 768, 1), (64, 64, 1))
    assert a.footprint() == ctx.tensors["x0"].nbytes and b.footprint() == ctx.tensors["x1"].nbytes
    assert k.grid[0] == min(gemm_sm90.units(problem_of(ctx), k.params["BN"], 1), gemm_sm90.SM_COUNT)
    assert k.shared_bytes <= 227 * 1024


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"dtype": "int8"}, "dtype"),
        ({"swizzle": "256B"}, "swizzle"),
        ({"strides": [1540, 6291456]}, "multiples of 16"),
        ({"box": [64, 512, 1]}, "box"),
        ({"box": [128, 128, 1]}, "at most 128 bytes"),
        ({"dims": [768, 4096]}, "rank"),
        ({"dims": [768, 4096, True]}, "integers"),
    ],
)
def test_bad_specs_are_refused(change, message):
    with pytest.raises(EngineError, match=message):
        spec_from_json({**GOOD, "swizzle": "128B", **change}, "step 's'")


def test_launch_validation_checks_tensors_and_indices():
    ctx = _ctx(4096, 768, 768)
    (k,) = gemm_sm90.generate(ctx)
    big = copy.deepcopy(k.params)
    big["tmaps"][0]["dims"][1] = 8192  # twice the rows the tensor has
    with pytest.raises(EngineError, match="spans"):
        validate_launch(big, k.args, ctx.tensors, "t")
    with pytest.raises(EngineError, match="names no tensor map"):
        validate_launch(k.params, [*k.args, "@tmap:2"], ctx.tensors, "t")
    other = copy.deepcopy(k.params)
    other["tmaps"][1]["tensor"] = "nope"
    with pytest.raises(EngineError, match="unknown tensor"):
        validate_launch(other, k.args, ctx.tensors, "t")
    as_bf16 = copy.deepcopy(k.params)
    as_bf16["tmaps"][0]["dtype"] = "bfloat16"
    with pytest.raises(EngineError, match="reads 'x0' as bfloat16"):
        validate_launch(as_bf16, k.args, ctx.tensors, "t")


def test_parameters():
    ctx = _ctx(4096, 3072, 768)
    for p in (
        {"BN": 96},
        {"BN": 256, "PINGPONG": 1},
        {"BN": 128, "PINGPONG": 1, "SPLITS": 2},
        {"BN": 256, "STAGES": 5},
    ):
        with pytest.raises(CompileError, match="not valid"):
            gemm_sm90.generate(ctx, p)
    for bn in gemm_sm90.BNS:
        assert gemm_sm90.shared_bytes(bn, gemm_sm90.max_stages(bn)) <= 227 * 1024
        assert gemm_sm90.shared_bytes(bn, gemm_sm90.max_stages(bn) + 1) > 227 * 1024
    split = gemm_sm90.generate(_ctx(128, 768, 3072), {"BN": 128, "SPLITS": 8})
    assert [k.params.get("reduce", False) for k in split] == [False, True]
    assert split[0].args[-1] == "@workspace" and split[0].workspace_bytes == 8 * 128 * 768 * 4


def test_unsupported_problems():
    assert "16-byte" in gemm_sm90.unsupported(problem_of(_ctx(256, 256, 100)))
    assert "float32" in gemm_sm90.unsupported(problem_of(_ctx(256, 256, 256, DType.float32)))
    with pytest.raises(CompileError, match="no TMA GEMM"):
        gemm_sm90.generate(_ctx(256, 256, 100))


@pytest.mark.parametrize(
    ("m", "n", "k", "want"),
    [
        (4096, 768, 768, True),  # BERT-base at batch 32: 0.87x cuBLAS against 0.58x (wgmma)
        (6304, 3072, 768, True),  # ViT-B/16 at batch 32
        (8192, 8192, 8192, True),
        (128, 768, 3072, True),  # batch 1, K = 3072: split-K 8, 0.99x against 0.98x
        (197, 768, 3072, True),
        (128, 768, 768, False),  # batch 1, K = 768: the wgmma path is as fast
        (197, 2304, 768, False),
        (1024, 768, 768, True),  # the mid-M tile rule: BN 64, 5.4 us against the cluster kernel's 8.0
    ],
)
def test_selection_rules(m, n, k, want):
    assert gemm_sm90.selected(problem_of(_ctx(m, n, k))) is want


def test_engine_validates_tensor_maps(tmp_path):
    """An sm_90 engine with TMA GEMMs saves and reads back; a tensor map that reaches past its
    tensor, or an argument naming no map, is refused when the file is read."""
    from onnx import TensorProto, helper, numpy_helper

    import graphc
    from graphc.runtime.format import read_engine

    rng = np.random.default_rng(0)
    w = rng.standard_normal((768, 768)).astype(np.float32)
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "mm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4096, 768])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4096, 768])],
        [numpy_helper.from_array(w, "w")],
    )
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 10
    eng = graphc.compile(model, target="cuda", precision="fp16", arch=["sm_90"], cache_dir=str(tmp_path / "c"))
    (ln,) = [ln for s in eng.plan.steps for ln in s.launches if ln.family == "gemm"]
    assert ln.params["path"] == "tma" and ln.args[:2] == ["@tmap:0", "@tmap:1"]
    eng.save(tmp_path / "ok.engine")
    read_engine(tmp_path / "ok.engine")
    good = copy.deepcopy(ln.params)
    ln.params["tmaps"][1]["dims"][0] *= 2
    eng.save(tmp_path / "far.engine")
    with pytest.raises(EngineError, match="spans"):
        read_engine(tmp_path / "far.engine")
    ln.params = good
    ln.args[1] = "@tmap:9"
    eng.save(tmp_path / "index.engine")
    with pytest.raises(EngineError, match="names no tensor map"):
        read_engine(tmp_path / "index.engine")


def test_heuristic_for_a_gelu_epilogue():
    """bias + Gelu (FFN1): BM 192 with the per-warp epilogue (BN 128 at M 4096, 192 at 6304: the
    tall rule); ping-pong BN 128 where the vector epilogue does not apply."""
    from graphc.codegen.families.gemm import standalone_context
    from graphc.ops.fused import ACC, IN, OP, EpilogueOp

    epi = (EpilogueOp("Add", get_op("Add").attrs(), (ACC, IN(2))), EpilogueOp("Gelu", get_op("Gelu").attrs(), (OP(0),)))
    for m, bn in ((4096, 128), (6304, 192)):
        ctx = standalone_context(
            "MatMul", [(m, 768), (768, 3072), (3072,)], DType.float16, n_anchor=2, epilogue=epi, outputs=(OP(1),)
        )
        (k,) = gemm_sm90.generate(ctx)
        got = (k.params.get("BM"), k.params["BN"], k.params["PINGPONG"], k.params["VEC_EPI"], k.params.get("WARP_EPI"))
        assert got == (192, bn, 0, 1, 1)
        p = gemm_sm90.heuristic(problem_of(ctx), vec_ok=False)
        assert (p["BN"], p["PINGPONG"], p.get("BM")) == (128, 1, None)
    plain = gemm_sm90.heuristic(problem_of(_ctx(4096, 3072, 768)))
    assert (plain["BN"], plain["PINGPONG"], plain["OVERLAP"]) == (192, 0, 1)  # the OVERLAP rule
    assert (gemm_sm90.heuristic(problem_of(_ctx(4096, 3072, 768)), vec_ok=False)["BN"]) == 256


@pytest.mark.parametrize(
    ("m", "n", "k", "layout", "overlap"),
    [
        (4096, 768, 768, "mn", True),
        (6304, 2304, 768, "mn", True),  # (6304 x 3072 x 768: the tall rule)
        (4096, 768, 3072, "k", True),
        (4096, 4096, 4096, "mn", False),  # cooperative BN 256 measured faster
        (2048, 3072, 768, "mn", True),  # the mid-M tile rule's OVERLAP (BN 192, as the OVERLAP rule's)
        (128, 768, 3072, "mn", False),  # split-K
    ],
)
def test_overlap_rule(m, n, k, layout, overlap):
    (kern,) = gemm_sm90.generate(_ctx(m, n, k, b_layout=layout))[:1]
    assert (kern.params.get("OVERLAP", 0) == 1) == overlap, kern.params
    if overlap:
        assert kern.params["BN"] == gemm_sm90.OVERLAP_RULE_BN and kern.params["VEC_EPI"] == 1


def test_overlap_rule_needs_the_vector_epilogue():
    """An epilogue input that does not broadcast along rows (no 8-column vector epilogue): the
    heuristic keeps the cooperative tile instead of failing."""
    ctx = standalone_context(
        "MatMul", [(4096, 768), (768, 768), (4096, 768)], DType.float16, n_anchor=2,
        epilogue=(EpilogueOp("Add", get_op("Add").attrs(), (ACC, IN(2))),), outputs=(OP(0),),
    )  # fmt: skip
    (k,) = gemm_sm90.generate(ctx)
    # a residual [M, N] vectorizes, and takes the tall rule (BM 192 BN 128: 132 tiles at M 4096)
    assert (k.params.get("BM"), k.params["BN"], k.params.get("WARP_EPI"), k.params["VEC_EPI"]) == (192, 128, 1, 1)
    (k,) = gemm_sm90.generate(ctx, {"VEC_EPI": 0})
    assert "OVERLAP" not in k.params and "BM" not in k.params and k.params["VEC_EPI"] == 0


@pytest.mark.parametrize(
    ("m", "n", "k", "bias", "want"),
    [
        (4096, 768, 3072, True, (192, 128)),  # BERT's FFN2 at batch 32: 132 tiles of 192 x 128
        (4096, 768, 768, False, (192, 128)),  # the attention output projection
        (6304, 768, 3072, True, (192, 192)),  # ViT's: 132 tiles of 192 x 192
        (2048, 768, 3072, True, None),  # below the measured M
        (4096, 4096, 4096, True, None),  # outside the measured N, K
    ],
)
def test_residual_takes_the_tall_rule(m, n, k, bias, want):
    """bias + residual [M, N] (measured: gemm_sm90.tall_rule's notes) takes BM 192 with the
    per-warp epilogue where M >= 4096 and N, K are linear-layer sizes, BN by the wave fill."""
    add = EpilogueOp("Add", get_op("Add").attrs(), (ACC, IN(2)))
    epi, extra = ((add, EpilogueOp("Add", get_op("Add").attrs(), (OP(0), IN(3)))), [(n,), (m, n)]) if bias else (
        (add,), [(m, n)])  # fmt: skip
    ctx = standalone_context(
        "MatMul", [(m, k), (n, k), *extra], DType.float16, domain="graphc",
        attrs=get_op("MatMul", "graphc").attrs(trans_b=1), n_anchor=2, epilogue=epi, outputs=(OP(len(epi) - 1),),
    )  # fmt: skip
    kern = gemm_sm90.generate(ctx)[0]
    if want is None:
        assert "BM" not in kern.params, kern.params
    else:
        assert (kern.params.get("BM"), kern.params["BN"], kern.params.get("WARP_EPI")) == (*want, 1), kern.params
    assert gemm_sm90.has_residual(problem_of(ctx), step_operands(ctx))


def test_overlap_parameters():
    """OVERLAP (the epilogue during the next tile's main loop) holds two accumulator arrays: BN 128
    or 192, one K slice, cooperative consumers, and the 8-column vector epilogue or the element-wise
    stores (N % 8 != 0), not the accumulator-layout one."""
    ctx = _ctx(4096, 3072, 768)
    for p in (
        {"BN": 256, "OVERLAP": 1},
        {"BN": 128, "OVERLAP": 1, "PINGPONG": 1},
        {"BN": 128, "OVERLAP": 1, "SPLITS": 2},
    ):
        with pytest.raises(CompileError, match="not valid"):
            gemm_sm90.generate(ctx, p)
    with pytest.raises(CompileError, match="OVERLAP=1 takes the 8-column vector epilogue"):
        gemm_sm90.generate(ctx, {"BN": 128, "OVERLAP": 1, "VEC_EPI": 2})
    # the element-wise stores in per-warp chunks: asked for, or where N % 8 != 0 allows no other
    odd = [_ctx(4096, n, 768, b_layout="k") for n in (3076, 50257)]
    for c, p in ((ctx, {"VEC_EPI": 0}), (odd[0], {}), (odd[1], {})):
        for sched in ({"BN": 128, "OVERLAP": 1}, {"BM": 192, "BN": 192, "WARP_EPI": 1}):
            (k,) = gemm_sm90.generate(c, {**sched, **p})
            assert k.params["VEC_EPI"] == 0 and all(k.params[x] == v for x, v in sched.items()), k.params
            assert "ov_chunk_scalar" not in k.source and "wep[r * EP + lane]" in k.source
    (k,) = gemm_sm90.generate(ctx, {"BN": 192, "OVERLAP": 1})
    assert k.params["OVERLAP"] == 1 and k.params["VEC_EPI"] == 1 and k.params["PINGPONG"] == 0
    (plain,) = gemm_sm90.generate(ctx, {"BN": 192})
    assert "OVERLAP" not in plain.params  # the other forms' parameters (and cache keys) are unchanged
    assert [gemm_sm90.overlap_every(kt, 128) for kt in (1, 4, 8, 12, 48)] == [1, 1, 2, 3, 3]


def _ptxas_log(source: str) -> str:
    from graphc.codegen.nvrtc import BASE_OPTIONS, _nvrtc

    nv = _nvrtc()
    _, prog = nv.nvrtcCreateProgram(source.encode(), b"k.cu", 0, [], [])
    try:
        opts = [o.encode() for o in (*BASE_OPTIONS, "--gpu-architecture=sm_90a", "--ptxas-options=-v")]
        (err,) = nv.nvrtcCompileProgram(prog, len(opts), opts)
        _, size = nv.nvrtcGetProgramLogSize(prog)
        buf = b" " * size
        nv.nvrtcGetProgramLog(prog, buf)
        assert err == nv.nvrtcResult.NVRTC_SUCCESS, buf.decode(errors="replace")
        return buf.decode(errors="replace")
    finally:
        nv.nvrtcDestroyProgram(prog)


@pytest.mark.parametrize(("bn", "gelu"), [(128, True), (192, False)])
def test_overlap_keeps_the_wgmma_pipelined(bn, gelu):
    """ptxas keeps the OVERLAP kernel's wgmma asynchronous (no C7511 "serialized due to insufficient
    register resources", which a copy of the accumulators into a second array caused) and spills
    nothing, with an FFN epilogue (bias + Gelu; bias + residual for BN 192, the default's form)
    between a K step's issue and its wait. (BN 192 with bias + Gelu spilled 48 bytes with NVRTC
    13.0, not with 13.5; the default never takes it.)"""
    add = EpilogueOp("Add", get_op("Add").attrs(), (ACC, IN(2)))
    if gelu:
        epi, extra = (add, EpilogueOp("Gelu", get_op("Gelu").attrs(), (OP(0),))), [(3072,)]
    else:
        epi, extra = (add, EpilogueOp("Add", get_op("Add").attrs(), (OP(0), IN(3)))), [(3072,), (4096, 3072)]
    ctx = standalone_context(
        "MatMul", [(4096, 768), (768, 3072), *extra], DType.float16, n_anchor=2, epilogue=epi, outputs=(OP(1),)
    )
    (k,) = gemm_sm90.generate(ctx, {"BN": bn, "OVERLAP": 1})
    log = _ptxas_log(k.source)
    assert "C7511" not in log and "serialized" not in log, log
    assert "0 bytes spill stores, 0 bytes spill loads" in log, log


def test_tall_tile_parameters():
    """BM 192: three consumer warpgroups (512 threads), A's tensor map 192 rows a box, the grid and
    shared memory of 192-row tiles; cooperative only, BN 128 or 192 (ptxas compiles 512 threads for
    128 registers: BN 256's wgmma needs 154); the 128-row forms keep their parameters."""
    ctx = _ctx(6304, 768, 768, b_layout="k")
    (k,) = gemm_sm90.generate(ctx, {"BM": 192, "BN": 192})
    assert k.block == (512, 1, 1) and k.params["BM"] == 192 and k.params["STAGES"] == gemm_sm90.max_stages(192, 192)
    assert k.grid == (132, 1, 1)  # 33 x 4 tiles: one whole wave
    a, b = validate_launch(k.params, k.args, ctx.tensors, "t")
    assert a.box == (64, 192, 1) and b.box == (64, 192, 1)
    assert k.shared_bytes == gemm_sm90.shared_bytes(192, 4, 192) <= 227 * 1024
    assert "__launch_bounds__(512, 1)" in k.source and "gc_setmaxnreg_inc<152>" in k.source
    for p in (
        {"BM": 192, "BN": 256},
        {"BM": 192, "BN": 128, "PINGPONG": 1},
        {"BM": 192, "BN": 128, "OVERLAP": 1},
        {"BM": 256, "BN": 128},
        {"BM": 192, "BN": 128, "STAGES": 5},
    ):
        with pytest.raises(CompileError, match="not valid"):
            gemm_sm90.generate(ctx, p)
    (plain,) = gemm_sm90.generate(ctx, {"BN": 192})
    assert "BM" not in plain.params and plain.block == (384, 1, 1)


@pytest.mark.parametrize("epilogue", ["gelu", "residual"])
def test_tall_tile_compiles_without_spills(epilogue):
    """BM 192 BN 192 (96 accumulators a thread within 128 registers) with an FFN epilogue: ptxas
    keeps the wgmma asynchronous and spills nothing."""
    add = EpilogueOp("Add", get_op("Add").attrs(), (ACC, IN(2)))
    if epilogue == "gelu":
        epi, extra = (add, EpilogueOp("Gelu", get_op("Gelu").attrs(), (OP(0),))), [(3072,)]
    else:
        epi, extra = (add, EpilogueOp("Add", get_op("Add").attrs(), (OP(0), IN(3)))), [(3072,), (6304, 3072)]
    ctx = standalone_context(
        "MatMul", [(6304, 768), (768, 3072), *extra], DType.float16, n_anchor=2, epilogue=epi, outputs=(OP(1),)
    )
    (k,) = gemm_sm90.generate(ctx, {"BM": 192, "BN": 192})
    log = _ptxas_log(k.source)
    assert "C7511" not in log and "serialized" not in log, log
    assert "0 bytes spill stores, 0 bytes spill loads" in log, log


@pytest.mark.parametrize("sched", [{"BN": 192, "OVERLAP": 1}, {"BM": 192, "BN": 192, "WARP_EPI": 1}])
def test_odd_n_per_warp_epilogue_compiles_without_spills(sched):
    """The element-wise per-warp chunks (N odd: GPT-2's LM head with a bias) with two accumulator
    arrays of BN 192 (OVERLAP) or BM 192's 128 registers: the wgmma stay asynchronous, no spill."""
    ctx = standalone_context(
        "MatMul",
        [(4096, 768), (50257, 768), (50257,)],
        DType.float16,
        n_anchor=2,
        epilogue=(EpilogueOp("Add", get_op("Add").attrs(), (ACC, IN(2))),),
        outputs=(OP(0),),
        domain="graphc",
        attrs=get_op("MatMul", "graphc").attrs(trans_b=1),
    )
    (k,) = gemm_sm90.generate(ctx, sched)
    assert k.params["VEC_EPI"] == 0
    log = _ptxas_log(k.source)
    assert "C7511" not in log and "serialized" not in log, log
    assert "0 bytes spill stores, 0 bytes spill loads" in log, log


@pytest.mark.parametrize(
    ("m", "n", "k", "tall"),
    [
        (6304, 768, 768, True),
        (6304, 3072, 768, True),
        (6304, 768, 3072, True),
        (6304, 2304, 768, False),  # 0.10 of wave fill gained: a tie on the H200
        (4096, 768, 768, False),
        (4096, 3072, 768, False),
        (6304, 4096, 4096, False),  # outside the measured N, K
    ],
)
def test_tall_rule(m, n, k, tall):
    """The plain heuristic takes BM 192 BN 192 with the per-warp epilogue where it fills the waves
    of 132 SMs by 0.12 or more better than the 128-row choice (measured: see TALL_RULE_MIN_GAIN)."""
    p = gemm_sm90.heuristic(problem_of(_ctx(m, n, k)))
    assert (p.get("BM") == 192) == tall, p
    if tall:
        assert (p["BN"], p["WARP_EPI"], p["STAGES"]) == (192, 1, gemm_sm90.max_stages(192, 192))
    assert gemm_sm90.heuristic(problem_of(_ctx(m, n, k)), vec_ok=False).get("BM") is None


def test_fast_gelu_forms():
    """FAST_GELU (the default without split-K) takes both GELU forms onto sm90.cuh's MUFU versions;
    FAST_GELU 0 keeps common.cuh's erff / tanhf."""
    for approx, fast_fn in (("none", "gc_gelu_fast("), ("tanh", "gc_gelu_tanh_fast(")):
        epi = (
            EpilogueOp("Add", get_op("Add").attrs(), (ACC, IN(2))),
            EpilogueOp("Gelu", get_op("Gelu").attrs(approximate=approx), (OP(0),)),
        )
        ctx = standalone_context(
            "MatMul", [(4096, 768), (768, 3072), (3072,)], DType.float16, n_anchor=2, epilogue=epi, outputs=(OP(1),)
        )
        for fast in (1, 0):
            (k,) = gemm_sm90.generate(ctx, {"FAST_GELU": fast})
            body = k.source[k.source.index(f"{k.name}_epi") :]  # past the headers' definitions
            assert k.params["FAST_GELU"] == fast and (fast_fn in body) == bool(fast), k.params
            assert fast or "_fast(" not in body


@pytest.mark.parametrize(
    ("m", "n", "overlap"),
    [
        (4096, 50257, True),
        (8192, 50257, True),
        (4096, 8193, True),
        (2048, 50257, True),
        (1024, 50257, True),
        (1023, 50257, False),
        (4096, 3075, False),
    ],
)
def test_wide_element_wise_rule(m, n, overlap):
    """A wide output with the element-wise stores (N odd: GPT-2's LM head) takes OVERLAP BN 192
    from M = 1024 (measured at 1024, 2048, 4096); narrower or shorter problems keep the wave model's tile."""
    ctx = _ctx(m, n, 768, b_layout="k")
    (k,) = gemm_sm90.generate(ctx)
    assert k.params["VEC_EPI"] == 0
    got = (k.params.get("OVERLAP"), k.params["BN"]) if overlap else k.params.get("OVERLAP")
    assert got == ((1, gemm_sm90.OVERLAP_RULE_BN) if overlap else None), k.params


@pytest.mark.parametrize(
    ("m", "n", "k", "tma"),
    [
        (100352, 384, 96, True),  # ConvNeXt-T stage 0 at batch 32
        (100352, 96, 384, True),
        (3136, 384, 96, True),  # ... at batch 1
        (784, 192, 768, True),
        (512, 384, 96, False),  # fewer rows than measured
        (100352, 64, 384, False),  # narrower than measured
        (128, 96, 384, False),
    ],
)
def test_narrow_mlp_rule(m, n, k, tma):
    """MatMuls with many rows and a narrow N or K (ConvNeXt's and Swin's stage-0/1 MLPs) run on the
    TMA GEMM from M = 784 and 96 channels, where the default path was 1.4-2.5x slower."""
    ctx = _ctx(m, n, k, b_layout="k")
    ctx.precision = "fp16"
    ks = gemm_sm90.select(ctx)
    assert gemm_sm90.narrow_mlp(problem_of(ctx)) == tma
    if tma:
        assert ks and ks[0].params["path"] == "tma", [k.params for k in ks]
    else:
        assert not ks or ks[0].params.get("path") != "tma"
