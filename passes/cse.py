"""Common subexpression elimination: one node for each (op, inputs, attrs); one constant for
each distinct small constant."""

from __future__ import annotations

import hashlib

from graphc.ir.builder import GraphBuilder
from graphc.ir.graph import Graph, Value
from graphc.passes.dce import eliminate_dead_code

# Constants up to this size are compared by content (hashing every large weight is not worth it:
# exporters duplicate small shape constants, not weights).
CSE_CONSTANT_MAX_BYTES = 1 << 16


def eliminate_common_subexpressions(graph: Graph) -> Graph:
    subst: dict[str, Value] = {}
    seen_consts: dict[tuple, Value] = {}
    for name, c in graph.constants.items():
        if c.data.nbytes > CSE_CONSTANT_MAX_BYTES or c.data.dtype == object:
            continue
        key = (c.data.dtype.str, c.data.shape, hashlib.sha1(c.data.tobytes()).digest())
        if key in seen_consts:
            subst[name] = seen_consts[key]
        else:
            seen_consts[key] = c.value
    b = GraphBuilder.like(graph)
    seen_nodes: dict[tuple, list[Value]] = {}
    changed = bool(subst)
    for node in graph.nodes:
        ins = [None if v is None else subst.get(v.name, b.values.get(v.name)) for v in node.inputs]
        key = (
            node.domain,
            node.op,
            tuple("" if v is None else v.name for v in ins),
            node.attrs,
            len(node.outputs),
        )
        try:
            hash(key)
        except TypeError:  # an attribute that cannot be hashed: never merged
            key = None
        if key is not None and key in seen_nodes:
            for old, new in zip(node.outputs, seen_nodes[key], strict=True):
                subst[old.name] = new
            changed = True
            continue
        new_node = b.keep_or_copy(node, ins)
        if key is not None:
            seen_nodes[key] = list(new_node.outputs)
    if not changed:
        return graph
    b.set_outputs([subst.get(v.name, b.values.get(v.name)) for v in graph.outputs], graph.output_names)
    return eliminate_dead_code(b.build(verify=False))
