"""The CUDA int8 path without a GPU (issue 13): the graph an int8 CUDA engine runs, its kernels'
parameters, the errors for what the kernels do not cover, and the SASS of its sm_80/sm_90 cubins
(integer tensor-core MMA: IMMA). The numbers are checked on a GPU by test_gemm_int8_gpu.py."""

from __future__ import annotations

import re
import subprocess

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import graphc
from graphc.codegen.families.gemm import OperandLayout
from graphc.codegen.families.gemm_int8 import Int8Problem, candidates, heuristic, shared_bytes, valid
from graphc.errors import CompileError
from helpers import cuobjdump_path

try:
    from graphc.codegen.nvrtc import nvrtc_version

    nvrtc_version()
    HAVE_NVRTC = True
except Exception:
    HAVE_NVRTC = False


def _opcodes(text: str) -> set[str]:
    return set(re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", text))


CUOBJDUMP = cuobjdump_path()
RNG = np.random.default_rng(13)
needs_nvrtc = pytest.mark.skipif(not HAVE_NVRTC, reason="needs NVRTC (cuda-bindings)")


def _init(name: str, shape: tuple[int, ...], scale: float = 0.3) -> TensorProto:
    return numpy_helper.from_array((RNG.standard_normal(shape) * scale).astype(np.float32), name)


def cnn_model(batch: int = 2) -> helper.ModelProto:
    """A ResNet-style block: stem conv 7x7/2 (C = 3) -> Relu -> MaxPool, then 1x1 -> 3x3 -> 1x1
    with a residual Add and Relu, global pooling and a Gemm classifier."""
    inits = [
        _init("w0", (16, 3, 7, 7), 0.1),
        _init("b0", (16,)),
        _init("w1", (8, 16, 1, 1)),
        _init("b1", (8,)),
        _init("w2", (8, 8, 3, 3), 0.2),
        _init("b2", (8,)),
        _init("w3", (16, 8, 1, 1)),
        _init("b3", (16,)),
        _init("fc", (10, 16)),
        _init("fcb", (10,)),
    ]
    n = helper.make_node
    nodes = [
        n("Conv", ["x", "w0", "b0"], ["c0"], strides=[2, 2], pads=[3, 3, 3, 3], name="stem"),
        n("Relu", ["c0"], ["r0"]),
        n("MaxPool", ["r0"], ["p0"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
        n("Conv", ["p0", "w1", "b1"], ["c1"], name="conv1"),
        n("Relu", ["c1"], ["r1"]),
        n("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], name="conv2"),
        n("Relu", ["c2"], ["r2"]),
        n("Conv", ["r2", "w3", "b3"], ["c3"], name="conv3"),
        n("Add", ["c3", "p0"], ["s"]),
        n("Relu", ["s"], ["r3"]),
        n("GlobalAveragePool", ["r3"], ["g"]),
        n("Flatten", ["g"], ["f"]),
        n("Gemm", ["f", "fc", "fcb"], ["y"], transB=1, name="fc"),
    ]
    g = helper.make_graph(
        nodes,
        "cnn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, 32, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 10])],
        inits,
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def mlp_model(batch: int = 2, seq: int = 24, d: int = 64) -> helper.ModelProto:
    """A transformer MLP block: MatMul + bias -> Gelu -> MatMul + bias -> residual Add ->
    LayerNorm, on [batch, seq, d]."""
    inits = [
        _init("w1", (d, 4 * d), 0.1),
        _init("b1", (4 * d,)),
        _init("w2", (4 * d, d), 0.05),
        _init("b2", (d,)),
        numpy_helper.from_array(np.ones(d, np.float32), "ln_s"),
        numpy_helper.from_array(np.zeros(d, np.float32), "ln_b"),
    ]
    n = helper.make_node
    nodes = [
        n("MatMul", ["x", "w1"], ["h0"], name="fc1"),
        n("Add", ["h0", "b1"], ["h1"]),
        n("Gelu", ["h1"], ["h2"], domain="com.microsoft"),
        n("MatMul", ["h2", "w2"], ["h3"], name="fc2"),
        n("Add", ["h3", "b2"], ["h4"]),
        n("Add", ["h4", "x"], ["h5"]),
        n("LayerNormalization", ["h5", "ln_s", "ln_b"], ["y"], axis=-1),
    ]
    g = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, seq, d])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, seq, d])],
        inits,
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])


def calibration(model: helper.ModelProto, n: int = 4) -> list[dict[str, np.ndarray]]:
    vi = model.graph.input[0]
    shape = [d.dim_value for d in vi.type.tensor_type.shape.dim]
    return [{vi.name: RNG.standard_normal(shape).astype(np.float32)} for _ in range(n)]


def _int8_cuda(model, arch=("sm_80",)):
    return graphc.compile(model, target="cuda", precision="int8", calibration_data=calibration(model), arch=list(arch))


# ---- the graph --------------------------------------------------------------------------------


@needs_nvrtc
def test_cnn_runs_int8_between_layers():
    """Every conv and the classifier are int8 GEMM steps; inside the bottleneck (one consumer per
    activation) the requantize rides in the producer's epilogue, so the tensors between those
    layers are int8, and no Quantize/DequantizeLinear node is left."""
    eng = _int8_cuda(cnn_model())
    steps = {s.name: s for s in eng.plan.steps}
    int_steps = [s for s in eng.plan.steps if any(ln.family == "gemm_int8" for ln in s.launches)]
    assert len(int_steps) == 5  # stem, conv1-3, fc
    assert not any(s.op in ("QuantizeLinear", "DequantizeLinear", "ConvInteger") for s in eng.plan.steps)
    dtypes = {n: t.dtype for n, t in eng.plan.tensors.items()}
    # conv1's and conv2's outputs feed only the next conv: int8 (requantized in the epilogue)
    for name in ("conv1/int", "conv2/int"):
        assert dtypes[steps[name].outputs[0]] == "int8", (name, dtypes[steps[name].outputs[0]])
    # every int8 step reads int8 activations and weights
    for s in int_steps:
        assert dtypes[s.inputs[0]] == "int8" and dtypes[s.inputs[1]] == "int8", s.name
    assert eng.report["quantization"]["integer_ops"] == {"ConvInteger": 5}


@needs_nvrtc
def test_mlp_matmuls_are_k_major_pointwise_gemms():
    """A MatMul runs as a 1x1 ConvInteger over [M, K, 1, 1] rows with the weight stored [N, K]:
    both operands K-contiguous (16-byte cp.async copies), the biases in the int32 accumulator, the
    Gelu and the requantize of fc1 and the residual Add of fc2 in the epilogues."""
    eng = _int8_cuda(mlp_model())
    gemms = [ln for s in eng.plan.steps for ln in s.launches if ln.family == "gemm_int8"]
    assert len(gemms) == 2
    for ln in gemms:
        assert ln.params["VEC_A"] == 1 and ln.params["VEC_B"] == 1, ln.params
        assert not ln.params.get("im2col")
    assert (gemms[0].params["M"], gemms[0].params["N"], gemms[0].params["K"]) == (48, 256, 64)
    steps = [s for s in eng.plan.steps if any(ln.family == "gemm_int8" for ln in s.launches)]
    assert eng.plan.tensors[steps[0].outputs[0]].dtype == "int8"  # fc1 + Gelu, requantized for fc2
    # fc2's epilogue reads the residual x (float32) and writes float32 for the LayerNorm
    # (through a view of x as the anchor's [M, N, 1, 1], an alias step: no copy)
    views = [eng.plan.tensors[i].alias_of for i in steps[1].inputs]
    assert "x" in views and eng.plan.tensors[steps[1].outputs[0]].dtype == "float32"


# ---- parameters -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "m,n,k,batch", [(1, 1, 1, 1), (16, 64, 27, 2), (4096, 3072, 768, 1), (64, 12544, 147, 32), (2, 10, 2048, 1)]
)
def test_heuristic_is_valid_and_fits(m, n, k, batch):
    prob = Int8Problem(
        m,
        n,
        k,
        OperandLayout(m, k, 1, []),
        OperandLayout(n, k, 1, []),
        [(batch, 0, n * k)] if batch > 1 else [],
        (m, n),
    )
    p = heuristic(prob)
    assert valid(prob, p) and shared_bytes(p) <= 227 * 1024
    assert all(valid(prob, c) for c in candidates(prob))
    assert not valid(prob, {**p, "BK": 48})  # one m16n8k32 step is 32 bytes of K
    assert not valid(prob, {**p, "BM": p["BM"] + 8})  # warp rows are whole m16 tiles


# ---- errors -----------------------------------------------------------------------------------


def _integer_model(
    op: str, x_type: int, x_shape, w: np.ndarray, y_shape, zp: bool = False, zp_shape: tuple = ()
) -> helper.ModelProto:
    inits = [numpy_helper.from_array(w, "w")]
    ins = ["x", "w"]
    if zp:
        inits.append(numpy_helper.from_array(np.full(zp_shape, 3, dtype=np.uint8), "xz"))
        ins.append("xz")
    node = helper.make_node(op, ins, ["y"], name="int_op")
    g = helper.make_graph(
        [node], "t", [helper.make_tensor_value_info("x", x_type, list(x_shape))],
        [helper.make_tensor_value_info("y", TensorProto.INT32, list(y_shape))], inits,
    )  # fmt: skip
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@needs_nvrtc
@pytest.mark.parametrize(
    "case,match",
    [
        ("zero_point", "node 'int_op'.*zero points"),
        ("conv3d", "node 'int_op'.*2-D convolutions"),
        ("batched_b", "node 'int_op'.*2-D B"),
    ],
)
def test_uncovered_forms_name_the_node(case, match):
    w8 = RNG.integers(-127, 128, (4, 4, 1, 1, 1)).astype(np.int8)
    if case == "zero_point":
        # A per-tensor zero point is lowered to a float GEMM (passes/lower_int_quant.py); a per-row
        # one of A is not, and reaches the int8 kernels, which take none.
        b8 = RNG.integers(0, 255, (4, 5)).astype(np.uint8)
        model = _integer_model("MatMulInteger", TensorProto.UINT8, (3, 4), b8, (3, 5), zp=True, zp_shape=(3,))
    elif case == "conv3d":
        model = _integer_model("ConvInteger", TensorProto.INT8, (1, 4, 3, 3, 3), w8, (1, 4, 3, 3, 3))
    else:
        model = _integer_model(
            "MatMulInteger", TensorProto.INT8, (2, 3, 4), RNG.integers(-9, 9, (2, 4, 5)).astype(np.int8), (2, 3, 5)
        )
    with pytest.raises(CompileError, match=match):
        graphc.compile(model, target="cuda", arch=["sm_80"])


# ---- SASS -------------------------------------------------------------------------------------


@needs_nvrtc
@pytest.mark.skipif(CUOBJDUMP is None, reason="cuobjdump not found: pip install nvidia-cuda-cuobjdump")
@pytest.mark.parametrize("which", ["cnn", "mlp"])
def test_int8_engine_cubins_use_imma(which, tmp_path):
    """Issue 13 item 5: the sm_90 and sm_80 cubins of an int8 engine run its GEMMs on integer tensor
    cores: every int8 GEMM kernel has IMMA (mma.sync) or, on sm_90, IGMMA (the sm_90a warpgroup
    kernels), and no float MMA hides in any of them. On sm_90 the K-major GEMMs with 16-byte rows
    (no patch matrix) run the TMA kernel: its operands arrive by bulk tensor copies (UTMALDG)."""
    eng = _int8_cuda(cnn_model() if which == "cnn" else mlp_model(), arch=("sm_80", "sm_90"))
    for arch in ("sm_80", "sm_90"):
        seen = 0
        paths: dict[str, int] = {}
        for s in eng.plan.for_arch(arch).steps:
            for ln in s.launches:
                if ln.family != "gemm_int8" or ln.params.get("im2col"):
                    continue
                f = tmp_path / f"{arch}_{ln.kernel}.cubin"
                f.write_bytes(eng.kernels.cubins[arch][ln.digest])
                out = subprocess.run([CUOBJDUMP, "-sass", str(f)], capture_output=True, text=True, check=True)
                ops = _opcodes(out.stdout)
                path = ln.params["path"]
                want = "IMMA" if path == "int8_mma" else "IGMMA"
                assert want in ops and not {"HMMA", "HGMMA"} & ops, (arch, s.name, want, sorted(ops))
                assert ("UTMALDG" in ops) == (path == "int8_tma"), (arch, s.name, path, sorted(ops))
                if arch == "sm_90":  # an sm_90a kernel wherever both operands have 16-byte rows
                    aligned = ln.params["VEC_A"] and ln.params["VEC_B"]
                    assert (path != "int8_mma") == bool(aligned), (s.name, ln.params)
                    assert (path == "int8_tma") == (not ln.params.get("im2col") and s.name in TMA_STEPS[which])
                paths[path] = paths.get(path, 0) + 1
                seen += 1
        assert seen == (5 if which == "cnn" else 2), (arch, seen)
        # the MLP's on sm_90 both TMA (K-major rows); the CNN's classifier TMA (rows [2, 16]), conv1
        # cp.async wgmma (a patch matrix), the others mma.sync (the stem's weight rows are 147
        # bytes, conv2's 72, conv3's 8: byte loads of the weight)
        want = {"sm_80": {"int8_mma": seen}, "sm_90": WANT_SM90[which]}[arch]
        assert paths == want, (arch, paths)


TMA_STEPS = {"cnn": {"fc/int"}, "mlp": {"fc1/int", "fc2/int"}}
WANT_SM90 = {"cnn": {"int8_mma": 3, "int8_wgmma": 1, "int8_tma": 1}, "mlp": {"int8_tma": 2}}


@needs_nvrtc
@pytest.mark.skipif(CUOBJDUMP is None, reason="cuobjdump not found: pip install nvidia-cuda-cuobjdump")
def test_tma_gemm_schedules_compile(tmp_path):
    """Every schedule of the int8 TMA GEMM compiles for sm_90a with IGMMA (no float MMA), TMA
    loads, no local-memory spill, and its int8 outputs stored 8 bytes at a time by the vector
    epilogue (STG.E.64) where N allows it."""
    from graphc.codegen.families import gemm_int8, gemm_sm90
    from graphc.codegen.nvrtc import CompileJob, compile_all

    model = _rows_requant_model(1000, 520, 272)
    seen = {}
    orig = gemm_sm90.generate_int8

    def capture(ctx, prob, params=None):
        seen["ctx"], seen["prob"] = ctx, prob
        return orig(ctx, prob, params)

    gemm_sm90.generate_int8 = capture
    try:
        graphc.compile(model, target="cuda", arch=["sm_90"], cache_dir=str(tmp_path / "c"))
    finally:
        gemm_sm90.generate_int8 = orig
    assert gemm_int8.hopper_path(seen["prob"]) == "tma"
    variants = [
        {"BN": 192, "OVERLAP": 1},
        {"BN": 128, "PINGPONG": 1},
        {"BN": 256, "WARP_EPI": 1},
        {"BN": 128, "VEC_EPI": 0},
    ]
    kernels = [orig(seen["ctx"], seen["prob"], v)[0] for v in variants]
    cubins = compile_all([CompileJob(k.name, k.source, "sm_90a") for k in kernels], cache_dir=tmp_path / "c")
    for v, k, cubin in zip(variants, kernels, cubins, strict=True):
        f = tmp_path / f"{k.name}.cubin"
        f.write_bytes(cubin)
        out = subprocess.run([CUOBJDUMP, "-sass", str(f)], capture_output=True, text=True, check=True).stdout
        ops = _opcodes(out)
        assert {"IGMMA", "UTMALDG"} <= ops and not {"HMMA", "HGMMA", "IMMA"} & ops, (v, sorted(ops))
        assert ("STG.E.64" in out) == (v.get("VEC_EPI", 1) == 1), v
        assert "STL" not in ops or v.get("OVERLAP"), (v, "local-memory spill")


def _rows_requant_model(m: int, n: int, k: int) -> helper.ModelProto:
    """An int8 layer as passes/quantize_int8.py writes it for CUDA: rows [M, K, 1, 1] x [N, K, 1, 1]
    + int32 bias, dequantized per channel, Relu, requantized to int8."""
    inits = [
        numpy_helper.from_array(RNG.integers(-127, 128, (n, k, 1, 1)).astype(np.int8), "w"),
        numpy_helper.from_array(RNG.integers(-999, 999, (n, 1, 1)).astype(np.int32), "b"),
        numpy_helper.from_array(RNG.uniform(1e-5, 3e-5, (1, n, 1, 1)).astype(np.float32), "s"),
        numpy_helper.from_array(np.array(0.05, np.float32), "ys"),
        numpy_helper.from_array(np.array(0, np.int8), "yz"),
    ]
    n_ = helper.make_node
    nodes = [
        n_("ConvInteger", ["x", "w"], ["acc"]),
        n_("Add", ["acc", "b"], ["a1"]),
        n_("Cast", ["a1"], ["f"], to=TensorProto.FLOAT),
        n_("Mul", ["f", "s"], ["d"]),
        n_("Relu", ["d"], ["r"]),
        n_("QuantizeLinear", ["r", "ys", "yz"], ["y"]),
    ]
    g = helper.make_graph(
        nodes, "rows", [helper.make_tensor_value_info("x", TensorProto.INT8, [m, k, 1, 1])],
        [helper.make_tensor_value_info("y", TensorProto.INT8, [m, n, 1, 1])], inits,
    )  # fmt: skip
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@needs_nvrtc
def test_tma_gemm_tensor_maps_are_validated(tmp_path):
    """The int8 TMA GEMM's operands are read through 1-byte ("uint8") tensor maps with 128-element
    (128-byte) box rows; the engine saves, reads back, and a map reaching past its int8 tensor is
    refused when the file is read."""
    import copy

    from graphc.runtime.errors import EngineError
    from graphc.runtime.format import read_engine

    eng = graphc.compile(
        _rows_requant_model(300, 264, 400), target="cuda", arch=["sm_90"], cache_dir=str(tmp_path / "c")
    )
    (ln,) = [ln for s in eng.plan.steps for ln in s.launches if ln.family == "gemm_int8"]
    assert ln.params["path"] == "int8_tma" and ln.args[:2] == ["@tmap:0", "@tmap:1"]
    a, b = ln.params["tmaps"]
    assert (a["dtype"], a["dims"], a["strides"][0], a["box"]) == ("uint8", [400, 300, 1], 400, [128, 128, 1])
    assert (b["dtype"], b["dims"], b["box"][0]) == ("uint8", [400, 264, 1], 128)
    assert eng.plan.tensors[a["tensor"]].dtype == "int8" and eng.plan.tensors[b["tensor"]].dtype == "int8"
    eng.save(tmp_path / "ok.engine")
    read_engine(tmp_path / "ok.engine")
    good = copy.deepcopy(ln.params)
    ln.params["tmaps"][0]["dims"][1] += 1  # one row more than x has
    eng.save(tmp_path / "far.engine")
    with pytest.raises(EngineError, match="spans"):
        read_engine(tmp_path / "far.engine")
    ln.params = good


@pytest.mark.parametrize(
    ("m", "n", "k", "light", "want"),
    [
        (4096, 3072, 768, False, {"BN": 192, "PINGPONG": 1}),  # 3.9 tiles a CTA
        (4096, 2304, 768, False, {"BN": 192, "PINGPONG": 0}),  # 2.9: cooperative
        (4096, 768, 3072, False, {"BN": 192, "PINGPONG": 0}),
        (8192, 8192, 8192, False, {"BN": 192, "OVERLAP": 1}),  # K above the measured 3072
        (4096, 3072, 768, True, {"BN": 192, "OVERLAP": 1}),  # FP8: OVERLAP from two tiles a CTA
        (4096, 768, 3072, True, {"BN": 192, "PINGPONG": 0}),
    ],
)
def test_tma_heuristic_rules(m, n, k, light, want):
    """gemm_sm90.int8_heuristic follows the schedules measured on an H200 (see the rules there)."""
    from graphc.codegen.families.gemm_sm90 import int8_heuristic, int8_valid

    prob = Int8Problem(m, n, k, OperandLayout(m, k, 1, []), OperandLayout(n, k, 1, []), [], (m, n))
    p = int8_heuristic(prob, vec_ok=True, light_epilogue=light)
    assert {key: p.get(key, 0) for key in want} == want, p
    assert int8_valid(prob, p)
    assert not int8_heuristic(prob, vec_ok=False, light_epilogue=light).get("OVERLAP")


def test_tma_selection():
    """hopper_path: the TMA kernel for K-major operands with 16-byte rows and no patch matrix;
    otherwise the cp.async wgmma kernel."""
    from graphc.codegen.families.gemm_int8 import ConvPatches, hopper_path

    def prob(k: int, b_kcontig: bool = True, conv: bool = False) -> Int8Problem:
        b = OperandLayout(256, k, 1, []) if b_kcontig else OperandLayout(256, 1, 256, [])
        cp = ConvPatches(1, 4, (8, 8), (8, 8), (3, 3), (1, 1), (1, 1), (1, 1), 48) if conv else None
        return Int8Problem(512, 256, k, OperandLayout(512, k, 1, []), b, [], (512, 256), conv=cp)

    assert hopper_path(prob(768)) == "tma"
    assert hopper_path(prob(64)) == "tma"  # K below one 128-byte stage row: zero-filled by TMA
    assert hopper_path(prob(200)) == "wgmma"  # 200-byte rows: not 16-byte aligned
    assert hopper_path(prob(768, b_kcontig=False)) == "wgmma"
    assert hopper_path(prob(768, conv=True)) == "wgmma"


# ---- QDQ models ---------------------------------------------------------------------------------


def symmetric_qdq_model(batch: int = 4) -> helper.ModelProto:
    """PyTorch-style symmetric QDQ: int8 activations (zero point 0), per-channel int8 weights:
    Q/DQ(x) -> Conv(DQ(w1)) + b -> Relu -> Flatten -> Q/DQ -> MatMul(DQ(w2)) -> y."""
    n = helper.make_node
    w1 = RNG.integers(-127, 128, (8, 3, 3, 3)).astype(np.int8)
    w2 = RNG.integers(-127, 128, (8 * 6 * 6, 10)).astype(np.int8)
    inits = [
        numpy_helper.from_array(w1, "w1q"),
        numpy_helper.from_array(RNG.uniform(1e-3, 3e-3, 8).astype(np.float32), "w1s"),
        numpy_helper.from_array(RNG.standard_normal(8).astype(np.float32) * 0.1, "b1"),
        numpy_helper.from_array(w2, "w2q"),
        numpy_helper.from_array(RNG.uniform(1e-3, 3e-3, 10).astype(np.float32), "w2s"),
        numpy_helper.from_array(np.array(0.02, np.float32), "xs"),
        numpy_helper.from_array(np.array(0.01, np.float32), "hs"),
        numpy_helper.from_array(np.array(0, np.int8), "zp"),
    ]
    nodes = [
        n("QuantizeLinear", ["x", "xs", "zp"], ["xq"]),
        n("DequantizeLinear", ["xq", "xs", "zp"], ["xd"]),
        n("DequantizeLinear", ["w1q", "w1s"], ["w1"], axis=0),
        n("Conv", ["xd", "w1", "b1"], ["c1"], name="conv"),
        n("Relu", ["c1"], ["r1"]),
        n("Flatten", ["r1"], ["f"]),
        n("QuantizeLinear", ["f", "hs", "zp"], ["hq"]),
        n("DequantizeLinear", ["hq", "hs", "zp"], ["hd"]),
        n("DequantizeLinear", ["w2q", "w2s"], ["w2"], axis=1),
        n("MatMul", ["hd", "w2"], ["y"], name="mm"),
    ]
    g = helper.make_graph(
        nodes,
        "qdq",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 10])],
        inits,
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@needs_nvrtc
def test_symmetric_qdq_model_uses_the_int8_kernels():
    eng = graphc.compile(symmetric_qdq_model(), target="cuda", precision="int8", arch=["sm_80"])
    gemms = [s.name for s in eng.plan.steps if any(ln.family == "gemm_int8" for ln in s.launches)]
    assert len(gemms) == 2, [(s.name, s.op) for s in eng.plan.steps]
    assert eng.report["quantization"]["integer_ops"] == {"ConvInteger": 2}


@needs_nvrtc
def test_uint8_qdq_ops_stay_float_on_cuda(tmp_path, caplog):
    """ONNX Runtime's QDQ (uint8 activations with zero points): no int8 CUDA kernel takes a zero
    point, so those ops keep their Q/DQ arithmetic in float, each one logged."""
    pytest.importorskip("onnxruntime.quantization")
    from helpers import quantize_zoo_model

    q, feeds = quantize_zoo_model("resnet", tmp_path)
    with caplog.at_level("INFO", logger="graphc.passes.quantize_int8"):
        eng = graphc.compile(q, target="cuda", precision="int8", shapes={k: v.shape for k, v in feeds.items()},
                             arch=["sm_80"])  # fmt: skip
    assert not any(ln.family == "gemm_int8" for s in eng.plan.steps for ln in s.launches)
    assert sum("stays float on cuda" in r.getMessage() for r in caplog.records) >= 10
