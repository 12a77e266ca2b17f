"""`graphc check` agrees with the compile (issue 12): over the zoo's tiny models and hand-made
graphs with ops the CUDA target does not cover, check --target X says "compiles" exactly when
graphc.compile(target=X) succeeds (CUDA through NVRTC, no GPU needed), and names the op that
stops it."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import graphc
import models
from graphc.cli import main
from graphc.errors import GraphcError
from graphc.support import check_model

try:
    from graphc.codegen.nvrtc import nvrtc_version

    nvrtc_version()
    HAVE_NVRTC = True
except Exception:
    HAVE_NVRTC = False

F = TensorProto.FLOAT


def _model(nodes, inputs, outputs, inits=(), opset=18, extra_opsets=()) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "t", inputs, outputs, list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset), *extra_opsets])
    m.ir_version = 9
    return m


def _vi(name, shape, t=F):
    return helper.make_tensor_value_info(name, t, shape)


def einsum_diagonal():
    return _model([helper.make_node("Einsum", ["x"], ["y"], equation="ii->i")], [_vi("x", [4, 4])], [_vi("y", [4])])


def lppool_ceil():
    node = helper.make_node("LpPool", ["x"], ["y"], kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1, p=2)
    return _model([node], [_vi("x", [1, 2, 5, 5])], [_vi("y", [1, 2, 3, 3])])


def runtime_split_sequence():
    nodes = [
        helper.make_node("SplitToSequence", ["x", "s"], ["parts"], axis=0),
        helper.make_node("SequenceAt", ["parts", "i"], ["y"]),
    ]
    return _model(
        nodes,
        [_vi("x", [6]), _vi("s", [2], TensorProto.INT64)],
        [_vi("y", ["m"])],
        [numpy_helper.from_array(np.array(1, np.int64), "i")],
    )


def static_split_sequence():
    nodes = [
        helper.make_node("SplitToSequence", ["x", "s"], ["parts"], axis=1),
        helper.make_node("SequenceAt", ["parts", "i"], ["y"]),
    ]
    return _model(
        nodes,
        [_vi("x", [2, 6])],
        [_vi("y", [2, 3])],
        [numpy_helper.from_array(np.array(3, np.int64), "s"), numpy_helper.from_array(np.array(1, np.int64), "i")],
    )


def runtime_scale_dequantize():
    node = helper.make_node("DequantizeLinear", ["x", "scale"], ["y"])
    return _model([node], [_vi("x", [4, 8], TensorProto.INT8), _vi("scale", [])], [_vi("y", [4, 8])])


def dynamic_dims():
    return _model([helper.make_node("Relu", ["x"], ["y"])], [_vi("x", ["batch", 8])], [_vi("y", ["batch", 8])])


def custom_op_in_a_branch():
    then_g = helper.make_graph(
        [helper.make_node("Frobnicate", ["x"], ["t"], domain="my.ops")], "then", [], [_vi("t", [3])]
    )
    else_g = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [], [_vi("e", [3])])
    node = helper.make_node("If", ["c"], ["y"], name="branch", then_branch=then_g, else_branch=else_g)
    return _model(
        [node],
        [_vi("c", [], TensorProto.BOOL), _vi("x", [3])],
        [_vi("y", [3])],
        extra_opsets=[helper.make_opsetid("my.ops", 1)],
    )


def topk_and_resize():
    nodes = [
        helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=2),
        helper.make_node("Resize", ["v", "", "sc"], ["y"], mode="linear"),
    ]
    return _model(
        nodes,
        [_vi("x", [1, 1, 6, 4])],
        [_vi("y", [1, 1, 3, 4]), _vi("i", [1, 1, 3, 4], TensorProto.INT64)],
        [numpy_helper.from_array(np.array([3], np.int64), "k"), numpy_helper.from_array(np.ones(4, np.float32), "sc")],
    )


# name -> (model builder, shapes, {target: the op the check must name, or None when it compiles})
HANDMADE = {
    "einsum-diagonal": (einsum_diagonal, None, {"cpu": None, "cuda": "Einsum"}),
    "lppool-ceil": (lppool_ceil, None, {"cpu": None, "cuda": "LpPool"}),
    "runtime-split-sequence": (runtime_split_sequence, None, {"cpu": "SequenceAt", "cuda": "SequenceAt"}),
    "static-split-sequence": (static_split_sequence, None, {"cpu": None, "cuda": None}),
    "runtime-scale-dequantize": (runtime_scale_dequantize, None, {"cpu": None, "cuda": "DequantizeLinear"}),
    "dynamic-dims": (dynamic_dims, None, {"cpu": "(inputs)", "cuda": "(inputs)"}),
    "dynamic-dims-bound": (dynamic_dims, {"batch": 2}, {"cpu": None, "cuda": None}),
    "custom-op-in-a-branch": (custom_op_in_a_branch, None, {"cpu": "my.ops.Frobnicate", "cuda": "my.ops.Frobnicate"}),
    "topk-and-identity-resize": (topk_and_resize, None, {"cpu": None, "cuda": None}),
}


def _compiles(model, target: str, shapes) -> tuple[bool, str]:
    kw = {"arch": ["sm_80"]} if target == "cuda" else {}
    try:
        graphc.compile(model, target=target, shapes=shapes, **kw)
    except GraphcError as e:
        return False, str(e)
    return True, ""


@pytest.mark.skipif(not HAVE_NVRTC, reason="the cuda compile needs NVRTC (cuda-bindings)")
@pytest.mark.parametrize("target", ["cpu", "cuda"])
@pytest.mark.parametrize("case", list(HANDMADE))
def test_check_agrees_with_compile_on_handmade_graphs(case, target):
    build, shapes, expect = HANDMADE[case]
    model = build()
    report = check_model(model, target=target, shapes=shapes)
    ok, err = _compiles(model, target, shapes)
    assert report.supported == ok, f"check says {report.lines()}, compile says {err or 'ok'}"
    want = expect[target]
    if want is None:
        assert report.supported, report.lines()
    else:
        assert want in {f.op.removesuffix(" (fused)") for f in report.findings}, report.lines()
        assert all(f.reason for f in report.findings)


@pytest.mark.skipif(not HAVE_NVRTC, reason="the cuda compile needs NVRTC (cuda-bindings)")
@pytest.mark.parametrize("target", ["cpu", "cuda"])
@pytest.mark.parametrize("name", models.list_models())
def test_check_agrees_with_compile_on_the_zoo(name, target):
    model = models.build(name, size="tiny", batch=2)
    shapes = {"seq": 16} if name == "bert" else None
    report = check_model(model, target=target, shapes=shapes)
    ok, err = _compiles(model, target, shapes)
    assert report.supported == ok, f"check says {report.lines()}, compile says {err or 'ok'}"


def test_subgraph_ops_are_named_with_their_place():
    report = check_model(custom_op_in_a_branch(), target="cpu")
    inner = [f for f in report.findings if f.op == "my.ops.Frobnicate"]
    assert inner and inner[0].where == "then_branch of If 'branch'", report.lines()


def test_cli_check_target_and_shapes(tmp_path, capsys):
    path = tmp_path / "d.onnx"
    onnx.save(dynamic_dims(), path)
    assert main(["check", str(path)]) == 1
    out = capsys.readouterr().out
    assert "does not compile for cpu" in out and "--shapes" in out
    assert main(["check", str(path), "--target", "cuda", "--shapes", "batch=4"]) == 0
    assert "every op compiles for cuda" in capsys.readouterr().out
    path = tmp_path / "e.onnx"
    onnx.save(einsum_diagonal(), path)
    assert main(["check", str(path), "--target", "cuda"]) == 1
    out = capsys.readouterr().out
    assert "Einsum" in out and "supported" not in out
    assert main(["check", str(path), "--target", "cpu"]) == 0
