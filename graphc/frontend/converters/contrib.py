"""Converters of ONNX Runtime's contrib ops (domain com.microsoft) onto graphc's own ops.

ONNX Runtime's transformer optimizer and its exporters write these fused ops; each one here becomes
the graphc op (or short chain of ops) that means the same, so every graphc pass and both targets
apply to it: attention becomes graphc's Attention node (the ONNX opset-23+ op, the one the flash
kernel runs), the layer norms LayerNormalization / RMSNormalization, the GELUs Gelu, FusedConv and
FusedMatMul Conv / graphc.MatMul followed by elementwise ops that fuse into their epilogue.

Definitions are those of ONNX Runtime's ContribOperators.md (the op schemas ORT registers); the
numerics are checked against ORT's CPU execution provider in tests/graphc/frontend/test_contrib.py.
Every option a converter does not support is refused with a message naming the node; none is
silently ignored. What each supports:

- Gelu, BiasGelu: erf GELU (of A + B); FastGelu: tanh GELU of X (+ bias); QuickGelu:
  x * sigmoid(alpha x); BiasAdd: X + bias + skip; BiasSplitGelu: left * gelu(right) of X + bias.
- SkipLayerNormalization / SkipSimplifiedLayerNormalization: the sum input + skip (+ bias), then
  LayerNormalization / RMSNormalization over the last axis; every output (mean, inv_std_var,
  input_skip_bias_sum) but the simplified form's mean.
- EmbedLayerNormalization: the three embedding Gathers, their sum, LayerNormalization, mask_index
  (the count of nonzero mask entries per row, as ORT counts them; zeros without a mask) and
  embedding_sum.
- Attention: packed QKV projection (qkv_hidden_sizes too), the mask_index formats (B) end
  positions, (2B) end + start positions, raw (B, T) and (B, S, T) masks, all additive with
  mask_filter_value as ORT applies them; attention_bias, unidirectional,
  scale, past/present (the cache as static tensors; the CUDA target has no KV-cache kernel).
  Refused: do_rotary, past_present_share_buffer, past_sequence_length, the (3B + 2) mask and the
  4-D (Megatron) mask (which ORT's CPU kernel refuses too, so there is no oracle for it here).
- MultiHeadAttention: separate 3-D Q/K/V, packed QKV (B, S, N, 3, H), packed KV (B, L, N, 2, H),
  K/V already in (B, N, L, H); bias, key_padding_mask ((B) lengths, (B, T), (B, S, T)),
  attention_bias, unidirectional, past_key/past_value with present outputs. Refused: the qk output,
  past_sequence_length, cache_indirection, (3B + 2) masks, bias with packed or BNSH K/V.
- GroupQueryAttention, prompt phase: separate or packed QKV, seqlens_k as a right-padding key mask
  (dropped when known to be full), causal (default) or not, local_window_size, softcap, scale,
  do_rotary with cos/sin caches (position_ids or 0..S-1), attention_bias; present_key/value are the
  new K/V. Refused: a non-empty past (token generation with a KV cache), head_sink / smooth_softmax,
  qk_output, KV-cache quantization, q/k norm weights, query_seqlens, sliding_window_cache.
- RotaryEmbedding: 3-D or 4-D input, position_ids (B, S) or a (1) offset, interleaved, partial
  rotary_embedding_dim. Refused: is_packed_batching, scale != 1.
- FusedConv / FusedGemm: Conv (+ Z) / Gemm, then the activation (Relu, Tanh, Sigmoid, LeakyRelu,
  Clip, HardSigmoid, Elu). FusedMatMul: graphc.MatMul(trans_a, trans_b, alpha), transBatchA/B as
  a Transpose that moves the first dim next to the last.
- MatMulNBits: the 2-, 4- or 8-bit block-quantized weight is dequantized to A's float type at load
  (the weight then takes 32 / bits times its packed size; logged), then MatMul (+ bias). Refused:
  g_idx, prepacked weights, a weight that is not a constant.
- DynamicQuantizeMatMul / MatMulIntegerToFloat: A quantized per tensor as DynamicQuantizeLinear
  does (uint8, zero point from the range including 0, round half to even) and dequantized again,
  B dequantized (per tensor or per column), then MatMul (+ bias): the integer product up to float
  rounding of the sum.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence

import numpy as np

from graphc.frontend.context import ConvertContext
from graphc.frontend.registry import converter
from graphc.ir.graph import Value
from graphc.ir.types import DType
from graphc.ops.internal import INTERNAL_DOMAIN
from graphc.ops.normalization import HAS_RMS_NORMALIZATION

log = logging.getLogger(__name__)

MS = "com.microsoft"
DEFAULT_MASK_FILTER = -10000.0  # ORT's mask_filter_value default


# ---- small helpers --------------------------------------------------------------------------------


def _refuse_inputs(ctx: ConvertContext, names: dict[int, str]) -> None:
    for i, what in names.items():
        if ctx.input(i) is not None:
            raise ctx.fail(f"input {i} ({what}) is not supported")


def _wanted(ctx: ConvertContext) -> list[bool]:
    """Which of the node's outputs are asked for (a non-empty name)."""
    return [bool(n) for n in ctx.node.output]


def _refuse_outputs(ctx: ConvertContext, names: dict[int, str]) -> None:
    wanted = _wanted(ctx)
    for i, what in names.items():
        if i < len(wanted) and wanted[i]:
            raise ctx.fail(f"output {i} ({what}) is not supported")


def _float_const(ctx: ConvertContext, value: float, like: Value, hint: str) -> Value:
    return ctx.constant(np.asarray(value, dtype=like.ttype.dtype.numpy), hint)


def _i64(ctx: ConvertContext, values: Sequence[int] | int, hint: str) -> Value:
    return ctx.constant(np.asarray(values, dtype=np.int64), hint)


def _shape(v: Value) -> tuple:
    s = v.ttype.shape
    return () if s is None else tuple(s)


def _rank(ctx: ConvertContext, v: Value, what: str) -> int:
    if v.ttype.shape is None:
        raise ctx.fail(f"{what} needs a known rank")
    return len(v.ttype.shape)


def _static_dim(ctx: ConvertContext, v: Value, axis: int, what: str) -> int:
    s = _shape(v)
    d = s[axis] if s and -len(s) <= axis < len(s) else None
    if not isinstance(d, int):
        raise ctx.fail(f"{what} (dim {axis} of {v.name}) must be known")
    return d


def _dim(ctx: ConvertContext, v: Value, axis: int, hint: str) -> Value:
    """Dim `axis` of v as a 1-element int64 tensor (a constant when static)."""
    s = _shape(v)
    if s and isinstance(s[axis], int):
        return _i64(ctx, [s[axis]], hint)
    shape = ctx.op("Shape", [v], name=f"{ctx.name}/{hint}_shape")
    a = axis % len(s) if s else axis
    return ctx.op("Slice", [shape, _i64(ctx, [a], "start"), _i64(ctx, [a + 1], "end")], name=f"{ctx.name}/{hint}")


def _arange(ctx: ConvertContext, length: Value, hint: str) -> Value:
    """0, 1, ..., length - 1 (int64); length a 1-element int64 tensor."""
    known = ctx.builder.known_value(length)
    if known is not None:
        return _i64(ctx, np.arange(int(np.asarray(known).reshape(-1)[0])), hint)
    n = ctx.op("Squeeze", [length, _i64(ctx, [0], "axis")], name=f"{ctx.name}/{hint}_len")
    return ctx.op("Range", [_i64(ctx, 0, "zero"), n, _i64(ctx, 1, "one")], name=f"{ctx.name}/{hint}")


def _split_last(ctx: ConvertContext, x: Value, sizes: Sequence[int], hint: str) -> list[Value]:
    node = ctx.emit("Split", [x, _i64(ctx, list(sizes), f"{hint}_sizes")], {"axis": -1}, outputs=len(sizes))
    return list(node.outputs)


def _add(ctx: ConvertContext, a: Value, b: Value | None, hint: str) -> Value:
    return a if b is None else ctx.op("Add", [a, b], name=f"{ctx.name}/{hint}")


# ---- activations ----------------------------------------------------------------------------------


def _gelu(ctx: ConvertContext, x: Value, approximate: str) -> Value:
    return ctx.op("Gelu", [x], {"approximate": approximate}, name=f"{ctx.name}/Gelu")


@converter("Gelu", since=1, domain=MS)
def _ms_gelu(ctx: ConvertContext) -> list[Value]:
    return [_gelu(ctx, ctx.required_input(0, "X"), "none")]


@converter("BiasGelu", since=1, domain=MS)
def _bias_gelu(ctx: ConvertContext) -> list[Value]:
    return [_gelu(ctx, _add(ctx, ctx.required_input(0, "A"), ctx.required_input(1, "B"), "bias"), "none")]


@converter("FastGelu", since=1, domain=MS)
def _fast_gelu(ctx: ConvertContext) -> list[Value]:
    # 0.5 x (1 + tanh(0.797885 x + 0.035677 x^3)) is the tanh GELU: 0.035677 = 0.797885 * 0.044715.
    return [_gelu(ctx, _add(ctx, ctx.required_input(0, "X"), ctx.input(1), "bias"), "tanh")]


@converter("QuickGelu", since=1, domain=MS)
def _quick_gelu(ctx: ConvertContext) -> list[Value]:
    x = ctx.required_input(0, "X")
    alpha = float(ctx.attr("alpha", 1.702))
    arg = x if alpha == 1.0 else ctx.op("Mul", [x, _float_const(ctx, alpha, x, "alpha")], name=f"{ctx.name}/scale")
    return [ctx.op("Mul", [x, ctx.op("Sigmoid", [arg], name=f"{ctx.name}/Sigmoid")], name=ctx.name)]


@converter("BiasAdd", since=1, domain=MS)
def _bias_add(ctx: ConvertContext) -> list[Value]:
    y = _add(ctx, ctx.required_input(0, "X"), ctx.required_input(1, "bias"), "bias")
    return [_add(ctx, y, ctx.required_input(2, "skip"), "skip")]


@converter("BiasSplitGelu", since=1, domain=MS)
def _bias_split_gelu(ctx: ConvertContext) -> list[Value]:
    x = _add(ctx, ctx.required_input(0, "X"), ctx.required_input(1, "bias"), "bias")
    d = _static_dim(ctx, x, -1, "the hidden size")
    if d % 2:
        raise ctx.fail(f"hidden size {d} is odd; BiasSplitGelu splits it in halves")
    left, right = _split_last(ctx, x, [d // 2, d // 2], "halves")
    return [ctx.op("Mul", [left, _gelu(ctx, right, "none")], name=ctx.name)]


# Activations of FusedConv / FusedGemm: ORT's names, with their parameters in order.
_ACTIVATIONS = {
    "Relu": (),
    "Tanh": (),
    "Sigmoid": (),
    "LeakyRelu": ("alpha",),
    "Elu": ("alpha",),
    "HardSigmoid": ("alpha", "beta"),
    "Clip": ("min", "max"),
}


def _activation(ctx: ConvertContext, y: Value, name: str, params: Sequence[float]) -> Value:
    if name not in _ACTIVATIONS:
        raise ctx.fail(f"activation {name!r} is not supported (one of {', '.join(_ACTIVATIONS)})")
    keys = _ACTIVATIONS[name]
    if name == "Clip":
        if len(params) != 2:
            raise ctx.fail(f"Clip activation takes 2 parameters (min, max), got {list(params)}")
        lo, hi = (_float_const(ctx, p, y, h) for p, h in zip(params, ("min", "max"), strict=True))
        return ctx.op("Clip", [y, lo, hi], name=f"{ctx.name}/Clip")
    if params and len(params) != len(keys):
        raise ctx.fail(f"{name} activation takes parameters {keys}, got {list(params)}")
    attrs = {k: float(p) for k, p in zip(keys, params, strict=False)}
    return ctx.op(name, [y], attrs, name=f"{ctx.name}/{name}")


@converter("FusedConv", since=1, domain=MS)
def _fused_conv(ctx: ConvertContext) -> list[Value]:
    conv_attrs = {k: v for k, v in ctx.attrs.items() if k not in ("activation", "activation_params")}
    x, w, b, z = (ctx.input(i) for i in range(4))
    y = ctx.op("Conv", [x, w, b], conv_attrs, name=f"{ctx.name}/Conv")
    y = _add(ctx, y, z, "sum")  # Z is added before the activation
    name = ctx.attr("activation")
    return [y if not name else _activation(ctx, y, name, list(ctx.attr("activation_params", [])))]


@converter("FusedGemm", since=1, domain=MS)
def _fused_gemm(ctx: ConvertContext) -> list[Value]:
    gemm_attrs = {k: v for k, v in ctx.attrs.items() if k in ("alpha", "beta", "transA", "transB")}
    y = ctx.op("Gemm", list(ctx.inputs), gemm_attrs, name=f"{ctx.name}/Gemm")
    name = ctx.attr("activation")
    if not name:
        return [y]
    given = [ctx.attr(f"activation_{k}") for k in ("alpha", "beta", "gamma")]
    keys = _ACTIVATIONS.get(name, ())
    params = [p for p in given[: len(keys)] if p is not None] if name != "Clip" else [p for p in given[:2]]
    if name == "Clip" and any(p is None for p in params):
        raise ctx.fail("Clip activation needs activation_alpha (min) and activation_beta (max)")
    return [_activation(ctx, y, name, params)]


def _batch_to_front_perm(rank: int) -> list[int]:
    """transBatch: (d0, d1, ..., d_{r-2}, d_{r-1}) read as (d1, ..., d_{r-2}, d0, d_{r-1})."""
    return [*range(1, rank - 1), 0, rank - 1]


@converter("FusedMatMul", since=1, domain=MS)
def _fused_matmul(ctx: ConvertContext) -> list[Value]:
    a, b = ctx.required_input(0, "A"), ctx.required_input(1, "B")
    alpha = float(ctx.attr("alpha", 1.0))
    ta, tb = int(ctx.attr("transA", 0)), int(ctx.attr("transB", 0))
    operands = []
    for v, flag, what in ((a, ctx.attr("transBatchA", 0), "A"), (b, ctx.attr("transBatchB", 0), "B")):
        if flag:
            r = _rank(ctx, v, f"transBatch{what}")
            if r < 3:
                raise ctx.fail(f"transBatch{what} needs {what} of rank >= 3, got rank {r}")
            v = ctx.op("Transpose", [v], {"perm": _batch_to_front_perm(r)}, name=f"{ctx.name}/batch_{what}")
        operands.append(v)
    ranks = [_rank(ctx, v, "FusedMatMul") for v in operands]
    if min(ranks) >= 2:
        attrs = {"trans_a": ta, "trans_b": tb, "alpha": alpha}
        return [ctx.op("MatMul", operands, attrs, name=ctx.name, domain=INTERNAL_DOMAIN)]
    if ta or tb:
        raise ctx.fail("transA/transB need operands of rank >= 2")
    y = ctx.op("MatMul", operands, name=f"{ctx.name}/MatMul")
    return [y if alpha == 1.0 else ctx.op("Mul", [y, _float_const(ctx, alpha, y, "alpha")], name=ctx.name)]


# ---- layer norms ----------------------------------------------------------------------------------


def _skip_sum(ctx: ConvertContext, bias_index: int) -> Value:
    s = ctx.op("Add", [ctx.required_input(0, "input"), ctx.required_input(1, "skip")], name=f"{ctx.name}/skip")
    return _add(ctx, s, ctx.input(bias_index), "bias")


def _layer_norm(
    ctx: ConvertContext, x: Value, scale: Value, bias: Value | None, eps: float, outputs: int, axis: int = -1
) -> list[Value]:
    attrs = {"axis": axis, "epsilon": eps, "stash_type": 1}
    node = ctx.emit("LayerNormalization", [x, scale, bias], attrs, outputs=outputs, name=f"{ctx.name}/LayerNorm")
    return list(node.outputs)


def _inv_rms(ctx: ConvertContext, x: Value, eps: float, axis: int) -> Value:
    """1 / sqrt(mean(x^2 over the axes from `axis` on) + eps), in x's type, dims kept."""
    rank = _rank(ctx, x, "the normalized input")
    axes = list(range(axis % rank, rank))
    sq = ctx.op("Mul", [x, x], name=f"{ctx.name}/square")
    ms = ctx.op("ReduceMean", [sq, _i64(ctx, axes, "axes")], {"keepdims": 1}, name=f"{ctx.name}/mean_square")
    ms = ctx.op("Add", [ms, _float_const(ctx, eps, x, "eps")], name=f"{ctx.name}/eps")
    return ctx.op("Reciprocal", [ctx.op("Sqrt", [ms], name=f"{ctx.name}/rms")], name=f"{ctx.name}/inv_rms")


def _rms_norm(ctx: ConvertContext, x: Value, scale: Value, eps: float, axis: int) -> Value:
    if HAS_RMS_NORMALIZATION:
        attrs = {"axis": axis, "epsilon": eps, "stash_type": 1}
        return ctx.op("RMSNormalization", [x, scale], attrs, name=f"{ctx.name}/RMSNorm")
    log.info("%s: onnx has no RMSNormalization; written as its arithmetic", ctx.name)
    return ctx.op("Mul", [ctx.op("Mul", [x, _inv_rms(ctx, x, eps, axis)], name=f"{ctx.name}/norm"), scale])


@converter("SkipLayerNormalization", since=1, domain=MS)
def _skip_layer_norm(ctx: ConvertContext) -> list[Value]:
    s = _skip_sum(ctx, 4)
    wanted = _wanted(ctx)
    n_stats = 3 if any(wanted[1:3]) else 1
    outs = _layer_norm(ctx, s, ctx.required_input(2, "gamma"), ctx.input(3), float(ctx.attr("epsilon", 1e-12)), n_stats)
    return [*outs, *([None] * (3 - len(outs))), s][: len(wanted)]


@converter("SkipSimplifiedLayerNormalization", since=1, domain=MS)
def _skip_simplified_layer_norm(ctx: ConvertContext) -> list[Value]:
    _refuse_outputs(ctx, {1: "mean: the simplified form has none"})
    s = _skip_sum(ctx, 3)
    eps = float(ctx.attr("epsilon", 1e-12))
    y = _rms_norm(ctx, s, ctx.required_input(2, "gamma"), eps, -1)
    wanted = _wanted(ctx)
    inv = _inv_rms(ctx, s, eps, -1) if len(wanted) > 2 and wanted[2] else None
    return [y, None, inv, s][: len(wanted)]


@converter("EmbedLayerNormalization", since=1, domain=MS)
def _embed_layer_norm(ctx: ConvertContext) -> list[Value]:
    ids, seg_ids = ctx.required_input(0, "input_ids"), ctx.input(1)
    word, pos, seg = ctx.required_input(2, "word_embedding"), ctx.required_input(3, "position_embedding"), ctx.input(4)
    gamma, beta = ctx.required_input(5, "gamma"), ctx.required_input(6, "beta")
    mask, pos_ids = ctx.input(7), ctx.input(8)
    if (seg_ids is None) != (seg is None):
        raise ctx.fail("segment_ids and segment_embedding must be given together")
    x = ctx.op("Gather", [word, ids], {"axis": 0}, name=f"{ctx.name}/word")
    if pos_ids is None:  # positions 0..S-1, shared by the batch
        seq = _arange(ctx, _dim(ctx, ids, 1, "seq"), "positions")
        pos_ids = ctx.op("Unsqueeze", [seq, _i64(ctx, [0], "batch_axis")], name=f"{ctx.name}/position_ids")
    x = ctx.op("Add", [x, ctx.op("Gather", [pos, pos_ids], {"axis": 0}, name=f"{ctx.name}/position")])
    if seg is not None:
        x = ctx.op("Add", [x, ctx.op("Gather", [seg, seg_ids], {"axis": 0}, name=f"{ctx.name}/segment")])
    (y,) = _layer_norm(ctx, x, gamma, beta, float(ctx.attr("epsilon", 1e-12)), 1)
    wanted = _wanted(ctx)
    outs: list[Value | None] = [y]
    if len(wanted) > 1:
        mask_index = None
        if wanted[1]:
            if mask is None:  # ORT writes zeros then
                zeros = ctx.constant(np.zeros(1, np.int32), "zeros")
                mask = ctx.op("Expand", [zeros, _dim(ctx, ids, 0, "batch")], name=f"{ctx.name}/no_mask")
                mask = ctx.op("Unsqueeze", [mask, _i64(ctx, [1], "axis")])
            nonzero = ctx.op(
                "Cast",
                [ctx.op("Not", [ctx.op("Equal", [mask, ctx.constant(np.zeros((), mask.ttype.dtype.numpy), "zero")])])],
                {"to": DType.int32.value},
            )
            mask_index = ctx.op(
                "ReduceSum", [nonzero, _i64(ctx, [1], "axis")], {"keepdims": 0}, name=f"{ctx.name}/mask_index"
            )
        outs.append(mask_index)
    if len(wanted) > 2:
        outs.append(x if wanted[2] else None)
    return outs


# ---- attention ------------------------------------------------------------------------------------


def _additive(ctx: ConvertContext, keep: Value, like: Value, fill: float) -> Value:
    """Where(keep, 0, fill) in like's float type."""
    zero, neg = _float_const(ctx, 0.0, like, "zero"), _float_const(ctx, fill, like, "mask_filter")
    return ctx.op("Where", [keep, zero, neg], name=f"{ctx.name}/mask")


def _length_mask(ctx: ConvertContext, ends: Value, starts: Value | None, total: Value) -> Value:
    """keep[b, j] = starts[b] <= j < ends[b], as (B, 1, 1, T) booleans."""
    j = _arange(ctx, total, "key_positions")
    col = _i64(ctx, [1], "col_axis")
    keep = ctx.op("Less", [j, ctx.op("Unsqueeze", [ctx.op("Cast", [ends], {"to": DType.int64.value}), col])])
    if starts is not None:
        s = ctx.op("Unsqueeze", [ctx.op("Cast", [starts], {"to": DType.int64.value}), col])
        keep = ctx.op("And", [keep, ctx.op("Not", [ctx.op("Less", [j, s])])])
    return ctx.op("Unsqueeze", [keep, _i64(ctx, [1, 2], "head_axes")], name=f"{ctx.name}/key_mask")


def _attention_mask(
    ctx: ConvertContext,
    mask: Value | None,
    bias: Value | None,
    like: Value,
    total: Value,
    batch: int | str | None,
    *,
    allow_index2: bool,
) -> Value | None:
    """The additive attn_mask of ORT's mask (index or raw formats) plus attention_bias."""
    fill = float(ctx.attr("mask_filter_value", DEFAULT_MASK_FILTER))
    out = None
    if mask is not None:
        shape = _shape(mask)
        if len(shape) == 1:
            n = shape[0]
            two_b = isinstance(n, int) and isinstance(batch, int) and n == 2 * batch
            if isinstance(n, int) and isinstance(batch, int) and n == 3 * batch + 2:
                raise ctx.fail("a mask_index of shape (3 * batch + 2) is not supported")
            if two_b and not allow_index2:
                raise ctx.fail("a key_padding_mask of shape (2 * batch) is not supported")
            if not two_b and not (n == batch or not isinstance(n, int) or not isinstance(batch, int)):
                raise ctx.fail(f"a 1-D mask of {n} entries for batch {batch} is not a supported format")
            if two_b:
                ends, starts = _split_last(ctx, mask, [batch, batch], "mask_index")
                keep = _length_mask(ctx, ends, starts, total)
            else:
                keep = _length_mask(ctx, mask, None, total)
        elif len(shape) == 4:
            # Megatron's (batch, 1, max_seq, max_seq): ORT's CPU kernel has no definition to check against
            raise ctx.fail(f"a 4-D mask {shape} (Megatron's format) is not supported")
        elif len(shape) in (2, 3):
            zero = ctx.constant(np.zeros((), mask.ttype.dtype.numpy), "zero")
            keep = ctx.op("Not", [ctx.op("Equal", [mask, zero])])
            axes = [1, 2] if len(shape) == 2 else [1]
            keep = ctx.op("Unsqueeze", [keep, _i64(ctx, axes, "head_axes")], name=f"{ctx.name}/raw_mask")
        else:
            raise ctx.fail(f"mask of shape {shape} is not a supported format")
        out = _additive(ctx, keep, like, fill)
    if bias is not None:
        out = bias if out is None else ctx.op("Add", [out, bias], name=f"{ctx.name}/attention_bias")
    return out


def _attention(
    ctx: ConvertContext,
    q: Value,
    k: Value,
    v: Value,
    mask: Value | None,
    heads: int,
    kv_heads: int,
    head: int,
    *,
    causal: bool,
    past: tuple[Value, Value] | None = None,
    outputs: int = 1,
    extra: dict | None = None,
) -> list[Value]:
    scale = ctx.attr("scale")
    attrs = {
        "q_num_heads": heads,
        "kv_num_heads": kv_heads,
        "is_causal": int(causal),
        # ORT's default 1/sqrt(head_size), always explicit (as passes/fuse_attention.py writes it)
        "scale": float(scale) if scale else 1.0 / math.sqrt(head),
        **(extra or {}),
    }
    pk, pv = past if past is not None else (None, None)
    node = ctx.emit("Attention", [q, k, v, mask, pk, pv], attrs, outputs=outputs, name=f"{ctx.name}/Attention")
    return list(node.outputs)


def _present(ctx: ConvertContext, t: Value, heads: int, hint: str) -> Value:
    """A new (B, S, heads * H) K or V as the cache layout (B, heads, S, H). Without a past this is
    the present output; written outside the Attention node, which then keeps its single output Y
    (the form the CUDA attention kernel runs)."""
    t = ctx.op("Reshape", [t, _i64(ctx, [0, 0, heads, -1], "bsnh")], name=f"{ctx.name}/{hint}_bsnh")
    return ctx.op("Transpose", [t], {"perm": [0, 2, 1, 3]}, name=f"{ctx.name}/{hint}")


def _attention_with_present(
    ctx: ConvertContext,
    q: Value,
    k: Value,
    v: Value,
    mask: Value | None,
    heads: int,
    kv_heads: int,
    head: int,
    *,
    causal: bool,
    past: tuple[Value, Value] | None,
    want_present: bool,
    extra: dict | None = None,
) -> list[Value]:
    """[Y, present_key, present_value] (only Y when no present is wanted)."""
    if past is not None and want_present:
        return _attention(ctx, q, k, v, mask, heads, kv_heads, head, causal=causal, past=past, outputs=3, extra=extra)
    (y,) = _attention(ctx, q, k, v, mask, heads, kv_heads, head, causal=causal, past=past, extra=extra)
    if not want_present:
        return [y]
    return [y, _present(ctx, k, kv_heads, "present_key"), _present(ctx, v, kv_heads, "present_value")]


@converter("Attention", since=1, domain=MS)
def _ms_attention(ctx: ConvertContext) -> list[Value]:
    if ctx.attr("do_rotary", 0):
        raise ctx.fail("do_rotary=1 is not supported")
    if ctx.attr("past_present_share_buffer", 0):
        raise ctx.fail("past_present_share_buffer=1 is not supported")
    _refuse_inputs(ctx, {6: "past_sequence_length"})
    x, w = ctx.required_input(0, "input"), ctx.required_input(1, "weights")
    bias, mask, past, attn_bias = ctx.input(2), ctx.input(3), ctx.input(4), ctx.input(5)
    heads = int(ctx.attr("num_heads", 0))
    if heads <= 0:
        raise ctx.fail("num_heads must be positive")
    total_w = _static_dim(ctx, w, 1, "the weights' output size")
    sizes = [int(s) for s in ctx.attr("qkv_hidden_sizes", [])] or [total_w // 3] * 3
    if len(sizes) != 3 or sum(sizes) != total_w or any(s <= 0 or s % heads for s in sizes):
        raise ctx.fail(f"Q/K/V hidden sizes {sizes} must be 3 positive multiples of num_heads summing to {total_w}")
    if sizes[0] != sizes[1]:
        raise ctx.fail(f"Q and K hidden sizes differ ({sizes[0]}, {sizes[1]})")
    wk, bk = ctx.builder.known_value(w), None if bias is None else ctx.builder.known_value(bias)
    qkv: list[Value] = []
    if wk is not None and (bias is None or bk is not None):
        # Constant weights: one projection each, whose bias fuses into the GEMM's epilogue.
        start = 0
        for size, name in zip(sizes, "qkv", strict=True):
            p = ctx.op(
                "MatMul", [x, ctx.constant(wk[:, start : start + size], f"{name}_weight")], name=f"{ctx.name}/{name}"
            )
            if bias is not None:
                p = ctx.op(
                    "Add", [p, ctx.constant(bk[start : start + size], f"{name}_bias")], name=f"{ctx.name}/{name}_bias"
                )
            qkv.append(p)
            start += size
    else:
        packed = _add(ctx, ctx.op("MatMul", [x, w], name=f"{ctx.name}/qkv"), bias, "qkv_bias")
        qkv = _split_last(ctx, packed, sizes, "qkv")
    q, k, v = qkv
    head = sizes[0] // heads
    past_kv = None
    if past is not None:
        if sizes[1] != sizes[2]:
            raise ctx.fail("a past state needs equal K and V hidden sizes")
        pk, pv = (
            ctx.op("Squeeze", [t, _i64(ctx, [0], "axis")], name=f"{ctx.name}/past_{n}")
            for t, n in zip(_split_first(ctx, past), "kv", strict=True)
        )
        past_kv = (pk, pv)
    total = _dim(ctx, k, 1, "kv_seq")
    if past_kv is not None:
        total = ctx.op("Add", [total, _dim(ctx, past_kv[0], 2, "past_seq")], name=f"{ctx.name}/total_seq")
    batch = _shape(x)[0] if _shape(x) else None
    attn_mask = _attention_mask(ctx, mask, attn_bias, x, total, batch, allow_index2=True)
    wanted = _wanted(ctx)
    want_present = len(wanted) > 1 and wanted[1]
    outs = _attention_with_present(
        ctx, q, k, v, attn_mask, heads, heads, head,
        causal=bool(ctx.attr("unidirectional", 0)), past=past_kv, want_present=want_present,
    )  # fmt: skip
    if not want_present:
        return outs[:1]
    axis0 = _i64(ctx, [0], "axis")
    stacked = [
        ctx.op("Unsqueeze", [t, axis0], name=f"{ctx.name}/present_{n}") for t, n in zip(outs[1:], "kv", strict=True)
    ]
    return [outs[0], ctx.op("Concat", stacked, {"axis": 0}, name=f"{ctx.name}/present")]


def _split_first(ctx: ConvertContext, past: Value) -> list[Value]:
    node = ctx.emit("Split", [past, _i64(ctx, [1, 1], "past_split")], {"axis": 0}, outputs=2)
    return list(node.outputs)


def _bnsh_to_bsd(ctx: ConvertContext, t: Value, hint: str) -> Value:
    t = ctx.op("Transpose", [t], {"perm": [0, 2, 1, 3]}, name=f"{ctx.name}/{hint}_bsnh")
    return ctx.op("Reshape", [t, _i64(ctx, [0, 0, -1], "bsd")], name=f"{ctx.name}/{hint}_bsd")


def _unpack(ctx: ConvertContext, packed: Value, count: int, hint: str) -> list[Value]:
    """(B, S, N, count, H) -> count tensors (B, S, N * H)."""
    node = ctx.emit("Split", [packed, _i64(ctx, [1] * count, f"{hint}_split")], {"axis": 3}, outputs=count)
    return [
        ctx.op("Reshape", [t, _i64(ctx, [0, 0, -1], "bsd")], name=f"{ctx.name}/{hint}{i}")
        for i, t in enumerate(node.outputs)
    ]


@converter("MultiHeadAttention", since=1, domain=MS)
def _multi_head_attention(ctx: ConvertContext) -> list[Value]:
    _refuse_inputs(ctx, {8: "past_sequence_length", 9: "cache_indirection"})
    _refuse_outputs(ctx, {3: "qk"})
    q, k, v, bias = ctx.required_input(0, "query"), ctx.input(1), ctx.input(2), ctx.input(3)
    kpm, attn_bias, pk, pv = ctx.input(4), ctx.input(5), ctx.input(6), ctx.input(7)
    heads = int(ctx.attr("num_heads", 0))
    if heads <= 0:
        raise ctx.fail("num_heads must be positive")
    qr = _rank(ctx, q, "query")
    if qr == 5:
        if k is not None or v is not None or bias is not None:
            raise ctx.fail("packed QKV (5-D query) takes no key, value or bias")
        q, k, v = _unpack(ctx, q, 3, "qkv")
    elif qr != 3:
        raise ctx.fail(f"query must be 3-D or packed 5-D, got rank {qr}")
    else:
        if k is None:
            raise ctx.fail("input 1 (key) is required unless the query is packed QKV")
        kr = _rank(ctx, k, "key")
        if kr == 5:
            if v is not None or bias is not None:
                raise ctx.fail("packed KV (5-D key) takes no value or bias")
            k, v = _unpack(ctx, k, 2, "kv")
        elif kr == 4:
            if v is None or _rank(ctx, v, "value") != 4 or bias is not None:
                raise ctx.fail("4-D (BNSH) key needs a 4-D value and no bias")
            k, v = _bnsh_to_bsd(ctx, k, "key"), _bnsh_to_bsd(ctx, v, "value")
        elif kr == 3:
            if v is None:
                raise ctx.fail("input 2 (value) is required with a 3-D key")
        else:
            raise ctx.fail(f"key of rank {kr} is not supported")
    d = _static_dim(ctx, q, -1, "the query hidden size")
    if bias is not None:
        dv = _static_dim(ctx, v, -1, "the value hidden size")
        bq, bk, bv = _split_last(ctx, bias, [d, d, dv], "bias")
        q, k, v = (
            ctx.op("Add", [t, b], name=f"{ctx.name}/{n}_bias") for t, b, n in ((q, bq, "q"), (k, bk, "k"), (v, bv, "v"))
        )
    if d % heads:
        raise ctx.fail(f"query hidden size {d} is not a multiple of num_heads {heads}")
    if (pk is None) != (pv is None):
        raise ctx.fail("past_key and past_value must be given together")
    past = (pk, pv) if pk is not None else None
    total = _dim(ctx, k, 1, "kv_seq")
    if past is not None:
        total = ctx.op("Add", [total, _dim(ctx, pk, 2, "past_seq")], name=f"{ctx.name}/total_seq")
    batch = _shape(q)[0]
    attn_mask = _attention_mask(ctx, kpm, attn_bias, q, total, batch, allow_index2=False)
    wanted = _wanted(ctx)
    outs = _attention_with_present(
        ctx, q, k, v, attn_mask, heads, heads, d // heads,
        causal=bool(ctx.attr("unidirectional", 0)), past=past, want_present=any(wanted[1:3]),
    )  # fmt: skip
    return outs[: len(wanted)]


_GQA_REFUSED_INPUTS = {
    11: "head_sink",
    12: "k_scale",
    13: "v_scale",
    14: "q_norm_weight",
    15: "k_norm_weight",
    16: "query_seqlens",
}


@converter("GroupQueryAttention", since=1, domain=MS)
def _group_query_attention(ctx: ConvertContext) -> list[Value]:
    _refuse_inputs(ctx, _GQA_REFUSED_INPUTS)
    _refuse_outputs(ctx, {3: "output_qk"})
    for attr, ok in (("smooth_softmax", (-1, 0)), ("qk_output", (0,)), ("sliding_window_cache", (0,))):
        if int(ctx.attr(attr, ok[0])) not in ok:
            raise ctx.fail(f"{attr}={ctx.attr(attr)} is not supported")
    if ctx.attr("k_quant_type", "NONE") != "NONE" or ctx.attr("v_quant_type", "NONE") != "NONE":
        raise ctx.fail("a quantized KV cache is not supported")
    q, k, v = ctx.required_input(0, "query"), ctx.input(1), ctx.input(2)
    pk, pv = ctx.input(3), ctx.input(4)
    seqlens = ctx.required_input(5, "seqlens_k")
    cos, sin, pos_ids, attn_bias = ctx.input(7), ctx.input(8), ctx.input(9), ctx.input(10)
    heads, kv_heads = int(ctx.attr("num_heads", 0)), int(ctx.attr("kv_num_heads", 0))
    if heads <= 0 or kv_heads <= 0 or heads % kv_heads:
        raise ctx.fail(f"num_heads {heads} must be a positive multiple of kv_num_heads {kv_heads}")
    for t, what in ((pk, "past_key"), (pv, "past_value")):
        if t is not None and _shape(t) and _shape(t)[2] != 0:
            raise ctx.fail(
                f"{what} of shape {_shape(t)}: only the prompt phase (no or an empty past) is supported; "
                "token generation with a KV cache is not"
            )
    if k is None:
        if v is not None:
            raise ctx.fail("value without key")
        d_total = _static_dim(ctx, q, -1, "the packed QKV size")
        head = d_total // (heads + 2 * kv_heads)
        if head * (heads + 2 * kv_heads) != d_total:
            raise ctx.fail(f"packed QKV size {d_total} is not (num_heads + 2 * kv_num_heads) * head_size")
        q, k, v = _split_last(ctx, q, [heads * head, kv_heads * head, kv_heads * head], "qkv")
    else:
        if v is None:
            raise ctx.fail("key without value")
        head = _static_dim(ctx, q, -1, "the query hidden size") // heads
    seq = _dim(ctx, q, 1, "seq")
    if int(ctx.attr("do_rotary", 0)):
        if cos is None or sin is None:
            raise ctx.fail("do_rotary=1 needs cos_cache and sin_cache")
        q = _rotary(ctx, q, cos, sin, pos_ids, seq, heads, head, "q")
        k = _rotary(ctx, k, cos, sin, pos_ids, seq, kv_heads, head, "k")
    causal = int(ctx.attr("causal", 1))
    window = int(ctx.attr("local_window_size", -1))
    extra = {"softcap": float(ctx.attr("softcap", 0.0))}
    if window >= 0:
        if not causal:
            raise ctx.fail("local_window_size needs causal=1")
        extra["left_window_size"] = window - 1  # ORT: the window holds window keys, i - window + 1 .. i
    # seqlens_k[b] + 1 keys are valid (right padding); a constant full length needs no mask.
    known = ctx.builder.known_value(seqlens)
    seq_n = ctx.builder.known_value(seq)
    full = known is not None and seq_n is not None and np.all(np.asarray(known) + 1 == int(seq_n[0]))
    batch = _shape(q)[0]
    if full:
        attn_mask = _attention_mask(ctx, None, attn_bias, q, seq, batch, allow_index2=False)
    else:
        ends = ctx.op("Add", [ctx.op("Cast", [seqlens], {"to": DType.int64.value}), _i64(ctx, 1, "one")])
        keep = _length_mask(ctx, ends, None, seq)
        attn_mask = keep if attn_bias is None else ctx.op("Add", [_additive(ctx, keep, q, -math.inf), attn_bias])
    wanted = _wanted(ctx)
    outs = _attention_with_present(
        ctx, q, k, v, attn_mask, heads, kv_heads, head,
        causal=bool(causal), past=None, want_present=any(wanted[1:3]), extra=extra,
    )  # fmt: skip
    return outs[: len(wanted)]


def _rotary(
    ctx: ConvertContext,
    x: Value,
    cos: Value,
    sin: Value,
    pos_ids: Value | None,
    seq: Value,
    heads: int,
    head: int,
    hint: str,
    interleaved: int | None = None,
) -> Value:
    """ONNX RotaryEmbedding of a (B, S, heads * head) tensor with (max_pos, rot / 2) caches."""
    if pos_ids is None:
        ids = _arange(ctx, seq, f"{hint}_positions")
        pos_ids = ctx.op("Unsqueeze", [ids, _i64(ctx, [0], "batch_axis")], name=f"{ctx.name}/{hint}_position_ids")
        batch = _dim(ctx, x, 0, "batch")
        pos_ids = ctx.op("Expand", [pos_ids, ctx.op("Concat", [batch, seq], {"axis": 0})])
    elif pos_ids.ttype.dtype != DType.int64:
        pos_ids = ctx.op("Cast", [pos_ids], {"to": DType.int64.value})
    half = _static_dim(ctx, cos, -1, "the cos_cache width")
    attrs = {
        "interleaved": int(ctx.attr("rotary_interleaved", 0)) if interleaved is None else interleaved,
        "num_heads": heads,
        "rotary_embedding_dim": 0 if 2 * half == head else 2 * half,
    }
    return ctx.op("RotaryEmbedding", [x, cos, sin, pos_ids], attrs, name=f"{ctx.name}/{hint}_rotary")


@converter("RotaryEmbedding", since=1, domain=MS)
def _ms_rotary(ctx: ConvertContext) -> list[Value]:
    if int(ctx.attr("is_packed_batching", 0)):
        raise ctx.fail("is_packed_batching=1 is not supported")
    if float(ctx.attr("scale", 1.0)) != 1.0:
        raise ctx.fail(f"scale={ctx.attr('scale')} is not supported (only 1.0)")
    roles = ("input", "position_ids", "cos_cache", "sin_cache")
    x, pos, cos, sin = (ctx.required_input(i, n) for i, n in enumerate(roles))
    half = _static_dim(ctx, cos, -1, "the cos_cache width")
    rot = int(ctx.attr("rotary_embedding_dim", 0))
    heads = int(ctx.attr("num_heads", 0))
    rank = _rank(ctx, x, "input")
    if rank == 3:
        hidden = _static_dim(ctx, x, -1, "the hidden size")
        head = hidden // heads if heads else 2 * half  # no num_heads: the caches span whole heads
        heads = heads or hidden // head
        if heads * head != hidden:
            raise ctx.fail(f"hidden size {hidden} is not num_heads * head_size")
    elif rank == 4:
        head = _static_dim(ctx, x, -1, "the head size")
    else:
        raise ctx.fail(f"input must be 3-D or 4-D, got rank {rank}")
    if rot and rot != 2 * half:
        raise ctx.fail(f"rotary_embedding_dim {rot} disagrees with the caches' width {half}")
    seq = _dim(ctx, x, 1 if rank == 3 else 2, "seq")
    if _rank(ctx, pos, "position_ids") == 1:  # (1): an offset added to 0..S-1
        ids = ctx.op("Add", [_arange(ctx, seq, "positions"), ctx.op("Cast", [pos], {"to": DType.int64.value})])
        batch = _dim(ctx, x, 0, "batch")
        pos = ctx.op(
            "Expand", [ctx.op("Unsqueeze", [ids, _i64(ctx, [0], "axis")]), ctx.op("Concat", [batch, seq], {"axis": 0})]
        )
    elif pos.ttype.dtype != DType.int64:
        pos = ctx.op("Cast", [pos], {"to": DType.int64.value})
    attrs = {
        "interleaved": int(ctx.attr("interleaved", 0)),
        "rotary_embedding_dim": 0 if 2 * half == head else 2 * half,
    }
    if rank == 3:
        attrs["num_heads"] = heads
    return [ctx.op("RotaryEmbedding", [x, cos, sin, pos], attrs, name=ctx.name)]


# ---- quantized matmuls ----------------------------------------------------------------------------


def _unpack_bits(packed: np.ndarray, bits: int) -> np.ndarray:
    """uint8 bytes -> their `8 // bits` fields each, low bits first, along the last axis."""
    per = 8 // bits
    shifts = (np.arange(per, dtype=np.uint8) * bits).astype(np.uint8)
    fields = (packed[..., None] >> shifts) & np.uint8((1 << bits) - 1)
    return fields.reshape(*packed.shape[:-1], packed.shape[-1] * per)


@converter("MatMulNBits", since=1, domain=MS)
def _matmul_nbits(ctx: ConvertContext) -> list[Value]:
    _refuse_inputs(ctx, {4: "g_idx (deprecated)"})
    if int(ctx.attr("weight_prepacked", 0)):
        raise ctx.fail("prepacked weights are not supported")
    a = ctx.required_input(0, "A")
    k_dim, n_dim = int(ctx.attr("K", 0)), int(ctx.attr("N", 0))
    bits, block = int(ctx.attr("bits", 4)), int(ctx.attr("block_size", 0))
    if bits not in (2, 4, 8):
        raise ctx.fail(f"bits={bits} is not supported (2, 4 or 8)")
    if block < 16 or block & (block - 1):
        raise ctx.fail(f"block_size={block} must be a power of 2 of at least 16")
    arrays = []
    for i, what in ((1, "B"), (2, "scales"), (3, "zero_points")):
        t = ctx.input(i)
        known = None if t is None else ctx.builder.known_value(t)
        if t is not None and known is None:
            raise ctx.fail(f"input {i} ({what}) must be a constant (it is dequantized at load)")
        arrays.append(known)
    b, scales, zp = arrays
    k_blocks = -(-k_dim // block)
    if b is None or b.dtype != np.uint8 or b.size != n_dim * k_blocks * block * bits // 8:
        raise ctx.fail(f"B must be uint8 of shape ({n_dim}, {k_blocks}, {block * bits // 8})")
    q = _unpack_bits(b.reshape(n_dim, k_blocks, -1), bits).astype(np.float32)  # (N, blocks, block)
    s = np.asarray(scales, dtype=np.float32).reshape(n_dim, k_blocks, 1)
    if zp is None:
        z = np.full((n_dim, k_blocks, 1), float(1 << (bits - 1)), np.float32)
    elif zp.dtype == np.uint8:
        z = _unpack_bits(zp.reshape(n_dim, -1), bits)[:, :k_blocks].astype(np.float32)[..., None]
    else:
        z = np.asarray(zp, dtype=np.float32).reshape(n_dim, k_blocks, 1)
    w = ((q - z) * s).reshape(n_dim, -1)[:, :k_dim].T  # (K, N)
    dt = a.ttype.dtype.numpy
    log.info(
        "%s: MatMulNBits weight (%d x %d, %d-bit) dequantized to %s at load (%d bytes -> %d)",
        ctx.name, k_dim, n_dim, bits, np.dtype(dt).name, b.size, w.size * np.dtype(dt).itemsize,
    )  # fmt: skip
    y = ctx.op("MatMul", [a, ctx.constant(np.ascontiguousarray(w.astype(dt)), "weight")], name=f"{ctx.name}/MatMul")
    return [_add(ctx, y, ctx.input(5), "bias")]


def _dynamic_quantize(ctx: ConvertContext, a: Value) -> Value:
    """A through uint8 and back, as DynamicQuantizeLinear + DequantizeLinear compute it."""
    c = lambda val, hint: _float_const(ctx, val, a, hint)  # noqa: E731
    lo = ctx.op("Min", [ctx.op("ReduceMin", [a], {"keepdims": 0}), c(0.0, "zero")], name=f"{ctx.name}/rmin")
    hi = ctx.op("Max", [ctx.op("ReduceMax", [a], {"keepdims": 0}), c(0.0, "zero")], name=f"{ctx.name}/rmax")
    scale = ctx.op("Div", [ctx.op("Sub", [hi, lo]), c(255.0, "qrange")], name=f"{ctx.name}/a_scale")
    # An all-zero A has range 0: any scale gives q = zp; 1 avoids dividing by zero.
    scale = ctx.op("Where", [ctx.op("Equal", [scale, c(0.0, "zero")]), c(1.0, "one"), scale])
    zp = ctx.op(
        "Clip", [ctx.op("Round", [ctx.op("Neg", [ctx.op("Div", [lo, scale])])]), c(0.0, "q0"), c(255.0, "q255")]
    )
    q = ctx.op(
        "Clip", [ctx.op("Add", [ctx.op("Round", [ctx.op("Div", [a, scale])]), zp]), c(0.0, "q0"), c(255.0, "q255")]
    )
    return ctx.op("Mul", [ctx.op("Sub", [q, zp]), scale], name=f"{ctx.name}/a_dequantized")


def _dequantize_b(ctx: ConvertContext, b: Value, scale: Value, zp: Value | None) -> Value:
    axis = _rank(ctx, b, "B") - 1  # a 1-D scale is per column of B
    return ctx.op("DequantizeLinear", [b, scale, zp], {"axis": axis}, name=f"{ctx.name}/b_dequantized")


@converter("DynamicQuantizeMatMul", since=1, domain=MS)
def _dynamic_quantize_matmul(ctx: ConvertContext) -> list[Value]:
    a, b, b_scale = ctx.required_input(0, "A"), ctx.required_input(1, "B"), ctx.required_input(2, "b_scale")
    y = ctx.op(
        "MatMul", [_dynamic_quantize(ctx, a), _dequantize_b(ctx, b, b_scale, ctx.input(3))], name=f"{ctx.name}/MatMul"
    )
    return [_add(ctx, y, ctx.input(4), "bias")]


@converter("MatMulIntegerToFloat", since=1, domain=MS)
def _matmul_integer_to_float(ctx: ConvertContext) -> list[Value]:
    a, b = ctx.required_input(0, "A"), ctx.required_input(1, "B")
    a_scale, b_scale = ctx.required_input(2, "a_scale"), ctx.required_input(3, "b_scale")
    ad = ctx.op("DequantizeLinear", [a, a_scale, ctx.input(4)], {"axis": -1}, name=f"{ctx.name}/a_dequantized")
    y = ctx.op("MatMul", [ad, _dequantize_b(ctx, b, b_scale, ctx.input(5))], name=f"{ctx.name}/MatMul")
    return [_add(ctx, y, ctx.input(6), "bias")]


@converter("DynamicQuantizeLSTM", since=1, domain=MS)
def _dynamic_quantize_lstm(ctx: ConvertContext) -> list[Value]:
    """ONNX Runtime's quantized LSTM: the IR op of the same name, whose reference
    (graphc.runtime.reference.recurrent.dynamic_quantize_lstm) quantizes X and each step's h
    as ONNX Runtime does. activation_alpha/beta have no field there: refused when given. The CUDA
    target unrolls it into integer-valued GEMMs and gate arithmetic (passes/lower_int_quant.py)."""
    for name in ("activation_alpha", "activation_beta", "layout"):
        if ctx.attr(name):
            raise ctx.fail(f"attribute '{name}' is not supported")
    acts = ctx.attr("activations") or ()
    attrs = {
        "activations": ",".join(a.decode() if isinstance(a, bytes) else str(a) for a in acts),
        "clip": float(ctx.attr("clip") or 0.0),
        "direction": (lambda d: d.decode() if isinstance(d, bytes) else str(d))(ctx.attr("direction") or "forward"),
        "hidden_size": int(ctx.attr("hidden_size") or 0),
        "input_forget": int(ctx.attr("input_forget") or 0),
    }
    node = ctx.emit("DynamicQuantizeLSTM", ctx.inputs, attrs, outputs=ctx.output_names, name=ctx.name, domain=MS)
    return list(node.outputs)
