"""If, Loop and Scan: import with outer-scope captures, the interpreter against ONNX Runtime, the
verifier on subgraphs, the text form, and lowering's refusal of data-dependent control flow."""

from __future__ import annotations

import cf_models as M
import numpy as np
import pytest

import graphc
from graphc.errors import VerificationError
from graphc.ir.builder import GraphBuilder
from graphc.ir.graph import Graph
from graphc.ir.text import TextParseError, format_graph, parse_graph
from graphc.ir.types import DType, TensorType
from graphc.ir.verify import verify_graph
from helpers import assert_close, run_graphc, run_ort

RNG = np.random.default_rng(7)
X = RNG.standard_normal((2, 3)).astype(np.float32)
F32 = TensorType(DType.float32, (2, 3))


def _same(model, feeds) -> dict:
    expected = run_ort(model, feeds)
    actual = run_graphc(model, feeds)
    assert set(actual) == set(expected)
    for k in expected:
        assert_close(actual[k], expected[k], rtol=1e-5, atol=1e-6, what=k)
    return actual


@pytest.mark.parametrize("cond", [True, False])
def test_if_on_input_scalar(cond):
    out = _same(M.if_on_input(), {"c": np.array(cond), "x": X})
    w = M.W
    np.testing.assert_allclose(out["y"], X * w + 1 if cond else X - w, rtol=1e-6)


@pytest.mark.parametrize("cond", [True, False])
def test_if_on_constant(cond):
    _same(M.if_on_constant(cond), {"x": X})


@pytest.mark.parametrize("rows", [2, 5])
def test_if_on_shape_comparison(rows):
    _same(M.if_on_shape("N"), {"x": RNG.standard_normal((rows, 3)).astype(np.float32)})


@pytest.mark.parametrize("trip", [0, 1, 5])
def test_loop_static_trip_count_carried_state_and_scan_outputs(trip):
    out = _same(M.loop_static(trip), {"x": X, "acc0": X})
    assert out["scans"].shape == (trip, 2, 3)


def test_loop_early_exit_on_data():
    _same(M.loop_static(10, early_exit=True), {"x": X, "acc0": X})


def test_nested_if_inside_loop_captures_through_two_scopes():
    model = M.loop_static(6, nested_if=True)
    _same(model, {"x": X, "acc0": X})
    g = graphc.load_onnx(model)
    (loop,) = g.nodes
    (inner,) = [n for n in loop.attrs.body.nodes if n.op == "If"]
    # The If reads x from the main graph: a capture of the body, captured again by the branch.
    assert "x" in [v.name for v in loop.attrs.body.captures]
    assert [v.name for v in inner.attrs.then_branch.captures][0] == "x"


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("out_axis", [0, 1, -1])
def test_scan_over_sequence_axis(reverse, out_axis):
    _same(M.scan_cumsum(4, reverse, out_axis), {"s0": X, "x": RNG.standard_normal((2, 4, 3)).astype(np.float32)})


def test_inference_knows_static_shapes():
    g = graphc.load_onnx(M.loop_static(5))
    assert [str(v.type) for v in g.outputs] == ["f32[2,3]", "f32[5,2,3]"]
    g = graphc.load_onnx(M.loop_static(5, early_exit=True))
    assert g.outputs[1].type.shape == (None, 2, 3)  # the trip count is data-dependent
    g = graphc.load_onnx(M.scan_cumsum(4, False, 1))
    assert g.outputs[1].type.shape == (2, 4, 3)


def _branch(name: str, cap_type: TensorType, op: str) -> Graph:
    b = GraphBuilder(name)
    c = b.add_capture("xc", cap_type)
    b.set_outputs([b.op(op, [c])])
    return b.build()


def test_verifier_checks_subgraphs():
    b = GraphBuilder("g")
    c = b.add_input("c", TensorType(DType.bool, ()))
    x = b.add_input("x", F32)
    y = b.add_node("If", [c, x, x], {"then_branch": _branch("t", F32, "Relu"), "else_branch": _branch("e", F32, "Neg")})
    b.set_outputs(y.outputs)
    g = b.build()
    assert format_graph(g).count("capture %xc") == 2
    # A subgraph reading a value it neither defines nor captures is caught, naming the subgraph.
    bad = _branch("t", F32, "Relu")
    v = bad.nodes[0].inputs[0]
    broken = bad.with_nodes(bad.nodes)
    object.__setattr__(broken, "captures", ())
    node = g.nodes[0]
    bad_node = type(node)(node.op, node.name, node.inputs[:2], node.outputs, node.attrs.replace(then_branch=broken))
    with pytest.raises(VerificationError, match=rf"in its subgraph 'then_branch'.*'{v.name}' is not defined"):
        verify_graph(g.with_nodes([bad_node]))


def test_capture_bound_to_wrong_type_is_an_error():
    b = GraphBuilder("g")
    c = b.add_input("c", TensorType(DType.bool, ()))
    x = b.add_input("x", TensorType(DType.float32, (4,)))
    with pytest.raises(graphc.errors.ShapeError, match="then-branch capture 'xc'"):
        b.add_node("If", [c, x, x], {"then_branch": _branch("t", F32, "Relu"), "else_branch": _branch("e", F32, "Neg")})


@pytest.mark.parametrize(
    "make", [M.if_on_input, lambda: M.loop_static(3, nested_if=True), lambda: M.scan_cumsum(4, True, 1)]
)
def test_text_prints_subgraphs_and_parses_them_back(make):
    g = graphc.load_onnx(make())
    text = format_graph(g)
    assert "capture %" in text and ": graph " in text
    back = parse_graph(text, {name: c.data for name, c in g.constants.items()})
    assert format_graph(back) == text


def test_parse_graph_names_a_missing_subgraph_block():
    text = format_graph(graphc.load_onnx(M.if_on_input()))
    cut = text[: text.index("    else_branch:")] + text[text.index("    then_branch:") :]
    with pytest.raises(TextParseError, match="subgraph attributes .* differ"):
        parse_graph(cut, {"w": M.W})


def test_data_dependent_if_and_a_long_loop_compile_for_cuda():
    # both targets run a data-dependent If as sub-plans chosen on the host: tests/runtime/test_cpu_host_if.py,
    # tests/runtime/test_cuda_host_if.py; a Loop that stays a loop is a host loop (tests/runtime/*host_loop*)
    eng = graphc.compile(M.if_on_input(), target="cuda", arch=["sm_90"])
    assert any("CUDA engine reads the condition back" in line for line in eng.report["control_flow"])
    eng = graphc.compile(M.loop_static(100), target="cuda", arch=["sm_90"])
    assert any("not unrolled (100 iterations" in line for line in eng.report["control_flow"])


def test_unsupported_op_inside_a_branch_is_listed_at_load():
    model = M.if_on_input()
    sub = next(a.g for a in model.graph.node[0].attribute if a.name == "else_branch").node[0]
    sub.op_type = "StringNormalizer"  # graphc has no string tensors
    del sub.input[1:]
    with pytest.raises(
        graphc.errors.UnsupportedOpError, match=r"StringNormalizer \(opset 17; nodes '#0/else_branch/0'\)"
    ):
        graphc.load_onnx(model)
