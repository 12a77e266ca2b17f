"""CUDA int8 engines against the CPU target's integer arithmetic (issue 13), on a GPU.

- The integer ops alone (MatMulInteger, ConvInteger: odd shapes, strides, pads, dilations, groups,
  the [K, N] byte-load path and the K-major cp.async path, an int32 bias in the epilogue): the int32
  results equal the CPU engine's exactly.
- A requantizing epilogue (bias, per-channel dequantize, Relu, QuantizeLinear to int8): within one
  LSB of the CPU's, and nearly all elements equal.
- Whole int8 engines (a ResNet-style CNN, a transformer MLP block) calibrated on the same samples:
  the same scales, and the outputs close to the CPU int8 engine's (an activation on a rounding
  boundary may requantize one step away on the GPU, where a * b + c contracts to one FMA).

Run on a GPU machine:  python -m pytest tests/codegen/test_gemm_int8_gpu.py -q
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import graphc

sys.path.insert(0, str(Path(__file__).parent))
from test_gemm_int8 import calibration, cnn_model, mlp_model, symmetric_qdq_model  # noqa: E402

pytestmark = pytest.mark.gpu
RNG = np.random.default_rng(1313)


@pytest.fixture(params=["default", "mma"])
def int8_path(request, monkeypatch):
    """The kernels an engine for this GPU gets ("default": on sm_90 the sm_90a TMA GEMM for K-major
    16-byte rows, the cp.async wgmma GEMM for the other operands it takes), or mma.sync everywhere
    (codegen/build.py with no Hopper-only archs)."""
    if request.param == "mma":
        import graphc.codegen.build as build

        monkeypatch.setattr(build, "HOPPER_ARCHS", ())
    return request.param


def _arch() -> list[str]:
    import cupy

    return [f"sm_{cupy.cuda.Device().compute_capability}"]


def _both(model, feeds, **kw):
    cpu = graphc.compile(model, target="cpu", **kw)
    gpu = graphc.compile(model, target="cuda", arch=_arch(), **kw)
    return cpu, gpu, cpu.run(feeds), gpu.run(feeds, to_numpy=True)


def _i8(shape) -> np.ndarray:
    return RNG.integers(-128, 128, shape).astype(np.int8)


def _model(nodes, x_shape, y_shape, inits, y_type=TensorProto.INT32, x_type=TensorProto.INT8):
    g = helper.make_graph(
        nodes,
        "t",
        [helper.make_tensor_value_info("x", x_type, list(x_shape))],
        [helper.make_tensor_value_info("y", y_type, list(y_shape))],
        inits,
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


MATMULS = [(1, 16, 8), (37, 100, 50), (300, 256, 200), (129, 768, 96)]


@pytest.mark.parametrize("m,k,n", MATMULS, ids=[f"{m}x{k}x{n}" for m, k, n in MATMULS])
@pytest.mark.parametrize("bias", [False, True])
def test_matmul_integer_is_exact(m, k, n, bias, int8_path):
    """[K, N] weights (the byte-load path), K not a multiple of 16 (byte loads of A too)."""
    inits = [numpy_helper.from_array(_i8((k, n)), "w")]
    nodes = [helper.make_node("MatMulInteger", ["x", "w"], ["acc" if bias else "y"])]
    if bias:
        inits.append(numpy_helper.from_array(RNG.integers(-(2**20), 2**20, n).astype(np.int32), "b"))
        nodes.append(helper.make_node("Add", ["acc", "b"], ["y"]))
    x = _i8((2, m, k))
    _, gpu, want, got = _both(_model(nodes, x.shape, (2, m, n), inits), {"x": x})
    assert any(ln.family == "gemm_int8" for s in gpu.plan.steps for ln in s.launches)
    assert got["y"].dtype == np.int32 and np.array_equal(got["y"], want["y"])


# (n, c, hw, co, kernel, stride, pad, dilation, group)
CONVS = [
    (2, 3, 17, 16, 7, 2, 3, 1, 1),  # a stem: K = 147, zero-padded patch rows
    (3, 16, 9, 32, 3, 1, 1, 1, 1),
    (1, 32, 8, 64, 1, 2, 0, 1, 1),
    (2, 8, 10, 8, 3, 1, 2, 2, 2),  # dilated and grouped
    (1, 8, 6, 8, 3, 1, 1, 1, 8),  # depthwise
    (96, 64, 1, 48, 1, 1, 0, 1, 1),  # rows [M, K, 1, 1]: the K-major pointwise GEMM of an int8 MatMul
]


@pytest.mark.parametrize("case", CONVS, ids=[f"conv{i}" for i in range(len(CONVS))])
def test_conv_integer_is_exact(case, int8_path):
    n, c, hw, co, k, s, p, d, g = case
    x = _i8((n, c, hw, hw))
    w = _i8((co, c // g, k, k))
    o = (hw + 2 * p - d * (k - 1) - 1) // s + 1
    bias = RNG.integers(-(2**16), 2**16, (co, 1, 1)).astype(np.int32)
    nodes = [
        helper.make_node("ConvInteger", ["x", "w"], ["acc"], strides=[s, s], pads=[p] * 4, dilations=[d, d], group=g),
        helper.make_node("Add", ["acc", "b"], ["y"]),
    ]
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(bias, "b")]
    _, _, want, got = _both(_model(nodes, x.shape, (n, co, o, o), inits), {"x": x})
    assert got["y"].dtype == np.int32 and np.array_equal(got["y"], want["y"])


def test_requantize_epilogue_within_one_lsb(int8_path):
    """ConvInteger -> + bias -> * per-channel scale -> Relu -> QuantizeLinear: int8 out."""
    n, c, hw, co = 4, 32, 14, 64
    x = _i8((n, c, hw, hw))
    inits = [
        numpy_helper.from_array(_i8((co, c, 3, 3)), "w"),
        numpy_helper.from_array(RNG.integers(-3000, 3000, (co, 1, 1)).astype(np.int32), "b"),
        numpy_helper.from_array(RNG.uniform(1e-4, 3e-4, (1, co, 1, 1)).astype(np.float32), "s"),
        numpy_helper.from_array(np.array(0.05, np.float32), "ys"),
        numpy_helper.from_array(np.array(0, np.int8), "yz"),
    ]
    nodes = [
        helper.make_node("ConvInteger", ["x", "w"], ["acc"], pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["acc", "b"], ["a1"]),
        helper.make_node("Cast", ["a1"], ["f"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["f", "s"], ["d"]),
        helper.make_node("Relu", ["d"], ["r"]),
        helper.make_node("QuantizeLinear", ["r", "ys", "yz"], ["y"]),
    ]
    model = _model(nodes, x.shape, (n, co, hw, hw), inits, y_type=TensorProto.INT8)
    _, gpu, want, got = _both(model, {"x": x})
    fused = [s for s in gpu.plan.steps if s.op == "Fused"]
    assert len(fused) == 1  # the whole chain is the int8 GEMM's epilogue
    diff = np.abs(got["y"].astype(np.int32) - want["y"].astype(np.int32))
    assert got["y"].dtype == np.int8 and diff.max() <= 1 and (diff == 0).mean() > 0.999, (diff.max(), diff.mean())
    assert len(np.unique(want["y"])) > 50  # the scales put the values across the int8 range


def _cos(a, b) -> float:
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.mark.parametrize("which", ["cnn", "mlp"])
def test_int8_engine_matches_cpu_int8_engine(which, int8_path):
    model = cnn_model(batch=4) if which == "cnn" else mlp_model(batch=4)
    calib = calibration(model, 8)
    feeds = calibration(model, 1)[0]
    cpu, gpu, want, got = _both(model, feeds, precision="int8", calibration_data=calib)
    assert cpu.report["quantization"]["tensors"] == gpu.report["quantization"]["tensors"]
    ref, out = np.asarray(want["y"], np.float64), np.asarray(got["y"], np.float64)
    scale = float(np.abs(ref).max())
    assert np.isfinite(out).all()
    assert _cos(out, ref) > 0.9999, _cos(out, ref)
    assert np.abs(out - ref).max() <= 0.02 * scale, (np.abs(out - ref).max(), scale)
    # and the int8 engine is still the float model (cosine to the fp32 CPU engine)
    fp32 = graphc.compile(model, target="cpu").run(feeds)["y"]
    assert _cos(out, fp32) > 0.99


@pytest.mark.parametrize("name", ["resnet", "mobilenetv2", "bert", "vit"])
def test_zoo_int8_engine_matches_cpu_int8_engine(name):
    """The tiny zoo models as int8 engines (calibrated on the same 4 samples): CUDA against CPU."""
    import models

    m = models.build(name, size="tiny")
    calib = [models.sample_inputs(name, m, seed=i) for i in range(4)]
    feeds = models.sample_inputs(name, m, seed=11)
    shapes = {k: v.shape for k, v in feeds.items()}
    cpu, gpu, want, got = _both(m, feeds, precision="int8", calibration_data=calib, shapes=shapes)
    assert cpu.report["quantization"]["tensors"] == gpu.report["quantization"]["tensors"]
    assert sum(gpu.report["quantization"]["integer_ops"].values()) >= 10
    for k, ref in want.items():
        ref, out = np.asarray(ref, np.float64), np.asarray(got[k], np.float64)
        scale = float(np.abs(ref).max())
        assert np.isfinite(out).all()
        assert _cos(out, ref) > 0.9995, (k, _cos(out, ref))
        assert np.abs(out - ref).max() <= 0.05 * scale, (k, np.abs(out - ref).max(), scale)


def test_symmetric_qdq_model_matches_cpu(int8_path):
    """A QDQ model's own scales through the int8 kernels: against the CPU int8 engine, and against
    the QDQ semantics in float (the fp32 CPU engine emulates the quantization)."""
    model = symmetric_qdq_model()
    feeds = {"x": RNG.standard_normal((4, 3, 8, 8)).astype(np.float32)}
    _, gpu, want, got = _both(model, feeds, precision="int8")
    assert sum(gpu.report["quantization"]["integer_ops"].values()) == 2
    ref, out = np.asarray(want["y"], np.float64), np.asarray(got["y"], np.float64)
    scale = float(np.abs(ref).max())
    assert _cos(out, ref) > 0.99999 and np.abs(out - ref).max() <= 0.01 * scale
    emulated = graphc.compile(model, target="cpu").run(feeds)["y"]
    assert _cos(out, emulated) > 0.9999


TILES = [
    {"path": "wgmma", "BM": 128, "BN": 128, "STAGES": 3},
    {"path": "wgmma", "BM": 128, "BN": 256, "STAGES": 4},
    {"path": "wgmma", "BM": 64, "BN": 256, "STAGES": 3},
    {"path": "mma", "BM": 128, "BN": 256, "BK": 64, "WM": 2, "WN": 4, "STAGES": 3},
    {"path": "mma", "BM": 32, "BN": 64, "BK": 128, "WM": 1, "WN": 2, "STAGES": 2},
]


@pytest.mark.parametrize("tile", TILES, ids=[f"{t['path']}{t['BM']}x{t['BN']}s{t['STAGES']}" for t in TILES])
def test_forced_tiles_are_exact(tile, monkeypatch):
    """Every tile shape the heuristics pick (two warpgroups, BN 256, short pipelines) on a
    K-major pointwise GEMM with ragged edges: int32 results equal the CPU engine's."""
    import graphc.codegen.build as build
    from graphc.codegen.families import gemm_int8

    orig = gemm_int8.heuristic
    monkeypatch.setattr(
        gemm_int8,
        "heuristic",
        lambda prob, path="mma": dict(tile, _eff=1.0) if path == tile["path"] else orig(prob, path),
    )
    if tile["path"] == "mma":
        monkeypatch.setattr(build, "HOPPER_ARCHS", ())
    else:  # the cp.async wgmma kernel, not the TMA one the sm_90 engine takes for these operands
        monkeypatch.setattr(gemm_int8, "hopper_path", lambda prob: "wgmma")
    m, k, n = 333, 384, 300
    x = _i8((m, k, 1, 1))
    inits = [numpy_helper.from_array(_i8((n, k, 1, 1)), "w")]
    model = _model([helper.make_node("ConvInteger", ["x", "w"], ["y"])], x.shape, (m, n, 1, 1), inits)
    _, gpu, want, got = _both(model, {"x": x})
    used = [ln.params for s in gpu.plan.steps for ln in s.launches if ln.family == "gemm_int8"]
    assert used and used[0]["BM"] == tile["BM"] and used[0]["path"] == f"int8_{tile['path']}", used
    assert np.array_equal(got["y"], want["y"])


# ---- the TMA kernel (gemm_sm90.generate_int8) ----------------------------------------------------

# (M, N, K): ragged M, N and K tails; K below one 128-byte stage row; a K-heavy and a BERT-sized one
TMA_SHAPES = [(333, 300, 384), (48, 256, 64), (1000, 520, 272), (130, 136, 2064), (4096, 3072, 768)]
# forced schedules: cooperative at each tile width, OVERLAP, ping-pong, the per-warp epilogue, the
# element-wise and the in-register (2-column) epilogues
TMA_VARIANTS = [
    {},
    {"BN": 128},
    {"BN": 192},
    {"BN": 256},
    {"BN": 128, "OVERLAP": 1},
    {"BN": 192, "OVERLAP": 1},
    {"BN": 128, "PINGPONG": 1},
    {"BN": 192, "PINGPONG": 1},
    {"BN": 256, "WARP_EPI": 1},
    {"BN": 128, "VEC_EPI": 0},
    {"BN": 256, "VEC_EPI": 2, "STAGES": 3},
    {"BN": 192, "OVERLAP": 1, "FAST_DIV": 0},
]


def _force_tma(monkeypatch, forced: dict) -> None:
    """Every int8 TMA GEMM of the next compiles with `forced` merged into its parameters."""
    from graphc.codegen.families import gemm_sm90

    orig = gemm_sm90.generate_int8
    monkeypatch.setattr(
        gemm_sm90, "generate_int8", lambda ctx, prob, params=None: orig(ctx, prob, {**(params or {}), **forced})
    )


def _rows_model(m: int, n: int, k: int, requant: bool):
    """x [M, K, 1, 1] . w [N, K, 1, 1] + bias: int32 out, or (requant) dequantized per channel,
    Relu, QuantizeLinear to int8 (the int8 layer's epilogue)."""
    inits = [
        numpy_helper.from_array(_i8((n, k, 1, 1)), "w"),
        numpy_helper.from_array(RNG.integers(-(2**16), 2**16, (n, 1, 1)).astype(np.int32), "b"),
    ]
    nodes = [
        helper.make_node("ConvInteger", ["x", "w"], ["acc"]),
        helper.make_node("Add", ["acc", "b"], ["a1" if requant else "y"]),
    ]
    if requant:
        inits += [
            numpy_helper.from_array((RNG.uniform(0.5, 1.5, (1, n, 1, 1)) * 4e-4 / np.sqrt(k)).astype(np.float32), "s"),
            numpy_helper.from_array(np.array(0.05, np.float32), "ys"),
            numpy_helper.from_array(np.array(0, np.int8), "yz"),
        ]
        nodes += [
            helper.make_node("Cast", ["a1"], ["f"], to=TensorProto.FLOAT),
            helper.make_node("Mul", ["f", "s"], ["d"]),
            helper.make_node("Relu", ["d"], ["r"]),
            helper.make_node("QuantizeLinear", ["r", "ys", "yz"], ["y"]),
        ]
    y_type = TensorProto.INT8 if requant else TensorProto.INT32
    return _model(nodes, (m, k, 1, 1), (m, n, 1, 1), inits, y_type=y_type)


def _tma_cases():
    for i, shape in enumerate(TMA_SHAPES):
        for j, v in enumerate(TMA_VARIANTS):
            if (v.get("OVERLAP") or v.get("WARP_EPI")) and shape[1] % 8:
                continue  # those need the 8-column vector epilogue (N % 8 == 0)
            if (i + j) % 2 == 0 or not v or shape[0] == 333:  # every variant on the ragged shape, half elsewhere
                yield shape, v


TMA_CASES = list(_tma_cases())


@pytest.mark.parametrize(
    "shape,forced",
    TMA_CASES,
    ids=[f"{m}x{n}x{k}-" + ("-".join(f"{a}{b}" for a, b in v.items()) or "default") for (m, n, k), v in TMA_CASES],
)
def test_tma_gemm_is_exact(shape, forced, monkeypatch):
    """The int8 TMA GEMM (the default of an sm_90 engine where operands allow it) under every
    schedule: int32 sums + bias equal the CPU engine's; the requantized int8 within 1 LSB."""
    _force_tma(monkeypatch, forced)
    m, n, k = shape
    x = _i8((m, k, 1, 1))
    _, gpu, want, got = _both(_rows_model(m, n, k, requant=False), {"x": x})
    used = [ln.params for s in gpu.plan.steps for ln in s.launches if ln.family == "gemm_int8"]
    assert used and used[0]["path"] == "int8_tma", used
    for key, v in forced.items():
        assert used[0].get(key) == v or (key == "VEC_EPI" and n % 8), (key, used[0])
    assert got["y"].dtype == np.int32 and np.array_equal(got["y"], want["y"])
    _, gpu, want, got = _both(_rows_model(m, n, k, requant=True), {"x": x})
    diff = np.abs(got["y"].astype(np.int32) - want["y"].astype(np.int32))
    assert got["y"].dtype == np.int8 and diff.max() <= 1 and (diff == 0).mean() > 0.999, (diff.max(), diff.mean())
    assert len(np.unique(want["y"])) > 50


@pytest.mark.parametrize("scale", [2e-4, 1e30, 1e-25, "mixed"])
def test_fast_division_matches_the_cpu(scale):
    """The vector epilogue divides by a constant through gc_div_const, and redoes a group of 8 with
    the IEEE division where a dividend leaves [2^-64, 2^64] (huge and tiny scales; "mixed": channels
    of all three, so some groups take the fallback): the float32 quotients equal the CPU's bit for bit."""
    m, n, k = 512, 256, 384
    if scale == "mixed":
        s = np.array([2e-4, 1e30, 1e-25, 1.0], np.float32)[RNG.integers(0, 4, n)]
    else:
        s = np.full(n, scale, np.float32)
    inits = [
        numpy_helper.from_array(_i8((n, k, 1, 1)), "w"),
        numpy_helper.from_array(s.reshape(1, n, 1, 1), "s"),
        numpy_helper.from_array(np.array(3.0, np.float32), "c"),
    ]
    nodes = [
        helper.make_node("ConvInteger", ["x", "w"], ["acc"]),
        helper.make_node("Cast", ["acc"], ["f"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["f", "s"], ["d"]),
        helper.make_node("Div", ["d", "c"], ["y"]),
    ]
    model = _model(nodes, (m, k, 1, 1), (m, n, 1, 1), inits, y_type=TensorProto.FLOAT)
    _, gpu, want, got = _both(model, {"x": _i8((m, k, 1, 1))})
    used = [ln.params for s in gpu.plan.steps for ln in s.launches if ln.family == "gemm_int8"]
    assert used and used[0]["path"] == "int8_tma" and used[0]["FAST_DIV"] == 1, used
    assert got["y"].dtype == np.float32 and np.array_equal(got["y"], want["y"])
