"""lower_int_quant (CUDA target): DynamicQuantizeLinear's run-time-scale QuantizeLinear and
ConvInteger / MatMulInteger with zero points (uint8 and int8, per-tensor and per-channel weight
zero points, constant and run-time weights) become float ops that give ONNX Runtime's integers
exactly (checked through the interpreter on the lowered graph, and on the CPU engine); the CUDA
compile then succeeds (NVRTC, no GPU); a QuantizeLinear it cannot lower keeps its error.
(DynamicQuantizeLSTM: tests/graphc/frontend/test_dynamic_quantize_lstm.py.)"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import graphc
from graphc.ir.shapes import bind_shapes
from graphc.passes.lower_int_quant import lower_int_quant
from helpers import INT8_EXACT_HI, INT8_EXACT_LO, run_ort

F, U8, I8 = TensorProto.FLOAT, TensorProto.UINT8, TensorProto.INT8


def _model(nodes, inputs, outputs, inits) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "q", inputs, outputs, [numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 19)])
    m.ir_version = 9
    return m


def _conv_model(wdt, per_channel: bool, weight_input: bool, group: int = 1):
    rng = np.random.default_rng(7)
    c, co = 4, 6
    lo, hi = (-128, 128) if wdt == np.int8 else (0, 256)
    w = rng.integers(lo, hi, (co, c // group, 3, 3)).astype(wdt)
    wz = rng.integers(-20, 20, (co,)) + (0 if wdt == np.int8 else 128)
    wz = wz.astype(wdt) if per_channel else wz[:1].reshape(()).astype(wdt)
    feeds = {"x": (rng.standard_normal((1, c, 7, 9)) * 3).astype(np.float32)}
    inits = {"wz": wz}
    (feeds if weight_input else inits)["w"] = w
    nodes = [
        helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"]),
        helper.make_node("ConvInteger", ["xq", "w", "xz", "wz"], ["y"], pads=[1, 0, 1, 2], strides=[1, 2], group=group),
    ]
    ins = [helper.make_tensor_value_info("x", F, feeds["x"].shape)]
    if weight_input:
        ins.append(helper.make_tensor_value_info("w", U8 if wdt == np.uint8 else I8, w.shape))
    outs = [
        helper.make_tensor_value_info("y", TensorProto.INT32, [1, co, 7, 5]),
        helper.make_tensor_value_info("xq", U8, [1, c, 7, 9]),
        helper.make_tensor_value_info("xs", F, []),
        helper.make_tensor_value_info("xz", U8, []),
    ]
    return _model(nodes, ins, outs, inits), feeds


def _matmul_model(wdt, per_column: bool):
    rng = np.random.default_rng(11)
    # int8: 7-bit values, which ORT's u8 x s8 kernel sums exactly on every x86 CPU (helpers.py)
    lo, hi = (INT8_EXACT_LO, INT8_EXACT_HI) if wdt == np.int8 else (0, 256)
    b = rng.integers(lo, hi, (40, 24)).astype(wdt)
    bz = (rng.integers(-9, 9, (24,)) + (0 if wdt == np.int8 else 128)).astype(wdt)
    bz = bz if per_column else bz[:1].reshape(())
    feeds = {"a": rng.standard_normal((3, 5, 40)).astype(np.float32)}
    nodes = [
        helper.make_node("DynamicQuantizeLinear", ["a"], ["aq", "as", "az"]),
        helper.make_node("MatMulInteger", ["aq", "b", "az", "bz"], ["y"]),
    ]
    outs = [helper.make_tensor_value_info("y", TensorProto.INT32, [3, 5, 24])]
    return _model(nodes, [helper.make_tensor_value_info("a", F, [3, 5, 40])], outs, {"b": b, "bz": bz}), feeds


def _float_conv(xq, xz, w, wz, conv: onnx.NodeProto) -> np.ndarray:
    """ConvInteger by its definition, conv((x - x_zp), (w - w_zp)), as ONNX Runtime's float32 Conv
    (exact: |sum| <= 36 * 255 * 256 < 2^24 here): the oracle where ORT's ConvInteger refuses
    per-channel zero points."""
    wz = wz.reshape((-1,) + (1,) * (w.ndim - 1)) if wz.ndim == 1 else wz
    xd = xq.astype(np.float32) - xz.astype(np.float32)
    wd = w.astype(np.float32) - wz.astype(np.float32)
    node = helper.make_node("Conv", ["X", "W"], ["Y"])
    node.attribute.extend(conv.attribute)
    ins = [helper.make_tensor_value_info("X", F, xd.shape), helper.make_tensor_value_info("W", F, wd.shape)]
    m = _model([node], ins, [helper.make_tensor_value_info("Y", F, None)], {})
    y = run_ort(m, {"X": xd, "W": wd})["Y"]
    assert np.array_equal(y, np.round(y))
    return y.astype(np.int32)


def _reference(m: onnx.ModelProto, feeds: dict) -> dict:
    conv = [n for n in m.graph.node if n.op_type == "ConvInteger"]
    wz = {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}.get("wz")
    if not conv or wz is None or wz.ndim == 0:
        return run_ort(m, feeds)
    # per-channel weight zero points: ORT quantizes X (its own DynamicQuantizeLinear), the conv by definition
    q = onnx.ModelProto()
    q.CopyFrom(m)
    del q.graph.node[1:]
    del q.graph.output[0]
    ref = run_ort(q, feeds)
    w = feeds["w"] if "w" in feeds else {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}["w"]
    ref["y"] = _float_conv(ref["xq"], ref["xz"], w, wz, conv[0])
    return ref


def _lowered(m: onnx.ModelProto):
    fired: list[str] = []
    g = lower_int_quant(bind_shapes(graphc.load_onnx(m), None), fired=fired)
    left = {n.op for n in g.nodes} & {"QuantizeLinear", "ConvInteger", "MatMulInteger"}
    assert fired and not left, left
    return g


CASES = [
    ("conv", lambda: _conv_model(np.uint8, False, False)),
    ("conv per-channel int8", lambda: _conv_model(np.int8, True, False)),
    ("conv run-time weight", lambda: _conv_model(np.uint8, True, True)),
    ("grouped conv", lambda: _conv_model(np.uint8, True, False, group=2)),
    ("matmul", lambda: _matmul_model(np.uint8, False)),
    ("matmul per-column int8", lambda: _matmul_model(np.int8, True)),
]


@pytest.mark.parametrize("name,build", CASES, ids=[c[0] for c in CASES])
def test_lowered_form_gives_onnxruntimes_integers(name, build):
    m, feeds = build()
    ref = _reference(m, feeds)
    got = graphc.interpret(_lowered(m), feeds)
    cpu = graphc.compile(m, target="cpu").run(feeds)
    for k, r in ref.items():
        for out in (got, cpu):
            assert out[k].dtype == r.dtype, k
            np.testing.assert_array_equal(out[k], r, err_msg=f"{name}: {k}")


@pytest.mark.parametrize("name,build", [CASES[0], CASES[2], CASES[4]], ids=["conv", "conv run-time weight", "matmul"])
def test_cuda_target_compiles_them(name, build):
    m, _ = build()
    eng = graphc.compile(m, target="cuda", arch=["sm_90"])
    ops = {s.op for s in eng.plan.steps}
    assert not ops & {"QuantizeLinear", "ConvInteger", "MatMulInteger"}, ops


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_reduced_precision_engines_refuse_instead_of_rounding_the_integer_sums(precision):
    # fp16 holds integers exactly only up to 2048 (and none above 65504): the float form of an
    # integer conv would be silently wrong there, so the lowering is fp32-only and the compile names
    # the op
    m, _ = CASES[0][1]()
    with pytest.raises(graphc.errors.GraphcError, match="ConvInteger"):
        graphc.compile(m, target="cuda", arch=["sm_90"], precision=precision)


def test_symmetric_int8_keeps_the_int8_kernel():
    rng = np.random.default_rng(1)
    w = rng.integers(-128, 128, (16, 32)).astype(np.int8)
    node = helper.make_node("MatMulInteger", ["a", "w"], ["y"])
    m = _model([node], [helper.make_tensor_value_info("a", I8, [8, 16])],
               [helper.make_tensor_value_info("y", TensorProto.INT32, [8, 32])], {"w": w})  # fmt: skip
    g = lower_int_quant(bind_shapes(graphc.load_onnx(m), None))
    assert [n.op for n in g.nodes] == ["MatMulInteger"]


def test_runtime_scale_to_float8_keeps_its_error():
    # QuantizeLinear to float8 with a scale computed at run time: no elementwise form here, so the
    # CUDA compile still names the op rather than computing something else.
    nodes = [
        helper.make_node("ReduceMax", ["x"], ["s"], keepdims=0),
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["y"]),
    ]
    z = helper.make_node("Constant", [], ["z"], value=helper.make_tensor("z", TensorProto.FLOAT8E4M3FN, [], [0.0]))
    m = _model([z, *nodes], [helper.make_tensor_value_info("x", F, [4, 8])],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT8E4M3FN, [4, 8])], {})  # fmt: skip
    with pytest.raises(graphc.errors.GraphcError, match="QuantizeLinear.*has no CUDA kernel"):
        graphc.compile(m, target="cuda", arch=["sm_90"])


@pytest.mark.slow
def test_ddddocr_common_old_compiles_for_cuda_and_its_lowered_form_keeps_the_numerics():
    """The corpus model (tools/fetch_trained_models.py) this pass exists for: 22 run-time
    QuantizeLinear, 21 ConvInteger and 1 MatMulInteger with zero points, 1 DynamicQuantizeLSTM."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
    from check_models import export_inputs, ort_run
    from fetch_trained_models import default_cache

    path = default_cache() / "models" / "ddddocr_common_old.onnx"
    if not path.exists():
        pytest.skip(f"{path} is not here (python tools/fetch_trained_models.py --fetch-only)")
    feeds = export_inputs(path.with_suffix(".json"), 1, 128)
    shapes = {k: v.shape for k, v in feeds.items()}
    eng = graphc.compile(str(path), target="cuda", shapes=shapes, arch=["sm_90"])
    lowered = {"QuantizeLinear", "ConvInteger", "MatMulInteger", "DynamicQuantizeLSTM"}
    assert not {s.op for s in eng.plan.steps} & lowered
    fired: list[str] = []
    g = bind_shapes(graphc.load_onnx(str(path)), shapes)
    low = lower_int_quant(g, fired=fired)
    assert len(fired) == 45 and not {n.op for n in low.nodes} & lowered
    ref, got, base = ort_run(str(path), feeds), graphc.interpret(low, feeds), graphc.interpret(g, feeds)
    for k, r in ref.items():
        scale = float(np.abs(r).max())
        # the lowered form computes what the reference ops compute (same quantization roundings) ...
        np.testing.assert_allclose(got[k], base[k], rtol=0, atol=1e-5 * scale, err_msg=k)
        # ... and both differ from ORT only where an activation sits on a rounding boundary
        # (docs/results/trained_models.md): a handful of outputs, below 2e-4 of the scale
        d = np.abs(got[k].astype(np.float64) - r)
        assert d.max() < 2e-4 * scale and (d > 1e-4 * scale).mean() < 1e-3, k
