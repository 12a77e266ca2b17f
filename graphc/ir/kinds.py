"""How a node is counted in reports: plain ops by op type, fused nodes by their anchor kind."""

from __future__ import annotations

from graphc.ir.graph import Node


def node_kind(node: Node) -> str:
    kind = getattr(node.attrs, "kind_name", None)
    if callable(kind):
        return kind()
    return node.op if not node.domain else f"{node.domain}.{node.op}"
