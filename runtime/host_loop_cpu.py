"""Host loops on the CPU engine (issue 12 item 1): a Loop or Scan step whose body is a planned
sub-plan (graphc/host_loop.py writes the layout, documented there), run by an executor and arena
of its own once per iteration.

Per iteration the body's inputs are written into its arena (the iteration number, the condition,
the carried values, the captures, a Scan's slices) and its outputs read back; a Loop's condition
is read on the host after each iteration where the body computes it. Scan outputs are
preallocated at their static length (the step's planned output) and each element is written into
place. The CPU engine is the numpy reference, so these host copies cost what numpy copies cost.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from graphc.runtime.errors import EngineError
from graphc.runtime.plan import KernelPlan, MemoryPlan, Step, memory_plan_from_json

HOST_LOOP_VERSION = 1  # the layout graphc/host_loop.py writes

StepFn = Callable[[list[Any]], list[Any]]


def is_host_loop(step: Step) -> bool:
    return (
        step.op in ("Loop", "Scan")
        and step.domain == ""
        and isinstance(step.attrs, dict)
        and "host_loop_version" in step.attrs
    )


def _int(attrs: dict[str, Any], key: str, where: str) -> int:
    v = attrs.get(key)
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise EngineError(f"{where}: its {key!r} is {v!r}, not a count")
    return v


def _ints(attrs: dict[str, Any], key: str, n: int, where: str) -> list[int]:
    v = attrs.get(key)
    if not isinstance(v, list) or len(v) != n or not all(isinstance(x, int) and x >= 0 for x in v):
        raise EngineError(f"{where}: its {key!r} is {v!r}, not {n} non-negative ints")
    return v


def loop_layout(step: Step, plan_outputs: list[Any] | None = None) -> dict[str, Any]:
    """The checked attrs of a host-loop step: counts, axes, and its body's plan data; a malformed
    layout is one EngineError naming the step."""
    a = step.attrs
    where = f"step '{step.name}' ({step.op})"
    if a.get("host_loop_version") != HOST_LOOP_VERSION or a.get("op") != step.op:
        raise EngineError(f"{where}: loop layout {a.get('host_loop_version')!r}, expected {HOST_LOOP_VERSION}")
    out: dict[str, Any] = {"where": where, "op": step.op}
    n, k = _int(a, "num_carried", where), _int(a, "num_scan", where)
    out.update(num_carried=n, num_scan=k)
    if n + k != len(step.outputs):
        raise EngineError(f"{where}: {n} carried + {k} scan outputs, the step has {len(step.outputs)} outputs")
    if step.op == "Loop":
        trip, cond = a.get("trip_count"), a.get("body_cond")
        if trip is not None and (not isinstance(trip, int) or isinstance(trip, bool) or trip < 0):
            raise EngineError(f"{where}: its trip_count is {trip!r}")
        if cond is not None and not isinstance(cond, bool):
            raise EngineError(f"{where}: its body_cond is {cond!r}")
        bound = a.get("trip_bound")  # M where it is a constant: nothing to read back for it
        if bound is not None and (not isinstance(bound, int) or isinstance(bound, bool) or bound < 0):
            raise EngineError(f"{where}: its trip_bound is {bound!r}")
        out.update(trip_count=trip, body_cond=cond, trip_bound=bound, formals=2 + n)
    else:
        m = _int(a, "num_scan_inputs", where)
        out.update(
            num_scan_inputs=m,
            length=_int(a, "length", where),
            in_axes=_ints(a, "scan_input_axes", m, where),
            in_dirs=_ints(a, "scan_input_directions", m, where),
            out_axes=_ints(a, "scan_output_axes", k, where),
            out_dirs=_ints(a, "scan_output_directions", k, where),
            formals=n + m,
        )
    d = a.get("body")
    try:
        out["plan"] = KernelPlan.from_json(d["plan"])
        out["memory"] = memory_plan_from_json(d["memory"])
        out["num_captures"] = int(d["num_captures"])
        out["take"] = [int(i) for i in d["inputs_from"]]
    except (KeyError, TypeError, ValueError, AttributeError) as e:  # a malformed or edited sub-plan
        raise EngineError(f"{where}: its body sub-plan is malformed ({type(e).__name__}: {e})") from None
    plan: KernelPlan = out["plan"]
    if len(plan.inputs) != out["formals"] + len(out["take"]) or any(
        not 0 <= i < out["num_captures"] for i in out["take"]
    ):
        raise EngineError(f"{where}: its body sub-plan's inputs do not match the values the step passes")
    n_out = (1 if step.op == "Loop" else 0) + n + k
    if len(plan.outputs) != n_out:
        raise EngineError(f"{where}: its body sub-plan gives {len(plan.outputs)} values, the body {n_out}")
    return out


def host_loop_kernel(step: Step, plan: KernelPlan, weights: Mapping[str, np.ndarray], factory: Any) -> StepFn:
    """The kernel of a host-loop step: the body's executor, run once per iteration."""
    from graphc.runtime.cpu import CPUExecutor

    lay = loop_layout(step)
    body_plan: KernelPlan = lay["plan"]
    memory: MemoryPlan = lay["memory"]
    for_plan = getattr(factory, "for_plan", None)  # the loader's factory checks each step's results
    try:
        body = CPUExecutor(body_plan, memory, weights, for_plan(body_plan) if for_plan else factory)
    except EngineError as e:
        raise EngineError(f"{lay['where']} body: {e}") from None
    specs = [plan.tensors[o] for o in step.outputs]
    n, k, where = lay["num_carried"], lay["num_scan"], lay["where"]
    for name, spec in zip(body_plan.outputs[len(body_plan.outputs) - n - k :][:n], specs[:n], strict=True):
        t = body_plan.tensors[name]
        if (t.dtype, list(t.shape)) != (spec.dtype, list(spec.shape)):
            raise EngineError(f"{where}: body output {name} is {t.dtype}{t.shape}, the step's {spec.dtype}{spec.shape}")
    outputs = [np.zeros(tuple(s.shape), dtype=_np_dtype(s.dtype)) for s in specs[n:]]
    names = body_plan.inputs

    def feeds(formals: list[Any], caps: list[Any]) -> dict[str, Any]:
        return dict(zip(names, [*formals, *(caps[i] for i in lay["take"])], strict=True))

    def run_body(formals: list[Any], caps: list[Any]) -> list[np.ndarray]:
        res = body.run(feeds(formals, caps))
        return [res[p] for p in body_plan.output_names]

    def run_loop(inputs: list[Any]) -> list[Any]:
        m, cond = (list(inputs) + [None, None])[:2]
        c = lay["num_captures"]
        carried = list(inputs[2 : len(inputs) - c])
        caps = list(inputs[len(inputs) - c :]) if c else []
        if len(carried) != n:
            raise EngineError(f"{where}: {len(carried)} carried values given, the body takes {n}")
        trip = None if m is None else int(np.asarray(m).reshape(()))
        keep = True if cond is None else _truth(cond, where)
        scans = [np.empty_like(o) for o in outputs]
        i = 0
        while keep and (trip is None or i < trip):
            outs = run_body([np.array(i, np.int64), np.array(keep), *carried], caps)
            keep = _truth(outs[0], where) if lay["body_cond"] is None else lay["body_cond"]
            carried = outs[1 : 1 + n]
            for j in range(k):
                if i >= scans[j].shape[0]:
                    raise EngineError(f"{where}: iteration {i} runs past scan output {j}'s planned length")
                scans[j][i] = outs[1 + n + j]
            i += 1
        for j in range(k):
            if i != scans[j].shape[0]:
                raise EngineError(f"{where}: {i} iterations ran, scan output {j} is planned for {scans[j].shape[0]}")
        return [*carried, *scans]

    def run_scan(inputs: list[Any]) -> list[Any]:
        c, ms = lay["num_captures"], lay["num_scan_inputs"]
        caps = list(inputs[len(inputs) - c :]) if c else []
        states = list(inputs[: len(inputs) - c - ms])
        xs = [np.asarray(x) for x in inputs[len(inputs) - c - ms : len(inputs) - c]]
        length = lay["length"]
        scans = [np.empty_like(o) for o in outputs]
        for t in range(length):
            slices = [
                np.take(x, length - 1 - t if d else t, axis=ax)
                for x, ax, d in zip(xs, lay["in_axes"], lay["in_dirs"], strict=True)
            ]
            outs = run_body([*states, *slices], caps)
            states = outs[:n]
            for j in range(k):
                pos = length - 1 - t if lay["out_dirs"][j] else t
                np.moveaxis(scans[j], lay["out_axes"][j], 0)[pos] = outs[n + j]
        return [*states, *scans]

    return run_loop if step.op == "Loop" else run_scan


def _np_dtype(name: str) -> np.dtype:
    from graphc.runtime.cpu import numpy_dtype

    return numpy_dtype(name)


def _truth(c: Any, where: str) -> bool:
    a = np.asarray(c)
    if a.size != 1:
        raise EngineError(f"{where}: the condition must have one element, it has shape {a.shape}")
    return bool(a.reshape(()))


__all__ = ["HOST_LOOP_VERSION", "host_loop_kernel", "is_host_loop", "loop_layout"]
