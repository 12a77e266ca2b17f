"""Engine benchmarks, like trtexec: latency min/median/p90/p99 and throughput, timed with CUDA
events around CUDA-graph replays (host copies excluded; end-to-end timed separately); and a
concurrent load of batch-1 requests with and without graphc.runtime.Batcher (`--batcher`)."""

from __future__ import annotations

import dataclasses
import threading
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


def _kernel_names(engine: Any, n: int) -> list[str]:
    """The kernel of each of the context's n launches, in its order (runtime/cuda.py builds them
    step by step: a vendor step's library call, then the step's kernels): "cuBLASLt" for a vendor
    call; blanks where the plan's launches do not line up with the context's."""
    names: list[str] = []
    for step in getattr(getattr(engine, "plan", None), "steps", None) or []:
        if step.vendor is not None:
            names.append("cuBLASLt")
        names.extend(ln.kernel for ln in step.launches)
    return names if len(names) == n else [""] * n


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
    engine.run(feeds)  # copies the inputs in
    graph = ctx.replay_graph()  # the launch sequence alone (captured on first use)
    stream = ctx.stream
    with cupy.cuda.Device(ctx.device):
        for _ in range(warmup):
            graph.launch(stream=stream)
        stream.synchronize()
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        times = []
        for _ in range(iterations):
            start.record(stream)
            graph.launch(stream=stream)
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
        from graphc.runtime.host_if_cuda import host_if_summary, reset_host_if_counters

        if host_if_summary(ctx) is not None:  # data-dependent Ifs: the host round trips are part of the cost
            reset_host_if_counters(ctx)
            runs = max(5, iterations // 10)
            t0 = time.perf_counter()
            for _ in range(runs):
                graph.launch(stream=stream)
            stream.synchronize()
            total = (time.perf_counter() - t0) * 1000 / runs
            h = host_if_summary(ctx)
            assert h is not None
            reads = h["stats"].get("condition_reads", 0) / runs
            result["host_if"] = {
                "if_steps": h["if_steps"],
                "loop_steps": h.get("loop_steps", 0),  # host loops (runtime/host_loop_cuda.py)
                "loop_iterations_per_run": sum(v for k, v in h["stats"].items() if k.endswith(":iterations")) / runs,
                "segments": h["segments"],
                "condition_reads_per_run": reads,
                "condition_wait_ms_per_run": h["condition_wait_s"] * 1000 / runs,
                "replay_ms_per_run": total,
            }
        if per_kernel:
            rows = []
            names = _kernel_names(engine, len(ctx.launches))
            for (fn, grid, block, args, smem, name), kernel in zip(ctx.launches, names, strict=True):
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
                        "kernel": kernel or getattr(fn, "name", ""),
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
    if r.get("host_if", {}).get("loop_steps"):
        h = r["host_if"]
        lines.append(
            f"host loops: {h['loop_steps']} step(s) iterated on the host, {h['loop_iterations_per_run']:.1f} "
            "iteration(s) per run (trip counts and exit conditions read back are counted below)"
        )
    if "host_if" in r:
        h = r["host_if"]
        lines.append(
            f"data-dependent If: {h['if_steps']} step(s) chosen on the host between {h['segments']} captured "
            f"segment(s); {h['condition_reads_per_run']:.1f} condition read(s) per run (1-byte device-to-host copy "
            f"and stream sync each), {h['condition_wait_ms_per_run']:.4f} ms per run waiting in them, replay "
            f"{h['replay_ms_per_run']:.4f} ms per run on the host clock (the latency above includes these waits)"
        )
    if "kernels" in r:
        lines.append("per kernel (median, share of the sum):")
        for row in sorted(r["kernels"], key=lambda x: -x["median_ms"])[:25]:
            lines.append(f"  {row['median_ms']:9.4f} ms  {row['share'] * 100:5.1f}%  {row['step']}")
    return "\n".join(lines)


# ---- concurrent load, with and without the dynamic batcher ---------------------------------------


def default_requests(concurrency: int) -> int:
    """Requests of `graphc bench --batcher` when --requests is not given: enough for a p99."""
    return max(MIN_SAMPLES["p99_ms"] * 2, 20 * concurrency)


def _drive(send, requests: list[dict[str, Any]], total: int, concurrency: int) -> tuple[list[float], float]:
    """`concurrency` client threads send requests back to back (each waits for its answer before
    the next) until `total` have been sent; returns each request's latency (ms) and the wall time (s)."""
    lock = threading.Lock()
    sent = [0]
    latencies: list[float] = []
    errors: list[BaseException] = []
    start = threading.Barrier(concurrency + 1)

    def client() -> None:
        start.wait()
        while True:
            with lock:
                i = sent[0]
                if i >= total or errors:
                    return
                sent[0] += 1
            t0 = time.perf_counter()
            try:
                send(requests[i % len(requests)])
            except BaseException as e:  # noqa: BLE001  (re-raised in the caller's thread below)
                with lock:
                    errors.append(e)
                return
            ms = (time.perf_counter() - t0) * 1000
            with lock:
                latencies.append(ms)

    threads = [threading.Thread(target=client, name=f"bench-client-{k}") for k in range(concurrency)]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    if errors:
        raise errors[0]
    return latencies, wall


def benchmark_batcher(
    engine,
    feeds: dict[str, Any],
    *,
    concurrency: int,
    requests: int,
    max_batch: int | None = None,
    max_wait_ms: float = 2.0,
    pipeline: int | None = None,
    warmup_requests: int | None = None,
    eager: bool = True,
) -> dict[str, Any]:
    """Batch-1 requests (rows of `feeds`) from `concurrency` threads, twice: unbatched (one
    engine.run per request under a lock, the request padded to a batch the engine accepts) and
    through graphc.runtime.Batcher (`pipeline` batches in flight; None: its default; `eager` as the
    Batcher's: True closes a batch as soon as none runs, False holds a partial one for max_wait). Latency is
    per request, from send to answer, host in and out. Each side first serves `warmup_requests`
    (default 4 x concurrency) untimed requests from the same clients: a CUDA engine captures its
    graphs there; the Batcher is made with warm= (its contexts made and timed before any request)."""
    from graphc.runtime.batcher import Batcher, accepted_batch_sizes, run_size, stack_rows

    if concurrency < 1 or requests < 1:
        raise ValueError(f"concurrency and requests must be >= 1, got {concurrency} and {requests}")
    warm_n = 4 * concurrency if warmup_requests is None else warmup_requests
    sizes = accepted_batch_sizes(engine)
    batch = _batch(engine)
    reqs = [{k: v[i : i + 1] for k, v in feeds.items()} for i in range(batch)]
    lock = threading.Lock()
    alone = run_size(1, sizes)

    def unbatched(req: dict[str, Any]) -> dict[str, Any]:
        # the same per-request work as the Batcher's callers get: host rows in, device rows out.
        # The lock is a plain (unfair) threading.Lock: one thread may take it many times running,
        # which starves others (the p99) but gives the unbatched side its best throughput.
        padded = {k: stack_rows([v], alone) for k, v in req.items()}
        with lock:
            outs = engine.run(padded)
        return {k: v[:1] for k, v in outs.items()}

    result: dict[str, Any] = {
        "target": engine.target,
        "batch": batch,
        "concurrency": concurrency,
        "requests": requests,
        "warmup_requests": warm_n,
        "max_wait_ms": max_wait_ms,
    }
    unbatched(reqs[0])  # a CUDA engine captures its graph here
    if warm_n:
        _drive(unbatched, reqs, warm_n, concurrency)
    lat, wall = _drive(unbatched, reqs, requests, concurrency)
    result["unbatched"] = {"latency": _stats(lat), "throughput_per_s": requests / wall, "mean_batch": 1.0}
    kw: dict[str, Any] = {} if pipeline is None else {"pipeline": pipeline}
    # warm=: on a CUDA engine every lane's context of every bucket is made (and timed) before the load
    kw["eager"] = eager
    with Batcher(engine, max_batch=max_batch, max_wait_ms=max_wait_ms, warm=reqs[0], **kw) as batcher:
        result["max_batch"] = batcher.max_batch
        result["pipeline"] = batcher.pipeline
        result["eager"] = batcher.eager
        result["mode"] = batcher_mode(result)
        batcher.run(reqs[0])
        if warm_n:
            _drive(batcher.run, reqs, warm_n, concurrency)
        s0 = dataclasses.replace(batcher.stats)
        lat, wall = _drive(batcher.run, reqs, requests, concurrency)
        s = batcher.stats
        batches = s.batches - s0.batches
        result["batcher"] = {
            "latency": _stats(lat),
            "throughput_per_s": requests / wall,
            "mean_batch": (s.rows - s0.rows) / max(batches, 1),
            "batches": batches,
            "padded_rows": s.padded_rows - s0.padded_rows,
        }
    result["speedup"] = result["batcher"]["throughput_per_s"] / result["unbatched"]["throughput_per_s"]
    return result


def batcher_mode(r: dict[str, Any]) -> str:
    """How a benchmark_batcher result's Batcher closed its batches: "eager" (as soon as none runs,
    max_wait the bound) or "hold" (a partial batch waits max_wait)."""
    return "eager" if r["eager"] else "hold"


def format_batcher_bench(r: dict[str, Any]) -> str:
    """The table of `graphc bench --batcher`: p50/p99 latency, requests/s and mean batch, both ways."""
    lines = [
        f"load: {r['concurrency']} client threads, {r['requests']} batch-1 requests back to back "
        f"({r['target']} engine of batch {r['batch']}; batcher max_batch {r['max_batch']}, "
        f"max_wait {r['max_wait_ms']:g} ms, {batcher_mode(r)}, pipeline {r.get('pipeline', 1)}; "
        f"{r.get('warmup_requests', 0)} "
        "untimed warm-up requests each way)",
        f"  {'':10} {'p50 ms':>10} {'p99 ms':>10} {'requests/s':>12} {'mean batch':>11}",
    ]
    for name in ("unbatched", "batcher"):
        row = r[name]
        lat = row["latency"]
        p99 = f"{lat['p99_ms']:10.3f}" if lat["samples"] >= MIN_SAMPLES["p99_ms"] else f"{'-':>10}"
        lines.append(
            f"  {name:10} {lat['median_ms']:10.3f} {p99} {row['throughput_per_s']:12.1f} {row['mean_batch']:11.2f}"
        )
    if r["requests"] < MIN_SAMPLES["p99_ms"]:
        lines.append(f"  (p99 needs at least {MIN_SAMPLES['p99_ms']} requests)")
    lines.append(f"batcher throughput: {r['speedup']:.2f}x unbatched (latency per request, host in and out)")
    return "\n".join(lines)
