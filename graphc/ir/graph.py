"""Values, nodes and graphs of the IR.

A `Graph` is immutable by convention: passes build a new one (usually through `GraphBuilder`).
Nodes are frozen and always carry inferred output types; they are created through
`GraphBuilder.add_node`, which runs the op's type inference, so no pass can forget to update
a type.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from graphc.ir.attrs import Attrs
from graphc.ir.types import TensorType, ValueType


@dataclass(frozen=True)
class Value:
    """A named SSA value and its type."""

    name: str
    type: ValueType

    @property
    def ttype(self) -> TensorType:
        """The type as a TensorType (every value but a sequence is one)."""
        assert isinstance(self.type, TensorType), f"{self.name} is a sequence"
        return self.type

    def __str__(self) -> str:
        return f"%{self.name}: {self.type}"


@dataclass(frozen=True, eq=False)
class Node:
    """One op application. `inputs` hold None for an omitted optional input (never trailing).

    Equality is identity; use `Node.key()` to compare nodes structurally (CSE).
    """

    op: str
    name: str
    inputs: tuple[Value | None, ...]
    outputs: tuple[Value, ...]
    attrs: Attrs
    domain: str = ""

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple("" if v is None else v.name for v in self.inputs)

    @property
    def output_names(self) -> tuple[str, ...]:
        return tuple(v.name for v in self.outputs)

    def input(self, i: int) -> Value | None:
        return self.inputs[i] if i < len(self.inputs) else None

    def key(self) -> tuple:
        """Structural identity: op, inputs and attrs (not names), for common subexpressions."""
        return (self.domain, self.op, self.input_names, self.attrs, len(self.outputs))

    def __repr__(self) -> str:
        return f"Node({self.op} '{self.name}')"


@dataclass(frozen=True)
class Constant:
    """A constant (initializer): its value and data. The data array is read-only."""

    value: Value
    data: np.ndarray

    @property
    def name(self) -> str:
        return self.value.name


@dataclass(frozen=True, eq=False)
class Graph:
    """A graph: inputs, constants, nodes in topological order, outputs; plus the opset it came from.

    `output_names` are the public names of the outputs (what users see), kept apart from the
    values' own names so that a pass may replace the value behind an output freely. Empty means
    the values' names.

    `meta` carries facts passes learn about the graph, e.g. which original nodes a fused node
    absorbed (`meta["fused_from"][node_name]`).

    A subgraph (the branch of an If, the body of a Loop or Scan, held in the node's attrs) is a
    Graph too. Its `captures` are values of its own that stand for values of an enclosing scope:
    the control-flow node lists the outer values as its trailing inputs, bound to `captures` by
    position. So a subgraph is closed (verified, run and printed on its own), and every pass that
    follows node inputs (DCE, renaming, scheduling) sees what a subgraph reads from outside.
    """

    name: str
    inputs: tuple[Value, ...]
    outputs: tuple[Value, ...]
    constants: Mapping[str, Constant]
    nodes: tuple[Node, ...]
    opset: int = 0
    meta: Mapping[str, object] = field(default_factory=dict)
    output_names: tuple[str, ...] = ()
    captures: tuple[Value, ...] = ()

    def __post_init__(self) -> None:
        if not self.output_names:
            object.__setattr__(self, "output_names", tuple(v.name for v in self.outputs))
        if len(self.output_names) != len(self.outputs):
            raise ValueError("output_names and outputs differ in length")

    # ---- indices (computed once per graph; graphs are not mutated) ----
    @functools.cached_property
    def producers(self) -> dict[str, Node]:
        return {v.name: n for n in self.nodes for v in n.outputs}

    @functools.cached_property
    def consumers(self) -> dict[str, list[Node]]:
        out: dict[str, list[Node]] = {}
        for n in self.nodes:
            seen = set()
            for v in n.inputs:
                if v is not None and v.name not in seen:
                    seen.add(v.name)
                    out.setdefault(v.name, []).append(n)
        return out

    @functools.cached_property
    def values(self) -> dict[str, Value]:
        vals: dict[str, Value] = {v.name: v for v in (*self.inputs, *self.captures)}
        vals.update({c.name: c.value for c in self.constants.values()})
        for n in self.nodes:
            for v in n.outputs:
                vals[v.name] = v
        return vals

    @functools.cached_property
    def output_value_names(self) -> frozenset[str]:
        return frozenset(v.name for v in self.outputs)

    def producer(self, name: str) -> Node | None:
        return self.producers.get(name)

    def users(self, name: str) -> list[Node]:
        return self.consumers.get(name, [])

    def is_output(self, name: str) -> bool:
        return name in self.output_value_names

    def const(self, name: str) -> np.ndarray | None:
        c = self.constants.get(name)
        return None if c is None else c.data

    def node(self, name: str) -> Node:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)

    def __iter__(self) -> Iterator[Node]:
        return iter(self.nodes)

    def __len__(self) -> int:
        return len(self.nodes)

    def op_counts(self) -> dict[str, int]:
        from graphc.ir.kinds import node_kind

        counts: dict[str, int] = {}
        for n in self.nodes:
            k = node_kind(n)
            counts[k] = counts.get(k, 0) + 1
        return dict(sorted(counts.items()))

    def with_nodes(
        self,
        nodes: Sequence[Node],
        constants: Mapping[str, Constant] | None = None,
        outputs: Sequence[Value] | None = None,
        meta: Mapping[str, object] | None = None,
    ) -> Graph:
        """The same graph over new nodes (and optionally constants, outputs, meta); the public
        output names stay."""
        return Graph(
            name=self.name,
            inputs=self.inputs,
            outputs=tuple(self.outputs if outputs is None else outputs),
            constants=dict(self.constants if constants is None else constants),
            nodes=tuple(nodes),
            opset=self.opset,
            meta=dict(self.meta if meta is None else meta),
            output_names=self.output_names
            if outputs is None or len(outputs) == len(self.outputs)
            else tuple(v.name for v in outputs),
            captures=self.captures,
        )

    def subgraphs(self) -> Iterator[tuple[Node, str, Graph]]:
        """(node, attribute name, subgraph) for every subgraph its nodes hold (not recursive)."""
        for n in self.nodes:
            yield from node_subgraphs(n)

    def __str__(self) -> str:
        from graphc.ir.text import format_graph

        return format_graph(self)


def node_subgraphs(node: Node) -> Iterator[tuple[Node, str, Graph]]:
    """(node, attribute name, subgraph) for each Graph-valued attribute of `node`, in field order."""
    for name, v in node.attrs.items():
        if isinstance(v, Graph):
            yield node, name, v
