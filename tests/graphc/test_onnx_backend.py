"""graphc.onnx_backend: the onnx.backend.base API over graphc."""

from __future__ import annotations

import unittest

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from onnx.backend.base import Backend, BackendRep

import graphc.onnx_backend as backend
from graphc.errors import GraphcError, InputError, UnsupportedOpError
from graphc.frontend.registry import find_converter
from helpers import make_node_model, rand


def need(*ops: str) -> None:
    missing = [op for op in ops if find_converter(op, "", 28) is None]
    if missing:
        pytest.skip(f"no converter yet for {missing}")


def two_output_model() -> onnx.ModelProto:
    """x, y -> (s = x + y, r = relu(x)), outputs listed in the opposite order of the nodes."""
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Add", ["x", "y"], ["s"])]
    graph = helper.make_graph(
        nodes,
        "two",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3]),
        ],
        [
            helper.make_tensor_value_info("s", TensorProto.FLOAT, [2, 3]),
            helper.make_tensor_value_info("r", TensorProto.FLOAT, [2, 3]),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_is_an_onnx_backend():
    assert issubclass(backend.GraphcBackend, Backend)
    assert issubclass(backend.GraphcRep, BackendRep)
    for name in ("prepare", "run_model", "run_node", "supports_device", "is_compatible"):
        assert callable(getattr(backend, name))


def test_prepare_and_run_list_and_dict_inputs():
    need("Relu", "Add")
    x, y = rand((2, 3), seed=1), rand((2, 3), seed=2)
    rep = backend.prepare(two_output_model(), "CPU")
    out = rep.run([x, y])
    # graph-output order, with access by name too (namedtupledict)
    assert len(out) == 2
    np.testing.assert_array_equal(out[0], x + y)
    np.testing.assert_array_equal(out[1], np.maximum(x, 0))
    np.testing.assert_array_equal(out["s"], x + y)
    np.testing.assert_array_equal(out.r, np.maximum(x, 0))
    by_name = rep.run({"y": y, "x": x})
    np.testing.assert_array_equal(by_name[0], out[0])
    # the same rep runs again on new inputs
    np.testing.assert_array_equal(rep.run([y, x])[0], x + y)


def test_run_model_and_a_single_array_input():
    need("Relu")
    x = rand((4, 5), seed=3)
    model = make_node_model("Relu", {"x": x})
    (y,) = backend.run_model(model, [x])
    np.testing.assert_array_equal(y, np.maximum(x, 0))
    np.testing.assert_array_equal(backend.prepare(model).run(x)[0], np.maximum(x, 0))
    # bytes work as a model source too, and a prepared rep is taken as it is
    np.testing.assert_array_equal(backend.run_model(model.SerializeToString(), [x])[0], np.maximum(x, 0))
    rep = backend.prepare(model)
    assert backend.prepare(rep) is rep


def test_numpy_scalar_inputs_become_arrays():
    need("Add")
    x = np.float32(2.5)
    model = make_node_model("Add", {"a": np.asarray(x), "b": np.asarray(x)})
    (y,) = backend.run_model(model, [x, x])
    assert isinstance(y, np.ndarray) and y.shape == () and y == 5.0


def test_wrong_number_of_inputs():
    need("Relu", "Add")
    rep = backend.prepare(two_output_model())
    with pytest.raises(InputError, match="takes 2"):
        rep.run([rand((2, 3))])
    with pytest.raises(InputError, match="single input"):
        rep.run(rand((2, 3)))


def test_run_node():
    need("Add", "Relu")
    a, b = rand((3, 4), seed=4), rand((4,), seed=5)
    (y,) = backend.run_node(helper.make_node("Add", ["a", "b"], ["y"]), [a, b])
    np.testing.assert_array_equal(y, a + b)
    (z,) = backend.run_node(helper.make_node("Relu", ["a"], ["z"]), {"a": a}, opset_version=13)
    np.testing.assert_array_equal(z, np.maximum(a, 0))
    info = [(np.dtype(np.float32), (3, 4))]
    (z,) = backend.run_node(helper.make_node("Relu", ["a"], ["z"]), [a], outputs_info=info)
    assert z.shape == (3, 4)


def test_devices():
    assert backend.supports_device("CPU")
    # no CUDA runner yet; a device name onnx does not know is not supported either
    assert not backend.supports_device("CUDA")
    assert not backend.supports_device("CUDA:1")
    assert not backend.supports_device("TPU")
    need("Relu")
    model = make_node_model("Relu", {"x": rand((2,))})
    with pytest.raises(GraphcError, match="device 'CUDA'"):
        backend.prepare(model, "CUDA")
    assert backend.is_compatible(model, "CPU")
    assert not backend.is_compatible(model, "CUDA")


def test_unsupported_op_raises_at_prepare():
    node = helper.make_node("Frobnicate", ["x"], ["y"], domain="com.example")
    graph = helper.make_graph(
        [node],
        "custom",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)])
    assert not backend.is_compatible(model)
    assert not backend.is_compatible(b"not a model")
    with pytest.raises(UnsupportedOpError, match="Frobnicate"):
        backend.prepare(model)


def test_onnx_backend_test_runner_drives_it():
    # ONNX's own runner (what `onnx.backend.test.BackendTest` generates) accepts the adapter.
    need("Relu", "Softmax", "Sub", "Exp", "ReduceMax", "ReduceSum", "Div")
    import onnx.backend.test

    bt = onnx.backend.test.BackendTest(backend, __name__)
    bt.include(r"^test_(relu|softmax_axis_1|softmax_axis_1_expanded)_cpu$")
    suite = unittest.TestSuite()
    suite.addTests(unittest.defaultTestLoader.loadTestsFromTestCase(bt.test_cases["OnnxBackendNodeModelTest"]))
    result = unittest.TestResult()
    suite.run(result)
    ran = result.testsRun - len(result.skipped)
    assert ran == 3, f"ran {ran} cases"
    assert result.wasSuccessful(), result.failures + result.errors
