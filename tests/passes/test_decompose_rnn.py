"""decompose_rnn: the unrolled MatMul + elementwise form of LSTM, GRU and RNN equals the reference
(through the interpreter) over directions, layouts, clip, activations, peepholes, input_forget,
linear_before_reset, absent and present initial states and biases, constant and run-time weights;
constant sequence_lens below the length (masked steps); dynamic shapes and
run-time sequence_lens are declined (logged), sequences above MAX_STEPS refused
naming the node; a model with an LSTM compiles for the CUDA target (NVRTC, no GPU needed)."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import graphc
from graphc.errors import CompileError
from graphc.ir.shapes import bind_shapes
from graphc.passes.decompose_rnn import MAX_STEPS, decompose_rnn

GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}


def _model(
    op: str,
    *,
    seq: int = 4,
    batch: int = 3,
    isize: int = 5,
    hidden: int = 6,
    attrs: dict[str, Any] | None = None,
    bias: bool = True,
    h0: bool = True,
    c0: bool = True,
    peep: bool = True,
    weights_as_inputs: bool = False,
    lens: list[int] | None = None,
    lens_input: bool = False,
    dynamic_seq: bool = False,
) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    attrs = dict(attrs or {})
    rng = np.random.default_rng(len(op) + seq + hidden)
    g, d = GATES[op], 2 if attrs.get("direction") == "bidirectional" else 1
    layout = attrs.get("layout", 0)
    x_shape = (batch, seq, isize) if layout else (seq, batch, isize)
    st = (batch, d, hidden) if layout else (d, batch, hidden)

    def r(*shape, scale=0.6):
        return (rng.uniform(-scale, scale, size=shape)).astype(np.float32)

    feeds = {"X": r(*x_shape, scale=2.0)}
    consts = {"W": r(d, g * hidden, isize), "R": r(d, g * hidden, hidden)}
    order = ["X", "W", "R"]
    optional = [
        ("B", r(d, 2 * g * hidden, scale=1.0) if bias else None),
        ("L", None if lens is None else np.array(lens, np.int32)),
        ("h0", r(*st, scale=1.0) if h0 else None),
    ]
    if op == "LSTM":
        optional += [("c0", r(*st, scale=1.0) if c0 else None), ("P", r(d, 3 * hidden) if peep else None)]
    for name, v in optional:
        order.append(name if v is not None else "")
        if v is None:
            continue
        (feeds if name in ("h0", "c0") or (name == "L" and lens_input) else consts)[name] = v
    while order[-1] == "":
        order.pop()
    if weights_as_inputs:
        feeds.update({k: consts.pop(k) for k in ("W", "R", "B") if k in consts})
    outs = ["Y", "Y_h", "Y_c"] if op == "LSTM" else ["Y", "Y_h"]
    node = helper.make_node(op, order, outs, hidden_size=hidden, **attrs)
    ins = []
    for k, v in feeds.items():
        shape = list(v.shape)
        if dynamic_seq and k == "X":
            shape[1 if layout else 0] = "seq"
        ins.append(
            helper.make_tensor_value_info(k, TensorProto.FLOAT if v.dtype == np.float32 else TensorProto.INT32, shape)
        )
    graph = helper.make_graph(
        [node],
        op,
        ins,
        [helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None) for o in outs],
        [numpy_helper.from_array(v, k) for k, v in consts.items()],
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 22)])
    m.ir_version = 10
    return onnx.shape_inference.infer_shapes(m), feeds


CASES = [
    ("LSTM", {}),
    ("LSTM", {"attrs": {"direction": "bidirectional"}}),
    ("LSTM", {"attrs": {"direction": "reverse", "clip": 0.4}}),
    ("LSTM", {"attrs": {"layout": 1, "direction": "bidirectional", "input_forget": 1}}),
    ("LSTM", {"h0": False, "c0": False, "peep": False, "bias": False}),
    (
        "LSTM",
        {
            "attrs": {
                "activations": ["HardSigmoid", "ScaledTanh", "Affine"],
                "activation_alpha": [0.3, 0.8, 0.7],
                "activation_beta": [0.45, 1.2, 0.1],
            }
        },
    ),
    ("LSTM", {"attrs": {"activations": ["Sigmoid", "Elu", "Softsign"]}, "seq": 1, "batch": 1}),
    ("LSTM", {"weights_as_inputs": True, "attrs": {"direction": "bidirectional"}}),
    ("LSTM", {"lens": [4, 4, 4]}),  # constant lengths equal to the sequence: no masking needed
    ("LSTM", {"lens": [4, 1, 3], "attrs": {"direction": "bidirectional"}}),
    ("LSTM", {"lens": [2, 0, 3], "attrs": {"direction": "reverse", "layout": 1}, "h0": False}),
    ("GRU", {"lens": [1, 4, 0], "attrs": {"direction": "bidirectional", "linear_before_reset": 1}}),
    ("RNN", {"lens": [3, 2, 1], "attrs": {"direction": "reverse"}}),
    ("RNN", {"lens": [0, 0, 0]}),
    ("GRU", {}),
    ("GRU", {"attrs": {"linear_before_reset": 1, "direction": "bidirectional"}}),
    ("GRU", {"attrs": {"linear_before_reset": 1, "layout": 1}, "weights_as_inputs": True}),
    ("GRU", {"attrs": {"clip": 0.7, "activations": ["Sigmoid", "LeakyRelu"], "activation_alpha": [0.2]}, "h0": False}),
    ("GRU", {"attrs": {"direction": "reverse"}, "bias": False, "seq": 7, "hidden": 9}),
    ("RNN", {}),
    ("RNN", {"attrs": {"direction": "bidirectional", "activations": ["Relu", "Softplus"]}}),
    ("RNN", {"attrs": {"layout": 1, "clip": 1.0, "activations": ["ThresholdedRelu"], "activation_alpha": [0.1]}}),
    ("RNN", {"weights_as_inputs": True, "h0": False}),
]


def _decomposed(m: onnx.ModelProto):
    g = bind_shapes(graphc.load_onnx(m), None)
    fired: list[str] = []
    d = decompose_rnn(g, fired=fired)
    return g, d, fired


@pytest.mark.parametrize(("op", "kw"), CASES)
def test_unrolled_form_equals_reference(op, kw):
    m, feeds = _model(op, **kw)
    g, d, fired = _decomposed(m)
    assert len(fired) == 1
    ops = {n.op for n in d.nodes}
    assert not ops & {"LSTM", "GRU", "RNN"}
    assert "MatMul" in ops
    ref, got = graphc.interpret(g, feeds), graphc.interpret(d, feeds)
    assert set(got) == set(ref)
    for k in ref:
        assert got[k].shape == ref[k].shape and got[k].dtype == ref[k].dtype, k
        np.testing.assert_allclose(got[k], ref[k], rtol=1e-5, atol=1e-6, err_msg=f"{op} {k}")


def test_one_projection_matmul_per_direction_and_one_recurrent_matmul_per_step():
    seq = 5
    m, _ = _model("LSTM", seq=seq, attrs={"direction": "bidirectional"})
    _, d, _ = _decomposed(m)
    matmuls = [n for n in d.nodes if n.op == "MatMul"]
    # per direction: 1 projection of all steps ([S*B, I] x [I, 4H]) + 1 per step
    assert len(matmuls) == 2 * (1 + seq)
    proj = [n for n in matmuls if n.name.endswith("/proj")]
    assert len(proj) == 2 and all(n.outputs[0].ttype.shape == (seq * 3, 4 * 6) for n in proj)


def test_runtime_lengths_and_dynamic_shapes_are_declined(caplog):
    for kw, why in [
        ({"lens": [4, 2, 3], "lens_input": True}, "sequence_lens is not known at compile time"),
        ({"dynamic_seq": True}, "not static"),
    ]:
        m, _ = _model("GRU", **kw)
        g = graphc.load_onnx(m)
        with caplog.at_level("WARNING", logger="graphc.passes.decompose_rnn"):
            caplog.clear()
            out = decompose_rnn(g)
        assert out is g
        assert "GRU node" in caplog.text and why in caplog.text


def test_lengths_computed_from_shapes_are_known():
    # tf2onnx writes sequence_lens as Expand(seq_len, Shape(X)[1:2]) cast to int32: not a constant,
    # but known once the shapes are bound.
    m, feeds = _model("LSTM", lens=[4, 4, 4], attrs={"direction": "bidirectional"})
    g = m.graph
    del g.initializer[[t.name for t in g.initializer].index("L")]
    g.initializer.append(numpy_helper.from_array(np.array([4], np.int64), "len4"))
    g.initializer.append(numpy_helper.from_array(np.array([1], np.int64), "one"))
    g.initializer.append(numpy_helper.from_array(np.array([2], np.int64), "two"))
    g.node.insert(0, helper.make_node("Cast", ["lens64"], ["L"], to=TensorProto.INT32))
    g.node.insert(0, helper.make_node("Expand", ["len4", "batch"], ["lens64"]))
    g.node.insert(0, helper.make_node("Slice", ["x_shape", "one", "two"], ["batch"]))
    g.node.insert(0, helper.make_node("Shape", ["X"], ["x_shape"]))
    gr, d, fired = _decomposed(m)
    assert len(fired) == 1
    ref, got = graphc.interpret(gr, feeds), graphc.interpret(d, feeds)
    for k in ref:
        np.testing.assert_allclose(got[k], ref[k], rtol=1e-5, atol=1e-6, err_msg=k)


def test_sequence_above_the_bound_is_refused_naming_the_node():
    m, _ = _model("RNN", seq=MAX_STEPS + 1, batch=1, isize=2, hidden=2)
    m.graph.node[0].name = "encoder_rnn"
    with pytest.raises(CompileError, match=f"RNN node 'encoder_rnn': sequence length {MAX_STEPS + 1} is above"):
        _decomposed(m)


def test_matches_onnxruntime_through_the_optimizer():
    from helpers import run_ort

    m, feeds = _model("LSTM", attrs={"direction": "bidirectional"}, seq=6)
    expected = run_ort(m, feeds)
    from graphc.passes.manager import OptimizeOptions, optimize

    _, d, _ = _decomposed(m)
    opt = optimize(d, OptimizeOptions(opt_level=2)).graph
    assert any(n.op == "graphc.Fused" or n.domain == "graphc" for n in opt.nodes)  # the gate math fused
    got = graphc.interpret(opt, feeds)
    for k in expected:
        np.testing.assert_allclose(got[k], expected[k], rtol=1e-5, atol=1e-6, err_msg=k)


def test_cuda_target_compiles_an_lstm():
    m, _ = _model("LSTM", seq=3, batch=2, isize=8, hidden=16, attrs={"direction": "bidirectional"})
    eng = graphc.compile(m, target="cuda", arch=["sm_90"])
    ops = {s.op for s in eng.plan.steps}
    assert "LSTM" not in ops
    families = {ln.family for s in eng.plan.steps for ln in s.launches}
    assert "gemm" in families and "elementwise" in families


def test_cuda_target_compiles_a_gru_with_constant_ragged_lengths():
    m, _ = _model("GRU", lens=[4, 1, 3], attrs={"direction": "bidirectional", "linear_before_reset": 1})
    eng = graphc.compile(m, target="cuda", arch=["sm_90"])
    assert "GRU" not in {s.op for s in eng.plan.steps}


def test_cpu_target_keeps_the_reference_op():
    m, _ = _model("GRU")
    eng = graphc.compile(m, target="cpu")
    assert any(s.op == "GRU" for s in eng.plan.steps)
