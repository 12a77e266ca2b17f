"""passes/lower_sequences.py: static-length sequences become tensor ops (issue 12). The graphs
are written the way the dynamo exporter writes GPT-2's `qkv.split(n_embd, dim=2)`
(SplitToSequence with a scalar split, then SequenceAt 0/1/2) and `torch.stack`/`torch.cat` of
lists (SequenceConstruct -> ConcatFromSequence); each is checked against ONNX Runtime before and
after the pass, and compiled for CUDA (NVRTC), which used to stop with "graphc compiles tensor
graphs only"."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import graphc
from graphc.ir.types import SequenceType
from graphc.passes.lower_sequences import lower_sequences
from graphc.passes.manager import OptimizeOptions, optimize
from tests.helpers import assert_close, rand, run_ort

F32 = np.float32
C = 8  # n_embd


def _i64(name: str, v) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(v, np.int64), name)


def gpt2_qkv_model(split_scalar: bool = True) -> onnx.ModelProto:
    """x [B, T, C] @ W [C, 3C] -> SplitToSequence(axis=2) -> q, k, v -> softmax(q k^T) v, plus the
    length of the list and a stack of (q, k) as extra outputs."""
    w = rand((C, 3 * C), F32, seed=1, low=-0.5, high=0.5)
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["qkv"], name="c_attn"),
        helper.make_node("SplitToSequence", ["qkv", "split"], ["parts"], name="split_qkv", axis=2),
        helper.make_node("SequenceAt", ["parts", "i0"], ["q"], name="at0"),
        helper.make_node("SequenceAt", ["parts", "i1"], ["k"], name="at1"),
        helper.make_node("SequenceAt", ["parts", "i2"], ["v"], name="at2"),
        helper.make_node("Transpose", ["k"], ["kt"], name="kt", perm=[0, 2, 1]),
        helper.make_node("MatMul", ["q", "kt"], ["s"], name="qk"),
        helper.make_node("Softmax", ["s"], ["p"], name="softmax", axis=-1),
        helper.make_node("MatMul", ["p", "v"], ["y"], name="pv"),
        helper.make_node("SequenceLength", ["parts"], ["n"], name="len"),
        helper.make_node("SequenceConstruct", ["q", "k"], ["qk_list"], name="construct"),
        helper.make_node("ConcatFromSequence", ["qk_list"], ["stacked"], name="stack", axis=0, new_axis=1),
        helper.make_node("ConcatFromSequence", ["parts"], ["cat"], name="cat", axis=-1),
    ]
    split = _i64("split", C) if split_scalar else _i64("split", [C, C, C])
    g = helper.make_graph(
        nodes,
        "gpt2_qkv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5, C])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 5, C]),
            helper.make_tensor_value_info("n", TensorProto.INT64, []),
            helper.make_tensor_value_info("stacked", TensorProto.FLOAT, [2, 2, 5, C]),
            helper.make_tensor_value_info("cat", TensorProto.FLOAT, [2, 5, 3 * C]),
        ],
        [numpy_helper.from_array(w, "w"), split, _i64("i0", 0), _i64("i1", 1), _i64("i2", -1)],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    m.ir_version = 9
    return m


def _has_sequences(graph) -> bool:
    return any(isinstance(o.type, SequenceType) for n in graph.nodes for o in n.outputs)


@pytest.mark.parametrize("split_scalar", [True, False])
def test_gpt2_split_lowered_matches_ort(split_scalar):
    model = gpt2_qkv_model(split_scalar)
    x = rand((2, 5, C), F32, seed=2)
    want = run_ort(model, {"x": x})
    graph = graphc.load_onnx(model)
    assert _has_sequences(graph)
    lowered = lower_sequences(graph)
    assert not _has_sequences(lowered), str(lowered)
    ops = {n.op for n in lowered.nodes}
    assert "Split" in ops and "Concat" in ops
    for g in (graph, lowered):
        got = graphc.interpret(g, {"x": x})
        for k in want:
            assert_close(got[k], want[k], rtol=1e-5, atol=1e-6, what=k)
    # In the pipeline too, at level 1.
    opt = optimize(graph, OptimizeOptions(opt_level=1)).graph
    assert not _has_sequences(opt)


def test_keepdims_0_insert_erase_and_empty():
    # SplitToSequence without split (parts of 1, squeezed), Insert at the front, Erase the last,
    # Insert into an empty sequence, then a stack.
    nodes = [
        helper.make_node("SplitToSequence", ["x"], ["rows"], axis=1, keepdims=0),
        helper.make_node("SequenceInsert", ["rows", "z", "i0"], ["rows2"]),
        helper.make_node("SequenceErase", ["rows2"], ["rows3"]),
        helper.make_node("ConcatFromSequence", ["rows3"], ["y"], axis=-1, new_axis=1),
        helper.make_node("SequenceEmpty", [], ["e"], dtype=TensorProto.FLOAT),
        helper.make_node("SequenceInsert", ["e", "z"], ["e1"]),
        helper.make_node("SequenceAt", ["e1", "i0"], ["z1"]),
        helper.make_node("Neg", ["z1"], ["w"]),
    ]
    g = helper.make_graph(
        nodes,
        "seqs",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4]),
            helper.make_tensor_value_info("z", TensorProto.FLOAT, [3]),
        ],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 4]),
            helper.make_tensor_value_info("w", TensorProto.FLOAT, [3]),
        ],
        [_i64("i0", 0)],
    )
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    feeds = {"x": rand((3, 4), F32, seed=3), "z": rand((3,), F32, seed=4)}
    want = run_ort(model, feeds)
    lowered = lower_sequences(graphc.load_onnx(model))
    assert not _has_sequences(lowered), str(lowered)
    got = graphc.interpret(lowered, feeds)
    for k in want:
        assert_close(got[k], want[k], what=k)


def test_run_time_split_keeps_the_general_form():
    nodes = [
        helper.make_node("SplitToSequence", ["x", "s"], ["parts"], axis=0),
        helper.make_node("SequenceAt", ["parts", "i0"], ["y"]),
    ]
    g = helper.make_graph(
        nodes,
        "dyn",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [6]),
            helper.make_tensor_value_info("s", TensorProto.INT64, [2]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["m"])],
        [_i64("i0", 1)],
    )
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    graph = graphc.load_onnx(model)
    assert lower_sequences(graph) is graph  # nothing static to lower
    feeds = {"x": rand((6,), F32, seed=5), "s": np.array([2, 4], np.int64)}
    assert_close(graphc.interpret(graph, feeds)["y"], run_ort(model, feeds)["y"])


def _have_nvrtc() -> bool:
    try:
        from graphc.codegen.nvrtc import nvrtc_version

        nvrtc_version()
        return True
    except Exception:
        return False


@pytest.mark.skipif(not _have_nvrtc(), reason="needs NVRTC (cuda-bindings)")
def test_gpt2_split_compiles_for_cuda():
    engine = graphc.compile(gpt2_qkv_model(), target="cuda", arch=["sm_80"])
    assert engine.kernels.sources
    # The CPU engine of the lowered graph agrees with ORT too.
    x = rand((2, 5, C), F32, seed=6)
    model = gpt2_qkv_model()
    got = graphc.compile(model, target="cpu").run({"x": x})
    want = run_ort(model, {"x": x})
    for k in want:
        assert_close(np.asarray(got[k]), want[k], rtol=1e-5, atol=1e-6, what=k)
