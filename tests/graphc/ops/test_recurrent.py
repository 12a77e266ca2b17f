"""LSTM, GRU and RNN against ONNX Runtime over every attribute, at fp32 tolerances (1e-5 relative).

ONNX Runtime's CPU kernels refuse layout=1, so layout=1 cases run ORT on the same data in layout 0
and compare the transposed outputs. Its activation defaults differ from the spec's (see
runtime/reference/recurrent.py), so alpha/beta are given explicitly where ORT is the oracle and
the spec defaults are checked against a plain numpy recurrence.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import graphc
from graphc.errors import GraphcError
from helpers import assert_close, make_node_model, rand, run_graphc, run_ort

GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}


@dataclass
class Case:
    op: str
    seq: int = 5
    batch: int = 3
    isize: int = 4
    hidden: int = 7
    attrs: dict[str, Any] = field(default_factory=dict)
    layout: int = 0
    bias: bool = True
    lens: list[int] | None = None
    h0: bool = True
    c0: bool = True
    peep: bool = True
    outputs: tuple[str, ...] | None = None
    dtype: Any = np.float32

    @property
    def dirs(self) -> int:
        return 2 if self.attrs.get("direction") == "bidirectional" else 1

    def feeds(self) -> tuple[dict[str, np.ndarray], list[str]]:
        g, d, h, dt = GATES[self.op], self.dirs, self.hidden, self.dtype
        x_shape = (self.batch, self.seq, self.isize) if self.layout else (self.seq, self.batch, self.isize)
        state = (self.batch, d, h) if self.layout else (d, self.batch, h)
        ins = {
            "X": rand(x_shape, dt, seed=1),
            "W": rand((d, g * h, self.isize), dt, seed=2, low=-0.6, high=0.6),
            "R": rand((d, g * h, h), dt, seed=3, low=-0.6, high=0.6),
        }
        order = ["X", "W", "R"]
        optional: list[tuple[str, np.ndarray | None]] = [
            ("B", rand((d, 2 * g * h), dt, seed=4) if self.bias else None),
            ("L", None if self.lens is None else np.array(self.lens, np.int32)),
            ("h0", rand(state, dt, seed=5) if self.h0 else None),
        ]
        if self.op == "LSTM":
            optional += [
                ("c0", rand(state, dt, seed=6) if self.c0 else None),
                ("P", rand((d, 3 * h), dt, seed=7) if self.peep else None),
            ]
        for name, v in optional:
            order.append(name if v is not None else "")
            if v is not None:
                ins[name] = v
        while order[-1] == "":
            order.pop()
        return ins, order

    def model(self, layout: int) -> onnx.ModelProto:
        ins, order = self.feeds()
        if layout != self.layout:
            ins = {k: np.swapaxes(v, 0, 1) if k in ("X", "h0", "c0") else v for k, v in ins.items()}
        attrs = {"hidden_size": self.hidden, **self.attrs}
        if layout:
            attrs["layout"] = 1
        outs = self.outputs or (("Y", "Y_h", "Y_c") if self.op == "LSTM" else ("Y", "Y_h"))
        return make_node_model(self.op, ins, attrs, outputs=outs, input_order=order), ins


def _check(case: Case, rtol: float | None = None, atol: float | None = None) -> dict[str, np.ndarray]:
    model, ins = case.model(case.layout)
    got = run_graphc(model, ins)
    ort_model, ort_ins = case.model(0)
    want = run_ort(ort_model, ort_ins)
    if case.layout:  # ORT ran layout 0: Y [S, D, B, H] -> [B, S, D, H], states [D, B, H] -> [B, D, H]
        want = {k: np.moveaxis(v, 2, 0) if k == "Y" else np.swapaxes(v, 0, 1) for k, v in want.items()}
    assert set(got) == set(want)
    for k in want:
        assert_close(got[k], want[k], rtol=rtol, atol=atol, what=f"{case.op} {k}")
    return got


DIRECTIONS = ["forward", "reverse", "bidirectional"]


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("direction", DIRECTIONS)
@pytest.mark.parametrize("layout", [0, 1])
def test_directions_and_layouts(op, direction, layout):
    _check(Case(op, attrs={"direction": direction}, layout=layout))


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("direction", DIRECTIONS)
@pytest.mark.parametrize("lens", [[5, 2, 3], [1, 5, 0]])
def test_sequence_lens(op, direction, lens):
    # Shorter entries run only their own steps (reverse from their own end); Y is zero past them.
    got = _check(Case(op, attrs={"direction": direction}, lens=lens))
    for b, n in enumerate(lens):
        assert not got["Y"][n:, :, b].any(), f"Y of batch entry {b} past its length {n}"
        assert got["Y"][:n, :, b].all()


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("clip", [0.3, 1.5])
def test_clip(op, clip):
    _check(Case(op, attrs={"clip": clip, "direction": "bidirectional"}))


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("missing", ["bias", "h0", "c0", "peep", "all"])
def test_optional_inputs(op, missing):
    if op != "LSTM" and missing in ("c0", "peep"):
        pytest.skip("LSTM-only input")
    kw = {"bias": False, "h0": False, "c0": False, "peep": False} if missing == "all" else {missing: False}
    _check(Case(op, **kw))


@pytest.mark.parametrize("input_forget", [0, 1])
@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
def test_lstm_input_forget(input_forget, direction):
    _check(Case("LSTM", attrs={"input_forget": input_forget, "direction": direction}))


@pytest.mark.parametrize("lbr", [0, 1])
@pytest.mark.parametrize("direction", DIRECTIONS)
def test_gru_linear_before_reset(lbr, direction):
    _check(Case("GRU", attrs={"linear_before_reset": lbr, "direction": direction}, lens=[4, 5, 2]))


# Activation sets with explicit alpha/beta (consumed in order by the functions that take them).
LSTM_ACTS = [
    (["HardSigmoid", "LeakyRelu", "Affine"], [0.3, 0.05, 0.7], [0.4, 0.2]),
    (["Sigmoid", "ScaledTanh", "Softsign"], [0.8], [1.3]),
    (["sigmoid", "Elu", "Tanh"], [0.6], None),  # names are case-insensitive
    (["HardSigmoid", "Tanh", "Softplus"], [0.25], [0.45]),
    (["Sigmoid", "ThresholdedRelu", "Relu"], [0.1], None),
]


@pytest.mark.parametrize("acts,alpha,beta", LSTM_ACTS)
def test_lstm_activations(acts, alpha, beta):
    attrs: dict[str, Any] = {"activations": acts}
    if alpha:
        attrs["activation_alpha"] = alpha
    if beta:
        attrs["activation_beta"] = beta
    _check(Case("LSTM", attrs=attrs))


def test_lstm_bidirectional_activations_per_direction():
    attrs = {
        "direction": "bidirectional",
        "activations": ["Sigmoid", "Tanh", "Tanh", "HardSigmoid", "Softsign", "LeakyRelu"],
        "activation_alpha": [0.3, 0.2],
        "activation_beta": [0.55],
    }
    _check(Case("LSTM", attrs=attrs))


@pytest.mark.parametrize(
    "acts,alpha,beta",
    [
        (["HardSigmoid", "Elu"], [0.3, 0.7], [0.45]),
        (["Sigmoid", "Softsign"], None, None),
        (["Sigmoid", "Relu"], None, None),
    ],
)
def test_gru_activations(acts, alpha, beta):
    attrs: dict[str, Any] = {"activations": acts, "direction": "bidirectional"}
    attrs["activations"] = acts * 2
    if alpha:
        attrs["activation_alpha"] = alpha * 2
    if beta:
        attrs["activation_beta"] = beta * 2
    _check(Case("GRU", attrs=attrs))


@pytest.mark.parametrize(
    "act,alpha,beta",
    [
        ("Relu", None, None),
        ("Sigmoid", None, None),
        ("Affine", [0.5], [0.1]),
        ("LeakyRelu", [0.1], None),
        ("ThresholdedRelu", [0.2], None),
        ("ScaledTanh", [0.8], [1.3]),
        ("HardSigmoid", [0.3], [0.4]),
        ("Elu", [0.5], None),
        ("Softsign", None, None),
        ("Softplus", None, None),
    ],
)
def test_rnn_activations(act, alpha, beta):
    attrs: dict[str, Any] = {"activations": [act]}
    if alpha:
        attrs["activation_alpha"] = alpha
    if beta:
        attrs["activation_beta"] = beta
    _check(Case("RNN", attrs=attrs))


@pytest.mark.parametrize(
    "sizes",
    [
        dict(seq=1, batch=1, isize=1, hidden=1),
        dict(seq=9, batch=2, isize=5, hidden=3),
        dict(seq=3, batch=5, isize=13, hidden=11),
    ],
)
@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
def test_odd_sizes(op, sizes):
    _check(Case(op, attrs={"direction": "bidirectional"}, **sizes))


def _against_float32_ort(case: Case, rtol: float, atol: float) -> None:
    """`case` in its dtype through graphc against ORT in float32 on the same values (ORT's CPU
    kernels have no float16 LSTM/GRU/RNN and no float64 LSTM)."""
    model, ins = case.model(0)
    got = run_graphc(model, ins)
    ins32 = {k: v.astype(np.float32) if v.dtype.kind == "f" else v for k, v in ins.items()}
    m32, _ = Case(**{**case.__dict__, "dtype": np.float32}).model(0)
    want = run_ort(m32, ins32)
    for k in want:
        assert got[k].dtype == case.dtype
        assert_close(got[k].astype(np.float32), want[k], rtol=rtol, atol=atol, what=k)


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
def test_float64(op):
    _against_float32_ort(Case(op, dtype=np.float64, attrs={"direction": "bidirectional"}, lens=[3, 5, 1]), 1e-5, 1e-6)


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
def test_float16_computes_in_float32(op):
    # Float16 data (exactly representable in float32): the float32 result rounded once.
    _against_float32_ort(Case(op, dtype=np.float16), 2e-3, 2e-3)


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
def test_only_last_state_output(op):
    # Y omitted (''), only Y_h asked for: exporters write this.
    _check(Case(op, outputs=("", "Y_h")))


@pytest.mark.parametrize("opset", [1, 3, 7, 14])
@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
def test_older_opsets(op, opset):
    # graphc reads the old version; ORT (which has no kernels before 7) runs the same node at 14.
    case = Case(op, attrs={"direction": "bidirectional"}, lens=[5, 3, 4])
    want = run_ort(*case.model(0))
    if opset < 7:
        case.attrs["output_sequence"] = 1
    model, ins = case.model(0)
    model.opset_import[0].version = opset
    got = run_graphc(model, ins)
    for k in want:
        assert_close(got[k], want[k], what=f"{op} opset {opset} {k}")


def _plain_rnn(x, w, r, b, h, act):
    """A forward RNN written out step by step (independent of the reference's vectorized form)."""
    ys = []
    for t in range(x.shape[0]):
        h = act(x[t] @ w.T + h @ r.T + b[: w.shape[0]] + b[w.shape[0] :])
        ys.append(h)
    return np.stack(ys)[:, None], h[None]


@pytest.mark.parametrize(
    "act,fn",
    [
        ("Affine", lambda v: v),  # alpha 1, beta 0
        ("ScaledTanh", np.tanh),  # alpha 1, beta 1
        ("ThresholdedRelu", lambda v: np.where(v > 1.0, v, 0)),  # alpha 1
        ("LeakyRelu", lambda v: np.where(v >= 0, v, 0.01 * v)),
        ("HardSigmoid", lambda v: np.clip(0.2 * v + 0.5, 0, 1)),
        ("Elu", lambda v: np.where(v >= 0, v, np.expm1(np.minimum(v, 0)))),
    ],
)
def test_activation_defaults_are_the_spec(act, fn):
    case = Case("RNN", attrs={"activations": [act]}, seq=4, hidden=5)
    model, ins = case.model(0)
    got = run_graphc(model, ins)
    y, yh = _plain_rnn(
        *(ins[k].astype(np.float64) for k in ("X",)),
        ins["W"][0].astype(np.float64),
        ins["R"][0].astype(np.float64),
        ins["B"][0].astype(np.float64),
        ins["h0"][0].astype(np.float64),
        fn,
    )
    assert_close(got["Y"], y.astype(np.float32), what="Y")
    assert_close(got["Y_h"], yh.astype(np.float32), what="Y_h")


@pytest.mark.parametrize("op", ["LSTM", "GRU"])
def test_cpu_engine_runs_the_reference(op, tmp_path):
    # The attrs go through the runtime's closed table: a CPU engine must give the interpreter's answer.
    acts = ["Sigmoid", "Tanh", "Tanh"] if op == "LSTM" else ["Sigmoid", "Tanh"]
    case = Case(op, attrs={"direction": "bidirectional", "clip": 2.0, "activations": acts * 2}, lens=[5, 1, 3])
    model, ins = case.model(0)
    engine = graphc.compile(model, target="cpu")
    got = engine.run(ins)
    want = run_graphc(model, ins)
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
def test_hidden_size_taken_from_r_when_absent(op):
    case = Case(op, hidden=5)
    model, ins = case.model(0)
    want = run_ort(model, ins)
    attrs = model.graph.node[0].attribute
    del attrs[[a.name for a in attrs].index("hidden_size")]
    got = run_graphc(model, ins)
    for k in want:
        assert_close(got[k], want[k], what=k)


def _bad_model(op: str, attrs: dict, w_rows: int | None = None) -> onnx.ModelProto:
    g, h = GATES[op], 3
    ins = {"X": rand((2, 1, 2)), "W": rand((1, w_rows or g * h, 2)), "R": rand((1, g * h, h))}
    node = helper.make_node(op, ["X", "W", "R"], ["Y"], **{"hidden_size": h, **attrs})
    graph = helper.make_graph(
        [node],
        "bad",
        [helper.make_tensor_value_info(k, TensorProto.FLOAT, v.shape) for k, v in ins.items()],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["s", "d", "b", "h"])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 22)])


@pytest.mark.parametrize(
    "op,attrs,w_rows,message",
    [
        ("LSTM", {"activations": ["Sigmoid", "Tanh"]}, None, "2 activations given; LSTM with 1 direction(s) takes 3"),
        ("GRU", {"activations": ["Sigmoid", "Swish"]}, None, "unknown activation 'Swish'"),
        ("RNN", {"direction": "sideways"}, None, "direction must be forward, reverse or bidirectional"),
        ("LSTM", {"hidden_size": 4}, None, "hidden_size vs R's last dim: 4 != 3"),
        ("GRU", {}, 7, "W dim 1 (3 gates x hidden_size 3): 7 != 9"),
        ("RNN", {"layout": 2}, None, "layout must be 0 or 1"),
    ],
)
def test_bad_attributes_name_the_node(op, attrs, w_rows, message):
    with pytest.raises(GraphcError) as e:
        graphc.load_onnx(_bad_model(op, attrs, w_rows))
    assert message in str(e.value)
    assert op in str(e.value)
