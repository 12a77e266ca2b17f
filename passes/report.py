"""The compile report of the optimizer: what ran, what was fused, what nearly was."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from graphc.ir.graph import Graph
from graphc.ir.kinds import node_kind
from graphc.ir.provenance import origins_of
from graphc.passes.manager import PassRecord


def add_near_miss(meta: dict, message: str) -> None:
    """Record why a fusion did not happen (fusion passes call this)."""
    misses = list(meta.get("near_misses", ()))
    if message not in misses:
        misses.append(message)
    meta["near_misses"] = misses


def optimizer_report(before: Graph, after: Graph, records: Sequence[PassRecord]) -> dict[str, Any]:
    """A JSON-serializable dict: passes, node and op counts before/after, fusions, near misses."""
    fusions = []
    for node in after.nodes:
        absorbed = origins_of(after, node.name)
        if len(absorbed) > 1 or absorbed != (node.name,):
            fusions.append({"node": node.name, "kind": node_kind(node), "absorbed": list(absorbed)})
    return {
        "passes": [
            {
                "name": r.name,
                "seconds": round(r.seconds, 6),
                "nodes_before": r.nodes_before,
                "nodes_after": r.nodes_after,
            }
            for r in records
        ],
        "optimize_seconds": round(sum(r.seconds for r in records), 6),
        "nodes_before": len(before.nodes),
        "nodes_after": len(after.nodes),
        "ops_before": before.op_counts(),
        "ops_after": after.op_counts(),
        "fusions": fusions,
        "near_misses": list(after.meta.get("near_misses", ())),
    }


def summarize(report: dict[str, Any], *, max_lines: int = 12) -> str:
    """A readable summary of an optimizer report."""
    lines = [
        f"optimizer: {report['nodes_before']} -> {report['nodes_after']} nodes in {report['optimize_seconds']:.2f} s"
    ]
    per_pass: dict[str, list[float]] = {}
    for p in report["passes"]:
        acc = per_pass.setdefault(p["name"], [0.0, 0])
        acc[0] += p["seconds"]
        acc[1] += p["nodes_before"] - p["nodes_after"]
    for name, (secs, removed) in per_pass.items():
        lines.append(
            f"  {name:<24} {secs * 1000:8.1f} ms  {removed:+d} nodes removed"
            if removed
            else f"  {name:<24} {secs * 1000:8.1f} ms"
        )
    lines.append("ops after: " + ", ".join(f"{k} x{v}" for k, v in report["ops_after"].items()))
    if report["fusions"]:
        lines.append(f"fusions: {len(report['fusions'])}")
        for f in report["fusions"][:max_lines]:
            lines.append(f"  {f['kind']} '{f['node']}' <- {', '.join(f['absorbed'])}")
        if len(report["fusions"]) > max_lines:
            lines.append(f"  ... and {len(report['fusions']) - max_lines} more")
    if report["near_misses"]:
        lines.append(f"near misses: {len(report['near_misses'])}")
        for m in report["near_misses"][:max_lines]:
            lines.append(f"  {m}")
        if len(report["near_misses"]) > max_lines:
            lines.append(f"  ... and {len(report['near_misses']) - max_lines} more")
    return "\n".join(lines)
