"""Structural equality of graphs (TVM's structural_equal): the same computation, whatever the
names of its values and nodes and the order of independent nodes.

Two graphs are structurally equal when their inputs have the same types in the same order, their
outputs have the same public names and types, and each output is computed the same way: values
pair up one to one, a paired input with the input at the same position, a constant with a
constant of the same type and bytes, a node's output with the same output of a node of the same
op, domain and attributes whose inputs pair up in turn. Nodes no output depends on must match in
number too (a dead node is a difference, DCE's job). `graph.meta` is not compared.

Pass tests state the graph they expect as text (graphc.ir.text.parse_graph) and compare it with
`assert_structurally_equal`, which names the first difference.
"""

from __future__ import annotations

from graphc.ir.graph import Graph, Node, Value


def structural_diff(a: Graph, b: Graph, *, names: bool = False) -> str | None:
    """None when `a` and `b` are structurally equal, else the first difference found, in words.
    With `names`, value and node names must be equal as well."""
    if len(a.inputs) != len(b.inputs):
        return f"{len(a.inputs)} inputs against {len(b.inputs)}"
    for va, vb in zip(a.inputs, b.inputs, strict=True):
        if va.type != vb.type:
            return f"input %{va.name} is {va.type}, input %{vb.name} is {vb.type}"
    if tuple(a.output_names) != tuple(b.output_names):
        return f"output names {list(a.output_names)} against {list(b.output_names)}"
    a2b: dict[str, str] = {va.name: vb.name for va, vb in zip(a.inputs, b.inputs, strict=True)}
    b2a: dict[str, str] = {v: k for k, v in a2b.items()}
    nodes_a2b: dict[str, str] = {}
    nodes_b2a: dict[str, str] = {}
    work: list[tuple[Value, Value, str]] = [
        (va, vb, f"output {name!r}") for va, vb, name in zip(a.outputs, b.outputs, a.output_names, strict=True)
    ]
    while work:
        va, vb, where = work.pop()
        if names and va.name != vb.name:
            return f"{where}: value %{va.name} is named %{vb.name} in the other graph"
        if va.type != vb.type:
            return f"{where}: %{va.name} is {va.type}, %{vb.name} is {vb.type}"
        if va.name in a2b or vb.name in b2a:  # seen (inputs are paired from the start)
            if a2b.get(va.name) != vb.name:
                other = a2b.get(va.name) or b2a.get(vb.name)
                return f"{where}: %{va.name} and %{vb.name} are not the same value (one pairs with %{other})"
            continue
        a2b[va.name], b2a[vb.name] = vb.name, va.name
        ca, cb = a.constants.get(va.name), b.constants.get(vb.name)
        if (ca is None) != (cb is None):
            return f"{where}: only one of %{va.name} and %{vb.name} is a constant"
        if ca is not None and cb is not None:
            if ca.data.dtype != cb.data.dtype or ca.data.tobytes() != cb.data.tobytes():
                return f"{where}: constants %{va.name} and %{vb.name} hold different data"
            continue
        na, nb = a.producer(va.name), b.producer(vb.name)
        if na is None or nb is None:
            return f"{where}: %{va.name} and %{vb.name} are not both produced by a node"
        problem = _node_diff(na, nb, names)
        if problem:
            return f"{where}: {problem}"
        if na.output_names.index(va.name) != nb.output_names.index(vb.name):
            return f"{where}: %{va.name} and %{vb.name} are different outputs of their nodes"
        if na.name in nodes_a2b or nb.name in nodes_b2a:
            if nodes_a2b.get(na.name) != nb.name:
                return f"{where}: nodes {na.name!r} and {nb.name!r} are not the same node"
            continue  # its inputs are queued already (another output of it came first)
        nodes_a2b[na.name], nodes_b2a[nb.name] = nb.name, na.name
        for i, (ia, ib) in enumerate(zip(na.inputs, nb.inputs, strict=True)):
            if (ia is None) != (ib is None):
                return f"node {na.name!r} input {i}: omitted in one graph only"
            if ia is not None and ib is not None:
                work.append((ia, ib, f"node {na.name!r} input {i}"))
    if len(a.nodes) != len(b.nodes):
        return f"{len(a.nodes)} nodes against {len(b.nodes)} (the same outputs; dead nodes differ)"
    if len(a.constants) != len(b.constants):
        return f"{len(a.constants)} constants against {len(b.constants)} (unused constants differ)"
    return None


def _node_diff(na: Node, nb: Node, names: bool) -> str | None:
    if (na.domain, na.op) != (nb.domain, nb.op):
        return f"node {na.name!r} is {na.domain + '.' if na.domain else ''}{na.op}, node {nb.name!r} is " + (
            f"{nb.domain + '.' if nb.domain else ''}{nb.op}"
        )
    if names and na.name != nb.name:
        return f"node {na.name!r} is named {nb.name!r} in the other graph"
    if na.attrs != nb.attrs:
        return f"{na.op} nodes {na.name!r} and {nb.name!r} differ in attributes: {na.attrs} != {nb.attrs}"
    if len(na.inputs) != len(nb.inputs) or len(na.outputs) != len(nb.outputs):
        return f"{na.op} nodes {na.name!r} and {nb.name!r} differ in their number of inputs or outputs"
    return None


def structurally_equal(a: Graph, b: Graph, *, names: bool = False) -> bool:
    return structural_diff(a, b, names=names) is None


def assert_structurally_equal(actual: Graph, expected: Graph, *, names: bool = False) -> None:
    """Raise AssertionError naming the first difference, with both graphs as text."""
    problem = structural_diff(actual, expected, names=names)
    if problem:
        raise AssertionError(f"graphs differ: {problem}\n--- actual\n{actual}--- expected\n{expected}")
