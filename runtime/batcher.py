"""Dynamic batching: concurrent requests that arrive close together run as one engine call.

`Batcher(engine, max_batch=8, max_wait_ms=2.0)` gathers requests (from threads through `run` or
`submit`, from asyncio through `await batcher.arun(...)`) along dim 0 of every input, up to
`max_batch` rows or `max_wait_ms` after the oldest waiting request, runs the engine once on one
worker thread, and hands each caller its rows of every output.

Which batch sizes an engine accepts is asked in one place, `accepted_batch_sizes(engine)`: an
engine with a `batch_sizes()` method (a range, once engines carry optimization profiles) is run
at the size of the gathered batch; today's fixed-shape engines accept only the batch they were
built for, so a partial batch is padded up to it with copies of its last row (real data, so no
NaN or uninitialized path runs) and the pad rows' outputs are dropped.

Errors reach the caller whose request caused them: a request with a wrong name, dtype or shape
fails alone in `submit`, before it joins a batch; an engine failure fails every request of that
batch and no other. `close()` (or leaving a `with` block) runs every pending request first.
numpy + stdlib only; cupy arrays pass through for CUDA engines.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections import deque
from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from graphc.runtime.errors import EngineError, EngineInputError

log = logging.getLogger(__name__)


# A range once engines carry profiles (every size from min to max); a tuple for fixed shapes.
BatchSizes = tuple[int, ...] | range


def accepted_batch_sizes(engine: Any) -> BatchSizes:
    """The batch sizes (dim 0) the engine runs at: its `batch_sizes()` where it has one (engines
    with profiles), else the one batch a fixed-shape engine was built for (dim 0 of its inputs)."""
    ask = getattr(engine, "batch_sizes", None)
    if callable(ask):
        return ask()
    batches = {int(s.shape[0]) for s in engine.inputs if s.shape}
    if len(batches) != 1 or any(not s.shape for s in engine.inputs):
        shapes = ", ".join(f"{s.name} {list(s.shape)}" for s in engine.inputs)
        raise EngineError(f"cannot batch this engine: its inputs do not share one batch dim 0 ({shapes})")
    return (batches.pop(),)


def run_size(rows: int, sizes: BatchSizes) -> int:
    """The batch size to run `rows` rows at: `rows` itself if accepted, else the smallest accepted
    size above it (the rest is padding)."""
    if rows in sizes:
        return rows
    above = [s for s in sizes if s >= rows]
    if not above:
        raise EngineError(f"no accepted batch size holds {rows} rows (the engine takes up to {max(sizes)})")
    return min(above)


def _xp(arrays: list[Any]) -> Any:
    """numpy, or cupy where any piece is a cupy array (a CUDA engine's device inputs)."""
    if any(type(a).__module__.startswith("cupy") for a in arrays):
        return sys.modules["cupy"]
    return np


def stack_rows(pieces: list[Any], size: int) -> Any:
    """The pieces concatenated along dim 0 and padded to `size` rows with copies of the last row."""
    xp = _xp(pieces)
    if xp is not np:
        pieces = [xp.asarray(p) for p in pieces]
    rows = sum(int(p.shape[0]) for p in pieces)
    if rows < size:
        last = pieces[-1][-1:]
        pieces = [*pieces, xp.repeat(last, size - rows, axis=0)]
    return pieces[0] if len(pieces) == 1 else xp.concatenate(pieces, axis=0)


@dataclass
class BatcherStats:
    """What the batcher has run: `rows / batches` is the mean batch size (pad rows not counted)."""

    requests: int = 0
    rows: int = 0
    batches: int = 0
    padded_rows: int = 0
    failed_batches: int = 0

    @property
    def mean_batch(self) -> float:
        return self.rows / self.batches if self.batches else 0.0


@dataclass
class _Request:
    feeds: dict[str, Any]
    rows: int
    arrived: float
    future: Future = field(default_factory=Future)


class Batcher:
    """Gathers concurrent requests into batches for one engine; see the module docstring."""

    def __init__(self, engine: Any, max_batch: int | None = None, max_wait_ms: float = 2.0) -> None:
        self.engine = engine
        self.sizes = accepted_batch_sizes(engine)
        top = max(self.sizes)
        if max_batch is None:
            max_batch = top
        if max_batch < 1:
            raise EngineError(f"max_batch must be at least 1, got {max_batch}")
        if max_batch > top:
            raise EngineError(f"max_batch {max_batch} is more than the engine's largest batch {top}")
        if max_wait_ms < 0:
            raise EngineError(f"max_wait_ms must be >= 0, got {max_wait_ms}")
        outs = [s for s in engine.outputs if not s.shape or int(s.shape[0]) != top]
        if outs and not callable(getattr(engine, "batch_sizes", None)):
            o = outs[0]
            raise EngineError(
                f"cannot batch this engine: output '{o.name}' {list(o.shape)} has no batch dim 0 of {top}"
            )
        self.max_batch = max_batch
        self.max_wait = max_wait_ms / 1000.0
        self.stats = BatcherStats()
        self._specs = {s.name: s for s in engine.inputs}
        self._queue: deque[_Request] = deque()
        self._queued_rows = 0
        self._cond = threading.Condition()
        self._closed = False
        self._worker = threading.Thread(target=self._loop, name="graphc-batcher", daemon=True)
        self._worker.start()

    # ---- callers -------------------------------------------------------------------------------

    def _check(self, feeds: Mapping[str, Any]) -> tuple[dict[str, Any], int]:
        """The request's arrays and its rows, or a one-line EngineInputError for this caller alone."""
        unknown = sorted(set(feeds) - set(self._specs))
        if unknown:
            raise EngineInputError(f"unknown input(s) {unknown}; the engine takes {sorted(self._specs)}")
        out: dict[str, Any] = {}
        rows = None
        for name, spec in self._specs.items():
            if name not in feeds:
                raise EngineInputError(f"input '{name}' ({spec.dtype}{spec.shape}) is missing")
            x = feeds[name]
            if not (isinstance(x, np.ndarray) or type(x).__module__.startswith("cupy")):
                x = np.asarray(x)
            tail = list(spec.shape[1:])
            if str(x.dtype) != spec.dtype:
                raise EngineInputError(f"input '{name}' has dtype {x.dtype}, the engine takes {spec.dtype}")
            if x.ndim != len(spec.shape) or list(x.shape[1:]) != tail:
                want = "(N, " + ", ".join(str(d) for d in tail) + ")"
                raise EngineInputError(f"input '{name}' has shape {tuple(x.shape)}, the batcher takes {want}")
            n = int(x.shape[0])
            if rows is not None and n != rows:
                raise EngineInputError(f"input '{name}' has {n} rows, the request's other inputs {rows}")
            rows = n
            out[name] = x
        assert rows is not None  # an engine has at least one input
        if not 1 <= rows <= self.max_batch:
            raise EngineInputError(f"a request has {rows} rows; the batcher takes 1 to max_batch={self.max_batch}")
        return out, rows

    def submit(self, feeds: Mapping[str, Any]) -> Future:
        """Queue one request; its Future gives the request's rows of every output."""
        checked, rows = self._check(feeds)
        req = _Request(checked, rows, time.monotonic())
        with self._cond:
            if self._closed:
                raise EngineError("the batcher is closed")
            self._queue.append(req)
            self._queued_rows += rows
            self._cond.notify()
        return req.future

    def run(self, feeds: Mapping[str, Any], timeout: float | None = None) -> dict[str, Any]:
        """Submit one request and wait for its outputs (from any thread)."""
        return self.submit(feeds).result(timeout)

    def __call__(self, **feeds: Any) -> dict[str, Any]:
        return self.run(feeds)

    async def arun(self, feeds: Mapping[str, Any]) -> dict[str, Any]:
        """`await batcher.arun(feeds)`: the asyncio form of run; the event loop is never blocked."""
        import asyncio  # here, so that loading an engine does not import asyncio

        return await asyncio.wrap_future(self.submit(feeds))

    def close(self) -> None:
        """Run every pending request, then stop the worker. Later submits raise EngineError."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        if threading.current_thread() is not self._worker:
            self._worker.join()

    def __enter__(self) -> Batcher:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ---- the worker ----------------------------------------------------------------------------

    def _take(self) -> list[_Request] | None:
        """Wait (on the condition, never spinning) for a batch: max_batch rows, or max_wait after
        the oldest request, or close(). None once closed and drained."""
        with self._cond:
            while not self._queue:
                if self._closed:
                    return None
                self._cond.wait()
            deadline = self._queue[0].arrived + self.max_wait
            while self._queued_rows < self.max_batch and not self._closed:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            batch, rows = [], 0
            # Requests stay whole and in arrival order: stop at the first that does not fit.
            while self._queue and rows + self._queue[0].rows <= self.max_batch:
                req = self._queue.popleft()
                rows += req.rows
                self._queued_rows -= req.rows
                batch.append(req)
            return batch

    def _loop(self) -> None:
        while (batch := self._take()) is not None:
            live = [r for r in batch if r.future.set_running_or_notify_cancel()]  # cancelled ones drop out
            if live:
                self._run(live)

    def _run(self, batch: list[_Request]) -> None:
        rows = sum(r.rows for r in batch)
        try:
            size = run_size(rows, self.sizes)
            feeds = {name: stack_rows([r.feeds[name] for r in batch], size) for name in self._specs}
            outs = self.engine.run(feeds)
            starts = [sum(r.rows for r in batch[:i]) for i in range(len(batch))]
            results = [{k: v[s : s + r.rows] for k, v in outs.items()} for s, r in zip(starts, batch, strict=True)]
        except Exception as e:  # noqa: BLE001  (every caller of the batch gets the engine's error)
            log.debug("batch of %d requests failed: %s", len(batch), e)
            self.stats.failed_batches += 1
            for r in batch:
                r.future.set_exception(e)
            return
        self.stats.requests += len(batch)
        self.stats.rows += rows
        self.stats.batches += 1
        self.stats.padded_rows += size - rows
        for r, res in zip(batch, results, strict=True):
            r.future.set_result(res)
