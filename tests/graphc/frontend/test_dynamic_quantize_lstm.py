"""com.microsoft.DynamicQuantizeLSTM against ONNX Runtime's CPU kernel: 8-bit weights (int8 and
uint8, per-direction and per-column scales, zero points), both directions, initial states,
peepholes; X and each step's h are quantized per tensor as ORT does, so the match is tight."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import graphc
from helpers import run_graphc, run_ort

F = TensorProto.FLOAT


def _zero_points(rng, wdt, d: int, shape: tuple) -> np.ndarray:
    """One zero point per direction (ORT requires a per-column zero point to be the same in every
    column, and 0 for int8 weights), broadcast to the scales' shape."""
    per_dir = np.zeros(d, np.int64) if wdt == np.int8 else rng.integers(120, 136, (d,))
    return np.broadcast_to(per_dir.reshape((d,) + (1,) * (len(shape) - 1)), shape).astype(wdt)


def _model(direction: str, wdt, per_column: bool, extras: bool, seq=5, batch=2, isz=6, hs=4, seed=0):
    rng = np.random.default_rng(seed)
    d = 2 if direction == "bidirectional" else 1
    # int8 weights in 7 bits: ORT's x86 kernel for uint8 X times int8 W on AVX2 without VNNI sums
    # pairs of products in saturating int16 (vpmaddubsw), so 8-bit weights are not computed exactly
    # there (max |x0*w0 + x1*w1| = 2*255*128 > 32767); ORT's quantizer writes 7-bit weights on x86
    # (reduce_range) for that reason. With |w| <= 64 the sums fit, and ORT is exact on every CPU.
    lo, hi = (-64, 64) if wdt == np.int8 else (0, 256)
    sshape = (d, 4 * hs) if per_column else (d,)
    inits = {
        "W": rng.integers(lo, hi, (d, isz, 4 * hs)).astype(wdt),
        "R": rng.integers(lo, hi, (d, hs, 4 * hs)).astype(wdt),
        "B": (rng.standard_normal((d, 8 * hs)) * 0.3).astype(np.float32),
        "ws": (rng.uniform(0.002, 0.01, sshape)).astype(np.float32),
        "wz": _zero_points(rng, wdt, d, sshape),
        "rs": (rng.uniform(0.002, 0.01, sshape)).astype(np.float32),
        "rz": _zero_points(rng, wdt, d, sshape),
    }
    feeds = {"X": rng.standard_normal((seq, batch, isz)).astype(np.float32)}
    order = ["X", "W", "R", "B", "", "", "", "", "ws", "wz", "rs", "rz"]
    if extras:
        feeds["h0"] = (rng.standard_normal((d, batch, hs)) * 0.5).astype(np.float32)
        feeds["c0"] = (rng.standard_normal((d, batch, hs)) * 0.5).astype(np.float32)
        inits["P"] = (rng.standard_normal((d, 3 * hs)) * 0.2).astype(np.float32)
        order[5:8] = ["h0", "c0", "P"]
    node = helper.make_node(
        "DynamicQuantizeLSTM", order, ["Y", "Y_h", "Y_c"], domain="com.microsoft", hidden_size=hs, direction=direction
    )
    g = helper.make_graph(
        [node],
        "dqlstm",
        [helper.make_tensor_value_info(k, F, v.shape) for k, v in feeds.items()],
        [
            helper.make_tensor_value_info("Y", F, [seq, d, batch, hs]),
            helper.make_tensor_value_info("Y_h", F, [d, batch, hs]),
            helper.make_tensor_value_info("Y_c", F, [d, batch, hs]),
        ],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 8
    return m, feeds


@pytest.mark.parametrize(
    "direction,wdt,per_column,extras",
    [
        ("forward", np.int8, False, False),
        ("reverse", np.uint8, True, True),
        ("bidirectional", np.int8, True, True),
        ("bidirectional", np.uint8, False, False),
    ],
)
def test_dynamic_quantize_lstm_matches_onnx_runtime(direction, wdt, per_column, extras):
    model, feeds = _model(direction, wdt, per_column, extras)
    ref = run_ort(model, feeds)
    got = run_graphc(model, feeds)
    eng = graphc.compile(model, target="cpu").run(feeds)
    for k, r in ref.items():
        for out in (got, eng):
            # a float-only LSTM over the dequantized weights differs from ORT by ~6e-3 here;
            # this bound holds only with X and h quantized as ORT quantizes them
            np.testing.assert_allclose(out[k], r, rtol=0, atol=2e-5 * max(1.0, float(np.abs(r).max())), err_msg=k)


def test_activation_alpha_is_refused_in_one_line():
    model, _ = _model("forward", np.int8, False, False)
    model.graph.node[0].attribute.append(helper.make_attribute("activation_alpha", [0.5]))
    with pytest.raises(graphc.errors.GraphcError, match="DynamicQuantizeLSTM.*activation_alpha"):
        graphc.load_onnx(model)


def _lowered(model):
    """The graph the CUDA target runs: passes/lower_int_quant.py's unrolled, integer-valued form."""
    from graphc.ir.shapes import bind_shapes
    from graphc.passes.lower_int_quant import lower_int_quant

    fired: list[str] = []
    g = lower_int_quant(bind_shapes(graphc.load_onnx(model), None), fired=fired)
    assert fired and not any(n.op == "DynamicQuantizeLSTM" for n in g.nodes)
    return g


@pytest.mark.parametrize(
    "direction,wdt,per_column,extras",
    [("bidirectional", np.uint8, False, True), ("reverse", np.int8, True, False), ("forward", np.uint8, True, True)],
)
def test_cuda_lowering_matches_onnx_runtime(direction, wdt, per_column, extras):
    model, feeds = _model(direction, wdt, per_column, extras, seed=3)
    ref = run_ort(model, feeds)
    got = graphc.interpret(_lowered(model), feeds)
    for k, r in ref.items():
        # ORT's own quantization of X and h, in float32: the integer-valued GEMMs are exact here
        np.testing.assert_allclose(got[k], r, rtol=0, atol=2e-5 * max(1.0, float(np.abs(r).max())), err_msg=k)


def test_cuda_target_compiles_it():
    model, _ = _model("bidirectional", np.uint8, False, True)
    eng = graphc.compile(model, target="cuda", arch=["sm_90"])
    assert not any(s.op == "DynamicQuantizeLSTM" for s in eng.plan.steps)


def test_cuda_target_keeps_refusing_runtime_lengths():
    model, feeds = _model("forward", np.int8, False, False)
    node = model.graph.node[0]
    node.input[4] = "L"
    model.graph.input.append(helper.make_tensor_value_info("L", TensorProto.INT32, [2]))
    with pytest.raises(graphc.errors.GraphcError, match="DynamicQuantizeLSTM.*has no CUDA kernel"):
        graphc.compile(model, target="cuda", arch=["sm_90"])
