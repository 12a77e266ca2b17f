"""Data-dependent `If` on the CUDA target, at run time (issue 12 item 1).

The compiler (graphc/host_if.py, graphc/host_if_cuda.py) plans each branch of such an If as a
sub-plan of its own with its own kernels, stored in the If step's attrs (kernel plan with launches
+ memory plan, the layout runtime/cpu.py reads too). Here:

- the main plan's launches are cut at every If step into segments; each segment is captured
  into a CUDA graph of its own on its first run and replayed after;
- at an If step the condition (one element, in the arena) is copied back to the host: one small
  device-to-host copy, which waits for the segment before it (a stream sync per If per run);
- the chosen branch runs in an execution context of its own (its own arena and workspace, the
  engine's weights and kernels, the parent's stream): copies of the captured tensors into its
  input slots, its launches, copies of its results into the If's outputs, all captured as one CUDA
  graph on that branch's first use (a branch with an If of its own replays segment by segment).

Why not CUDA graph conditional nodes (CUDA 12.4+: cudaGraphConditionalHandle set by a device-side
cudaGraphSetConditional): cupy's stream capture cannot build them, so they would need the whole
graph built through cuda-bindings' graph API (or captures into conditional bodies with
cudaStreamBeginCaptureToGraph) plus a kernel of our own to set the handle, and drivers older than
12.4 would need this path anyway. The host-side choice is one path that works on every driver; its
cost (a host round trip per If) is what `graphc bench` reports as `host_if`.

Counters (`HostIfContext.host_if_stats`): condition reads, and runs and graph captures per branch,
so a test (and bench) sees which graph was replayed and that graphs are reused.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import numpy as np

from graphc.runtime.cuda import CUDAContext
from graphc.runtime.errors import EngineError
from graphc.runtime.plan import KernelPlan, Launch, MemoryPlan, Step, memory_plan_from_json

log = logging.getLogger(__name__)

HOST_IF_VERSION = 1  # the sub-plan layout graphc/host_if.py writes (runtime/cpu.py reads the same)
BRANCHES = ("then_branch", "else_branch")


def is_host_if(step: Step) -> bool:
    """A step whose sub-plans the host runs: a data-dependent If (two branches), or a host Loop/Scan
    (one body, iterated on the host: runtime/host_loop_cuda.py). It has no launches of its own."""
    if step.op == "If" and step.domain == "" and isinstance(step.attrs, dict) and "host_if_version" in step.attrs:
        return True
    from graphc.runtime.host_loop_cpu import is_host_loop

    return is_host_loop(step)


def branch_plans(step: Step, arch: str | None) -> list[tuple[str, Any, Any, int, list[int]]]:
    """(key, sub-plan as `arch` runs it, its memory plan, number of captures, which captures are
    its inputs) for both branches of a host-If step; a malformed sub-plan is one EngineError. A
    branch the compiler refused (it does not type-check on the engine's shapes) comes as
    (key, None, why, number of captures, [])."""
    from graphc.runtime.host_loop_cpu import is_host_loop, loop_layout

    if is_host_loop(step):  # one sub-plan: the body
        lay = loop_layout(step)
        return [("body", lay["plan"].for_arch(arch or ""), lay["memory"], lay["num_captures"], lay["take"])]
    where = f"step '{step.name}' (If)"
    if step.attrs.get("host_if_version") != HOST_IF_VERSION:
        raise EngineError(f"{where}: sub-plan layout {step.attrs.get('host_if_version')!r}, expected {HOST_IF_VERSION}")
    out = []
    for key in BRANCHES:
        d = step.attrs.get(key)
        if isinstance(d, dict) and isinstance(d.get("refused"), str):  # it cannot run on these shapes
            out.append((key, None, d["refused"], int(d.get("num_captures", 0)), []))
            continue
        try:
            plan = KernelPlan.from_json(d["plan"])
            plan = plan.for_arch(arch or "")  # "": the default launches
            memory = memory_plan_from_json(d["memory"])
            n_caps, take = int(d["num_captures"]), [int(i) for i in d["inputs_from"]]
        except (KeyError, TypeError, ValueError, AttributeError) as e:  # a malformed or edited sub-plan
            raise EngineError(f"{where}: its {key} sub-plan is malformed ({type(e).__name__}: {e})") from None
        if len(plan.inputs) != len(take) or any(not 0 <= i < n_caps for i in take):
            raise EngineError(f"{where}: its {key} sub-plan's inputs do not match the captures it names")
        if len(plan.outputs) != len(step.outputs):
            raise EngineError(
                f"{where}: its {key} sub-plan gives {len(plan.outputs)} values, the step {len(step.outputs)}"
            )
        out.append((key, plan, memory, n_caps, take))
    return out


def sub_plan_launches(plan: KernelPlan, arch: str | None) -> Iterator[Launch]:
    """Every launch of the branch sub-plans of `plan`'s host-If steps, nested ones included."""
    for step in plan.steps:
        if is_host_if(step):
            for _key, sub, _m, _n, _t in branch_plans(step, arch):
                if sub is None:
                    continue
                for s in sub.steps:
                    yield from s.launches
                yield from sub_plan_launches(sub, arch)


def sub_plan_digests(plan: KernelPlan, arch: str | None) -> set[str]:
    """The kernels the branch sub-plans launch (their cubins must be loaded with the plan's)."""
    return {ln.digest for ln in sub_plan_launches(plan, arch)}


def make_context(
    plan: KernelPlan,
    memory: MemoryPlan,
    weights: Any,
    functions: dict[str, Any],
    device: int,
    arch: str | None,
    pdl_kernels: frozenset[str] = frozenset(),
    pdl_max_ctas: int | str | None = None,
) -> CUDAContext:
    """The execution context of a plan: a HostIfContext where it has host-If steps. Such a plan
    launches without PDL: its segments are captured apart and start after a host decision, so a
    programmatic edge would have no kernel of the same graph before it."""
    if any(is_host_if(s) for s in plan.steps):
        if pdl_kernels:
            log.info("plan with data-dependent If steps: launched without PDL")
        return HostIfContext(plan, memory, weights, functions, device, arch)
    return CUDAContext(plan, memory, weights, functions, device, pdl_kernels, pdl_max_ctas)


def capture(stream: Any, work: Any) -> Any:
    """`work()` captured on `stream` into a CUDA graph; a failure ends the capture and keeps no
    graph (a partial one would replay silently without the work that failed)."""
    stream.begin_capture()
    try:
        work()
    except BaseException:
        stream.end_capture()
        raise
    return stream.end_capture()


class _Segment:
    """Launches [start, end) of the context's launch list, captured into one graph on first use."""

    def __init__(self, start: int, end: int):
        self.start, self.end = start, end
        self.graph: Any = None


class _Branch:
    """One branch: its own context on the parent's stream, the copies in and out, and its graph."""

    def __init__(self, parent: HostIfContext, step: Step, key: str, plan: KernelPlan, memory: MemoryPlan,
                 captures: list[str | None], take: list[int]):  # fmt: skip
        self.key, self.name = key, f"{step.name}/{key.split('_')[0]}"
        self.ctx = make_context(plan, memory, parent.weights_arg, parent.functions, parent.device, parent.arch)
        self.nested = isinstance(self.ctx, HostIfContext)
        set_stream(self.ctx, parent.stream)  # ordered with the segments before and after it
        self.copies_in: list[tuple[int, int, int]] = []
        for sub_name, i in zip(plan.inputs, take, strict=True):
            src_name = captures[i]
            if src_name is None:
                raise EngineError(f"step '{step.name}': {key} takes capture {i}, which the step does not pass")
            self.copies_in.append(self._copy(self.ctx.views[sub_name], parent.views[src_name], step, src_name))
        self.copies_out = [
            self._copy(parent.views[out], self.ctx.views[sub_out], step, out)
            for sub_out, out in zip(plan.outputs, step.outputs, strict=True)
        ]
        self.graph: Any = None

    @staticmethod
    def _copy(dst: Any, src: Any, step: Step, name: str) -> tuple[int, int, int]:
        if dst.dtype != src.dtype or tuple(dst.shape) != tuple(src.shape):
            raise EngineError(
                f"step '{step.name}' (If): '{name}' is {src.dtype}{list(src.shape)} on one side of the branch and "
                f"{dst.dtype}{list(dst.shape)} on the other"
            )
        return int(dst.data.ptr), int(src.data.ptr), int(dst.nbytes)

    def _memcpys(self, parent: HostIfContext, copies: list[tuple[int, int, int]]) -> None:
        copy, d2d, stream = parent.cupy.cuda.runtime.memcpyAsync, parent._d2d, parent.stream.ptr
        for dst, src, n in copies:
            if n:
                copy(dst, src, n, d2d, stream)

    def run(self, parent: HostIfContext, use_graph: bool, stats: Counter) -> None:
        stats[f"{self.name}:runs"] += 1
        if use_graph and not self.nested:
            if self.graph is None:
                parent.stream.synchronize()  # capture starts on an idle stream (first use only)
                self.graph = capture(
                    parent.stream,
                    lambda: (
                        self._memcpys(parent, self.copies_in),
                        self.ctx.launch_all(),
                        self._memcpys(parent, self.copies_out),
                    ),
                )
                stats[f"{self.name}:captures"] += 1
            self.graph.launch(stream=parent.stream)
            return
        self._memcpys(parent, self.copies_in)
        if use_graph:  # a branch with an If of its own: its segments are graphs, chosen on the host
            self.ctx.graph.launch(stream=parent.stream)
        else:
            self.ctx.launch_all()
        self._memcpys(parent, self.copies_out)


class _Refused:
    """A branch that does not type-check on the engine's shapes: a run that takes it is refused."""

    ctx = None

    def __init__(self, step: Step, why: str):
        self.where, self.why = f"step '{step.name}' (If)", why

    def run(self, parent: HostIfContext, use_graph: bool, stats: Counter) -> None:
        raise EngineError(f"{self.where}: {self.why}")


def set_stream(ctx: CUDAContext, stream: Any) -> None:
    """Run `ctx` (and the branch contexts inside it) on `stream`."""
    ctx.stream = stream
    for seg in getattr(ctx, "segments", ()):
        if not isinstance(seg, _Segment):
            for sub in seg.contexts():
                set_stream(sub, stream)


class _HostIf:
    """A host-If step: where its condition lives, and its two branches."""

    def __init__(self, parent: HostIfContext, step: Step):
        self.step = step
        cond = step.inputs[0]
        if cond is None or cond not in parent.views:
            raise EngineError(f"step '{step.name}' (If): its condition is no tensor of the plan")
        self.cond = parent.views[cond]
        if int(np.prod(self.cond.shape)) != 1:
            raise EngineError(f"step '{step.name}' (If): the condition must have one element, it has shape "
                              f"{tuple(self.cond.shape)}")  # fmt: skip
        branches = branch_plans(step, parent.arch)
        nt = branches[0][3]
        caps = list(step.inputs[1:])
        bound = {"then_branch": caps[:nt], "else_branch": caps[nt:]}
        self.then_b, self.else_b = (
            _Refused(step, memory) if plan is None else _Branch(parent, step, key, plan, memory, bound[key], take)
            for key, plan, memory, _n, take in branches
        )

    def contexts(self) -> list[Any]:
        return [b.ctx for b in (self.then_b, self.else_b) if b.ctx is not None]

    def run(self, parent: HostIfContext, use_graph: bool, stats: Counter) -> None:
        self.choose(parent, stats).run(parent, use_graph, stats)

    def choose(self, parent: HostIfContext, stats: Counter) -> _Branch | _Refused:
        # One small device-to-host copy; it waits for everything queued before it on the stream.
        t0 = time.perf_counter()
        c = parent.cupy.asnumpy(self.cond, stream=parent.stream)
        parent.condition_wait_s += time.perf_counter() - t0
        stats["condition_reads"] += 1
        return self.then_b if bool(np.asarray(c).reshape(-1)[0]) else self.else_b


def _host_loop(parent: HostIfContext, step: Step) -> Any:
    from graphc.runtime.host_loop_cuda import HostLoop  # a Loop/Scan iterated on the host

    return HostLoop(parent, step)


class _Replay:
    """Stands where CUDAContext keeps its captured graph: launch() replays the segment graphs and
    runs the If steps between them (CUDAContext.run and graphc bench call graph.launch)."""

    def __init__(self, ctx: HostIfContext):
        self.ctx = ctx

    def launch(self, stream: Any = None) -> None:
        self.ctx.run_segments(use_graph=True)


class HostIfContext(CUDAContext):
    """A CUDA execution context for a plan with data-dependent If steps (see the module's doc)."""

    def __init__(
        self,
        plan: KernelPlan,
        memory: MemoryPlan,
        weights: Any,
        functions: dict[str, Any],
        device: int,
        arch: str | None = None,
    ):
        super().__init__(plan, memory, weights, functions, device)
        self.weights_arg, self.functions, self.arch = weights, functions, arch
        self.host_if_stats: Counter = Counter()
        self.condition_wait_s = 0.0  # host time spent in condition reads (waiting for the GPU included)
        self.segments: list[Any] = []  # _Segment, _HostIf, host_loop_cuda.HostLoop
        start = i = 0
        for step in plan.steps:
            if is_host_if(step):
                if i > start:
                    self.segments.append(_Segment(start, i))
                self.segments.append(_HostIf(self, step) if step.op == "If" else _host_loop(self, step))
                start = i
            else:
                i += len(step.launches) + (step.vendor is not None)  # a vendor call is one entry of the list
        if i > start:
            self.segments.append(_Segment(start, i))
        self.all_launches = self.launches
        self.graph = _Replay(self)
        log.info(
            "plan with %d data-dependent If step(s) and %d host loop(s): %d captured segment(s) between them",
            sum(isinstance(s, _HostIf) for s in self.segments),
            sum(not isinstance(s, (_HostIf, _Segment)) for s in self.segments),
            sum(isinstance(s, _Segment) for s in self.segments),
        )

    def _launch_range(self, start: int, end: int) -> None:
        programmatic = self.programmatic
        self.launches, self.programmatic = self.all_launches[start:end], programmatic[start:end]
        try:
            CUDAContext.launch_all(self)
        finally:
            self.launches, self.programmatic = self.all_launches, programmatic

    def launch_all(self) -> None:
        self.run_segments(use_graph=False)

    def run_segments(self, use_graph: bool) -> None:
        stats = self.host_if_stats
        for seg in self.segments:
            if not isinstance(seg, _Segment):  # a host If or a host loop
                seg.run(self, use_graph, stats)
            elif not use_graph:
                self._launch_range(seg.start, seg.end)
            else:
                if seg.graph is None:
                    self.stream.synchronize()  # capture starts on an idle stream (first use only)
                    seg.graph = capture(self.stream, lambda seg=seg: self._launch_range(seg.start, seg.end))
                    stats["segment_captures"] += 1
                seg.graph.launch(stream=self.stream)


def host_if_summary(ctx: Any) -> dict[str, Any] | None:
    """For bench and reports: the If steps a run chooses on the host (top level), the captured
    segments between them, the counters, and the host time spent reading conditions."""
    if not isinstance(ctx, HostIfContext):
        return None
    return {
        "if_steps": sum(isinstance(s, _HostIf) for s in ctx.segments),
        "loop_steps": sum(not isinstance(s, (_HostIf, _Segment)) for s in ctx.segments),
        "segments": sum(isinstance(s, _Segment) for s in ctx.segments),
        "stats": dict(ctx.host_if_stats),
        "condition_wait_s": ctx.condition_wait_s,
    }


def reset_host_if_counters(ctx: Any) -> None:
    if isinstance(ctx, HostIfContext):
        ctx.host_if_stats.clear()
        ctx.condition_wait_s = 0.0


__all__ = [
    "HOST_IF_VERSION",
    "HostIfContext",
    "branch_plans",
    "host_if_summary",
    "is_host_if",
    "make_context",
    "reset_host_if_counters",
    "sub_plan_digests",
    "sub_plan_launches",
]
