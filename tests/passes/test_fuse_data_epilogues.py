"""fuse_data_epilogues: a Transpose, Gather or Concat takes the Cast before it or the fused
elementwise kernel after it. Each case: the structure for the CPU and CUDA fp16 pipelines, the
outputs bit for bit those of the pipeline without the pass (CPU target, the ops' numpy
references), and the CUDA kernels rendered and compiled by NVRTC where it is installed."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import graphc
from graphc.codegen.capabilities import CUDA
from graphc.passes.manager import OptimizeOptions, Pass, optimize
from graphc.passes.pipeline import stages
from graphc.passes.target import Target

RNG = np.random.default_rng(5)
F, I64 = TensorProto.FLOAT, TensorProto.INT64
CPU16 = Target("cpu", "fp16")
CUDA16 = Target("cuda", "fp16", capabilities=CUDA)


def _nvrtc_ok() -> bool:
    try:
        from graphc.codegen.nvrtc import nvrtc_version

        nvrtc_version()
        return True
    except Exception:
        return False


needs_nvrtc = pytest.mark.skipif(not _nvrtc_ok(), reason="NVRTC (cuda-bindings) is not installed")


def _model(nodes, inputs, outputs, inits=()):
    g = helper.make_graph(
        nodes,
        "t",
        [helper.make_tensor_value_info(n, dt, s) for n, dt, s in inputs],
        [helper.make_tensor_value_info(n, dt, s) for n, dt, s in outputs],
        [numpy_helper.from_array(a, n) for n, a in inits],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _optimized(model, target, *, fuse=True):
    g = graphc.bind_shapes(graphc.load_onnx(model), {})
    st = stages() if fuse else [s for s in stages() if not (isinstance(s, Pass) and s.name == "fuse_data_epilogues")]
    return optimize(g, OptimizeOptions(opt_level=2, verify=True, target=target), st).graph


def _feeds(model):
    out = {}
    for i in model.graph.input:
        shape = [d.dim_value for d in i.type.tensor_type.shape.dim]
        if i.type.tensor_type.elem_type == I64:
            out[i.name] = RNG.integers(0, 10, shape).astype(np.int64)
        else:
            out[i.name] = (RNG.standard_normal(shape) * 4).astype(np.float32)
    return out


def _check_exact(model):
    g0, g1 = _optimized(model, CPU16, fuse=False), _optimized(model, CPU16)
    feeds = _feeds(model)
    a, b = graphc.interpret(g0, feeds), graphc.interpret(g1, feeds)
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    return g0, g1


def _kinds(graph) -> list[str]:
    return [n.attrs.kind_name() if n.op == "Fused" else n.op for n in graph.nodes if n.op != "Reshape"]


def _image_model():
    # The fp16 engine casts the fp32 NCHW input; the transpose to NHWC takes the cast.
    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=[0, 2, 3, 1]), helper.make_node("Relu", ["t"], ["y"])]
    return _model(nodes, [("x", F, [2, 3, 5, 7])], [("y", F, [2, 5, 7, 3])])


def test_cast_through_transpose_and_elementwise_after():
    g0, g1 = _check_exact(_image_model())
    assert _kinds(g0) == ["Cast", "Transpose", "Fused[Elementwise]"]
    # the Cast goes into the transpose's store, then the Relu (and its output Cast) too
    assert _kinds(g1) == ["Fused[Transpose]"]
    (node,) = [n for n in g1.nodes if n.op == "Fused"]
    assert [e.op for e in node.attrs.epilogue] == ["Cast", "Relu", "Cast"]
    assert _kinds(_optimized(_image_model(), CUDA16)) == ["Fused[Transpose]"]


def _embedding_model():
    # GPT-2's embeddings: wte[ids] + wpe (a constant: positions are 0..seq-1), then a MatMul.
    wte = RNG.standard_normal((50, 16)).astype(np.float32)
    wpe = RNG.standard_normal((1, 6, 16)).astype(np.float32)
    w = RNG.standard_normal((16, 8)).astype(np.float32)
    nodes = [
        helper.make_node("Gather", ["wte", "ids"], ["e"], axis=0),
        helper.make_node("Add", ["e", "wpe"], ["h"]),
        helper.make_node("MatMul", ["h", "w"], ["y"]),
    ]
    return _model(nodes, [("ids", I64, [1, 6])], [("y", F, [1, 6, 8])], [("wte", wte), ("wpe", wpe), ("w", w)])


def test_gather_takes_the_position_add():
    g0, g1 = _check_exact(_embedding_model())
    assert "Gather" in _kinds(g0) and "Fused[Gather]" in _kinds(g1)
    (node,) = [n for n in g1.nodes if n.op == "Fused" and n.attrs.anchor_op == "Gather"]
    assert [e.op for e in node.attrs.epilogue] == ["Add"]


def _concat_model():
    # ViT's [cls; patches] + position embeddings.
    cls = RNG.standard_normal((1, 1, 8)).astype(np.float32)
    pos = RNG.standard_normal((1, 5, 8)).astype(np.float32)
    nodes = [helper.make_node("Concat", ["cls", "p"], ["c"], axis=1), helper.make_node("Add", ["c", "pos"], ["y"])]
    return _model(nodes, [("p", F, [1, 4, 8])], [("y", F, [1, 5, 8])], [("cls", cls), ("pos", pos)])


def test_concat_takes_the_add():
    g0, g1 = _check_exact(_concat_model())
    assert "Concat" in _kinds(g0)
    fused = [n for n in g1.nodes if n.op == "Fused" and n.attrs.anchor_op == "Concat"]
    assert len(fused) == 1 and [e.op for e in fused[0].attrs.epilogue][:1] == ["Add"]


def test_no_fusion_where_the_move_is_read_twice():
    # t is an output and read by the Relu: the transpose must store it, the Relu stays apart.
    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=[1, 0]), helper.make_node("Relu", ["t"], ["y"])]
    m = _model(nodes, [("x", F, [3, 4])], [("t", F, [4, 3]), ("y", F, [4, 3])])
    g0, g1 = _check_exact(m)
    fused = [n for n in g1.nodes if n.op == "Fused" and n.attrs.anchor_op == "Transpose"]
    assert all(e.op == "Cast" for n in fused for e in n.attrs.epilogue)
    assert any(n.op == "Fused" and n.attrs.anchor_op is None and "Relu" in [e.op for e in n.attrs.epilogue]
               for n in g1.nodes)  # fmt: skip


def test_no_fusion_into_a_broadcasting_reader():
    # The Add reads the gather's (6,) rows broadcast against a (3, 6) input: the result is larger
    # than what the Gather moves, so it stays a kernel of its own.
    tab = RNG.standard_normal((10, 6)).astype(np.float32)
    nodes = [helper.make_node("Gather", ["tab", "ids"], ["e"], axis=0), helper.make_node("Add", ["e", "z"], ["y"])]
    m = _model(nodes, [("ids", I64, [1]), ("z", F, [3, 6])], [("y", F, [3, 6])], [("tab", tab)])
    g0, g1 = _check_exact(m)
    assert not [n for n in g1.nodes if n.op == "Fused" and n.attrs.anchor_op == "Gather"]


@needs_nvrtc
@pytest.mark.parametrize("build", [_image_model, _embedding_model, _concat_model])
def test_fused_data_kernels_compile(build):
    engine = graphc.compile(build(), target="cuda", precision="fp16", arch=["sm_80", "sm_90"])
    kinds = [s.kind for s in engine.plan.steps if s.launches_for("sm_90")]
    assert any(k in ("Fused[Transpose]", "Fused[Gather]", "Fused[Concat]") for k in kinds), kinds
    assert "Transpose" not in kinds and "Concat" not in kinds and "Gather" not in kinds, kinds
    # the concat's graph input keeps its Cast (a Cast commutes into a Transpose or a Gather's data)
    assert kinds.count("Cast") == (build is _concat_model), kinds


def test_through_a_view_with_a_full_shape_residual():
    # Swin's window reverse: transpose, reshape, + shortcut of the reshaped shape: one kernel that
    # reads the shortcut through a view in the transpose's shape.
    shape = np.array([2, 12, 5], np.int64)
    nodes = [
        helper.make_node("Transpose", ["x"], ["t"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["t", "shape"], ["r"]),
        helper.make_node("Add", ["r", "s"], ["y"]),
    ]
    m = _model(nodes, [("x", F, [2, 3, 4, 5]), ("s", F, [2, 12, 5])], [("y", F, [2, 12, 5])], [("shape", shape)])
    g0, g1 = _check_exact(m)
    (node,) = [n for n in g1.nodes if n.op == "Fused" and n.attrs.anchor_op == "Transpose"]
    assert "Add" in [e.op for e in node.attrs.epilogue]
    assert _kinds(_optimized(m, CUDA16)) == ["Fused[Transpose]"]


def test_no_fusion_through_a_view_of_symbolic_shape():
    # The same with a symbolic batch, optimized before shapes are bound (tools/fusion_report.py's
    # and `graphc check`'s unbound graphs): the views back and forth need constant shapes, so the
    # rule leaves the Add out (building them raised a ValueError); the Cast still moves in.
    shape = np.array([-1, 12, 5], np.int64)
    nodes = [
        helper.make_node("Transpose", ["x"], ["t"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["t", "shape"], ["r"]),
        helper.make_node("Add", ["r", "s"], ["y"]),
    ]
    m = _model(nodes, [("x", F, ["b", 3, 4, 5]), ("s", F, ["b", 12, 5])], [("y", F, ["b", 12, 5])], [("shape", shape)])
    g = optimize(graphc.load_onnx(m), OptimizeOptions(opt_level=2, verify=True, target=CUDA16)).graph
    (move,) = [n for n in g.nodes if n.op == "Fused" and n.attrs.anchor_op == "Transpose"]
    assert "Add" not in [e.op for e in move.attrs.epilogue]  # the fp16 engine's input Cast only
    assert any(n.op == "Add" or (n.op == "Fused" and n.attrs.anchor_op is None) for n in g.nodes)


def test_a_slab_view_gather_takes_no_epilogue():
    # x[1] of a (3, 4, 8) tensor is a view (no kernel): relu(x[1]) stays one elementwise kernel.
    idx = np.array(1, np.int64)
    nodes = [helper.make_node("Gather", ["x", "i"], ["g"], axis=0), helper.make_node("Relu", ["g"], ["y"])]
    m = _model(nodes, [("x", F, [3, 4, 8])], [("y", F, [4, 8])], [("i", idx)])
    g0, g1 = _check_exact(m)
    assert not [n for n in g1.nodes if n.op == "Fused" and n.attrs.anchor_op == "Gather"]


def test_elementwise_after_a_gemm_joins_its_epilogue_late():
    # What the layout pass leaves in ConvNeXt: Fused[MatMul]{Add bias, Mul scale} then a separate
    # Fused[Elementwise]{Add residual} (transposes stood between them during epilogue fusion).
    from graphc.ir.builder import GraphBuilder
    from graphc.ir.types import DType, TensorType
    from graphc.ops.fused import ACC, IN, OP, EpilogueOp, FusedAttrs
    from graphc.ops.registry import get_op
    from graphc.passes.fuse_data_epilogues import fuse_data_epilogues

    add, mul = get_op("Add").attrs(), get_op("Mul").attrs()
    b = GraphBuilder("t", opset=17)
    x = b.add_input("x", TensorType(DType.float32, (6, 8)))
    r = b.add_input("r", TensorType(DType.float32, (6, 4)))
    w = b.add_constant(RNG.standard_normal((8, 4)).astype(np.float32), "w")
    bias = b.add_constant(RNG.standard_normal(4).astype(np.float32), "bias")
    gemm = FusedAttrs(
        anchor_op="MatMul",
        anchor_attrs=get_op("MatMul").attrs(),
        anchor_inputs=2,
        epilogue=(EpilogueOp("Add", add, (ACC, IN(2))), EpilogueOp("Mul", mul, (OP(0), OP(0)))),
        outputs=(OP(1),),
    )
    h = b.add_node("Fused", [x, w, bias], gemm, name="gemm", domain="graphc").outputs[0]
    ew = FusedAttrs(epilogue=(EpilogueOp("Add", add, (IN(0), IN(1))),), outputs=(OP(0),))
    y = b.add_node("Fused", [r, h], ew, name="res", domain="graphc").outputs[0]
    b.set_outputs([y])
    g0 = b.build()
    g1 = fuse_data_epilogues(g0)
    (node,) = g1.nodes
    assert node.attrs.anchor_op == "MatMul" and [e.op for e in node.attrs.epilogue] == ["Add", "Mul", "Add"]
    feeds = {"x": RNG.standard_normal((6, 8)).astype(np.float32), "r": RNG.standard_normal((6, 4)).astype(np.float32)}
    out = g0.output_names[0]
    np.testing.assert_array_equal(graphc.interpret(g0, feeds)[out], graphc.interpret(g1, feeds)[out])
