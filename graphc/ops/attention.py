"""Attention ops: Attention (scaled dot-product attention, ONNX opset 23-25) and RotaryEmbedding.

Attention's IR form is the newest ONNX version (25: sliding windows, nonpad_kv_seqlen). Older
versions are subsets of it with the same meaning, so they pass through unchanged.

Numerics: float16/bfloat16 inputs are computed in float32 throughout (QK matmul, softcap, bias,
softmax, PV matmul) and rounded to the input precision once, at the outputs: the result an fp16
kernel with fp32 accumulation gives, and the most accurate one. Only sqrt(scale) is rounded to T1
first, as the spec's function body does. Softmax never runs below float32, whatever
softmax_precision asks (it may ask for more: float64).

graphc's own attribute (no ONNX file carries it; passes/fuse_attention.py sets it): masked_rows,
what a query row with no kept key stores (no key left by the mask, is_causal, the windows and the
key lengths together). "zero" (the default): 0, as the spec says. "mean": the mean of V over all
keys of its (batch, kv head), the uniform softmax that a finite mask fill (finfo.min) gives such a
row in the decomposed graph and in ONNX Runtime. "nan": NaN, the softmax of a row of -inf that a
-inf fill with no NaN guard gives there (ONNX Runtime too).

This module holds type inference and traits; the numpy kernels are in
graphc.runtime.reference.attention.
"""

from __future__ import annotations

from dataclasses import dataclass

from graphc.ir.attrs import onnx_attrs_class
from graphc.ir.types import Dim, DType, TensorType
from graphc.ops.registry import Category, InferContext, register_op

_FLOATS = (DType.float16, DType.bfloat16, DType.float32, DType.float64)
_MASK_DTYPES = (
    *_FLOATS,
    DType.bool,
    DType.uint8,
    DType.uint16,
    DType.uint32,
    DType.uint64,
    DType.int8,
    DType.int16,
    DType.int32,
    DType.int64,
)
# softmax_precision codes the spec allows (TensorProto FLOAT, FLOAT16, DOUBLE, BFLOAT16).
_SOFTMAX_PRECISIONS = (1, 10, 11, 16)


MASKED_ROWS = ("zero", "mean", "nan")


@dataclass(frozen=True, kw_only=True)
class AttentionAttrs(onnx_attrs_class("Attention")):  # type: ignore[misc]
    """ONNX Attention's attributes (from onnx.defs) and graphc's masked_rows (module notes)."""

    masked_rows: str = "zero"


# ---- dim arithmetic over int | str | None ------------------------------------------------------


def _merge(ctx: InferContext, what: str, *dims: Dim) -> Dim:
    """Dims that must be equal: a concrete one wins, a conflict fails."""
    ints = {d for d in dims if isinstance(d, int)}
    if len(ints) > 1:
        ctx.fail(f"{what} disagree: {', '.join(str(d) for d in dims)}")
    if ints:
        return ints.pop()
    strs = {d for d in dims if isinstance(d, str)}
    return strs.pop() if len(strs) == 1 else None


def _add(a: Dim, b: Dim) -> Dim:
    if isinstance(a, int) and isinstance(b, int):
        return a + b
    if b == 0:
        return a
    return None


def _mul(a: Dim, b: Dim) -> Dim:
    if isinstance(a, int) and isinstance(b, int):
        return a * b
    if a == 1:
        return b
    if b == 1:
        return a
    return None


def _div(ctx: InferContext, a: Dim, b: int, what: str) -> Dim:
    if isinstance(a, int):
        if a % b:
            ctx.fail(f"{what} {a} is not divisible by {b}")
        return a // b
    return a if b == 1 else None


# ---- Attention ---------------------------------------------------------------------------------


def _attention_infer(ctx: InferContext) -> list[TensorType]:
    a = ctx.attrs
    qt, kt, vt = ctx.type(0), ctx.type(1), ctx.type(2)
    for i, t in enumerate((qt, kt, vt)):
        if t.dtype not in _FLOATS:
            ctx.fail(f"input {i} has dtype {t.dtype.name}; Q, K and V must be float tensors")
    if kt.dtype != qt.dtype:
        ctx.fail(f"K has dtype {kt.dtype.name}, Q has {qt.dtype.name} (both are T1)")
    rank = ctx.rank(0)
    if rank not in (3, 4) or ctx.rank(1) != rank or ctx.rank(2) != rank:
        ctx.fail(f"Q, K and V must all be 3-D or all 4-D, got {qt}, {kt}, {vt}")
    if a.qk_matmul_output_mode not in (0, 1, 2, 3):
        ctx.fail(f"qk_matmul_output_mode must be 0, 1, 2 or 3, got {a.qk_matmul_output_mode}")
    if a.left_window_size < -1 or a.right_window_size < -1:
        ctx.fail("left_window_size and right_window_size must be -1 or nonnegative")
    if a.softmax_precision is not None and a.softmax_precision not in _SOFTMAX_PRECISIONS:
        ctx.fail(f"softmax_precision {a.softmax_precision} is not one of {_SOFTMAX_PRECISIONS}")
    if a.masked_rows not in MASKED_ROWS:
        ctx.fail(f"masked_rows must be one of {MASKED_ROWS}, got {a.masked_rows!r}")

    if rank == 3:
        if a.q_num_heads is None or a.kv_num_heads is None:
            ctx.fail("3-D Q, K, V need the q_num_heads and kv_num_heads attributes")
        qh, kvh = a.q_num_heads, a.kv_num_heads
        if qh <= 0 or kvh <= 0:
            ctx.fail(f"q_num_heads {qh} and kv_num_heads {kvh} must be positive")
        (qb, sq, qhid), (kb, skv, khid), (vb, vskv, vhid) = qt.shape, kt.shape, vt.shape
        head = _merge(
            ctx,
            "Q and K head sizes",
            _div(ctx, qhid, qh, "Q hidden size"),
            _div(ctx, khid, kvh, "K hidden size"),
        )
        vhead = _div(ctx, vhid, kvh, "V hidden size")
    else:
        qb, qh, sq, qhead = qt.shape
        kb, kvh, skv, khead = kt.shape
        vb, vkvh, vskv, vhead = vt.shape
        # Opset 23/24 let 4-D inputs carry the head-count attributes; they must agree.
        qh = _merge(ctx, "q_num_heads and Q's head dim", qh, a.q_num_heads)
        kvh = _merge(ctx, "K and V head counts (and kv_num_heads)", kvh, vkvh, a.kv_num_heads)
        head = _merge(ctx, "Q and K head sizes", qhead, khead)
    batch = _merge(ctx, "batch sizes of Q, K and V", qb, kb, vb)
    skv = _merge(ctx, "sequence lengths of K and V", skv, vskv)
    if isinstance(qh, int) and isinstance(kvh, int) and qh % kvh:
        ctx.fail(f"q_num_heads {qh} is not a multiple of kv_num_heads {kvh}")

    total = skv
    if ctx.has_input(4) != ctx.has_input(5):
        ctx.fail("past_key and past_value must be given together")
    if ctx.has_input(4):
        pk, pv = ctx.type(4), ctx.type(5)
        if ctx.rank(4) != 4 or ctx.rank(5) != 4:
            ctx.fail(f"past_key and past_value must be 4-D, got {pk} and {pv}")
        if pk.dtype != qt.dtype or pv.dtype != vt.dtype:
            ctx.fail(f"past_key/past_value dtypes {pk.dtype.name}/{pv.dtype.name} differ from K/V")
        batch = _merge(ctx, "batch sizes of Q and the past cache", batch, pk.shape[0], pv.shape[0])
        kvh = _merge(ctx, "kv head counts of K and the past cache", kvh, pk.shape[1], pv.shape[1])
        past = _merge(ctx, "past_key and past_value lengths", pk.shape[2], pv.shape[2])
        head = _merge(ctx, "head sizes of K and past_key", head, pk.shape[3])
        vhead = _merge(ctx, "head sizes of V and past_value", vhead, pv.shape[3])
        total = _add(past, skv)
    if ctx.has_input(6):
        if ctx.has_input(4):
            ctx.fail("nonpad_kv_seqlen cannot be combined with past_key/past_value")
        nt = ctx.type(6)
        if nt.dtype != DType.int64 or ctx.rank(6) != 1:
            ctx.fail(f"nonpad_kv_seqlen must be a 1-D int64 tensor, got {nt}")
        batch = _merge(ctx, "batch size and nonpad_kv_seqlen length", batch, nt.shape[0])
    if ctx.has_input(3):
        _check_mask(ctx, ctx.type(3), (batch, qh, sq, total))

    dt1 = qt.dtype
    if rank == 3:
        hidden = _mul(qh, vhead)
        if hidden is None and qh == kvh:
            hidden = vt.shape[2]
        y = TensorType(dt1, (batch, sq, hidden))
    else:
        y = TensorType(dt1, (batch, qh, sq, vhead))
    outs = [
        y,
        TensorType(dt1, (batch, kvh, total, head)),
        TensorType(vt.dtype, (batch, kvh, total, vhead)),
        TensorType(dt1, (batch, qh, sq, total)),
    ]
    if ctx.num_outputs > len(outs):
        ctx.fail(f"{ctx.num_outputs} outputs asked, Attention has 4")
    return outs[: max(ctx.num_outputs, 1)]


def _check_mask(ctx: InferContext, mt: TensorType, full: tuple[Dim, ...]) -> None:
    """attn_mask broadcasts (right-aligned) to (batch, q_heads, q_seq, total); its last dim may
    be shorter than total (padded with -inf), never longer."""
    if mt.dtype not in _MASK_DTYPES:
        ctx.fail(f"attn_mask has dtype {mt.dtype.name}")
    if mt.shape is None:
        return
    if not 1 <= len(mt.shape) <= 4:
        ctx.fail(f"attn_mask must have rank 1 to 4, got {mt}")
    last, total = mt.shape[-1], full[3]
    if isinstance(last, int) and isinstance(total, int) and last > total:
        ctx.fail(f"attn_mask's last dim {last} exceeds the total sequence length {total}")
    for d, f in zip(reversed(mt.shape[:-1]), reversed(full[:3]), strict=False):
        if isinstance(d, int) and isinstance(f, int) and d not in (1, f):
            ctx.fail(f"attn_mask {mt} does not broadcast to {tuple(full)}")


register_op(
    "Attention",
    attrs=AttentionAttrs,
    category=Category.OTHER,
    infer=_attention_infer,
    doc="Scaled dot-product attention (MHA/GQA/MQA), KV cache, causal/window masks, softcap.",
)

# ---- RotaryEmbedding ---------------------------------------------------------------------------


def _rotary_infer(ctx: InferContext) -> list[TensorType]:
    a = ctx.attrs
    xt, ct, st = ctx.type(0), ctx.type(1), ctx.type(2)
    if xt.dtype not in (DType.float32, DType.float16, DType.bfloat16):
        ctx.fail(f"X has dtype {xt.dtype.name}; RotaryEmbedding takes float, float16 or bfloat16")
    if ct.dtype != xt.dtype or st.dtype != xt.dtype:
        ctx.fail(f"cos_cache/sin_cache dtypes {ct.dtype.name}/{st.dtype.name} differ from X's")
    rank = ctx.rank(0)
    if rank == 4:
        batch, _, seq, head = xt.shape
    elif rank == 3:
        if a.num_heads is None or a.num_heads <= 0:
            ctx.fail("a 3-D input needs a positive num_heads attribute")
        batch, seq, hidden = xt.shape
        head = _div(ctx, hidden, a.num_heads, "hidden size")
    else:
        ctx.fail(f"X must be 3-D or 4-D, got {xt}")
    rot = a.rotary_embedding_dim or head
    if isinstance(rot, int):
        if rot % 2:
            ctx.fail(f"rotary dim {rot} must be even")
        if isinstance(head, int) and rot > head:
            ctx.fail(f"rotary_embedding_dim {rot} exceeds the head size {head}")
    if ctx.has_input(3):
        pt = ctx.type(3)
        if pt.dtype != DType.int64 or ctx.rank(3) != 2:
            ctx.fail(f"position_ids must be a 2-D int64 tensor, got {pt}")
        _merge(ctx, "batch sizes of X and position_ids", batch, pt.shape[0])
        _merge(ctx, "sequence lengths of X and position_ids", seq, pt.shape[1])
        want_rank = 2
    else:
        want_rank = 3
    for name, i in (("cos_cache", 1), ("sin_cache", 2)):
        t = ctx.type(i)
        if ctx.rank(i) != want_rank:
            ctx.fail(f"{name} must be {want_rank}-D {'with' if want_rank == 2 else 'without'} position_ids")
        if want_rank == 3:
            _merge(ctx, f"batch sizes of X and {name}", batch, t.shape[0])
            _merge(ctx, f"sequence lengths of X and {name}", seq, t.shape[1])
        half = rot // 2 if isinstance(rot, int) else None
        _merge(ctx, f"{name}'s last dim and rotary dim / 2", t.shape[-1], half)
    return [xt]


register_op(
    "RotaryEmbedding",
    category=Category.OTHER,
    infer=_rotary_infer,
    doc="Rotary positional embedding (RoPE), half-split or interleaved, full or partial.",
)

# ---- LinearAttention ---------------------------------------------------------------------------

_UPDATE_RULES = ("linear", "gated", "delta", "gated_delta")
_LOW_FLOATS = (DType.float16, DType.bfloat16, DType.float32)


def _linear_attention_infer(ctx: InferContext) -> list[TensorType]:
    a = ctx.attrs
    if a.update_rule not in _UPDATE_RULES:
        ctx.fail(f"update_rule must be one of {_UPDATE_RULES}, got {a.update_rule!r}")
    qh, kvh = a.q_num_heads, a.kv_num_heads
    if qh <= 0 or kvh <= 0 or qh % kvh:
        ctx.fail(f"q_num_heads {qh} must be a positive multiple of kv_num_heads {kvh}")
    qt, kt, vt = ctx.type(0), ctx.type(1), ctx.type(2)
    if qt.dtype not in _LOW_FLOATS or kt.dtype != qt.dtype or vt.dtype != qt.dtype:
        ctx.fail(f"query, key and value must share one of float16/bfloat16/float32, got {qt}, {kt}, {vt}")
    for i in range(3):
        if ctx.rank(i) != 3:
            ctx.fail(f"input {i} must be 3-D (batch, seq, heads * size), got {ctx.type(i)}")
    batch = _merge(ctx, "batch sizes of query, key and value", qt.shape[0], kt.shape[0], vt.shape[0])
    seq = _merge(ctx, "sequence lengths of query, key and value", qt.shape[1], kt.shape[1], vt.shape[1])
    dk = _merge(
        ctx,
        "query and key head sizes",
        _div(ctx, qt.shape[2], qh, "query hidden size"),
        _div(ctx, kt.shape[2], kvh, "key hidden size"),
    )
    dv = _div(ctx, vt.shape[2], kvh, "value hidden size")
    state_dtype = qt.dtype
    if ctx.has_input(3):
        st = ctx.type(3)
        if st.dtype not in _LOW_FLOATS or ctx.rank(3) != 4:
            ctx.fail(f"past_state must be a 4-D float tensor, got {st}")
        for what, d, want in zip(("batch", "kv heads", "d_k", "d_v"), st.shape, (batch, kvh, dk, dv), strict=True):
            _merge(ctx, f"past_state's {what} and the inputs'", d, want)
        state_dtype = st.dtype
    gating = a.update_rule in ("gated", "gated_delta")
    delta = a.update_rule in ("delta", "gated_delta")
    for i, name, needed, lasts in (
        (4, "decay", gating, (kvh, _mul(kvh, dk))),
        (5, "beta", delta, (kvh, 1)),
    ):
        if ctx.has_input(i) != needed:
            ctx.fail(f"update_rule {a.update_rule!r} {'requires' if needed else 'forbids'} the {name} input")
        if needed:
            t = ctx.type(i)
            if t.dtype != qt.dtype or ctx.rank(i) != 3:
                ctx.fail(f"{name} must be a 3-D tensor of the query's dtype, got {t}")
            _merge(ctx, f"batch sizes of {name} and query", t.shape[0], batch)
            _merge(ctx, f"sequence lengths of {name} and query", t.shape[1], seq)
            last = t.shape[2]
            if isinstance(last, int) and all(isinstance(x, int) for x in lasts) and last not in lasts:
                ctx.fail(f"{name}'s last dim {last} must be one of {sorted(set(lasts))}")
    return [
        TensorType(qt.dtype, (batch, seq, _mul(qh, dv))),
        TensorType(state_dtype, (batch, kvh, dk, dv)),
    ][: max(ctx.num_outputs, 1)]


register_op(
    "LinearAttention",
    category=Category.OTHER,
    infer=_linear_attention_infer,
    doc="Recurrent linear attention (linear, gated, delta, gated_delta rules) with a state cache.",
)
