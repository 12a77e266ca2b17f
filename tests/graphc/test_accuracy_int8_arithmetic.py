"""The CPU target's int8 arithmetic is the CUDA kernels' (issue 13, item 4): int32 sums that wrap
as int32 accumulators do, and the CUDA form of an int8 graph (1x1 ConvInteger over the rows of a
MatMul, Quantize/DequantizeLinear as Div/Round/Clip/Cast and Cast/Mul: what the int8 GEMM
epilogues compute) gives bit for bit the CPU form's numbers through the same numpy kernels."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

import graphc
import models
from graphc.interpreter import interpret
from graphc.ir.shapes import bind_shapes
from graphc.passes.manager import OptimizeOptions, optimize
from graphc.passes.quantize_int8 import quantize_int8
from graphc.passes.target import Target
from graphc.runtime.reference.linalg import _mmi_compute


def _wrap(x: np.ndarray) -> np.ndarray:
    return (((x.astype(np.int64) + 2**31) % 2**32) - 2**31).astype(np.int32)


def test_integer_sums_past_int32_wrap_like_int32_accumulators():
    k = 140_000  # 127 * 127 * k > 2**31
    a = np.full((1, k), 127, np.int8)
    b = np.stack([np.full(k, 127), np.full(k, -127), np.arange(k) % 255 - 127], axis=1).astype(np.int8)
    want = _wrap(a.astype(np.int64) @ b.astype(np.int64))
    assert np.abs(a.astype(np.int64) @ b.astype(np.int64)).max() > 2**31  # it does overflow
    got = _mmi_compute([a, b], None, 1)[0]
    assert got.dtype == np.int32 and np.array_equal(got, want)
    g = helper.make_graph(
        [helper.make_node("MatMulInteger", ["a", "b"], ["y"])],
        "g",
        [helper.make_tensor_value_info("a", TensorProto.INT8, [1, k])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, [1, 3])],
        [numpy_helper.from_array(b, "b")],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    assert np.array_equal(ort.InferenceSession(m.SerializeToString()).run(None, {"a": a})[0], want)
    assert np.array_equal(graphc.compile(m, target="cpu").run({"a": a})["y"], want)  # the CPU engine
    # ConvInteger: a 1x1 convolution over k channels, in a CPU engine
    w = b.T.reshape(3, k, 1, 1).copy()
    g = helper.make_graph(
        [helper.make_node("ConvInteger", ["x", "w"], ["y"], kernel_shape=[1, 1])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.INT8, [1, k, 1, 1])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, [1, 3, 1, 1])],
        [numpy_helper.from_array(w, "w")],
    )
    conv = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    y = graphc.compile(conv, target="cpu").run({"x": a.reshape(1, k, 1, 1)})["y"]
    assert y.dtype == np.int32 and np.array_equal(y.reshape(1, 3), want)


def _int8_pass_input(model, feeds):
    captured = []
    target = Target("cpu", "int8", calibrator=lambda g, names: captured.append(g) or {})
    optimize(
        bind_shapes(graphc.load_onnx(model), {k: v.shape for k, v in feeds[0].items()}), OptimizeOptions(target=target)
    )
    return captured[0]


def test_cuda_form_equals_cpu_form_bit_for_bit():
    """The same calibrated graph in the int8 pass's CPU form and its CUDA form, both run by the
    interpreter: equal outputs (the CUDA kernels compute the CUDA form's integers exactly; their
    float epilogue is the same float32 operations, docs/results/int8_cuda.md)."""
    for name in ("resnet", "bert"):
        m = models.build(name, size="tiny")
        feeds = [models.sample_inputs(name, m, seed=i) for i in range(3)]
        fg = _int8_pass_input(m, feeds)
        rng = np.random.default_rng(0)
        amax = {}

        def calib(g, names, amax=amax, rng=rng):
            for n in names:
                amax.setdefault(n, float(rng.uniform(0.5, 4.0)))
            return {n: amax[n] for n in names}

        cpu = quantize_int8(fg, Target("cpu", "int8", calibrator=calib))
        cuda = quantize_int8(fg, Target("cuda", "int8", calibrator=calib))
        assert any(n.op == "QuantizeLinear" for n in cpu.nodes)
        assert not any(n.op in ("QuantizeLinear", "DequantizeLinear", "MatMulInteger") for n in cuda.nodes)
        assert sum(n.op == "ConvInteger" for n in cuda.nodes) == sum(
            n.op in ("ConvInteger", "MatMulInteger") for n in cpu.nodes
        )
        for f in feeds:
            a, b = interpret(cpu, f), interpret(cuda, f)
            for k in cpu.output_names:
                assert np.array_equal(a[k], b[k]), (name, k, np.max(np.abs(a[k] - b[k])))
