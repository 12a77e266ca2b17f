"""The two timing methods of tools/bench_torch.py, applied the same way to graphc and to PyTorch.

(a) Steady state through the ordinary call: `warmup` calls, then `rounds` rounds of `calls` calls back
    to back with one device synchronization after each round; the best round's mean (ms). Host-side
    dispatch counts (where the host is slower than the GPU it is the time), as a user sees it.
(b) GPU time of one CUDA-graph replay: the captured graph replayed `warmup` times, then `rounds`
    rounds of CUDA events around `calls` replays on one stream; the best round's mean (ms). For
    PyTorch the graph is a torch.cuda.CUDAGraph captured around the eager or compiled module; for
    graphc it is the graph its engine captured on the first run.

Kernel counts come from the PyTorch profiler (CUPTI), one call, for both sides; memcpy, memset and
synchronization activities are not kernels and are not counted.
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("bench_torch")


@dataclass(frozen=True)
class Protocol:
    warmup: int = 10
    rounds: int = 3
    calls: int = 50


def steady_ms(call: Callable[[], Any], sync: Callable[[], None], p: Protocol) -> float:
    """(a): the best mean per call over `rounds` rounds of `calls` back-to-back calls."""
    for _ in range(p.warmup):
        call()
    sync()
    best = math.inf
    for _ in range(p.rounds):
        t0 = time.perf_counter()
        for _ in range(p.calls):
            call()
        sync()
        best = min(best, (time.perf_counter() - t0) * 1000 / p.calls)
    return best


def torch_sync(device: str) -> Callable[[], None]:
    if device == "cpu":
        return lambda: None
    import torch

    return torch.cuda.synchronize


def torch_capture(fn: Callable[[], Any]) -> Any:
    """A torch.cuda.CUDAGraph of one call of fn, after warm-up calls on a side stream (as PyTorch's
    documentation prescribes: capture must not see first-call allocations or lazy initialization)."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    torch.cuda.synchronize()
    return graph


def torch_replay_ms(graph: Any, p: Protocol) -> float:
    """(b) for PyTorch: CUDA events around `calls` replays of a torch.cuda.CUDAGraph."""
    import torch

    for _ in range(p.warmup):
        graph.replay()
    torch.cuda.synchronize()
    best = math.inf
    for _ in range(p.rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(p.calls):
            graph.replay()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / p.calls)
    return best


def graphc_graph(engine: Any) -> tuple[Any, Any, int]:
    """The CUDA graph of a graphc engine's launch sequence (captured on its first run, or here:
    the ordinary call replays an output slot's graph of the same kernels), with its stream and device."""
    ctx = getattr(engine.executor, "default", None)
    graph = ctx.replay_graph() if hasattr(ctx, "replay_graph") else getattr(ctx, "graph", None)
    if graph is None or not hasattr(ctx, "stream"):
        raise RuntimeError("the engine holds no captured CUDA graph (was it run once with use_graph?)")
    return graph, ctx.stream, ctx.device


def graphc_replay_ms(engine: Any, p: Protocol) -> float:
    """(b) for graphc: CUDA events around `calls` replays of the engine's captured graph."""
    import cupy

    graph, stream, device = graphc_graph(engine)
    with cupy.cuda.Device(device):
        for _ in range(p.warmup):
            graph.launch(stream=stream)
        stream.synchronize()
        best = math.inf
        for _ in range(p.rounds):
            start, end = cupy.cuda.Event(), cupy.cuda.Event()
            start.record(stream)
            for _ in range(p.calls):
                graph.launch(stream=stream)
            end.record(stream)
            end.synchronize()
            best = min(best, cupy.cuda.get_elapsed_time(start, end) / p.calls)
    return best


def graphc_replay_once(engine: Any) -> None:
    """One replay of the engine's graph: its kernels alone, as a torch.cuda.CUDAGraph holds PyTorch's
    (engine.run adds its input copies to them)."""
    graph, stream, _device = graphc_graph(engine)
    graph.launch(stream=stream)
    stream.synchronize()


def is_kernel(name: str) -> bool:
    """CUPTI's device activities are kernels, copies and sets, and (where enabled) synchronizations."""
    low = name.lower()
    return not low.startswith(("memcpy", "memset")) and "synchroniz" not in low


def kernel_count(call: Callable[[], Any]) -> int | None:
    """GPU kernels launched by one call, as the PyTorch profiler (CUPTI) records them: the same count
    for graphc (cupy launches, graph replays) and PyTorch. None when the profiler saw no kernel."""
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize()
    n = sum(1 for e in prof.events() if e.device_type == DeviceType.CUDA and is_kernel(e.name))
    if n == 0:
        log.warning("the profiler recorded no CUDA kernel; kernel count left empty")
        return None
    return n


def graph_launch_ms(torch: Any, cupy: Any, go: Callable[[int], Any], iters: int, reps: int = 7) -> float:
    """Median ms per launch: `iters` launches of go(i) (i rotating operand sets, say) captured in one
    CUDA graph on torch's stream (cupy launches too), its replays timed with events, so host launch
    overhead is out of every side timed this way (the kernel benches' method)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), cupy.cuda.ExternalStream(side.cuda_stream):
        for i in range(3):
            go(i)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream):
        for i in range(iters):
            go(i)
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        graph.replay()
        e.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e) / iters)
    del graph
    return statistics.median(times)
