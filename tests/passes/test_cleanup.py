"""Constant folding, simplify, CSE, DCE and the pass manager."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import graphc
from graphc.ir import verify_graph
from graphc.ir.equality import assert_structurally_equal
from graphc.ir.text import parse_graph
from graphc.passes import OptimizeOptions, optimize
from graphc.passes.constant_folding import fold_constants
from graphc.passes.cse import eliminate_common_subexpressions
from graphc.passes.dce import eliminate_dead_code
from graphc.passes.report import optimizer_report, summarize
from graphc.passes.simplify import simplify


def _model(nodes, inputs, outputs, inits=(), opset=17):
    g = helper.make_graph(nodes, "g", inputs, outputs, [numpy_helper.from_array(v, k) for k, v in inits])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _vi(name, shape, t=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, t, shape)


def _exporter_shape_chain():
    """What exporters emit to flatten x: Shape -> Gather -> Unsqueeze -> Concat -> Reshape."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
        helper.make_node("Unsqueeze", ["n", "axes0"], ["n1"]),
        helper.make_node("Concat", ["n1", "minus1"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["flat"]),
        helper.make_node("Identity", ["flat"], ["flat2"]),
        helper.make_node("Relu", ["flat2"], ["r1"]),
        helper.make_node("Relu", ["flat2"], ["r2"]),  # a duplicate of r1: CSE merges it
        helper.make_node("Add", ["r1", "r2"], ["y"]),
        helper.make_node("Neg", ["x"], ["dead"]),  # feeds nothing
    ]
    inits = [
        ("zero", np.array(0, np.int64)),
        ("axes0", np.array([0], np.int64)),
        ("minus1", np.array([-1], np.int64)),
    ]
    return _model(nodes, [_vi("x", ["batch", 3, 4])], [_vi("y", ["batch", 12])], inits)


def test_shape_chain_folds_away_once_shapes_are_bound():
    g = graphc.bind_shapes(graphc.load_onnx(_exporter_shape_chain()), {"batch": 5})
    res = optimize(g, OptimizeOptions(opt_level=1, verify=True))
    opt = res.graph
    # The shape arithmetic became one constant target, Identity went, the two Relus became one,
    # the dead Neg is gone.
    expected = """
      graph g (opset 17)
        input  %x: f32[5,3,4]
        const  %target: i64[2] = [5, -1]
        %flat: f32[5,12] = Reshape[r](%x, %target)
        %r1: f32[5,12] = Relu[relu](%flat)
        %y: f32[5,12] = Add[add](%r1, %r1)
        output %y: f32[5,12]
    """
    assert_structurally_equal(opt, parse_graph(expected))
    x = np.random.default_rng(0).standard_normal((5, 3, 4)).astype(np.float32)
    np.testing.assert_array_equal(graphc.interpret(opt, {"x": x})["y"], graphc.interpret(g, {"x": x})["y"])
    # fold_control_flow runs first (every level) and finds nothing here; then cleanup.
    assert [r.name for r in res.records][:5] == ["fold_control_flow", "constant_folding", "simplify", "cse", "dce"]
    # the public output name stays, though the value behind it changed
    assert opt.output_names == ("y",)


def test_each_cleanup_pass_returns_same_graph_when_nothing_changes():
    g = graphc.bind_shapes(graphc.load_onnx(_exporter_shape_chain()), {"batch": 2})
    opt = optimize(g, OptimizeOptions(opt_level=1)).graph
    for fn in (fold_constants, simplify, eliminate_common_subexpressions, eliminate_dead_code):
        assert fn(opt) is opt, fn.__name__


def test_dce_removes_dead_nodes_and_constants():
    g = graphc.load_onnx(_exporter_shape_chain())
    out = eliminate_dead_code(g)
    assert "Neg" not in out.op_counts()
    verify_graph(out)


def test_cse_merges_duplicates_and_equal_small_constants():
    nodes = [
        helper.make_node("Mul", ["x", "c1"], ["a"]),
        helper.make_node("Mul", ["x", "c2"], ["b"]),  # c2 == c1 by value
        helper.make_node("Add", ["a", "b"], ["y"]),
    ]
    c = np.array([1.5, 2.5, 3.5], np.float32)
    m = _model(nodes, [_vi("x", [2, 3])], [_vi("y", [2, 3])], [("c1", c), ("c2", c.copy())])
    g = graphc.load_onnx(m)
    out = eliminate_common_subexpressions(g)
    expected = """
      graph g (opset 17)
        input  %x: f32[2,3]
        const  %c: f32[3] = [1.5, 2.5, 3.5]
        %a: f32[2,3] = Mul[m](%x, %c)
        %y: f32[2,3] = Add[add](%a, %a)
        output %y: f32[2,3]
    """
    assert_structurally_equal(out, parse_graph(expected))
    x = np.ones((2, 3), np.float32)
    np.testing.assert_array_equal(graphc.interpret(out, {"x": x})["y"], 2 * x * c)


def test_constant_folding_size_cap():
    """Expanding a scalar into a large tensor is not materialized; transposing a weight is."""
    nodes = [
        helper.make_node("Expand", ["one", "big_shape"], ["ones"]),
        helper.make_node("Transpose", ["w"], ["wt"], perm=[1, 0]),
        helper.make_node("MatMul", ["x", "wt"], ["xw"]),
        helper.make_node("Add", ["xw", "ones"], ["y"]),
    ]
    w = np.arange(64 * 512, dtype=np.float32).reshape(512, 64) / 1000
    inits = [("one", np.array([1.0], np.float32)), ("big_shape", np.array([256, 512], np.int64)), ("w", w)]
    m = _model(nodes, [_vi("x", [256, 64])], [_vi("y", [256, 512])], inits)
    g = graphc.load_onnx(m)
    out = fold_constants(g)
    ops = out.op_counts()
    assert "Transpose" not in ops and ops["Expand"] == 1, ops
    x = np.random.default_rng(1).standard_normal((256, 64)).astype(np.float32)
    np.testing.assert_allclose(graphc.interpret(out, {"x": x})["y"], graphc.interpret(g, {"x": x})["y"], rtol=1e-6)


def test_constant_folding_dequantizes_large_int8_weights():
    """DequantizeLinear of a 256 KiB int8 weight folds into a 1 MiB float one (same element count),
    so the convolution after it sees a constant weight (the layout pass needs one)."""
    wq = np.random.default_rng(2).integers(-127, 127, size=(512, 512)).astype(np.int8)
    nodes = [
        helper.make_node("DequantizeLinear", ["wq", "ws"], ["w"], axis=0),
        helper.make_node("MatMul", ["x", "w"], ["y"]),
    ]
    inits = [("wq", wq), ("ws", np.full(512, 0.01, np.float32))]
    m = _model(nodes, [_vi("x", [4, 512])], [_vi("y", [4, 512])], inits)
    g = graphc.load_onnx(m)
    out = fold_constants(g)
    assert out.op_counts() == {"MatMul": 1}
    (w,) = [c.data for c in out.constants.values()]
    np.testing.assert_array_equal(w, wq.astype(np.float32) * np.float32(0.01))


@pytest.mark.parametrize(
    "node,inits,expect_removed",
    [
        (helper.make_node("Cast", ["x"], ["y"], to=TensorProto.FLOAT), [], True),
        (helper.make_node("Mul", ["x", "one"], ["y"]), [("one", np.ones((1, 3), np.float32))], True),
        # Mul by ones of a bigger shape broadcasts: not a no-op
        (helper.make_node("Mul", ["x", "one"], ["y"]), [("one", np.ones((4, 2, 3), np.float32))], False),
        (helper.make_node("Add", ["x", "zero"], ["y"]), [("zero", np.zeros(3, np.float32))], True),
        (helper.make_node("Transpose", ["x"], ["y"], perm=[0, 1]), [], True),
        (helper.make_node("Transpose", ["x"], ["y"], perm=[1, 0]), [], False),
        (
            helper.make_node("Slice", ["x", "st", "en", "ax", "stp"], ["y"]),
            [
                ("st", np.array([-1], np.int64)),
                ("en", np.array([-10], np.int64)),
                ("ax", np.array([1], np.int64)),
                ("stp", np.array([-1], np.int64)),
            ],
            False,  # same shape, but reversed: not a no-op
        ),
        (helper.make_node("Pad", ["x", "pads"], ["y"]), [("pads", np.array([0, 1, 0, -1], np.int64))], False),
        (helper.make_node("Pad", ["x", "pads"], ["y"]), [("pads", np.zeros(4, np.int64))], True),
    ],
)
def test_simplify_removes_only_true_noops(node, inits, expect_removed):
    out_shape = [4, 2, 3] if expect_removed is False and node.op_type == "Mul" else [2, 3]
    if node.op_type == "Transpose" and node.attribute[0].ints == [1, 0]:
        out_shape = [3, 2]
    m = _model([node], [_vi("x", [2, 3])], [_vi("y", out_shape)], inits)
    g = graphc.load_onnx(m)
    out = simplify(fold_constants(g))
    removed = node.op_type not in out.op_counts()
    assert removed == expect_removed, str(out)
    x = np.random.default_rng(2).standard_normal((2, 3)).astype(np.float32)
    np.testing.assert_array_equal(graphc.interpret(out, {"x": x})["y"], graphc.interpret(g, {"x": x})["y"])


def test_reshape_canonicalization_collapses_chains():
    nodes = [
        helper.make_node("Flatten", ["x"], ["a"], axis=1),
        helper.make_node("Unsqueeze", ["a", "ax"], ["b"]),
        helper.make_node("Reshape", ["b", "shp"], ["y"]),
    ]
    m = _model(
        nodes,
        [_vi("x", [2, 3, 4])],
        [_vi("y", [6, 4])],
        [("ax", np.array([0], np.int64)), ("shp", np.array([6, 4], np.int64))],
    )
    g = graphc.load_onnx(m)
    out = optimize(g, OptimizeOptions(opt_level=1, verify=True)).graph
    assert out.op_counts() == {"Reshape": 1}
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    np.testing.assert_array_equal(graphc.interpret(out, {"x": x})["y"], x.reshape(6, 4))


def test_opt_level_zero_runs_nothing_and_dump_ir(tmp_path):
    g = graphc.bind_shapes(graphc.load_onnx(_exporter_shape_chain()), {"batch": 2})
    assert optimize(g, OptimizeOptions(opt_level=0)).graph is g
    res = optimize(g, OptimizeOptions(opt_level=1, dump_ir=tmp_path))
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files[0] == "00-input.txt" and any(f.endswith("-constant_folding.txt") for f in files)
    assert (tmp_path / files[-1]).read_text() == str(res.graph)


def test_report_is_json_serializable_and_counts_ops():
    import json

    g = graphc.bind_shapes(graphc.load_onnx(_exporter_shape_chain()), {"batch": 2})
    res = optimize(g, OptimizeOptions(opt_level=2))
    rep = optimizer_report(g, res.graph, res.records)
    json.dumps(rep)
    assert rep["nodes_before"] == len(g.nodes) and rep["nodes_after"] == len(res.graph.nodes)
    assert rep["ops_before"]["Shape"] == 1 and "Shape" not in rep["ops_after"]
    assert {p["name"] for p in rep["passes"]} >= {"constant_folding", "simplify", "cse", "dce"}
    assert "optimizer:" in summarize(rep)


def _empty_slice_concat():
    """Phi-3's partial rotary from torch 2.11's TorchScript exporter where the rotary width is the
    whole head: cat(f(x[..., :8]), x[..., 8:]) with the pass-through slice empty."""
    nodes = [
        helper.make_node("Slice", ["x", "s0", "s8", "ax"], ["rot"]),
        helper.make_node("Slice", ["x", "s8", "big", "ax"], ["rest"]),  # [2, 4, 16, 0]
        helper.make_node("Neg", ["rot"], ["rot2"]),
        helper.make_node("Concat", ["rot2", "rest"], ["y"], axis=-1),
    ]
    inits = [
        ("s0", np.array([0], np.int64)),
        ("s8", np.array([8], np.int64)),
        ("big", np.array([2**62], np.int64)),
        ("ax", np.array([-1], np.int64)),
    ]
    return _model(nodes, [_vi("x", [2, 4, 16, 8])], [_vi("y", [2, 4, 16, 8])], inits)


def test_concat_drops_empty_inputs_and_the_cuda_plan_has_no_kernelless_step():
    m = _empty_slice_concat()
    x = np.random.default_rng(0).standard_normal((2, 4, 16, 8)).astype(np.float32)
    out = graphc.compile(m, target="cpu").run({"x": x})
    np.testing.assert_array_equal(next(iter(out.values())), -x)
    g = optimize(graphc.load_onnx(m), OptimizeOptions(opt_level=1, verify=True)).graph
    assert [n.op for n in g.nodes] == ["Neg"]  # the whole-width Slice, the empty one and the Concat go
    e = graphc.compile(m, target="cuda", arch=["sm_90"])
    kernelless = [s.name for s in e.plan.steps if not s.launches and not s.alias and s.vendor is None]
    assert kernelless == []
