"""Attention as torch's exporters write scaled_dot_product_attention, hand-built with onnx.helper
(the local torch may write it differently): the torch-2.11 spelling fuses into one Attention node
and computes what ONNX Runtime computes, fully masked rows included. Also the canonicalization
rules it relies on (passes/canonicalize.py), checked against numpy."""

from __future__ import annotations

import math

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import graphc
from graphc.passes import OptimizeOptions, optimize
from graphc.passes.canonicalize import _sandwich_perm
from tests.helpers import OnnxNet

RNG = np.random.default_rng(11)
B, S, H, D = 2, 5, 4, 8
HID = H * D


class _Net(OnnxNet):
    prefix = "sdpa"

    def model(self, output: str) -> onnx.ModelProto:
        outs = [helper.make_tensor_value_info(output, TensorProto.FLOAT, [B, S, HID])]
        return self.make(outs, opset=17, ir_version=8)


def _proj(net: _Net, x: str, heads: int) -> str:
    """x @ W -> (B, S, heads, D) -> (B, heads, S, D)."""
    w = net.c(RNG.normal(0, HID**-0.5, (HID, heads * D)))
    y = net.op("Reshape", net.op("MatMul", x, w), net.c([B, S, heads, D], np.int64))
    return net.op("Transpose", y, perm=[0, 2, 1, 3])


def _torch211_scale(net: _Net, q: str) -> str:
    """torch.onnx's _attention_scale, then the Sqrt both Q and K are multiplied by."""
    last = net.op("Slice", net.op("Shape", q), net.c([-1], np.int64), net.c([2**63 - 1], np.int64))
    size = net.op("Cast", last, to=TensorProto.FLOAT)
    scale = net.op("Cast", net.op("Div", net.c([1.0]), net.op("Sqrt", size)), to=TensorProto.FLOAT)
    return net.op("Sqrt", scale)


def _sdpa_model(*, kt: str = "transpose", kv_heads: int = H, mask: str = "bool") -> onnx.ModelProto:
    """torch 2.11's scaled_dot_product_attention: sqrt(scale) on Q and on K^T separately, a bool
    mask through Where(mask, 0, -inf) + Add, Softmax, the IsNaN -> Where guard, P @ V.
    kt: "transpose" (TorchScript: Transpose(0,1,3,2)) or "dynamo" (torchlib: Reshape to 3-D,
    Transpose(0,2,1), Reshape back). kv_heads < H: K and V through transformers' repeat_kv."""
    net = _Net()
    x = net.input("x", TensorProto.FLOAT, [B, S, HID])
    q, k, v = _proj(net, x, H), _proj(net, x, kv_heads), _proj(net, x, kv_heads)
    if kv_heads != H:
        rep = H // kv_heads
        for name in ("k", "v"):
            t = k if name == "k" else v
            t = net.op("Unsqueeze", t, net.c([2], np.int64))
            t = net.op("Expand", t, net.c([B, kv_heads, rep, S, D], np.int64))
            t = net.op("Reshape", t, net.c([B, H, S, D], np.int64))
            k, v = (t, v) if name == "k" else (k, t)
    sq = _torch211_scale(net, q)
    if kt == "transpose":
        kt_v = net.op("Transpose", k, perm=[0, 1, 3, 2])
    else:
        k3 = net.op("Reshape", k, net.c([-1, S, D], np.int64))
        kt_v = net.op("Reshape", net.op("Transpose", k3, perm=[0, 2, 1]), net.c([B, H, D, S], np.int64))
    scores = net.op("MatMul", net.op("Mul", q, sq), net.op("Mul", kt_v, sq))
    zero, ninf = net.c([0.0]), net.c([-np.inf])
    if mask == "bool":
        keep = net.input("keep", TensorProto.BOOL, [B, 1, 1, S])
        scores = net.op("Add", scores, net.op("Where", keep, zero, ninf))
    else:  # is_causal: torch.onnx's _causal_attention_mask, a float 0 / -inf mask from Trilu
        ones = net.op("Expand", net.c([1.0]), net.c([S, S], np.int64))
        tril = net.op("Trilu", ones, upper=0)
        scores = net.op("Add", scores, net.op("Where", net.op("Equal", tril, zero), ninf, zero))
    p = net.op("Softmax", scores, axis=-1)
    if mask == "bool":
        p = net.op("Where", net.op("IsNaN", p), zero, p)
    o = net.op("MatMul", p, v)
    o = net.op("Reshape", net.op("Transpose", o, perm=[0, 2, 1, 3]), net.c([B, S, HID], np.int64))
    return net.model(o)


def _feeds(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    feeds = {"x": RNG.normal(0, 1, (B, S, HID)).astype(np.float32)}
    if any(i.name == "keep" for i in model.graph.input):
        keep = np.ones((B, 1, 1, S), bool)
        keep[0, ..., -2:] = False
        keep[1] = False  # batch 1 attends nothing: Softmax gives NaN rows, the guard zeroes them
        feeds["keep"] = keep
    return feeds


@pytest.mark.parametrize("kt", ["transpose", "dynamo"])
@pytest.mark.parametrize("kv_heads", [H, 2, 1])
@pytest.mark.parametrize("mask", ["bool", "causal"])
def test_torch211_sdpa_fuses(kt, kv_heads, mask):
    model = _sdpa_model(kt=kt, kv_heads=kv_heads, mask=mask)
    onnx.checker.check_model(model, full_check=True)
    g1 = optimize(graphc.load_onnx(model), OptimizeOptions(opt_level=2, verify=True)).graph
    counts = g1.op_counts()
    assert counts.get("Attention") == 1, (counts, g1.meta.get("near_misses"))
    for gone in ("Softmax", "IsNaN", "Expand", "Transpose", "Sqrt"):
        assert gone not in counts, counts
    att = next(n for n in g1.nodes if n.op == "Attention")
    assert math.isclose(att.attrs.scale, 1 / math.sqrt(D), rel_tol=1e-6)
    assert (att.attrs.q_num_heads, att.attrs.kv_num_heads) == (H, kv_heads)
    assert att.attrs.is_causal == (1 if mask == "causal" else 0)
    feeds = _feeds(model)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    got = next(iter(graphc.interpret(g1, feeds).values()))
    assert not np.isnan(want).any()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    if mask == "bool":
        assert np.all(got[1] == 0)  # the fully masked batch: zeros, as the guard wrote them


def test_nan_guard_kept_when_attention_does_not_fuse():
    # The same guard after a Softmax that is no attention (its input is no Q @ K^T) stays.
    net = _Net()
    x = net.input("x", TensorProto.FLOAT, [B, H, S, S])
    p = net.op("Softmax", x, axis=-1)
    out = net.op("Where", net.op("IsNaN", p), net.c([0.0]), p)
    g1 = optimize(graphc.load_onnx(net.model(out)), OptimizeOptions(opt_level=2)).graph
    counts = g1.op_counts()
    assert "Attention" not in counts
    feeds = {"x": np.full((B, H, S, S), -np.inf, np.float32)}
    assert np.all(next(iter(graphc.interpret(g1, feeds).values())) == 0)


# ---- RESHAPE_SANDWICH against numpy --------------------------------------------------------------


def _sandwich(x: np.ndarray, ys, p, zs) -> np.ndarray:
    return np.transpose(x.reshape(ys), p).reshape(zs)


CASES = [
    ((2, 4, 8, 6), (8, 8, 6), (0, 2, 1), (2, 4, 6, 8), True),  # dynamo's K^T
    ((1, 4, 8, 6), (4, 8, 6), (0, 2, 1), (1, 4, 6, 8), True),  # batch 1
    ((2, 2, 2, 8, 6), (8, 8, 6), (0, 2, 1), (2, 4, 6, 8), True),  # repeat_kv's reshape merged in
    ((2, 8, 12), (2, 8, 3, 4), (0, 2, 1, 3), (2, 3, 8, 4), True),  # a head split, then a merge
    ((6, 4), (6, 4), (1, 0), (1, 4, 6), True),  # a plain transpose with a size-1 axis added
    ((4, 6), (2, 12), (1, 0), (12, 2), True),  # blocks that cut x's axes: still one transpose
    ((2, 3, 4), (6, 4), (1, 0), (4, 3, 2), False),  # z splits a block: no transpose of x
    ((2, 3, 4), (2, 3, 4), (2, 0, 1), (4, 6), True),  # a last axis moved to the front of a (6, 4) view
    ((2, 3, 4), (2, 3, 4), (1, 0, 2), (3, 8), False),  # z merges blocks not adjacent in x
]


@pytest.mark.parametrize(("xs", "ys", "p", "zs", "one_transpose"), CASES)
def test_sandwich_perm_is_exact(xs, ys, p, zs, one_transpose):
    x = np.arange(int(np.prod(xs))).reshape(xs)
    want = _sandwich(x, ys, p, zs)
    found = _sandwich_perm(xs, ys, p, zs)
    assert (found is not None) == one_transpose
    if found is not None:
        w, q = found
        np.testing.assert_array_equal(np.transpose(x.reshape(w), q).reshape(zs), want)
