"""The classical-ML domain's Binarizer and ArrayFeatureExtractor (ai.onnx.ml), converted onto
standard ops: against ONNX Runtime and ONNX's reference, through the interpreter, the CPU engine and
the CUDA compile; a model that imports only ai.onnx.ml loads."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import graphc
from helpers import run_ort

ML = "ai.onnx.ml"
NP_TO_ONNX = {np.float32: TensorProto.FLOAT, np.float64: TensorProto.DOUBLE, np.int64: TensorProto.INT64,
              np.int32: TensorProto.INT32}  # fmt: skip


def _model(node, inputs, out_shape, out_type, standard=True):
    g = helper.make_graph([node], "ml", inputs, [helper.make_tensor_value_info("Y", out_type, out_shape)])
    imports = [helper.make_opsetid(ML, 1)] + ([helper.make_opsetid("", 17)] if standard else [])
    m = helper.make_model(g, opset_imports=imports)
    m.ir_version = 8
    return m


def _check(m, feeds, rtol=0.0, ort=True):
    from onnx.reference import ReferenceEvaluator

    (want,) = ReferenceEvaluator(m).run(None, feeds)
    if ort:
        np.testing.assert_allclose(run_ort(m, feeds)["Y"], want, rtol=rtol)  # ORT and ONNX agree here
    got = graphc.interpret(graphc.load_onnx(m), feeds)["Y"]
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=rtol)
    cpu = graphc.compile(m, target="cpu")
    np.testing.assert_allclose(np.asarray(cpu.run(feeds)["Y"]), want, rtol=rtol)
    return want


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64])
@pytest.mark.parametrize("threshold", [0.0, 0.37, -2.0, -0.5])
@pytest.mark.parametrize("standard", [True, False])
def test_binarizer(dtype, threshold, standard):
    x = (np.random.default_rng(0).standard_normal((3, 5)) * 3).astype(dtype)
    x[0, 0] = dtype(threshold) if np.issubdtype(dtype, np.floating) else x[0, 0]  # equal: not above
    node = helper.make_node("Binarizer", ["X"], ["Y"], domain=ML, threshold=threshold)
    m = _model(node, [helper.make_tensor_value_info("X", NP_TO_ONNX[dtype], [3, 5])], [3, 5], NP_TO_ONNX[dtype],
               standard)  # fmt: skip
    want = _check(m, {"X": x}, ort=dtype == np.float32)  # ONNX Runtime's Binarizer is float-only
    assert 0 < want.sum() < want.size


@pytest.mark.parametrize(
    ("shape", "idx"),
    [((7,), [3, 0, 6]), ((4, 6), [5, 1]), ((2, 3, 5), [[4, 0, 4]]), ((3, 4), [2])],
)
def test_array_feature_extractor(shape, idx):
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    y = np.array(idx, np.int64)
    k = y.size
    out = [1, k] if len(shape) == 1 else [*shape[:-1], k]
    node = helper.make_node("ArrayFeatureExtractor", ["X", "I"], ["Y"], domain=ML)
    inputs = [helper.make_tensor_value_info("X", TensorProto.FLOAT, list(shape)),
              helper.make_tensor_value_info("I", TensorProto.INT64, list(y.shape))]  # fmt: skip
    m = _model(node, inputs, out, TensorProto.FLOAT)
    want = _check(m, {"X": x, "I": y})
    assert list(want.shape) == out


def test_both_compile_for_cuda():
    node = helper.make_node("Binarizer", ["X"], ["Y"], domain=ML, threshold=0.5)
    m = _model(node, [helper.make_tensor_value_info("X", TensorProto.FLOAT, [4, 8])], [4, 8], TensorProto.FLOAT)
    eng = graphc.compile(m, target="cuda", arch=["sm_90"])
    assert eng.plan.steps


def test_bad_indices_type_is_one_line():
    node = helper.make_node("ArrayFeatureExtractor", ["X", "I"], ["Y"], domain=ML)
    inputs = [helper.make_tensor_value_info("X", TensorProto.FLOAT, [3, 4]),
              helper.make_tensor_value_info("I", TensorProto.INT32, [2])]  # fmt: skip
    m = _model(node, inputs, [3, 2], TensorProto.FLOAT)
    with pytest.raises(graphc.GraphcError, match=r"Y \(the indices\) is int32, not int64") as e:
        graphc.load_onnx(m)
    assert "\n" not in str(e.value)
