"""Models with data-dependent If for the host-If tests of both targets (tests/runtime/test_cuda_host_if.py,
tests/runtime/test_cuda_host_if_gpu.py): conditions computed from data, steps before and after the If,
nested Ifs, and a branch that does not type-check on the bound shapes."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

FL = TensorProto.FLOAT
RNG = np.random.default_rng(12)


def data_if_model() -> onnx.ModelProto:
    """z = If(ReduceSum(x) > 0) then relu(x) @ W + 1 else (x * 2) @ W, then tanh(z) - x[:, :1]:
    steps before the If (the condition from data), in both branches, and after it."""
    w = RNG.standard_normal((6, 4)).astype(np.float32)
    then_g = helper.make_graph(
        [
            helper.make_node("Relu", ["x"], ["r"]),
            helper.make_node("MatMul", ["r", "w"], ["m"]),
            helper.make_node("Add", ["m", "one"], ["t_out"]),
        ],
        "then",
        [],
        [helper.make_tensor_value_info("t_out", FL, [3, 4])],
        initializer=[numpy_helper.from_array(np.array(1.0, np.float32), "one")],
    )
    else_g = helper.make_graph(
        [helper.make_node("Mul", ["x", "two"], ["d"]), helper.make_node("MatMul", ["d", "w"], ["e_out"])],
        "else",
        [],
        [helper.make_tensor_value_info("e_out", FL, [3, 4])],
        initializer=[numpy_helper.from_array(np.array(2.0, np.float32), "two")],
    )
    g = helper.make_graph(
        [
            helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
            helper.make_node("Greater", ["s", "zero"], ["c"]),
            helper.make_node("If", ["c"], ["z"], name="pick", then_branch=then_g, else_branch=else_g),
            helper.make_node("Tanh", ["z"], ["tz"]),
            helper.make_node("Slice", ["x", "st", "en", "ax"], ["x0"]),
            helper.make_node("Sub", ["tz", "x0"], ["y"]),
        ],
        "data_if",
        [helper.make_tensor_value_info("x", FL, [3, 6])],
        [helper.make_tensor_value_info("y", FL, [3, 4])],
        initializer=[
            numpy_helper.from_array(w, "w"),
            numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
            numpy_helper.from_array(np.array([0], np.int64), "st"),
            numpy_helper.from_array(np.array([1], np.int64), "en"),
            numpy_helper.from_array(np.array([1], np.int64), "ax"),
        ],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def ill_typed_else_model() -> onnx.ModelProto:
    """If(c) then x * 2 else Reshape(x, [4, -1]): six elements do not reshape to 4 rows, so the
    else-branch cannot run on a [2, 3] input (ONNX Runtime fails inside it); the If's outputs are
    the then-branch's ([2, 3]) and a run that takes the else-branch is refused in one line."""
    then_g = helper.make_graph(
        [helper.make_node("Mul", ["x", "two"], ["t"])],
        "then",
        [],
        [helper.make_tensor_value_info("t", FL, ["a", "b"])],
        initializer=[numpy_helper.from_array(np.array(2.0, np.float32), "two")],
    )
    else_g = helper.make_graph(
        [helper.make_node("Reshape", ["x", "shape"], ["e"])],
        "else",
        [],
        [helper.make_tensor_value_info("e", FL, ["a", "b"])],
        initializer=[numpy_helper.from_array(np.array([4, -1], np.int64), "shape")],
    )
    g = helper.make_graph(
        [helper.make_node("If", ["c"], ["y"], name="sr_if", then_branch=then_g, else_branch=else_g)],
        "ill_typed",
        [helper.make_tensor_value_info("c", TensorProto.BOOL, []), helper.make_tensor_value_info("x", FL, ["n", 3])],
        [helper.make_tensor_value_info("y", FL, ["a", "b"])],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def nested_if_model() -> onnx.ModelProto:
    """y = If(sum(x) > 0) then (If(max(x) > 1) then sigmoid(x @ W) else x @ W) else (x - 1) @ W,
    then y * 3: the inner condition is data too, so the outer then-branch chooses on the host."""
    w = RNG.standard_normal((5, 4)).astype(np.float32)
    inner_then = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["im"]), helper.make_node("Sigmoid", ["im"], ["it"])],
        "inner_then",
        [],
        [helper.make_tensor_value_info("it", FL, [2, 4])],
    )
    inner_else = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["ie"])],
        "inner_else",
        [],
        [helper.make_tensor_value_info("ie", FL, [2, 4])],
    )
    outer_then = helper.make_graph(
        [
            helper.make_node("ReduceMax", ["x"], ["mx"], keepdims=0),
            helper.make_node("Greater", ["mx", "one"], ["c2"]),
            helper.make_node("If", ["c2"], ["ot"], name="inner", then_branch=inner_then, else_branch=inner_else),
        ],
        "outer_then",
        [],
        [helper.make_tensor_value_info("ot", FL, [2, 4])],
    )
    outer_else = helper.make_graph(
        [helper.make_node("Sub", ["x", "one"], ["xm"]), helper.make_node("MatMul", ["xm", "w"], ["oe"])],
        "outer_else",
        [],
        [helper.make_tensor_value_info("oe", FL, [2, 4])],
    )
    g = helper.make_graph(
        [
            helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
            helper.make_node("Greater", ["s", "zero"], ["c"]),
            helper.make_node("If", ["c"], ["z"], name="outer", then_branch=outer_then, else_branch=outer_else),
            helper.make_node("Mul", ["z", "three"], ["y"]),
        ],
        "nested_if",
        [helper.make_tensor_value_info("x", FL, [2, 5])],
        [helper.make_tensor_value_info("y", FL, [2, 4])],
        initializer=[
            numpy_helper.from_array(w, "w"),
            numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
            numpy_helper.from_array(np.array(1.0, np.float32), "one"),
            numpy_helper.from_array(np.array(3.0, np.float32), "three"),
        ],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m
