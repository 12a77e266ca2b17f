"""Fuse GELU written with basic ops into one Gelu node.

Exact form:  x * 0.5 * (1 + erf(x / sqrt(2)))                      -> Gelu(x)
Tanh form:   x * 0.5 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3)))  -> Gelu(x, approximate="tanh")

Exporters associate the product in every order: ((x * 0.5) * p), x * (0.5 * p), (x * p) * 0.5,
with x / 2 for x * 0.5; erf's argument as x / 1.4142135 or x * 0.70710678; x^3 as Pow(x, 3),
x * x * x or x^2 * x. The rules cover the cross product. Predicates check every constant: 0.5,
1, 2 and 3 exactly; sqrt(2), 1/sqrt(2), sqrt(2/pi) and 0.044715 within 1e-4 relative (or the
rounding error of a narrower constant dtype, float16 or bfloat16).
"""

from __future__ import annotations

import math

from graphc.ir.builder import GraphBuilder
from graphc.ir.graph import Graph, Value
from graphc.passes.fuse_util import is_float, is_scalar, near_misses, record_near_misses, same_shape
from graphc.passes.rewrite import Const, Match, Op, Pattern, Rule, Var, apply_rules

SQRT2 = math.sqrt(2.0)
SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
TANH_CUBIC = 0.044715
_ADD = ("Add", "Sum")  # ONNX's own Gelu function body adds with a two-input Sum


def _halves(v: Pattern) -> list[tuple[str, Pattern]]:
    return [
        ("{} * 0.5", Op("Mul", v, Const(pred=is_scalar(0.5)))),
        ("{} / 2", Op("Div", v, Const(pred=is_scalar(2.0)))),
    ]


def _erf_terms(x: Pattern) -> list[tuple[str, Pattern]]:
    """1 + erf(x / sqrt 2)."""
    args = [
        ("x / sqrt2", Op("Div", x, Const(pred=is_scalar(SQRT2, approx=True)))),
        ("x * (1/sqrt2)", Op("Mul", x, Const(pred=is_scalar(1.0 / SQRT2, approx=True)))),
    ]
    return [(f"(1 + erf({a}))", Op(_ADD, Op("Erf", arg), Const(pred=is_scalar(1.0)))) for a, arg in args]


def _cubes(x: Pattern) -> list[tuple[str, Pattern]]:
    return [
        ("x^3", Op("Pow", x, Const(pred=is_scalar(3.0)))),
        ("x*x*x", Op("Mul", Op("Mul", x, x), x)),
        ("x^2*x", Op("Mul", Op("Pow", x, Const(pred=is_scalar(2.0))), x)),
    ]


def _tanh_terms(x: Pattern) -> list[tuple[str, Pattern]]:
    """1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3))."""
    out = []
    for cname, cube in _cubes(x):
        inner = Op(_ADD, x, Op("Mul", cube, Const(pred=is_scalar(TANH_CUBIC, approx=True))))
        arg = Op("Mul", inner, Const(pred=is_scalar(SQRT_2_OVER_PI, approx=True)))
        out.append(
            (f"(1 + tanh(sqrt(2/pi) * (x + 0.044715 {cname})))", Op(_ADD, Op("Tanh", arg), Const(pred=is_scalar(1.0))))
        )
    return out


def _products(x: Pattern, p: Pattern, ptext: str) -> list[tuple[str, Pattern]]:
    """x * 0.5 * p in its three association orders (and x / 2 for x * 0.5)."""
    out = [(f"({h.format('x')}) * {ptext}", Op("Mul", half_x, p)) for h, half_x in _halves(x)]
    out += [(f"x * ({h.format(ptext)})", Op("Mul", x, half_p)) for h, half_p in _halves(p)]
    out += [(h.format(f"(x * {ptext})"), outer) for h, outer in _halves(Op("Mul", x, p))]
    return out


def _pred(m: Match) -> bool:
    x = m.values["x"]
    return is_float(x) and same_shape(m.root.outputs[0], x)


def _builder(approximate: str):
    def build(m: Match, b: GraphBuilder) -> Value:
        name = m.root.name
        hint = (name.rsplit("/", 1)[0] if "/" in name else name) + "/Gelu"
        return b.op("Gelu", [m.value("x")], {"approximate": approximate}, name=hint)

    return build


def _rules() -> list[Rule]:
    x = Var("x")
    rules = []
    for approximate, terms in (("none", _erf_terms(x)), ("tanh", _tanh_terms(x))):
        target = "gelu(x)" if approximate == "none" else "gelu(x, approximate=tanh)"
        for ptext, p in terms:
            for text, pattern in _products(x, p, ptext):
                rules.append(Rule(f"{text} -> {target}", pattern, _builder(approximate), predicate=_pred))
    return rules


RULES: list[Rule] = _rules()


def fuse_gelu(graph: Graph) -> Graph:
    if not any(n.op in ("Erf", "Tanh") and not n.domain for n in graph.nodes):
        return graph
    g = apply_rules(graph, RULES)
    return record_near_misses(g, near_misses(g, RULES, "GELU"))
