"""Host overhead of `engine.run` on the CUDA path (issue 11 item 5: at most 10 us at batch 1).

    python tools/bench_host_overhead.py                 # on a GPU: a zoo model at batch 1, the real call
    python tools/bench_host_overhead.py --fake          # anywhere: graphc's Python work, cupy faked

GPU mode compiles a zoo model (fp16, batch 1, tiny by default: the host's work does not depend on
the model's size, only on its inputs and outputs) and reports, as medians over rounds of back-to-back
calls (microseconds per call):
- `run`: engine.run(cupy feeds, sync=False), the ordinary call with device inputs (new output
  arrays each call: one cupy allocation per output);
- `launch`: the engine's CUDA graph launched alone (cudaGraphLaunch's own host cost);
- `run_idle`, `launch_idle`, `overhead_idle` = run_idle - launch_idle: one call's host time with
  the GPU's queue empty (a sync before each call, outside the timing), median: the issue's number;
- `overhead` = run - launch, back to back (where the replay outlasts the call, both converge to
  the replay's GPU time and the difference means little);
- `run_noop_launch`: engine.run with the graph launch replaced by a no-op (the same, measured directly);
- `run_out`: engine.run(..., out=preallocated) (no allocation per call);
- `run_reuse`: engine.run(..., reuse_outputs=True) (the engine's own output buffers: no
  allocation, no copy), and `overhead_reuse_idle`;
- `copy_graphs`: the graphs the context captured with the copies of these addresses inside (the
  steady state of a call is then one graph launch);
- `run_numpy`: engine.run with numpy feeds (a host-to-device copy per input);
- `run_sync` - `launch_sync`: the end-to-end call against a replay and a stream sync.

--fake replaces cupy by no-op fakes (tools/fake_cupy.py) and times engine.run's own Python on a
hand-made plan of the same inputs and outputs: the part of the overhead that is graphc's code
(numbers of this machine's CPU, not of the GPU host's), with the calls each makes.

On the H200 (under 30 s; docs/runtime.md, host overhead):
    python tools/bench_host_overhead.py --json docs/results/h200_host_overhead_<date>.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

TARGET_US = 10.0


def per_call_us(call: Callable[[], Any], calls: int, rounds: int, after: Callable[[], Any] = lambda: None) -> float:
    """Median over `rounds` of the mean host time of `calls` back-to-back calls (then `after`, a
    sync, outside the timed part)."""
    for _ in range(min(calls, 20)):
        call()
    after()
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            call()
        times.append((time.perf_counter() - t0) * 1e6 / calls)
        after()
    return statistics.median(times)


def idle_call_us(call: Callable[[], Any], sync: Callable[[], Any], calls: int) -> float:
    """Median host time of one call made with the GPU's queue empty (a sync before each, outside
    the timed part): what the call itself costs, not the wait of a full launch queue. Back-to-back
    figures of a model whose replay is longer than the call converge to the replay instead."""
    for _ in range(20):
        call()
        sync()
    times = []
    for _ in range(calls):
        sync()
        t0 = time.perf_counter()
        call()
        times.append((time.perf_counter() - t0) * 1e6)
    sync()
    return statistics.median(times)


class NoopGraph:
    """Stands for a captured CUDA graph whose launch does nothing."""

    def launch(self, stream: Any = None) -> None:
        return None


def gpu(model: str, size: str, calls: int, rounds: int) -> dict[str, Any]:
    import cupy
    import numpy as np

    import graphc
    import models

    m = models.build(model, size=size, batch=1)
    feeds = models.sample_inputs(model, m)
    from graphc.runtime.cuda import device_arch

    # this GPU's arch alone: the tool finishes in well under 30 s on a fresh machine (no kernel cache)
    shapes = {k: v.shape for k, v in feeds.items()}
    engine = graphc.compile(m, target="cuda", precision="fp16", shapes=shapes, arch=[device_arch()])
    dev = {k: cupy.asarray(v.astype(s.dtype)) for s in engine.inputs for k, v in feeds.items() if k == s.name}
    host = {k: cupy.asnumpy(v) for k, v in dev.items()}
    engine.run(dev)  # captures the graph
    ctx = engine.executor.default
    stream, graph = ctx.stream, ctx.replay_graph()
    out = {
        s.name: cupy.empty(tuple(s.shape), dtype=ctx.views[n].dtype)
        for s, n in zip(engine.outputs, ctx.plan.outputs, strict=True)
    }
    sync = stream.synchronize
    r: dict[str, Any] = {"model": model, "size": size, "batch": 1, "inputs": len(dev), "outputs": len(out)}
    # the number: one call's host time with the queue empty, against the graph launch's alone
    r["launch_idle"] = idle_call_us(lambda: graph.launch(stream=stream), sync, calls)
    r["run_idle"] = idle_call_us(lambda: engine.run(dev, sync=False), sync, calls)
    r["run_out_idle"] = idle_call_us(lambda: engine.run(dev, sync=False, out=out), sync, calls)
    r["run_reuse_idle"] = idle_call_us(lambda: engine.run(dev, sync=False, reuse_outputs=True), sync, calls)
    r["overhead_idle"] = r["run_idle"] - r["launch_idle"]
    r["overhead_out_idle"] = r["run_out_idle"] - r["launch_idle"]
    r["overhead_reuse_idle"] = r["run_reuse_idle"] - r["launch_idle"]
    r["launch"] = per_call_us(lambda: graph.launch(stream=stream), calls, rounds, sync)
    r["run"] = per_call_us(lambda: engine.run(dev, sync=False), calls, rounds, sync)
    r["run_out"] = per_call_us(lambda: engine.run(dev, sync=False, out=out), calls, rounds, sync)
    r["run_reuse"] = per_call_us(lambda: engine.run(dev, sync=False, reuse_outputs=True), calls, rounds, sync)
    r["run_numpy"] = per_call_us(lambda: engine.run(host, sync=False), calls, rounds, sync)
    r["launch_sync"] = per_call_us(lambda: (graph.launch(stream=stream), sync()), calls, rounds)
    r["run_sync"] = per_call_us(lambda: engine.run(dev), calls, rounds)
    # the replay's GPU time, for scale (CUDA events around `calls` replays)
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    start.record(stream)
    for _ in range(calls):
        graph.launch(stream=stream)
    end.record(stream)
    end.synchronize()
    r["replay_gpu"] = cupy.cuda.get_elapsed_time(start, end) * 1000 / calls
    r["copy_graphs"] = len(getattr(ctx, "_copy_graphs", {}))
    # every graph a call may launch (the context's, with the copies inside, and the output ring's
    # slots': runtime/output_ring.py) made a no-op: the call's host work alone is left
    ring = getattr(ctx, "_ring", None)
    lists = [ctx, *(ring.slots if ring is not None else [])]
    saved = [(lst.graph, dict(lst._copy_graphs)) for lst in lists]
    for lst in lists:
        lst.graph = NoopGraph() if lst.graph is not None or lst is ctx else None
        for k in lst._copy_graphs:
            lst._copy_graphs[k] = NoopGraph()
    try:
        r["run_noop_launch"] = per_call_us(lambda: engine.run(dev, sync=False), calls, rounds, sync)
        r["run_reuse_noop_launch"] = per_call_us(
            lambda: engine.run(dev, sync=False, reuse_outputs=True), calls, rounds, sync
        )
    finally:
        for lst, (g, copies) in zip(lists, saved, strict=True):
            lst.graph = g
            lst._copy_graphs.update(copies)
    # the pieces of a call, each alone (what a fix would save)
    first_out = next(iter(out.values()))
    src = first_out
    dst = cupy.empty_like(first_out)
    d2d = cupy.cuda.runtime.memcpyDeviceToDevice
    dev_ctx = cupy.cuda.Device(ctx.device)

    def with_device() -> None:
        with dev_ctx:
            pass

    def with_stream() -> None:
        with stream:
            pass

    r["part_check_feeds"] = per_call_us(lambda: engine.check_feeds(dev), calls, rounds)
    r["part_device_ctx"] = per_call_us(with_device, calls, rounds)
    r["part_stream_ctx"] = per_call_us(with_stream, calls, rounds)
    r["part_empty"] = per_call_us(lambda: cupy.empty(first_out.shape, dtype=first_out.dtype), calls, rounds)
    r["part_memcpy"] = per_call_us(
        lambda: cupy.cuda.runtime.memcpyAsync(dst.data.ptr, src.data.ptr, src.nbytes, d2d, stream.ptr),
        calls, rounds, sync,
    )  # fmt: skip
    r["overhead"] = r["run"] - r["launch"]
    r["overhead_out"] = r["run_out"] - r["launch"]
    r["overhead_sync"] = r["run_sync"] - r["launch_sync"]
    got = engine.run(dev, to_numpy=True)
    r["outputs_finite"] = bool(all(np.isfinite(np.asarray(v, dtype=np.float32)).all() for v in got.values()))
    reused = {k: cupy.asnumpy(v) for k, v in engine.run(dev, reuse_outputs=True).items()}
    got_out = {k: cupy.asnumpy(v) for k, v in engine.run(dev, out=out).items()}
    r["outputs_match"] = all(np.array_equal(got[k], reused[k]) and np.array_equal(got[k], got_out[k]) for k in got)
    name = cupy.cuda.runtime.getDeviceProperties(0)["name"]
    r["gpu"] = name.decode() if isinstance(name, bytes) else str(name)
    return r


def fake(calls: int, rounds: int, inputs: int = 2, outputs: int = 1) -> dict[str, Any]:
    import fake_cupy
    import numpy as np

    engine, ctx, feeds = fake_cupy.fake_engine(inputs, outputs)
    out = {o.name: fake_cupy.array(np.zeros(tuple(o.shape), o.dtype)) for o in engine.outputs}
    fake_cupy.MOVE[0] = False  # the fake's calls then cost next to nothing: graphc's Python is what is left
    r: dict[str, Any] = {"mode": "fake cupy", "inputs": inputs, "outputs": outputs}
    r["run"] = per_call_us(lambda: engine.run(feeds, sync=False), calls, rounds)
    r["run_sync"] = per_call_us(lambda: engine.run(feeds), calls, rounds)
    r["run_out"] = per_call_us(lambda: engine.run(feeds, sync=False, out=out), calls, rounds)
    try:
        r["run_reuse"] = per_call_us(lambda: engine.run(feeds, sync=False, reuse_outputs=True), calls, rounds)
    except TypeError:  # a runtime without reuse_outputs= (to measure the one before it)
        r["run_reuse"] = None
    r["check_feeds"] = per_call_us(lambda: engine.check_feeds(feeds), calls, rounds)
    # what a call does in the steady state (allocations, host memcpys, launches)
    r["counts_per_call"] = fake_cupy.counts_per_call(lambda: engine.run(feeds, sync=False))
    r["counts_per_call_out"] = fake_cupy.counts_per_call(lambda: engine.run(feeds, sync=False, out=out))
    if r["run_reuse"] is not None:
        r["counts_per_call_reuse"] = fake_cupy.counts_per_call(
            lambda: engine.run(feeds, sync=False, reuse_outputs=True)
        )
    return r


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--fake", action="store_true", help="no GPU: cupy faked, graphc's Python work alone")
    p.add_argument("--model", default="bert", help="zoo model (GPU mode; default bert)")
    p.add_argument("--size", default="tiny", help="zoo size (GPU mode; default tiny)")
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--json", help="write the figures here")
    a = p.parse_args(argv)
    if a.calls < 1 or a.rounds < 1:
        p.error("--calls and --rounds must be at least 1")
    if a.fake:
        r = fake(a.calls, a.rounds)
    else:
        try:
            import cupy

            if cupy.cuda.runtime.getDeviceCount() == 0:
                raise RuntimeError("no CUDA device")
        except Exception as e:
            print(f"bench_host_overhead: no GPU here ({e}); --fake times graphc's Python work alone", file=sys.stderr)
            return 2
        r = gpu(a.model, a.size, a.calls, a.rounds)
    for k, v in r.items():
        print(f"{k:>16}: {v:.2f} us" if isinstance(v, float) else f"{k:>16}: {v}")
    if "overhead_idle" in r:
        print(
            f"engine.run overhead {r['overhead_idle']:.2f} us (new output arrays), {r['overhead_out_idle']:.2f} us "
            f"with out=, {r['overhead_reuse_idle']:.2f} us with reuse_outputs=True "
            f"(one call, queue empty; target <= {TARGET_US:.0f} us)"
        )
    if a.json:
        Path(a.json).write_text(json.dumps(r, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
