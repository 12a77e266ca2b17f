"""Optional types (issue 12): optional(tensor) and optional(sequence) graph inputs, Optional,
OptionalHasElement and OptionalGetElement in the interpreter; the ops removed when compiling where
presence is known (passes/lower_optionals.py); a graph that keeps an optional is refused by the
CPU and CUDA targets in one line."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import graphc
from graphc.ir.text import format_graph, parse_graph, parse_type
from graphc.ir.types import OptionalType, SequenceType, TensorType


def _model(nodes, inputs, outputs, opset=18):
    g = helper.make_graph(nodes, "opt", inputs, outputs)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def _opt_tensor(name, shape=(4,)):
    return helper.make_value_info(
        name, helper.make_optional_type_proto(helper.make_tensor_type_proto(TensorProto.FLOAT, list(shape)))
    )


def _opt_seq(name):
    seq = helper.make_sequence_type_proto(helper.make_tensor_type_proto(TensorProto.FLOAT, None))
    return helper.make_value_info(name, helper.make_optional_type_proto(seq))


def _bool_out(name="has"):
    return helper.make_tensor_value_info(name, TensorProto.BOOL, [])


def test_has_element_of_an_optional_input_present_and_empty():
    m = _model([helper.make_node("OptionalHasElement", ["x"], ["has"])], [_opt_tensor("x")], [_bool_out()])
    g = graphc.load_onnx(m)
    assert isinstance(g.inputs[0].type, OptionalType) and str(g.inputs[0].type) == "opt<f32[4]>"
    assert graphc.interpret(g, {"x": np.ones(4, np.float32)})["has"].item() is True
    assert graphc.interpret(g, {"x": None})["has"].item() is False


def test_get_element_of_optional_tensor_and_sequence():
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])
    m = _model([helper.make_node("OptionalGetElement", ["x"], ["y"])], [_opt_tensor("x")], [out])
    x = np.arange(4, dtype=np.float32)
    np.testing.assert_array_equal(graphc.interpret(graphc.load_onnx(m), {"x": x})["y"], x)
    with pytest.raises(graphc.GraphcError, match="the optional is empty") as e:
        graphc.interpret(graphc.load_onnx(m), {"x": None})
    assert "\n" not in str(e.value) and "OptionalGetElement" in str(e.value)
    seq_out = helper.make_value_info(
        "s", helper.make_sequence_type_proto(helper.make_tensor_type_proto(TensorProto.FLOAT, None))
    )
    ms = _model([helper.make_node("OptionalGetElement", ["x"], ["s"])], [_opt_seq("x")], [seq_out])
    got = graphc.interpret(graphc.load_onnx(ms), {"x": [x, 2 * x]})["s"]
    assert len(got) == 2 and np.array_equal(got[1], 2 * x)


def test_optional_constructor_with_and_without_input():
    # Optional(x) then HasElement: true; the empty Optional of a TypeProto: false
    seq_t = helper.make_sequence_type_proto(helper.make_tensor_type_proto(TensorProto.INT64, None))
    nodes = [
        helper.make_node("Optional", ["x"], ["ox"]),
        helper.make_node("OptionalHasElement", ["ox"], ["a"]),
        helper.make_node("Optional", [], ["oe"], type=seq_t),
        helper.make_node("OptionalHasElement", ["oe"], ["b"]),
    ]
    m = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])], [_bool_out("a"), _bool_out("b")])
    g = graphc.load_onnx(m)
    oe = next(n for n in g.nodes if n.outputs[0].name == "oe")
    assert oe.outputs[0].type == OptionalType(SequenceType(TensorType(graphc.ir.DType.int64, None)))
    got = graphc.interpret(g, {"x": np.ones(2, np.float32)})
    assert got["a"].item() is True and got["b"].item() is False
    # known presence: both fold to constants when compiled; the CPU engine computes nothing
    eng = graphc.compile(m, target="cpu")
    out = eng.run({"x": np.ones(2, np.float32)})
    assert bool(out["a"]) is True and bool(out["b"]) is False
    assert not any(s.op.startswith("Optional") for s in eng.plan.steps)


def test_opset18_tensor_inputs_and_no_input_compile_for_cuda():
    # 18's ops on a plain tensor (always present) and HasElement without an input (never): no
    # optional is left, so the CUDA target compiles them (an alias and a constant)
    nodes = [
        helper.make_node("OptionalGetElement", ["x"], ["y"]),
        helper.make_node("OptionalHasElement", ["x"], ["a"]),
        helper.make_node("OptionalHasElement", [""], ["b"]),
    ]
    outs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4]), _bool_out("a"), _bool_out("b")]
    m = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])], outs)
    x = np.arange(4, dtype=np.float32)
    got = graphc.interpret(graphc.load_onnx(m), {"x": x})
    assert got["a"].item() is True and got["b"].item() is False
    eng = graphc.compile(m, target="cuda", arch=["sm_90"])
    assert not any(s.op.startswith("Optional") for s in eng.plan.steps)


def test_an_optional_graph_input_is_refused_when_compiling(tmp_path):
    from graphc.cli import main

    m = _model([helper.make_node("OptionalHasElement", ["x"], ["has"])], [_opt_tensor("x")], [_bool_out()])
    for target in ("cpu", "cuda"):
        with pytest.raises(graphc.GraphcError, match=r"input 'x' is an optional \(opt<f32\[4\]>\)") as e:
            graphc.compile(m, target=target)
        assert "\n" not in str(e.value)
    path = tmp_path / "opt.onnx"
    onnx.save(m, str(path))
    assert main(["check", str(path), "--target", "cuda"]) != 0


def test_optional_types_in_the_ir_text():
    assert parse_type("opt<seq<i64[*]>>") == OptionalType(SequenceType(TensorType(graphc.ir.DType.int64, None)))
    assert str(parse_type("opt<f16[2,n]>")) == "opt<f16[2,n]>"
    m = _model([helper.make_node("OptionalHasElement", ["x"], ["has"])], [_opt_seq("x")], [_bool_out()])
    g = graphc.load_onnx(m)
    again = parse_graph(format_graph(g))
    assert again.inputs[0].type == g.inputs[0].type
