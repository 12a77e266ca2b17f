"""Provenance: which original (frontend) nodes each node stands for, kept in graph.meta["origins"].

A node made by a pass maps to the names of the original nodes it absorbed; an original node
stands for itself (it has no entry). The compile report's `fusions` and the kernel plan's step
origins come from here. It is a fact about the graph, so it lives with the IR; every pass that
replaces nodes extends a copy of the table (`origins_table`) for the graph it builds.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from graphc.ir.graph import Graph

ORIGINS_KEY = "origins"


def origins_of(graph: Graph, node_name: str) -> tuple[str, ...]:
    """The original nodes `node_name` stands for (itself if no pass made it)."""
    origins: Mapping[str, tuple[str, ...]] = graph.meta.get(ORIGINS_KEY, {})  # type: ignore[assignment]
    return tuple(origins.get(node_name, (node_name,)))


def merged_origins(graph: Graph, node_names: Iterable[str]) -> tuple[str, ...]:
    """The original nodes a group of nodes stands for, in order, each once."""
    return tuple(dict.fromkeys(o for n in node_names for o in origins_of(graph, n)))


def origins_table(graph: Graph) -> dict[str, tuple[str, ...]]:
    """A copy of the graph's table to extend while building its successor."""
    return dict(graph.meta.get(ORIGINS_KEY, {}))  # type: ignore[arg-type]
