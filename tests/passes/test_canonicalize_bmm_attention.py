"""Attention over 3-D (batch * heads, q, k) scores (passes/canonicalize_bmm_attention.py, then
passes/fuse_attention.py): hand-built with onnx.helper in the forms DeBERTa-v2 and BLOOM export
(transformers 5.24, torch 2.13, both exporters): torch.bmm / baddbmm scores viewed as (B, H, q, k)
for the mask and the Softmax, and back to 3-D for the bmm with V.

Each fuses into one Attention node and computes what ONNX Runtime computes on the decomposed
graph, on right and left padding and on rows whose every key is masked (a padding query of
DeBERTa's query-and-key mask, a left-padded query under BLOOM's causal mask, a wholly padded batch
entry): those rows are the mean of V (finfo.min fills), which the fused node's masked_rows "mean"
gives. A bias that may hold -inf by design (a float input) beside the finite fill is not fused."""

from __future__ import annotations

import math

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import graphc
from graphc.ir.graph import Graph
from graphc.ir.types import DType
from graphc.passes import OptimizeOptions, optimize, pipeline
from graphc.passes.canonicalize_bmm_attention import bmm_attention_to_4d
from graphc.passes.fuse_attention import _cast_bound
from graphc.passes.transpose import eliminate_transposes
from tests.helpers import OnnxNet

RNG = np.random.default_rng(11)
B, S, H, D = 3, 7, 4, 8
HID = H * D
R = 2 * S  # DeBERTa's relative positions (2 * position buckets)
FMIN = float(np.finfo(np.float32).min)


class _Net(OnnxNet):
    prefix = "layer/attn"

    def model(self, out: str) -> onnx.ModelProto:
        return self.make([helper.make_tensor_value_info(out, TensorProto.FLOAT, [B, S, HID])])


def _heads3(net: _Net, x: str) -> str:
    """x @ W viewed (B, S, H, D), heads first, then merged with the batch: (B * H, S, D)."""
    w = net.c(RNG.normal(0, HID**-0.5, (HID, HID)))
    y = net.op("Transpose", net.op("Reshape", net.op("MatMul", x, w), net.i64([B, S, H, D])), perm=[0, 2, 1, 3])
    return net.op("Reshape", y, net.i64([B * H, S, D]))


def _attend(net: _Net, s4: str, v3: str) -> onnx.ModelProto:
    """Softmax of the (B, H, S, S) scores, back to 3-D, @ V, and the heads merged as the models do."""
    p3 = net.op("Reshape", net.op("Softmax", s4, axis=-1), net.i64([B * H, S, S]))
    o4 = net.op("Reshape", net.op("MatMul", p3, v3), net.i64([B, H, S, D]))
    return net.model(net.op("Reshape", net.op("Transpose", o4, perm=[0, 2, 1, 3]), net.i64([B, S, HID])))


def deberta(bias: str = "c2p_p2c") -> onnx.ModelProto:
    """DeBERTa-v2's disentangled attention: q @ (k / sqrt)^T plus the c2p and p2c terms (queries
    and keys against projected relative embeddings, gathered by relative position), viewed 4-D,
    masked_fill(~(mask_q & mask_k), finfo.min). bias="input": a float input instead of c2p + p2c."""
    net = _Net()
    x = net.input("x", TensorProto.FLOAT, [B, S, HID])
    am = net.input("attention_mask", TensorProto.INT64, [B, S])
    q3, k3, v3 = _heads3(net, x), _heads3(net, x), _heads3(net, x)
    sqrt = net.c(math.sqrt(D * 3))  # DeBERTa's scale factor 1 + len(["c2p", "p2c"])
    qk = net.op("MatMul", q3, net.op("Transpose", net.op("Div", k3, sqrt), perm=[0, 2, 1]))
    if bias == "c2p_p2c":
        pos = np.clip(np.arange(S)[:, None] - np.arange(S)[None, :] + S, 0, R - 1)
        idx = net.i64(np.broadcast_to(pos, (B * H, S, S)))
        pos_key = net.c(RNG.normal(0, 1, (B * H, D, R)))  # the projected relative embeddings, as K^T
        pos_query = net.c(RNG.normal(0, 1, (B * H, D, R)))
        c2p = net.op("Div", net.op("GatherElements", net.op("MatMul", q3, pos_key), idx, axis=-1), sqrt)
        p2c = net.op("GatherElements", net.op("MatMul", k3, pos_query), idx, axis=-1)
        p2c = net.op("Div", net.op("Transpose", p2c, perm=[0, 2, 1]), sqrt)
        rel = net.op("Add", c2p, p2c)
    else:
        rel = net.input("bias", TensorProto.FLOAT, [B * H, S, S])
    s4 = net.op("Reshape", net.op("Add", qk, rel), net.i64([-1, H, S, S]))
    kq = net.op("Mul", net.op("Reshape", am, net.i64([B, 1, 1, S])), net.op("Reshape", am, net.i64([B, 1, S, 1])))
    masked = net.op("Not", net.op("Cast", kq, to=TensorProto.BOOL))
    return _attend(net, net.op("Where", masked, net.c(FMIN), s4), v3)


def bloom(alibi: str = "cumsum") -> onnx.ModelProto:
    """BLOOM's attention: baddbmm(alibi, q, k^T, beta=1, alpha=1/sqrt(D)) viewed 4-D, plus
    Where(causal & padding, 0, finfo.min). ALiBi is slopes * ((cumsum(mask) - 1) * mask), made at
    run time from the int64 mask. alibi="input": a float input of the same shape instead."""
    net = _Net()
    x = net.input("x", TensorProto.FLOAT, [B, S, HID])
    am = net.input("attention_mask", TensorProto.INT64, [B, S])
    q3, k3, v3 = _heads3(net, x), _heads3(net, x), _heads3(net, x)
    if alibi == "cumsum":
        positions = net.op("Mul", net.op("Sub", net.op("CumSum", am, net.i64(-1)), net.i64(1)), am)
        positions = net.op("Cast", net.op("Unsqueeze", positions, net.i64([1])), to=TensorProto.FLOAT)
        slopes = net.c(2.0 ** (-8.0 * np.arange(1, H + 1) / H)[:, None])
        bias = net.op("Reshape", net.op("Mul", slopes, positions), net.i64([B * H, 1, S]))
    else:
        bias = net.input("alibi", TensorProto.FLOAT, [B * H, 1, S])
    qk = net.op("MatMul", q3, net.op("Transpose", k3, perm=[0, 2, 1]))
    scores = net.op("Add", net.op("Mul", qk, net.c(1 / math.sqrt(D))), bias)
    s4 = net.op("Reshape", scores, net.i64([B, H, S, S]))
    causal = net.c(np.tril(np.ones((S, S), bool))[None, None], np.bool_)
    pad = net.op("Reshape", net.op("Cast", am, to=TensorProto.BOOL), net.i64([B, 1, 1, S]))
    mask = net.op("Where", net.op("And", causal, pad), net.c(0.0), net.c(FMIN))
    return _attend(net, net.op("Add", s4, mask), v3)


def _feeds(**extra) -> dict[str, np.ndarray]:
    am = np.ones((B, S), np.int64)
    am[0, 5:] = 0  # right padding: padding queries keep no key under DeBERTa's mask
    am[1, :3] = 0  # left padding: BLOOM's queries 0-2 see only padding under the causal mask
    am[2] = 0  # a wholly padded batch entry
    return {"x": RNG.normal(0, 1, (B, S, HID)).astype(np.float32), "attention_mask": am, **extra}


def _ort(model: onnx.ModelProto, feeds) -> np.ndarray:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)[0]


def _optimized(model: onnx.ModelProto, *, elementwise: bool = False) -> Graph:
    """The optimized graph; without `elementwise`, before epilogue and elementwise fusion (which
    would take the mask arithmetic the tests look at into Fused nodes)."""
    stages = [s for s in pipeline.stages() if elementwise or s.name not in ("fuse_epilogues", "fuse_elementwise")]
    return optimize(graphc.load_onnx(model), OptimizeOptions(opt_level=2, verify=True), stages=stages).graph


def _close(got: np.ndarray, want: np.ndarray) -> None:
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * float(np.abs(want).max()))


MODELS = {"deberta": deberta, "bloom": bloom}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_fused_and_exact(name):
    model = MODELS[name]()
    onnx.checker.check_model(model, full_check=True)
    feeds = _feeds()
    want = _ort(model, feeds)
    assert np.isfinite(want).all()
    g = _optimized(model)
    ops = g.op_counts()
    assert ops.get("Attention") == 1 and "Softmax" not in ops, (ops, g.meta.get("near_misses"))
    att = next(n for n in g.nodes if n.op == "Attention")
    # the bias joins the padding mask as one float mask, Where(keep, bias, -inf): kept keys get
    # score + bias, a wholly masked row the mean of V, as the finfo.min fill gives
    assert att.attrs.masked_rows == "mean" and att.inputs[3].ttype.dtype == DType.float32
    assert att.attrs.is_causal == (1 if name == "bloom" else 0)
    assert att.inputs[0].ttype.shape == (B, S, HID) and att.attrs.q_num_heads == H  # the 3-D form, no transposes
    _close(next(iter(graphc.interpret(g, feeds).values())), want)
    cpu = graphc.compile(model, target="cpu")
    _close(next(iter(cpu.run(feeds).values())), want)
    # the feeds make such rows: batch entry 2 keeps no key, and its rows are the mean of V, not 0
    assert np.abs(want[2]).max() > 1e-3
    np.testing.assert_allclose(want[2], np.broadcast_to(want[2, :1], want[2].shape), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("transposes_first", [False, True])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_rewrite_alone_is_4d_and_exact(name, transposes_first):
    # The canonicalization on its own: the scores chain and P @ V in 4-D (no Reshape between the
    # QK matmul and the Softmax), the same numbers, and a second run finds nothing to do. K^T as
    # the exports' 3-D Transpose(0, 2, 1), or (after transpose elimination) graphc.MatMul's trans_b.
    model = MODELS[name]()
    g0 = graphc.load_onnx(model)
    if transposes_first:
        g0 = eliminate_transposes(g0)
        assert any(n.domain and n.op == "MatMul" and n.attrs.trans_b for n in g0.nodes)
    g = bmm_attention_to_4d(g0)
    assert g is not g0
    assert bmm_attention_to_4d(g) is g
    # Q @ K^T and P @ V are 4-D (the projections and DeBERTa's c2p / p2c matmuls stay as they were)
    shapes = {n.outputs[0].ttype.shape for n in g.nodes if n.op == "MatMul"}
    assert (B, H, S, S) in shapes and (B, H, S, D) in shapes
    assert not shapes & {(B * H, S, S), (B * H, S, D)}

    def reaches_qk(graph: Graph, v) -> bool:  # through 4-D elementwise ops only (no Reshape)
        n = graph.producer(v.name)
        if n is None or n.op not in ("MatMul", "Add", "Mul", "Div", "Where"):
            return False
        if n.op == "MatMul":
            return True
        return any(reaches_qk(graph, i) for i in n.inputs if i.ttype.shape == (B, H, S, S))

    for graph, want in ((g0, False), (g, True)):
        softmax = next(n for n in graph.nodes if n.op == "Softmax")
        assert reaches_qk(graph, softmax.inputs[0]) is want
    feeds = _feeds()
    _close(next(iter(graphc.interpret(g, feeds).values())), _ort(model, feeds))


def test_deberta_bias_fed_as_input_is_not_fused():
    # Where(~keep, finfo.min, scores + bias) with a float input as the bias: it may hold -inf (a
    # mask), and a row whose kept keys are all -inf is, in the decomposed graph, uniform over its
    # masked keys; Where(keep, bias, -inf) would make it the mean of V over every key. Not fused
    # (the rewrite to 4-D still happens: it is exact on any input).
    model = deberta(bias="input")
    bias = RNG.normal(0, 1, (B * H, S, S)).astype(np.float32)
    bias[0:H, :, :5] = -np.inf  # batch entry 0 keeps keys 0-4: every kept key of its rows is -inf
    feeds = _feeds(bias=bias)
    res = optimize(graphc.load_onnx(model), OptimizeOptions(opt_level=2, verify=True))
    assert "Attention" not in res.graph.op_counts()
    assert any("finite-fill mask combined" in m for m in res.graph.meta.get("near_misses", []))
    want = _ort(model, feeds)
    assert np.isfinite(want).all()
    _close(next(iter(graphc.interpret(res.graph, feeds).values())), want)


def test_bloom_alibi_fed_as_input_is_not_fused():
    # ALiBi as a float input beside the added finfo.min padding mask: unbounded, so a wholly masked
    # row is fill + score + bias, which need not be uniform (-inf in it drops keys from the average)
    model = bloom(alibi="input")
    alibi = RNG.normal(0, 1, (B * H, 1, S)).astype(np.float32)
    alibi[2 * H :, :, :2] = -np.inf
    feeds = _feeds(alibi=alibi)
    res = optimize(graphc.load_onnx(model), OptimizeOptions(opt_level=2, verify=True))
    assert "Attention" not in res.graph.op_counts()
    assert any("finite-fill mask combined" in m for m in res.graph.meta.get("near_misses", []))
    want = _ort(model, feeds)
    _close(next(iter(graphc.interpret(res.graph, feeds).values())), want)
    # batch entry 2 (wholly padded) averages V over keys 2..6 only: not the mean over all keys
    assert not np.allclose(want[2], _ort(model, {**feeds, "alibi": np.zeros_like(alibi)})[2], atol=1e-3)


def test_scores_read_elsewhere_stay_3d():
    # The 3-D scores also leave the graph: rewriting their chain would compute it twice, so the
    # pass leaves the block as it is (and attention fusion, which reads 4-D scores, with it).
    model = bloom()
    g0 = graphc.load_onnx(model)
    scores = next(n for n in g0.nodes if n.op == "Reshape" and n.outputs[0].ttype.shape == (B, H, S, S)).inputs[0]
    model.graph.output.append(helper.make_tensor_value_info(scores.name, TensorProto.FLOAT, [B * H, S, S]))
    g0 = graphc.load_onnx(model)
    assert bmm_attention_to_4d(g0) is g0


def test_cast_bounds():
    # A cast integer is bounded by its type (int64: 2**63 < BOUNDED_BIAS), unless the float type
    # cannot hold that range (int32 or wider in float16: the cast itself may give inf).
    assert _cast_bound(DType.int64, DType.float32) == 2.0**63
    assert _cast_bound(DType.bool, DType.float16) == 1.0
    assert _cast_bound(DType.int16, DType.float16) == 32768.0
    assert _cast_bound(DType.int32, DType.float16) is None
    assert _cast_bound(DType.int64, DType.bfloat16) == 2.0**63
    assert _cast_bound(DType.float16, DType.float32) is None
