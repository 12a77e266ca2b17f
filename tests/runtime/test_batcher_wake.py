"""The Batcher's cheap per-request paths (runtime/batcher.py): run() callers of one batch woken as a
chain (each wakes the next), with a caller that timed out skipped and errors passed along the same
chain; the batch-1 fast check; the default eager Batcher, which closes a batch when none is running,
and eager=False, which holds it for max_wait. On the stand-in CUDA engine of test_batcher_pipeline
(a fake GPU thread). The chain tests hold their batch (eager=False) so it gathers all their callers."""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
import pytest

from graphc.runtime import Batcher, EngineInputError
from tests.runtime.test_batcher_pipeline import POISON, WIDTH, FakeCudaEngine, _rows, _same


def _in_order(b: Batcher, reqs: list[dict[str, np.ndarray]], timeouts: list[float]) -> list[Any]:
    """run() each request from its own thread, the threads started in order and each request in
    the queue before the next thread starts (so the batch holds them in this order)."""
    out: list[Any] = [None] * len(reqs)

    def client(i: int) -> None:
        try:
            out[i] = b.run(reqs[i], timeout=timeouts[i])
        except Exception as e:  # noqa: BLE001  (the test looks at what each caller got)
            out[i] = e

    threads = []
    for i in range(len(reqs)):
        before = len(b._queue)
        t = threading.Thread(target=client, args=(i,))
        t.start()
        threads.append(t)
        deadline = time.monotonic() + 10
        while len(b._queue) == before and time.monotonic() < deadline and i < b.max_batch - 1:
            time.sleep(0.001)  # wait for it to be queued (the last one fills the batch and runs it)
    for t in threads:
        t.join(30)
    return out


def test_every_caller_of_a_batch_is_woken_and_a_timed_out_one_is_skipped():
    eng = FakeCudaEngine([4], cost_ms=lambda n: 300.0)
    rng = np.random.default_rng(0)
    reqs = [_rows(rng, 1) for _ in range(4)]
    # the second caller gives up after 50 ms, long before the 300 ms batch ends: the chain that
    # wakes the callers one by one must pass over it to reach the third and fourth
    with Batcher(eng, max_batch=4, max_wait_ms=60_000, eager=False) as b:
        got = _in_order(b, reqs, [30, 0.05, 30, 30])
        assert isinstance(got[1], TimeoutError)
        for i in (0, 2, 3):
            _same(got[i], reqs[i]["x"])
        again = b.submit(reqs[1])  # the batcher goes on (this one runs at close, which drains)
    _same(again.result(30), reqs[1]["x"])
    assert b.stats.batches == 2 and eng.gpu.runs == [4, 4]


def test_a_failed_batch_reaches_every_run_caller_along_the_chain():
    eng = FakeCudaEngine([4], cost_ms=lambda n: 20.0)
    rng = np.random.default_rng(1)
    reqs = [_rows(rng, 1) for _ in range(4)]
    reqs[3]["x"][0, 0] = POISON  # fails the whole batch on the fake GPU, at synchronize
    with Batcher(eng, max_batch=4, max_wait_ms=60_000, eager=False) as b:
        got = _in_order(b, reqs, [30] * 4)
    assert all(isinstance(g, RuntimeError) and "illegal address" in str(g) for g in got), got
    assert b.stats.failed_batches == 1


def test_run_and_submit_callers_mixed_in_one_batch():
    eng = FakeCudaEngine([8], cost_ms=lambda n: 5.0)
    rng = np.random.default_rng(2)
    reqs = [_rows(rng, 1) for _ in range(8)]
    with Batcher(eng, max_batch=8, max_wait_ms=60_000, eager=False) as b:
        futs = [b.submit(r) for r in reqs[:3]]
        got = _in_order(b, reqs[3:], [30] * 5)
    for r, f in zip(reqs[:3], futs, strict=True):
        _same(f.result(), r["x"])
    for r, g in zip(reqs[3:], got, strict=True):
        _same(g, r["x"])
    assert b.stats.batches == 1


def test_the_batch_1_fast_check_refuses_what_the_slow_one_does():
    eng = FakeCudaEngine([1, 2])
    with Batcher(eng, max_wait_ms=0) as b:
        x = np.ones((1, WIDTH), np.float32)
        _same(b.run({"x": x}, timeout=30), x)
        _same(b.run({"x": x[::1, ::1].copy(order="F")}, timeout=30), x)  # (1, 6) F-order: still one row
        with pytest.raises(EngineInputError, match="has dtype float64, the engine takes float32"):
            b.run({"x": x.astype(np.float64)})
        with pytest.raises(EngineInputError, match=r"has shape \(1, 5\), the batcher takes \(N, 6\)"):
            b.run({"x": x[:, :5]})
        with pytest.raises(EngineInputError, match="unknown input"):
            b.run({"y": x})
    assert b.stats.batches == 2


def test_by_default_a_lone_request_runs_at_once_and_others_gather_behind_a_running_batch():
    eng = FakeCudaEngine([1, 2, 4, 8], cost_ms=lambda n: 150.0)
    rng = np.random.default_rng(3)
    reqs = [_rows(rng, 1) for _ in range(5)]
    with Batcher(eng, max_batch=8, max_wait_ms=60_000) as b:  # the default: eager
        assert b.eager is True
        t0 = time.monotonic()
        first = b.submit(reqs[0])  # nothing runs: it closes at once, not after a minute
        time.sleep(0.05)  # it is on the fake GPU now, for 150 ms
        rest = [b.submit(r) for r in reqs[1:]]  # they wait for it, then run together
        _same(first.result(30), reqs[0]["x"])
        for r, f in zip(reqs[1:], rest, strict=True):
            _same(f.result(30), r["x"])
        took = time.monotonic() - t0
    assert eng.gpu.runs == [1, 4]
    assert took < 30  # (a minute if eager waited for max_wait; no speed is asserted)


def test_eager_false_holds_a_partial_batch_even_when_nothing_runs():
    eng = FakeCudaEngine([1, 2, 4, 8], cost_ms=lambda n: 1.0)
    rng = np.random.default_rng(4)
    reqs = [_rows(rng, 1) for _ in range(3)]
    with Batcher(eng, max_batch=8, max_wait_ms=200, eager=False) as b:
        futs = [b.submit(r) for r in reqs]
        for r, f in zip(reqs, futs, strict=True):
            _same(f.result(30), r["x"])
    assert eng.gpu.runs == [4]  # one batch of the three (padded to its bucket), after max_wait
