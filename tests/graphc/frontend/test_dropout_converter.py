"""Inference Dropout becomes Identity in the frontend (issue 12): its mask, when read, a constant
all-true tensor; so no Dropout reaches the passes or CUDA codegen (opset 9 exports name a mask
output nobody reads, which used to leave a two-output Dropout with no CUDA kernel)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import graphc
from tests.helpers import assert_close, rand, run_graphc, run_ort

F32 = np.float32


def _model(opset: int, *, read_mask: bool, attrs=None, extra_inputs=(), shape=(2, 3, 4)) -> onnx.ModelProto:
    """x -> Dropout(x) -> Relu, the way opset-9 exporters write it (mask named, often unread)."""
    drop = helper.make_node("Dropout", ["x", *extra_inputs], ["d", "mask"], name="drop", **(attrs or {}))
    relu = helper.make_node("Relu", ["d"], ["y"], name="relu")
    mask_t = TensorProto.FLOAT if opset < 10 else TensorProto.BOOL
    outs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)]
    if read_mask:
        outs.append(helper.make_tensor_value_info("mask", mask_t, shape))
    inits = []
    if "r" in extra_inputs:
        inits.append(helper.make_tensor("r", TensorProto.FLOAT, [], [0.25]))
    if "t" in extra_inputs:
        inits.append(helper.make_tensor("t", TensorProto.BOOL, [], [False]))
    g = helper.make_graph(
        [drop, relu], "dropout", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)], outs, inits
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


@pytest.mark.parametrize("opset", [6, 7, 9, 10, 12, 13])
def test_inference_dropout_is_identity_in_the_ir(opset):
    attrs = {"is_test": 1} if opset < 7 else {"ratio": 0.3} if opset < 12 else {}
    extra = ("r", "t") if opset >= 12 else ()
    model = _model(opset, read_mask=True, attrs=attrs, extra_inputs=extra)
    graph = graphc.load_onnx(model)
    ops = [n.op for n in graph.nodes]
    assert "Dropout" not in ops, ops
    x = rand((2, 3, 4), F32, seed=1)
    out = run_graphc(model, {"x": x})
    assert_close(out["y"], np.maximum(x, 0))
    mask_t = F32 if opset < 10 else np.bool_
    assert_close(out["mask"], np.ones(x.shape, mask_t))
    if opset >= 12:
        ort = run_ort(model, {"x": x})
        assert_close(out["mask"], ort["mask"])


def test_training_dropout_stays_a_dropout():
    # is_test=0 at opset 6 asks for random dropout: kept, so running it fails clearly.
    model = _model(6, read_mask=False, attrs={"ratio": 0.3})
    assert "Dropout" in [n.op for n in graphc.load_onnx(model).nodes]
    # A run-time training_mode is only known when the graph runs.
    drop = helper.make_node("Dropout", ["x", "r", "t"], ["y"], name="drop")
    g = helper.make_graph(
        [drop],
        "dropout",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [3]),
            helper.make_tensor_value_info("t", TensorProto.BOOL, []),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])],
        [helper.make_tensor("r", TensorProto.FLOAT, [], [0.5])],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    assert "Dropout" in [n.op for n in graphc.load_onnx(m).nodes]


def test_run_time_ratio_in_inference_is_identity():
    # No training_mode: inference, whatever the (run-time) ratio.
    drop = helper.make_node("Dropout", ["x", "r"], ["y"], name="drop")
    g = helper.make_graph(
        [drop],
        "dropout",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [3]),
            helper.make_tensor_value_info("r", TensorProto.FLOAT, []),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    assert "Dropout" not in [n.op for n in graphc.load_onnx(m).nodes]
    x = rand((3,), F32, seed=3)
    assert_close(run_graphc(m, {"x": x, "r": np.array(0.7, F32)})["y"], x)


def test_dynamic_shape_mask_follows_the_input():
    model = _model(12, read_mask=True, shape=["n", 3])
    x = rand((5, 3), F32, seed=2)
    out = run_graphc(model, {"x": x})
    assert_close(out["mask"], np.ones((5, 3), np.bool_))


def _have_nvrtc() -> bool:
    try:
        from graphc.codegen.nvrtc import nvrtc_version

        nvrtc_version()
        return True
    except Exception:
        return False


@pytest.mark.skipif(not _have_nvrtc(), reason="needs NVRTC (cuda-bindings)")
@pytest.mark.parametrize("read_mask", [False, True])
def test_opset9_dropout_compiles_for_cuda(read_mask):
    model = _model(9, read_mask=read_mask, attrs={"ratio": 0.5})
    engine = graphc.compile(model, target="cuda", arch=["sm_80"])
    assert all(s.op != "Dropout" for s in engine.plan.steps)
