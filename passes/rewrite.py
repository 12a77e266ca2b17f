"""Declarative rewrites: a pattern with named captures, a predicate, and a builder.

    Rule(
        "identity(x) -> x",
        Op("Identity", Var("x")),
        build=lambda m, b: m.value("x"),
    )

A pattern is matched at a root node of the *old* graph, walking back through producers. Interior
nodes of a match must have no consumer outside the match (and must not be graph outputs), so a
rewrite never duplicates work or loses a value someone else needs; `Op(..., shared=True)` lifts
that for a node the builder keeps using anyway. The builder gets the match and a `RewriteBuilder`
(a GraphBuilder over the new graph) and returns the replacement value(s) of the root's outputs, or
None to decline. Matched nodes that become dead are removed by dead code elimination.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from graphc.ir.builder import GraphBuilder
from graphc.ir.graph import Graph, Node, Value
from graphc.ir.provenance import ORIGINS_KEY, merged_origins, origins_table
from graphc.ir.types import TensorType

log = logging.getLogger(__name__)

COMMUTATIVE = frozenset({"Add", "Mul", "Max", "Min", "Sum", "And", "Or", "Xor", "Equal"})


class Pattern:
    pass


@dataclass(frozen=True)
class Var(Pattern):
    """Any value (an input, a constant, or a node output); captured under `name`."""

    name: str | None = None
    pred: Callable[[Value], bool] | None = None


@dataclass(frozen=True)
class Const(Pattern):
    """A graph constant; its data is captured under `name`. `pred` tests the data."""

    name: str | None = None
    pred: Callable[[np.ndarray], bool] | None = None


@dataclass(frozen=True)
class Op(Pattern):
    """A node of one of `ops` whose inputs match `inputs` (in order; both orders for commutative
    binary ops). `optional_tail`: the node may have up to that many fewer inputs than patterns."""

    ops: str | tuple[str, ...]
    inputs: tuple[Pattern, ...] = ()
    name: str | None = None
    pred: Callable[[Node], bool] | None = None
    shared: bool = False
    output: int = 0
    any_inputs: bool = False  # `inputs` match a prefix of the node's inputs; the rest are free
    domain: str = ""

    def __init__(
        self, ops, *inputs: Pattern, name=None, pred=None, shared=False, output=0, any_inputs=False, domain: str = ""
    ):
        object.__setattr__(self, "ops", (ops,) if isinstance(ops, str) else tuple(ops))
        object.__setattr__(self, "inputs", tuple(inputs))
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "pred", pred)
        object.__setattr__(self, "shared", shared)
        object.__setattr__(self, "output", output)
        object.__setattr__(self, "any_inputs", any_inputs)
        object.__setattr__(self, "domain", domain)


@dataclass
class Match:
    root: Node
    graph: Graph
    nodes: dict[str, Node] = field(default_factory=dict)
    values: dict[str, Value] = field(default_factory=dict)
    consts: dict[str, np.ndarray] = field(default_factory=dict)
    matched: list[Node] = field(default_factory=list)
    # Set by the driver: maps old-graph values to their new-graph counterparts.
    _map: Callable[[Value], Value] | None = None

    def node(self, name: str) -> Node:
        return self.nodes[name]

    def value(self, name: str) -> Value:
        """A captured value as it stands in the new graph."""
        v = self.values[name]
        return self._map(v) if self._map else v

    def new(self, v: Value | None) -> Value | None:
        """Any old-graph value as it stands in the new graph."""
        if v is None:
            return None
        return self._map(v) if self._map else v

    def const(self, name: str) -> np.ndarray:
        return self.consts[name]


@dataclass(frozen=True)
class Rule:
    name: str  # the algebra, e.g. "conv(x, w) * s + b -> conv(x, w*s, b')"
    pattern: Op
    build: Callable[[Match, GraphBuilder], Value | Sequence[Value] | None]
    predicate: Callable[[Match], bool] | None = None


def match(graph: Graph, pattern: Op, node: Node) -> Match | None:
    m = Match(root=node, graph=graph)
    if _match_op(graph, pattern, node, m, is_root=True):
        return m
    return None


def _match_value(graph: Graph, pat: Pattern, v: Value | None, m: Match, parent: Node) -> bool:
    if isinstance(pat, Var):
        if v is None or (pat.pred is not None and not pat.pred(v)):
            return False
        return _capture(m.values, pat.name, v)
    if isinstance(pat, Const):
        if v is None:
            return False
        data = graph.const(v.name)
        if data is None or (pat.pred is not None and not pat.pred(data)):
            return False
        if pat.name is not None:
            if not _capture(m.values, pat.name, v):
                return False
            m.consts[pat.name] = data
        return True
    if isinstance(pat, Op):
        if v is None:
            return False
        producer = graph.producer(v.name)
        if producer is None or producer.outputs[pat.output].name != v.name:
            return False
        if not pat.shared:
            # The interior value may feed only this match's parent, and not leave the graph.
            users = graph.users(v.name)
            if graph.is_output(v.name) or any(u is not parent for u in users):
                return False
            if any(o.name != v.name and (graph.users(o.name) or graph.is_output(o.name)) for o in producer.outputs):
                return False
        return _match_op(graph, pat, producer, m, is_root=False)
    raise TypeError(f"not a pattern: {pat!r}")


def _capture(store: dict, name: str | None, v: Any) -> bool:
    if name is None:
        return True
    if name in store:
        return store[name] == v  # the same name twice must be the same value
    store[name] = v
    return True


def _match_op(graph: Graph, pat: Op, node: Node, m: Match, is_root: bool) -> bool:
    if node.op not in pat.ops or node.domain != pat.domain:
        return False
    if pat.pred is not None and not pat.pred(node):
        return False
    n_in = len(node.inputs)
    if n_in < len(pat.inputs) or (n_in != len(pat.inputs) and not pat.any_inputs):
        return False
    orders = [list(node.inputs[: len(pat.inputs)])]
    if node.op in COMMUTATIVE and n_in == 2 and len(pat.inputs) == 2:
        orders.append([node.inputs[1], node.inputs[0]])
    for order in orders:
        saved = (dict(m.nodes), dict(m.values), dict(m.consts), list(m.matched))
        if all(_match_value(graph, p, v, m, node) for p, v in zip(pat.inputs, order, strict=True)):
            break
        m.nodes, m.values, m.consts, m.matched = saved
    else:
        return False
    if pat.name is not None and not _capture(m.nodes, pat.name, node):
        return False
    m.matched.append(node)
    return True


def apply_rules(graph: Graph, rules: Sequence[Rule], *, fired: list[str] | None = None) -> Graph:
    """One sweep over the graph in order; at each node the first rule that matches and builds wins.
    Returns `graph` itself when nothing fired."""
    by_op: dict[tuple[str, str], list[Rule]] = {}
    for r in rules:
        for op in r.pattern.ops:
            by_op.setdefault((r.pattern.domain, op), []).append(r)

    def visit(node: Node, ctx: RewriteContext) -> Rewritten | None:
        for rule in by_op.get((node.domain, node.op), ()):
            m = match(graph, rule.pattern, node)
            if m is None or (rule.predicate is not None and not rule.predicate(m)):
                continue
            m._map = ctx.mapv
            mark = checkpoint(ctx.b)
            out = rule.build(m, ctx.b)
            if out is None:
                rollback(ctx.b, mark)  # the next rule starts from a clean builder
                continue
            if fired is not None:
                fired.append(f"{rule.name} at '{node.name}'")
            log.debug("rule %s fired at %s", rule.name, node.name)
            return Rewritten([out] if isinstance(out, Value) else list(out), m.matched)
        return None

    return rewrite_graph(graph, visit)


def apply_rules_counted(graph: Graph, rules: Sequence[Rule], what: str, *, fired: list[str] | None = None) -> Graph:
    """apply_rules, logging how many nodes `what` describes were rewritten (at INFO)."""
    fired = [] if fired is None else fired
    before = len(fired)
    out = apply_rules(graph, rules, fired=fired)
    if len(fired) > before:
        log.info("%s: %d", what, len(fired) - before)
    return out


def static_shape(v: Value) -> tuple[int, ...] | None:
    """The value's shape when every dim is a number (a tensor after bind_shapes), else None."""
    t = v.type
    return t.static_shape if isinstance(t, TensorType) and t.is_static else None


# ---- the rewrite driver ------------------------------------------------------------------------
#
# The one loop every rewriting pass runs (apply_rules above, fold_common.rebuild, transpose,
# layout, attention fusion): walk the old graph in order; at each node a visitor either keeps it,
# drops it, or builds its replacement in the new graph's builder; the driver substitutes the
# replacement for the node's outputs everywhere after, records provenance for every node built,
# undoes whatever a declining visitor built, and removes what became dead.


class _Drop:
    def __repr__(self) -> str:
        return "DROP"


DROP: Any = _Drop()  # a visitor's answer: leave the node out (its outputs must be unused after)


@dataclass
class Rewritten:
    """A visitor's replacement of a node: values for the node's outputs (in order), the old nodes
    the new ones stand for (provenance), or per new node name its own old nodes."""

    outputs: Sequence[Value]
    absorbed: Sequence[Node] | None  # None: record nothing (the new nodes stand for themselves)
    origins: Mapping[str, Sequence[Node]] | None = None


class RewriteContext:
    """What a visitor sees: the old graph, the new graph's builder and the value map."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self.b = GraphBuilder.like(graph)
        self.subst: dict[str, Value] = {}

    def new(self, v: Value | None) -> Value | None:
        """The new graph's value for an old value (None stays None)."""
        if v is None:
            return None
        return self.subst.get(v.name) or self.b.values[v.name]

    def mapv(self, v: Value) -> Value:
        return self.subst.get(v.name) or self.b.values[v.name]


Visitor = Callable[[Node, RewriteContext], "Rewritten | None"]


@dataclass(frozen=True)
class Checkpoint:
    nodes: int
    values: int
    constants: int
    known: int


def checkpoint(b: GraphBuilder) -> Checkpoint:
    """Where the builder stands, to `rollback` to."""
    return Checkpoint(len(b.nodes), len(b.values), len(b.constants), len(b.known))


def rollback(b: GraphBuilder, m: Checkpoint) -> None:
    """Forget everything the builder got since `m` (dicts keep insertion order): a declining
    visitor leaves no node, value, constant or reserved name behind."""
    for n in b.nodes[m.nodes :]:
        b._node_names.discard(n.name)  # noqa: SLF001 (the builder has no public undo yet)
    del b.nodes[m.nodes :]
    for table, keep in ((b.values, m.values), (b.constants, m.constants), (b.known, m.known)):
        for key in list(table)[keep:]:
            del table[key]


def rewrite_graph(
    graph: Graph,
    visit: Visitor,
    *,
    near_misses: Sequence[str] = (),
    dce: bool = True,
    context: RewriteContext | None = None,
) -> Graph:
    """Rebuild `graph` node by node through `visit` (see above). Returns `graph` itself when no
    visitor replaced or dropped anything and no near miss is new; else the new graph with
    `near_misses` added to its meta, dead code removed when `dce`."""
    from graphc.passes.dce import eliminate_dead_code
    from graphc.passes.report import add_near_miss

    ctx = context or RewriteContext(graph)
    b = ctx.b
    origins = origins_table(graph)
    changed = False
    for node in graph.nodes:
        mark = checkpoint(b)
        res = visit(node, ctx)
        if res is DROP:
            changed = True
            continue
        if res is None:
            rollback(b, mark)
            b.keep_or_copy(node, [ctx.new(v) for v in node.inputs])
            continue
        for old, nv in zip(node.outputs, res.outputs, strict=False):
            ctx.subst[old.name] = nv
        for n in b.nodes[mark.nodes :]:
            olds = (res.origins or {}).get(n.name, res.absorbed)
            if olds is not None:
                origins[n.name] = merged_origins(graph, (o.name for o in olds))
        changed = True
    new_misses = [m for m in dict.fromkeys(near_misses) if m not in graph.meta.get("near_misses", ())]
    if not changed:
        if not new_misses:
            return graph
        meta = dict(graph.meta)
        for msg in new_misses:
            add_near_miss(meta, msg)
        return graph.with_nodes(graph.nodes, meta=meta)
    b.set_outputs([ctx.mapv(v) for v in graph.outputs], graph.output_names)
    b.meta[ORIGINS_KEY] = origins
    for msg in new_misses:
        add_near_miss(b.meta, msg)
    out = b.build(verify=False)
    return eliminate_dead_code(out) if dce else out
