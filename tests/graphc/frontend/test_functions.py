"""Expansion of ONNX function ops into their function bodies (graphc/frontend/functions.py).

Converters are hidden per test (`hide`) so that the expansion path runs whatever converters the op
families register: a native converter always wins, so an op with one is never expanded otherwise.
"""

from __future__ import annotations

import logging

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import graphc
from graphc.errors import UnsupportedOpError
from graphc.frontend import convert, functions
from graphc.frontend.registry import find_converter as real_find_converter
from helpers import make_node_model, rand, run_ort


@pytest.fixture
def hide(monkeypatch):
    """hide("Celu", ...): the frontend sees no converter for these ops."""

    def _hide(*ops: str) -> None:
        hidden = set(ops)

        def find(op_type: str, domain: str, opset: int):
            return None if op_type in hidden else real_find_converter(op_type, domain, opset)

        monkeypatch.setattr(convert, "find_converter", find)

    return _hide


def need(*ops: str, opset: int = 28) -> None:
    """Skip while an op family that the body needs has not landed yet."""
    missing = [op for op in ops if real_find_converter(op, "", opset) is None]
    if missing:
        pytest.skip(f"no converter yet for {missing}")


def ops_of(graph) -> set[str]:
    return {n.op for n in graph.nodes}


def celu_ref(x: np.ndarray, alpha: float) -> np.ndarray:
    return (np.maximum(0, x) + np.minimum(0, alpha * (np.exp(x / alpha) - 1))).astype(x.dtype)


# ---- end to end through graphc ----------------------------------------------------------------


@pytest.mark.parametrize("alpha", [None, 2.0])
def test_celu_expands_nested_elu_and_defaults_alpha(hide, alpha):
    # Celu's body calls Elu, itself a function op: both expand (nested), and @alpha resolves to
    # the node's attribute or the schema default (1.0) when the node has none.
    need("Constant", "CastLike", "Div", "Mul", "Less", "Exp", "Sub", "Where")
    hide("Celu", "Elu")
    x = rand((3, 1, 5), seed=1)
    attrs = {} if alpha is None else {"alpha": alpha}
    model = make_node_model("Celu", {"x": x}, attrs)
    g = graphc.load_onnx(model)
    assert not ops_of(g) & {"Celu", "Elu"}
    y = graphc.interpret(g, {"x": x})["y"]
    np.testing.assert_allclose(y, celu_ref(x, alpha or 1.0), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("opset", [13, 18])
def test_softmax_context_dependent_body_matches_ort(hide, opset):
    # Softmax has a context-dependent body with one version per opset (13: ReduceSum takes axes
    # as an input, ReduceMax as an attribute; 18: both as inputs). The model's opset picks it.
    need("ReduceMax", "ReduceSum", "Sub", "Exp", "Div", opset=opset)
    hide("Softmax")
    x = rand((2, 3, 4), seed=2)
    model = make_node_model("Softmax", {"x": x}, {"axis": 1}, opset=opset)
    g = graphc.load_onnx(model)
    assert "Softmax" not in ops_of(g)
    np.testing.assert_allclose(graphc.interpret(g, {"x": x})["y"], run_ort(model, {"x": x})["y"], rtol=1e-5)


def test_layer_norm_with_an_omitted_middle_output(hide):
    need("Shape", "Size", "Slice", "Neg", "ConstantOfShape", "Concat", "Flatten", "Cast", "ReduceMean")
    hide("LayerNormalization")
    x, s, b = rand((2, 3, 4), seed=3), rand((4,), seed=4), rand((4,), seed=5)
    node = helper.make_node("LayerNormalization", ["x", "s", "b"], ["y", "", "inv"], axis=-1)
    graph = helper.make_graph(
        [node],
        "ln",
        [helper.make_tensor_value_info(k, TensorProto.FLOAT, v.shape) for k, v in (("x", x), ("s", s), ("b", b))],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 4]),
            helper.make_tensor_value_info("inv", TensorProto.FLOAT, [2, 3, 1]),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 10
    g = graphc.load_onnx(model)
    assert "LayerNormalization" not in ops_of(g)
    got = graphc.interpret(g, {"x": x, "s": s, "b": b})
    want = run_ort(model, {"x": x, "s": s, "b": b})
    for k in ("y", "inv"):
        np.testing.assert_allclose(got[k], want[k], rtol=1e-4, atol=1e-5)


def test_clip_with_an_omitted_optional_input(hide):
    # Clip's body depends on which of min/max are given; an omitted one stays omitted inside.
    need("Less", "Where")
    hide("Clip")
    x = rand((5, 4), seed=6)
    hi = np.array(0.5, dtype=np.float32)
    model = make_node_model("Clip", {"x": x}, initializers={"hi": hi}, input_order=["x", "", "hi"], opset=13)
    g = graphc.load_onnx(model)
    assert "Clip" not in ops_of(g)
    np.testing.assert_allclose(graphc.interpret(g, {"x": x})["y"], np.minimum(x, hi))


def test_two_expansions_and_clashing_names_stay_apart(hide):
    # Two Celu nodes expand to the same body; a model value is named like a body value would be.
    need("Constant", "CastLike", "Div", "Mul", "Less", "Exp", "Sub", "Where")
    hide("Celu")
    x = rand((4,), seed=7)
    nodes = [
        helper.make_node("Celu", ["x"], ["c/Alpha"], name="c", alpha=0.5),
        helper.make_node("Celu", ["c/Alpha"], ["y"], name="d", alpha=3.0),
    ]
    graph = helper.make_graph(
        nodes,
        "two",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 28)])
    g = graphc.load_onnx(model)
    y = graphc.interpret(g, {"x": x})["y"]
    np.testing.assert_allclose(y, celu_ref(celu_ref(x, 0.5), 3.0), rtol=1e-5, atol=1e-6)


def test_native_converter_wins():
    need("Softmax")
    x = rand((2, 3), seed=8)
    g = graphc.load_onnx(make_node_model("Softmax", {"x": x}, {"axis": 1}))
    assert "Softmax" in ops_of(g)


def test_expansion_logged_once_per_op(hide, caplog):
    need("Constant", "CastLike", "Div", "Mul", "Elu")
    hide("Celu")
    nodes = [helper.make_node("Celu", ["x"], ["t"]), helper.make_node("Celu", ["t"], ["y"])]
    graph = helper.make_graph(
        nodes,
        "log",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 28)])
    with caplog.at_level(logging.INFO, logger="graphc.frontend.convert"):
        graphc.load_onnx(model)
    msgs = [r.getMessage() for r in caplog.records if "Celu" in r.getMessage()]
    assert len(msgs) == 1 and "expanding Celu" in msgs[0]


# ---- find_unsupported ---------------------------------------------------------------------


def test_unsupported_when_a_body_op_is_missing(hide):
    need("Constant", "CastLike", "Mul", "Elu")
    x = rand((3,), seed=9)
    model = make_node_model("Celu", {"x": x}, {"alpha": 2.0})
    hide("Celu")
    if real_find_converter("Div", "", 28) is not None:
        assert convert.find_unsupported(model) == []
    hide("Celu", "Div")  # Div is in Celu's body: the expansion cannot be converted either
    assert convert.find_unsupported(model) == [("Celu", "", 28, ["#0"])]
    with pytest.raises(UnsupportedOpError, match="Celu"):
        graphc.load_onnx(model)


def test_context_dependent_body_of_an_untyped_intermediate(hide):
    # LayerNormalization's body needs its input's element type; the input is an intermediate
    # with no value_info, so find_unsupported takes the type from ONNX shape inference.
    need("Relu", "Shape", "Size", "Slice", "Neg", "ConstantOfShape", "Concat", "Flatten", "Cast", "ReduceMean")
    hide("LayerNormalization")
    nodes = [
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node("LayerNormalization", ["r", "s"], ["y"], axis=-1),
    ]
    graph = helper.make_graph(
        nodes,
        "ln",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
        [onnx.numpy_helper.from_array(np.ones(4, np.float32), "s")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    assert convert.find_unsupported(model) == []
    x = rand((2, 4), seed=10)
    y = graphc.interpret(graphc.load_onnx(model), {"x": x})["y"]
    r = np.maximum(x, 0)
    want = (r - r.mean(-1, keepdims=True)) / np.sqrt(r.var(-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-5)


# ---- expand_node on protos (independent of graphc's converters) -----------------------------


def test_expand_node_binds_inputs_outputs_and_attributes():
    node = helper.make_node("Celu", ["a"], ["b"], name="n", alpha=0.25)
    tp = helper.make_tensor_type_proto(TensorProto.FLOAT, [3])
    exp = functions.expand_node(node, {"": 28}, [tp], prefix="n/")
    assert exp is not None
    assert exp.inputs == ("n/X",) and exp.outputs == ("b",)
    assert exp.opsets[""] == 28 and exp.since_version == 28
    ops = [n.op_type for n in exp.nodes]
    assert ops == ["Constant", "CastLike", "Div", "Elu", "Mul"]
    const = exp.nodes[0]
    assert const.attribute[0].name == "value_float" and const.attribute[0].f == 0.25
    assert not const.attribute[0].ref_attr_name
    assert exp.nodes[-1].output[0] == "b"
    assert all(n.name.startswith("n/") for n in exp.nodes)


def test_expand_node_function_version_follows_the_opset():
    # Elu-22's body is the opset-18 function; at opset 17 Elu (version 6) has no body.
    node = helper.make_node("Elu", ["x"], ["y"])
    tp = helper.make_tensor_type_proto(TensorProto.FLOAT, [2])
    assert functions.expand_node(node, {"": 17}, [tp], prefix="") is None
    exp = functions.expand_node(node, {"": 22}, [tp], prefix="")
    assert exp is not None and exp.opsets[""] == 18
    # a non-function op has no expansion
    assert functions.expand_node(helper.make_node("MatMul", ["x", "x"], ["y"]), {"": 28}, [tp, tp], prefix="") is None


@pytest.mark.parametrize(
    "op, attrs, opset, n_in",
    [
        ("Celu", {"alpha": 1.5}, 12, 1),
        ("Softmax", {"axis": 0}, 13, 1),
        ("LogSoftmax", {"axis": -1}, 18, 1),
        ("HardSigmoid", {"alpha": 0.3}, 22, 1),
        ("Shrink", {"lambd": 0.7, "bias": 0.1}, 18, 1),
        ("MeanVarianceNormalization", {}, 18, 1),
        ("LayerNormalization", {"axis": 1, "epsilon": 1e-3}, 17, 3),
        ("GreaterOrEqual", {}, 16, 2),
    ],
)
def test_expanded_protos_match_ort(op, attrs, opset, n_in):
    # The expanded nodes, run by ONNX Runtime, give what ORT gives for the op itself.
    shapes = {"LayerNormalization": [(2, 3, 4), (3, 4), (3, 4)], "MeanVarianceNormalization": [(2, 3, 4, 5)]}.get(
        op, [(2, 3, 4)] * n_in
    )
    inputs = {f"i{k}": rand(shapes[k], seed=20 + k) for k in range(n_in)}
    model = make_node_model(op, inputs, attrs, opset=opset)
    node = model.graph.node[0]
    types = [vi.type for vi in model.graph.input]
    exp = functions.expand_node(node, {"": opset}, types, prefix="F/")
    assert exp is not None
    binds = [helper.make_node("Identity", [a], [f]) for a, f in zip(node.input, exp.inputs, strict=True)]
    graph = helper.make_graph(binds + list(exp.nodes), "exp", model.graph.input, model.graph.output)
    expanded = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in exp.opsets.items()])
    expanded.ir_version = model.ir_version
    want = run_ort(model, inputs)
    got = run_ort(expanded, inputs)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6)


def test_missing_ops_reports_body_ops():
    node = helper.make_node("Celu", ["x"], ["y"])
    tp = helper.make_tensor_type_proto(TensorProto.FLOAT, [2])
    everything = functions.missing_ops(node, {"": 28}, [tp], lambda op, d, v: True)
    assert everything == []
    no_div = functions.missing_ops(node, {"": 28}, [tp], lambda op, d, v: op not in ("Celu", "Div"))
    assert no_div == [("Div", "", 28)]
    # Elu has no converter either: it expands (nested) and its own body ops are checked
    nested = functions.missing_ops(node, {"": 28}, [tp], lambda op, d, v: op not in ("Celu", "Elu", "Exp"))
    assert nested == [("Exp", "", 18)]
    matmul = helper.make_node("MatMul", ["x", "x"], ["y"])
    assert functions.missing_ops(matmul, {"": 28}, [tp, tp], lambda *a: False) is None
