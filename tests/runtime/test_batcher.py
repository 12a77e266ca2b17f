"""graphc.runtime.Batcher on CPU engines of the zoo built for batch 8: every request's outputs equal
running that request alone through the engine bit for bit, from 32 threads and from asyncio; bad
requests and engine failures reach only their callers; max_wait, max_batch and close() behave.
The default is eager (a batch closes as soon as none runs); the tests of holding a partial batch
for max_wait pass eager=False."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest

import graphc
import models
from graphc.runtime import Batcher, EngineError, EngineInputError
from graphc.runtime.batcher import accepted_batch_sizes, run_size, stack_rows

B = 8


@pytest.fixture(scope="module")
def mlp():
    return graphc.compile(models.build("mlp", size="tiny"), target="cpu", shapes={"batch": B})


@pytest.fixture(scope="module")
def bert():
    return graphc.compile(models.build("bert", size="tiny"), target="cpu", shapes={"batch": B, "seq": 8})


def _mlp_request(rng: np.random.Generator, rows: int) -> dict[str, np.ndarray]:
    return {"input": rng.standard_normal((rows, 64)).astype(np.float32)}


def _bert_request(rng: np.random.Generator, rows: int) -> dict[str, np.ndarray]:
    ids = rng.integers(0, 128, size=(rows, 8), dtype=np.int64)
    mask = np.ones((rows, 8), dtype=np.int64)
    mask[:, rng.integers(3, 8) :] = 0  # padded tokens: rows of one batch differ in their masks
    return {"input_ids": ids, "attention_mask": mask}


def _alone(engine, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The request run by itself: padded to the engine's batch with copies of its own last row."""
    rows = next(iter(feeds.values())).shape[0]
    padded = {k: np.concatenate([v, np.repeat(v[-1:], B - rows, axis=0)]) for k, v in feeds.items()}
    return {k: v[:rows] for k, v in engine.run(padded).items()}


def _assert_same(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    assert got.keys() == want.keys()
    for k in want:
        assert got[k].shape == want[k].shape, k
        assert np.array_equal(got[k], want[k]), f"{k}: max diff {np.abs(got[k] - want[k]).max()}"


class _Recording:
    """An engine wrapper that records the batch of every run and can fail chosen runs."""

    def __init__(self, engine, fail_on: set[int] = frozenset(), sizes=None) -> None:
        self.engine, self.fail_on, self.calls = engine, set(fail_on), []
        self.inputs, self.outputs, self.target = engine.inputs, engine.outputs, engine.target
        if sizes is not None:
            self.batch_sizes = lambda: sizes

    def run(self, feeds):
        self.calls.append(next(iter(feeds.values())).shape[0])
        if len(self.calls) in self.fail_on:
            raise RuntimeError(f"engine failure in run {len(self.calls)}")
        if self.calls[-1] != B:  # stands in for an engine with a profile: n rows give n rows
            return _alone(self.engine, feeds)
        return self.engine.run(feeds)


@pytest.mark.parametrize("eager", [True, False])
@pytest.mark.parametrize("name", ["mlp", "bert"])
def test_32_threads_get_their_own_rows_bit_identical(name, eager, request):
    engine = request.getfixturevalue(name)
    make = _mlp_request if name == "mlp" else _bert_request
    results: dict[tuple[int, int], tuple] = {}
    errors = []

    def client(t: int) -> None:
        rng = np.random.default_rng(t)
        try:
            for i in range(4):
                feeds = make(rng, int(rng.integers(1, 4)))  # 1 to 3 rows per request
                results[(t, i)] = (feeds, batcher.run(feeds, timeout=60))
        except Exception as e:  # noqa: BLE001  (reported by the assert below)
            errors.append(e)

    with Batcher(engine, max_batch=B, max_wait_ms=5, eager=eager) as batcher:
        threads = [threading.Thread(target=client, args=(t,)) for t in range(32)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    assert not errors
    assert len(results) == 32 * 4
    for feeds, got in results.values():
        _assert_same(got, _alone(engine, feeds))
    s = batcher.stats
    assert s.requests == 128 and s.rows == sum(next(iter(f.values())).shape[0] for f, _ in results.values())
    assert batcher.eager is eager
    if not eager:  # held for 5 ms, concurrent requests share engine runs (eager ones may run alone)
        assert s.batches < 128
        assert s.mean_batch > 1


def test_partial_batch_is_padded_and_pad_rows_do_not_leak(mlp):
    rec = _Recording(mlp)
    feeds = _mlp_request(np.random.default_rng(1), 3)
    with Batcher(rec, max_wait_ms=0) as b:
        got = b.run(feeds)
    assert got["logits"].shape == (3, 10)
    _assert_same(got, _alone(mlp, feeds))
    assert rec.calls == [B]  # a fixed-shape engine runs at its own batch
    assert b.stats.padded_rows == B - 3


def test_stack_rows_pads_with_copies_of_the_last_row():
    a, c = np.arange(6.0).reshape(3, 2), np.arange(10.0, 12.0).reshape(1, 2)
    out = stack_rows([a, c], 6)
    assert out.shape == (6, 2)
    assert np.array_equal(out[:3], a) and np.array_equal(out[3:], np.repeat(c, 3, axis=0))
    assert not np.isnan(out).any()


def test_engine_with_a_range_of_batch_sizes_runs_unpadded(mlp):
    rec = _Recording(mlp, sizes=range(1, B + 1))
    assert accepted_batch_sizes(rec) == range(1, B + 1)
    assert run_size(5, range(1, 9)) == 5 and run_size(5, (8,)) == 8
    feeds = _mlp_request(np.random.default_rng(2), 5)
    with Batcher(rec, max_wait_ms=0) as b:
        got = b.run(feeds)
    assert rec.calls == [5]
    assert b.stats.padded_rows == 0
    _assert_same(got, _alone(mlp, feeds))


@pytest.mark.parametrize("eager", [True, False])
def test_asyncio_callers(bert, eager):
    rng = np.random.default_rng(3)
    reqs = [_bert_request(rng, 1) for _ in range(16)]

    async def main(b: Batcher):
        return await asyncio.gather(*(b.arun(f) for f in reqs))

    with Batcher(bert, max_batch=B, max_wait_ms=20, eager=eager) as b:
        outs = asyncio.run(main(b))
    for feeds, got in zip(reqs, outs, strict=True):
        _assert_same(got, _alone(bert, feeds))
    assert b.stats.requests == 16
    if not eager:
        assert b.stats.batches < 16  # held for 20 ms: they were batched


@pytest.mark.parametrize(
    "bad, message",
    [
        ({"input": np.zeros((1, 64), np.float64)}, "input 'input' has dtype float64, the engine takes float32"),
        ({"input": np.zeros((1, 63), np.float32)}, "input 'input' has shape (1, 63), the batcher takes (N, 64)"),
        ({"input": np.zeros((9, 64), np.float32)}, "a request has 9 rows; the batcher takes 1 to max_batch=8"),
        ({"input": np.zeros((0, 64), np.float32)}, "a request has 0 rows"),
        ({"x": np.zeros((1, 64), np.float32)}, "unknown input(s) ['x']"),
        ({}, "input 'input' (float32[8, 64]) is missing"),
    ],
)
def test_a_bad_request_fails_alone(mlp, bad, message):
    rng = np.random.default_rng(4)
    good = [_mlp_request(rng, 1) for _ in range(3)]
    with Batcher(mlp, max_wait_ms=10_000, eager=False) as b:  # held: the three good ones are one batch
        futs = [b.submit(g) for g in good[:2]]
        with pytest.raises(EngineInputError) as e:
            b.submit(bad)
        assert message in str(e.value) and "\n" not in str(e.value)
        futs.append(b.submit(good[2]))
    for g, f in zip(good, futs, strict=True):
        _assert_same(f.result(), _alone(mlp, g))
    assert b.stats.requests == 3 and b.stats.batches == 1


def test_engine_error_reaches_its_batch_and_not_the_next(mlp):
    rec = _Recording(mlp, fail_on={1})
    rng = np.random.default_rng(5)
    first = [_mlp_request(rng, 1) for _ in range(4)]
    second = [_mlp_request(rng, 1) for _ in range(4)]
    # held: max_batch fills at 4 rows long before the wait ends, so each group of 4 is one batch
    with Batcher(rec, max_batch=4, max_wait_ms=60_000, eager=False) as b:
        f1 = [b.submit(f) for f in first]
        for f in f1:
            with pytest.raises(RuntimeError, match="engine failure in run 1"):
                f.result(timeout=30)
        f2 = [b.submit(f) for f in second]
        for feeds, f in zip(second, f2, strict=True):
            _assert_same(f.result(timeout=30), _alone(mlp, feeds))
    assert rec.calls == [B, B]
    assert b.stats.failed_batches == 1 and b.stats.batches == 1


def test_held_lone_request_waits_for_max_wait_then_runs(mlp):
    feeds = _mlp_request(np.random.default_rng(6), 1)
    with Batcher(mlp, max_wait_ms=50, eager=False) as b:
        t0 = time.monotonic()
        got = b.run(feeds, timeout=30)
        waited = time.monotonic() - t0
    _assert_same(got, _alone(mlp, feeds))
    assert waited >= 0.05  # a partial batch is held for max_wait for company
    assert waited < 30  # and then runs alone (a generous bound: no speed is asserted)
    assert b.stats.batches == 1 and b.stats.padded_rows == B - 1


def test_a_full_batch_runs_without_waiting(mlp):
    rng = np.random.default_rng(7)
    reqs = [_mlp_request(rng, 2) for _ in range(4)]
    with Batcher(mlp, max_wait_ms=600_000, eager=False) as b:  # only a full batch can run before close()
        futs = [b.submit(f) for f in reqs]
        outs = [f.result(timeout=60) for f in futs]
        assert b.stats.batches == 1 and b.stats.padded_rows == 0
    for feeds, got in zip(reqs, outs, strict=True):
        _assert_same(got, _alone(mlp, feeds))


def test_requests_stay_whole_and_in_order(mlp):
    rec = _Recording(mlp)
    rng = np.random.default_rng(8)
    reqs = [_mlp_request(rng, n) for n in (5, 5, 3)]  # 5 + 5 > 8: the second starts the next batch
    with Batcher(rec, max_wait_ms=600_000, eager=False) as b:
        futs = [b.submit(f) for f in reqs]
    for feeds, f in zip(reqs, futs, strict=True):
        _assert_same(f.result(), _alone(mlp, feeds))
    assert b.stats.batches == 2 and b.stats.rows == 13


def test_close_drains_pending_requests(mlp):
    rng = np.random.default_rng(9)
    reqs = [_mlp_request(rng, 1) for _ in range(3)]
    b = Batcher(mlp, max_wait_ms=600_000, eager=False)  # nothing would run for ten minutes but for close()
    futs = [b.submit(f) for f in reqs]
    assert not any(f.done() for f in futs)
    b.close()
    assert all(f.done() for f in futs)
    for feeds, f in zip(reqs, futs, strict=True):
        _assert_same(f.result(), _alone(mlp, feeds))
    with pytest.raises(EngineError, match="the batcher is closed"):
        b.submit(reqs[0])
    b.close()  # a second close is harmless


def test_a_cancelled_request_drops_out(mlp):
    rng = np.random.default_rng(10)
    reqs = [_mlp_request(rng, 1) for _ in range(2)]
    with Batcher(mlp, max_wait_ms=600_000, eager=False) as b:  # held, so f0 can still be cancelled
        f0, f1 = (b.submit(f) for f in reqs)
        assert f0.cancel()
    _assert_same(f1.result(), _alone(mlp, reqs[1]))
    assert b.stats.requests == 1


def test_max_batch_above_the_engine_batch_is_refused(mlp):
    with pytest.raises(EngineError) as e:
        Batcher(mlp, max_batch=16)
    assert str(e.value) == "max_batch 16 is more than the engine's largest batch 8"
    with pytest.raises(EngineError, match="max_batch must be at least 1"):
        Batcher(mlp, max_batch=0)
    with pytest.raises(EngineError, match="max_wait_ms must be >= 0"):
        Batcher(mlp, max_wait_ms=-1)
    with Batcher(mlp) as b:
        assert b.max_batch == B  # default: the engine's batch
        assert b.eager is True  # default: a batch closes as soon as none runs


def test_by_default_a_lone_request_runs_at_once(mlp):
    """The default Batcher is eager: with nothing running, a lone request does not wait for company
    (held, it would wait the whole minute of max_wait and run() would time out after 30 s)."""
    rec = _Recording(mlp)
    feeds = _mlp_request(np.random.default_rng(11), 2)
    with Batcher(rec, max_wait_ms=60_000) as b:
        got = b.run(feeds, timeout=30)
        _assert_same(got, _alone(mlp, feeds))
        assert b.stats.batches == 1 and rec.calls == [B]  # it ran before close()
        got = b.run(feeds, timeout=30)  # and so does the next, once the first is done
        _assert_same(got, _alone(mlp, feeds))
        assert b.stats.batches == 2
