"""Engine benchmarks, like trtexec: latency min/median/p90/p99 and throughput, timed with CUDA
events around CUDA-graph replays (host copies excluded; end-to-end timed separately)."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

# A percentile is reported only from enough samples that it is not simply the maximum.
MIN_SAMPLES = {"p90_ms": 10, "p99_ms": 100}
DEFAULT_COUNTS = {"cuda": (200, 20), "cpu": (20, 2)}  # (iterations, warm-up): numpy runs are slow


def default_counts(target: str) -> tuple[int, int]:
    """The (iterations, warm-up) that `graphc bench` uses for a target when none are given."""
    return DEFAULT_COUNTS.get(target, DEFAULT_COUNTS["cuda"])


def _stats(ms: list[float]) -> dict[str, float]:
    """min/median/mean/max and p90/p99 of the samples; `samples` says how many (format_bench shows
    a percentile only from MIN_SAMPLES up)."""
    a = np.asarray(ms, dtype=np.float64)
    return {
        "samples": len(a),
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
    if iterations < 1 or warmup < 0:
        raise ValueError(f"iterations must be >= 1 and warmup >= 0, got {iterations} and {warmup}")
    batch = _batch(engine)
    result: dict[str, Any] = {"target": engine.target, "batch": batch, "iterations": iterations, "warmup": warmup}
    if engine.target == "cpu":
        for _ in range(warmup):
            engine.run(feeds)
        times = []
        for _ in range(iterations):
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
    pct = "".join(f"  {k[:-3]} {lat[k]:.4f} ms" for k, n in MIN_SAMPLES.items() if lat["samples"] >= n)
    if "device" in r:
        d = r["device"]
        lines.append(f"device: {d['name']} (sm_{d['sm']}, driver {d['driver']})")
    lines.append("latency (GPU compute, CUDA graph replay)" if r["target"] == "cuda" else "latency (CPU, engine.run)")
    lines.append(
        f"  min {lat['min_ms']:.4f} ms  median {lat['median_ms']:.4f} ms{pct}  max {lat['max_ms']:.4f} ms  "
        f"({lat['samples']} timed runs, {r['warmup']} warm-up)"
    )
    lines.append(f"throughput: {r['throughput_per_s']:.1f} inferences/s (batch {r['batch']})")
    if "end_to_end" in r:
        e = r["end_to_end"]
        tail = f"  p99 {e['p99_ms']:.4f} ms" if e["samples"] >= MIN_SAMPLES["p99_ms"] else f"  max {e['max_ms']:.4f} ms"
        lines.append(
            f"end to end (host in, host out): median {e['median_ms']:.4f} ms{tail}  ({e['samples']} timed runs)"
        )
    if "kernels" in r:
        lines.append("per kernel (median, share of the sum):")
        for row in sorted(r["kernels"], key=lambda x: -x["median_ms"])[:25]:
            lines.append(f"  {row['median_ms']:9.4f} ms  {row['share'] * 100:5.1f}%  {row['step']}")
    return "\n".join(lines)
