"""Engine benchmarks, like trtexec: latency min/median/p90/p99 and throughput, timed with CUDA
events around CUDA-graph replays (host copies excluded; end-to-end timed separately)."""

from __future__ import annotations

import time
from typing import Any

import numpy as np


def _stats(ms: list[float]) -> dict[str, float]:
    a = np.asarray(ms, dtype=np.float64)
    return {
        "min_ms": float(a.min()),
        "median_ms": float(np.median(a)),
        "mean_ms": float(a.mean()),
        "p90_ms": float(np.percentile(a, 90)),
        "p99_ms": float(np.percentile(a, 99)),
        "max_ms": float(a.max()),
    }


def _batch(engine) -> int:
    specs = engine.inputs
    return int(specs[0].shape[0]) if specs and specs[0].shape else 1


def benchmark(
    engine, feeds: dict[str, Any], *, iterations: int = 200, warmup: int = 20, per_kernel: bool = False
) -> dict[str, Any]:
    batch = _batch(engine)
    result: dict[str, Any] = {"target": engine.target, "batch": batch, "iterations": iterations, "warmup": warmup}
    if engine.target == "cpu":
        for _ in range(max(1, warmup // 10)):
            engine.run(feeds)
        times = []
        for _ in range(max(1, iterations // 10)):
            t0 = time.perf_counter()
            engine.run(feeds)
            times.append((time.perf_counter() - t0) * 1000)
        result["latency"] = _stats(times)
        result["throughput_per_s"] = batch * 1000 / result["latency"]["median_ms"]
        return result

    import cupy

    ctx = engine.executor.default
    engine.run(feeds)  # copies the inputs in and captures the graph
    stream = ctx.stream
    with cupy.cuda.Device(ctx.device):
        for _ in range(warmup):
            ctx.graph.launch(stream=stream)
        stream.synchronize()
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        times = []
        for _ in range(iterations):
            start.record(stream)
            ctx.graph.launch(stream=stream)
            end.record(stream)
            end.synchronize()
            times.append(cupy.cuda.get_elapsed_time(start, end))
        result["latency"] = _stats(times)
        result["throughput_per_s"] = batch * 1000 / result["latency"]["median_ms"]
        e2e = []
        for _ in range(max(5, iterations // 10)):
            t0 = time.perf_counter()
            engine.run(feeds, to_numpy=True)
            e2e.append((time.perf_counter() - t0) * 1000)
        result["end_to_end"] = _stats(e2e)
        if per_kernel:
            rows = []
            for fn, grid, block, args, smem, name in ctx.launches:
                for _ in range(3):
                    fn(grid, block, args, shared_mem=smem, stream=stream)
                ks = []
                for _ in range(max(5, iterations // 10)):
                    start.record(stream)
                    fn(grid, block, args, shared_mem=smem, stream=stream)
                    end.record(stream)
                    end.synchronize()
                    ks.append(cupy.cuda.get_elapsed_time(start, end))
                rows.append(
                    {
                        "step": name,
                        "kernel": getattr(fn, "name", ""),
                        "median_ms": float(np.median(ks)),
                        "grid": list(grid),
                        "block": list(block),
                    }
                )
            total = sum(r["median_ms"] for r in rows) or 1.0
            for r in rows:
                r["share"] = r["median_ms"] / total
            result["kernels"] = rows
        dev = cupy.cuda.Device(ctx.device)
        props = cupy.cuda.runtime.getDeviceProperties(dev.id)
        result["device"] = {
            "name": props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"]),
            "sm": dev.compute_capability,
            "driver": cupy.cuda.runtime.driverGetVersion(),
            "runtime": cupy.cuda.runtime.runtimeGetVersion(),
        }
    return result


def format_bench(r: dict[str, Any]) -> str:
    lat = r["latency"]
    lines = []
    if "device" in r:
        d = r["device"]
        lines.append(f"device: {d['name']} (sm_{d['sm']}, driver {d['driver']})")
    lines.append("latency (GPU compute, CUDA graph replay)" if r["target"] == "cuda" else "latency (CPU, engine.run)")
    lines.append(
        f"  min {lat['min_ms']:.4f} ms  median {lat['median_ms']:.4f} ms  p90 {lat['p90_ms']:.4f} ms  "
        f"p99 {lat['p99_ms']:.4f} ms  ({r['iterations']} iterations, {r['warmup']} warm-up)"
    )
    lines.append(f"throughput: {r['throughput_per_s']:.1f} inferences/s (batch {r['batch']})")
    if "end_to_end" in r:
        e = r["end_to_end"]
        lines.append(f"end to end (host in, host out): median {e['median_ms']:.4f} ms  p99 {e['p99_ms']:.4f} ms")
    if "kernels" in r:
        lines.append("per kernel (median, share of the sum):")
        for row in sorted(r["kernels"], key=lambda x: -x["median_ms"])[:25]:
            lines.append(f"  {row['median_ms'] * 1000:9.1f} us  {row['share'] * 100:5.1f}%  {row['step']}")
    return "\n".join(lines)
