"""Fuse the remaining elementwise ops into Fused[Elementwise] nodes (no anchor): one kernel per
group, a lone op included.

    a = exp(x); b = a * y; c = b + 1    -> Fused(x, y, 1) {op0 = Exp(in0); op1 = Mul(op0, in1); op2 = Add(op1, in2)}

Groups form from the consumers back (reverse graph order): a node joins the group of its
consumers when every reader of its output is in that one group and its output is no graph
output. Each group then has a single result, made by its last node, and the fused node sits
there (everything it reads is made before, everything reading it comes after).

A node on a smaller shape than the group's output is recomputed for every output element it
broadcasts to, so it joins only when that is cheap: a cheap op (arithmetic, compare, select,
cast) whose inputs also broadcast into the output, and at most MAX_BROADCAST_OPS such per group.
Otherwise it stays a group of its own, computed once on its small shape. Int64 vectors (shape
arithmetic that folds once shapes are bound) are left alone.
"""

from __future__ import annotations

from graphc.ir.graph import Graph, Node
from graphc.ir.types import DType
from graphc.ops.fused import FUSED_DOMAIN, FusedAttrs
from graphc.passes.capabilities import REFERENCE, FusionCapabilities
from graphc.passes.fold_common import Replacement, rebuild
from graphc.passes.fuse_common import EpilogueBuilder, broadcasts_into, fusable_elementwise, same_shape

CHEAP = frozenset(
    {
        "Add",
        "Sub",
        "Mul",
        "Neg",
        "Abs",
        "Relu",
        "Max",
        "Min",
        "Clip",
        "Cast",
        "Where",
        "Equal",
        "Less",
        "LessOrEqual",
        "Greater",
        "GreaterOrEqual",
        "Not",
        "And",
        "Or",
        "Xor",
        "Sign",
    }
)
MAX_BROADCAST_OPS = 2
MAX_GROUP_OPS = 64


def _candidate(node: Node, caps: FusionCapabilities) -> bool:
    if not fusable_elementwise(node, caps):
        return False
    t = node.outputs[0].ttype
    return not (t.dtype == DType.int64 and len(t.shape) <= 1)


def _groups(graph: Graph, caps: FusionCapabilities) -> list[list[Node]]:
    group_of: dict[str, str] = {}
    members: dict[str, list[Node]] = {}
    small: dict[str, int] = {}
    for node in reversed(graph.nodes):
        if not _candidate(node, caps):
            continue
        out = node.outputs[0]
        users = graph.users(out.name)
        target = None
        if users and not graph.is_output(out.name):
            gs = {group_of.get(u.name) for u in users}
            if len(gs) == 1 and None not in gs:
                g = gs.pop()
                shape = members[g][0].outputs[0].ttype.shape
                if len(members[g]) >= MAX_GROUP_OPS:
                    pass
                elif same_shape(out.ttype.shape, shape):
                    target = g
                elif (
                    node.op in CHEAP
                    and small[g] < MAX_BROADCAST_OPS
                    and broadcasts_into(out.type, shape)
                    and all(broadcasts_into(v.type, shape) for v in node.inputs)
                ):
                    target = g
                    small[g] += 1
        if target is None:
            target = node.name
            members[target] = []
            small[target] = 0
        group_of[node.name] = target
        members[target].append(node)
    return [list(reversed(m)) for m in members.values()]


def _replacement(group: list[Node]) -> Replacement:
    last = group[-1]

    def emit(b, mapv):
        eb = EpilogueBuilder(0)
        ref = None
        for n in group:
            ref = eb.add_node(n, mapv)
        attrs = FusedAttrs(epilogue=tuple(eb.ops), outputs=(ref,))
        node = b.add_node(
            "Fused",
            eb.inputs,
            attrs,
            name=last.name,
            keep_name=True,
            outputs=[last.outputs[0].name],
            domain=FUSED_DOMAIN,
        )
        return list(node.outputs)

    return Replacement(last.name, emit, tuple(group))


def fuse_elementwise(graph: Graph, caps: FusionCapabilities = REFERENCE) -> Graph:
    """Group elementwise nodes into Fused[Elementwise] nodes; `caps` says which ops and dtypes the
    target's fused kernels take (the reference executor's by default)."""
    return rebuild(graph, [_replacement(g) for g in _groups(graph, caps)])
