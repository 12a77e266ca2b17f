"""The IR text form parses back: every zoo model's graph (loaded and optimized, for both targets)
round-trips, wrong text gets an error naming its line, and structural equality tells graphs apart
by computation, not by names."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import numpy as np
import pytest

import graphc
import models
from graphc.ir.builder import GraphBuilder
from graphc.ir.equality import assert_structurally_equal, structural_diff, structurally_equal
from graphc.ir.graph import Graph
from graphc.ir.text import TextParseError, format_graph, parse_graph
from graphc.ir.types import DType, TensorType
from graphc.passes import OptimizeOptions, optimize
from graphc.passes.target import Target

ZOO = {
    "mlp": {},
    "resnet": {},
    "mobilenetv2": {},
    "bert": {},
    "bert-decomposed": {"layernorm": "decomposed", "pooler": True, "token_type_input": True},
    "vit-opset13": {"opset": 13},
}


@functools.cache
def _zoo_graph(variant: str) -> Graph:
    name = variant.split("-")[0]
    model = models.build(name, "tiny", **ZOO[variant])
    feeds = models.sample_inputs(name, model, seed=1)
    return graphc.bind_shapes(graphc.load_onnx(model), {k: v.shape for k, v in feeds.items()})


def _round_trip(g: Graph) -> Graph:
    text = format_graph(g)
    back = parse_graph(text, {name: c.data for name, c in g.constants.items()})
    assert format_graph(back) == text
    assert_structurally_equal(back, g, names=True)
    return back


@pytest.mark.parametrize("variant", list(ZOO))
@pytest.mark.parametrize("target", [Target(), Target("cuda", "fp16")], ids=str)
@pytest.mark.parametrize("level", [0, 2])
def test_every_zoo_graph_round_trips(variant, target, level):
    g = optimize(_zoo_graph(variant), OptimizeOptions(opt_level=level, target=target)).graph
    back = _round_trip(g)
    if level == 2:
        assert any(n.op == "Fused" for n in back.nodes)  # the fused form is among what parsed


SMALL = """\
graph small (opset 17)
  input  %x: f32[2,3]
  const  %b: f32[3] = [0.5, -1.0, 2.0]
  const  %w: f32[3,4] = sha1:{digest}
  %"h 1": f32[2,3] = Add[add0](%x, %b)
  %y: f32[2,4] = MatMul["mm:"](%"h 1", %w)
  output %y: f32[2,4] as 'out'
"""


def _small_text(w: np.ndarray) -> str:
    from graphc.ir.text import data_digest

    return SMALL.format(digest=data_digest(w))


def test_hand_written_text_parses_and_runs():
    w = np.arange(12, dtype=np.float32).reshape(3, 4)
    g = parse_graph(_small_text(w), {"w": w})
    assert [n.name for n in g.nodes] == ["add0", "mm:"] and g.output_names == ("out",)
    x = np.ones((2, 3), np.float32)
    got = graphc.interpret(g, {"x": x})["out"]
    np.testing.assert_array_equal(got, (x + np.array([0.5, -1.0, 2.0], np.float32)) @ w)
    _round_trip(g)


@pytest.mark.parametrize(
    "edit, message",
    [
        (("f32[2,4] = MatMul", "f32[2,5] = MatMul"), "stated as f32[2,5] but MatMul infers f32[2,4]"),
        (("MatMul[", "MatMool["), "unknown op 'MatMool'"),
        (('(%"h 1", %w)', "(%h2, %w)"), "input %h2 is not defined"),
        (("= [0.5, -1.0, 2.0]", "= [0.5, -1.0]"), "constant %b"),
        (("Add[add0](%x, %b)", "Add[add0](%x, %b) {alpha=1}"), "bad attributes"),
        (("output %y: f32[2,4]", "output %y: f32[2,3]"), "output %y is stated as f32[2,3]"),
        (("  input  %x: f32[2,3]\n", "  input  %x: f32[2,3]\n  input  %x: f32[2,3]\n"), "line 3"),
    ],
)
def test_wrong_text_is_an_error_naming_the_line(edit, message):
    w = np.arange(12, dtype=np.float32).reshape(3, 4)
    text = _small_text(w).replace(*edit)
    with pytest.raises(TextParseError, match=message.replace("[", r"\[").replace("(", r"\(")) as e:
        parse_graph(text, {"w": w})
    assert "line" in str(e.value) or "invalid" in str(e.value)


def test_constants_by_digest_need_matching_data():
    w = np.arange(12, dtype=np.float32).reshape(3, 4)
    text = _small_text(w)
    with pytest.raises(TextParseError, match="pass its data in"):
        parse_graph(text)
    with pytest.raises(TextParseError, match="does not match digest"):
        parse_graph(text, {"w": w + 1})
    with pytest.raises(TextParseError, match="the data given is float64"):
        parse_graph(text, {"w": w.astype(np.float64)})


def test_inline_constants_and_tensor_attrs_are_exact():
    b = GraphBuilder("exact", 17)
    x = b.add_input("x", TensorType(DType.float16, (3,)))
    c = b.add_constant(np.array([np.nan, -np.inf, 65504.0], np.float16), "c")
    shape = b.add_constant(np.array([3], np.int64), "shape")
    fill = b.op("ConstantOfShape", [shape], {"value": np.array([0.1], np.float16)})
    b.set_outputs([b.op("Add", [b.op("Mul", [x, c]), fill])])
    g = b.build()
    back = _round_trip(g)
    assert back.constants["c"].data.tobytes() == g.constants["c"].data.tobytes()


def test_odd_names_are_quoted_and_read_back():
    b = GraphBuilder("names", 17)
    x = b.add_input("onnx::input 0", TensorType(DType.float32, (2,)))
    y = b.op("Relu", [x], name='a "quoted", [bracketed] name:')
    b.set_outputs([b.op("Neg", [y], name="onnx::Neg_1")], ["out put"])
    _round_trip(b.build())


# ---- structural equality ------------------------------------------------------------------------


def _chain(names: tuple[str, str], order: str = "ab", alpha: float = 0.1) -> Graph:
    b = GraphBuilder("g", 17)
    x = b.add_input(names[0], TensorType(DType.float32, (4,)))
    branches = {}
    for k in order:
        branches[k] = b.op("Relu", [x], name=f"{names[1]}{k}") if k == "a" else b.op("LeakyRelu", [x], {"alpha": alpha})
    b.set_outputs([b.op("Sub", [branches["a"], branches["b"]], name=f"{names[1]}sub")], ["y"])
    return b.build()


def test_structural_equality_ignores_names_and_independent_order():
    a = _chain(("x", "n"), "ab")
    b = _chain(("input", "m"), "ba")
    assert structurally_equal(a, b)
    assert "named" in structural_diff(a, b, names=True)


def test_structural_equality_sees_attrs_operand_order_and_dead_nodes():
    a = _chain(("x", "n"))
    assert "attributes" in structural_diff(a, _chain(("x", "n"), alpha=0.2))
    swapped = parse_graph(format_graph(a).replace("Sub[nsub](%na, %LeakyRelu)", "Sub[nsub](%LeakyRelu, %na)"))
    assert structural_diff(a, swapped) is not None
    dead = parse_graph(format_graph(a).replace("  output", "  %dead: f32[4] = Neg[dead](%x)\n  output"))
    assert "dead nodes" in structural_diff(a, dead)
    with pytest.raises(AssertionError, match="graphs differ"):
        assert_structurally_equal(a, dead)


def test_text_module_imports_no_op_library_at_module_level():
    source = Path(graphc.ir.text.__file__).read_text()
    for node in ast.parse(source).body:
        if isinstance(node, ast.ImportFrom):
            assert not (node.module or "").startswith("graphc.ops"), node.module
        if isinstance(node, ast.Import):
            assert not any(a.name.startswith("graphc.ops") for a in node.names)
