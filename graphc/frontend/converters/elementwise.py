"""Converters of elementwise ops.

`since` is the first ONNX version whose meaning and attribute names are those of the IR op (the
newest version); later versions only added types or spelled out cases the earlier text left
undefined (e.g. BitShift by more than the width, Mod fmod=0 on floats). Older forms that differ:

- opset 1 ops carry `consumed_inputs`, a memory hint with no effect on values: dropped, and
  attributes the node leaves out take that version's defaults (Selu-1's differ from Selu-6's);
- Add/Sub/Mul/Div (< 7), Pow, And/Or/Xor, Equal/Less/Greater (< 7) broadcast only when
  `broadcast=1`, aligning B with A from `axis`: B gets trailing unit dims, then numpy rules apply;
- Clip (< 11) takes min/max as attributes, which become constant inputs;
- Dropout (< 12) takes ratio as an attribute; its mask was of the input's type before 10; before
  7 `is_test=0` (the default) means training mode. An inference Dropout (every version: no
  training mode, or ratio 0) becomes Identity and its mask, when the node names one, a constant
  all-true (all-ones) tensor of X's shape, so no Dropout reaches a pass or a kernel;
- Cast-1 names its target type with a string.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx

from graphc.frontend.context import ConvertContext
from graphc.frontend.registry import converter, passthrough
from graphc.ir.graph import Value
from graphc.ops.registry import get_op
from graphc.runtime.attrs import TensorAttr

# ---- ops whose every version (from `since`) is the IR op ---------------------------------------

passthrough("Softplus", "Softsign", "Not", since=1)
passthrough("Sqrt", "Exp", "Log", "Tanh", "Sigmoid", "Relu", "Neg", "Abs", "Reciprocal", "Floor", "Ceil", since=6)
passthrough("LeakyRelu", "Elu", "Selu", "HardSigmoid", since=6)
passthrough("Max", "Min", "Sum", "Mean", since=6)  # 6 needed equal shapes; 8 broadcasts
passthrough("PRelu", since=6)  # 6: slope of X's shape or of size 1; 7 broadcasts unidirectionally
passthrough("Cast", since=6)  # later versions add types, `saturate` (19) and `round_mode` (24)
passthrough("Add", "Sub", "Mul", "Div", "Pow", since=7)
passthrough("And", "Or", "Xor", "Equal", "Less", "Greater", since=7)
passthrough("Sin", "Cos", "Tan", "Asin", "Acos", "Atan", since=7)
passthrough("Sinh", "Cosh", "Asinh", "Acosh", "Atanh", "Erf", "Sign", "IsNaN", "Where", "Shrink", since=9)
passthrough("Mod", "IsInf", "ThresholdedRelu", since=10)
passthrough("Round", "Clip", "BitShift", since=11)
passthrough("LessOrEqual", "GreaterOrEqual", "Celu", since=12)
passthrough("HardSwish", since=14)
passthrough("CastLike", since=15)
passthrough("Mish", "BitwiseAnd", "BitwiseOr", "BitwiseXor", "BitwiseNot", since=18)
passthrough("Gelu", since=20)
passthrough("Swish", since=24)
passthrough("BitCast", since=26)

# ---- opset 1-6 forms ---------------------------------------------------------------------------


def _versioned_attrs(ctx: ConvertContext, drop: Sequence[str] = ("consumed_inputs",)) -> dict[str, Any]:
    """The node's attributes minus `drop`, plus the defaults of the node's own version where they
    differ from the IR op's (the newest version's)."""
    raw = {k: v for k, v in ctx.attrs.items() if k not in drop}
    schema = onnx.defs.get_schema(ctx.op_type, ctx.opset)
    fields = get_op(ctx.op_type).attrs.__dataclass_fields__
    for name, a in schema.attributes.items():
        if name in raw or name in drop or name not in fields or not a.default_value.name:
            continue
        default = onnx.helper.get_attribute_value(a.default_value)
        if default != fields[name].default:
            raw[name] = default
    return raw


def _emit_same(ctx: ConvertContext, inputs: Sequence[Value | None], attrs: dict[str, Any]) -> Sequence[Value]:
    node = ctx.emit(ctx.op_type, inputs, attrs, outputs=ctx.output_names, name=ctx.name)
    return node.outputs


def _drop_consumed_inputs(ctx: ConvertContext) -> Sequence[Value]:
    return _emit_same(ctx, ctx.inputs, _versioned_attrs(ctx))


for _op in (
    "Sqrt", "Exp", "Log", "Tanh", "Sigmoid", "Relu", "Neg", "Abs", "Reciprocal", "Floor", "Ceil",
    "LeakyRelu", "Elu", "Selu", "HardSigmoid", "PRelu", "Max", "Min", "Sum", "Mean",
):  # fmt: skip
    converter(_op, since=1)(_drop_consumed_inputs)


def _legacy_broadcast(ctx: ConvertContext) -> Sequence[Value]:
    """A binary op of opset < 7: with broadcast=1 and an axis, B's dims line up with A's dims
    from `axis` on; trailing unit dims on B make numpy broadcasting do the same. Without an
    axis, B matches A's trailing dims (numpy's rule); broadcast=0 means equal shapes."""
    a, b = ctx.input(0), ctx.input(1)
    axis = ctx.attr("axis")
    if ctx.attr("broadcast", 0) and axis is not None and a is not None and b is not None:
        ta, tb = a.ttype, b.ttype
        if ta.shape is None or tb.shape is None:
            raise ctx.fail("broadcast with an axis needs inputs of known rank")
        ra, rb = len(ta.shape), len(tb.shape)
        axis = axis + ra if axis < 0 else axis
        trailing = ra - axis - rb
        if trailing < 0 or axis < 0:
            raise ctx.fail(f"B {tb} does not fit in A {ta} from axis {ctx.attr('axis')}")
        if trailing and rb:
            axes = ctx.constant(np.arange(rb, rb + trailing, dtype=np.int64), "axes")
            b = ctx.op("Unsqueeze", [b, axes])
    return _emit_same(ctx, [a, b], {})


for _op in ("Add", "Sub", "Mul", "Div", "Pow", "And", "Or", "Xor", "Equal", "Less", "Greater"):
    converter(_op, since=1)(_legacy_broadcast)


@converter("Clip", since=1)
def _clip_attrs(ctx: ConvertContext) -> Sequence[Value]:
    """Clip-1/6: min and max attributes (absent: no bound) become scalar inputs of X's dtype."""
    x = ctx.input(0)
    if x is None:
        raise ctx.fail("input X is missing")
    dt = x.ttype.dtype.numpy
    bounds: list[Value | None] = []
    for name in ("min", "max"):
        v = ctx.attr(name)
        # float16 X with the default +-FLT_MAX: the bound becomes +-inf, still no clipping.
        bounds.append(None if v is None else ctx.constant(np.array(v, dtype=np.float64).astype(dt), name))
    return _emit_same(ctx, [x, *bounds], {})


# ---- Dropout ------------------------------------------------------------------------------------


def _dropout_as_identity(ctx: ConvertContext, x: Value, mask_dtype: Any) -> list[Value]:
    """Inference Dropout: Identity, and the mask (when named) every element kept."""
    names = ctx.output_names
    out = [ctx.emit("Identity", [x], {}, outputs=[names[0]], name=ctx.name).outputs[0]]
    if len(names) > 1:
        one = TensorAttr(np.ones((1,), dtype=mask_dtype))
        shape = x.ttype.shape
        if shape is not None and all(isinstance(d, int) for d in shape):
            dims = ctx.constant(np.array(shape, dtype=np.int64), "mask_shape")
        else:  # a dynamic X: the mask follows X's run-time shape
            dims = ctx.op("Shape", [x])
        out.append(ctx.emit("ConstantOfShape", [dims], {"value": one}, outputs=[names[1]]).outputs[0])
    return out


def _known_scalar(ctx: ConvertContext, i: int) -> Any:
    v = ctx.known(i)
    return None if v is None or np.asarray(v).size != 1 else np.asarray(v).reshape(-1)[0].item()


@converter("Dropout", since=12)
def _dropout_12(ctx: ConvertContext) -> Sequence[Value]:
    x = ctx.input(0)
    if x is None:
        raise ctx.fail("input data is missing")
    ratio = 0.5 if ctx.input(1) is None else _known_scalar(ctx, 1)
    training = False if ctx.input(2) is None else _known_scalar(ctx, 2)
    # Inference ignores the ratio (a run-time one included). Kept as a Dropout, whose kernel says
    # what is wrong when it runs: a training_mode known only at run time, training with a ratio
    # that is not 0, and a known ratio that the op rejects.
    bad_ratio = ratio is not None and not 0.0 <= float(ratio) < 1.0
    if not bad_ratio and (training is False or (training is not None and ratio == 0)):
        return _dropout_as_identity(ctx, x, np.bool_)
    return _emit_same(ctx, ctx.inputs, ctx.typed_attrs())


def _dropout_attrs(ctx: ConvertContext, *, training: bool, mask_as_input_type: bool) -> Sequence[Value]:
    x = ctx.input(0)
    if x is None:
        raise ctx.fail("input data is missing")
    r = float(ctx.attr("ratio", 0.5))
    if 0.0 <= r < 1.0 and (not training or r == 0.0):
        return _dropout_as_identity(ctx, x, x.ttype.dtype.numpy if mask_as_input_type else np.bool_)
    ratio = ctx.constant(np.array(r, dtype=np.float32), "ratio")
    inputs: list[Value | None] = [x, ratio]
    if training:
        inputs.append(ctx.constant(np.array(True), "training_mode"))
    names = ctx.output_names
    if len(names) < 2 or not mask_as_input_type:
        return _emit_same(ctx, inputs, {})
    # The mask had X's type before opset 10; the IR mask is bool.
    bool_mask = ctx.builder.fresh_value_name(f"{names[1]}_bool")
    out, mask = ctx.emit("Dropout", inputs, {}, outputs=[names[0], bool_mask], name=ctx.name).outputs
    cast = ctx.emit("Cast", [mask], {"to": x.ttype.dtype.value}, outputs=[names[1]])
    return [out, cast.outputs[0]]


@converter("Dropout", since=10)
def _dropout_10(ctx: ConvertContext) -> Sequence[Value]:
    return _dropout_attrs(ctx, training=False, mask_as_input_type=False)


@converter("Dropout", since=7)
def _dropout_7(ctx: ConvertContext) -> Sequence[Value]:
    return _dropout_attrs(ctx, training=False, mask_as_input_type=True)


@converter("Dropout", since=1)
def _dropout_1(ctx: ConvertContext) -> Sequence[Value]:
    # Before 7, is_test=0 (the default) asks for training-mode dropout, which is random; the
    # node then fails when run (the Dropout op refuses training mode with a nonzero ratio).
    return _dropout_attrs(ctx, training=not ctx.attr("is_test", 0), mask_as_input_type=True)


# ---- Cast-1 ------------------------------------------------------------------------------------


@converter("Cast", since=1)
def _cast_1(ctx: ConvertContext) -> Sequence[Value]:
    """Cast-1 names the target type with a string, e.g. "FLOAT"."""
    to = ctx.attr("to")
    if isinstance(to, str):
        try:
            to = onnx.TensorProto.DataType.Value(to.upper())
        except ValueError:
            raise ctx.fail(f"unknown target type {to!r}") from None
    return _emit_same(ctx, ctx.inputs, {"to": int(to)})
