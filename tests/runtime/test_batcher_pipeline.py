"""The Batcher's pipelined path (execution contexts, issue 14) on the CPU, with a stand-in for a CUDA
engine with profiles: an executor whose contexts queue work on one shared fake GPU (a thread that
runs queued batches one after another, each taking `cost_ms(batch)`), read their inputs only when
the GPU gets to them (as an asynchronous host-to-device copy does: a staging buffer reused too early
shows) and fail asynchronously on a poisoned row (the error shows at the stream's synchronize, as a
CUDA fault does)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from graphc.runtime import Batcher, EngineError

WIDTH = 6  # features per row
POISON = -1.0  # a request whose first feature is this fails its batch on the fake GPU


@dataclass
class Spec:
    name: str
    dtype: str
    shape: list[int]


def expected(x: np.ndarray) -> dict[str, np.ndarray]:
    """What the fake engine computes for rows x: both outputs keep the batch dim."""
    return {"y": x * 2 + 1, "s": x.sum(axis=1, keepdims=True)}


class FakeGPU:
    """One queue of work for every context, run in order on a thread of its own."""

    def __init__(self, cost_ms: Callable[[int], float]) -> None:
        self.cost_ms = cost_ms
        self.cv = threading.Condition()
        self.work: list[Callable[[], None]] = []
        self.queued = 0  # batches queued or running now
        self.max_queued = 0
        self.runs: list[int] = []  # batch size of every run, in order
        threading.Thread(target=self._loop, daemon=True).start()

    def enqueue(self, op: Callable[[], None]) -> None:
        with self.cv:
            self.work.append(op)
            self.queued += 1
            self.max_queued = max(self.max_queued, self.queued)
            self.cv.notify()

    def _loop(self) -> None:
        while True:
            with self.cv:
                while not self.work:
                    self.cv.wait()
                op = self.work.pop(0)
            op()
            with self.cv:
                self.queued -= 1


class FakeStream:
    def __init__(self) -> None:
        self.pending: list[threading.Event] = []
        self.error: BaseException | None = None

    def synchronize(self) -> None:
        for ev in self.pending:
            ev.wait()
        self.pending.clear()
        if self.error is not None:
            e, self.error = self.error, None
            raise e


class FakeContext:
    def __init__(self, gpu: FakeGPU, size: int) -> None:
        self.gpu, self.size, self.stream = gpu, size, FakeStream()

    def run(self, feeds: dict[str, Any], *, sync: bool = True, **_: Any) -> dict[str, Any]:
        x = feeds["x"]
        assert x.shape == (self.size, WIDTH), f"context of batch {self.size} got {x.shape}"
        outs = {"y": np.full((self.size, WIDTH), np.nan, np.float32), "s": np.full((self.size, 1), np.nan, np.float32)}
        done = threading.Event()
        stream = self.stream

        def op() -> None:
            time.sleep(self.gpu.cost_ms(self.size) / 1000)
            host = np.array(x)  # the copy in happens only now: the staging buffer must still hold it
            self.gpu.runs.append(self.size)
            if (host[:, 0] == POISON).any():
                stream.error = RuntimeError("fake GPU: illegal address in batch")
            else:
                for k, v in expected(host).items():
                    outs[k][...] = v
            done.set()

        stream.pending.append(done)
        self.gpu.enqueue(op)
        if sync:
            stream.synchronize()
        return outs


class FakeExecutor:
    def __init__(self, gpu: FakeGPU, size: int, made: list[int]) -> None:
        self.gpu, self.size, self.made = gpu, size, made

    def create_context(self) -> FakeContext:
        self.made.append(self.size)
        return FakeContext(self.gpu, self.size)


@dataclass
class Bucket:
    shapes: dict[str, list[int]]
    engine: Any = None


@dataclass
class FakeDynamic:
    buckets: list[int]
    gpu: FakeGPU
    made: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._b = {n: Bucket({"x": [n, WIDTH]}) for n in self.buckets}
        for n, b in self._b.items():
            b.engine = type("BucketEngine", (), {"executor": FakeExecutor(self.gpu, n, self.made)})()

    def resolve(self, engine: Any, feeds: dict[str, Any]) -> tuple[None, Bucket, None]:
        rows = feeds["x"].shape[0]
        return None, self._b[min(n for n in self.buckets if n >= rows)], None

    def bucket_engine(self, engine: Any, bucket: Bucket) -> Any:
        return bucket.engine


class FakeCudaEngine:
    """target 'cuda', batch 1..max(buckets), input x float32 (N, WIDTH), outputs y (N, WIDTH), s (N, 1)."""

    target = "cuda"

    def __init__(self, buckets: list[int], cost_ms: Callable[[int], float] = lambda n: 0.0) -> None:
        self.gpu = FakeGPU(cost_ms)
        self.dynamic = FakeDynamic(buckets, self.gpu)
        self.executor = FakeExecutor(self.gpu, max(buckets), self.dynamic.made)
        self.inputs = [Spec("x", "float32", [max(buckets), WIDTH])]
        self.outputs = [Spec("y", "float32", [max(buckets), WIDTH]), Spec("s", "float32", [max(buckets), 1])]
        self.top = max(buckets)

    def batch_sizes(self) -> range:
        return range(1, self.top + 1)


# ---- the tests ------------------------------------------------------------------------------------


def _rows(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    return {"x": rng.standard_normal((n, WIDTH)).astype(np.float32)}


def _same(got: dict[str, np.ndarray], x: np.ndarray) -> None:
    want = expected(x)
    assert got.keys() == want.keys()
    for k in want:
        np.testing.assert_array_equal(np.asarray(got[k]), want[k], err_msg=k)


def test_pipelined_results_reach_their_callers_from_16_threads():
    # a slow fake GPU reads each batch's staging buffer late: a lane reused too early would show
    eng = FakeCudaEngine([1, 2, 4, 8], cost_ms=lambda n: 2.0)
    rng = np.random.default_rng(0)
    reqs = [_rows(rng, int(rng.integers(1, 4))) for _ in range(160)]
    got: list[Any] = [None] * len(reqs)

    def client(k: int) -> None:
        for i in range(k, len(reqs), 16):
            got[i] = b.run(reqs[i], timeout=60)

    with Batcher(eng, max_batch=8, max_wait_ms=1.0, pipeline=2) as b:
        threads = [threading.Thread(target=client, args=(k,)) for k in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    for r, g in zip(reqs, got, strict=True):
        _same(g, r["x"])
    assert b.stats.requests == len(reqs) and b.stats.rows == sum(r["x"].shape[0] for r in reqs)
    assert all(n in (1, 2, 4, 8) for n in eng.gpu.runs)  # every batch ran at a bucket's batch
    assert eng.gpu.max_queued == 2  # two batches were in flight at once, never more
    # one context per lane and bucket used, made when first needed
    assert sorted(set(eng.dynamic.made)) == sorted(set(eng.gpu.runs))
    assert all(eng.dynamic.made.count(n) <= 2 for n in set(eng.dynamic.made))


def test_one_lane_keeps_one_batch_in_flight():
    eng = FakeCudaEngine([4], cost_ms=lambda n: 5.0)
    rng = np.random.default_rng(1)
    reqs = [_rows(rng, 4) for _ in range(6)]
    with Batcher(eng, max_wait_ms=0, pipeline=1) as b:
        futs = [b.submit(r) for r in reqs]
    for r, f in zip(reqs, futs, strict=True):
        _same(f.result(), r["x"])
    assert eng.gpu.max_queued == 1 and eng.gpu.runs == [4] * 6


def test_a_partial_batch_is_padded_to_its_bucket():
    eng = FakeCudaEngine([1, 4, 8])
    x = np.arange(3 * WIDTH, dtype=np.float32).reshape(3, WIDTH)
    with Batcher(eng, max_wait_ms=0) as b:
        got = b.run({"x": x}, timeout=30)
    _same(got, x)  # 3 rows out, not the bucket's 4
    assert eng.gpu.runs == [4] and b.stats.padded_rows == 1


def test_an_asynchronous_failure_reaches_only_its_batch():
    eng = FakeCudaEngine([4], cost_ms=lambda n: 3.0)
    rng = np.random.default_rng(2)
    groups = [[_rows(rng, 1) for _ in range(4)] for _ in range(3)]
    groups[1][2]["x"][0, 0] = POISON  # one bad row poisons the second batch on the "GPU"
    with Batcher(eng, max_batch=4, max_wait_ms=60_000, pipeline=2, eager=False) as b:
        futs = [[b.submit(r) for r in g] for g in groups]  # 4 rows each, held: each group is one batch
    for g, fs in zip(groups, futs, strict=True):
        for r, f in zip(g, fs, strict=True):
            if g is groups[1]:
                with pytest.raises(RuntimeError, match="illegal address"):
                    f.result()
            else:
                _same(f.result(), r["x"])
    assert b.stats.failed_batches == 1 and b.stats.batches == 2


def test_close_drains_batches_in_flight_and_queued():
    eng = FakeCudaEngine([2], cost_ms=lambda n: 30.0)
    rng = np.random.default_rng(3)
    reqs = [_rows(rng, 1) for _ in range(9)]
    b = Batcher(eng, max_wait_ms=600_000, pipeline=2, eager=False)  # held: only full batches run before close()
    futs = [b.submit(r) for r in reqs]
    time.sleep(0.01)  # two full batches are on the fake GPU now, two more and a half one queued
    assert not all(f.done() for f in futs)
    b.close()
    assert all(f.done() for f in futs)
    for r, f in zip(reqs, futs, strict=True):
        _same(f.result(), r["x"])
    assert eng.gpu.runs == [2] * 5 and b.stats.padded_rows == 1
    with pytest.raises(EngineError, match="the batcher is closed"):
        b.submit(reqs[0])


def test_results_come_back_in_order_of_submission():
    eng = FakeCudaEngine([1, 2, 4], cost_ms=lambda n: 1.0)
    rng = np.random.default_rng(4)
    reqs = [_rows(rng, 1) for _ in range(24)]
    done: list[int] = []
    with Batcher(eng, max_batch=4, max_wait_ms=0.5, pipeline=3) as b:
        futs = []
        for i, r in enumerate(reqs):
            f = b.submit(r)
            f.add_done_callback(lambda _f, i=i: done.append(i))
            futs.append(f)
    assert done == sorted(done)  # batches are delivered in the order they were started
    for r, f in zip(reqs, futs, strict=True):
        _same(f.result(), r["x"])


def test_pipeline_must_be_positive():
    with pytest.raises(EngineError, match="pipeline must be at least 1"):
        Batcher(FakeCudaEngine([2]), pipeline=0)


def test_run_raises_its_batch_error_and_times_out():
    eng = FakeCudaEngine([1, 2], cost_ms=lambda n: 200.0 if n == 2 else 0.0)
    bad = {"x": np.full((1, WIDTH), POISON, np.float32)}
    with Batcher(eng, max_wait_ms=0) as b:
        with pytest.raises(RuntimeError, match="illegal address"):
            b.run(bad, timeout=30)  # run() waits on a lock, not a Future: the error still comes back
        x = np.ones((2, WIDTH), np.float32)
        t0 = time.monotonic()
        with pytest.raises(TimeoutError, match="no result within 0.02 s"):
            b.run({"x": x}, timeout=0.02)  # 200 ms on the fake GPU
        assert time.monotonic() - t0 < 0.2
        _same(b.run({"x": x[:1]}, timeout=30), x[:1])  # the batcher goes on after both
    assert b.stats.failed_batches == 1 and b.stats.batches == 2


def test_close_from_a_done_callback_does_not_hang():
    eng = FakeCudaEngine([1], cost_ms=lambda n: 5.0)
    rng = np.random.default_rng(6)
    reqs = [_rows(rng, 1) for _ in range(4)]
    b = Batcher(eng, max_wait_ms=0, pipeline=2)
    futs = [b.submit(r) for r in reqs]  # both lanes busy when the first result comes back
    futs[0].add_done_callback(lambda _f: b.close())
    for r, f in zip(reqs, futs, strict=True):
        _same(f.result(timeout=30), r["x"])  # requests queued before close() still run
    b.close()
    assert not b._worker.is_alive() and not b._deliverer.is_alive()


def test_warm_makes_every_context_first_and_a_faster_bucket_takes_a_partial_batch():
    # bucket 4 is slow and bucket 8 fast (as BERT-base's bucket 13 against 32 on the H200)
    eng = FakeCudaEngine([1, 2, 4, 8], cost_ms=lambda n: {1: 1.0, 2: 1.0, 4: 40.0, 8: 2.0}[n])
    x = np.arange(3 * WIDTH, dtype=np.float32).reshape(3, WIDTH)
    with Batcher(eng, max_wait_ms=0, pipeline=2, warm={"x": x[:1]}) as b:
        assert sorted(eng.dynamic.made) == [1, 1, 2, 2, 4, 4, 8, 8]  # every lane, every bucket, made already
        assert sorted(eng.gpu.runs) == sorted([1, 2, 4, 8] * 4)  # each run twice per lane, the second timed
        assert b.stats.batches == 0  # warming is no request
        del eng.gpu.runs[:]
        got = b.run({"x": x}, timeout=30)  # 3 rows: bucket 4 by shape, bucket 8 by measured time
        _same(got, x)
        assert eng.gpu.runs == [8] and b.stats.padded_rows == 5
        got = b.run({"x": x[:2]}, timeout=30)  # its own bucket (2) is as fast as any: it stays
        _same(got, x[:2])
        assert eng.gpu.runs == [8, 2]
    assert len(eng.dynamic.made) == 8  # serving made no context


def test_no_larger_bucket_where_the_batch_dim_is_not_proven_paddable():
    eng = FakeCudaEngine([1, 2, 4, 8], cost_ms=lambda n: {1: 1.0, 2: 1.0, 4: 40.0, 8: 2.0}[n])
    group = type("Dim", (), {"positions": [("x", 0)], "padded": False})()
    profile = type("Profile", (), {"dims": [group]})()
    resolve = eng.dynamic.resolve
    eng.dynamic.resolve = lambda e, f: (profile, *resolve(e, f)[1:])
    x = np.arange(3 * WIDTH, dtype=np.float32).reshape(3, WIDTH)
    with Batcher(eng, max_wait_ms=0, warm={"x": x[:1]}) as b:
        del eng.gpu.runs[:]
        _same(b.run({"x": x}, timeout=30), x)
    assert eng.gpu.runs == [4]  # its own bucket, however slow: rows may not be independent


def test_a_bucket_that_pads_another_dim_runs_through_engine_run(caplog):
    eng = FakeCudaEngine([2, 4])
    eng.dynamic._b[4].shapes = {"x": [4, WIDTH + 2]}  # as a bucket padding a sequence dim would
    runs: list[int] = []

    def run(feeds):  # engine.run: pads (and slices) by itself
        runs.append(feeds["x"].shape[0])
        return expected(feeds["x"])

    eng.run = run
    rng = np.random.default_rng(7)
    with caplog.at_level("INFO", logger="graphc.runtime.batcher"), Batcher(eng, max_wait_ms=0) as b:
        small, big = _rows(rng, 2), _rows(rng, 3)
        _same(b.run(small, timeout=30), small["x"])
        _same(b.run(big, timeout=30), big["x"])
    assert eng.gpu.runs == [2] and runs == [3]  # the context for bucket 2, engine.run for 3 rows
    assert "batch 3 runs through engine.run" in caplog.text


def test_asyncio_callers_on_the_pipelined_path():
    import asyncio

    eng = FakeCudaEngine([1, 2, 4, 8], cost_ms=lambda n: 1.0)
    rng = np.random.default_rng(8)
    reqs = [_rows(rng, 1) for _ in range(20)]

    async def main(b: Batcher) -> list[dict[str, np.ndarray]]:
        return await asyncio.gather(*(b.arun(r) for r in reqs))

    with Batcher(eng, max_batch=8, max_wait_ms=5) as b:
        outs = asyncio.run(main(b))
    for r, got in zip(reqs, outs, strict=True):
        _same(got, r["x"])
    assert b.stats.requests == 20 and b.stats.batches < 20  # they were batched
