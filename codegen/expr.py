"""CUDA expressions of the elementwise ops, used by every template's epilogue.

`render_op(op, attrs, args, in_dtypes, out_dtype)` gives a C expression computing the op on
argument expressions that are already in their compute types (fp32 for 16/32-bit floats). An op
missing here cannot be part of a CUDA kernel: lowering reports it by name.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from graphc.codegen.cuda_types import cuda_type
from graphc.errors import CompileError
from graphc.ir.types import DType

ExprFn = Callable[[Sequence[str], Any, Sequence[DType], DType], str]


def lit(v: float | int, ct: str) -> str:
    """A literal of compute type `ct`."""
    if ct == "float":
        if math.isnan(v):
            return "__int_as_float(0x7fc00000)"
        if math.isinf(v):
            return "__int_as_float(0x7f800000)" if v > 0 else "__int_as_float(0xff800000)"
        return f"{float(v)!r}f"
    if ct == "double":
        if math.isnan(v) or math.isinf(v):
            return {"nan": "__longlong_as_double(0x7ff8000000000000ll)"}.get(
                "nan" if math.isnan(v) else "", "(1.0/0.0)" if v > 0 else "(-1.0/0.0)"
            )
        return repr(float(v))
    if ct == "bool":
        return "true" if v else "false"
    return f"(({ct}){int(v)})"


def _ct(dt: DType) -> str:
    return cuda_type(dt).compute


def _fn(name: str, ct: str) -> str:
    """The math function for a compute type: expf for float, exp for double."""
    return f"{name}f" if ct == "float" else name


def _unary_math(name: str) -> ExprFn:
    return lambda a, at, i, o: f"{_fn(name, _ct(o))}({a[0]})"


def _is_float(dt: DType) -> bool:
    return dt.is_float


def _binary(op: str) -> ExprFn:
    return lambda a, at, i, o: f"(({_ct(o)})({a[0]}) {op} ({_ct(o)})({a[1]}))"


def _compare(op: str) -> ExprFn:
    return lambda a, at, i, o: f"(({a[0]}) {op} ({a[1]}))"


def _div(a, at, i, o) -> str:
    ct = _ct(o)
    if o.is_float:
        return f"(({a[0]}) / ({a[1]}))"
    return f"(({ct})({a[0]}) / ({ct})({a[1]}))"  # C truncation, as ONNX integer Div


def _mod(a, at, i, o) -> str:
    ct = _ct(o)
    if o.is_float or at.fmod:
        return f"{_fn('fmod', ct)}(({a[0]}), ({a[1]}))" if o.is_float else f"(({a[0]}) % ({a[1]}))"
    # integer Mod with the divisor's sign (Python semantics)
    return f"({ct})((({a[0]}) % ({a[1]}) + ({a[1]})) % ({a[1]}))"


def _pow(a, at, i, o) -> str:
    ct = _ct(o)
    if o.is_float:
        return f"{_fn('pow', ct)}(({ct})({a[0]}), ({ct})({a[1]}))"
    return f"({ct})pow((double)({a[0]}), (double)({a[1]}))"


def _minmax(fn: str) -> ExprFn:
    def render(a, at, i, o) -> str:
        ct = _ct(o)
        if o.is_float:
            # ONNX Min/Max propagate NaN; fminf/fmaxf do not.
            out = a[0]
            for x in a[1:]:
                cmp = "<" if fn == "min" else ">"
                out = f"gc_{fn}_nan(({ct})({out}), ({ct})({x}))" if ct in ("float", "double") else out
                del cmp
            return out
        out = a[0]
        for x in a[1:]:
            out = f"(({out}) {'<' if fn == 'min' else '>'} ({x}) ? ({out}) : ({x}))"
        return out

    return render


def _sum(a, at, i, o) -> str:
    return "(" + " + ".join(f"({x})" for x in a) + ")"


def _mean(a, at, i, o) -> str:
    return f"({_sum(a, at, i, o)} / {lit(len(a), _ct(o))})"


def _clip(a, at, i, o) -> str:
    ct = _ct(o)
    x = a[0]
    if len(a) > 1 and a[1]:
        x = f"(({x}) < ({a[1]}) ? ({ct})({a[1]}) : ({x}))"
    if len(a) > 2 and a[2]:
        x = f"(({x}) > ({a[2]}) ? ({ct})({a[2]}) : ({x}))"
    return x


def _cast(a, at, i, o) -> str:
    src, dst = i[0], o
    if dst is DType.float8e4m3fn and not getattr(at, "saturate", 1):
        # the e4m3 store saturates (common.cuh gc_f2e4m3); without saturation ONNX wants NaN there
        raise CompileError("Cast to float8e4m3fn with saturate=0 has no CUDA form (the saturating one has)")
    ct = _ct(dst)
    if dst is DType.bool:
        return f"(({a[0]}) != 0)"
    if dst.is_float and not src.is_float:
        return f"({ct})({a[0]})"
    if not dst.is_float and src.is_float:
        # C float-to-int conversion truncates toward zero, as numpy astype does.
        return f"({ct})({a[0]})"
    return f"({ct})({a[0]})"


def _where(a, at, i, o) -> str:
    ct = _ct(o)
    return f"(({a[0]}) ? ({ct})({a[1]}) : ({ct})({a[2]}))"


def _f(o: DType) -> Callable[[float], str]:
    return lambda v: lit(v, _ct(o))


EXPRESSIONS: dict[str, ExprFn] = {
    "Add": _binary("+"),
    "Sub": _binary("-"),
    "Mul": _binary("*"),
    "Div": _div,
    "Mod": _mod,
    "Pow": _pow,
    "Max": _minmax("max"),
    "Min": _minmax("min"),
    "Sum": _sum,
    "Mean": _mean,
    "Neg": lambda a, at, i, o: f"(-({a[0]}))",
    "Abs": lambda a, at, i, o: (
        f"{_fn('fabs', _ct(o))}({a[0]})" if o.is_float else f"(({a[0]}) < 0 ? -({a[0]}) : ({a[0]}))"
    ),
    "Sign": lambda a, at, i, o: f"({_ct(o)})((({a[0]}) > 0) - (({a[0]}) < 0))",
    "Reciprocal": lambda a, at, i, o: f"({_f(o)(1)} / ({a[0]}))",
    "Sqrt": _unary_math("sqrt"),
    "Exp": _unary_math("exp"),
    "Log": _unary_math("log"),
    "Erf": _unary_math("erf"),
    "Tanh": _unary_math("tanh"),
    "Sin": _unary_math("sin"),
    "Cos": _unary_math("cos"),
    "Tan": _unary_math("tan"),
    "Asin": _unary_math("asin"),
    "Acos": _unary_math("acos"),
    "Atan": _unary_math("atan"),
    "Sinh": _unary_math("sinh"),
    "Cosh": _unary_math("cosh"),
    "Asinh": _unary_math("asinh"),
    "Acosh": _unary_math("acosh"),
    "Atanh": _unary_math("atanh"),
    "Floor": _unary_math("floor"),
    "Ceil": _unary_math("ceil"),
    "Round": _unary_math("rint"),  # half to even, as ONNX Round
    "Relu": lambda a, at, i, o: f"(({a[0]}) < {_f(o)(0)} ? {_f(o)(0)} : ({a[0]}))",  # NaN stays NaN
    "LeakyRelu": lambda a, at, i, o: f"(({a[0]}) >= {_f(o)(0)} ? ({a[0]}) : ({a[0]}) * {_f(o)(at.alpha)})",
    "PRelu": lambda a, at, i, o: f"(({a[0]}) >= {_f(o)(0)} ? ({a[0]}) : ({a[0]}) * ({a[1]}))",
    "Elu": lambda a, at, i, o: (
        f"(({a[0]}) >= {_f(o)(0)} ? ({a[0]}) : {_f(o)(at.alpha)} * ({_fn('exp', _ct(o))}({a[0]}) - {_f(o)(1)}))"
    ),
    "Celu": lambda a, at, i, o: (
        f"({_fn('fmax', _ct(o))}({_f(o)(0)}, ({a[0]})) + {_fn('fmin', _ct(o))}({_f(o)(0)}, "
        f"{_f(o)(at.alpha)} * ({_fn('exp', _ct(o))}(({a[0]}) / {_f(o)(at.alpha)}) - {_f(o)(1)})))"
    ),
    "Selu": lambda a, at, i, o: (
        f"{_f(o)(at.gamma)} * (({a[0]}) > {_f(o)(0)} ? ({a[0]}) : "
        f"{_f(o)(at.alpha)} * ({_fn('exp', _ct(o))}({a[0]}) - {_f(o)(1)}))"
    ),
    "Sigmoid": lambda a, at, i, o: f"gc_sigmoid({a[0]})",
    "HardSigmoid": lambda a, at, i, o: (
        f"{_fn('fmax', _ct(o))}({_f(o)(0)}, {_fn('fmin', _ct(o))}({_f(o)(1)}, "
        f"{_f(o)(at.alpha)} * ({a[0]}) + {_f(o)(at.beta)}))"
    ),
    "HardSwish": lambda a, at, i, o: (
        f"(({a[0]}) * {_fn('fmax', _ct(o))}({_f(o)(0)}, {_fn('fmin', _ct(o))}({_f(o)(1)}, "
        f"({a[0]}) / {_f(o)(6)} + {_f(o)(0.5)})))"
    ),
    "Softplus": lambda a, at, i, o: f"{_fn('log1p', _ct(o))}({_fn('exp', _ct(o))}({a[0]}))",
    "Softsign": lambda a, at, i, o: f"(({a[0]}) / ({_f(o)(1)} + {_fn('fabs', _ct(o))}({a[0]})))",
    "Mish": lambda a, at, i, o: (
        f"(({a[0]}) * {_fn('tanh', _ct(o))}({_fn('log1p', _ct(o))}({_fn('exp', _ct(o))}({a[0]}))))"
    ),
    "Swish": lambda a, at, i, o: f"(({a[0]}) * gc_sigmoid({_f(o)(getattr(at, 'alpha', 1.0))} * ({a[0]})))",
    "Gelu": lambda a, at, i, o: f"gc_gelu_tanh({a[0]})" if at.approximate == "tanh" else f"gc_gelu({a[0]})",
    "ThresholdedRelu": lambda a, at, i, o: f"(({a[0]}) > {_f(o)(at.alpha)} ? ({a[0]}) : {_f(o)(0)})",
    "Shrink": lambda a, at, i, o: (
        f"(({a[0]}) < -{_f(o)(at.lambd)} ? ({a[0]}) + {_f(o)(at.bias)} : "
        f"(({a[0]}) > {_f(o)(at.lambd)} ? ({a[0]}) - {_f(o)(at.bias)} : {_f(o)(0)}))"
    ),
    "Clip": _clip,
    "Equal": _compare("=="),
    "Less": _compare("<"),
    "LessOrEqual": _compare("<="),
    "Greater": _compare(">"),
    "GreaterOrEqual": _compare(">="),
    "Not": lambda a, at, i, o: f"(!({a[0]}))",
    "And": lambda a, at, i, o: f"(({a[0]}) && ({a[1]}))",
    "Or": lambda a, at, i, o: f"(({a[0]}) || ({a[1]}))",
    "Xor": lambda a, at, i, o: f"(({a[0]}) != ({a[1]}))",
    "BitwiseAnd": _binary("&"),
    "BitwiseOr": _binary("|"),
    "BitwiseXor": _binary("^"),
    "BitwiseNot": lambda a, at, i, o: f"(~({a[0]}))",
    "IsNaN": lambda a, at, i, o: f"isnan({a[0]})",
    "IsInf": lambda a, at, i, o: (
        f"(isinf({a[0]}) && ((({a[0]}) > 0 && {int(at.detect_positive)}) || "
        f"(({a[0]}) < 0 && {int(at.detect_negative)})))"
    ),
    "Where": _where,
    "Cast": _cast,
    "Identity": lambda a, at, i, o: a[0],
    "Dropout": lambda a, at, i, o: a[0],
}


def render_op(
    op: str, attrs: Any, args: Sequence[str], in_dtypes: Sequence[DType], out_dtype: DType, where: str = ""
) -> str:
    fn = EXPRESSIONS.get(op)
    if fn is None:
        raise CompileError(f"{where}{op} has no CUDA expression (it cannot be part of a CUDA kernel yet)")
    return fn(args, attrs, in_dtypes, out_dtype)


def supported_elementwise_ops() -> frozenset[str]:
    return frozenset(EXPRESSIONS)
