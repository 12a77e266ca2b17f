"""Dead code elimination: drop nodes and constants that no graph output depends on."""

from __future__ import annotations

from graphc.ir.graph import Graph


def eliminate_dead_code(graph: Graph) -> Graph:
    live = {v.name for v in graph.outputs}
    keep = []
    for node in reversed(graph.nodes):
        if any(o.name in live for o in node.outputs):
            keep.append(node)
            live.update(v.name for v in node.inputs if v is not None)
    constants = {k: c for k, c in graph.constants.items() if k in live}
    if len(keep) == len(graph.nodes) and len(constants) == len(graph.constants):
        return graph
    keep.reverse()
    return graph.with_nodes(keep, constants=constants)
