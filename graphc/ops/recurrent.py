"""Recurrent ops: LSTM, GRU, RNN (the ONNX opset 14/22 forms; the frontend converts older ones).

Type inference checks every input's rank and the sizes they share (directions, gates times
hidden size, input size, batch), the attributes (direction, activations and their count,
layout, hidden_size against R) and gives Y [S, D, B, H] and Y_h (LSTM also Y_c) [D, B, H], or
with layout=1 Y [B, S, D, H] and the states [B, D, H]. The numpy kernels are in
graphc.runtime.reference.recurrent, which also holds the activation tables.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from graphc.ir.attrs import Attrs
from graphc.ir.types import DType, TensorType
from graphc.ops.registry import Category, InferContext, register_op
from graphc.runtime.reference.recurrent import (
    NUM_GATES,
    RecurrentAttrError,
    num_directions,
    resolve_activations,
)

# Input names per position, for messages.
INPUT_NAMES = ("X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P")


def _dims_agree(ctx: InferContext, what: str, a: object, b: object) -> None:
    if isinstance(a, int) and isinstance(b, int) and a != b:
        ctx.fail(f"{what}: {a} != {b}")


def _check_shape(ctx: InferContext, i: int, expected: tuple, dtype: DType) -> None:
    """Optional input i, if present, has `expected` dims (None: any) and dtype."""
    if not ctx.has_input(i):
        return
    t = ctx.type(i)
    name = INPUT_NAMES[i]
    if t.dtype != dtype:
        ctx.fail(f"{name} must be {dtype.name} like X, got {t.dtype.name}")
    if t.shape is None:
        return
    if len(t.shape) != len(expected):
        ctx.fail(f"{name} must have rank {len(expected)}, got {t}")
    for k, (got, want) in enumerate(zip(t.shape, expected, strict=True)):
        _dims_agree(ctx, f"{name} dim {k}", got, want)


def _infer(op: str):
    gates = NUM_GATES[op]
    num_out = 3 if op == "LSTM" else 2

    def infer(ctx: InferContext) -> list[TensorType]:
        a = ctx.attrs
        try:
            dirs = num_directions(a.direction)
            resolve_activations(op, a, dirs)
        except RecurrentAttrError as e:
            ctx.fail(str(e))
        if a.layout not in (0, 1):
            ctx.fail(f"layout must be 0 or 1, got {a.layout}")
        if ctx.num_outputs > num_out:
            ctx.fail(f"{op} has {num_out} outputs, {ctx.num_outputs} asked for")
        if op == "LSTM" and a.input_forget not in (0, 1):
            ctx.fail(f"input_forget must be 0 or 1, got {a.input_forget}")
        if op == "GRU" and a.linear_before_reset not in (0, 1):
            ctx.fail(f"linear_before_reset must be 0 or 1, got {a.linear_before_reset}")
        if a.clip is not None and not a.clip > 0:
            ctx.fail(f"clip must be positive, got {a.clip}")
        x, w, r = ctx.type(0), ctx.type(1), ctx.type(2)
        if not x.dtype.is_float:
            ctx.fail(f"X must be a float tensor, got {x.dtype.name}")
        for i, t in ((1, w), (2, r)):
            if t.dtype != x.dtype:
                ctx.fail(f"{INPUT_NAMES[i]} must be {x.dtype.name} like X, got {t.dtype.name}")
            if t.shape is not None and len(t.shape) != 3:
                ctx.fail(f"{INPUT_NAMES[i]} must have rank 3, got {t}")
        if x.shape is not None and len(x.shape) != 3:
            ctx.fail(f"X must have rank 3, got {x}")
        seq, batch, isize = (None, None, None) if x.shape is None else x.shape
        if a.layout == 1:
            seq, batch = batch, seq
        hs = a.hidden_size
        if hs is not None and hs <= 0:
            ctx.fail(f"hidden_size must be positive, got {hs}")
        if r.shape is not None:
            _dims_agree(ctx, "hidden_size vs R's last dim", hs, r.shape[2])
            hs = hs if hs is not None else r.shape[2]
        gh = gates * hs if isinstance(hs, int) else None
        for i, t in ((1, w), (2, r)):
            if t.shape is not None:
                name = INPUT_NAMES[i]
                _dims_agree(ctx, f"{name} dim 0 (directions, {a.direction})", t.shape[0], dirs)
                _dims_agree(ctx, f"{name} dim 1 ({gates} gates x hidden_size {hs})", t.shape[1], gh)
        if w.shape is not None:
            _dims_agree(ctx, "W dim 2 vs X's input size", w.shape[2], isize)
        _check_shape(ctx, 3, (dirs, None if gh is None else 2 * gh), x.dtype)
        if ctx.has_input(4):
            lt = ctx.type(4)
            if lt.dtype != DType.int32:
                ctx.fail(f"sequence_lens must be int32, got {lt.dtype.name}")
            if lt.shape is not None and (len(lt.shape) != 1 or not _same(lt.shape[0], batch)):
                ctx.fail(f"sequence_lens must be [batch_size={batch}], got {lt}")
        state = (batch, dirs, hs) if a.layout == 1 else (dirs, batch, hs)
        _check_shape(ctx, 5, state, x.dtype)
        if op == "LSTM":
            _check_shape(ctx, 6, state, x.dtype)
            _check_shape(ctx, 7, (dirs, None if hs is None else 3 * hs), x.dtype)
        elif len(ctx.input_types) > 6 and any(ctx.has_input(i) for i in range(6, len(ctx.input_types))):
            ctx.fail(f"{op} takes at most 6 inputs")
        y = (batch, seq, dirs, hs) if a.layout == 1 else (seq, dirs, batch, hs)
        outs = [x.with_shape(y)] + [x.with_shape(state)] * (num_out - 1)
        return outs[: max(ctx.num_outputs, 1)]

    return infer


def _same(a: object, b: object) -> bool:
    return not (isinstance(a, int) and isinstance(b, int) and a != b)


for _op in ("LSTM", "GRU", "RNN"):
    register_op(_op, category=Category.OTHER, infer=_infer(_op))


# ---- com.microsoft.DynamicQuantizeLSTM (ONNX Runtime's contrib op) ----------------------------------


@dataclass(frozen=True, kw_only=True)
class DynamicQuantizeLSTMAttrs(Attrs):
    """LSTM's attributes (no layout; activation_alpha/beta are refused by the converter).
    activations: comma-joined names ("" = LSTM's defaults); clip 0 = none; hidden_size 0 = from R."""

    op_type: ClassVar[str] = "DynamicQuantizeLSTM"
    domain: ClassVar[str] = "com.microsoft"
    activations: str = ""
    clip: float = 0.0
    direction: str = "forward"
    hidden_size: int = 0
    input_forget: int = 0


def _dq_lstm_infer(ctx: InferContext) -> list[TensorType]:
    a = ctx.attrs
    try:
        dirs = num_directions(a.direction)
    except RecurrentAttrError as e:
        ctx.fail(str(e))
    x, w, r = ctx.type(0), ctx.type(1), ctx.type(2)
    if not x.dtype.is_float:
        ctx.fail(f"X must be a float tensor, got {x.dtype.name}")
    for i, t in ((1, w), (2, r)):
        if t.dtype not in (DType.int8, DType.uint8):
            ctx.fail(f"input {i} must be int8 or uint8, got {t.dtype.name}")
        if t.shape is not None and len(t.shape) != 3:
            ctx.fail(f"input {i} must have rank 3 ([directions, K, 4*hidden]), got {t}")
    if x.shape is not None and len(x.shape) != 3:
        ctx.fail(f"X must have rank 3, got {x}")
    seq, batch, isize = (None, None, None) if x.shape is None else x.shape
    hs = a.hidden_size or (r.shape[1] if r.shape is not None else None)
    if w.shape is not None:
        _dims_agree(ctx, "W dim 0 (directions)", w.shape[0], dirs)
        _dims_agree(ctx, "W dim 1 vs X's input size", w.shape[1], isize)
        _dims_agree(ctx, "W dim 2 (4 gates x hidden_size)", w.shape[2], None if hs is None else 4 * hs)
    if r.shape is not None:
        _dims_agree(ctx, "R dim 0 (directions)", r.shape[0], dirs)
        _dims_agree(ctx, "R dim 2 (4 gates x hidden_size)", r.shape[2], None if hs is None else 4 * hs)
    for i in (8, 10):
        if not ctx.has_input(i):
            ctx.fail(f"input {i} ({'W' if i == 8 else 'R'}_scale) is required")
    state = (dirs, batch, hs)
    outs = [x.with_shape((seq, dirs, batch, hs))] + [x.with_shape(state)] * 2
    return outs[: max(ctx.num_outputs, 1)]


register_op(
    "DynamicQuantizeLSTM",
    domain="com.microsoft",
    attrs=DynamicQuantizeLSTMAttrs,
    category=Category.OTHER,
    infer=_dq_lstm_infer,
    doc="ONNX Runtime's LSTM over 8-bit weights with per-tensor dynamic quantization of X and h.",
)
