"""Sequence ops lowered to tensor ops wherever lengths and positions are static (issue 12).

Exporters use sequences as fixed-length lists: the dynamo exporter writes GPT-2's
`qkv.split(n_embd, dim=2)` as SplitToSequence(qkv, 768) -> SequenceAt(0|1|2), `torch.stack`
and `torch.cat` of lists as SequenceConstruct -> ConcatFromSequence. Canonicalize first, then
match once: every static-length sequence becomes a SequenceConstruct of tensors, and the
consumers of a SequenceConstruct read its elements directly.

    split_to_sequence(x, s)                 -> sequence_construct(split(x, s)...)   (squeezed when keepdims=0)
    sequence_insert(construct(t...), x, i)  -> sequence_construct(t... with x at i)
    sequence_erase(construct(t...), i)      -> sequence_construct(t... without t_i)
    sequence_at(construct(t...), i)         -> t_i
    sequence_length(s: length n)            -> n
    concat_from_sequence(construct(t...))   -> concat(t...)    (new_axis: concat(unsqueeze(t)...))

The SequenceConstructs left without a reader are dead code. What cannot be lowered (a split or a
position known only at run time, a sequence that is a graph output) keeps its sequence ops: the
interpreter and the CPU engine run them, and the CUDA target names them.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np

from graphc.ir.builder import GraphBuilder
from graphc.ir.graph import Graph, Node, Value
from graphc.ir.types import SequenceType, TensorType
from graphc.passes.rewrite import Const, Match, Op, Rule, Var, apply_rules
from graphc.runtime.reference.sequence import _split_lengths

log = logging.getLogger(__name__)

MAX_SWEEPS = 32  # each sweep moves one level down a chain of sequence ops


def _const_int(graph: Graph, v: Value | None) -> int | None:
    if v is None:
        return None
    data = graph.const(v.name)
    if data is None or np.asarray(data).size != 1:
        return None
    return int(np.asarray(data).reshape(-1)[0])


def _rank(v: Value) -> int | None:
    t = v.type
    return len(t.shape) if isinstance(t, TensorType) and t.shape is not None else None


def _split_to_construct(m: Match, b: GraphBuilder) -> Value | None:
    node: Node = m.root
    x = m.value("x")
    t = x.type
    if not isinstance(t, TensorType) or t.shape is None:
        return None
    rank = len(t.shape)
    axis = node.attrs.axis + rank if node.attrs.axis < 0 else node.attrs.axis
    dim = t.shape[axis]
    has_split = len(node.inputs) > 1 and node.inputs[1] is not None
    split = m.graph.const(node.inputs[1].name) if has_split else None  # type: ignore[union-attr]
    if (has_split and split is None) or not isinstance(dim, int):
        return None  # lengths known only at run time
    lengths = _split_lengths(dim, split)
    if not lengths:
        return None
    name = node.name
    sizes = b.add_constant(np.array(lengths, np.int64), f"{name}/split")
    parts = list(b.add_node("Split", [x, sizes], {"axis": axis}, name=f"{name}/split", outputs=len(lengths)).outputs)
    if not has_split and not node.attrs.keepdims:
        axes = b.add_constant(np.array([axis], np.int64), f"{name}/axis")
        parts = [b.op("Squeeze", [p, axes], name=f"{name}/squeeze{i}") for i, p in enumerate(parts)]
    return b.op("SequenceConstruct", parts, name=name)


def _elements(m: Match) -> list[Value] | None:
    """The new-graph elements of the matched SequenceConstruct/SequenceEmpty 'seq'."""
    seq = m.node("seq")
    return [m.new(v) for v in seq.inputs]  # type: ignore[misc]


def _construct(b: GraphBuilder, elems: Sequence[Value], like: Value, name: str) -> Value:
    if elems:
        return b.op("SequenceConstruct", list(elems), name=name)
    t = like.type
    assert isinstance(t, SequenceType)
    return b.op("SequenceEmpty", [], {"dtype": t.elem.dtype.value}, name=name)


def _insert(m: Match, b: GraphBuilder) -> Value | None:
    node: Node = m.root
    elems = _elements(m)
    assert elems is not None
    pos = len(elems)
    if len(node.inputs) > 2 and node.inputs[2] is not None:
        p = _const_int(m.graph, node.inputs[2])
        if p is None:
            return None
        pos = p + len(elems) if p < 0 else p
    elems.insert(pos, m.value("x"))
    return _construct(b, elems, node.outputs[0], node.name)


def _erase(m: Match, b: GraphBuilder) -> Value | None:
    node: Node = m.root
    elems = _elements(m)
    assert elems is not None
    if not elems:
        return None  # the op's own error when it runs
    pos = len(elems) - 1
    if len(node.inputs) > 1 and node.inputs[1] is not None:
        p = _const_int(m.graph, node.inputs[1])
        if p is None:
            return None
        pos = p + len(elems) if p < 0 else p
    del elems[pos]
    return _construct(b, elems, node.outputs[0], node.name)


def _at(m: Match, b: GraphBuilder) -> Value | None:
    elems = _elements(m)
    assert elems is not None
    p = int(np.asarray(m.const("pos")).reshape(-1)[0])
    if not -len(elems) <= p < len(elems):
        return None  # out of range: left to the op, which names it
    return elems[p]


def _length(m: Match, b: GraphBuilder) -> Value:
    t = m.root.inputs[0].type  # type: ignore[union-attr]
    assert isinstance(t, SequenceType) and t.length is not None
    return b.add_constant(np.array(t.length, np.int64), f"{m.root.name}/length")


def _concat(m: Match, b: GraphBuilder) -> Value | None:
    node: Node = m.root
    elems = _elements(m)
    if not elems:
        return None
    rank = _rank(elems[0])
    if rank is None:
        return None
    axis = node.attrs.axis
    if node.attrs.new_axis:
        axis = axis + rank + 1 if axis < 0 else axis
        axes = b.add_constant(np.array([axis], np.int64), f"{node.name}/new_axis")
        elems = [b.op("Unsqueeze", [e, axes], name=f"{node.name}/unsqueeze{i}") for i, e in enumerate(elems)]
    return b.op("Concat", elems, {"axis": axis}, name=node.name)


def _is_static_length(v: Value) -> bool:
    return isinstance(v.type, SequenceType) and v.type.length is not None


def _seq(ops: str | tuple[str, ...] = "SequenceConstruct") -> Op:
    # shared: several SequenceAts read one sequence; the construct dies once all are rewritten.
    return Op(ops, any_inputs=True, shared=True, name="seq")


RULES: list[Rule] = [
    Rule(
        "split_to_sequence(x, s) -> sequence_construct(split(x, s)...)",
        Op("SplitToSequence", Var("x"), any_inputs=True),
        _split_to_construct,
    ),
    Rule(
        "sequence_insert(construct(t...), x, i) -> sequence_construct(t... with x at i)",
        Op("SequenceInsert", _seq(("SequenceConstruct", "SequenceEmpty")), Var("x"), any_inputs=True),
        _insert,
    ),
    Rule(
        "sequence_erase(construct(t...), i) -> sequence_construct(t... without t_i)",
        Op("SequenceErase", _seq(), any_inputs=True),
        _erase,
    ),
    Rule("sequence_at(construct(t...), i) -> t_i", Op("SequenceAt", _seq(), Const("pos")), _at),
    Rule("sequence_length(s: length n) -> n", Op("SequenceLength", Var("s", pred=_is_static_length)), _length),
    Rule("concat_from_sequence(construct(t...)) -> concat(t...)", Op("ConcatFromSequence", _seq()), _concat),
]


def lower_sequences(graph: Graph) -> Graph:
    """Rewrite to a fixed point; returns `graph` itself when nothing changed."""
    g = graph
    fired: list[str] = []
    for _ in range(MAX_SWEEPS):
        new = apply_rules(g, RULES, fired=fired)
        if new is g:
            break
        g = new
    else:
        log.warning("lower_sequences did not reach a fixed point in %d sweeps", MAX_SWEEPS)
    if fired:
        log.info("lower_sequences: %d rewrites", len(fired))
    return g
