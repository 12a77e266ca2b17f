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
    # by name: a Value read by a node is not always the object its producer holds (the dynamo
    # exports' Linear biases were missed, each left an Add kernel on its slab of the stacked GEMM)
    a0 = add.inputs[0]
    other = add.inputs[1] if a0 is not None and a0.name == out.name else a0
    if other is None or other.name == out.name:
        return None
    data = graph.const(other.name)
    if data is None or data.dtype != out.type.dtype.numpy or data.size != n:
        return None
    if data.shape[-1:] != (n,) or any(d != 1 for d in data.shape[:-1]) or data.ndim > len(_static(out) or ()):
        return None
    return add, data.reshape(n)


def _aligned(m: int, n: int) -> bool:
    """Whether every [m, n] slab starts at a multiple of the arena alignment, at the narrowest
    float type the precision pass may give it later (2 bytes: fp16/bf16 halve the offsets)."""
    return (m * n * 2) % ALIGNMENT == 0


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
        if not _aligned(m, n):
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


def _batched(
    b, x: Value, weights: np.ndarray, bias: np.ndarray | None, shapes: list[tuple[int, ...]], name: str
) -> list[Value]:
    """Reshape(x, [1, M, K]) @ weights [G, K, N] (+ bias [G, 1, N]), then per member i the slab
    Y[i] reshaped to shapes[i]: the replacement values, in member order."""
    g, k, n = weights.shape
    m = math.prod(_static(x)[:-1])
    x3 = b.op("Reshape", [x, b.add_constant(np.array([1, m, k], dtype=np.int64))], name=name + "_in")
    y = b.op("MatMul", [x3, b.add_constant(np.ascontiguousarray(weights))], name=name)
    if bias is not None:
        y = b.op("Add", [y, b.add_constant(np.ascontiguousarray(bias.reshape(g, 1, n)))], name=name + "_bias")
    out = []
    for i, shape in enumerate(shapes):
        slab = b.op("Gather", [y, b.add_constant(np.array(i, dtype=np.int64))], {"axis": 0}, name=name + f"_{i}")
        out.append(b.op("Reshape", [slab, b.add_constant(np.array(shape, dtype=np.int64))], name=name + f"_{i}_view"))
    return out


def fuse_horizontal(graph: Graph) -> Graph:
    """MatMuls of one input by constant weights of one shape, and a GEMM whose result is split
    into equal column blocks, -> one batched GEMM with views of its slabs (see above)."""
    return _split_gemms(_fuse_groups(graph))


def _fuse_groups(graph: Graph) -> Graph:
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
        x = ctx.new(group[0].matmul.inputs[0])
        assert x is not None
        olds = [mb.add if mb.add is not None else mb.matmul for mb in group]
        bias = None if group[0].bias is None else np.stack([mb.bias for mb in group])
        weights = np.stack([mb.weight for mb in group])
        shapes = [_static(o.outputs[0]) for o in olds]
        for old, v in zip(
            olds, _batched(ctx.b, x, weights, bias, shapes, group[0].matmul.name + "_horizontal"), strict=True
        ):
            made[old.name] = v

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


# ---- a GEMM whose output is split into equal column blocks (GPT-2's c_attn) ------------------------


@dataclass
class _SplitGemm:
    gemm: Node  # Gemm or MatMul
    chain: list[Node]  # the Reshapes between it and the Split (last dim kept)
    weights: np.ndarray  # [G, K, N]
    bias: np.ndarray | None  # [G, N]


def _single_user(graph: Graph, v: Value) -> Node | None:
    users = graph.users(v.name)
    return users[0] if len(users) == 1 and not graph.is_output(v.name) else None


def _split_source(graph: Graph, split: Node) -> _SplitGemm | None:
    """The GEMM behind `split` when it cuts the GEMM's columns into G equal blocks."""
    src = split.inputs[0]
    shape = _static(src)
    g = len(split.outputs)
    if shape is None or g < 2 or split.attrs.axis % len(shape) != len(shape) - 1 or shape[-1] % g:
        return None
    if any(_static(o) is None or _static(o)[-1] != shape[-1] // g for o in split.outputs):
        return None  # unequal blocks
    chain: list[Node] = []
    node = graph.producer(src.name)
    while node is not None and node.op == "Reshape" and node.domain == "":
        inner = _static(node.inputs[0])
        if inner is None or inner[-1] != shape[-1] or _single_user(graph, node.outputs[0]) is None:
            return None
        chain.append(node)
        node = graph.producer(node.inputs[0].name)
    if node is None or node.domain != "" or node.op not in ("Gemm", "MatMul") or None in node.inputs[:2]:
        return None
    if _single_user(graph, node.outputs[0]) is None:
        return None
    x, w = node.inputs[0], node.inputs[1]
    wdata, xs = graph.const(w.name), _static(x)
    if wdata is None or wdata.ndim != 2 or xs is None or graph.const(x.name) is not None:
        return None
    bias = None
    if node.op == "Gemm":
        a = node.attrs
        if a.transA or a.alpha != 1.0:
            return None
        if a.transB:
            wdata = wdata.T
        if len(node.inputs) > 2 and node.inputs[2] is not None:
            c = graph.const(node.inputs[2].name)
            if c is None or c.size != shape[-1] or a.beta != 1.0:
                return None
            bias = c.reshape(g, shape[-1] // g)
    k, total = wdata.shape
    n = total // g
    if total != shape[-1] or not _aligned(math.prod(xs[:-1]), n):
        return None
    weights = np.ascontiguousarray(wdata.reshape(k, g, n).transpose(1, 0, 2))
    return _SplitGemm(node, chain, weights, bias)


def _split_gemms(graph: Graph) -> Graph:
    found = {
        n.name: sg
        for n in graph.nodes
        if n.op == "Split" and n.domain == "" and (sg := _split_source(graph, n)) is not None
    }
    if not found:
        return graph

    def visit(node: Node, ctx: RewriteContext):
        sg = found.get(node.name)
        if sg is None:
            return None
        x = ctx.new(sg.gemm.inputs[0])
        assert x is not None
        shapes = [_static(o) for o in node.outputs]
        outs = _batched(ctx.b, x, sg.weights, sg.bias, shapes, sg.gemm.name + "_split")
        return Rewritten(outs, [sg.gemm, *sg.chain, node])

    out = rewrite_graph(graph, visit)
    log.info("fuse_horizontal: %d GEMM(s) whose output is split by columns made batched", len(found))
    return out
