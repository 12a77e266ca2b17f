"""Reference semantics of the control-flow ops If, Loop and Scan.

A control-flow node's subgraph attributes reach these kernels as *body runners*: objects with
`__call__(inputs: list) -> list` (run the subgraph on its formal inputs followed by its captures),
`num_captures` (how many of the node's trailing inputs are bound to the subgraph's captures) and
`output_dtypes` and `output_shapes` (numpy dtypes of the subgraph's outputs and their shapes,
None where not static: the empty scan outputs of a Loop that runs zero times). The
interpreter binds runners over IR graphs (graphc.interpreter); the runtime never sees an IR graph,
so these kernels import nothing of the compiler. The engines run control flow with each subgraph as
plan data of its own instead (runtime/cpu.py host_if_kernel, runtime/host_loop_cpu.py,
runtime/host_if_cuda.py, runtime/host_loop_cuda.py); these kernels are the interpreter's.

Node inputs, by op (C captures at the end, each subgraph's in attribute order):
  If(cond, then captures..., else captures...)
  Loop(M, cond, v_initial[N]..., captures...)   body(iter, cond, v[N]..., captures) -> (cond, v[N], scans[K])
  Scan(initial states[N]..., scan inputs[M]..., captures...)
                                                body(states[N], slices[M], captures) -> (states[N], scans[K])
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from graphc.runtime.reference.registry import register_kernel


class BodyRunner(Protocol):
    num_captures: int
    output_dtypes: list[np.dtype]
    output_shapes: list[tuple[int, ...] | None]

    def __call__(self, inputs: list[Any]) -> list[Any]: ...


def _runner(attrs: Any, field: str, op: str) -> BodyRunner:
    r = getattr(attrs, field)
    if not callable(r) or not hasattr(r, "num_captures"):
        # A kernel called with the IR's attrs as they stand (a graph, not a runner).
        raise TypeError(f"{op}: subgraph '{field}' is not bound to a body runner (the interpreter binds them)")
    return r


def _truth(cond: Any, op: str) -> bool:
    c = np.asarray(cond)
    if c.size != 1:
        raise ValueError(f"{op}: the condition must have one element, it has shape {c.shape}")
    return bool(c.reshape(()))


def if_kernel(inputs: list[Any], attrs: Any, num_outputs: int) -> list[Any]:
    then_b = _runner(attrs, "then_branch", "If")
    else_b = _runner(attrs, "else_branch", "If")
    nt = then_b.num_captures
    caps = inputs[1:]
    if _truth(inputs[0], "If"):
        return list(then_b(list(caps[:nt])))
    return list(else_b(list(caps[nt:])))


def loop_kernel(inputs: list[Any], attrs: Any, num_outputs: int) -> list[Any]:
    body = _runner(attrs, "body", "Loop")
    c = body.num_captures
    m, cond = (inputs + [None, None])[:2]
    caps = list(inputs[len(inputs) - c :]) if c else []
    carried = list(inputs[2 : len(inputs) - c])
    n = len(carried)
    k = num_outputs - n
    trip = None if m is None else int(np.asarray(m).reshape(()))
    keep_going = True if cond is None else _truth(cond, "Loop")
    scans: list[list[np.ndarray]] = [[] for _ in range(k)]
    i = 0
    while keep_going and (trip is None or i < trip):
        outs = body([np.array(i, dtype=np.int64), np.array(keep_going, dtype=np.bool_), *carried, *caps])
        keep_going = _truth(outs[0], "Loop")
        carried = list(outs[1 : 1 + n])
        for j in range(k):
            scans[j].append(np.asarray(outs[1 + n + j]))
        i += 1
    results: list[Any] = list(carried)
    for j in range(k):
        if scans[j]:
            results.append(np.stack(scans[j]))
        else:  # zero iterations: an empty scan output, of the element shape where it is static
            shape = body.output_shapes[1 + n + j]
            results.append(np.zeros((0, *(shape if shape is not None else ())), dtype=body.output_dtypes[1 + n + j]))
    return results


def scan_kernel(inputs: list[Any], attrs: Any, num_outputs: int) -> list[Any]:
    body = _runner(attrs, "body", "Scan")
    c = body.num_captures
    m = int(attrs.num_scan_inputs)
    caps = list(inputs[len(inputs) - c :]) if c else []
    states = list(inputs[: len(inputs) - c - m])
    xs = [np.asarray(x) for x in inputs[len(inputs) - c - m : len(inputs) - c]]
    n = len(states)
    k = num_outputs - n
    in_axes = list(attrs.scan_input_axes or [0] * m)
    in_dirs = list(attrs.scan_input_directions or [0] * m)
    out_axes = list(attrs.scan_output_axes or [0] * k)
    out_dirs = list(attrs.scan_output_directions or [0] * k)
    in_axes = [a + x.ndim if a < 0 else a for a, x in zip(in_axes, xs, strict=True)]
    lengths = {x.shape[a] for x, a in zip(xs, in_axes, strict=True)}
    if len(lengths) > 1:
        raise ValueError(f"Scan: the scan inputs have different lengths {sorted(lengths)} along their axes")
    length = lengths.pop() if lengths else 0
    scans: list[list[np.ndarray]] = [[] for _ in range(k)]
    for t in range(length):
        slices = [np.take(x, length - 1 - t if d else t, axis=a) for x, a, d in zip(xs, in_axes, in_dirs, strict=True)]
        outs = body([*states, *slices, *caps])
        states = list(outs[:n])
        for j in range(k):
            scans[j].append(np.asarray(outs[n + j]))
    results: list[Any] = list(states)
    for j in range(k):
        if not scans[j]:
            shape = list(body.output_shapes[n + j] or ())
            shape.insert(out_axes[j] + len(shape) + 1 if out_axes[j] < 0 else out_axes[j], 0)
            results.append(np.zeros(shape, dtype=body.output_dtypes[n + j]))
            continue
        seq = scans[j][::-1] if out_dirs[j] else scans[j]
        r = seq[0].ndim + 1
        axis = out_axes[j] + r if out_axes[j] < 0 else out_axes[j]
        results.append(np.stack(seq, axis=axis))
    return results


register_kernel("If", if_kernel)
register_kernel("Loop", loop_kernel)
register_kernel("Scan", scan_kernel)
