"""Hand-made ONNX models with control flow (onnx.helper), shared by the control-flow tests."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

F = TensorProto.FLOAT
OPSET = 17


def _model(graph: onnx.GraphProto) -> onnx.ModelProto:
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def _branches(x: str = "x", w: str = "w"):
    """then: x * w + 1 (captures x, w); else: x - w (captures x, w)."""
    then_g = helper.make_graph(
        [helper.make_node("Mul", [x, w], ["t0"]), helper.make_node("Add", ["t0", "one"], ["t_out"])],
        "then",
        [],
        [helper.make_tensor_value_info("t_out", F, [2, 3])],
        initializer=[numpy_helper.from_array(np.array(1.0, np.float32), "one")],
    )
    else_g = helper.make_graph(
        [helper.make_node("Sub", [x, w], ["e_out"])], "else", [], [helper.make_tensor_value_info("e_out", F, [2, 3])]
    )
    return then_g, else_g


W = np.arange(6, dtype=np.float32).reshape(2, 3) / 4 - 0.5


def if_on_input() -> onnx.ModelProto:
    """If on an input scalar (data-dependent): captures an input and an initializer."""
    then_g, else_g = _branches()
    g = helper.make_graph(
        [helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)],
        "if_input",
        [helper.make_tensor_value_info("c", TensorProto.BOOL, []), helper.make_tensor_value_info("x", F, [2, 3])],
        [helper.make_tensor_value_info("y", F, [2, 3])],
        initializer=[numpy_helper.from_array(W, "w")],
    )
    return _model(g)


def if_on_constant(value: bool) -> onnx.ModelProto:
    then_g, else_g = _branches()
    g = helper.make_graph(
        [
            helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(np.array(value), "c")),
            helper.make_node("Relu", ["x"], ["rx"]),
            helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g),
            helper.make_node("Add", ["y", "rx"], ["z"]),
        ],
        "if_const",
        [helper.make_tensor_value_info("x", F, [2, 3])],
        [helper.make_tensor_value_info("z", F, [2, 3])],
        initializer=[numpy_helper.from_array(W, "w")],
    )
    return _model(g)


def if_on_shape(dim: int | str = 2) -> onnx.ModelProto:
    """If (x.shape[0] == 2) as exporters write it: Shape -> Gather -> Equal."""
    then_g, else_g = _branches()
    for g in (then_g, else_g):
        g.output[0].CopyFrom(helper.make_tensor_value_info(g.output[0].name, F, [dim, 3]))
    g = helper.make_graph(
        [
            helper.make_node("Shape", ["x"], ["s"]),
            helper.make_node("Gather", ["s", "zero"], ["d0"], axis=0),
            helper.make_node("Equal", ["d0", "two"], ["c"]),
            helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g),
        ],
        "if_shape",
        [helper.make_tensor_value_info("x", F, [dim, 3])],
        [helper.make_tensor_value_info("y", F, [dim, 3])],
        initializer=[
            numpy_helper.from_array(np.array([1.0, 2.0, 3.0], np.float32), "w"),
            numpy_helper.from_array(np.array(0, np.int64), "zero"),
            numpy_helper.from_array(np.array(2, np.int64), "two"),
        ],
    )
    return _model(g)


def loop_static(trip: int = 5, early_exit: bool = False, nested_if: bool = False) -> onnx.ModelProto:
    """Loop M=trip: acc = acc * 0.5 + x * i (captures x), scan output acc + 1 per iteration.
    With `early_exit` the body's condition is sum(acc) < 40 (data-dependent); with `nested_if`
    the update is If(i even) then acc*0.5+x*i else acc - x (captured through two scopes)."""
    upd_nodes = [
        helper.make_node("Cast", ["i"], ["fi"], to=F),
        helper.make_node("Mul", ["x", "fi"], ["xi"]),
        helper.make_node("Mul", ["acc_in", "half"], ["ah"]),
        helper.make_node("Add", ["ah", "xi"], ["acc_upd"]),
    ]
    if nested_if:
        then_g = helper.make_graph(
            upd_nodes[1:] + [helper.make_node("Identity", ["acc_upd"], ["then_out"])],
            "even",
            [],
            [helper.make_tensor_value_info("then_out", F, [2, 3])],
        )
        else_g = helper.make_graph(
            [helper.make_node("Sub", ["acc_in", "x"], ["else_out"])],
            "odd",
            [],
            [helper.make_tensor_value_info("else_out", F, [2, 3])],
        )
        upd_nodes = [
            helper.make_node("Cast", ["i"], ["fi"], to=F),
            helper.make_node("Mod", ["i", "two"], ["r"]),
            helper.make_node("Equal", ["r", "zero"], ["even"]),
            helper.make_node("If", ["even"], ["acc_upd"], then_branch=then_g, else_branch=else_g),
        ]
    nodes = [*upd_nodes, helper.make_node("Add", ["acc_upd", "one"], ["scan_out"])]
    if early_exit:
        nodes += [
            helper.make_node("ReduceSum", ["acc_upd"], ["tot"], keepdims=0),
            helper.make_node("Less", ["tot", "forty"], ["cond_out"]),
        ]
    else:
        nodes += [helper.make_node("Identity", ["cond_in"], ["cond_out"])]
    nodes += [helper.make_node("Identity", ["acc_upd"], ["acc_out"])]
    body = helper.make_graph(
        nodes,
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("acc_in", F, [2, 3]),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("acc_out", F, [2, 3]),
            helper.make_tensor_value_info("scan_out", F, [2, 3]),
        ],
    )
    g = helper.make_graph(
        [helper.make_node("Loop", ["M", "c0", "acc0"], ["acc", "scans"], body=body)],
        "loop",
        [helper.make_tensor_value_info("x", F, [2, 3]), helper.make_tensor_value_info("acc0", F, [2, 3])],
        [helper.make_tensor_value_info("acc", F, [2, 3]), helper.make_tensor_value_info("scans", F, ["T", 2, 3])],
        initializer=[
            numpy_helper.from_array(np.array(trip, np.int64), "M"),
            numpy_helper.from_array(np.array(True), "c0"),
            numpy_helper.from_array(np.array(0.5, np.float32), "half"),
            numpy_helper.from_array(np.array(1.0, np.float32), "one"),
            numpy_helper.from_array(np.array(40.0, np.float32), "forty"),
            numpy_helper.from_array(np.array(2, np.int64), "two"),
            numpy_helper.from_array(np.array(0, np.int64), "zero"),
        ],
    )
    return _model(g)


def scan_cumsum(length: int = 4, reverse: bool = False, out_axis: int = 0) -> onnx.ModelProto:
    """Scan over axis 1 of x [2, length, 3]: state s = s + x_t * w (captures w), scan out tanh(s)."""
    body = helper.make_graph(
        [
            helper.make_node("Mul", ["xt", "w"], ["xw"]),
            helper.make_node("Add", ["s_in", "xw"], ["s_out"]),
            helper.make_node("Tanh", ["s_out"], ["y_t"]),
        ],
        "scan_body",
        [helper.make_tensor_value_info("s_in", F, [2, 3]), helper.make_tensor_value_info("xt", F, [2, 3])],
        [helper.make_tensor_value_info("s_out", F, [2, 3]), helper.make_tensor_value_info("y_t", F, [2, 3])],
    )
    g = helper.make_graph(
        [
            helper.make_node(
                "Scan",
                ["s0", "x"],
                ["s", "ys"],
                body=body,
                num_scan_inputs=1,
                scan_input_axes=[1],
                scan_input_directions=[1 if reverse else 0],
                scan_output_axes=[out_axis],
            )
        ],
        "scan",
        [helper.make_tensor_value_info("s0", F, [2, 3]), helper.make_tensor_value_info("x", F, [2, length, 3])],
        [helper.make_tensor_value_info("s", F, [2, 3]), helper.make_tensor_value_info("ys", F, ["a", "b", "c"])],
        initializer=[numpy_helper.from_array(np.array([0.5, -1.0, 2.0], np.float32), "w")],
    )
    return _model(g)
