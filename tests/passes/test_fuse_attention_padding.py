"""Attention fusion on rows whose every key is masked (padding queries: a sliding window that
holds only padding, left padding under a causal mask, a wholly padded batch entry): the fused
graph computes what the decomposed graph and ONNX Runtime compute, for each mask spelling the
exporters write (hand-built with onnx.helper in transformers' eager forms and torch's SDPA form).

A finite fill (finfo.min, through Where or added) makes such a row uniform: the mean of V over
all keys. A -inf fill makes it NaN, which torch's NaN guard turns into 0."""

from __future__ import annotations

import math

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import graphc
from graphc.ir.graph import Graph
from graphc.passes import OptimizeOptions, optimize, pipeline
from tests.helpers import OnnxNet

RNG = np.random.default_rng(5)
B, S, H, D = 3, 7, 4, 8
HID = H * D
WINDOW = 2  # a key j is in query i's window when i - WINDOW < j <= i (Mistral's sliding window)
FMIN = float(np.finfo(np.float32).min)


class _Net(OnnxNet):
    prefix = "layer/attn"


def _heads(net: _Net, x: str, heads: int) -> str:
    """x @ W -> (B, S, heads, D) -> (B, heads, S, D)."""
    w = net.c(RNG.normal(0, HID**-0.5, (HID, heads * D)))
    y = net.op("Reshape", net.op("MatMul", x, w), net.c([0, 0, heads, D], np.int64))
    return net.op("Transpose", y, perm=[0, 2, 1, 3])


def _keep(net: _Net, pattern: str) -> str:
    """transformers' boolean keep mask from the int64 attention_mask input: a constant pattern
    (all True, causal, causal sliding window) And the padding of the keys, (B, 1, S, S)."""
    i, j = np.arange(S)[:, None], np.arange(S)[None, :]
    const = {"full": np.ones((S, S), bool), "causal": j <= i, "window": (j <= i) & (i - j < WINDOW)}[pattern]
    am = net.input("attention_mask", TensorProto.INT64, [B, S])
    pad = net.op("Unsqueeze", net.op("Cast", am, to=TensorProto.BOOL), net.c([1, 2], np.int64))
    return net.op("And", net.c(const[None, None], np.bool_), pad)


def _model(spelling: str, *, kv_heads: int = H, softcap: float | None = None, out: str = "merge") -> onnx.ModelProto:
    net = _Net()
    x = net.input("x", TensorProto.FLOAT, [B, S, HID])
    q, k, v = _heads(net, x, H), _heads(net, x, kv_heads), _heads(net, x, kv_heads)
    if kv_heads != H:  # transformers' repeat_kv
        rep = H // kv_heads
        copies = net.c([B, kv_heads, rep, S, D], np.int64)
        merged = net.c([B, H, S, D], np.int64)
        k, v = (
            net.op("Reshape", net.op("Expand", net.op("Unsqueeze", t, net.c([2], np.int64)), copies), merged)
            for t in (k, v)
        )
    s = net.op("Mul", net.op("MatMul", q, net.op("Transpose", k, perm=[0, 1, 3, 2])), net.c(1 / math.sqrt(D)))
    if softcap:  # Gemma-2's logit softcapping, before the mask
        s = net.op("Mul", net.op("Tanh", net.op("Div", s, net.c(softcap))), net.c(softcap))
    guard = False
    form, _, pattern = spelling.partition(":")
    if form == "eager":  # Where(keep, 0, finfo.min), sliced to the key length, added
        m = net.op("Where", _keep(net, pattern), net.c(0.0), net.c(FMIN))
        m = net.op("Slice", m, net.c([0], np.int64), net.c([S], np.int64), net.c([3], np.int64))
        s = net.op("Add", s, m)
    elif form == "where_min":  # the scores replaced by finfo.min where not kept
        s = net.op("Where", _keep(net, pattern), s, net.c(FMIN))
    elif form == "where_min_inverted":  # masked_fill(~keep, finfo.min)
        s = net.op("Where", net.op("Not", _keep(net, pattern)), net.c(FMIN), s)
    elif form in ("sdpa", "ninf"):  # torch's SDPA: Where(keep, 0, -inf) added (+ the NaN guard)
        s = net.op("Add", s, net.op("Where", _keep(net, pattern), net.c(0.0), net.c(-np.inf)))
        guard = form == "sdpa"
    elif form in ("legacy", "legacy_1e4"):
        # transformers' GPT-2 before SDPA: Where(causal, scores, finfo.min) (masked_bias -1e4 in
        # older releases), then the padding mask (1 - attention_mask) * the same fill added
        fill = FMIN if form == "legacy" else -1e4
        i, j = np.arange(S)[:, None], np.arange(S)[None, :]
        s = net.op("Where", net.c((j <= i)[None, None], np.bool_), s, net.c(fill))
        am = net.input("attention_mask", TensorProto.INT64, [B, S])
        amf = net.op("Unsqueeze", net.op("Cast", am, to=TensorProto.FLOAT), net.c([1, 2], np.int64))
        s = net.op("Add", s, net.op("Mul", net.op("Sub", net.c(1.0), amf), net.c(fill)))
    elif form == "bias":  # a constant relative-position bias (MPNet, T5), then the eager mask
        s = net.op("Add", s, net.c(RNG.normal(0, 2, (1, H, S, S))))
        s = net.op("Add", s, net.op("Where", _keep(net, pattern), net.c(0.0), net.c(FMIN)))
    elif form == "additive_1e4":  # a fill that does not absorb the scores
        s = net.op("Add", s, net.op("Where", _keep(net, pattern), net.c(0.0), net.c(-1e4)))
    else:
        raise AssertionError(spelling)
    p = net.op("Softmax", s, axis=-1)
    if guard:
        p = net.op("Where", net.op("IsNaN", p), net.c(0.0), p)
    o = net.op("MatMul", p, v)
    if out == "merge":
        o = net.op("Reshape", net.op("Transpose", o, perm=[0, 2, 1, 3]), net.c([0, 0, HID], np.int64))
        shape = [B, S, HID]
    else:  # the (B, H, S, D) result read directly
        o = net.op("Relu", o)
        shape = [B, H, S, D]
    outs = [helper.make_tensor_value_info(o, TensorProto.FLOAT, shape)]
    m = helper.make_model(
        helper.make_graph(net.nodes, "t", net.inputs, outs, net.inits), opset_imports=[helper.make_opsetid("", 18)]
    )
    m.ir_version = 9
    return m


def _feeds() -> dict[str, np.ndarray]:
    am = np.ones((B, S), np.int64)
    am[0, 4:] = 0  # right padding: queries 6 (window 5-6) see only padding keys
    am[1, :3] = 0  # left padding: queries 0-2 see only padding under a causal mask
    am[2] = 0  # a wholly padded batch entry
    return {"x": RNG.normal(0, 1, (B, S, HID)).astype(np.float32), "attention_mask": am}


def _fused(model: onnx.ModelProto, *, elementwise: bool = True) -> Graph:
    """The optimized graph; without `elementwise`, before epilogue and elementwise fusion (which
    would fold the nodes a test counts into Fused nodes)."""
    stages = [s for s in pipeline.stages() if elementwise or s.name not in ("fuse_epilogues", "fuse_elementwise")]
    g = optimize(graphc.load_onnx(model), OptimizeOptions(opt_level=2, verify=True), stages=stages).graph
    assert g.op_counts().get("Attention") == 1, (g.op_counts(), g.meta.get("near_misses"))
    return g


def _ort(model: onnx.ModelProto, feeds) -> np.ndarray:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)[0]


SPELLINGS = [
    "eager:full",
    "eager:causal",
    "eager:window",
    "where_min:causal",
    "where_min:window",
    "where_min_inverted:window",
    "sdpa:window",
    "additive_1e4:window",
    "legacy:causal",
    "bias:window",
]


@pytest.mark.parametrize("spelling", SPELLINGS)
@pytest.mark.parametrize(("kv_heads", "softcap", "out"), [(H, None, "merge"), (2, None, "merge"), (H, 30.0, "relu4d")])
def test_wholly_masked_rows_match_onnxruntime(spelling, kv_heads, softcap, out):
    model = _model(spelling, kv_heads=kv_heads, softcap=softcap, out=out)
    onnx.checker.check_model(model, full_check=True)
    feeds = _feeds()
    want = _ort(model, feeds)
    assert not np.isnan(want).any()
    g = _fused(model)
    # -1e4 added to a logit rounds it to float32's spacing there (~1e-3): its wholly masked rows
    # (a softmax of the scores) agree to that, whichever order the scale and the mask came in.
    tol = 2e-3 if spelling.startswith("additive_1e4") else 1e-5
    got = next(iter(graphc.interpret(g, feeds).values()))
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    cpu = graphc.compile(model, target="cpu")
    np.testing.assert_allclose(next(iter(cpu.run(feeds).values())), want, rtol=tol, atol=tol)
    # The feeds do make such rows: batch entry 2 keeps no key. Finite fills make them the
    # mean of V (not 0), -inf under the NaN guard makes them 0.
    if spelling.startswith("sdpa"):
        assert np.all(want[2] == 0)
    elif not spelling.startswith("additive"):
        assert np.abs(want[2]).max() > 1e-3


@pytest.mark.parametrize("spelling", ["eager:causal", "eager:window", "where_min:window", "sdpa:window"])
def test_fast_paths_stay(spelling):
    # The boolean mask (and is_causal for a causal pattern) stays on Attention; the rows a
    # finite fill makes uniform are Attention's own (masked_rows="mean"): no node follows it.
    g = _fused(_model(spelling), elementwise=False)
    att = next(n for n in g.nodes if n.op == "Attention")
    assert att.inputs[3].ttype.dtype.name == "bool"
    assert att.attrs.is_causal == (1 if spelling.endswith("causal") else 0)
    assert att.attrs.masked_rows == ("zero" if spelling.startswith("sdpa") else "mean")
    assert all(n.op != "Where" for n in g.users(att.outputs[0].name))


def test_additive_fill_that_does_not_absorb_stays_a_float_mask():
    g = _fused(_model("additive_1e4:window"), elementwise=False)
    att = next(n for n in g.nodes if n.op == "Attention")
    assert att.inputs[3].ttype.dtype.name == "float32"
    # a float mask computed at run time may hold -inf: a row it makes all -inf is NaN, as in the
    # decomposed graph (this one's fill is finite, so no row is)
    assert att.attrs.masked_rows == "nan"


def test_ninf_without_guard_gives_nan_as_onnxruntime_does():
    # A -inf fill with no NaN guard leaves NaN rows in the decomposed graph (a softmax of -inf):
    # the fused node says so (masked_rows "nan"), so the interpreter and the CPU engine give NaN
    # there too, and every other row agrees.
    model = _model("ninf:window")
    feeds = _feeds()
    want = _ort(model, feeds)
    g = _fused(model)
    assert next(n for n in g.nodes if n.op == "Attention").attrs.masked_rows == "nan"
    got = next(iter(graphc.interpret(g, feeds).values()))
    dead = np.isnan(want)
    assert dead[2].all() and dead.any(axis=-1).sum() < dead.shape[0] * dead.shape[1]
    np.testing.assert_array_equal(np.isnan(got), dead)
    np.testing.assert_allclose(got[~dead], want[~dead], rtol=1e-5, atol=1e-5)
    cpu = next(iter(graphc.compile(model, target="cpu").run(feeds).values()))
    np.testing.assert_array_equal(np.isnan(cpu), dead)
    np.testing.assert_allclose(cpu[~dead], want[~dead], rtol=1e-5, atol=1e-5)


def test_legacy_gpt2_masks_are_one_float_mask():
    # Where(causal, scores, finfo.min) + (1 - mask) * finfo.min: on a left-padded query row the
    # causal fill ties with the padding fill, so the row averages V over every key the two do not
    # both mask. is_causal plus the padding mask would average over the causal keys only: the
    # causal term joins the float mask instead.
    model = _model("legacy:causal", out="relu4d")
    g = _fused(model, elementwise=False)
    att = next(n for n in g.nodes if n.op == "Attention")
    assert att.attrs.is_causal == 0 and att.inputs[3].ttype.dtype.name == "float32"
    feeds = _feeds()
    want = _ort(model, feeds)
    got = next(iter(graphc.interpret(g, feeds).values()))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # (batch entry 1's left-padded queries 0-2 average V over keys 0..i and 3..6 there, where
    # is_causal with the padding mask would average over 0..i alone)


def _hand_model(masks) -> onnx.ModelProto:
    """Q.K^T, then `masks(net, scores) -> scores`, Softmax and P @ V, read as (B, H, S, D)."""
    net = _Net()
    x = net.input("x", TensorProto.FLOAT, [B, S, HID])
    q, k, v = _heads(net, x, H), _heads(net, x, H), _heads(net, x, H)
    s = masks(net, net.op("MatMul", q, net.op("Transpose", k, perm=[0, 1, 3, 2])))
    o = net.op("MatMul", net.op("Softmax", s, axis=-1), v)
    outs = [helper.make_tensor_value_info(o, TensorProto.FLOAT, [B, H, S, D])]
    model = helper.make_model(
        helper.make_graph(net.nodes, "t", net.inputs, outs, net.inits), opset_imports=[helper.make_opsetid("", 18)]
    )
    model.ir_version = 9
    return model


def _not_fused_and_exact(model: onnx.ModelProto, feeds, near_miss: str | None = None) -> None:
    """No Attention node (with that near miss reported, if given), and ORT's output all the same."""
    res = optimize(graphc.load_onnx(model), OptimizeOptions(opt_level=2, verify=True))
    assert "Attention" not in res.graph.op_counts()
    if near_miss is not None:
        assert any(near_miss in m for m in res.graph.meta.get("near_misses", []))
    np.testing.assert_allclose(
        next(iter(graphc.interpret(res.graph, feeds).values())), _ort(model, feeds), rtol=1e-5, atol=1e-5
    )


def test_legacy_gpt2_masks_with_a_1e4_fill_are_not_fused():
    # masked_bias -1e4 does not absorb the scores: a left-padded row mixes -1e4 + score with -1e4
    _not_fused_and_exact(_model("legacy_1e4:causal"), _feeds(), "finite fill -10000 combined with a float mask")


def test_an_unbounded_float_mask_beside_a_finite_fill_is_not_fused():
    # a float mask fed at run time may hold -inf, which would drop keys from a wholly masked row's
    # average: only a bias bounded by construction (constants, gathers of them) joins the fill
    def masks(net: _Net, s: str) -> str:
        s = net.op("Add", s, net.input("bias", TensorProto.FLOAT, [B, H, S, S]))
        return net.op("Add", s, net.op("Where", _keep(net, "window"), net.c(0.0), net.c(FMIN)))

    bias = RNG.normal(0, 1, (B, H, S, S)).astype(np.float32)
    bias[2, :, :, :3] = -np.inf  # batch entry 2 is wholly padded: its rows average over keys 3..6
    _not_fused_and_exact(_hand_model(masks), {**_feeds(), "bias": bias})


def test_finite_fill_mixed_with_another_mask_is_not_fused():
    # Where(keep, scores, finfo.min) then + Where(keep2, 0, finfo.min): a row both mask wholly
    # averages V over the keys only one of them masks; Attention's form cannot say that.
    def masks(net: _Net, s: str) -> str:
        keep2 = net.input("keep2", TensorProto.BOOL, [B, 1, S, S])
        s = net.op("Where", _keep(net, "causal"), s, net.c(FMIN))
        return net.op("Add", s, net.op("Where", keep2, net.c(0.0), net.c(FMIN)))

    feeds = {**_feeds(), "keep2": RNG.random((B, 1, S, S)) < 0.5}
    _not_fused_and_exact(_hand_model(masks), feeds, "finite-fill mask combined")


@pytest.mark.parametrize(
    ("spelling", "out"), [("eager:causal", "merge"), ("where_min:window", "merge"), ("where_min:causal", "relu4d")]
)
def test_symbolic_batch(spelling, out):
    # The graph as exported with a symbolic batch (optimized before shapes are bound): the
    # uniform rows are Attention's masked_rows="mean" (or, where the mask is still sliced to the
    # key length, it stays a float mask): either way what ORT computes.
    model = _model(spelling, out=out)
    for vi in [*model.graph.input, *model.graph.output]:
        vi.type.tensor_type.shape.dim[0].dim_param = "batch"
    g = _fused(model)
    feeds = _feeds()
    got = next(iter(graphc.interpret(g, feeds).values()))
    np.testing.assert_allclose(got, _ort(model, feeds), rtol=1e-5, atol=1e-5)
