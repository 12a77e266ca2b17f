"""Elementwise ops: arithmetic, activations, math functions, logic, bitwise, comparisons, Where,
Cast/CastLike/BitCast and (inference-only) Dropout.

Conventions of this family:
- Every op checks its input dtypes against the type constraints of its newest onnx.defs schema
  (`check_types`), so an op applied to a type ONNX does not define fails at build time with the
  node's name, instead of computing something numpy happens to accept.
- Binary and variadic ops broadcast like numpy (multidirectionally); PRelu's slope broadcasts
  unidirectionally to X.
- Narrow floats (float16, bfloat16, float8) are computed in float32 and rounded once at the end
  (numpy does the same for one float16 ufunc; for composite functions such as Gelu it avoids
  rounding every intermediate). Sums accumulate in float32.
- Integer ops follow the ONNX spec and C: overflow wraps, Div truncates toward zero, Mod with
  fmod=0 takes the divisor's sign, Pow with integer operands is exact (with wrap-around).
- The shared cases are tables (UNARY, BINARY_ARITH, COMPARE, LOGICAL, BITWISE): adding a plain
  unary op is one line.

This module holds type inference and traits; the numpy kernels are in
graphc.runtime.reference.elementwise.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from graphc.ir.types import DType, TensorType, ValueType
from graphc.ops.registry import Category, InferContext, broadcast_shapes, register_op
from graphc.runtime.reference.elementwise import (
    _FOUR_BIT,
    _ROUND_MODES,
    BINARY_ARITH,
    BITWISE,
    COMPARE,
    LOGICAL,
    UNARY,
    VARIADIC,
)
from graphc.runtime.reference.elementwise import cast_to as cast_to
from graphc.runtime.reference.elementwise import erf as erf


def bit_width(dtype: DType) -> int:
    return 4 if dtype in _FOUR_BIT else dtype.itemsize * 8


# ---- type checking against the ONNX schema -----------------------------------------------------


def _dtype_of_type_str(s: str) -> DType | None:
    """'tensor(float)' -> DType.float32; None for types graphc does not have (or non-tensors)."""
    import onnx

    if not (s.startswith("tensor(") and s.endswith(")")):
        return None
    name = s[len("tensor(") : -1].upper()
    try:
        return DType.from_onnx(onnx.TensorProto.DataType.Value(name))
    except ValueError:
        return None


@functools.cache
def _type_rules(op: str) -> tuple[tuple[str, ...], bool, dict[str, frozenset[DType]], int, int, int]:
    """(formal input type strs, last input variadic, allowed dtypes per type param,
    min inputs, max inputs, max outputs) of the newest schema of `op`."""
    import onnx.defs
    from onnx.defs import OpSchema

    schema = onnx.defs.get_schema(op)
    params = tuple(p.type_str for p in schema.inputs)
    variadic = bool(schema.inputs) and schema.inputs[-1].option == OpSchema.FormalParameterOption.Variadic
    allowed = {
        tc.type_param_str: frozenset(d for d in (_dtype_of_type_str(s) for s in tc.allowed_type_strs) if d is not None)
        for tc in schema.type_constraints
    }
    return params, variadic, allowed, schema.min_input, schema.max_input, schema.max_output


# Attributes with a closed set of values, checked at build time.
_ATTR_CHOICES: dict[str, tuple[str, tuple[Any, ...]]] = {
    "Gelu": ("approximate", ("none", "tanh")),
    "Mod": ("fmod", (0, 1)),
    "BitShift": ("direction", ("LEFT", "RIGHT")),
}


def check_types(ctx: InferContext) -> dict[str, DType]:
    """Check input count, output count and input dtypes against the op's newest schema.

    Returns the dtype bound to each type parameter (e.g. {'T': float32}); inputs that share a
    parameter must have the same dtype.
    """
    params, variadic, allowed, min_in, max_in, max_out = _type_rules(ctx.op)
    n = len(ctx.input_types)
    if n > max_in:
        ctx.fail(f"takes at most {max_in} inputs, got {n}")
    present = [i for i in range(n) if ctx.has_input(i)]
    if len(present) < min_in or any(not ctx.has_input(i) for i in range(min_in)):
        ctx.fail(f"needs at least {min_in} input(s)")
    if ctx.num_outputs > max_out:
        ctx.fail(f"gives at most {max_out} output(s), {ctx.num_outputs} asked")
    choice = _ATTR_CHOICES.get(ctx.op)
    if choice is not None and getattr(ctx.attrs, choice[0]) not in choice[1]:
        ctx.fail(f"{choice[0]}={getattr(ctx.attrs, choice[0])!r}; the spec allows {', '.join(map(repr, choice[1]))}")
    bound: dict[str, DType] = {}
    for i in present:
        p = params[min(i, len(params) - 1)] if variadic else params[i]
        dt = ctx.type(i).dtype
        if p in allowed:
            if dt not in allowed[p]:
                names = ", ".join(sorted(d.name for d in allowed[p]))
                ctx.fail(f"input {i} has dtype {dt.name}; {ctx.op} takes {names}")
            if p in bound and bound[p] != dt:
                ctx.fail(f"inputs of type {p} differ: {bound[p].name} and {dt.name} (input {i})")
            bound.setdefault(p, dt)
        elif _dtype_of_type_str(p) not in (None, dt):
            ctx.fail(f"input {i} has dtype {dt.name}, the op takes {p}")
    return bound


# ---- generic infer functions -------------------------------------------------------------------


def _unary_infer(ctx: InferContext) -> list[ValueType]:
    check_types(ctx)
    return [ctx.type(0)]


def _bool_unary_infer(ctx: InferContext) -> list[ValueType]:
    check_types(ctx)
    return [ctx.type(0).with_dtype(DType.bool)]


def _broadcast_shape(ctx: InferContext) -> tuple | None:
    shapes = [ctx.type(i).shape for i in range(len(ctx.input_types)) if ctx.has_input(i)]
    return broadcast_shapes(ctx, *shapes)


def _broadcast_infer(ctx: InferContext) -> list[ValueType]:
    check_types(ctx)
    return [TensorType(ctx.type(0).dtype, _broadcast_shape(ctx))]


def _compare_infer(ctx: InferContext) -> list[ValueType]:
    check_types(ctx)
    return [TensorType(DType.bool, _broadcast_shape(ctx))]


for _name, _fn in UNARY.items():
    register_op(_name, category=Category.ELEMENTWISE, infer=_unary_infer)


register_op(
    "IsNaN",
    category=Category.ELEMENTWISE,
    infer=_bool_unary_infer,
)
register_op(
    "IsInf",
    category=Category.ELEMENTWISE,
    infer=_bool_unary_infer,
)


# Binary ops whose two inputs may be swapped (the trait rewrites ask for; Max/Min are exact too:
# both propagate NaN from either side). Bitwise And/Or/Xor are commutative as well.
COMMUTATIVE = frozenset({"Add", "Mul", "Max", "Min", "Sum", "Mean", "And", "Or", "Xor", "Equal"})


for _name, _fn2 in BINARY_ARITH.items():
    register_op(
        _name,
        category=Category.ELEMENTWISE,
        infer=_broadcast_infer,
        commutative=_name in COMMUTATIVE,
    )


register_op("Pow", category=Category.ELEMENTWISE, infer=_broadcast_infer)
for _name, _compute in VARIADIC.items():
    register_op(
        _name,
        category=Category.ELEMENTWISE,
        infer=_broadcast_infer,
        commutative=_name in COMMUTATIVE,
    )


for _name, _fn3 in {**COMPARE, **LOGICAL}.items():
    register_op(
        _name,
        category=Category.ELEMENTWISE,
        infer=_compare_infer,
        commutative=_name in COMMUTATIVE,
    )

for _name, _fn3 in BITWISE.items():
    register_op(
        _name,
        category=Category.ELEMENTWISE,
        infer=_broadcast_infer,
        commutative=True,
    )

# ---- PRelu, Clip, Where ------------------------------------------------------------------------


def _prelu_infer(ctx: InferContext) -> list[ValueType]:
    check_types(ctx)
    x, slope = ctx.type(0), ctx.type(1)
    out = broadcast_shapes(ctx, x.shape, slope.shape)
    if x.shape is None or out is None:
        return [x]
    if len(out) != len(x.shape) or any(
        isinstance(o, int) and isinstance(d, int) and o != d for o, d in zip(out, x.shape, strict=True)
    ):
        ctx.fail(f"slope {slope} does not broadcast to X {x} (unidirectionally)")
    return [x]


register_op("PRelu", category=Category.ELEMENTWISE, infer=_prelu_infer)


def _clip_infer(ctx: InferContext) -> list[ValueType]:
    check_types(ctx)
    for i in (1, 2):
        if ctx.has_input(i):
            t = ctx.type(i)
            # The spec asks for scalars; exporters also write shape [1] (ORT accepts it too).
            if t.shape is not None and t.is_static and t.numel != 1:
                ctx.fail(f"{'min' if i == 1 else 'max'} must be a scalar, got {t}")
    return [ctx.type(0)]


register_op("Clip", category=Category.ELEMENTWISE, infer=_clip_infer)


def _where_infer(ctx: InferContext) -> list[ValueType]:
    check_types(ctx)
    return [TensorType(ctx.type(1).dtype, _broadcast_shape(ctx))]


register_op(
    "Where",
    category=Category.ELEMENTWISE,
    infer=_where_infer,
)

# ---- Dropout (inference) -----------------------------------------------------------------------


def _dropout_infer(ctx: InferContext) -> list[ValueType]:
    check_types(ctx)
    x = ctx.type(0)
    for i, what in ((1, "ratio"), (2, "training_mode")):
        if ctx.has_input(i):
            t = ctx.type(i)
            if t.is_static and t.numel != 1:
                ctx.fail(f"{what} must be a scalar, got {t}")
    ratio = ctx.value(1)
    if ratio is not None and not 0.0 <= float(np.asarray(ratio).reshape(-1)[0]) < 1.0:
        ctx.fail(f"ratio {float(np.asarray(ratio).reshape(-1)[0])} is outside [0, 1)")
    return [x, x.with_dtype(DType.bool)][: max(ctx.num_outputs, 1)]


register_op("Dropout", category=Category.ELEMENTWISE, infer=_dropout_infer)


def _check_cast_target(ctx: InferContext, to: int, what: str) -> DType:
    try:
        dt = DType.from_onnx(to)
    except ValueError:
        import onnx

        name = onnx.TensorProto.DataType.Name(to) if to in onnx.TensorProto.DataType.values() else str(to)
        ctx.fail(f"{what} {name} is not a type graphc supports")
    if ctx.attrs.round_mode not in _ROUND_MODES:
        ctx.fail(f"round_mode {ctx.attrs.round_mode!r}; the spec allows {', '.join(_ROUND_MODES)}")
    return dt


def _cast_infer(ctx: InferContext) -> list[ValueType]:
    check_types(ctx)
    dt = _check_cast_target(ctx, ctx.attrs.to, "target type")
    return [ctx.type(0).with_dtype(dt)]


register_op(
    "Cast",
    category=Category.ELEMENTWISE,
    infer=_cast_infer,
)


def _castlike_infer(ctx: InferContext) -> list[ValueType]:
    check_types(ctx)
    _check_cast_target(ctx, ctx.type(1).dtype.value, "target type")
    return [ctx.type(0).with_dtype(ctx.type(1).dtype)]


register_op(
    "CastLike",
    category=Category.ELEMENTWISE,
    infer=_castlike_infer,
)


def _bitcast_infer(ctx: InferContext) -> list[ValueType]:
    check_types(ctx)
    src = ctx.type(0).dtype
    try:
        dst = DType.from_onnx(ctx.attrs.to)
    except ValueError:
        ctx.fail(f"target type {ctx.attrs.to} is not a type graphc supports")
    if dst is DType.string or src is DType.string:
        ctx.fail("BitCast does not take strings")
    if bit_width(src) != bit_width(dst):
        ctx.fail(f"{src.name} ({bit_width(src)} bits) and {dst.name} ({bit_width(dst)} bits) differ in width")
    return [ctx.type(0).with_dtype(dst)]


register_op("BitCast", category=Category.ELEMENTWISE, infer=_bitcast_infer)
