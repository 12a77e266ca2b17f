"""Loops the optimizer could not unroll, on both engines: the body is a planned sub-plan of its
own, iterated on the host (issue 12 item 1).

passes/fold_control_flow.py unrolls a Loop or Scan whose every iteration is known and that is
short (MAX_UNROLL). What is left here has a trip count or an exit condition known only at run
time, or too many iterations to unroll. For each such node the body is specialized to the node's
actual input types (graphc/host_if.py `specialize_subgraph`: its iteration number, condition and
carried values as inputs, its captures bound to the node's inputs, constants folded in), then
optimized, lowered and memory-planned for the same target as the main graph, exactly as a host
If's branch is (`plan_sub`; nested control flow the same way, recursively). The step's attrs hold
the body sub-plan and what the runtime needs to drive it (layout: HOST_LOOP_VERSION):

    Loop: {"host_loop_version", "op": "Loop", "num_carried", "num_scan", "trip_count" (static count
           or None), "body_cond" (True/False where the body's condition output is known, None
           where it depends on data), "body": {plan, memory, num_captures, inputs_from}}
          body sub-plan inputs: iteration, condition, carried values, captures[inputs_from];
          outputs: condition, carried values, scan outputs (one element each)
    Scan: {"host_loop_version", "op": "Scan", "num_carried", "num_scan_inputs", "num_scan", "length",
           "scan_input_axes", "scan_input_directions", "scan_output_axes", "scan_output_directions",
           "body": {...}}   (axes normalized to be non-negative)
          body sub-plan inputs: states, one slice per scan input, captures[inputs_from];
          outputs: states, scan outputs (one element each)

Shapes: the engines plan one static shape per tensor, so a carried value must keep its shape
across iterations, and a scan output must have a static length (a static trip count without an
early exit, or a Scan): it is preallocated at that length and each iteration's element is written
into place. Anything else is refused with one line naming the node and the value (the
interpreter, graphc.interpret, runs the general form). runtime/host_loop_cpu.py and
runtime/host_loop_cuda.py run the steps.
"""

from __future__ import annotations

import logging
from typing import Any

from graphc.errors import CompileError
from graphc.host_if import HostIfs, plan_sub, specialize_subgraph
from graphc.ir.graph import Graph, Node
from graphc.ir.types import DType, TensorType

log = logging.getLogger(__name__)

HOST_LOOP_VERSION = 1  # runtime/host_loop_cpu.py and runtime/host_loop_cuda.py check it


def _static(node: Node, what: str, v: Any) -> TensorType:
    t = v.type
    if not isinstance(t, TensorType) or not t.is_static:
        raise CompileError(
            f"{node.op} node '{node.name}': {what} '{v.name}' is {t}; the engines plan static shapes "
            "(graphc.interpret runs it)"
        )
    return t


def _same(node: Node, what: str, name: str, want: TensorType, got: Any) -> None:
    """A value the body gives back must keep the type it entered with."""
    if not isinstance(got, TensorType) or got.dtype != want.dtype or got.shape != want.shape:
        raise CompileError(
            f"{node.op} node '{node.name}': {what} '{name}' changes shape across iterations (enters as {want}, "
            f"the body gives {got}); the engines plan one shape per value (graphc.interpret runs it)"
        )


def _check_outputs(node: Node, want: list[list[int] | None]) -> Any:
    """A check for plan_sub: the body sub-plan's outputs have the shapes the runtime writes."""

    def check(shapes: list[tuple[str, list[int]]]) -> None:
        for i, ((_n, shape), w) in enumerate(zip(shapes, want, strict=True)):
            if w is not None and list(shape) != list(w):
                raise CompileError(
                    f"{node.op} node '{node.name}': body output {i} has shape {list(shape)}, expected {list(w)}"
                )

    return check


def plan_host_loop(out: HostIfs, node: Node, graph: Graph, opt_level: int, target: Any, prefix: str = "") -> None:
    """Plan the Loop or Scan `node` of `graph` (optimized for `target`; None: CPU) as a host loop:
    its step attrs into `out.attrs`, the body's weights into `out.weights`, one report line."""
    where = f"{prefix}{node.name}/body"
    if node.op == "Loop":
        attrs, steps = _plan_loop(out, node, graph, opt_level, target, where)
    else:
        attrs, steps = _plan_scan(out, node, graph, opt_level, target, where)
    out.attrs[node.name] = attrs
    line = _report_line(node, attrs, steps, target is not None and getattr(target, "is_cuda", False))
    log.info("%s", line)
    out.lines.append(line)


def _plan_loop(
    out: HostIfs, node: Node, graph: Graph, opt_level: int, target: Any, where: str
) -> tuple[dict[str, Any], int]:
    from graphc.ops.control_flow import body_cond_passthrough, static_trip_count

    body: Graph = node.attrs.body
    ins = list(node.inputs) + [None] * max(0, 2 - len(node.inputs))
    c = len(body.captures)
    caps = ins[len(ins) - c :] if c else []
    carried = ins[2 : len(ins) - c]
    n = len(carried)
    k = len(body.outputs) - 1 - n
    types = [_static(node, "loop-carried value", v) for v in carried]
    scan_shapes = []
    for j in range(k):
        v = node.outputs[n + j]
        t = v.type
        if not isinstance(t, TensorType) or not t.is_static:
            raise CompileError(
                f"Loop node '{node.name}': scan output '{v.name}' has a length known only at run time (the trip "
                "count or the exit depends on data); the engines plan static shapes (graphc.interpret runs it)"
            )
        scan_shapes.append(list(t.static_shape))
    formals = [TensorType(DType.int64, ()), TensorType(DType.bool, ()), *types]
    g, inputs_from = specialize_subgraph(body, node, caps, where, graph, formals)
    for j in range(n):
        _same(node, "loop-carried value", carried[j].name, types[j], g.outputs[1 + j].type)
    cond_out = g.outputs[0].type
    if not isinstance(cond_out, TensorType) or cond_out.dtype != DType.bool or cond_out.numel != 1:
        raise CompileError(f"Loop node '{node.name}': the body's condition output is {cond_out}, not one bool")
    known = {name: c_.data for name, c_ in graph.constants.items()}
    m_val = known.get(ins[0].name) if ins[0] is not None else None
    c_val = known.get(ins[1].name) if ins[1] is not None else None
    trip = static_trip_count(m_val, c_val, ins[1] is not None, body)
    attrs: dict[str, Any] = {
        "host_loop_version": HOST_LOOP_VERSION,
        "op": "Loop",
        "num_carried": n,
        "num_scan": k,
        "trip_count": trip,
        "body_cond": body_cond_passthrough(body),
        # the trip count M where it is a constant (the body may still exit early): for the report
        "trip_bound": None if m_val is None else max(int(m_val.reshape(())), 0),
    }
    want = [list(cond_out.static_shape), *[list(t.static_shape) for t in types], *[s[1:] for s in scan_shapes]]
    steps = plan_sub(out, node.name, "body", g, c, inputs_from, where, opt_level, target, attrs,
                     _check_outputs(node, want))  # fmt: skip
    return attrs, steps


def _plan_scan(
    out: HostIfs, node: Node, graph: Graph, opt_level: int, target: Any, where: str
) -> tuple[dict[str, Any], int]:
    body: Graph = node.attrs.body
    a = node.attrs
    m = int(a.num_scan_inputs)
    ins = list(node.inputs)
    c = len(body.captures)
    caps = ins[len(ins) - c :] if c else []
    states = ins[: len(ins) - c - m]
    xs = ins[len(ins) - c - m : len(ins) - c]
    n = len(states)
    k = len(body.outputs) - n
    st_types = [_static(node, "state", v) for v in states]
    x_types = [_static(node, "scan input", v) for v in xs]
    in_axes = [ax % len(t.static_shape) for ax, t in zip(a.scan_input_axes or [0] * m, x_types, strict=True)]
    out_types = [_static(node, "scan output", v) for v in node.outputs[n:]]
    out_axes = [ax % len(t.static_shape) for ax, t in zip(a.scan_output_axes or [0] * k, out_types, strict=True)]
    lengths = {t.static_shape[ax] for t, ax in zip(x_types, in_axes, strict=True)}
    if len(lengths) != 1:
        raise CompileError(f"Scan node '{node.name}': the scan inputs have lengths {sorted(lengths)}")
    length = lengths.pop()
    slices = [
        TensorType(t.dtype, tuple(d for i, d in enumerate(t.static_shape) if i != ax))
        for t, ax in zip(x_types, in_axes, strict=True)
    ]
    g, inputs_from = specialize_subgraph(body, node, caps, where, graph, [*st_types, *slices])
    for j in range(n):
        _same(node, "state", states[j].name, st_types[j], g.outputs[j].type)
    elems = [[d for i, d in enumerate(t.static_shape) if i != ax] for t, ax in zip(out_types, out_axes, strict=True)]
    attrs: dict[str, Any] = {
        "host_loop_version": HOST_LOOP_VERSION,
        "op": "Scan",
        "num_carried": n,
        "num_scan_inputs": m,
        "num_scan": k,
        "length": int(length),
        "scan_input_axes": in_axes,
        "scan_input_directions": [int(d) for d in (a.scan_input_directions or [0] * m)],
        "scan_output_axes": out_axes,
        "scan_output_directions": [int(d) for d in (a.scan_output_directions or [0] * k)],
    }
    want = [*[list(t.static_shape) for t in st_types], *elems]
    steps = plan_sub(out, node.name, "body", g, c, inputs_from, where, opt_level, target, attrs,
                     _check_outputs(node, want))  # fmt: skip
    return attrs, steps


def _report_line(node: Node, attrs: dict[str, Any], steps: int, cuda: bool) -> str:
    from graphc.runtime.host_loop_cuda import WHOLE_GRAPH_MAX_ITERATIONS

    static = (
        attrs["length"] if attrs["op"] == "Scan" else attrs["trip_count"] if attrs["body_cond"] is not None else None
    )
    if attrs["op"] == "Scan":
        count = f"{attrs['length']} steps, more than fold_control_flow's MAX_UNROLL"
        reads = "no condition to read"
    else:
        trip = attrs["trip_count"]
        count = (
            f"{trip} iterations, more than fold_control_flow's MAX_UNROLL"
            if trip is not None
            else f"at most {attrs['trip_bound']} iterations, with an exit computed from data"
            if attrs.get("trip_bound") is not None
            else "trip count and exit known only at run time"
        )
        if attrs["body_cond"] is None:
            reads = (
                "the body's condition read back every iteration (one 1-byte device-to-host copy and a stream sync)"
                if cuda
                else "the body's condition read every iteration"
            )
        else:
            reads = (
                "no early exit: the trip count and initial condition read back once per run (one small device-to-"
                "host copy each), then the iterations are queued without a sync"
                if cuda and static is None
                else "no early exit and a static trip count: nothing read back"
                if static is not None
                else "no early exit: the trip count read once per run"
            )
    if not cuda:
        how = "the CPU engine runs it once per iteration"
    elif static is not None and static <= WHOLE_GRAPH_MAX_ITERATIONS:
        how = (
            "the CUDA engine captures the whole loop (every iteration's copies and launches) as one CUDA graph on "
            "first use and replays it per run"
        )
    else:
        how = (
            "the CUDA engine replays the body as one CUDA graph per iteration (captured on first use), the carried "
            "values copied device to device into the body's inputs inside that graph"
        )
    scans = (
        f"; {attrs['num_scan']} scan output(s) preallocated at their static length, each iteration's element "
        "copied into place"
        if attrs["num_scan"]
        else ""
    )
    return (
        f"{node.op} node '{node.name}': not unrolled ({count}); its body is its own planned sub-plan ({steps} steps) "
        f"iterated on the host: {how}; {reads}{scans}"
    )


__all__ = ["HOST_LOOP_VERSION", "plan_host_loop"]
