"""Attention ops: Attention (scaled dot-product attention, ONNX opset 23-25) and RotaryEmbedding.

Attention's IR form is the newest ONNX version (25: sliding windows, nonpad_kv_seqlen). Older
versions are subsets of it with the same meaning, so they pass through unchanged.

Numerics: float16/bfloat16 inputs are computed in float32 throughout (QK matmul, softcap, bias,
softmax, PV matmul) and rounded to the input precision once, at the outputs: the result an fp16
kernel with fp32 accumulation gives, and the most accurate one. Only sqrt(scale) is rounded to T1
first, as the spec's function body does. Softmax never runs below float32, whatever
softmax_precision asks (it may ask for more: float64).

This module holds the numpy kernels (what the interpreter and a CPU engine run); type
inference and traits are in graphc.ops.attention.
"""

from __future__ import annotations

import math

import numpy as np

from graphc.runtime.dtypes import DType
from graphc.runtime.reference.registry import register_kernel


def _compute_dtype(dt: np.dtype) -> np.dtype:
    """float64 stays float64; every narrower float is computed in float32."""
    return np.dtype(np.float64) if dt == np.float64 else np.dtype(np.float32)


def _split_heads(x: np.ndarray, heads: int) -> np.ndarray:
    """(batch, seq, heads * size) -> (batch, heads, seq, size)."""
    b, s, hidden = x.shape
    return x.reshape(b, s, heads, hidden // heads).transpose(0, 2, 1, 3)


def _attention_bias(
    mask: np.ndarray | None,
    nonpad: np.ndarray | None,
    offset: int,
    q_len: int,
    total: int,
    attrs,
    cdt: np.dtype,
) -> np.ndarray:
    """The additive bias (0 or -inf, plus a float mask), broadcastable to (B, H, q_len, total).

    A query's absolute position is `offset + i` (offset = past length, or per batch
    nonpad_kv_seqlen - q_len for an external cache); causal masking and the windows are relative
    to it, bottom-right aligned as the spec says.
    """
    bias = np.zeros((q_len, total), dtype=cdt)
    if mask is not None:
        if mask.shape[-1] > total:
            raise ValueError(f"attn_mask's last dim {mask.shape[-1]} exceeds total length {total}")
        m = np.where(mask, cdt.type(0), cdt.type(-np.inf)) if mask.dtype == np.bool_ else mask.astype(cdt)
        pad = total - m.shape[-1]
        if pad:
            m = np.pad(m, [(0, 0)] * (m.ndim - 1) + [(0, pad)], constant_values=-np.inf)
        bias = bias + m
    i = np.arange(q_len).reshape(q_len, 1)
    j = np.arange(total).reshape(1, total)
    if nonpad is not None:
        offset = (nonpad.astype(np.int64) - q_len).reshape(-1, 1, 1, 1)  # per batch: (B, 1, 1, 1)
    pos = i + offset  # absolute query positions, (q, 1) or (B, 1, q, 1)
    allowed = np.ones(np.broadcast_shapes(pos.shape, j.shape), dtype=bool)
    if attrs.is_causal:
        allowed &= j <= pos
    if attrs.left_window_size >= 0:
        allowed &= pos - j <= attrs.left_window_size
    if attrs.right_window_size >= 0:
        allowed &= j - pos <= attrs.right_window_size
    if nonpad is not None:
        allowed &= j < nonpad.astype(np.int64).reshape(-1, 1, 1, 1)
    if not allowed.all():
        bias = bias + np.where(allowed, cdt.type(0), cdt.type(-np.inf))
    return bias


def _masked_softmax(x: np.ndarray) -> np.ndarray:
    """Softmax over the last axis; an all -inf row gives zeros, not NaN."""
    x_max = np.max(x, axis=-1, keepdims=True)
    x_max = np.where(np.isneginf(x_max), x.dtype.type(0), x_max)
    e = np.exp(x - x_max)
    s = np.sum(e, axis=-1, keepdims=True)
    return e / np.where(s == 0, x.dtype.type(1), s)


def _attention_compute(ins, attrs, n):
    q, k, v = ins[0], ins[1], ins[2]
    opt = [ins[i] if i < len(ins) else None for i in range(3, 7)]
    mask, past_k, past_v, nonpad = opt
    t1, t2 = q.dtype, v.dtype
    rank = q.ndim
    if rank == 3:
        q = _split_heads(q, attrs.q_num_heads)
        k = _split_heads(k, attrs.kv_num_heads)
        v = _split_heads(v, attrs.kv_num_heads)
    present_k = k if past_k is None else np.concatenate([past_k, k], axis=2)
    present_v = v if past_v is None else np.concatenate([past_v, v], axis=2)
    _, qh, q_len, head = q.shape
    kvh, total = present_k.shape[1], present_k.shape[2]

    cdt = _compute_dtype(t1)
    scale = attrs.scale if attrs.scale is not None else 1.0 / math.sqrt(head)
    # Q and K are each scaled by sqrt(scale), rounded to T1 as the spec's function body does.
    s = t1.type(math.sqrt(scale))
    qs = q.astype(cdt) * cdt.type(s)
    ks = present_k.astype(cdt) * cdt.type(s)
    vv = present_v.astype(np.promote_types(cdt, _compute_dtype(t2)))
    if qh != kvh:
        # Grouped-query attention: query head h reads kv head h // (qh / kvh).
        ks = np.repeat(ks, qh // kvh, axis=1)
        vv = np.repeat(vv, qh // kvh, axis=1)
    qk = np.matmul(qs, ks.transpose(0, 1, 3, 2))
    capped = qk
    if attrs.softcap > 0:
        capped = cdt.type(attrs.softcap) * np.tanh(qk / cdt.type(attrs.softcap))
    offset = 0 if past_k is None else past_k.shape[2]
    bias = _attention_bias(mask, nonpad, offset, q_len, total, attrs, cdt)
    logits = capped + bias

    sdt = cdt
    if attrs.softmax_precision is not None:
        sdt = np.promote_types(cdt, DType.from_onnx(attrs.softmax_precision).numpy)
        sdt = np.promote_types(sdt, np.float32)
    probs = _masked_softmax(logits.astype(sdt))
    # A row that attends nothing (its whole bias is -inf) is zero, decided on the bias so that
    # NaN or inf logits cannot leak into it; with masked_rows (graphc's own attribute, see
    # graphc.ops.attention) "mean" it is uniform over every key, the mean of V, and with "nan" NaN.
    dead = np.isneginf(np.max(bias, axis=-1, keepdims=True))
    fill = {"mean": 1.0 / total if total else 0.0, "nan": np.nan}.get(attrs.masked_rows, 0.0)
    probs = np.where(dead, sdt.type(fill), probs)
    y = np.matmul(probs.astype(vv.dtype), vv)
    if rank == 3:
        y = y.transpose(0, 2, 1, 3).reshape(y.shape[0], q_len, -1)
    outs = [y.astype(t1), present_k.astype(t1), present_v.astype(t2)]
    if n >= 4:
        mode = attrs.qk_matmul_output_mode
        qk_out = {0: qk, 1: capped, 2: logits, 3: probs}[mode]
        outs.append(np.broadcast_to(qk_out, qk.shape).astype(t1))
    return outs[: max(n, 1)]


def _rotary_compute(ins, attrs, n):
    x, cos, sin = ins[0], ins[1], ins[2]
    pos = ins[3] if len(ins) > 3 else None
    dt = x.dtype
    cdt = _compute_dtype(dt)
    if x.ndim == 4:
        xs = x.transpose(0, 2, 1, 3)  # (batch, seq, heads, head)
    else:
        b, s, hidden = x.shape
        xs = x.reshape(b, s, attrs.num_heads, hidden // attrs.num_heads)
    rot = attrs.rotary_embedding_dim or xs.shape[3]
    if pos is not None:
        if pos.size and (pos.min() < 0 or pos.max() >= cos.shape[0]):
            raise ValueError(f"position_ids out of range [0, {cos.shape[0]})")
        cos, sin = cos[pos], sin[pos]  # (batch, seq, rot/2)
    cos = cos.astype(cdt)[:, :, None, :]
    sin = sin.astype(cdt)[:, :, None, :]
    xr = xs[..., :rot].astype(cdt)
    if attrs.interleaved:
        x1, x2 = xr[..., 0::2], xr[..., 1::2]
    else:
        x1, x2 = xr[..., : rot // 2], xr[..., rot // 2 :]
    real = cos * x1 - sin * x2
    imag = sin * x1 + cos * x2
    if attrs.interleaved:
        rotated = np.stack([real, imag], axis=-1).reshape(xr.shape)
    else:
        rotated = np.concatenate([real, imag], axis=-1)
    out = np.concatenate([rotated.astype(dt), xs[..., rot:]], axis=-1)
    out = out.transpose(0, 2, 1, 3) if x.ndim == 4 else out.reshape(x.shape)
    return [np.ascontiguousarray(out)]


def _linear_attention_compute(ins, attrs, n):
    query, key, value = ins[0], ins[1], ins[2]
    past, decay, beta = (ins[i] if i < len(ins) else None for i in (3, 4, 5))
    qh, kvh = attrs.q_num_heads, attrs.kv_num_heads
    f32 = np.float32
    q = _split_heads(query, qh).astype(f32)  # (B, Hq, T, dk)
    k = _split_heads(key, kvh).astype(f32)  # (B, Hkv, T, dk)
    v = _split_heads(value, kvh).astype(f32)  # (B, Hkv, T, dv)
    b, _, t, dk = k.shape
    dv = v.shape[3]
    # decay/beta per (B, Hkv, T, dk or 1); a per-head decay broadcasts over dk.
    g = None if decay is None else _split_heads(decay, kvh).astype(f32)
    beta4 = None if beta is None else beta.reshape(b, t, beta.shape[2], 1).transpose(0, 2, 1, 3).astype(f32)
    state = np.zeros((b, kvh, dk, dv), f32) if past is None else past.astype(f32)
    scale = attrs.scale if attrs.scale else 1.0 / math.sqrt(dk)
    group = qh // kvh
    # Query head h reads kv head h // group: view queries as (B, Hkv, group, T, dk).
    qg = q.reshape(b, kvh, group, t, dk)
    out = np.empty((b, kvh, group, t, dv), f32)
    # The recurrence is sequential in time (each state depends on the previous one).
    for i in range(t):
        if g is not None:
            state = state * np.exp(g[:, :, i, :])[..., None]
        k_t, v_t = k[:, :, i, :], v[:, :, i, :]
        if beta4 is not None:
            retrieved = np.einsum("bhdm,bhd->bhm", state, k_t)
            v_t = beta4[:, :, i, :] * (v_t - retrieved)
        state = state + k_t[..., :, None] * v_t[..., None, :]
        out[:, :, :, i, :] = np.einsum("bhgd,bhdm->bhgm", qg[:, :, :, i, :], state)
    out *= f32(scale)
    y = out.reshape(b, qh, t, dv).transpose(0, 2, 1, 3).reshape(b, t, qh * dv)
    state_dtype = query.dtype if past is None else past.dtype
    return [y.astype(query.dtype), state.astype(state_dtype)][: max(n, 1)]


register_kernel("Attention", _attention_compute)
register_kernel("RotaryEmbedding", _rotary_compute)
register_kernel("LinearAttention", _linear_attention_compute)
