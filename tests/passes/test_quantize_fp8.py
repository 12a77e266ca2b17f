"""quantize_fp8: MatMul/Gemm as FP8 E4M3 GEMMs (graphc.MatMulFp8), the rest fp16, on the CPU target.

The CPU engine runs the arithmetic the CUDA engine runs (e4m3 operands rounded to nearest even and
saturated, products summed in float32, the dequantize scale, an fp16 epilogue), so these check it
against numpy: a residual MLP's engine bit for bit against a numpy emulation written out here; in a
tiny BERT every fp8 GEMM's quantized input and output against numpy on the tensors the graph
computes; whole engines (MLP, BERT) against ONNX Runtime fp32 by cosine."""

from __future__ import annotations

import logging

import ml_dtypes
import numpy as np
import onnxruntime as ort
import pytest

import graphc
import models
from graphc.errors import CompileError
from graphc.interpreter import interpret
from graphc.ir.shapes import bind_shapes
from graphc.passes.manager import OptimizeOptions, optimize
from graphc.passes.quantize_fp8 import activation_scale, quantize_weight_fp8
from graphc.passes.target import Target
from helpers import residual_mlp_model, run_ort

RNG = np.random.default_rng(0)
F16, E4M3 = np.float16, ml_dtypes.float8_e4m3fn


def _cos(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def _q(x16: np.ndarray, s: np.float32) -> np.ndarray:
    """fp16 x / fp16 s (rounded to fp16) -> e4m3, saturating: what the engine's quantize computes."""
    d = (x16.astype(np.float32) / np.float32(F16(s))).astype(F16)
    return np.clip(d.astype(np.float32), -448.0, 448.0).astype(E4M3)


def _gemm(xq: np.ndarray, w_kn: np.ndarray, s_x: np.float32) -> np.ndarray:
    wq, s_w = quantize_weight_fp8(w_kn.T)
    alpha = np.float32(np.float64(s_x) * np.float64(s_w))
    return (np.matmul(xq.astype(np.float32), wq.astype(np.float32).T) * alpha).astype(F16)


def _add16(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a.astype(np.float32) + b.astype(F16).astype(np.float32)).astype(F16)


def test_weight_and_activation_scales():
    w = RNG.standard_normal((64, 32)).astype(np.float32)
    wq, s = quantize_weight_fp8(w)
    assert wq.dtype == E4M3 and s == np.float32(np.abs(w).max() / 448)
    assert float(np.abs(wq.astype(np.float32)).max()) == 448.0  # the largest weight at the top of the range
    np.testing.assert_array_equal(wq, (w / s).astype(E4M3))  # ml_dtypes: round to nearest even
    for amax in (4.49, 1e-3, 1e-9):
        s_x = activation_scale(amax)
        assert s_x == np.float32(F16(s_x)) and s_x >= amax / 448  # an fp16 value, never below amax / 448
        assert s_x > 0
    assert activation_scale(4.49) <= np.float32(4.49 / 448) * (1 + 2**-10)


def test_mlp_engine_equals_numpy_emulation_bit_for_bit():
    m, w = residual_mlp_model(32, 64, 128, RNG)
    samples = [{"x": RNG.standard_normal((32, 64)).astype(np.float32)} for _ in range(4)]
    e = graphc.compile(m, target="cpu", precision="fp8", calibration_data=samples, verify=True)
    q = e.report["quantization"]
    assert q["method"] == "minmax" and q["fp8_gemms"] == 2 and q["fp16_convs"] == []
    # the second GEMM's input is quantized in the first one's epilogue; the model input by a kernel of its own
    assert q["activation_quantize"] == {"in_producer_epilogue": 1, "own_kernel": 1}
    assert q["tensors"]["x"]["amax"] == max(float(np.abs(s["x"]).max()) for s in samples)  # minmax
    x = RNG.standard_normal((32, 64)).astype(np.float32) * 1.5  # beyond the calibrated range: saturates
    y = e.run({"x": x})["y"]
    s1, s2 = (activation_scale(q["tensors"][n]["amax"]) for n in ("x", "v"))
    h = x.astype(F16)
    v = np.maximum(_add16(_gemm(_q(h, s1), w["w1"], s1), w["b1"]), F16(0))
    want = (_gemm(_q(v, s2), w["w2"], s2).astype(np.float32) + h.astype(np.float32)).astype(F16)
    np.testing.assert_array_equal(y, want.astype(np.float32))
    ref = run_ort(m, {"x": x})["y"]
    assert _cos(y, ref) >= 0.999


def _fp8_graph(model, shapes, samples, opt_level: int):
    from graphc.calibrate import make_calibrator
    from graphc.frontend import load_onnx

    g = bind_shapes(load_onnx(model), shapes)
    cal = make_calibrator(samples, [v.name for v in g.inputs], "minmax", 99.99, None, None)
    target = Target("cpu", "fp8", calibrator=cal)
    return optimize(g, OptimizeOptions(opt_level=opt_level, verify=True, target=target)).graph


def test_tiny_bert_every_fp8_gemm_against_numpy():
    """Unfused (opt level 1, the attention kept as MatMuls): every weight MatMul became MatMulFp8,
    its input e4m3 is the fp16 tensor / scale rounded as ml_dtypes rounds, its output the fp32 sum
    of the e4m3 products times alpha in fp16; the attention's activation x activation MatMuls stay
    fp16."""
    m = models.build("bert", size="tiny")
    samples = [models.sample_inputs("bert", m, seed=i) for i in range(4)]
    test = models.sample_inputs("bert", m, seed=100)
    g = _fp8_graph(m, {k: v.shape for k, v in test.items()}, samples, opt_level=1)
    fp8 = [n for n in g.nodes if n.op == "MatMulFp8"]
    assert len(fp8) == 12  # 2 layers x (Q, K, V, output, two FFN)
    assert all(n.outputs[0].ttype.dtype.name == "float16" for n in fp8)
    plain = [n for n in g.nodes if n.op == "MatMul" and not n.domain]
    assert len(plain) == 4 and all(n.outputs[0].ttype.dtype.name == "float16" for n in plain)
    casts = {n.outputs[0].name: n for n in g.nodes if n.op == "Cast" and n.attrs.to == 17}  # FLOAT8E4M3FN
    divs = {n.outputs[0].name: n for n in g.nodes if n.op == "Div"}
    keep = []
    for n in fp8:
        cast = casts[n.inputs[0].name]
        div = divs[cast.inputs[0].name]
        keep += [n.inputs[0].name, n.outputs[0].name, div.inputs[0].name]
    env = interpret(g, test, keep=tuple(keep))
    for n in fp8:
        div = divs[casts[n.inputs[0].name].inputs[0].name]
        s = g.const(div.inputs[1].name)
        x16 = env[div.inputs[0].name]
        np.testing.assert_array_equal(env[n.inputs[0].name], _q(x16, np.float32(s)))
        wq = g.const(n.inputs[1].name)
        a = env[n.inputs[0].name].astype(np.float32).reshape(-1, wq.shape[1])
        want = (np.matmul(a, wq.astype(np.float32).T) * np.float32(n.attrs.alpha)).astype(F16)
        np.testing.assert_array_equal(env[n.outputs[0].name].reshape(want.shape), want)


@pytest.mark.parametrize("name", ["mlp", "bert"])
def test_zoo_fp8_engine_cosine_to_onnxruntime_fp32(name, tmp_path):
    m = models.build(name, size="tiny")
    samples = [models.sample_inputs(name, m, seed=i) for i in range(8)]
    test = models.sample_inputs(name, m, seed=1000)
    e = graphc.compile(
        m, target="cpu", precision="fp8", calibration_data=samples, shapes={k: v.shape for k, v in test.items()}
    )
    assert e.report["quantization"]["fp8_gemms"] == (12 if name == "bert" else 3)
    e.save(tmp_path / "m.engine")  # the e4m3 weights through the engine file
    loaded = graphc.runtime.load(tmp_path / "m.engine", device="cpu")
    ref = ort.InferenceSession(m.SerializeToString()).run(None, test)
    out = list(loaded.run(test).values())
    for a, b in zip(out, ref, strict=True):
        assert _cos(a, b) >= 0.99, (name, _cos(a, b))
    # and fp8 is a real change from fp16: the outputs differ beyond fp16 rounding
    e16 = graphc.compile(m, target="cpu", precision="fp16", shapes={k: v.shape for k, v in test.items()})
    assert not np.allclose(list(e16.run(test).values())[0], out[0], rtol=1e-3, atol=1e-3)


def test_conv_stays_fp16_and_is_reported(caplog):
    m = models.build("resnet", size="tiny")
    samples = [models.sample_inputs("resnet", m, seed=i) for i in range(2)]
    test = models.sample_inputs("resnet", m, seed=5)
    with caplog.at_level(logging.INFO, logger="graphc.passes.quantize_fp8"):
        e = graphc.compile(
            m, target="cpu", precision="fp8", calibration_data=samples, shapes={k: v.shape for k, v in test.items()}
        )
    q = e.report["quantization"]
    assert len(q["fp16_convs"]) >= 10 and q["fp8_gemms"] == 1  # the classifier's Gemm
    assert "stays fp16 (no FP8 convolution kernel)" in caplog.text
    ref = ort.InferenceSession(m.SerializeToString()).run(None, test)[0]
    assert _cos(list(e.run(test).values())[0], ref) >= 0.99


def test_refusals_are_one_line():
    m, _ = residual_mlp_model(16, 32, 64, RNG)
    with pytest.raises(CompileError, match="precision fp8 needs calibration_data") as ei:
        graphc.compile(m, target="cpu", precision="fp8")
    assert "\n" not in str(ei.value)
    feeds = [{"x": RNG.standard_normal((16, 32)).astype(np.float32)}]
    for arch, why in (("sm_80", "no FP8 tensor cores"), ("sm_89", "graphc's FP8 GEMM is the sm_90a wgmma")):
        with pytest.raises(CompileError, match=f"arch {arch} .*{why}") as ei:
            graphc.compile(m, target="cuda", precision="fp8", calibration_data=feeds, arch=["sm_90", arch])
        assert "\n" not in str(ei.value)
    with pytest.raises(CompileError, match="only with precision int8"):
        graphc.compile(m, target="cpu", precision="fp8", calibration_data=feeds, accuracy="cosine:0.99")


def test_cli_compiles_an_fp8_engine(tmp_path, capsys):
    from graphc.cli import main

    m, _ = residual_mlp_model(16, 32, 64, RNG)
    src = tmp_path / "m.onnx"
    src.write_bytes(m.SerializeToString())
    calib = tmp_path / "calib.npz"
    np.savez(calib, x=RNG.standard_normal((4, 16, 32)).astype(np.float32))
    out = tmp_path / "m.engine"
    args = ["compile", str(src), "-o", str(out), "--precision", "fp8", "--calibration-data", str(calib), "-q"]
    rc = main([*args, "--target", "cpu"])
    assert rc in (0, None) and out.is_file()
    e = graphc.runtime.load(out, device="cpu")
    assert e.build_info["precision"] == "fp8"
    x = RNG.standard_normal((16, 32)).astype(np.float32)
    assert _cos(e.run({"x": x})["y"], run_ort(m, {"x": x})["y"]) >= 0.999
    # an fp8 CUDA engine for a pre-Hopper arch: refused in one line naming it
    capsys.readouterr()
    assert main([*args, "--target", "cuda", "--arch", "sm_86"]) not in (0, None)
    err = capsys.readouterr().err.strip().splitlines()
    assert any("arch sm_86 has no FP8 tensor cores" in ln for ln in err), err
