"""Frontend: bad files and unsupported ops give clear errors, never tracebacks."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import graphc
from graphc.errors import ModelLoadError, UnsupportedOpError


def _reshape_model(opset: int = 17) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 6])
    y = helper.make_tensor_value_info("y", TensorProto.BOOL, ["?"])
    shape = numpy_helper.from_array(np.array([0, 2, 3], dtype=np.int64), "shape")
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["y"], name="reshape")]
    g = helper.make_graph(nodes, "g", [x], [y], [shape])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def test_missing_file(tmp_path):
    with pytest.raises(ModelLoadError, match="no such file"):
        graphc.load_onnx(tmp_path / "nope.onnx")


def test_garbage_file(tmp_path):
    p = tmp_path / "bad.onnx"
    p.write_bytes(b"\x00\xffthis is not protobuf" * 10)
    with pytest.raises(ModelLoadError):
        graphc.load_onnx(p)


def test_truncated_file(tmp_path):
    data = _reshape_model().SerializeToString()
    p = tmp_path / "cut.onnx"
    p.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelLoadError):
        graphc.load_onnx(p)


def test_empty_file(tmp_path):
    p = tmp_path / "empty.onnx"
    p.write_bytes(b"")
    with pytest.raises(ModelLoadError):
        graphc.load_onnx(p)


def test_every_unsupported_op_listed_at_once():
    x = helper.make_tensor_value_info("x", TensorProto.STRING, [3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["?"])
    z = helper.make_tensor_value_info("z", TensorProto.STRING, ["?"])
    nodes = [
        helper.make_node("StringNormalizer", ["x"], ["z"], name="norm1"),
        helper.make_node("StringNormalizer", ["z"], ["z2"], name="norm2"),
        helper.make_node("RegexFullMatch", ["z2"], ["y"], name="regex", pattern="a.*"),
    ]
    g = helper.make_graph(nodes, "g", [x], [y, z])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)])  # RegexFullMatch is 20's
    with pytest.raises(UnsupportedOpError) as info:
        graphc.load_onnx(m)
    msg = str(info.value)
    assert "StringNormalizer" in msg and "'norm1'" in msg and "'norm2'" in msg
    assert "RegexFullMatch" in msg and "'regex'" in msg and "opset 20" in msg
    ops = {u[0]: u[3] for u in info.value.unsupported}
    assert ops == {"StringNormalizer": ["norm1", "norm2"], "RegexFullMatch": ["regex"]}


def test_undefined_input_is_a_clear_error():
    m = _reshape_model()
    m.graph.node[0].input[1] = "nowhere"
    m.graph.initializer.pop()
    with pytest.raises(ModelLoadError):  # the checker or the frontend names it
        graphc.load_onnx(m)


def test_feeds_are_validated():
    g = graphc.load_onnx(_reshape_model())
    with pytest.raises(graphc.InputError, match="missing"):
        graphc.interpret(g, {})
    with pytest.raises(graphc.InputError, match="dtype"):
        graphc.interpret(g, {"x": np.zeros((2, 6), np.float64)})
    with pytest.raises(graphc.InputError, match="shape"):
        graphc.interpret(g, {"x": np.zeros((2, 5), np.float32)})
    with pytest.raises(graphc.InputError, match="unknown input"):
        graphc.interpret(g, {"x": np.zeros((2, 6), np.float32), "w": np.zeros(1)})
    out = graphc.interpret(g, {"x": np.arange(12, dtype=np.float32).reshape(2, 6)})
    assert out["y"].shape == (2, 2, 3)


def test_external_data_is_memory_mapped(tmp_path):
    w = np.arange(4096, dtype=np.float32).reshape(64, 64)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 64])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["?"])
    g = helper.make_graph(
        [helper.make_node("Identity", ["w"], ["y"], name="id"), helper.make_node("Identity", ["x"], ["x2"])],
        "g",
        [x],
        [y],
        [numpy_helper.from_array(w, "w")],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path / "ext.onnx"
    onnx.save_model(
        m,
        path,
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="ext.data",
        size_threshold=0,
    )
    graph = graphc.load_onnx(path)
    data = graph.constants["w"].data
    import mmap

    base = data
    while base is not None and not isinstance(base, (np.memmap, mmap.mmap)):
        base = getattr(base, "base", None)
    assert base is not None, "external data was copied instead of memory-mapped"
    np.testing.assert_array_equal(graphc.interpret(graph, {"x": w})["y"], w)
    # A missing external file is a clear error.
    (tmp_path / "ext.data").unlink()
    with pytest.raises(ModelLoadError, match="missing|not regular file"):
        graphc.load_onnx(path)


def test_external_data_truncated(tmp_path):
    w = np.ones((128,), dtype=np.float32)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["?"])
    g = helper.make_graph(
        [helper.make_node("Identity", ["w"], ["y"])], "g", [x], [y], [numpy_helper.from_array(w, "w")]
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path / "t.onnx"
    onnx.save_model(m, path, save_as_external_data=True, location="t.data", size_threshold=0)
    data = (tmp_path / "t.data").read_bytes()
    (tmp_path / "t.data").write_bytes(data[:100])
    with pytest.raises(ModelLoadError, match="truncated"):
        graphc.load_onnx(path)


def test_old_opset_form_is_converted():
    """Unsqueeze took axes as an attribute before opset 13; the IR takes them as an input."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["?"])
    g = helper.make_graph([helper.make_node("Unsqueeze", ["x"], ["y"], axes=[0, 3])], "g", [x], [y])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 11)])
    graph = graphc.load_onnx(m)
    out = graphc.interpret(graph, {"x": np.ones((2, 3), np.float32)})
    assert out["y"].shape == (1, 2, 3, 1)
    assert graph.outputs[0].name == "y"


def test_output_names_survive_conversion():
    """Graph outputs keep their public names even where they are inputs or constants."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    c = helper.make_tensor_value_info("c", TensorProto.FLOAT, ["?"])
    g = helper.make_graph([], "g", [x], [x, c], [numpy_helper.from_array(np.ones(2, np.float32), "c")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    graph = graphc.load_onnx(m)
    out = graphc.interpret(graph, {"x": np.array([1, 2], np.float32)})
    assert list(out) == ["x", "c"]
