"""NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss against ONNX Runtime and an independent
per-sample numpy formula."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from graphc.errors import ShapeError
from graphc.ir.types import DType, TensorType
from graphc.ops.registry import InferContext, get_op
from helpers import assert_close, check_against_ort, make_node_model, rand, run_graphc


def ref_nll(logp, target, weight=None, reduction="mean", ignore_index=None):
    """The spec's loss, one sample position at a time, in float64."""
    logp = logp.astype(np.float64)
    loss = np.zeros(target.shape)
    wsum = 0.0
    for idx in itertools.product(*(range(n) for n in target.shape)):
        c = int(target[idx])
        if ignore_index is not None and c == ignore_index:
            continue
        w = 1.0 if weight is None else float(weight[c])
        loss[idx] = -logp[(idx[0], c, *idx[1:])] * w
        wsum += w
    if reduction == "sum":
        return loss.sum()
    if reduction == "mean":
        return loss.sum() / wsum
    return loss


def ref_log_softmax(x):
    shifted = x.astype(np.float64) - x.max(axis=1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))


CASES = [  # (scores shape, reduction, with weight, ignore_index)
    ((3, 5), "mean", False, None),
    ((3, 5), "none", True, None),
    ((1, 4), "sum", False, None),
    ((2, 3, 7), "mean", True, 1),  # ignore_index is a real class
    ((2, 3, 7), "mean", False, -1),  # mean divides by the non-ignored count
    ((2, 4, 3, 5), "none", False, -100),
    ((2, 4, 3, 5), "sum", True, 4),  # ignore_index outside [0, C)
    ((3, 2, 1, 2, 1), "mean", True, None),
]


def _inputs(shape, with_weight, ignore_index, dtype=np.float32, tdtype=np.int64, seed=0):
    n, c = shape[0], shape[1]
    x = rand(shape, dtype, seed=seed)
    target = rand((n, *shape[2:]), tdtype, seed=seed + 1, low=0, high=c - 1)
    if ignore_index is not None:
        target.reshape(-1)[::3] = ignore_index
    feeds = {"x": x, "t": target}
    if with_weight:
        feeds["w"] = rand((c,), dtype, seed=seed + 2, low=0.1, high=2.0)
    return feeds


def _attrs(reduction, ignore_index):
    attrs = {"reduction": reduction}
    if ignore_index is not None:
        attrs["ignore_index"] = ignore_index
    return attrs


@pytest.mark.parametrize("shape, reduction, with_weight, ignore_index", CASES)
def test_nll_loss(shape, reduction, with_weight, ignore_index):
    feeds = _inputs(shape, with_weight, ignore_index)
    out = check_against_ort("NegativeLogLikelihoodLoss", feeds, _attrs(reduction, ignore_index))
    want = ref_nll(feeds["x"], feeds["t"], feeds.get("w"), reduction, ignore_index)
    assert_close(out["y"], np.asarray(want, dtype=np.float32))


@pytest.mark.parametrize("shape, reduction, with_weight, ignore_index", CASES)
@pytest.mark.parametrize("log_prob", [False, True])
def test_softmax_cross_entropy(shape, reduction, with_weight, ignore_index, log_prob):
    feeds = _inputs(shape, with_weight, ignore_index, seed=3)
    outputs = ("y", "log_prob") if log_prob else ("y",)
    attrs = _attrs(reduction, ignore_index)
    out = check_against_ort("SoftmaxCrossEntropyLoss", feeds, attrs, outputs=outputs)
    logp = ref_log_softmax(feeds["x"])
    want = ref_nll(logp, feeds["t"], feeds.get("w"), reduction, ignore_index)
    assert_close(out["y"], np.asarray(want, dtype=np.float32))
    if log_prob:
        assert_close(out["log_prob"], logp.astype(np.float32))


@pytest.mark.parametrize("op", ["NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLoss"])
@pytest.mark.parametrize("reduction", ["none", "mean"])
def test_losses_float16_int32_targets(op, reduction):
    feeds = _inputs((4, 6, 3), True, 2, dtype=np.float16, tdtype=np.int32, seed=5)
    out = check_against_ort(op, feeds, _attrs(reduction, 2))
    logp = feeds["x"] if op == "NegativeLogLikelihoodLoss" else ref_log_softmax(feeds["x"])
    want = ref_nll(logp, feeds["t"], feeds["w"].astype(np.float64), reduction, 2)
    assert_close(out["y"], np.asarray(want).astype(np.float16))


def test_softmax_cross_entropy_float16_large_scores_stay_finite():
    # Scores near fp16's max: exp overflows unless the log-softmax runs in fp32 after a max shift.
    x = np.array([[60000.0, 59000.0, -60000.0], [0.0, 1.0, 2.0]], dtype=np.float16)
    t = np.array([1, 2], dtype=np.int64)
    model = make_node_model("SoftmaxCrossEntropyLoss", {"x": x, "t": t}, {"reduction": "none"})
    out = run_graphc(model, {"x": x, "t": t})["y"]
    assert_close(out, ref_nll(ref_log_softmax(x), t, reduction="none").astype(np.float16))


def test_losses_float64_and_opset12():
    feeds = _inputs((3, 4, 2), True, 0, dtype=np.float64, seed=7)
    for op in ("NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLoss"):
        out = check_against_ort(op, feeds, _attrs("mean", 0), opset=12)
        logp = feeds["x"] if op == "NegativeLogLikelihoodLoss" else ref_log_softmax(feeds["x"])
        assert_close(out["y"], np.asarray(ref_nll(logp, feeds["t"], feeds["w"], "mean", 0)))


def test_nll_ignored_position_with_inf_log_prob_is_zero():
    # An ignored position contributes exactly 0 even where every log-probability is -inf.
    x = np.array([[-np.inf, -np.inf], [-0.5, -1.0]], dtype=np.float32)
    t = np.array([-1, 1], dtype=np.int64)
    feeds = {"x": x, "t": t}
    model = make_node_model("NegativeLogLikelihoodLoss", feeds, {"reduction": "none", "ignore_index": -1})
    assert_close(run_graphc(model, feeds)["y"], np.array([0.0, 1.0], dtype=np.float32))


def test_nll_target_out_of_range_is_an_error():
    x = rand((2, 3))
    t = np.array([0, 3], dtype=np.int64)
    model = make_node_model("NegativeLogLikelihoodLoss", {"x": x, "t": t})
    with pytest.raises(Exception, match=r"outside \[0, 3\)"):
        run_graphc(model, {"x": x, "t": t})


# ---- type inference ------------------------------------------------------------------------------


def _infer(op, types, attrs=None, num_outputs=1):
    opdef = get_op(op)
    ctx = InferContext(
        op=op,
        node_name="n",
        attrs=opdef.attrs(**(attrs or {})),
        input_types=list(types),
        input_values=[None] * len(types),
        num_outputs=num_outputs,
    )
    return opdef.infer(ctx)


def T(*shape, dt=DType.float32):
    return TensorType(dt, tuple(shape))


@pytest.mark.parametrize("reduction, want", [("none", ("n", 7, None)), ("sum", ()), ("mean", ())])
def test_loss_infer(reduction, want):
    types = [T("n", 5, 7, None), T("n", 7, None, dt=DType.int64), T(5)]
    outs = _infer("SoftmaxCrossEntropyLoss", types, {"reduction": reduction}, num_outputs=2)
    assert outs == [T(*want), T("n", 5, 7, None)]


@pytest.mark.parametrize(
    "types, attrs, message",
    [
        ([T(3), T(3, dt=DType.int64)], {}, "must be"),
        ([T(3, 4), T(3, 4, dt=DType.int64)], {}, "rank 1"),
        ([T(3, 4, 5), T(3, 6, dt=DType.int64)], {}, "does not match"),
        ([T(3, 4), T(3, dt=DType.int64), T(5)], {}, "one entry per class"),
        ([T(3, 4), T(3, dt=DType.float32)], {}, "int32 or int64"),
        ([T(3, 4), T(3, dt=DType.int64)], {"reduction": "max"}, "reduction"),
    ],
)
def test_loss_infer_errors(types, attrs, message):
    with pytest.raises(ShapeError, match=message):
        _infer("NegativeLogLikelihoodLoss", types, attrs)
