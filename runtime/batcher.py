"""Dynamic batching: concurrent requests that arrive close together run as one engine call.

`Batcher(engine, max_batch=8, max_wait_ms=2.0)` gathers requests (from threads through `run` or
`submit`, from asyncio through `await batcher.arun(...)`) along dim 0 of every input, up to
`max_batch` rows or `max_wait_ms` after the oldest waiting request (sooner where no batch is
running: eager, below), runs the engine once, and hands each caller its rows of every output.

Two threads, `pipeline` lanes (batches in flight, default 2): the gathering thread takes a free
lane, gathers a batch and starts it there; the delivering thread waits for each started batch in
start order and hands out its results, then frees its lane. On a CUDA engine a lane is a set of
execution contexts (one per bucket, each with its own arena, stream and CUDA graph) and pinned
staging buffers: starting a batch stacks it into the staging rows and queues one host-to-device
copy per input, the graph replay and the output copies without waiting, so one batch's copies and
run overlap the gathering of the next and the delivery of the one before. On any other engine a
lane runs `engine.run` on the gathering thread; delivery still overlaps the next batch.

Which batch sizes an engine accepts is asked in one place, `accepted_batch_sizes(engine)`: an
engine with a `batch_sizes()` method (a range, once engines carry optimization profiles) is run
at the size of the gathered batch; today's fixed-shape engines accept only the batch they were
built for, so a partial batch is padded up to it with copies of its last row (real data, so no
NaN or uninitialized path runs) and the pad rows' outputs are dropped.

When a batch closes, two modes (`eager`, see Batcher.__init__):
- eager (the default): a batch closes at max_batch rows, or as soon as no batch is running (the
  engine would otherwise stand idle), or at max_wait after its oldest request while another batch
  runs; so max_wait is the most a request waits for company, and a lone request runs at once.
- hold (`eager=False`): a partial batch is held for max_wait even when nothing runs, for callers
  who want full batches (e.g. the most throughput at a fixed arrival pattern).
Eager is the default because it measured better on every figure: BERT-base on the H200, 32 client
threads of batch-1 requests, max_batch 32, max_wait 2 ms (docs/results/h200_batcher_2026-12-01_1800.md):
10,407 req/s eager against 7,926 held (5.47x and 4.05x unbatched), p50 3.01 against 3.98 ms, p99
5.08 against 5.21 ms; with one batch in flight 5.04x against 4.42x. Triton Inference Server's
dynamic batcher likewise runs what is queued as soon as the model is free unless a queue delay is
configured. A batch's run() callers are woken as a chain, each waking the next as it returns (see
Batcher._wake).

Errors reach the caller whose request caused them: a request with a wrong name, dtype or shape
fails alone in `submit`, before it joins a batch; an engine failure fails every request of that
batch and no other. `close()` (or leaving a `with` block) runs every pending request first.
numpy + stdlib only; cupy arrays pass through for CUDA engines.
"""

from __future__ import annotations

import logging
import queue
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


class _Request:
    """One request: a Future for submit() (and asyncio), or for run() a plain lock that the caller
    blocks on (a Future costs a Condition and an RLock per request; a lock is the cheapest wait).
    `host`: every input is a numpy array (stacked into a staging buffer by one concatenate).
    `next`: the batch's next run() request, which this one's caller wakes once woken itself (see
    Batcher._deliver); `gone`: its caller gave up waiting (a timeout), so the chain skips it."""

    __slots__ = ("feeds", "rows", "arrived", "future", "lock", "result", "error", "host", "next", "gone")

    def __init__(
        self, feeds: dict[str, Any], rows: int, arrived: float, future: bool = True, host: bool = False
    ) -> None:
        self.feeds, self.rows, self.arrived, self.host = feeds, rows, arrived, host
        self.result: dict[str, Any] | None = None
        self.error: BaseException | None = None
        self.next: _Request | None = None
        self.gone = False
        if future:
            self.future: Future | None = Future()
            self.lock: Any = None
        else:
            self.future = None
            self.lock = lock = threading.Lock()
            lock.acquire()  # released once the result or error is in


@dataclass
class _InFlight:
    """A batch started on a lane: its requests, rows, the size it ran at and each request's rows of
    the (maybe still queued) outputs; `error` where starting it failed."""

    batch: list[_Request]
    rows: int
    size: int
    lane: Any
    results: list[dict[str, Any]] = field(default_factory=list)  # per request, its rows of every output
    error: BaseException | None = None
    token: Any = None
    started: float = 0.0  # perf_counter when its work was queued


def _cut(batch: list[_Request], outs: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Each request's rows of every output, in batch order (views, no copies)."""
    items = list(outs.items())
    results, s = [], 0
    for r in batch:
        e = s + r.rows
        results.append({k: v[s:e] for k, v in items})
        s = e
    return results


class _HostLane:
    """Runs a batch with the engine's own engine.run (synchronous): the CPU target, or any engine
    without execution contexts. Delivery still overlaps the next batch's run."""

    def __init__(self, batcher: Batcher) -> None:
        self.b = batcher

    def start(self, batch: list[_Request], rows: int, size: int | None = None) -> tuple[int, dict[str, Any], Any]:
        size = size or run_size(rows, self.b.sizes)
        feeds = {name: stack_rows([r.feeds[name] for r in batch], size) for name in self.b._specs}
        return size, self.b.engine.run(feeds), None

    measures = False  # engine.run picks its own padding: nothing for _choose_size to learn

    def finish(self, token: Any) -> None:
        return None


class _ContextLane:
    """One CUDA execution context per run size (executor.create_context(): its own arena, stream
    and CUDA graph), with host staging buffers (pinned where cupy can allocate them) that a batch
    is stacked into: one host-to-device copy per input per batch, queued with the graph replay and
    the output copies without waiting; finish() waits for that context's stream. Two lanes let one
    batch's copies and run overlap the gathering of the next and the delivery of the previous."""

    def __init__(self, batcher: Batcher, index: int) -> None:
        self.b, self.index = batcher, index
        self._contexts: dict[int, Any] = {}  # run size -> context
        self._staging: dict[str, np.ndarray] = {}
        top = max(batcher.sizes)
        for s in batcher.engine.inputs:
            self._staging[s.name] = _host_buffer((top, *[int(d) for d in s.shape[1:]]), np.dtype(s.dtype))

    def context(self, size: int) -> Any:
        ctx = self._contexts.get(size)
        if ctx is None:
            ctx = self._contexts[size] = self.b._executor_for(size).create_context()
        return ctx

    def start(self, batch: list[_Request], rows: int, size: int | None = None) -> tuple[int, dict[str, Any], Any]:
        size = size or self.b._choose_size(rows)
        if size < 0:  # a bucket this lane's stacking does not fit (see Batcher._bucket_size)
            return self.b._host.start(batch, rows)
        ctx = self.context(size)
        feeds: dict[str, Any] = {}
        host = all(r.host for r in batch)  # known from submit: no per-input type scan here
        for name in self.b._specs:
            pieces = [r.feeds[name] for r in batch]
            if host or all(type(p) is np.ndarray for p in pieces):
                buf = self._staging[name][:size]
                if len(pieces) == 1:
                    buf[:rows] = pieces[0]
                else:
                    np.concatenate(pieces, axis=0, out=buf[:rows])
                if rows < size:
                    buf[rows:] = buf[rows - 1]  # pad rows: copies of the last real row
                feeds[name] = buf
            else:  # device arrays in: stacked on the device, one device-to-device copy
                feeds[name] = stack_rows(pieces, size)
        return size, ctx.run(feeds, sync=False), ctx

    measures = True

    def finish(self, ctx: Any) -> None:
        if ctx is not None:  # None: run by engine.run, which waited already
            ctx.stream.synchronize()  # releases the GIL while the GPU works


def _host_buffer(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """A host array in page-locked memory (host-to-device copies from it are truly asynchronous),
    or ordinary memory where cupy has none to give (logged once)."""
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    cupy = sys.modules.get("cupy")
    try:
        mem = cupy.cuda.alloc_pinned_memory(max(nbytes, 1))  # type: ignore[union-attr]
    except Exception as e:  # noqa: BLE001  (no cupy or no pinned memory: pageable staging instead)
        if not _PINNED_LOGGED:
            log.info("Batcher staging buffers in pageable memory (no pinned memory: %s)", e)
            _PINNED_LOGGED.append(True)
        return np.empty(shape, dtype=dtype)
    return np.frombuffer(mem, dtype=dtype, count=nbytes // dtype.itemsize).reshape(shape)


_PINNED_LOGGED: list[bool] = []


def _uses_contexts(engine: Any) -> bool:
    """Whether batches run on execution contexts of their own (a CUDA engine's executor)."""
    ex = getattr(engine, "executor", None)
    return getattr(engine, "target", None) == "cuda" and callable(getattr(ex, "create_context", None))


# A larger bucket replaces a batch's own only when measured this much faster (no flip-flopping on
# noise); measured times are averaged with this weight for the newest run.
COST_MARGIN = 0.95
COST_EMA = 0.2


def _batch_padded(profile: Any, first_input: str) -> bool:
    """Whether the profile pads its batch dim (dim 0 of the first input): the compiler proved the
    rows independent. A profile-less stand-in (tests) counts as padded."""
    dims = getattr(profile, "dims", None)
    if dims is None:
        return True
    g = next((g for g in dims if (first_input, 0) in [tuple(p) for p in g.positions]), None)
    return bool(g is not None and g.padded)


class _Shape:
    __slots__ = ("shape",)

    def __init__(self, shape: tuple[int, ...]) -> None:
        self.shape = shape


class Batcher:
    """Gathers concurrent requests into batches for one engine; see the module docstring."""

    def __init__(
        self,
        engine: Any,
        max_batch: int | None = None,
        max_wait_ms: float = 2.0,
        pipeline: int = 2,
        warm: Mapping[str, Any] | None = None,
        eager: bool = True,
    ) -> None:
        """`warm`: a sample request; on a CUDA engine every lane then makes its context of every
        bucket up to max_batch here and runs it (the sample's first row repeated), timing the
        second run, so no context, graph capture or first measurement happens while serving.

        `eager` (default True): a batch also closes, before max_batch rows or max_wait, as soon as
        no batch is running (the engine would otherwise sit idle); max_wait stays the bound a request
        waits while another batch runs. `eager=False` holds a partial batch for max_wait even when
        nothing runs (full batches, at the cost of latency and, measured, of throughput too). With
        as many client threads as max_batch, each waiting for its answer before it sends again, the
        held batch is always full, so only one batch is ever in flight: every client's turnaround
        (thread wake-up, GIL hand-over, the next request) is time the engine stands idle. Eager
        batches split the clients into groups whose turnaround runs while the other group's batch
        runs: 5.47x unbatched against 4.05x held on BERT-base (H200, 32 clients, max_batch 32,
        max_wait 2 ms; docs/results/h200_batcher_2026-12-01_1800.md), p50 and p99 lower too."""
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
        if pipeline < 1:
            raise EngineError(f"pipeline must be at least 1 (batches in flight), got {pipeline}")
        outs = [s for s in engine.outputs if not s.shape or int(s.shape[0]) != top]
        if outs and not callable(getattr(engine, "batch_sizes", None)):
            o = outs[0]
            raise EngineError(
                f"cannot batch this engine: output '{o.name}' {list(o.shape)} has no batch dim 0 of {top}"
            )
        self.max_batch = max_batch
        self.max_wait = max_wait_ms / 1000.0
        self.pipeline = pipeline
        self.eager = bool(eager)
        self._running = 0  # batches started and not yet finished (eager: close one when 0)
        self.stats = BatcherStats()
        self._specs = {s.name: s for s in engine.inputs}
        # per input (name, dtype, shape after dim 0, rank): submit's fast check compares these only
        self._fast = [(s.name, np.dtype(s.dtype), tuple(int(d) for d in s.shape[1:]), len(s.shape))
                      for s in engine.inputs]  # fmt: skip
        # the same for the common batch-1 request: one tuple comparison of its whole shape
        self._fast1 = [(name, dt, (1, *tail)) for name, dt, tail, _r in self._fast]
        self._n_inputs = len(self._fast)
        self._bucket_sizes: dict[int, int] = {}
        # whether a batch may run padded past its own bucket: False once a profile's batch dim is
        # not one the compiler proved safe to pad (its rows might then mix)
        self._pad_free = True
        self._cost: dict[int, float] = {}  # batch size -> measured seconds per run (moving average)
        self._last_finish = 0.0
        self._queue: deque[_Request] = deque()
        self._queued_rows = 0
        # A plain lock under the condition: a caller takes it with one C call (`with self._mu`),
        # where Condition.__enter__/__exit__ are Python frames around an RLock; only the worker
        # waits on the condition, and a caller notifies it (two per batch, not one per request).
        self._mu = threading.Lock()
        self._cond = threading.Condition(self._mu)
        self._chain_mu = threading.Lock()  # orders a wake-up in the chain against a caller's timeout
        self._closed = False
        lanes = [_ContextLane(self, i) for i in range(pipeline)] if _uses_contexts(engine) else [
            _HostLane(self) for _ in range(pipeline)
        ]  # fmt: skip
        self._host = _HostLane(self)  # batches a context lane cannot stack (logged) run through it
        self._free: queue.SimpleQueue = queue.SimpleQueue()
        if warm is not None:
            self._warm(lanes, warm)
        for lane in lanes:
            self._free.put(lane)
        self._started: queue.SimpleQueue = queue.SimpleQueue()  # _InFlight in start order; None: stop
        self._worker = threading.Thread(target=self._loop, name="graphc-batcher", daemon=True)
        self._deliverer = threading.Thread(target=self._deliver_loop, name="graphc-batcher-out", daemon=True)
        self._worker.start()
        self._deliverer.start()

    # ---- callers -------------------------------------------------------------------------------

    def _check(self, feeds: Mapping[str, Any]) -> tuple[dict[str, Any], int]:
        """The request's arrays and its rows, or a one-line EngineInputError for this caller alone.
        numpy arrays of the right dtype and trailing shape take a fast path of a few comparisons
        (batch-1 requests one shape comparison an input)."""
        if len(feeds) == self._n_inputs:
            out1: dict[str, Any] = {}
            for name, dtype, one in self._fast1:
                x = feeds.get(name)
                if type(x) is not np.ndarray or x.shape != one or x.dtype != dtype:
                    break
                out1[name] = x
            else:
                return out1, 1
            out: dict[str, Any] = {}
            rows = -1
            for name, dtype, tail, rank in self._fast:
                x = feeds.get(name)
                if type(x) is not np.ndarray or x.dtype != dtype or len(x.shape) != rank or x.shape[1:] != tail:
                    break
                n = x.shape[0]
                if rows != n and rows != -1:
                    break
                rows = n
                out[name] = x
            else:
                if 1 <= rows <= self.max_batch:
                    return out, rows
        return self._check_slow(feeds)

    def _check_slow(self, feeds: Mapping[str, Any]) -> tuple[dict[str, Any], int]:
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
        req = self._enqueue(feeds, True)
        assert req.future is not None
        return req.future

    def _enqueue(self, feeds: Mapping[str, Any], future: bool) -> _Request:
        checked, rows = self._check(feeds)
        host = True
        for x in checked.values():
            if type(x) is not np.ndarray:
                host = False
                break
        req = _Request(checked, rows, time.monotonic(), future, host)
        with self._mu:
            if self._closed:
                raise EngineError("the batcher is closed")
            q = self._queue
            q.append(req)
            queued = self._queued_rows = self._queued_rows + rows
            # the worker waits only for a first request or for a full batch: wake it for those
            if len(q) == 1 or queued >= self.max_batch:
                self._cond.notify()
        return req

    def run(self, feeds: Mapping[str, Any], timeout: float | None = None) -> dict[str, Any]:
        """Submit one request and wait for its outputs (from any thread); TimeoutError after
        `timeout` seconds (the request still runs, its result is dropped)."""
        req = self._enqueue(feeds, False)
        lock = req.lock
        if not lock.acquire(timeout=-1 if timeout is None else timeout):
            with self._chain_mu:  # woken just now, or gone: the chain then skips this request
                woken = lock.acquire(False)
                req.gone = not woken
            if not woken:
                raise TimeoutError(f"no result within {timeout} s")
        if req.next is not None:
            self._pass_on(req.next)  # the next caller of this batch wakes while this one returns
        if req.error is not None:
            raise req.error
        assert req.result is not None
        return req.result

    def __call__(self, **feeds: Any) -> dict[str, Any]:
        return self.run(feeds)

    async def arun(self, feeds: Mapping[str, Any]) -> dict[str, Any]:
        """`await batcher.arun(feeds)`: the asyncio form of run; the event loop is never blocked."""
        import asyncio  # here, so that loading an engine does not import asyncio

        return await asyncio.wrap_future(self.submit(feeds))

    def close(self) -> None:
        """Run every pending request (and those in flight), then stop the worker threads. Later
        submits raise EngineError."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        if threading.current_thread() in (self._worker, self._deliverer):
            return  # from a done-callback: the threads finish the drain by themselves
        self._worker.join()
        self._deliverer.join()

    def __enter__(self) -> Batcher:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ---- the engine side -----------------------------------------------------------------------

    def _bucket_size(self, rows: int) -> int:
        """The batch a context runs `rows` rows at: for an engine with profiles, its bucket's batch
        (so the context's plan takes the stacked inputs as they are), else run_size."""
        size = self._bucket_sizes.get(rows)
        if size is None:
            size = run_size(rows, self.sizes)
            dyn = getattr(self.engine, "dynamic", None)
            if dyn is not None:
                shapes = {n: _Shape((size, *tail)) for n, _dt, tail, _r in self._fast}
                profile, bucket, _s = dyn.resolve(self.engine, shapes)
                if not _batch_padded(profile, self._fast[0][0]):
                    self._pad_free = False  # rows are not proven independent: no larger bucket
                want = {n: [size, *tail] for n, _dt, tail, _r in self._fast}
                got = {n: list(bucket.shapes[n]) for n in want}
                if any(got[n][1:] != want[n][1:] for n in want):
                    # the bucket pads more than the batch dim: engine.run pads such batches itself
                    log.info(
                        "Batcher: batch %d runs through engine.run (its bucket %s pads more than dim 0)", size, got
                    )
                    size = -1
                else:
                    size = got[self._fast[0][0]][0]
            self._bucket_sizes[rows] = size
        return size

    def _choose_size(self, rows: int) -> int:
        """The batch to run `rows` rows at: their bucket's, unless a larger bucket has been measured
        faster (an engine tuned at opt can run its max bucket in less time than a partial one:
        BERT-base on the H200, bucket 13 2.11 ms and bucket 32 1.96 ms); an unmeasured bucket is
        run as it is, which measures it."""
        exact = self._bucket_size(rows)
        own = self._cost.get(exact)
        if own is None or not self._pad_free:
            return exact
        best, best_cost = exact, own * COST_MARGIN
        for size, cost in self._cost.items():
            if size > exact and cost < best_cost:
                best, best_cost = size, cost
        return best

    def _measure(self, job: _InFlight) -> None:
        """Update the run time of the job's batch size: from when it was queued, or when the batch
        before it finished (the GPU runs them in order), to when its stream was done."""
        now = time.perf_counter()
        busy = now - max(job.started, self._last_finish)
        self._last_finish = now
        old = self._cost.get(job.size)
        self._cost[job.size] = busy if old is None else old + COST_EMA * (busy - old)

    def _warm(self, lanes: list[Any], sample: Mapping[str, Any]) -> None:
        checked, _rows = self._check(sample)
        req = _Request({k: v[:1] for k, v in checked.items()}, 1, 0.0, future=False)
        sizes = sorted({self._bucket_size(n) for n in range(1, self.max_batch + 1)} - {-1})
        for lane in lanes:
            if not lane.measures:
                continue  # engine.run makes what it needs on its first call
            for size in sizes:
                for timed in (False, True):
                    t0 = time.perf_counter()
                    _size, _outs, token = lane.start([req], 1, size)
                    lane.finish(token)
                    if timed:
                        took = time.perf_counter() - t0
                        self._cost[size] = min(took, self._cost.get(size, took))
        if self._cost:
            log.info(
                "Batcher warm: %s", ", ".join(f"batch {n} {t * 1000:.3f} ms" for n, t in sorted(self._cost.items()))
            )

    def _executor_for(self, size: int) -> Any:
        """The executor whose plan runs batch `size` (a bucket's engine for an engine with profiles)."""
        dyn = getattr(self.engine, "dynamic", None)
        if dyn is None:
            return self.engine.executor
        shapes = {n: _Shape((size, *tail)) for n, _dt, tail, _r in self._fast}
        _p, bucket, _s = dyn.resolve(self.engine, shapes)
        return dyn.bucket_engine(self.engine, bucket).executor

    # ---- the worker threads --------------------------------------------------------------------

    def _take(self) -> list[_Request] | None:
        """Wait (on the condition, never spinning) for a batch: max_batch rows, or max_wait after
        the oldest request, or (eager) no batch running, or close(). None once closed and drained."""
        with self._cond:
            while not self._queue:
                if self._closed:
                    return None
                self._cond.wait()
            deadline = self._queue[0].arrived + self.max_wait
            while self._queued_rows < self.max_batch and not self._closed:
                if self.eager and not self._running:
                    break  # nothing runs: waiting for company would only leave the engine idle
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
        """Gather a batch while a lane is free, start it there (queued, not waited for) and hand it
        to the delivering thread; so gathering, running and delivering overlap."""
        try:
            while True:
                lane = self._free.get()  # a batch gathers only once it has somewhere to run
                batch = self._take()
                if batch is None:
                    self._free.put(lane)
                    break
                # cancelled Futures drop out; run()'s requests (no Future) cannot be cancelled
                live = [r for r in batch if r.future is None or r.future.set_running_or_notify_cancel()]
                if not live:
                    self._free.put(lane)
                    continue
                rows = sum(r.rows for r in live)
                job = _InFlight(live, rows, rows, lane)
                try:
                    job.started = time.perf_counter()
                    job.size, outs, job.token = lane.start(live, rows)
                    # each caller's rows, cut while the GPU runs (views: the data need not be there yet)
                    job.results = _cut(live, outs)
                except Exception as e:  # noqa: BLE001  (the batch's callers get it, in _deliver)
                    job.error = e
                if job.error is None:
                    with self._mu:
                        self._running += 1
                self._started.put(job)
        finally:
            self._started.put(None)

    def _deliver_loop(self) -> None:
        while (job := self._started.get()) is not None:
            try:
                self._deliver(job)
            finally:
                self._free.put(job.lane)

    def _pass_on(self, req: _Request | None) -> None:
        """Wake the first caller still waiting from `req` on along its batch's chain."""
        while req is not None:
            with self._chain_mu:
                if not req.gone:
                    req.lock.release()
                    return
            req = req.next

    def _wake(self, batch: list[_Request]) -> None:
        """Hand the batch's run() callers their result or error (already set): the first is woken
        here and each wakes the next as it returns (run()), so the callers wake one after another,
        each when the one before is about to need the GIL no more. Woken all at once (32 lock
        releases here) they would all contend for the GIL: each sleeps a second time, on the GIL,
        and on a 2-core machine 32 callers took 0.62-0.88 ms to get through, against 0.36-0.52 ms
        chained (tools/bench_batcher_standin.py, docs/dynamic_shapes.md)."""
        first = prev = None
        for r in batch:
            if r.future is None:
                if prev is None:
                    first = r
                else:
                    prev.next = r
                prev = r
        self._pass_on(first)

    def _finished(self) -> None:
        """A started batch is done (or failed) on the engine; an eager worker may close the next."""
        with self._mu:
            self._running -= 1
            if self.eager and not self._running and self._queue:
                self._cond.notify()

    def _deliver(self, job: _InFlight) -> None:
        batch = job.batch
        try:
            if job.error is not None:
                raise job.error
            try:
                job.lane.finish(job.token)
            finally:
                self._finished()
            if job.lane.measures and job.token is not None:
                self._measure(job)
            results = job.results
        except Exception as e:  # noqa: BLE001  (every caller of the batch gets the engine's error)
            log.debug("batch of %d requests failed: %s", len(batch), e)
            self.stats.failed_batches += 1
            for r in batch:
                if r.future is None:
                    r.error = e
                else:
                    r.future.set_exception(e)
            self._wake(batch)
            return
        st = self.stats
        st.requests += len(batch)
        st.rows += job.rows
        st.batches += 1
        st.padded_rows += job.size - job.rows
        for r, res in zip(batch, results, strict=True):
            if r.future is None:
                r.result = res
            else:
                r.future.set_result(res)
        self._wake(batch)
