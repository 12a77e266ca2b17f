"""Remove ops that do nothing and canonicalize reshapes.

Identity and inference-mode Dropout go; so do Cast/CastLike to the same dtype, and Reshape,
Expand, Flatten, Squeeze, Unsqueeze, Slice, Transpose, Pad, Concat, Tile that leave their input
as it is; Mul/Div by one and Add/Sub of zero that change neither shape nor dtype. Once shapes
are static, Flatten/Squeeze/Unsqueeze become Reshape, and chains of Reshape collapse: the
planner treats a Reshape as an alias, so one canonical form is enough downstream.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from graphc.ir.graph import Graph, Node, Value
from graphc.ir.types import TensorType
from graphc.passes.rewrite import Const, Op, Rule, Var, apply_rules


def _same_type(node: Node, i: int = 0) -> bool:
    v = node.inputs[i]
    return v is not None and v.type == node.outputs[0].type and isinstance(v.type, TensorType) and v.type.is_static


def _passthrough(name: str) -> callable:
    return lambda m, b: m.value(name)


def _all_equal(value: float):
    return lambda data: data.dtype != object and data.size > 0 and bool(np.all(data == value))


def _dropout_is_noop(node: Node) -> bool:
    if len(node.outputs) > 1:
        return False  # the mask is used (DCE has run; a listed mask output may still be read)
    return len(node.inputs) < 3  # no training_mode input (a constant-False one is folded away)


def _static(v: Value) -> bool:
    return isinstance(v.type, TensorType) and v.type.is_static


def _to_reshape(m, b):
    node = m.root
    x = m.value("x")
    out = node.outputs[0].type
    if not (_static(x) and out.is_static):
        return None
    shape = b.add_constant(np.array(out.shape, dtype=np.int64), f"{node.name}/shape")
    return b.add_node("Reshape", [x, shape], name=node.name, keep_name=True).outputs[0]


def _collapse_reshape(m, b):
    node = m.root
    out = node.outputs[0].type
    if not out.is_static:
        return None
    shape = b.add_constant(np.array(out.shape, dtype=np.int64), f"{node.name}/shape")
    return b.add_node("Reshape", [m.value("x"), shape], name=node.name, keep_name=True).outputs[0]


def _castlike_to_cast(m, b):
    node = m.root
    to = node.outputs[0].type.dtype.value
    # CastLike's other attributes (saturate, round_mode) mean the same on Cast: keep them.
    from graphc.ops.registry import get_op

    cast_fields = get_op("Cast").attrs.__dataclass_fields__
    attrs = {k: v for k, v in node.attrs.items() if k in cast_fields}
    attrs["to"] = to
    return b.add_node("Cast", [m.value("x")], attrs, name=node.name, keep_name=True).outputs[0]


RULES: list[Rule] = [
    Rule("identity(x) -> x", Op("Identity", Var("x")), _passthrough("x")),
    Rule(
        "dropout(x) -> x",
        Op("Dropout", Var("x"), any_inputs=True, pred=_dropout_is_noop),
        lambda m, b: m.new(m.root.inputs[0]),
    ),
    Rule("cast(x: T, to=T) -> x", Op("Cast", Var("x"), pred=_same_type), _passthrough("x")),
    Rule("castlike(x: T, y: T) -> x", Op("CastLike", Var("x"), Var(), pred=_same_type), _passthrough("x")),
    Rule("castlike(x, y: U) -> cast(x, to=U)", Op("CastLike", Var("x"), Var()), _castlike_to_cast),
    Rule("reshape(x: S, S) -> x", Op("Reshape", Var("x"), Var(), pred=_same_type), _passthrough("x")),
    Rule("expand(x: S, S) -> x", Op("Expand", Var("x"), Var(), pred=_same_type), _passthrough("x")),
    Rule("flatten(x: S) -> x", Op("Flatten", Var("x"), pred=_same_type), _passthrough("x")),
    Rule(
        "squeeze(x: S) -> x",
        Op(("Squeeze", "Unsqueeze"), Var("x"), Var(), pred=_same_type),
        _passthrough("x"),
    ),
    Rule(
        "slice(x: S) -> x when nothing is cut or reversed",
        Op("Slice", Var("x"), any_inputs=True, pred=_same_type),
        lambda m, b: m.new(m.root.inputs[0]),
        predicate=lambda m: _const_input_all(m, 4, lambda a: a > 0),
    ),
    Rule(
        "transpose(x, identity) -> x",
        Op(
            "Transpose",
            Var("x"),
            pred=lambda n: n.attrs.perm is not None and tuple(n.attrs.perm) == tuple(range(len(n.attrs.perm))),
        ),
        _passthrough("x"),
    ),
    Rule(
        "pad(x, 0) -> x",
        Op("Pad", Var("x"), any_inputs=True, pred=_same_type),
        lambda m, b: m.new(m.root.inputs[0]),
        predicate=lambda m: _const_input_all(m, 1, lambda a: a == 0),
    ),
    Rule("tile(x, 1) -> x", Op("Tile", Var("x"), Var(), pred=_same_type), _passthrough("x")),
    Rule("concat(x) -> x", Op("Concat", Var("x"), pred=_same_type), _passthrough("x")),
    Rule("x * 1 -> x", Op("Mul", Var("x"), Const(pred=_all_equal(1)), pred=_same_type), _passthrough("x")),
    Rule("x / 1 -> x", Op("Div", Var("x"), Const(pred=_all_equal(1)), pred=_same_type), _passthrough("x")),
    Rule("x + 0 -> x", Op("Add", Var("x"), Const(pred=_all_equal(0)), pred=_same_type), _passthrough("x")),
    Rule("x - 0 -> x", Op("Sub", Var("x"), Const(pred=_all_equal(0)), pred=_same_type), _passthrough("x")),
    Rule(
        "flatten|squeeze|unsqueeze(x) -> reshape(x)",
        Op(("Flatten", "Squeeze", "Unsqueeze"), Var("x"), any_inputs=True),
        _to_reshape,
    ),
    Rule(
        "reshape(reshape(x)) -> reshape(x)",
        Op("Reshape", Op("Reshape", Var("x"), Var()), Var()),
        _collapse_reshape,
    ),
]


def _const_input_all(m, i: int, test) -> bool:
    """Input i of the root is absent or a constant whose every element passes `test`."""
    v = m.root.input(i)
    if v is None:
        return True
    data = m.graph.const(v.name)
    return data is not None and bool(np.all(test(data)))


def _is_empty(v: Value | None) -> bool:
    return v is not None and _static(v) and 0 in v.type.static_shape


def drop_empty_concat_inputs(graph: Graph) -> Graph:
    """Concat inputs with no elements dropped (at least one input kept). Exporters write
    `cat(rotate(x[..., :d]), x[..., d:])` for partial rotary embeddings, and where d is the whole
    head (Phi-3 from torch 2.11's TorchScript exporter) the pass-through slice is empty: without
    this, the CUDA engine held a Slice step with no kernel to launch, which the loader refuses."""
    nodes, changed = [], False
    for n in graph.nodes:
        if n.domain == "" and n.op == "Concat" and len(n.inputs) > 1:
            keep = tuple(v for v in n.inputs if not _is_empty(v))
            if keep and len(keep) < len(n.inputs):
                n, changed = dataclasses.replace(n, inputs=keep), True
        nodes.append(n)
    return graph.with_nodes(nodes) if changed else graph


def simplify(graph: Graph) -> Graph:
    return apply_rules(drop_empty_concat_inputs(graph), RULES)
