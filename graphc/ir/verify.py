"""The IR verifier: SSA form, topological order, types, and no dangling values.

Subgraphs (If branches, Loop/Scan bodies) are verified too, each as a graph of its own: a
subgraph is closed, so what it reads from an enclosing scope is one of its `captures`, bound to
one of the node's trailing inputs, which the ordinary input check proves defined in the enclosing
scope before the node (the op's inference checks the binding's count and types).

It re-runs type inference on every node and compares with the types the node carries, so a pass
that builds a node by hand with a wrong type is caught here.
"""

from __future__ import annotations

from graphc.errors import GraphcError, VerificationError
from graphc.ir.graph import Graph, node_subgraphs
from graphc.ir.registry import InferContext, get_op


def verify_graph(graph: Graph, *, check_types: bool = True) -> None:
    """Raise VerificationError naming the first problem found."""
    problems = verify_problems(graph, check_types=check_types, first_only=True)
    if problems:
        raise VerificationError(f"graph '{graph.name}' is invalid: {problems[0]}")


def verify_problems(graph: Graph, *, check_types: bool = True, first_only: bool = False) -> list[str]:
    problems: list[str] = []

    def bad(msg: str) -> bool:
        problems.append(msg)
        return first_only

    defined: dict[str, object] = {}
    for v in graph.inputs:
        if v.name in defined and bad(f"input '{v.name}' is defined twice"):
            return problems
        defined[v.name] = v.type
    for v in graph.captures:
        if v.name in defined and bad(f"capture '{v.name}' is defined twice"):
            return problems
        defined[v.name] = v.type
    for name, c in graph.constants.items():
        if name != c.value.name and bad(f"constant keyed '{name}' is named '{c.value.name}'"):
            return problems
        if name in defined and bad(f"constant '{name}' redefines a value"):
            return problems
        defined[name] = c.value.type
        t = c.value.type
        if (tuple(c.data.shape) != t.shape or c.data.dtype != t.dtype.numpy) and bad(
            f"constant '{name}' data {c.data.dtype}{list(c.data.shape)} does not match its type {t}"
        ):
            return problems
    known = {n: c.data for n, c in graph.constants.items()}
    node_names: set[str] = set()
    for node in graph.nodes:
        where = f"{node.op} node '{node.name}'"
        if node.name in node_names and bad(f"two nodes are named '{node.name}'"):
            return problems
        node_names.add(node.name)
        for i, v in enumerate(node.inputs):
            if v is None:
                continue
            if v.name not in defined:
                if bad(f"{where}: input {i} '{v.name}' is not defined before the node"):
                    return problems
            elif defined[v.name] != v.type and bad(
                f"{where}: input {i} '{v.name}' has type {v.type} but is defined as {defined[v.name]}"
            ):
                return problems
        for v in node.outputs:
            if v.name in defined and bad(f"{where}: output '{v.name}' is defined twice (not SSA)"):
                return problems
            defined[v.name] = v.type
        for _, attr, sub in node_subgraphs(node):
            for p in verify_problems(sub, check_types=check_types, first_only=first_only):
                if bad(f"{where}: in its subgraph '{attr}': {p}"):
                    return problems
        if check_types:
            try:
                opdef = get_op(node.op, node.domain)
            except KeyError:
                if bad(f"{where}: unknown op"):
                    return problems
                continue
            if not isinstance(node.attrs, opdef.attrs) and bad(
                f"{where}: attrs are {type(node.attrs).__name__}, expected {opdef.attrs.__name__}"
            ):
                return problems
            ctx = InferContext(
                op=node.op,
                node_name=node.name,
                attrs=node.attrs,
                input_types=[None if v is None else v.type for v in node.inputs],
                input_values=[None if v is None else known.get(v.name) for v in node.inputs],
                num_outputs=len(node.outputs),
            )
            try:
                types = opdef.infer(ctx)
            except GraphcError as e:
                if bad(f"{where}: inference fails: {e}"):
                    return problems
                continue
            for v, t in zip(node.outputs, types, strict=False):
                if not _compatible(v.type, t) and bad(
                    f"{where}: output '{v.name}' carries {v.type}, inference gives {t}"
                ):
                    return problems
    for v in graph.outputs:
        if v.name not in defined:
            if bad(f"graph output '{v.name}' is not defined"):
                return problems
        elif defined[v.name] != v.type and bad(
            f"graph output '{v.name}' has type {v.type} but is defined as {defined[v.name]}"
        ):
            return problems
    return problems


def _compatible(carried, inferred) -> bool:
    """Types agree, allowing the carried type to be more precise where re-inference without
    build-time values gives unknown dims."""
    if carried == inferred:
        return True
    from graphc.ir.types import TensorType

    if not (isinstance(carried, TensorType) and isinstance(inferred, TensorType)):
        return False
    if carried.dtype != inferred.dtype:
        return False
    if inferred.shape is None:
        return True
    if carried.shape is None or len(carried.shape) != len(inferred.shape):
        return False
    return all(i is None or c == i for c, i in zip(carried.shape, inferred.shape, strict=True))
