"""to_channels_last: structure (which ops become NHWC, which transposes remain) and numerics
(the interpreter on the graph before and after)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import graphc
from graphc.ir.graph import Graph
from graphc.ir.shapes import bind_shapes
from graphc.ir.verify import verify_graph
from graphc.passes.layout import to_channels_last
from graphc.passes.manager import OptimizeOptions, optimize

RNG = np.random.default_rng(0)


def model(nodes, inputs, outputs, inits=(), opset=21):
    """A model from onnx.helper nodes; `inputs`/`outputs`: (name, shape) float32; `inits`:
    (name, array)."""
    g = helper.make_graph(
        nodes,
        "t",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
        [helper.make_tensor_value_info(n, TensorProto.UNDEFINED, None) for n, _ in outputs],
        [numpy_helper.from_array(np.asarray(a), n) for n, a in inits],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 10
    return onnx.shape_inference.infer_shapes(m)


def w(*shape):
    return (RNG.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype(np.float32)


def load(m, optimize_first: bool = True) -> Graph:
    g = graphc.load_onnx(m)
    if optimize_first:
        g = optimize(g, OptimizeOptions(opt_level=2, verify=True)).graph
    return g


def same_numbers(before: Graph, after: Graph, rtol=1e-5, atol=1e-5) -> None:
    verify_graph(after)
    feeds = {v.name: RNG.standard_normal(v.type.static_shape).astype(np.float32) for v in before.inputs}
    a, b = graphc.interpret(before, feeds), graphc.interpret(after, feeds)
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_allclose(b[k], a[k], rtol=rtol, atol=atol)


def kinds(g: Graph) -> dict[str, int]:
    return g.op_counts()


def conv(name, x, wname, y, bname=None, **attrs):
    ins = [x, wname] + ([bname] if bname else [])
    return helper.make_node("Conv", ins, [y], name=name, **attrs)


def test_conv_chain_keeps_only_edge_transposes():
    m = model(
        [
            conv("c1", "x", "w1", "a", "b1", pads=[1, 1, 1, 1]),
            helper.make_node("Relu", ["a"], ["r1"]),
            conv("c2", "r1", "w2", "b", "b2", strides=[2, 2], pads=[1, 1, 1, 1]),
            helper.make_node("Relu", ["b"], ["y"]),
        ],
        [("x", [2, 3, 9, 9])],
        [("y", None)],
        [("w1", w(8, 3, 3, 3)), ("b1", w(8)), ("w2", w(16, 8, 3, 3)), ("b2", w(16))],
    )
    g = load(m)
    h = to_channels_last(g)
    counts = kinds(h)
    assert "Conv" not in counts and "Fused[Conv]" not in counts
    assert counts.get("Fused[ConvNHWC]", 0) + counts.get("graphc.ConvNHWC", 0) == 2
    ts = [n for n in h.nodes if n.op == "Transpose"]
    assert [tuple(n.attrs.perm) for n in ts] == [(0, 2, 3, 1), (0, 3, 1, 2)]
    assert ts[0].inputs[0].name == "x" and h.outputs[0].name == ts[1].outputs[0].name
    same_numbers(g, h)


def test_weights_relaid_out_at_compile_time():
    wt = w(8, 3, 3, 5)
    m = model([conv("c", "x", "w", "y", kernel_shape=[3, 5])], [("x", [1, 3, 7, 9])], [("y", None)], [("w", wt)])
    g = load(m, optimize_first=False)
    h = to_channels_last(g)
    (cv,) = [n for n in h.nodes if n.op == "ConvNHWC"]
    np.testing.assert_array_equal(h.const(cv.inputs[1].name), wt.transpose(0, 2, 3, 1))
    assert cv.attrs.pads == (0, 0, 0, 0) and cv.attrs.kernel_shape == (3, 5)
    same_numbers(g, h)


def test_fused_epilogue_constants_become_channels_last():
    """A Fused[Conv] whose epilogue multiplies by a per-channel (C,1,1) constant and adds a
    residual: the constant folds to (1,1,1,C), the residual gets the NHWC producer's layout."""
    from graphc.ir.attrs import onnx_attrs_class
    from graphc.ir.builder import GraphBuilder
    from graphc.ir.types import DType, TensorType
    from graphc.ops.fused import ACC, IN, OP, EpilogueOp, FusedAttrs

    b = GraphBuilder("t")
    x = b.add_input("x", TensorType(DType.float32, (2, 4, 6, 6)))
    res = b.add_input("res", TensorType(DType.float32, (2, 8, 6, 6)))
    wv = b.add_constant(w(8, 4, 3, 3), "w")
    scale = b.add_constant((1 + RNG.random((8, 1, 1))).astype(np.float32), "scale")
    conv_attrs = onnx_attrs_class("Conv")(pads=(1, 1, 1, 1))
    fa = FusedAttrs(
        anchor_op="Conv",
        anchor_attrs=conv_attrs,
        anchor_inputs=2,
        epilogue=(
            EpilogueOp("Mul", onnx_attrs_class("Mul")(), (ACC, IN(2))),
            EpilogueOp("Add", onnx_attrs_class("Add")(), (OP(0), IN(3))),
        ),
        outputs=(OP(1),),
    )
    y = b.add_node("Fused", [x, wv, scale, res], fa, domain="graphc").outputs[0]
    b.set_outputs([y])
    g = b.build()
    h = to_channels_last(g)
    (fused,) = [n for n in h.nodes if n.op == "Fused"]
    assert fused.attrs.anchor_op == "ConvNHWC" and fused.attrs.anchor_domain == "graphc"
    assert h.const(fused.inputs[2].name).shape == (1, 1, 1, 8)
    assert fused.outputs[0].type.shape == (2, 6, 6, 8)
    assert sum(n.op == "Transpose" for n in h.nodes) == 3  # x, res in; y out: all edges
    same_numbers(g, h)


def test_residual_join_of_two_nhwc_branches():
    """conv_a + conv_b -> relu -> conv_c: the join moves into NHWC (no transpose between)."""
    m = model(
        [
            conv("ca", "x", "wa", "a", pads=[1, 1, 1, 1]),
            conv("cb", "x", "wb", "bb"),
            helper.make_node("Add", ["a", "bb"], ["s"]),
            helper.make_node("Relu", ["s"], ["r"]),
            conv("cc", "r", "wc", "y"),
        ],
        [("x", [1, 4, 5, 5])],
        [("y", None)],
        [("wa", w(8, 4, 3, 3)), ("wb", w(8, 4, 1, 1)), ("wc", w(6, 8, 1, 1))],
    )
    g = load(m, optimize_first=False)  # unfused: the Add and Relu are plain ops
    h = to_channels_last(g)
    assert sum(n.op == "Transpose" for n in h.nodes) == 2
    same_numbers(g, h)


def test_pad_and_batchnorm_fold_into_the_nhwc_region():
    """An explicit zero Pad before a conv goes into its pads; an unfolded BatchNormalization
    (opt_level 0/1 graphs) becomes a per-channel affine that transposes move through."""
    pads = np.array([0, 0, 0, 1, 0, 0, 1, 2], np.int64)
    c = 6
    m = model(
        [
            helper.make_node("Pad", ["x", "pads"], ["xp"]),
            conv("c1", "xp", "w1", "a", group=c),
            helper.make_node("BatchNormalization", ["a", "s", "bias", "mean", "var"], ["bn"]),
            helper.make_node("Relu", ["bn"], ["r"]),
            conv("c2", "r", "w2", "y"),
        ],
        [("x", [2, c, 7, 7])],
        [("y", None)],
        [
            ("pads", pads),
            ("w1", w(c, 1, 3, 3)),
            ("s", 1 + RNG.random(c).astype(np.float32)),
            ("bias", w(c)),
            ("mean", w(c)),
            ("var", 1 + RNG.random(c).astype(np.float32)),
            ("w2", w(4, c, 1, 1)),
        ],
    )
    g = load(m, optimize_first=False)
    h = to_channels_last(g)
    counts = kinds(h)
    assert "Pad" not in counts and "BatchNormalization" not in counts
    assert counts["Transpose"] == 2
    (dw,) = [n for n in h.nodes if n.op == "ConvNHWC" and n.attrs.group == c]
    assert dw.attrs.pads == (0, 1, 1, 2)
    same_numbers(g, h, rtol=1e-4, atol=1e-5)


def test_pools_next_to_convs_become_nhwc():
    m = model(
        [
            conv("c", "x", "w", "a", pads=[1, 1, 1, 1]),
            helper.make_node("Relu", ["a"], ["r"]),
            helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
            helper.make_node("AveragePool", ["p"], ["q"], kernel_shape=[2, 2], ceil_mode=1, count_include_pad=1),
            helper.make_node("GlobalAveragePool", ["q"], ["y"]),
        ],
        [("x", [2, 3, 11, 11])],
        [("y", None)],
        [("w", w(8, 3, 3, 3))],
    )
    g = load(m, optimize_first=False)
    h = to_channels_last(g)
    counts = kinds(h)
    for op in ("MaxPool", "AveragePool", "GlobalAveragePool"):
        assert op not in counts and counts[f"graphc.{op}NHWC"] == 1
    # the last transpose, of a (N,1,1,C) result, moves no data: it is a reshape
    assert counts["Transpose"] == 1
    same_numbers(g, h)


def test_nothing_to_convert_returns_the_same_graph():
    lone_pool = model(
        [helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2])], [("x", [1, 3, 4, 4])], [("y", None)]
    )
    conv1d = model([conv("c", "x", "w", "y")], [("x", [1, 3, 9])], [("y", None)], [("w", w(4, 3, 3))])
    conv3d = model([conv("c", "x", "w", "y")], [("x", [1, 3, 4, 4, 4])], [("y", None)], [("w", w(4, 3, 2, 2, 2))])
    for m in (lone_pool, conv1d, conv3d):
        g = load(m, optimize_first=False)
        assert to_channels_last(g) is g


def test_maxpool_indices_and_dynamic_weights_stay_nchw():
    m = model(
        [
            conv("c", "x", "w", "a"),
            helper.make_node("MaxPool", ["a"], ["y", "idx"], kernel_shape=[2, 2]),
            conv("d", "x", "wdyn", "z"),
        ],
        [("x", [1, 3, 6, 6]), ("wdyn", [2, 3, 1, 1])],
        [("y", None), ("z", None), ("idx", None)],
        [("w", w(4, 3, 1, 1))],
    )
    g = load(m, optimize_first=False)
    h = to_channels_last(g)
    counts = kinds(h)
    assert counts["MaxPool"] == 1 and counts["Conv"] == 1 and counts["graphc.ConvNHWC"] == 1
    same_numbers(g, h)


def test_a_conv_output_that_is_a_graph_output_keeps_nchw_at_the_edge():
    m = model(
        [conv("c1", "x", "w1", "a"), helper.make_node("Relu", ["a"], ["r"]), conv("c2", "r", "w2", "y")],
        [("x", [1, 3, 5, 5])],
        [("a", None), ("y", None)],
        [("w1", w(4, 3, 1, 1)), ("w2", w(2, 4, 1, 1))],
    )
    g = load(m, optimize_first=False)
    h = to_channels_last(g)
    assert kinds(h)["Transpose"] == 3
    assert h.output_names == g.output_names
    same_numbers(g, h)


@pytest.mark.parametrize("name", ["resnet", "mobilenetv2"])
def test_zoo_models_keep_one_input_transpose(name):
    import models

    m = models.build(name, size="tiny")
    g = bind_shapes(graphc.load_onnx(m), {"batch": 2})
    g = optimize(g, OptimizeOptions(opt_level=2)).graph
    h = to_channels_last(g)
    counts = kinds(h)
    assert counts["Transpose"] == 1, counts
    assert not any(k in counts for k in ("Conv", "Fused[Conv]", "MaxPool", "GlobalAveragePool"))
    feeds = models.sample_inputs(name, m, batch=2)
    a, b = graphc.interpret(g, feeds), graphc.interpret(h, feeds)
    for k in a:
        np.testing.assert_allclose(b[k], a[k], rtol=1e-4, atol=1e-5)
