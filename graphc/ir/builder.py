"""GraphBuilder: the one way to make nodes, so that every node carries inferred types.

The builder also tracks values known at build time (constants, and small results computed from
them or from static shapes, e.g. `Shape(x)` of a static `x`). Inference uses them to resolve the
shape arithmetic that exporters emit (Reshape targets, Slice bounds, Expand shapes).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from graphc.errors import ShapeError
from graphc.ir.attrs import Attrs
from graphc.ir.graph import Constant, Graph, Node, Value
from graphc.ir.registry import InferContext, OpDef, get_op
from graphc.ir.types import TensorType, ValueType

# Values of at most this many elements are computed at build time when all their inputs are
# known; bigger ones are left to constant folding, which has its own size policy.
KNOWN_VALUE_MAX_ELEMENTS = 1 << 12


class GraphBuilder:
    def __init__(self, name: str = "main", opset: int = 0, meta: Mapping[str, object] | None = None):
        self.name = name
        self.opset = opset
        self.meta: dict[str, object] = dict(meta or {})
        self.inputs: list[Value] = []
        self.captures: list[Value] = []
        self.outputs: list[Value] = []
        self.output_names: list[str] = []
        self.constants: dict[str, Constant] = {}
        self.nodes: list[Node] = []
        self.values: dict[str, Value] = {}
        self.known: dict[str, np.ndarray] = {}
        self._node_names: set[str] = set()
        self._counter = itertools.count()

    @classmethod
    def like(cls, graph: Graph, *, keep_constants: bool = True) -> GraphBuilder:
        """A builder with the graph's name, opset, meta, inputs and (by default) constants."""
        b = cls(graph.name, graph.opset, graph.meta)
        b.output_names = list(graph.output_names)
        for v in graph.inputs:
            b._define(v)
            b.inputs.append(v)
        for v in graph.captures:
            b._define(v)
            b.captures.append(v)
        if keep_constants:
            for c in graph.constants.values():
                b._define(c.value)
                b.constants[c.name] = c
                b.known[c.name] = c.data
        # Reserve every name of the source graph so that fresh names never collide with it.
        b._reserved_node_names = {n.name for n in graph.nodes}
        b._reserved_values = set(graph.values)
        return b

    _reserved_values: frozenset[str] | set[str] = frozenset()
    # Frontend state for the subgraphs of control-flow nodes converted inside this builder's graph
    # (graphc.frontend.convert.SubgraphScope: the enclosing names they may capture); None elsewhere.
    scope: Any = None
    _reserved_node_names: frozenset[str] | set[str] = frozenset()

    # ---- names ----
    def fresh_value_name(self, hint: str) -> str:
        hint = hint or "v"
        if hint not in self.values and hint not in self._reserved_values:
            return hint
        while True:
            cand = f"{hint}_{next(self._counter)}"
            if cand not in self.values and cand not in self._reserved_values:
                return cand

    def fresh_node_name(self, hint: str) -> str:
        hint = hint or "node"
        if hint not in self._node_names and hint not in self._reserved_node_names:
            return hint
        while True:
            cand = f"{hint}_{next(self._counter)}"
            if cand not in self._node_names and cand not in self._reserved_node_names:
                return cand

    def _define(self, v: Value) -> None:
        if v.name in self.values:
            raise ShapeError(f"value '{v.name}' is defined twice")
        self.values[v.name] = v

    # ---- inputs, constants, outputs ----
    def add_input(self, name: str, type: ValueType) -> Value:
        v = Value(name, type)
        self._define(v)
        self.inputs.append(v)
        return v

    def add_capture(self, name: str, type: ValueType) -> Value:
        """A value of this (sub)graph that stands for a value of the enclosing scope; the
        control-flow node binds it by position to one of its trailing inputs (see Graph)."""
        v = Value(name, type)
        self._define(v)
        self.captures.append(v)
        return v

    def add_constant(self, data: np.ndarray, name: str | None = None, *, keep_name: bool = False) -> Value:
        """Add a constant. `name` is a hint made unique, or with `keep_name` taken as it is unless
        a value of that name exists in this builder."""
        data = np.asarray(data)
        if data.flags.writeable:
            data = data.copy()
            data.setflags(write=False)
        if not (keep_name and name and name not in self.values):
            name = self.fresh_value_name(name or "const")
        v = Value(name, TensorType.of(data))
        self._define(v)
        self.constants[name] = Constant(v, data)
        self.known[name] = data
        return v

    def set_outputs(self, outputs: Sequence[Value], names: Sequence[str] | None = None) -> None:
        """Set the graph outputs; `names` are their public names (default: the values' names)."""
        self.outputs = list(outputs)
        self.output_names = list(names) if names is not None else [v.name for v in outputs]

    def value(self, name: str) -> Value:
        return self.values[name]

    def known_value(self, v: Value | None) -> np.ndarray | None:
        return None if v is None else self.known.get(v.name)

    # ---- nodes ----
    def add_node(
        self,
        op: str,
        inputs: Sequence[Value | None],
        attrs: Attrs | Mapping[str, Any] | None = None,
        *,
        name: str | None = None,
        outputs: int | Sequence[str] = 1,
        domain: str = "",
        keep_name: bool = False,
    ) -> Node:
        """Build a node, infer its output types, and append it. `name` is a hint made unique,
        or with `keep_name` taken as it is unless this builder already has a node of that name."""
        opdef = get_op(op, domain)
        inputs = list(inputs)
        while inputs and inputs[-1] is None:
            inputs.pop()
        keep = keep_name and name and name not in self._node_names
        node_name = name if keep else self.fresh_node_name(name or op)
        if attrs is None:
            attrs = {}
        if not isinstance(attrs, Attrs):
            try:
                attrs = opdef.attrs(**attrs)
            except TypeError as e:
                raise ShapeError(f"{op} node '{node_name}': bad attributes: {e}") from None
        elif not isinstance(attrs, opdef.attrs):
            raise TypeError(f"{op} node '{node_name}': attrs of type {type(attrs).__name__}")
        for v in inputs:
            if v is not None and self.values.get(v.name) != v:
                raise ShapeError(
                    f"{op} node '{node_name}': input '{v.name}' is not defined before it"
                    if v.name not in self.values
                    else f"{op} node '{node_name}': input '{v.name}' has a stale type "
                    f"{v.type} (defined as {self.values[v.name].type})"
                )
        if isinstance(outputs, int):
            out_names = [
                self.fresh_value_name(f"{node_name}_out{i}" if outputs > 1 else node_name)
                for i in range(outputs)
            ]
        else:
            out_names = [self.fresh_value_name(n) if n in self.values else n for n in outputs]
        ctx = InferContext(
            op=op,
            node_name=node_name,
            attrs=attrs,
            input_types=[None if v is None else v.type for v in inputs],
            input_values=[self.known_value(v) for v in inputs],
            num_outputs=len(out_names),
        )
        types = opdef.infer(ctx)
        if len(types) < len(out_names):
            raise ShapeError(
                f"{op} node '{node_name}': {len(out_names)} outputs asked, op gives {len(types)}"
            )
        out_values = tuple(Value(n, t) for n, t in zip(out_names, types, strict=False))
        node = Node(op, node_name, tuple(inputs), out_values, attrs, domain)
        for v in out_values:
            self._define(v)
        self._node_names.add(node_name)
        self.nodes.append(node)
        self._propagate_known(opdef, node, ctx)
        return node

    def op(
        self,
        op: str,
        inputs: Sequence[Value | None],
        attrs: Mapping[str, Any] | Attrs | None = None,
        *,
        name: str | None = None,
        domain: str = "",
    ) -> Value:
        """add_node for a single-output op; returns the output value."""
        return self.add_node(op, inputs, attrs, name=name, domain=domain).outputs[0]

    def copy_node(self, node: Node, inputs: Sequence[Value | None] | None = None) -> Node:
        """Re-add `node` (same op, attrs, name, output names) over possibly new inputs."""
        return self.add_node(
            node.op,
            node.inputs if inputs is None else inputs,
            node.attrs,
            name=node.name,
            outputs=list(node.output_names),
            domain=node.domain,
            keep_name=True,
        )

    def keep_or_copy(self, node: Node, inputs: Sequence[Value | None]) -> Node:
        """Re-add `node` over `inputs`: as it is when its inputs are unchanged (no re-inference,
        the cheap path passes take for most nodes), else through copy_node."""
        if len(inputs) != len(node.inputs) or any(a != b for a, b in zip(inputs, node.inputs, strict=True)):
            return self.copy_node(node, inputs)
        for v in node.inputs:
            if v is not None and self.values.get(v.name) != v:
                return self.copy_node(node, inputs)
        if node.name in self._node_names:
            return self.copy_node(node, inputs)
        for v in node.outputs:
            self._define(v)
        self._node_names.add(node.name)
        self.nodes.append(node)
        opdef = get_op(node.op, node.domain)
        ctx = InferContext(
            op=node.op,
            node_name=node.name,
            attrs=node.attrs,
            input_types=[None if v is None else v.type for v in node.inputs],
            input_values=[self.known_value(v) for v in node.inputs],
            num_outputs=len(node.outputs),
        )
        self._propagate_known(opdef, node, ctx)
        return node

    def _propagate_known(self, opdef: OpDef, node: Node, ctx: InferContext) -> None:
        if opdef.value_infer is not None:
            vals = opdef.value_infer(ctx)
            for v, val in zip(node.outputs, vals, strict=False):
                if val is not None:
                    self.known[v.name] = val
            if any(val is not None for val in vals):
                return
        present = [v for v in node.inputs if v is not None]
        if not present or any(v.name not in self.known for v in present):
            return
        if any(self.known[v.name].size > KNOWN_VALUE_MAX_ELEMENTS for v in present):
            return
        for v in node.outputs:
            t = v.type
            if not isinstance(t, TensorType) or not t.is_static or t.numel > KNOWN_VALUE_MAX_ELEMENTS:
                return
        inputs = [None if v is None else self.known[v.name] for v in node.inputs]
        try:
            results = opdef.compute(inputs, node.attrs, len(node.outputs))
        except Exception:  # inference stays valid without the value; folding will report errors
            return
        for v, r in zip(node.outputs, results, strict=False):
            self.known[v.name] = np.asarray(r)

    # ---- finish ----
    def build(self, *, verify: bool = True) -> Graph:
        g = Graph(
            name=self.name,
            inputs=tuple(self.inputs),
            outputs=tuple(self.outputs),
            constants=dict(self.constants),
            nodes=tuple(self.nodes),
            opset=self.opset,
            meta=dict(self.meta),
            output_names=tuple(self.output_names)
            if len(self.output_names) == len(self.outputs)
            else tuple(v.name for v in self.outputs),
            captures=tuple(self.captures),
        )
        if verify:
            from graphc.ir.verify import verify_graph

            verify_graph(g)
        return g
