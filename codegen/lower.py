"""Lowering an optimized graph to a kernel plan: one step per node, in a memory-aware order.

Every shape must be concrete (bind_shapes runs first). Reshape-like ops become alias steps: views
of their input with no kernel and no memory of their own.

The plan keeps each step's IR node beside it (`LoweredPlan.nodes`, by step name), so code
generation reads typed attrs and TensorTypes from the node; the step's JSON attrs are only the
engine file's record of them.
"""

from __future__ import annotations

import heapq
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from graphc.codegen.views import slab_offset
from graphc.errors import CompileError
from graphc.ir.attrs import attrs_to_json
from graphc.ir.graph import Graph, Node
from graphc.ir.kinds import node_kind
from graphc.ir.types import TensorType, kind_of
from graphc.ops.registry import Category, get_op
from graphc.passes.provenance import origins_of
from graphc.runtime.plan import ALIAS, ARENA, INPUT, WEIGHT, KernelPlan, Step, TensorSpec

if TYPE_CHECKING:
    from graphc.codegen.kernel import StepContext

log = logging.getLogger(__name__)


@dataclass
class LoweredPlan(KernelPlan):
    """A kernel plan as lowering leaves it (no launches yet), with the IR node of every step.

    It is a KernelPlan (the memory planner and the CPU executor take it as one); only the
    KernelPlan fields reach an engine file."""

    nodes: dict[str, Node] = field(default_factory=dict, repr=False)  # step name -> the node it lowers

    def context(
        self,
        step: Step,
        weights: Mapping[str, Any],
        *,
        precision: str = "fp32",
        allow_tf32: bool = False,
        params: dict[str, Any] | None = None,
    ) -> StepContext:
        """The StepContext a kernel family generates `step` from."""
        from graphc.codegen.kernel import StepContext

        node = self.nodes.get(step.name)
        if node is None:
            raise CompileError(f"step '{step.name}' has no IR node in its plan")
        return StepContext(step, node, self.tensors, weights, precision, allow_tf32, params)


# Ops whose output is its input's bytes under another shape.
ALIAS_OPS = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity"})


def _spec(name: str, t, kind: str, alias_of: str | None = None, alias_offset: int = 0) -> TensorSpec:
    if not isinstance(t, TensorType):
        raise CompileError(f"value '{name}' is {kind_of(t)} ({t}); graphc compiles tensor graphs only")
    if not t.is_static:
        raise CompileError(f"value '{name}' has shape {t}, which is not concrete: bind the input shapes")
    return TensorSpec(name, t.dtype.numpy.name, list(t.static_shape), t.nbytes, kind, alias_of, alias_offset)


def _is_alias(node: Node) -> bool:
    return node.domain == "" and node.op in ALIAS_OPS and node.inputs and node.inputs[0] is not None


def _inplace_inputs(node: Node) -> list[int]:
    """Inputs whose buffer the (single) output may take over: elementwise reads of the element it
    writes. For a fused node, the epilogue's extra inputs of the output's exact type."""
    if len(node.outputs) != 1:
        return []
    out_t = node.outputs[0].type
    opdef = get_op(node.op, node.domain)
    if opdef.category is Category.ELEMENTWISE:
        first = 0
    elif opdef.category is Category.FUSED:
        first = node.attrs.anchor_inputs
    else:
        return []
    return [i for i, v in enumerate(node.inputs) if i >= first and v is not None and v.type == out_t]


def schedule(graph: Graph) -> list[Node]:
    """A topological order that keeps the bytes live at once low: among the nodes ready to run,
    take the one that grows live memory least (frees most), ties going to the original order."""
    nodes = list(graph.nodes)
    index = {id(n): i for i, n in enumerate(nodes)}
    producers = graph.producers
    remaining_users: dict[str, int] = {}
    for n in nodes:
        for v in {v.name for v in n.inputs if v is not None}:
            remaining_users[v] = remaining_users.get(v, 0) + 1
    deps = {}
    for n in nodes:
        deps[id(n)] = len({producers[v.name].name for v in n.inputs if v is not None and v.name in producers})
    dependents: dict[str, list[Node]] = {}
    for n in nodes:
        for pname in {producers[v.name].name for v in n.inputs if v is not None and v.name in producers}:
            dependents.setdefault(pname, []).append(n)
    outputs = graph.output_value_names

    def nbytes(v) -> int:
        t = v.type
        return t.nbytes if isinstance(t, TensorType) and t.is_static else 0

    def score(n: Node) -> int:
        if _is_alias(n):
            return -(1 << 60)  # views cost nothing: take them at once
        grow = sum(nbytes(v) for v in n.outputs)
        free = sum(
            nbytes(v)
            for v in {v.name: v for v in n.inputs if v is not None}.values()
            if v.name in producers and remaining_users.get(v.name) == 1 and v.name not in outputs
        )
        return grow - free

    ready = [n for n in nodes if deps[id(n)] == 0]
    heap = [(score(n), index[id(n)], n) for n in ready]
    heapq.heapify(heap)
    order: list[Node] = []
    while heap:
        # Scores change as other nodes run; re-score the top before taking it.
        s, i, n = heapq.heappop(heap)
        fresh = score(n)
        if fresh != s and heap and (fresh, i) > heap[0][:2]:
            heapq.heappush(heap, (fresh, i, n))
            continue
        order.append(n)
        for v in {v.name for v in n.inputs if v is not None}:
            remaining_users[v] -= 1
        for d in dependents.get(n.name, ()):
            deps[id(d)] -= 1
            if deps[id(d)] == 0:
                heapq.heappush(heap, (score(d), index[id(d)], d))
    if len(order) != len(nodes):
        raise CompileError("the graph has a cycle")
    return order


def peak_live_bytes(graph: Graph, order: list[Node]) -> int:
    """The largest total of bytes live at any step for this order (aliases counted once)."""
    from graphc.codegen.memory import lifetimes_from_plan

    plan = build_plan(graph, order)
    return lifetimes_from_plan(plan).lower_bound


def _refuse_control_flow(node: Node) -> None:
    """An If/Loop/Scan left after passes/fold_control_flow.py depends on data at run time."""
    if get_op(node.op, node.domain).category is not Category.CONTROL_FLOW:
        return
    raise CompileError(
        f"{node.op} node '{node.name}': data-dependent control flow (its condition, trip count or exit "
        "depends on run-time values, or it runs more than 64 iterations) reached lowering without its sub-plans "
        "(graphc/host_if.py and graphc/host_loop.py plan them first); graphc.interpret runs it"
    )


def build_plan(graph: Graph, order: list[Node], host_ifs: Mapping[str, dict[str, Any]] | None = None) -> LoweredPlan:
    """`host_ifs`: the step attrs (two branch sub-plans, graphc/host_if.py) of data-dependent If
    nodes the CPU engine chooses between on the host; any other control flow is refused."""
    host_ifs = host_ifs or {}
    tensors: dict[str, TensorSpec] = {}
    for v in graph.inputs:
        tensors[v.name] = _spec(v.name, v.type, INPUT)
    for name, c in graph.constants.items():
        tensors[name] = _spec(name, c.value.type, WEIGHT)
    steps = []
    for i, node in enumerate(order):
        if node.name not in host_ifs:
            _refuse_control_flow(node)
        alias = _is_alias(node)
        offset = 0 if alias else slab_offset(graph, node)  # x[i] of a contiguous x: a view at an offset
        if offset is not None:
            alias = True
        for v in node.outputs:
            if alias:
                tensors[v.name] = _spec(v.name, v.type, ALIAS, node.inputs[0].name, offset or 0)
            else:
                tensors[v.name] = _spec(v.name, v.type, ARENA)
        steps.append(
            Step(
                index=i,
                name=node.name,
                kind=node_kind(node),
                op=node.op,
                domain=node.domain,
                attrs=host_ifs[node.name] if node.name in host_ifs else attrs_to_json(node.attrs),
                inputs=[None if v is None else v.name for v in node.inputs],
                outputs=[v.name for v in node.outputs],
                alias=alias,
                origins=list(origins_of(graph, node.name)),
                inplace=_inplace_inputs(node),
            )
        )
    nodes = {node.name: node for node in order}
    if len(nodes) != len(order):
        dup = sorted({n.name for n in order if sum(m.name == n.name for m in order) > 1})
        raise CompileError(f"node names {dup[:5]} are not unique; each step is named after its node")
    return LoweredPlan(
        tensors=tensors,
        steps=steps,
        inputs=[v.name for v in graph.inputs],
        outputs=[v.name for v in graph.outputs],
        output_names=list(graph.output_names),
        nodes=nodes,
    )


def lower_to_plan(graph: Graph, host_ifs: Mapping[str, dict[str, Any]] | None = None) -> LoweredPlan:
    """The kernel plan of a graph with concrete shapes, in the order of lower peak memory of
    (a) the graph's own order and (b) the memory-aware schedule. `host_ifs`: see build_plan."""
    original = list(graph.nodes)
    candidates = [original]
    try:
        scheduled = schedule(graph)
        if scheduled != original:
            candidates.append(scheduled)
    except CompileError:
        raise
    best = None
    for order in candidates:
        plan = build_plan(graph, order, host_ifs)
        from graphc.codegen.memory import lifetimes_from_plan

        lb = lifetimes_from_plan(plan).lower_bound
        if best is None or lb < best[0]:
            best = (lb, plan)
    assert best is not None
    return best[1]
