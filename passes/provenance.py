"""Which original (frontend) nodes each node stands for, kept in graph.meta["origins"].

A node made by a pass maps to the names of the original nodes it absorbed; an original node
stands for itself. The compile report's `fusions` come from here.
"""

from __future__ import annotations

from collections.abc import Mapping

from graphc.ir.graph import Graph


def origins_of(graph: Graph, node_name: str) -> tuple[str, ...]:
    origins: Mapping[str, tuple[str, ...]] = graph.meta.get("origins", {})  # type: ignore[assignment]
    return tuple(origins.get(node_name, (node_name,)))
