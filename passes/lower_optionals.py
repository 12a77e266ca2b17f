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
from graphc.passes.rewrite import Match, Op, Rule, Var, apply_rules


def _present(v: Value) -> bool:
    return not isinstance(v.type, OptionalType)


def _no_input(node) -> bool:
    return not any(v is not None for v in node.inputs)


RULES = [
    Rule(
        "optional_get_element(x) -> x",
        Op("OptionalGetElement", Var("x", pred=_present)),
        build=lambda m, b: m.value("x"),
    ),
    Rule(
        "optional_get_element(optional(x)) -> x",
        Op("OptionalGetElement", Op("Optional", Var("x"), domain="graphc")),
        build=lambda m, b: m.value("x"),
    ),
    Rule(
        "optional_has_element(x) -> true",
        Op("OptionalHasElement", Var("x", pred=_present)),
        build=lambda m, b: b.add_constant(np.array(True)),
    ),
    Rule(
        "optional_has_element(optional(x)) -> true",
        Op("OptionalHasElement", Op("Optional", Var("x"), shared=True, domain="graphc")),
        build=lambda m, b: b.add_constant(np.array(True)),
    ),
]


def _has_element_of_nothing(m: Match, b) -> Value:
    return b.add_constant(np.array(False))


def lower_optionals(graph: Graph) -> Graph:
    """The rewrites above; a node without an input is matched by its op alone."""
    rules = [
        *RULES,
        Rule(
            "optional_has_element(optional()) -> false",
            Op("OptionalHasElement", Op("Optional", pred=_no_input, any_inputs=True, shared=True, domain="graphc")),
            build=_has_element_of_nothing,
        ),
        Rule(
            "optional_has_element() -> false",
            Op("OptionalHasElement", pred=_no_input, any_inputs=True),
            build=_has_element_of_nothing,
        ),
    ]
    return apply_rules(graph, rules)
