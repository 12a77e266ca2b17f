"""Horizontal GEMM fusion: MatMuls that share their input become one batched GEMM.

    y_i = x @ W_i (+ b_i),  i < G,  W_i constant [K, N]
    ->  Y = Reshape(x, [1, M, K]) @ stack(W_i) (+ stack(b_i)[:, None, :])     # [G, M, N], one launch
        y_i = Reshape(Gather(Y, i, axis=0), shape(y_i))                        # views, no launch

The Q, K and V projections of an attention block are the case this is for: three launches become
one. The weights are stacked at compile time; the biases (each member's single Add of a constant
[N]) become one broadcast Add, which epilogue fusion then takes into the GEMM. Each y_i is the
contiguous slab Y[i], which lowering turns into a view at a byte offset (codegen/views.py); the
pass fuses only where every slab starts at a multiple of the arena alignment, so none of them
becomes a copy. It runs after attention fusion (whose matcher reads the three MatMuls) and before
epilogue fusion (which must see the stacked bias Add next to the GEMM).
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from graphc.ir.graph import Graph, Node, Value
from graphc.ir.types import TensorType
from graphc.passes.rewrite import DROP, RewriteContext, Rewritten, rewrite_graph
from graphc.runtime.plan import ALIGNMENT

log = logging.getLogger(__name__)

MAX_GROUP = 8  # members of one fused GEMM (Q/K/V are 3; more would grow the weight copy for little)


@dataclass
class _Member:
    matmul: Node
    weight: np.ndarray  # [K, N]
    add: Node | None = None  # its bias Add, when the group fuses biases
    bias: np.ndarray | None = None  # [N]


def _static(v: Value | None) -> tuple[int, ...] | None:
    t = None if v is None else v.type
    return t.static_shape if isinstance(t, TensorType) and t.is_static else None


def _bias_of(graph: Graph, mm: Node, n: int) -> tuple[Node, np.ndarray] | None:
    """The single Add consumer of `mm` with a constant [N] (or [1, N]...) operand, and that bias."""
    out = mm.outputs[0]
    users = graph.users(out.name)
    if len(users) != 1 or graph.is_output(out.name):
        return None
    add = users[0]
    if add.op != "Add" or add.domain != "" or len(add.inputs) != 2:
        return None
    other = add.inputs[1] if add.inputs[0] is out else add.inputs[0]
    if other is None or other is out:
        return None
    data = graph.const(other.name)
    if data is None or data.dtype != out.type.dtype.numpy or data.size != n:
        return None
    if data.shape[-1:] != (n,) or any(d != 1 for d in data.shape[:-1]) or data.ndim > len(_static(out) or ()):
        return None
    return add, data.reshape(n)


def _groups(graph: Graph) -> list[list[_Member]]:
    by_input: dict[tuple, list[_Member]] = defaultdict(list)
    for node in graph.nodes:
        if node.op != "MatMul" or node.domain != "" or len(node.inputs) != 2 or None in node.inputs:
            continue
        x, w = node.inputs
        xs, wdata = _static(x), graph.const(w.name)
        if xs is None or len(xs) < 2 or wdata is None or wdata.ndim != 2 or graph.const(x.name) is not None:
            continue
        if wdata.shape[0] != xs[-1] or not np.issubdtype(wdata.dtype, np.floating) or wdata.dtype != x.type.dtype.numpy:
            continue
        by_input[(x.name, wdata.shape, wdata.dtype.str)].append(_Member(node, wdata))
    groups = []
    for (_, (_k, n), _), members in by_input.items():
        members = members[:MAX_GROUP]
        if len(members) < 2:
            continue
        x = members[0].matmul.inputs[0]
        m = math.prod(_static(x)[:-1])
        if (m * n * x.type.dtype.itemsize) % ALIGNMENT:
            log.info(
                "fuse_horizontal: %d MatMuls of '%s' not fused: a [%d, %d] slab is not aligned",
                len(members),
                x.name,
                m,
                n,
            )
            continue
        biases = [_bias_of(graph, mb.matmul, n) for mb in members]
        if all(b is not None for b in biases):
            for mb, (add, data) in zip(members, biases, strict=True):
                mb.add, mb.bias = add, data
        elif any(b is not None for b in biases):
            # Mixed: some biases would stay as Adds on the views (a kernel each): keep the biased
            # members as they are (their Add goes into their own GEMM's epilogue).
            members = [mb for mb, b in zip(members, biases, strict=True) if b is None]
            if len(members) < 2:
                continue
        groups.append(members)
    return groups


def fuse_horizontal(graph: Graph) -> Graph:
    """MatMuls of one input by constant weights of one shape -> one batched GEMM (see above)."""
    groups = _groups(graph)
    if not groups:
        return graph
    first: dict[str, list[_Member]] = {g[0].matmul.name: g for g in groups}
    made: dict[str, Value] = {}  # old node name (MatMul, or its Add) -> its slab in the new graph
    dropped: set[str] = set()
    for g in groups:
        for mb in g[1:]:
            dropped.add(mb.matmul.name)
        if g[0].add is not None:
            dropped.add(g[0].matmul.name)

    def build(group: list[_Member], ctx: RewriteContext) -> None:
        b = ctx.b
        x = ctx.new(group[0].matmul.inputs[0])
        assert x is not None
        xs = _static(x)
        k, n = group[0].weight.shape
        m = math.prod(xs[:-1])
        name = group[0].matmul.name + "_horizontal"
        x3 = b.op("Reshape", [x, b.add_constant(np.array([1, m, k], dtype=np.int64))], name=name + "_in")
        w3 = b.add_constant(np.ascontiguousarray(np.stack([mb.weight for mb in group])))
        y = b.op("MatMul", [x3, w3], name=name)
        if group[0].bias is not None:
            bias = np.stack([mb.bias for mb in group]).reshape(len(group), 1, n)
            y = b.op("Add", [y, b.add_constant(np.ascontiguousarray(bias))], name=name + "_bias")
        for i, mb in enumerate(group):
            old = mb.add if mb.add is not None else mb.matmul
            slab = b.op("Gather", [y, b.add_constant(np.array(i, dtype=np.int64))], {"axis": 0}, name=name + f"_{i}")
            shape = np.array(_static(old.outputs[0]), dtype=np.int64)
            made[old.name] = b.op("Reshape", [slab, b.add_constant(shape)], name=name + f"_{i}_view")

    def visit(node: Node, ctx: RewriteContext):
        group = first.get(node.name)
        if group is not None:
            build(group, ctx)
            absorbed = [mb.matmul for mb in group] + [mb.add for mb in group if mb.add is not None]
            return Rewritten([made[node.name]] if node.name in made else [], absorbed)
        if node.name in made:
            return Rewritten([made[node.name]], None)
        if node.name in dropped:
            return DROP
        return None

    out = rewrite_graph(graph, visit)
    log.info(
        "fuse_horizontal: %d group(s) of MatMuls sharing an input fused (%s)", len(groups), [len(g) for g in groups]
    )
    return out
