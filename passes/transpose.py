"""Pass transpose (being written: returns the graph unchanged for now)."""

from __future__ import annotations

from graphc.ir.graph import Graph


def eliminate_transposes(graph: Graph) -> Graph:
    return graph
