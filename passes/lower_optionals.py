"""Optional ops removed where presence is known when compiling (issue 12):

    optional_get_element(x: tensor | sequence)  -> x
    optional_has_element(x: tensor | sequence)  -> true
    optional_has_element()                      -> false    (no input, or an empty name)
    optional_has_element(optional(x))           -> true
    optional_has_element(optional())            -> false    (the empty optional of a type)
    optional_get_element(optional(x))           -> x

Opset 18's OptionalHasElement / OptionalGetElement take plain tensors and sequences, which are
always present. An optional graph input (presence known only at run time) keeps its ops: the
interpreter runs them, and the CPU and CUDA targets name them (graphc compiles tensor graphs).
"""

from __future__ import annotations

import numpy as np

from graphc.ir.graph import Graph, Value
from graphc.ir.types import OptionalType
from graphc.ops.optional import OPTIONAL_DOMAIN
from graphc.passes.rewrite import Match, Op, Rule, Var, apply_rules


def _present(v: Value) -> bool:
    return not isinstance(v.type, OptionalType)


def _no_input(node) -> bool:
    return not any(v is not None for v in node.inputs)


def _true(m: Match, b) -> Value:
    return b.add_constant(np.array(True))


def _false(m: Match, b) -> Value:
    return b.add_constant(np.array(False))


def _optional(*inputs, **kw) -> Op:
    return Op("Optional", *inputs, domain=OPTIONAL_DOMAIN, **kw)


# A node without an input is matched by its op alone (any_inputs, the predicate says none).
RULES = [
    Rule(
        "optional_get_element(x) -> x",
        Op("OptionalGetElement", Var("x", pred=_present)),
        build=lambda m, b: m.value("x"),
    ),
    Rule(
        "optional_get_element(optional(x)) -> x",
        Op("OptionalGetElement", _optional(Var("x"))),
        build=lambda m, b: m.value("x"),
    ),
    Rule("optional_has_element(x) -> true", Op("OptionalHasElement", Var("x", pred=_present)), build=_true),
    Rule(
        "optional_has_element(optional(x)) -> true",
        Op("OptionalHasElement", _optional(Var("x"), shared=True)),
        build=_true,
    ),
    Rule(
        "optional_has_element(optional()) -> false",
        Op("OptionalHasElement", _optional(pred=_no_input, any_inputs=True, shared=True)),
        build=_false,
    ),
    Rule("optional_has_element() -> false", Op("OptionalHasElement", pred=_no_input, any_inputs=True), build=_false),
]


def lower_optionals(graph: Graph) -> Graph:
    """The rewrites above."""
    return apply_rules(graph, RULES)
