"""decompose_qdq: the elementwise form equals the ops' reference exactly (ties, saturation, every
granularity), the optimizer fuses a QDQ conv into one kernel's epilogue, the result matches ONNX
Runtime, and the CUDA target compiles it (no GPU needed)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import graphc
from graphc.ir.shapes import bind_shapes
from graphc.ops.quantize import broadcast_param
from graphc.passes.decompose_qdq import decompose_qdq
from graphc.passes.manager import OptimizeOptions, optimize
from helpers import quantize_zoo_model, run_ort

RNG = np.random.default_rng(0)


def _qdq_model(x_shape, x_dtype, s, zp, attrs, opset=21) -> onnx.ModelProto:
    inits = [numpy_helper.from_array(s, "s")]
    q_in, dq_in = ["x", "s"], ["q", "s"]
    if zp is not None:
        inits.append(numpy_helper.from_array(zp, "zp"))
        q_in.append("zp")
        dq_in.append("zp")
    nodes = [
        helper.make_node("QuantizeLinear", q_in, ["q"], **attrs),
        helper.make_node("DequantizeLinear", dq_in, ["y"], **attrs),
    ]
    xt = helper.np_dtype_to_tensor_dtype(np.dtype(x_dtype))
    g = helper.make_graph(
        nodes,
        "qdq",
        [helper.make_tensor_value_info("x", xt, x_shape)],
        [helper.make_tensor_value_info("q", TensorProto.UNDEFINED, None), helper.make_tensor_value_info("y", xt, None)],
        inits,
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 10
    return onnx.shape_inference.infer_shapes(m)


CASES = [
    # (x dtype, scale shape, zp dtype, attrs)
    (np.float32, (), np.uint8, {}),
    (np.float32, (), np.int8, {}),
    (np.float32, (), None, {}),
    (np.float32, (1,), np.int16, {}),
    (np.float32, (6,), np.int8, {"axis": 1}),
    (np.float32, (5,), np.uint16, {"axis": -1}),
    (np.float32, (2, 2, 5), np.uint8, {"axis": 1, "block_size": 4}),
    (np.float16, (), np.int8, {}),
    (np.float16, (6,), np.uint8, {"axis": 1}),
]


@pytest.mark.parametrize(("x_dtype", "s_shape", "zp_dtype", "attrs"), CASES)
def test_decomposed_equals_reference(x_dtype, s_shape, zp_dtype, attrs):
    shape = (2, 6, 5)
    s = RNG.uniform(0.02, 0.3, size=s_shape).astype(x_dtype)
    zp = None
    if zp_dtype is not None:
        info = np.iinfo(zp_dtype)
        zp = RNG.integers(max(info.min, -9), min(info.max, 9) + 1, size=s_shape).astype(zp_dtype)
    x = RNG.uniform(-60, 60, size=shape).astype(x_dtype)
    # exact ties x / s = k + 0.5 in the first batch row, where round-half-even decides
    s_elem = np.broadcast_to(broadcast_param(s, shape, attrs.get("axis", 1), attrs.get("block_size", 0)), shape)
    x[0] = ((RNG.integers(-50, 50, size=shape[1:]) + 0.5) * s_elem[0].astype(np.float64)).astype(x_dtype)
    g = bind_shapes(graphc.load_onnx(_qdq_model(shape, x_dtype, s, zp, attrs)), None)
    fired: list[str] = []
    d = decompose_qdq(g, fired=fired)
    assert len(fired) == 2
    assert not {"QuantizeLinear", "DequantizeLinear"} & {n.op for n in d.nodes}
    ref, got = graphc.interpret(g, {"x": x}), graphc.interpret(d, {"x": x})
    np.testing.assert_array_equal(got["q"], ref["q"])
    np.testing.assert_array_equal(got["y"], ref["y"])


def test_not_decomposed_where_no_kernel_types_exist():
    """float8 and a scale computed at run time stay ops (the CPU engine runs them)."""
    import ml_dtypes

    zp8 = np.zeros((), dtype=ml_dtypes.float8_e4m3fn)
    m = _qdq_model((4,), np.float32, np.array(0.5, np.float32), zp8, {})
    g = bind_shapes(graphc.load_onnx(m), None)
    assert decompose_qdq(g) is g


def _qdq_conv() -> onnx.ModelProto:
    """x -> Q/DQ -> Conv(DQ(int8 weight, per-channel)) + bias -> Relu -> Q/DQ: ONNX Runtime's QDQ form."""
    c_in, c_out = 8, 16
    w = RNG.standard_normal((c_out, c_in, 3, 3)).astype(np.float32) * 0.2
    w_scale = (np.abs(w).reshape(c_out, -1).max(1) / 127).astype(np.float32)
    w_q = np.clip(np.rint(w / w_scale[:, None, None, None]), -127, 127).astype(np.int8)
    inits = [
        numpy_helper.from_array(np.array(0.05, np.float32), "xs"),
        numpy_helper.from_array(np.array(128, np.uint8), "xz"),
        numpy_helper.from_array(w_q, "wq"),
        numpy_helper.from_array(w_scale, "ws"),
        numpy_helper.from_array(np.zeros(c_out, np.int8), "wz"),
        numpy_helper.from_array(RNG.standard_normal(c_out).astype(np.float32) * 0.1, "b"),
        numpy_helper.from_array(np.array(0.04, np.float32), "ys"),
        numpy_helper.from_array(np.array(0, np.uint8), "yz"),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
        helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["wd"], axis=0),
        helper.make_node("Conv", ["xd", "wd", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("QuantizeLinear", ["r", "ys", "yz"], ["rq"]),
        helper.make_node("DequantizeLinear", ["rq", "ys", "yz"], ["y"]),
    ]
    g = helper.make_graph(
        nodes,
        "qdq_conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c_in, 12, 10])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, c_out, 12, 10])],
        inits,
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    m.ir_version = 10
    return m


def test_qdq_conv_fuses_and_matches_onnxruntime():
    m = _qdq_conv()
    x = RNG.uniform(-3, 3, size=(1, 8, 12, 10)).astype(np.float32)
    g = bind_shapes(graphc.load_onnx(m), None)
    opt = optimize(g, OptimizeOptions(opt_level=2)).graph
    ops = [n.op for n in opt.nodes]
    assert "QuantizeLinear" not in ops and "DequantizeLinear" not in ops
    # the activation's quantize-dequantize lands in the conv's epilogue (one kernel for Conv..Q/DQ)
    assert ops.count("Fused") == 2 and "Conv" not in ops, ops
    expected = run_ort(m, {"x": x})["y"]
    got = graphc.compile(m, target="cpu").run({"x": x})["y"]
    # Outputs are multiples of the output scale 0.04: equal, or one step apart where the conv's
    # float sum sits on a rounding boundary (summation order differs from ONNX Runtime's).
    steps = np.abs(got - expected) / 0.04
    assert np.all(np.isclose(steps, np.round(steps), atol=1e-3)) and steps.max() <= 1.0 + 1e-3
    assert (steps > 0.5).mean() < 0.01


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_qdq_conv_compiles_for_cuda(precision):
    eng = graphc.compile(_qdq_conv(), target="cuda", precision=precision, arch=["sm_90"])
    fams = {ln.family for s in eng.plan.steps for ln in s.launches}
    assert "conv" in fams
    assert not {"QuantizeLinear", "DequantizeLinear"} & set(eng.report["ops_after"])


def test_cuda_at_opt_level_0_decomposes_too():
    eng = graphc.compile(_qdq_conv(), target="cuda", arch=["sm_90"], opt_level=0)
    assert all(s.op not in ("QuantizeLinear", "DequantizeLinear") for s in eng.plan.steps)


@pytest.mark.parametrize("name", ["resnet", "bert"])
def test_onnxruntime_quantized_zoo_model(name, tmp_path):
    """A zoo model quantized by ONNX Runtime's own tool (QDQ, uint8 activations, per-channel int8
    weights): the CPU engine equals ONNX Runtime running the Q/DQ ops, and the CUDA target compiles
    it with no Quantize/DequantizeLinear left."""
    pytest.importorskip("onnxruntime.quantization")
    q, feeds = quantize_zoo_model(name, tmp_path)
    assert sum(n.op_type == "QuantizeLinear" for n in q.graph.node) > 10
    shapes = {k: v.shape for k, v in feeds.items()}
    expected = run_ort(q, feeds)
    got = graphc.compile(q, target="cpu", shapes=shapes).run(feeds)
    for k, v in expected.items():
        np.testing.assert_allclose(got[k], v, rtol=0, atol=1e-6 * float(np.abs(v).max()))
    eng = graphc.compile(q, target="cuda", shapes=shapes, arch=["sm_90"], precision="fp16")
    ops = set(eng.report["ops_after"])
    assert not {"QuantizeLinear", "DequantizeLinear"} & ops
    if name == "resnet":  # the dequantized weights are constants, so every conv runs NHWC
        assert "Fused[Conv]" not in ops and "Fused[ConvNHWC]" in ops, ops
