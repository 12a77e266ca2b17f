"""The Batcher's own per-request cost, measured on the CPU with a stand-in for a CUDA engine.

The stand-in has the shape of BERT-base's inputs (input_ids, attention_mask: int64, seq 128) and
outputs (hidden (N, 128, 64) fp16 kept small, pooled (N, 64)), execution contexts as the CUDA
executor's, whose run() queues the batch on one fake GPU (a thread that sleeps `--gpu-ms` per
batch, so it holds no GIL, as a CUDA graph replay does) and whose stream.synchronize() waits for
it. The load is graphc.bench's own client loop (`--threads` clients, batch-1 requests back to
back), so the figure is what `graphc bench --batcher` would get from an engine that costs only
`--gpu-ms` per batch: 32 clients over 2 ms batches of 32 can reach at most 16,000 requests/s, and
every microsecond of Python per request on the critical path takes from that.

    python tools/bench_batcher_standin.py --threads 32 --gpu-ms 2 --requests 4000 [--hold] [--profile out.prof]

The Batcher is the default one (eager: a batch closes as soon as none runs); --hold runs
Batcher(eager=False), which holds a partial batch for max_wait.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

SEQ, HIDDEN = 128, 64

# BERT-base (seq 128, fp16) graph replays per bucket on the H200, ms (the dynamic engine's rows of
# docs/results/h200_profiles_2026-12-01_1729.md); other sizes interpolated. `--cost bert` uses them.
BERT_H200_MS = {1: 0.456, 8: 1.005, 13: 1.141, 22: 1.378, 32: 1.947}


def bert_ms(n: int) -> float:
    pts = sorted(BERT_H200_MS.items())
    for (a, ta), (b, tb) in zip(pts, pts[1:], strict=False):
        if n <= b:
            return ta + (tb - ta) * (max(n, a) - a) / (b - a)
    return pts[-1][1]


@dataclass
class Spec:
    name: str
    dtype: str
    shape: list[int]


class StandinGPU:
    """One in-order queue of batches for all contexts; each takes `ms(size)` on a thread of its own."""

    def __init__(self, ms: Any) -> None:
        self.ms = ms
        self.cv = threading.Condition()
        self.work: list[tuple[threading.Event, int]] = []
        self.batches = 0
        self.busy_s = 0.0
        threading.Thread(target=self._loop, daemon=True, name="standin-gpu").start()

    def enqueue(self, done: threading.Event, size: int) -> None:
        with self.cv:
            self.work.append((done, size))
            self.cv.notify()

    def _loop(self) -> None:
        while True:
            with self.cv:
                while not self.work:
                    self.cv.wait()
                done, size = self.work.pop(0)
            t0 = time.perf_counter()
            time.sleep(self.ms(size) / 1000)
            self.busy_s += time.perf_counter() - t0
            self.batches += 1
            done.set()


class StandinStream:
    def __init__(self) -> None:
        self.pending: threading.Event | None = None

    def synchronize(self) -> None:
        if self.pending is not None:
            self.pending.wait()
            self.pending = None


class StandinContext:
    def __init__(self, gpu: StandinGPU, size: int) -> None:
        self.gpu, self.size, self.stream = gpu, size, StandinStream()
        self.outs = {
            "hidden": np.zeros((size, SEQ, HIDDEN), np.float16),
            "pooled": np.zeros((size, HIDDEN), np.float16),
        }

    def run(self, feeds: dict[str, Any], *, sync: bool = True, **_: Any) -> dict[str, Any]:
        assert feeds["input_ids"].shape == (self.size, SEQ)
        done = threading.Event()
        self.stream.pending = done
        self.gpu.enqueue(done, self.size)
        if sync:
            self.stream.synchronize()
        return dict(self.outs)  # new arrays per call in the real executor: a new dict at least


class StandinExecutor:
    def __init__(self, gpu: StandinGPU, size: int) -> None:
        self.gpu, self.size = gpu, size

    def create_context(self) -> StandinContext:
        return StandinContext(self.gpu, self.size)


class _Bucket:
    def __init__(self, gpu: StandinGPU, n: int) -> None:
        self.shapes = {"input_ids": [n, SEQ], "attention_mask": [n, SEQ]}
        self.engine = type("BucketEngine", (), {"executor": StandinExecutor(gpu, n)})()


class StandinDynamic:
    def __init__(self, gpu: StandinGPU, buckets: list[int]) -> None:
        self.buckets = {n: _Bucket(gpu, n) for n in buckets}

    def resolve(self, engine: Any, feeds: dict[str, Any]) -> tuple[None, _Bucket, None]:
        rows = feeds["input_ids"].shape[0]
        return None, self.buckets[min(n for n in self.buckets if n >= rows)], None

    def bucket_engine(self, engine: Any, bucket: _Bucket) -> Any:
        return bucket.engine


class StandinEngine:
    """target 'cuda', batch 1..32 in the buckets of graphc.profiles' ladder for 1..32 at opt 8."""

    target = "cuda"

    def __init__(self, gpu_ms: Any, buckets: tuple[int, ...] = (1, 2, 3, 5, 7, 8, 10, 13, 17, 22, 28, 32)) -> None:
        self.gpu = StandinGPU(gpu_ms)
        self.dynamic = StandinDynamic(self.gpu, list(buckets))
        top = max(buckets)
        self.executor = StandinExecutor(self.gpu, top)
        self.inputs = [Spec("input_ids", "int64", [top, SEQ]), Spec("attention_mask", "int64", [top, SEQ])]
        self.outputs = [Spec("hidden", "float16", [top, SEQ, HIDDEN]), Spec("pooled", "float16", [top, HIDDEN])]
        self.top = top

    def batch_sizes(self) -> range:
        return range(1, self.top + 1)


def measure(threads: int, gpu_ms: float, requests: int, pipeline: int, max_wait_ms: float,
            profile: str | None = None, cost: str = "flat", eager: bool = True) -> dict[str, Any]:  # fmt: skip
    from graphc.bench import _drive, _stats
    from graphc.runtime import Batcher

    eng = StandinEngine(bert_ms if cost == "bert" else (lambda n: gpu_ms))
    rng = np.random.default_rng(0)
    reqs = [
        {"input_ids": rng.integers(0, 30000, (1, SEQ), dtype=np.int64), "attention_mask": np.ones((1, SEQ), np.int64)}
        for _ in range(threads)
    ]
    with Batcher(eng, max_wait_ms=max_wait_ms, pipeline=pipeline, warm=reqs[0], eager=eager) as b:
        _drive(b.run, reqs, 4 * threads, threads)
        s0 = b.stats.batches, b.stats.rows
        busy0 = eng.gpu.busy_s
        prof = cProfile.Profile() if profile else None
        if prof:
            prof.enable()
        cpu0 = time.process_time()
        lat, wall = _drive(b.run, reqs, requests, threads)
        cpu = time.process_time() - cpu0
        if prof:
            prof.disable()
            prof.dump_stats(profile)
        batches, rows = b.stats.batches - s0[0], b.stats.rows - s0[1]
        busy = eng.gpu.busy_s - busy0
    return {
        "threads": threads,
        "cost": cost if cost == "bert" else f"flat {gpu_ms} ms",
        "eager": eager,
        "mode": "eager" if eager else "hold",
        "pipeline": pipeline,
        "max_wait_ms": max_wait_ms,
        "requests": requests,
        "throughput_per_s": round(requests / wall, 1),
        "ceiling_per_s": round(min(threads, eng.top) / (eng.gpu.ms(eng.top) / 1000), 1),
        "gpu_busy": round(busy / wall, 3),  # share of the wall time the stand-in GPU was running
        "mean_batch": round(rows / max(batches, 1), 2),
        "cycle_ms": round(wall / max(batches, 1) * 1000, 3),
        # CPU time of the whole process (clients, batcher, stand-in GPU thread) per request: the
        # GIL-holding work, robust to other processes sharing the machine (wall time is not)
        "cpu_us_per_request": round(cpu / requests * 1e6, 2),
        "latency": _stats(lat),
        "switchinterval_s": sys.getswitchinterval(),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=32)
    p.add_argument("--gpu-ms", type=float, default=2.0)
    p.add_argument("--requests", type=int, default=4000)
    p.add_argument("--pipeline", type=int, default=2)
    p.add_argument("--max-wait-ms", type=float, default=2.0)
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--profile", help="write a cProfile of the timed load here")
    p.add_argument("--cost", choices=("flat", "bert"), default="flat",
                   help="flat: --gpu-ms per batch; bert: BERT-base's H200 time per bucket")  # fmt: skip
    p.add_argument("--hold", action="store_true", help="Batcher(eager=False): hold a partial batch for max_wait")
    a = p.parse_args(argv)
    for _ in range(a.repeat):
        r = measure(a.threads, a.gpu_ms, a.requests, a.pipeline, a.max_wait_ms, a.profile, a.cost, not a.hold)
        lat = r.pop("latency")
        r["p50_ms"], r["p99_ms"] = lat["median_ms"], lat.get("p99_ms")
        print(json.dumps(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
