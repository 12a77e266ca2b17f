"""k_major_gemm_weights: which GEMMs get a transposed weight, the numbers before and after (the
interpreter), and the CUDA plan's B operand loads becoming 16-byte wide (no GPU needed)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import graphc
from graphc.ir.shapes import bind_shapes
from graphc.ops.internal import INTERNAL_DOMAIN
from graphc.passes.gemm_weight_layout import k_major_gemm_weights

RNG = np.random.default_rng(0)


def _model(op: str, k: int, n: int, *, shared: bool = False, trans_b: int = 0) -> onnx.ModelProto:
    w = (RNG.standard_normal((n, k) if trans_b else (k, n)) / np.sqrt(k)).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["y"])
        if op == "MatMul"
        else helper.make_node("Gemm", ["x", "w", "c"], ["y"], transB=trans_b, alpha=0.5, beta=2.0)
    ]
    inits = [numpy_helper.from_array(w, "w")]
    outputs = [helper.make_tensor_value_info("y", TensorProto.UNDEFINED, None)]
    if op == "Gemm":
        inits.append(numpy_helper.from_array(RNG.standard_normal(n).astype(np.float32), "c"))
    if shared:  # a second reader of the same weight
        nodes.append(helper.make_node("ReduceSum", ["w"], ["s"], keepdims=0))
        outputs.append(helper.make_tensor_value_info("s", TensorProto.UNDEFINED, None))
    x_shape = [3, 5, k] if op == "MatMul" else [5, k]
    g = helper.make_graph(nodes, "t", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)], outputs, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    m.ir_version = 10
    return onnx.shape_inference.infer_shapes(m)


def _run(graph, feeds):
    return graphc.interpret(graph, feeds)


@pytest.mark.parametrize("op", ["MatMul", "Gemm"])
@pytest.mark.parametrize(("k", "n", "expect"), [(64, 50, True), (64, 13, True), (64, 48, False), (62, 50, False)])
def test_rewrites_unaligned_n_only(op, k, n, expect):
    g = bind_shapes(graphc.load_onnx(_model(op, k, n)), None)
    x = RNG.standard_normal([3, 5, k] if op == "MatMul" else [5, k]).astype(np.float32)
    fired: list[str] = []
    out = k_major_gemm_weights(g, fired=fired)
    assert bool(fired) is expect
    if expect:
        (node,) = [nd for nd in out.nodes if nd.op in ("MatMul", "Gemm")]
        w = out.constants[node.inputs[1].name].data
        assert w.shape == (n, k) and w.flags.c_contiguous
        if op == "MatMul":
            assert node.domain == INTERNAL_DOMAIN and node.attrs.trans_b == 1
        else:
            assert node.attrs.transB == 1 and node.attrs.alpha == 0.5 and node.attrs.beta == 2.0
        assert "w" not in out.constants  # the row-major copy is gone
    else:
        assert out is g
    ref, got = _run(g, {"x": x})["y"], _run(out, {"x": x})["y"]
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


def test_weight_with_another_reader_is_left_alone():
    g = bind_shapes(graphc.load_onnx(_model("MatMul", 64, 50, shared=True)), None)
    assert k_major_gemm_weights(g) is g


def test_already_transposed_gemm_is_left_alone():
    g = bind_shapes(graphc.load_onnx(_model("Gemm", 64, 50, trans_b=1)), None)
    assert k_major_gemm_weights(g) is g


@pytest.mark.parametrize("precision", ["fp16", "fp32"])
def test_cuda_plan_loads_the_weight_in_16_byte_chunks(precision):
    """The GPT-2 LM head's case in small: N odd. Without the pass the kernel's B loads are scalar."""
    m = _model("MatMul", 64, 101)
    eng = graphc.compile(m, target="cuda", precision=precision, arch=["sm_90"], allow_tf32=True)
    (launch,) = [ln for s in eng.plan.steps for ln in s.launches if ln.family == "gemm"]
    assert launch.params["b"] == "k" and launch.params["VEC_B"] == 1
    off = graphc.compile(m, target="cuda", precision=precision, arch=["sm_90"], allow_tf32=True, opt_level=0)
    (launch,) = [ln for s in off.plan.steps for ln in s.launches if ln.family == "gemm"]
    assert launch.params["b"] == "mn" and launch.params["VEC_B"] == 0
