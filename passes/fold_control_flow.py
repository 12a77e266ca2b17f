"""Control flow decided at compile time becomes an ordinary tensor graph.

- `If` whose condition is known at compile time (a constant, or computed from constants and
  static shapes: exporters write `Shape -> Gather -> Equal`; the builder knows such values): the
  chosen branch's nodes are inlined into the parent graph, its captures replaced by the node's
  inputs they are bound to.
- `Loop` whose every iteration's condition is known (a static trip count M with a condition that
  is absent, constant or passed through; or a body condition that folds each iteration) is
  unrolled: the body is inlined once per iteration with the iteration number as a constant, the
  carried values threaded through, and each scan output stacked (Unsqueeze + Concat).
- `Scan` with a static sequence length is unrolled the same way, each step's slice a Gather at
  a constant index (reversed for a reverse direction).

Inlined nodes are re-inferred over the actual inputs, so a body typed loosely by its exporter
gets exact types, and control flow nested in a branch or body folds in the same sweep. A loop or
scan of more than MAX_UNROLL iterations stays (logged): the unrolled graph grows with the count.
What stays (data-dependent, or long) the engines run as host loops: the body one planned sub-plan,
iterated on the host (graphc/host_loop.py); the interpreter runs the general form.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np

from graphc.errors import GraphcError
from graphc.ir.builder import GraphBuilder
from graphc.ir.graph import Graph, Node, Value
from graphc.ir.types import TensorType
from graphc.ops.registry import Category, get_op
from graphc.passes.rewrite import RewriteContext, Rewritten, rewrite_graph

log = logging.getLogger(__name__)

# Iterations of a Loop or steps of a Scan unrolled at most; larger ones stay control flow.
MAX_UNROLL = 64


def _is_control_flow(node: Node) -> bool:
    return get_op(node.op, node.domain).category is Category.CONTROL_FLOW


def fold_control_flow(graph: Graph) -> Graph:
    """Inline If nodes with known conditions and unroll small static Loop/Scan nodes."""
    if not any(_is_control_flow(n) for n in graph.nodes):
        return graph

    def visit(node: Node, ctx: RewriteContext) -> Rewritten | None:
        if not _is_control_flow(node):
            return None
        outs = fold_node(ctx.b, node, [ctx.new(v) for v in node.inputs], node.name)
        return None if outs is None else Rewritten(outs, absorbed=[node])

    return rewrite_graph(graph, visit)


def fold_node(b: GraphBuilder, node: Node, ins: Sequence[Value | None], where: str) -> list[Value] | None:
    """The values replacing a control-flow node's outputs, built into `b`; None to keep it."""
    try:
        if node.op == "If":
            return _fold_if(b, node, ins, where)
        if node.op == "Loop":
            return _unroll_loop(b, node, ins, where)
        if node.op == "Scan":
            return _unroll_scan(b, node, ins, where)
    except GraphcError as e:  # e.g. a body whose inference fails on the actual shapes: keep the node
        log.info("%s node '%s' stays control flow: %s", node.op, where, e)
    return None


def inline(b: GraphBuilder, sub: Graph, bindings: Sequence[Value], prefix: str) -> list[Value]:
    """Build `sub`'s nodes into `b` over `bindings` (its inputs, then its captures); its outputs."""
    params = (*sub.inputs, *sub.captures)
    if len(params) != len(bindings):
        raise GraphcError(f"subgraph '{sub.name}' takes {len(params)} values, {len(bindings)} given")
    env: dict[str, Value] = {p.name: v for p, v in zip(params, bindings, strict=True)}
    for name, c in sub.constants.items():
        env[name] = b.add_constant(c.data, f"{prefix}{name}")
    for n in sub.nodes:
        ins = [None if v is None else env[v.name] for v in n.inputs]
        name = f"{prefix}{n.name}"
        outs = fold_node(b, n, ins, name) if _is_control_flow(n) else None
        if outs is None:
            hints = [f"{prefix}{v.name}" for v in n.outputs]
            outs = list(b.add_node(n.op, ins, n.attrs, name=name, outputs=hints, domain=n.domain).outputs)
        for v, nv in zip(n.outputs, outs, strict=True):
            env[v.name] = nv
    return [env[v.name] for v in sub.outputs]


def _fold_if(b: GraphBuilder, node: Node, ins: Sequence[Value | None], where: str) -> list[Value] | None:
    cond = b.known_value(ins[0])
    if cond is None or np.asarray(cond).size != 1:
        return None
    taken = bool(np.asarray(cond).reshape(()))
    then_b, else_b = node.attrs.then_branch, node.attrs.else_branch
    nt = len(then_b.captures)
    caps = list(ins[1:])
    branch, bound = (then_b, caps[:nt]) if taken else (else_b, caps[nt:])
    log.info(
        "If node '%s': condition is %s at compile time; %s branch inlined", where, taken, "then" if taken else "else"
    )
    return inline(b, branch, bound, f"{where}/{'then' if taken else 'else'}/")


def _stack(b: GraphBuilder, values: list[Value], axis: int, where: str) -> Value:
    """Stack same-shaped values along a new `axis` (Unsqueeze each, then Concat)."""
    axes = b.add_constant(np.array([axis], np.int64), f"{where}/stack_axis")
    parts = [b.op("Unsqueeze", [v, axes], name=f"{where}/unsqueeze") for v in values]
    if len(parts) == 1:
        return parts[0]
    return b.op("Concat", parts, {"axis": axis}, name=f"{where}/stack")


def _empty_scan(b: GraphBuilder, t: object, axis: int, where: str) -> Value | None:
    """A scan output of zero steps: an empty constant where the element type is static."""
    if not isinstance(t, TensorType) or not t.is_static:
        return None
    shape = list(t.static_shape)
    shape.insert(axis + len(shape) + 1 if axis < 0 else axis, 0)
    return b.add_constant(np.zeros(shape, dtype=t.dtype.numpy), f"{where}/empty")


def _unroll_loop(b: GraphBuilder, node: Node, ins: Sequence[Value | None], where: str) -> list[Value] | None:
    body: Graph = node.attrs.body
    ins = list(ins) + [None] * max(0, 2 - len(ins))
    c = len(body.captures)
    caps = ins[len(ins) - c :] if c else []
    carried = list(ins[2 : len(ins) - c])
    n = len(carried)
    k = len(body.outputs) - 1 - n
    m_val = b.known_value(ins[0])
    trip = None if m_val is None else max(int(np.asarray(m_val).reshape(())), 0)
    cond = ins[1]
    cond_val = True if cond is None else b.known_value(cond)
    if cond_val is None:
        return None
    if trip is not None and trip > MAX_UNROLL:
        log.info("Loop node '%s': %d iterations, more than MAX_UNROLL=%d; not unrolled", where, trip, MAX_UNROLL)
        return None
    scans: list[list[Value]] = [[] for _ in range(k)]
    i = 0
    while bool(np.asarray(cond_val).reshape(())) and (trip is None or i < trip):
        if i >= MAX_UNROLL:
            log.info("Loop node '%s': runs past MAX_UNROLL=%d iterations; not unrolled", where, MAX_UNROLL)
            return None
        it = b.add_constant(np.array(i, np.int64), f"{where}/iter{i}")
        cin = b.add_constant(np.array(True), f"{where}/cond{i}")
        outs = inline(b, body, [it, cin, *carried, *caps], f"{where}/{i}/")
        cond_val = b.known_value(outs[0])
        if cond_val is None:  # the body's condition depends on data: an early exit at run time
            return None
        carried = outs[1 : 1 + n]
        for j in range(k):
            scans[j].append(outs[1 + n + j])
        i += 1
    results = list(carried)
    for j in range(k):
        if scans[j]:
            results.append(_stack(b, scans[j], 0, f"{where}/scan{j}"))
        else:
            empty = _empty_scan(b, body.outputs[1 + n + j].type, 0, f"{where}/scan{j}")
            if empty is None:
                return None
            results.append(empty)
    log.info("Loop node '%s': unrolled %d iterations", where, i)
    return results


def _unroll_scan(b: GraphBuilder, node: Node, ins: Sequence[Value | None], where: str) -> list[Value] | None:
    body: Graph = node.attrs.body
    a = node.attrs
    m = int(a.num_scan_inputs)
    c = len(body.captures)
    caps = list(ins[len(ins) - c :]) if c else []
    states = list(ins[: len(ins) - c - m])
    xs = list(ins[len(ins) - c - m : len(ins) - c])
    n, k = len(states), len(body.outputs) - len(states)
    in_axes = list(a.scan_input_axes or [0] * m)
    in_dirs = list(a.scan_input_directions or [0] * m)
    out_axes = list(a.scan_output_axes or [0] * k)
    out_dirs = list(a.scan_output_directions or [0] * k)
    lengths = set()
    for x, ax in zip(xs, in_axes, strict=True):
        t = None if x is None else x.type
        if not isinstance(t, TensorType) or t.shape is None:
            return None
        d = t.shape[ax + len(t.shape) if ax < 0 else ax]
        if not isinstance(d, int):
            return None
        lengths.add(d)
    if len(lengths) != 1:
        return None
    length = lengths.pop()
    if length > MAX_UNROLL:
        log.info("Scan node '%s': %d steps, more than MAX_UNROLL=%d; not unrolled", where, length, MAX_UNROLL)
        return None
    scans: list[list[Value]] = [[] for _ in range(k)]
    for t in range(length):
        slices = []
        for j, (x, ax, d) in enumerate(zip(xs, in_axes, in_dirs, strict=True)):
            idx = b.add_constant(np.array(length - 1 - t if d else t, np.int64), f"{where}/t{t}")
            slices.append(b.op("Gather", [x, idx], {"axis": ax}, name=f"{where}/{t}/slice{j}"))
        outs = inline(b, body, [*states, *slices, *caps], f"{where}/{t}/")
        states = outs[:n]
        for j in range(k):
            scans[j].append(outs[n + j])
    results = list(states)
    for j in range(k):
        if not scans[j]:
            empty = _empty_scan(b, body.outputs[n + j].type, out_axes[j], f"{where}/scan{j}")
            if empty is None:
                return None
            results.append(empty)
            continue
        seq = scans[j][::-1] if out_dirs[j] else scans[j]
        rank = seq[0].ttype.rank if seq[0].ttype.shape is not None else None
        axis = out_axes[j]
        if axis < 0:
            if rank is None:
                return None
            axis += rank + 1
        results.append(_stack(b, seq, axis, f"{where}/scan{j}"))
    log.info("Scan node '%s': unrolled %d steps", where, length)
    return results
