"""IR: types, builder inference and known values, verifier, text form, bind_shapes."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import graphc.ops
from graphc.errors import ShapeError, VerificationError
from graphc.ir import DType, Graph, GraphBuilder, Node, TensorType, Value, format_graph, verify_graph
from graphc.ir.attrs import TensorAttr, onnx_attrs_class
from graphc.ir.shapes import bind_shapes

# The IR builds nodes through the op registry; the op library registers into it.
graphc.ops.load()


def test_dtype_round_trips():
    for dt in DType:
        assert DType.from_onnx(dt.value) is dt
        assert DType.from_short(dt.short) is dt
        if dt is not DType.string:
            assert DType.from_numpy(dt.numpy) is dt
    assert DType.float16.itemsize == 2 and DType.bfloat16.itemsize == 2
    assert DType.int64.is_int and not DType.int64.is_float and DType.bfloat16.is_float


def test_tensor_type_properties():
    t = TensorType(DType.float32, (2, 3, 4))
    assert t.is_static and t.numel == 24 and t.nbytes == 96 and str(t) == "f32[2,3,4]"
    s = TensorType(DType.float16, ("batch", None))
    assert not s.is_static and str(s) == "f16[batch,?]"
    with pytest.raises(ValueError):
        _ = s.numel


def test_attrs_from_onnx_schema_are_typed_with_spec_defaults():
    conv = onnx_attrs_class("Conv")
    a = conv()
    assert a.group == 1 and a.auto_pad == "NOTSET" and a.pads is None
    b = conv(pads=[1, 1, 1, 1])
    assert b.pads == (1, 1, 1, 1)  # lists become tuples: hashable
    assert hash(b) == hash(conv(pads=(1, 1, 1, 1)))
    with pytest.raises(TypeError):
        conv(padz=[1])  # a typo is an error, never a silently ignored key
    with pytest.raises(AttributeError):
        _ = a.padz
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.group = 2  # type: ignore[misc]
    gemm = onnx_attrs_class("Gemm")()
    assert gemm.beta == 1.0 and gemm.alpha == 1.0  # the spec's defaults, not 0.0
    assert onnx_attrs_class("Reshape")().allowzero == 0


def test_tensor_attr_hash_and_eq():
    a = TensorAttr(np.array([1.0], dtype=np.float32))
    b = TensorAttr(np.array([1.0], dtype=np.float32))
    c = TensorAttr(np.array([1.0], dtype=np.float64))
    assert a == b and hash(a) == hash(b) and a != c
    assert not a.array.flags.writeable


def _shape_graph() -> Graph:
    b = GraphBuilder("g", 17)
    x = b.add_input("x", TensorType(DType.float32, ("batch", 3, 4)))
    shape = b.op("Shape", [x], name="shape")
    tail = b.add_constant(np.array([-1], dtype=np.int64), "minus_one")
    y = b.op("Reshape", [x, b.add_constant(np.array([0, 12], dtype=np.int64), "tgt")], name="flat")
    z = b.op("Unsqueeze", [y, b.add_constant(np.array([1], dtype=np.int64), "ax")], name="unsq")
    b.set_outputs([z, shape])
    del tail
    return b.build()


def test_builder_infers_symbolic_shapes():
    g = _shape_graph()
    assert g.node("flat").outputs[0].type == TensorType(DType.float32, ("batch", 12))
    assert g.node("unsq").outputs[0].type == TensorType(DType.float32, ("batch", 1, 12))
    assert g.node("shape").outputs[0].type == TensorType(DType.int64, (3,))


def test_builder_resolves_known_shape_values():
    b = GraphBuilder("g", 17)
    x = b.add_input("x", TensorType(DType.float32, (2, 3, 4)))
    s = b.op("Shape", [x])
    assert b.known_value(s).tolist() == [2, 3, 4]
    y = b.op("Reshape", [x, s])  # target computed from Shape, known at build time
    assert y.type.shape == (2, 3, 4)


def test_bind_shapes_makes_everything_concrete():
    g = bind_shapes(_shape_graph(), {"x": (5, 3, 4)})
    for n in g.nodes:
        for v in n.outputs:
            assert v.type.is_static, v
    assert g.outputs[0].type.shape == (5, 1, 12)
    # By dim name as well as by input name.
    g2 = bind_shapes(_shape_graph(), {"batch": 7})
    assert g2.outputs[0].type.shape == (7, 1, 12)


def test_bind_shapes_errors_name_input_and_dim():
    with pytest.raises(ShapeError, match=r"input 'x'.*symbolic dim 0 \('batch'\)"):
        bind_shapes(_shape_graph(), {})
    with pytest.raises(ShapeError, match="dim 1 is fixed at 3"):
        bind_shapes(_shape_graph(), {"x": (5, 4, 4)})
    with pytest.raises(ShapeError, match="not graph inputs"):
        bind_shapes(_shape_graph(), {"nope": (1,)})


def test_verifier_catches_broken_graphs():
    g = _shape_graph()
    verify_graph(g)
    # use before definition: swap two nodes
    nodes = list(g.nodes)
    nodes[0], nodes[-1] = nodes[-1], nodes[0]
    with pytest.raises(VerificationError, match="not defined before"):
        verify_graph(g.with_nodes(nodes))
    # a wrong output type on a hand-built node
    n = g.node("flat")
    bad = Node(
        n.op, n.name, n.inputs, (Value(n.outputs[0].name, TensorType(DType.float32, ("batch", 13))),), n.attrs
    )
    with pytest.raises(VerificationError, match="inference gives"):
        verify_graph(g.with_nodes([bad if m is n else m for m in g.nodes]))
    # not SSA: the same output twice
    dup = Node("Identity", "dup", (g.inputs[0],), (n.outputs[0],), onnx_attrs_class("Identity")())
    with pytest.raises(VerificationError, match="defined twice"):
        verify_graph(g.with_nodes([*g.nodes, dup]))
    # dangling graph output
    with pytest.raises(VerificationError, match="not defined"):
        verify_graph(g.with_nodes(g.nodes, outputs=[Value("ghost", TensorType(DType.float32, (1,)))]))


def test_text_form_is_stable():
    text = format_graph(_shape_graph())
    assert text == format_graph(_shape_graph())
    assert "input  %x: f32[batch,3,4]" in text
    assert "%flat: f32[batch,12] = Reshape[flat](%x, %tgt)" in text
    assert "const  %tgt: i64[2] = [0, 12]" in text
    assert "output %unsq: f32[batch,1,12]" in text


def test_op_traits_come_from_the_registry():
    from graphc.ir.registry import Category, all_ops, get_op

    reduce_ops = {o.op_type for o in all_ops() if o.axis_reduction}
    assert reduce_ops == {
        "ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
        "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare",
    }  # fmt: skip
    assert all(get_op(op).category is Category.REDUCTION for op in reduce_ops)
    commutative = {o.op_type for o in all_ops() if o.commutative}
    assert {"Add", "Mul", "Max", "Min", "And", "Or", "Xor", "Equal", "BitwiseAnd"} <= commutative
    assert not commutative & {"Sub", "Div", "Pow", "Less", "MatMul", "Mod"}
    assert get_op("Relu").elementwise and not get_op("Conv").elementwise


def test_ops_registry_is_the_ir_registry():
    import graphc.ir.registry as ir_registry
    import graphc.ops.registry as ops_registry

    for name in ("OpDef", "register_op", "get_op", "InferContext", "Category", "all_ops", "has_op"):
        assert getattr(ops_registry, name) is getattr(ir_registry, name)
