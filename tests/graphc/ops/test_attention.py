"""Attention and RotaryEmbedding against an independent numpy formula (and ONNX Runtime where its
CPU kernel agrees with the spec)."""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import graphc
from graphc.errors import ShapeError
from graphc.ir.types import DType, TensorType
from graphc.ops.registry import InferContext, get_op
from helpers import (
    ONNX_OPSET,
    assert_close,
    check_against_ort,
    make_node_model,
    np_to_onnx_dtype,
    rand,
    run_graphc,
)

# ---- the independent formula ---------------------------------------------------------------------


def ref_attention(
    q,
    k,
    v,
    mask=None,
    past_k=None,
    past_v=None,
    nonpad=None,
    *,
    scale=None,
    is_causal=0,
    q_num_heads=None,
    kv_num_heads=None,
    softcap=0.0,
    left=-1,
    right=-1,
    mode=0,
):
    """Attention in float64, one (batch, head, query) row at a time, from the spec's prose."""
    out_dtype = q.dtype
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    three_d = q.ndim == 3
    if three_d:

        def split(x, h):
            b, s, d = x.shape
            return x.reshape(b, s, h, d // h).transpose(0, 2, 1, 3)

        q, k, v = split(q, q_num_heads), split(k, kv_num_heads), split(v, kv_num_heads)
    if past_k is not None:
        k = np.concatenate([past_k.astype(np.float64), k], axis=2)
        v = np.concatenate([past_v.astype(np.float64), v], axis=2)
    batch, qh, sq, d = q.shape
    kvh, total = k.shape[1], k.shape[2]
    scale = 1 / math.sqrt(d) if scale is None else scale
    past = 0 if past_k is None else past_k.shape[2]
    if mask is not None:
        full_mask = np.zeros(mask.shape[:-1] + (total,), dtype=np.float64)
        m = np.where(mask, 0.0, -np.inf) if mask.dtype == np.bool_ else mask.astype(np.float64)
        full_mask[...] = -np.inf
        full_mask[..., : mask.shape[-1]] = m
        full_mask = np.broadcast_to(full_mask, (batch, qh, sq, total))
    y = np.zeros((batch, qh, sq, v.shape[3]))
    qk_out = np.zeros((batch, qh, sq, total))
    for b in range(batch):
        offset = past if nonpad is None else int(nonpad[b]) - sq
        for h in range(qh):
            g = h // (qh // kvh)
            for i in range(sq):
                pos = offset + i
                logits = np.array([q[b, h, i] @ k[b, g, j] * scale for j in range(total)])
                raw = logits.copy()
                if softcap > 0:
                    logits = softcap * np.tanh(logits / softcap)
                capped = logits.copy()
                bias = np.zeros(total)
                for j in range(total):
                    if is_causal and j > pos:
                        bias[j] = -np.inf
                    if left >= 0 and pos - j > left:
                        bias[j] = -np.inf
                    if right >= 0 and j - pos > right:
                        bias[j] = -np.inf
                    if nonpad is not None and j >= nonpad[b]:
                        bias[j] = -np.inf
                if mask is not None:
                    bias = bias + full_mask[b, h, i]
                logits = logits + bias
                if np.all(np.isneginf(bias)):
                    p = np.zeros(total)
                else:
                    e = np.exp(logits - logits.max())
                    p = e / e.sum()
                y[b, h, i] = p @ v[b, g]
                qk_out[b, h, i] = (raw, capped, logits, p)[mode]
    if three_d:
        y = y.transpose(0, 2, 1, 3).reshape(batch, sq, -1)
    return y.astype(out_dtype), k.astype(out_dtype), v.astype(out_dtype), qk_out.astype(out_dtype)


ATTN_INPUTS = ["Q", "K", "V", "attn_mask", "past_key", "past_value", "nonpad_kv_seqlen"]


def run_attention(inputs: dict, attrs: dict, outputs=("Y",), opset=None):
    """Run graphc on a one-node Attention model; inputs keyed by the spec's input names."""
    order = [n if n in inputs else "" for n in ATTN_INPUTS]
    while order and not order[-1]:
        order.pop()
    # An empty output name is an omitted optional output: in the node, not among graph outputs.
    node = helper.make_node("Attention", order, list(outputs), **attrs)
    g_in = [helper.make_tensor_value_info(n, np_to_onnx_dtype(x.dtype), x.shape) for n, x in inputs.items()]
    g_out = [helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None) for o in outputs if o]
    graph = helper.make_graph([node], "attention", g_in, g_out)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset or ONNX_OPSET)])
    model.ir_version = min(model.ir_version, 10)
    return run_graphc(onnx.shape_inference.infer_shapes(model), inputs)


def _qkv(shape_q, shape_k, shape_v, dtype=np.float32, seed=0):
    return (
        rand(shape_q, dtype, seed=seed, low=-1, high=1),
        rand(shape_k, dtype, seed=seed + 1, low=-1, high=1),
        rand(shape_v, dtype, seed=seed + 2, low=-1, high=1),
    )


# ---- Attention against ONNX Runtime (cases its CPU kernel implements as the spec says) ---------


@pytest.mark.parametrize(
    "shapes, attrs",
    [
        (((2, 3, 5, 6), (2, 3, 7, 6), (2, 3, 7, 5)), {}),  # cross attention, v_head != head
        (((1, 6, 3, 4), (1, 2, 3, 4), (1, 2, 3, 4)), {}),  # GQA 4-D
        (((2, 5, 12), (2, 5, 4), (2, 5, 6)), {"q_num_heads": 6, "kv_num_heads": 2}),  # GQA 3-D
        (((1, 1, 1, 3), (1, 1, 1, 3), (1, 1, 1, 3)), {}),  # size-1 everything
        (((2, 3, 5, 6), (2, 3, 5, 6), (2, 3, 5, 6)), {"is_causal": 1, "scale": 0.3}),
        (((2, 3, 5, 6), (2, 3, 7, 6), (2, 3, 7, 6)), {"softcap": 1.5}),
    ],
)
def test_attention_matches_ort(shapes, attrs):
    q, k, v = _qkv(*shapes)
    out = check_against_ort("Attention", {"Q": q, "K": k, "V": v}, attrs, outputs=("Y",))
    ref = ref_attention(q, k, v, **_ref_kw(attrs))[0]
    assert_close(out["Y"], ref, rtol=1e-5, atol=1e-6)


def _ref_kw(attrs):
    names = {"left_window_size": "left", "right_window_size": "right", "qk_matmul_output_mode": "mode"}
    return {names.get(k, k): v for k, v in attrs.items() if k != "softmax_precision"}


@pytest.mark.parametrize("mask_shape", [(5, 7), (2, 1, 5, 7), (3, 5, 7), (7,), (1, 7)])
@pytest.mark.parametrize("mask_dtype", [np.bool_, np.float32])
def test_attention_masks_match_ort(mask_shape, mask_dtype):
    q, k, v = _qkv((2, 3, 5, 6), (2, 3, 7, 6), (2, 3, 7, 6))
    if mask_dtype == np.bool_:
        mask = rand(mask_shape, np.bool_, seed=5)
        mask[..., 0] = True  # keep every row attending something (ORT NaNs on empty rows)
    else:
        mask = rand(mask_shape, np.float32, seed=5, low=-3, high=1)
    feeds = {"Q": q, "K": k, "V": v, "attn_mask": mask}
    out = check_against_ort("Attention", feeds, {}, outputs=("Y",))
    assert_close(out["Y"], ref_attention(q, k, v, mask)[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode", [0, 1, 2, 3])
def test_attention_qk_matmul_output_modes(mode):
    q, k, v = _qkv((2, 3, 5, 6), (2, 3, 5, 6), (2, 3, 5, 6))
    mask = rand((5, 5), np.float32, seed=3, low=-1, high=1)
    attrs = {"qk_matmul_output_mode": mode, "softcap": 0.8}
    feeds = {"Q": q, "K": k, "V": v, "attn_mask": mask}
    out = run_attention(feeds, attrs, outputs=("Y", "", "", "qk"))
    y, _, _, qk = ref_attention(q, k, v, mask, softcap=0.8, mode=mode)
    assert_close(out["Y"], y, rtol=1e-5, atol=1e-6)
    assert_close(out["qk"], qk, rtol=1e-5, atol=1e-6)


# ---- KV cache, causal offsets, windows, padding: against the formula ---------------------------


@pytest.mark.parametrize("three_d", [False, True])
@pytest.mark.parametrize("q_heads, kv_heads", [(3, 3), (4, 2), (4, 1)])
def test_attention_causal_with_past(three_d, q_heads, kv_heads):
    b, sq, past, d = 2, 3, 4, 6
    q, k, v = _qkv((b, q_heads, sq, d), (b, kv_heads, sq, d), (b, kv_heads, sq, 5), seed=7)
    pk, pv = rand((b, kv_heads, past, d), seed=20), rand((b, kv_heads, past, 5), seed=21)
    attrs = {"is_causal": 1}
    if three_d:
        q, k, v = (x.transpose(0, 2, 1, 3).reshape(b, sq, -1) for x in (q, k, v))
        attrs.update(q_num_heads=q_heads, kv_num_heads=kv_heads)
    feeds = {"Q": q, "K": k, "V": v, "past_key": pk, "past_value": pv}
    out = run_attention(feeds, attrs, outputs=("Y", "present_key", "present_value"))
    y, pres_k, pres_v, _ = ref_attention(q, k, v, None, pk, pv, **_ref_kw(attrs))
    assert_close(out["Y"], y, rtol=1e-5, atol=1e-6)
    assert_close(out["present_key"], pres_k)
    assert_close(out["present_value"], pres_v)


def test_attention_past_with_mask_and_all_outputs():
    q, k, v = _qkv((1, 2, 3, 4), (1, 2, 3, 4), (1, 2, 3, 4), seed=9)
    pk, pv = rand((1, 2, 2, 4), seed=10), rand((1, 2, 2, 4), seed=11)
    mask = rand((2, 3, 5), np.bool_, seed=12)
    feeds = {"Q": q, "K": k, "V": v, "attn_mask": mask, "past_key": pk, "past_value": pv}
    attrs = {"is_causal": 1, "qk_matmul_output_mode": 2}
    out = run_attention(feeds, attrs, outputs=("Y", "pk", "pv", "qk"))
    y, rk, rv, qk = ref_attention(q, k, v, mask, pk, pv, is_causal=1, mode=2)
    for name, want in zip(("Y", "pk", "pv", "qk"), (y, rk, rv, qk), strict=True):
        assert_close(out[name], want, rtol=1e-5, atol=1e-6, what=name)


@pytest.mark.parametrize("causal", [0, 1])
def test_attention_nonpad_kv_seqlen(causal):
    # External cache: K/V hold 7 slots, batch 0 uses 5, batch 1 uses 2 (fewer than the 3 queries:
    # with is_causal its first query row attends nothing and must be zero).
    q, k, v = _qkv((2, 2, 3, 4), (2, 2, 7, 4), (2, 2, 7, 4), seed=13)
    nonpad = np.array([5, 2], dtype=np.int64)
    mask = rand((2, 1, 3, 6), np.bool_, seed=14)  # shorter than the cache: padded with False
    mask[..., :2] = True
    feeds = {"Q": q, "K": k, "V": v, "attn_mask": mask, "nonpad_kv_seqlen": nonpad}
    out = run_attention(feeds, {"is_causal": causal})
    y = ref_attention(q, k, v, mask, nonpad=nonpad, is_causal=causal)[0]
    assert_close(out["Y"], y, rtol=1e-5, atol=1e-6)
    if causal:
        assert not out["Y"][1, :, 0].any()


@pytest.mark.parametrize("left, right, causal", [(2, -1, 1), (1, 2, 0), (0, 0, 0), (-1, 1, 0)])
def test_attention_sliding_window(left, right, causal):
    q, k, v = _qkv((1, 2, 5, 4), (1, 2, 6, 4), (1, 2, 6, 4), seed=15)
    pk, pv = rand((1, 2, 2, 4), seed=16), rand((1, 2, 2, 4), seed=17)
    attrs = {"left_window_size": left, "right_window_size": right, "is_causal": causal}
    feeds = {"Q": q, "K": k, "V": v, "past_key": pk, "past_value": pv}
    out = run_attention(feeds, attrs)
    want = ref_attention(q, k, v, None, pk, pv, is_causal=causal, left=left, right=right)[0]
    assert_close(out["Y"], want, rtol=1e-5, atol=1e-6)


def test_attention_fully_masked_rows_are_zero():
    q, k, v = _qkv((1, 1, 3, 4), (1, 1, 3, 4), (1, 1, 3, 4))
    mask = np.array([[True, True, False], [False, False, False], [True, False, True]])
    feeds = {"Q": q, "K": k, "V": v, "attn_mask": mask}
    out = run_attention(feeds, {"qk_matmul_output_mode": 3}, outputs=("Y", "", "", "qk"))
    assert np.isfinite(out["Y"]).all()
    assert not out["Y"][0, 0, 1].any() and not out["qk"][0, 0, 1].any()
    assert_close(out["Y"], ref_attention(q, k, v, mask)[0], rtol=1e-5, atol=1e-6)


# ---- precision -----------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float16, np.float64])
@pytest.mark.parametrize("causal", [0, 1])
def test_attention_dtypes(dtype, causal):
    q, k, v = _qkv((2, 4, 5, 8), (2, 2, 7, 8), (2, 2, 7, 8), dtype=dtype, seed=18)
    mask = rand((5, 7), dtype, seed=19, low=-1, high=0)
    feeds = {"Q": q, "K": k, "V": v, "attn_mask": mask}
    out = run_attention(feeds, {"is_causal": causal})
    assert_close(out["Y"], ref_attention(q, k, v, mask, is_causal=causal)[0])
    if dtype == np.float16:
        check_against_ort("Attention", feeds, {"is_causal": causal}, outputs=("Y",))


def test_attention_fp16_large_logits_do_not_overflow():
    # QK^T of 64 dims of magnitude ~16 is ~16k: near fp16's max. An fp16 softmax would overflow
    # in exp or its sum; the fp32 one must give the exact answer.
    q = np.full((1, 1, 2, 64), 16, dtype=np.float16)
    k = np.full((1, 1, 3, 64), 16, dtype=np.float16)
    k[0, 0, 2] = -16
    v = rand((1, 1, 3, 4), np.float16, seed=1)
    out = run_attention({"Q": q, "K": k, "V": v}, {"scale": 1.0, "softmax_precision": 10})
    assert_close(out["Y"], ref_attention(q, k, v, scale=1.0)[0])


def test_attention_bfloat16_runs_in_fp32():
    bf16 = DType.bfloat16.numpy
    q, k, v = _qkv((1, 2, 3, 8), (1, 2, 5, 8), (1, 2, 5, 8), seed=22)
    qb, kb, vb = (x.astype(bf16) for x in (q, k, v))
    out = run_attention({"Q": qb, "K": kb, "V": vb}, {"is_causal": 1})
    want = ref_attention(*(x.astype(np.float32) for x in (qb, kb, vb)), is_causal=1)[0]
    assert out["Y"].dtype == bf16
    np.testing.assert_allclose(out["Y"].astype(np.float32), want, rtol=8e-3, atol=1e-3)


def test_attention_opset23_node():
    q, k, v = _qkv((1, 2, 3, 4), (1, 2, 3, 4), (1, 2, 3, 4))
    out = run_attention({"Q": q, "K": k, "V": v}, {"is_causal": 1}, opset=23)
    assert_close(out["Y"], ref_attention(q, k, v, is_causal=1)[0], rtol=1e-5, atol=1e-6)


# ---- type inference ------------------------------------------------------------------------------


def _infer(op, types, attrs=None, num_outputs=1, values=None):
    opdef = get_op(op)
    ctx = InferContext(
        op=op,
        node_name="n",
        attrs=opdef.attrs(**(attrs or {})),
        input_types=list(types),
        input_values=list(values or [None] * len(types)),
        num_outputs=num_outputs,
    )
    return opdef.infer(ctx)


def T(*shape, dt=DType.float32):
    return TensorType(dt, tuple(shape))


def test_attention_infer_shapes_all_outputs():
    f16 = DType.float16
    types = [
        T("b", 7, 48, dt=f16),
        T("b", 5, 16, dt=f16),
        T("b", 5, 10, dt=DType.float32),
        T(7, 9, dt=DType.bool),
        T("b", 2, 4, 8, dt=f16),
        T("b", 2, 4, 5, dt=DType.float32),
    ]
    outs = _infer("Attention", types, {"q_num_heads": 6, "kv_num_heads": 2}, num_outputs=4)
    assert outs == [
        T("b", 7, 30, dt=f16),
        T("b", 2, 9, 8, dt=f16),
        T("b", 2, 9, 5, dt=DType.float32),
        T("b", 6, 7, 9, dt=f16),
    ]


def test_attention_infer_4d_symbolic_sequence():
    outs = _infer("Attention", [T(1, 4, "s", 8), T(1, 2, "t", 8), T(1, 2, "t", 3)], num_outputs=4)
    assert outs[0] == T(1, 4, "s", 3)
    assert outs[3] == T(1, 4, "s", "t")


@pytest.mark.parametrize(
    "types, attrs, message",
    [
        ([T(1, 3, 12), T(1, 3, 12), T(1, 3, 12)], {}, "q_num_heads"),
        ([T(1, 3, 4, 8), T(1, 2, 4, 8), T(1, 2, 4, 8)], {}, "multiple"),
        ([T(1, 2, 4, 8), T(1, 2, 4, 6), T(1, 2, 4, 8)], {}, "head sizes"),
        ([T(1, 2, 4, 8), T(1, 2, 4, 8), T(1, 2, 4, 8), None, T(1, 2, 3, 8)], {}, "together"),
        ([T(1, 2, 4, 8), T(1, 2, 4, 8), T(1, 2, 4, 8), T(4, 5)], {}, "exceeds"),
        ([T(1, 2, 4, 8), T(1, 2, 4, 8), T(1, 2, 4, 8), T(3, 4)], {}, "broadcast"),
        ([T(1, 2, 4, 8), T(1, 2, 4, 8), T(1, 2, 4, 8)], {"qk_matmul_output_mode": 4}, "mode"),
    ],
)
def test_attention_infer_errors(types, attrs, message):
    with pytest.raises(ShapeError, match=message):
        _infer("Attention", types, attrs)


# ---- RotaryEmbedding -----------------------------------------------------------------------------


def ref_rotary(x, cos, sin, pos=None, *, interleaved=0, rotary_embedding_dim=0, num_heads=None):
    """RoPE in float64 from the paper's pairwise rotation, one pair of channels at a time."""
    xd = x.astype(np.float64)
    if x.ndim == 3:
        b, s, hid = x.shape
        xd = xd.reshape(b, s, num_heads, hid // num_heads).transpose(0, 2, 1, 3)
    head = xd.shape[3]
    rot = rotary_embedding_dim or head
    if pos is not None:
        cos, sin = cos[pos], sin[pos]
    cos, sin = cos.astype(np.float64), sin.astype(np.float64)  # (batch, seq, rot/2)
    out = xd.copy()
    for p in range(rot // 2):
        a, b_ = (2 * p, 2 * p + 1) if interleaved else (p, p + rot // 2)
        c, s_ = cos[:, None, :, p], sin[:, None, :, p]
        out[..., a] = xd[..., a] * c - xd[..., b_] * s_
        out[..., b_] = xd[..., a] * s_ + xd[..., b_] * c
    if x.ndim == 3:
        out = out.transpose(0, 2, 1, 3).reshape(x.shape)
    return out.astype(x.dtype)


@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("rot_dim", [0, 4])
@pytest.mark.parametrize("three_d", [False, True])
@pytest.mark.parametrize("with_pos", [True, False])
def test_rotary_embedding(interleaved, rot_dim, three_d, with_pos):
    b, h, s, d = 2, 3, 5, 10
    x = rand((b, h, s, d), seed=1)
    half = (rot_dim or d) // 2
    attrs = {"interleaved": interleaved, "rotary_embedding_dim": rot_dim}
    if three_d:
        x = x.transpose(0, 2, 1, 3).reshape(b, s, h * d)
        attrs["num_heads"] = h
    if with_pos:
        cos, sin = rand((11, half), seed=2), rand((11, half), seed=3)
        pos = np.array([[0, 3, 4, 10, 1], [2, 2, 7, 0, 9]], dtype=np.int64)
        feeds = {"X": x, "cos": cos, "sin": sin, "pos": pos}
    else:
        cos, sin = rand((b, s, half), seed=2), rand((b, s, half), seed=3)
        pos = None
        feeds = {"X": x, "cos": cos, "sin": sin}
    out = check_against_ort("RotaryEmbedding", feeds, attrs)
    want = ref_rotary(x, cos, sin, pos, **attrs)
    assert_close(out["y"], want)


def test_rotary_embedding_float16():
    x = rand((1, 2, 3, 8), np.float16, seed=4)
    theta = np.arange(6)[:, None] * 10000.0 ** (-np.arange(4) / 4)
    cos, sin = np.cos(theta).astype(np.float16), np.sin(theta).astype(np.float16)
    pos = np.array([[5, 0, 2]], dtype=np.int64)
    out = check_against_ort("RotaryEmbedding", {"X": x, "cos": cos, "sin": sin, "pos": pos})
    assert_close(out["y"], ref_rotary(x, cos, sin, pos))


def test_rotary_embedding_bad_position():
    x = rand((1, 1, 2, 4))
    cos = rand((3, 2))
    model = make_node_model("RotaryEmbedding", {"X": x, "c": cos, "s": cos, "p": np.array([[0, 3]])})
    with pytest.raises(graphc.interpreter.InterpretError, match="position_ids"):
        run_graphc(model, {"X": x, "c": cos, "s": cos, "p": np.array([[0, 3]])})


@pytest.mark.parametrize(
    "types, attrs, message",
    [
        ([T(1, 3, 12), T(4, 3), T(4, 3), T(1, 3, dt=DType.int64)], {}, "num_heads"),
        ([T(1, 2, 3, 8), T(4, 3), T(4, 3), T(1, 3, dt=DType.int64)], {}, "rotary dim / 2"),
        ([T(1, 2, 3, 8), T(4, 2), T(4, 2), T(1, 3, dt=DType.int64)], {"rotary_embedding_dim": 3}, "even"),
        ([T(1, 2, 3, 8), T(4, 4), T(4, 4)], {}, "3-D"),
    ],
)
def test_rotary_infer_errors(types, attrs, message):
    with pytest.raises(ShapeError, match=message):
        _infer("RotaryEmbedding", types, attrs)


def test_rotary_infer_symbolic():
    types = [T("b", "s", 24, dt=DType.float16), T("b", "s", 2, dt=DType.float16)] * 1
    types.append(T("b", "s", 2, dt=DType.float16))
    out = _infer("RotaryEmbedding", types, {"num_heads": 3, "rotary_embedding_dim": 4})
    assert out == [T("b", "s", 24, dt=DType.float16)]


# ---- LinearAttention -----------------------------------------------------------------------------


def ref_linear_attention(q, k, v, past=None, decay=None, beta=None, *, qh, kvh, rule, scale=0.0):
    """Per (batch, query head): the closed form sum over s <= t for the linear and gated rules, the
    spec's recurrence for the delta rules; float64."""
    b, t, _ = q.shape
    dk, dv = q.shape[2] // qh, v.shape[2] // kvh
    scale = scale or 1 / math.sqrt(dk)
    f = np.float64
    y = np.zeros((b, t, qh, dv))
    states = np.zeros((b, kvh, dk, dv))
    for bi in range(b):
        for h in range(qh):
            g = h // (qh // kvh)
            qs = q[bi, :, h * dk : (h + 1) * dk].astype(f)
            ks = k[bi, :, g * dk : (g + 1) * dk].astype(f)
            vs = v[bi, :, g * dv : (g + 1) * dv].astype(f)
            s0 = np.zeros((dk, dv)) if past is None else past[bi, g].astype(f)
            if decay is None:
                gam = np.zeros((t, dk))
            elif decay.shape[2] == kvh:
                gam = np.repeat(decay[bi, :, g : g + 1].astype(f), dk, axis=1)
            else:
                gam = decay[bi, :, g * dk : (g + 1) * dk].astype(f)
            if rule in ("linear", "gated"):
                cum = np.cumsum(gam, axis=0)  # log of the decay from step 0 through step t
                for ti in range(t):
                    acc = (qs[ti] * np.exp(cum[ti])) @ s0
                    for si in range(ti + 1):
                        acc += (qs[ti] * np.exp(cum[ti] - cum[si])) @ np.outer(ks[si], vs[si])
                    y[bi, ti, h] = scale * acc
                state = s0 * np.exp(cum[-1])[:, None]
                for si in range(t):
                    state += np.exp(cum[-1] - cum[si])[:, None] * np.outer(ks[si], vs[si])
            else:
                state = s0
                for ti in range(t):
                    bt = beta[bi, ti, g if beta.shape[2] == kvh else 0]
                    state = state * np.exp(gam[ti])[:, None]
                    state = state + bt * np.outer(ks[ti], vs[ti] - state.T @ ks[ti])
                    y[bi, ti, h] = scale * (qs[ti] @ state)
            states[bi, g] = state
    return y.reshape(b, t, qh * dv).astype(q.dtype), states


@pytest.mark.parametrize(
    "rule, qh, kvh, per_head_decay, beta_last, with_past",
    [
        ("linear", 2, 2, False, None, False),
        ("linear", 4, 2, False, None, True),
        ("gated", 3, 1, True, None, True),
        ("gated", 2, 2, False, None, False),
        ("delta", 2, 2, False, "heads", True),
        ("delta", 4, 2, False, "one", False),
        ("gated_delta", 2, 1, True, "one", True),
        ("gated_delta", 4, 2, False, "heads", False),
    ],
)
def test_linear_attention(rule, qh, kvh, per_head_decay, beta_last, with_past):
    b, t, dk, dv = 2, 5, 3, 4
    q = rand((b, t, qh * dk), seed=1, low=-1, high=1)
    k = rand((b, t, kvh * dk), seed=2, low=-1, high=1)
    k /= np.linalg.norm(k.reshape(b, t, kvh, dk), axis=-1).repeat(dk, axis=-1)  # L2-normalized keys
    v = rand((b, t, kvh * dv), seed=3, low=-1, high=1)
    feeds = {"query": q, "key": k, "value": v}
    order = ["query", "key", "value", "", "", ""]
    past = decay = beta = None
    if with_past:
        past = feeds["past_state"] = rand((b, kvh, dk, dv), seed=4, low=-1, high=1)
        order[3] = "past_state"
    if rule in ("gated", "gated_delta"):
        decay = feeds["decay"] = rand((b, t, kvh if per_head_decay else kvh * dk), seed=5, low=-0.5, high=0)
        order[4] = "decay"
    if beta_last:
        beta = feeds["beta"] = rand((b, t, kvh if beta_last == "heads" else 1), seed=6, low=0.1, high=0.9)
        order[5] = "beta"
    while not order[-1]:
        order.pop()
    attrs = {"update_rule": rule, "q_num_heads": qh, "kv_num_heads": kvh, "chunk_size": 2}
    model = make_node_model("LinearAttention", feeds, attrs, outputs=("y", "state"), input_order=order)
    out = run_graphc(model, feeds)
    want_y, want_state = ref_linear_attention(q, k, v, past, decay, beta, qh=qh, kvh=kvh, rule=rule)
    assert_close(out["y"], want_y, rtol=1e-5, atol=1e-5)
    assert_close(out["state"], want_state.astype(np.float32), rtol=1e-5, atol=1e-5)


def test_linear_attention_float16_state_dtype_follows_past():
    q = rand((1, 3, 4), np.float16, seed=1, low=-1, high=1)
    past = rand((1, 2, 2, 2), np.float32, seed=2, low=-1, high=1)
    feeds = {"query": q, "key": q, "value": q, "past_state": past}
    attrs = {"update_rule": "linear", "q_num_heads": 2, "kv_num_heads": 2, "scale": 0.5}
    model = make_node_model("LinearAttention", feeds, attrs, outputs=("y", "state"))
    out = run_graphc(model, feeds)
    want_y, want_state = ref_linear_attention(q, q, q, past, qh=2, kvh=2, rule="linear", scale=0.5)
    assert out["state"].dtype == np.float32
    assert_close(out["y"], want_y)
    assert_close(out["state"], want_state.astype(np.float32), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "types, attrs, message",
    [
        ([T(1, 3, 6), T(1, 3, 4), T(1, 3, 4)], {"q_num_heads": 3, "kv_num_heads": 2}, "multiple"),
        ([T(1, 3, 4), T(1, 3, 4), T(1, 3, 4)], {"q_num_heads": 2, "kv_num_heads": 2}, "requires the decay"),
        (
            [T(1, 3, 4), T(1, 3, 4), T(1, 3, 4), None, T(1, 3, 2)],
            {"q_num_heads": 2, "kv_num_heads": 2, "update_rule": "linear"},
            "forbids the decay",
        ),
        (
            [T(1, 3, 4), T(1, 3, 4), T(1, 3, 4), None, T(1, 3, 3)],
            {"q_num_heads": 2, "kv_num_heads": 2, "update_rule": "gated"},
            "last dim",
        ),
    ],
)
def test_linear_attention_infer_errors(types, attrs, message):
    with pytest.raises(ShapeError, match=message):
        _infer("LinearAttention", types, attrs)


def test_linear_attention_infer_symbolic():
    types = [T("b", "t", 12), T("b", "t", 6), T("b", "t", 10), None, T("b", "t", 2)]
    attrs = {"q_num_heads": 4, "kv_num_heads": 2, "update_rule": "gated"}
    assert _infer("LinearAttention", types, attrs, num_outputs=2) == [T("b", "t", 20), T("b", 2, 3, 5)]


@pytest.mark.parametrize("mode", ["zero", "mean", "nan"])
def test_attention_masked_rows_modes(mode):
    # graphc's masked_rows: a row with no kept key is 0, the mean of V over all keys, or NaN (what
    # the decomposed graph's softmax of a -inf row gives); every other row is the same in each.
    from graphc.ops.attention import AttentionAttrs
    from graphc.runtime.reference.attention import _attention_compute

    q, k, v = _qkv((1, 1, 3, 4), (1, 1, 3, 4), (1, 1, 3, 4))
    mask = np.array([[True, True, False], [False, False, False], [True, False, True]])
    (y,) = _attention_compute([q, k, v, mask], AttentionAttrs(masked_rows=mode), 1)
    (zero,) = _attention_compute([q, k, v, mask], AttentionAttrs(), 1)
    want = {"zero": np.zeros(4), "mean": v[0, 0].mean(axis=0), "nan": np.full(4, np.nan)}[mode]
    np.testing.assert_allclose(y[0, 0, 1], want, rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(y[0, 0, [0, 2]], zero[0, 0, [0, 2]])
