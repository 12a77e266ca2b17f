"""The auto-tuner on the GPU: candidate kernels per (family, template, shapes, dtypes, epilogue, GPU),
timed, the fastest correct one kept; decisions persist in SQLite; the tuned engine is kept only when
its whole graph replays faster than the untuned one (validate_on_gpu). The search itself, its budget
and the whole-graph rule are in tune_search.py (tested without a GPU).

Timing follows DESIGN: CUDA events, warm-up, median of many runs, inputs rotated between several
buffer sets (or L2 flushed when they are large), so repeated runs do not measure the cache. Each
candidate's output is checked against the default's before it is accepted; a candidate that fails to
compile, launch or match is treated as infinitely slow. The default is what the untuned engine runs
on this GPU (on sm_90 its Hopper GEMMs): a step the tuner leaves alone keeps exactly that.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from graphc.codegen.kernel import StepContext, family_for
from graphc.codegen.lower import LoweredPlan
from graphc.ir.attrs import attrs_to_json

log = logging.getLogger(__name__)

# 2: a record's default is the untuned engine's launches on its GPU (Hopper GEMMs on sm_90), not mma.sync's
SCHEMA_VERSION = 2
FAST_CANDIDATES = 6


@dataclass(frozen=True)
class TuningKey:
    family: str
    template: str  # hash of the family's template source
    signature: str  # dtypes, shapes and attrs (epilogue included) of the step
    gpu: str
    sm: str
    driver: str


def step_signature(ctx: StepContext) -> str:
    step = ctx.step
    parts = {
        "op": f"{step.domain}.{step.op}",
        "attrs": attrs_to_json(ctx.attrs),  # the attrs' stable JSON form, as the records were keyed
        "inputs": [None if n is None else (ctx.tensors[n].dtype, ctx.tensors[n].shape) for n in step.inputs],
        "outputs": [(ctx.tensors[n].dtype, ctx.tensors[n].shape) for n in step.outputs],
        "precision": ctx.precision,
        "tf32": ctx.allow_tf32,
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def template_hash(family: str) -> str:
    """A hash of the family's templates (templates/<family>*), the headers they include (the
    tensor-core kernels share mma.cuh) and common.cuh: a tuning record is reused only while none
    of them has changed."""
    from graphc.codegen.kernel import TEMPLATE_DIR, template_sources

    own = sorted(p.name for p in TEMPLATE_DIR.glob(f"{family}*"))
    h = hashlib.sha256()
    for name in [*template_sources(own), "common.cuh"]:
        h.update((TEMPLATE_DIR / name).read_bytes())
    return h.hexdigest()[:16]


class TuningCache:
    """SQLite store of tuning decisions (parameterized queries only; a schema version)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(str(self.path))
        self.db.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT)")
        row = self.db.execute("SELECT value FROM meta WHERE key = ?", ("schema_version",)).fetchone()
        if row is not None and int(row[0]) != SCHEMA_VERSION:
            log.warning("tuning cache %s has schema %s, expected %s: starting afresh", path, row[0], SCHEMA_VERSION)
            self.db.execute("DROP TABLE IF EXISTS records")
        self.db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", ("schema_version", SCHEMA_VERSION))
        self.db.execute(
            "CREATE TABLE IF NOT EXISTS records (family TEXT, template TEXT, signature TEXT, gpu TEXT, sm TEXT, "
            "driver TEXT, params TEXT, time_ms REAL, candidates INTEGER, created REAL, "
            "PRIMARY KEY (family, template, signature, gpu, sm, driver))"
        )
        self.db.commit()

    def get(self, key: TuningKey) -> tuple[dict[str, Any], float] | None:
        row = self.db.execute(
            "SELECT params, time_ms FROM records WHERE family = ? AND template = ? AND signature = ? AND gpu = ? "
            "AND sm = ? AND driver = ?",
            (key.family, key.template, key.signature, key.gpu, key.sm, key.driver),
        ).fetchone()
        return None if row is None else (json.loads(row[0]), float(row[1]))

    def put(self, key: TuningKey, params: dict[str, Any], time_ms: float, candidates: int) -> None:
        self.db.execute(
            "INSERT OR REPLACE INTO records VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                key.family,
                key.template,
                key.signature,
                key.gpu,
                key.sm,
                key.driver,
                json.dumps(params, sort_keys=True),
                float(time_ms),
                int(candidates),
                time.time(),
            ),
        )
        self.db.commit()

    def close(self) -> None:
        self.db.close()


def default_tuning_cache() -> Path:
    from graphc.codegen.nvrtc import default_cache_dir

    return default_cache_dir().parent / "tuning.sqlite"


class StepBench:
    """Runs one step's kernels on buffers of its own, with random inputs (a few rotating sets)."""

    def __init__(self, ctx: StepContext, device: int = 0, sets: int = 3):
        import cupy

        self.cupy = cupy
        self.ctx = ctx
        rng = np.random.default_rng(0)
        step = ctx.step
        total = sum(ctx.tensors[n].nbytes for n in step.inputs if n is not None)
        self.sets = sets if total < (64 << 20) else 1
        self.flush = cupy.empty(256 << 20, dtype=cupy.uint8) if self.sets == 1 else None
        self.inputs = []
        for _ in range(self.sets):
            bufs = {}
            for n in step.inputs:
                if n is None or n in bufs:
                    continue
                t = ctx.tensors[n]
                if t.kind == "weight" and n in ctx.weights:
                    bufs[n] = cupy.asarray(np.ascontiguousarray(ctx.weights[n]))
                    continue
                dt = np.dtype(t.dtype) if t.dtype != "bfloat16" else np.dtype("uint16")
                if dt.kind in "iub":
                    a = rng.integers(0, 2, size=t.shape).astype(dt)
                elif t.dtype == "bfloat16":
                    import ml_dtypes

                    a = rng.standard_normal(t.shape).astype(ml_dtypes.bfloat16).view(np.uint16)
                else:
                    a = rng.standard_normal(t.shape).astype(dt)
                bufs[n] = cupy.asarray(a)
            self.inputs.append(bufs)
        self.outputs = {n: cupy.empty(max(ctx.tensors[n].nbytes, 1), dtype=cupy.uint8) for n in step.outputs}
        self.sms = int(cupy.cuda.runtime.getDeviceProperties(device)["multiProcessorCount"])

    def run(self, launches, functions, workspace, which: int = 0) -> None:
        bufs = self.inputs[which % self.sets]
        for ln in launches:
            args = []
            for a in ln.args:
                if a == "@workspace":
                    args.append(workspace)
                elif a in bufs:
                    args.append(bufs[a])
                else:
                    args.append(self.outputs[a])
            grid = tuple(ln.grid)
            if ln.params.get("persistent"):  # a CTA per SM at most, as the engine launches it
                grid = (min(grid[0], self.sms), *grid[1:])
            functions[ln.digest](grid, (*ln.block,), tuple(args), shared_mem=ln.shared_bytes)

    def time(self, launches, functions, workspace, warmup: int = 3, reps: int = 15, inner: int = 10) -> float:
        """Median over `reps` of the mean of `inner` back-to-back runs: a step of a few microseconds
        is below what one pair of events resolves reliably. With the L2 flush (large inputs) every
        run is timed alone, so each starts cold."""
        cupy = self.cupy
        inner = 1 if self.flush is not None else inner
        for i in range(warmup):
            self.run(launches, functions, workspace, i)
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        times = []
        for i in range(reps):
            if self.flush is not None:
                self.flush.fill(i & 0xFF)
            start.record()
            for j in range(inner):
                self.run(launches, functions, workspace, i * inner + j)
            end.record()
            end.synchronize()
            times.append(cupy.cuda.get_elapsed_time(start, end) / inner)
        return float(np.median(times))

    def output_bytes(self) -> dict[str, np.ndarray]:
        return {n: self.cupy.asnumpy(b) for n, b in self.outputs.items()}


@dataclass(frozen=True)
class DeviceInfo:
    """What a tuning record is valid for beside the kernel itself: the GPU, its SM and the driver."""

    gpu: str
    sm: str
    driver: str

    @classmethod
    def of(cls, device: int = 0) -> DeviceInfo:
        import cupy

        props = cupy.cuda.runtime.getDeviceProperties(device)
        gpu = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
        sm = cupy.cuda.Device(device).compute_capability
        return cls(gpu, sm, str(cupy.cuda.runtime.driverGetVersion()))


def tuning_key(ctx: StepContext, family: str, dev: DeviceInfo) -> TuningKey:
    """The cache key of one step's decision: family, template hash, the step's dtypes, shapes and
    attrs (step_signature), and the GPU, SM and driver."""
    return TuningKey(family, template_hash(family), step_signature(ctx), dev.gpu, dev.sm, dev.driver)


class _LazyBench:
    """The StepBench of one task, made on first use in the thread that times (the one that owns the
    GPU), never in the background thread that renders and compiles candidates."""

    def __init__(self, ctx: StepContext, device: int):
        self.ctx, self.device, self.bench = ctx, device, None

    def get(self) -> StepBench:
        if self.bench is None:
            self.bench = StepBench(self.ctx, self.device)
        return self.bench


class KernelChoice:
    """One candidate of a step (Inductor's ChoiceCaller): its launches and their sources, NVRTC jobs,
    loading, one checked run and a benchmark. `params` None: the launches an untuned engine runs."""

    def __init__(
        self,
        params: dict[str, Any] | None,
        launches: list[Any],
        sources: dict[str, tuple[str, str, str]],  # digest -> (function name, CUDA source, arch)
        workspace_bytes: int,
        bench: _LazyBench,
        workspace: Any,
    ):
        self.params, self.launches, self.sources = params, launches, sources
        self.workspace_bytes, self.bench, self.workspace = workspace_bytes, bench, workspace
        self.functions: dict[str, Any] = {}
        self._modules: list[Any] = []

    @classmethod
    def from_sources(cls, params: dict[str, Any], made: list[Any], arch: str, bench: _LazyBench, workspace: Any):
        from graphc.runtime.plan import Launch

        launches = [
            Launch(s.name, s.digest, list(s.grid), list(s.block), list(s.args), s.shared_bytes, s.family,
                   dict(s.params))
            for s in made
        ]  # fmt: skip
        sources = {s.digest: (s.name, s.source, s.params.get("requires_arch") or arch) for s in made}
        return cls(params, launches, sources, max((s.workspace_bytes for s in made), default=0), bench, workspace)

    @classmethod
    def untuned(cls, kernels: Any, step: str, arch: str, bench: _LazyBench, workspace: Any) -> KernelChoice:
        """The step's launches in the untuned engine for `arch` (the Hopper GEMMs on sm_90 included):
        the default that every candidate must beat is what would run without tuning."""
        sk = kernels.step_kernels(arch)[step]
        sources = {
            ln.digest: (kernels.names[ln.digest], kernels.sources[ln.digest], kernels.requires.get(ln.digest) or arch)
            for ln in sk.launches
        }
        return cls(None, list(sk.launches), sources, sk.workspace_bytes, bench, workspace)

    def compile_jobs(self) -> list[Any]:
        from graphc.codegen.nvrtc import CompileJob

        return [CompileJob(name, src, arch) for name, src, arch in self.sources.values()]

    def load(self, cubins: list[bytes]) -> None:
        import cupy

        from graphc.runtime.cuda import SHARED_OPT_IN_BYTES, allow_large_shared_memory
        from graphc.runtime.tensormap import is_tmap_arg

        if self.workspace_bytes > self.workspace.nbytes:
            raise RuntimeError(f"needs {self.workspace_bytes} bytes of workspace")
        if any(is_tmap_arg(a) for ln in self.launches for a in ln.args):
            # the bench has no tensor maps for its own buffers: such a kernel is not timed alone
            raise RuntimeError("launches with tensor maps (TMA) are not timed on their own")
        for (digest, (name, _src, _arch)), cubin in zip(self.sources.items(), cubins, strict=True):
            mod = cupy.cuda.function.Module()
            mod.load(cubin)
            self._modules.append(mod)
            self.functions[digest] = mod.get_function(name)
        for ln in self.launches:
            if ln.shared_bytes > SHARED_OPT_IN_BYTES:
                allow_large_shared_memory(self.functions[ln.digest], ln.shared_bytes)

    def outputs(self) -> dict[str, np.ndarray]:
        bench = self.bench.get()
        bench.run(self.launches, self.functions, self.workspace, 0)
        return bench.output_bytes()

    def benchmark(self) -> float:
        return self.bench.get().time(self.launches, self.functions, self.workspace)


@dataclass
class TuneResult:
    choices: dict[str, dict[str, Any]]  # step name -> template parameters, only where not the default
    report: dict[str, Any]


def tune_plan(
    plan: LoweredPlan,
    weights: dict[str, np.ndarray],
    *,
    mode: str,
    precision: str,
    allow_tf32: bool,
    cache_path: str | Path | None = None,
    device: int = 0,
    budget: Any = None,
    progress: bool = False,
    cache_dir: str | Path | None = None,
) -> TuneResult:
    """Choose template parameters for the steps whose family declares a search space, within
    `budget` (a tune_search.Budget; default the mode's). Each distinct step (cache key) is tuned once,
    the most repeated first; decisions persist in the SQLite cache. The result is not yet proved on
    the whole graph: validate_on_gpu does that."""
    import cupy

    from graphc.codegen.build import content_named, generate_for_archs
    from graphc.codegen.tune_search import Budget, Task, budget_seconds, search
    from graphc.runtime.tensormap import is_tmap_arg

    if mode == "off":
        return TuneResult({}, {})
    budget = budget or Budget(budget_seconds(mode))
    dev = DeviceInfo.of(device)
    arch = f"sm_{dev.sm}"
    cache = TuningCache(cache_path or default_tuning_cache())
    # The untuned engine's launches for this GPU: every step's default, Hopper paths included.
    untuned = generate_for_archs(plan, weights, [arch], precision=precision, allow_tf32=allow_tf32)
    workspace = cupy.empty(256 << 20, dtype=cupy.uint8)
    by_key: dict[TuningKey, list[str]] = {}
    contexts: dict[TuningKey, tuple[StepContext, Any, list[dict[str, Any]]]] = {}
    for step in plan.steps:
        if step.alias:
            continue
        ctx = plan.context(step, weights, precision=precision, allow_tf32=allow_tf32)
        fam = family_for(ctx)
        space = fam.search_space(ctx) if fam.search_space is not None else []
        if not space:
            continue
        key = tuning_key(ctx, fam.name, dev)
        by_key.setdefault(key, []).append(step.name)
        contexts.setdefault(key, (ctx, fam, space[:FAST_CANDIDATES] if mode == "fast" else space))
    choices: dict[str, dict[str, Any]] = {}
    hits, tasks = 0, []
    for key, steps in sorted(by_key.items(), key=lambda kv: -len(kv[1])):  # the most repeated first
        hit = cache.get(key)
        if hit is not None:
            hits += 1
            if hit[0]:  # {}: the default won; the step stays as an untuned engine runs it
                choices.update({s: dict(hit[0]) for s in steps})
            continue
        ctx, fam, space = contexts[key]
        default = untuned.step_kernels(arch)[steps[0]].launches
        if any(is_tmap_arg(a) for ln in default for a in ln.args):
            # The bench has no tensor maps over its own buffers, so the default (a TMA GEMM) cannot be
            # timed alone, and no candidate can be proved faster than it: the steps stay untuned.
            log.info("tuning %s: its default uses tensor maps (TMA) and is not timed alone; left untuned", steps[0])
            continue

        def make(ctx=ctx, fam=fam, space=space, first=steps[0]) -> list[Any]:
            bench = _LazyBench(ctx, device)
            out = [KernelChoice.untuned(untuned, first, arch, bench, workspace)]
            for params in space:
                try:
                    # named by content, as the engine names them: a winner's cubin is then the kernel
                    # cache's when the whole-graph check and the final build compile it
                    made = [content_named(k, ctx.kernel_name()) for k in fam.generate(ctx.with_params(params))]
                    out.append(KernelChoice.from_sources(params, made, arch, bench, workspace))
                except Exception as e:  # a candidate that does not render is infinitely slow
                    log.info("tuning %s: candidate %s does not render: %s", first, params, e)
            return out

        tasks.append(Task(key, steps, make, label=f"{steps[0]} ({fam.name}, {len(steps)} step(s))"))

    def record(task: Task, pick: Any) -> None:
        if pick is None:
            return
        cache.put(task.key, pick.params or {}, pick.ms, pick.timed)
        if pick.params:
            choices.update({s: dict(pick.params) for s in task.steps})
        log.info("tuned %s: %s in %.4f ms (default %.4f ms)", task.label, pick.params or "the default", pick.ms,
                 pick.default_ms)  # fmt: skip

    def compile_fn(jobs: list[Any]) -> list[bytes]:
        return compile_in_threads(jobs, cache_dir)

    with _progress_bar(progress, len(tasks), budget) as advance:

        def on_task(task: Task, pick: Any) -> None:
            record(task, pick)
            advance(task.label)

        found = search(tasks, budget=budget, compile_fn=compile_fn, check=_checker(contexts), on_task=on_task)
    cache.close()
    report = {
        "mode": mode,
        "budget_s": round(budget.seconds, 1),
        "search_s": found.seconds,
        "distinct_steps": len(by_key),
        "cache_hits": hits,
        "timed": found.timed_tasks,
        "stopped_by_budget": found.stopped_by_budget,
        "not_reached": found.untouched,
        "changed_steps": len(choices),
    }
    return TuneResult(choices, report)


def compile_in_threads(jobs: list[Any], cache_dir: str | Path | None = None, workers: int | None = None) -> list[bytes]:
    """NVRTC for the tuner's candidates in threads (the compile releases the GIL; NVRTC compiles
    distinct programs concurrently), through the kernel cache. Threads, not nvrtc.compile_all's
    worker processes: this runs beside the thread that times kernels, and forking a process whose
    threads hold CUDA and logging locks is not safe. Identical jobs are compiled once."""
    from concurrent.futures import ThreadPoolExecutor

    from graphc.codegen.nvrtc import compile_all, nvrtc_version

    version = nvrtc_version()
    unique: dict[str, Any] = {}
    for j in jobs:
        unique.setdefault(j.key(version), j)
    keys = list(unique)
    n = max(1, min(len(keys), workers or os.cpu_count() or 1))
    chunks = [keys[i::n] for i in range(n)]  # one chunk per thread: no key is written by two threads
    with ThreadPoolExecutor(max_workers=n, thread_name_prefix="graphc-nvrtc") as pool:
        outs = list(pool.map(lambda ks: compile_all([unique[k] for k in ks], cache_dir=cache_dir, workers=1), chunks))
    by_key = {k: cubin for ks, cubins in zip(chunks, outs, strict=True) for k, cubin in zip(ks, cubins, strict=True)}
    return [by_key[j.key(version)] for j in jobs]


def _checker(contexts: dict[TuningKey, tuple[StepContext, Any, Any]]):
    """An output check for pick_best: outputs compared at the tolerance of the step's dtype (the
    outputs carry their step's names, which say whose context it is)."""
    by_output = {n: ctx for ctx, _f, _s in contexts.values() for n in ctx.step.outputs}

    def check(out: dict[str, np.ndarray], ref: dict[str, np.ndarray]) -> bool:
        ctx = by_output[next(iter(out))]
        return _outputs_match(ctx, out, ref)

    return check


@contextlib.contextmanager
def _progress_bar(show: bool, total: int, budget: Any):
    """A rich progress bar on stderr (transient) when asked; else nothing."""
    if not show or total == 0:
        yield lambda label: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn("  tuning"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.description}"),
        console=Console(stderr=True),
        transient=True,
    ) as bar:
        t = bar.add_task(f"budget {budget.seconds:.0f} s", total=total)

        def advance(label: str) -> None:
            bar.update(t, advance=1, description=f"{max(0.0, budget.left()):.0f} s left · {label[:40]}")

        yield advance


def validate_on_gpu(
    plan: LoweredPlan,
    weights: dict[str, np.ndarray],
    choices: dict[str, dict[str, Any]],
    *,
    precision: str,
    allow_tf32: bool,
    cache_dir: str | Path | None = None,
    device: int = 0,
) -> tuple[dict[str, dict[str, Any]], Any]:
    """The whole-graph check: the untuned and the tuned engine for this GPU, built as the compiler
    builds them, their CUDA graphs replayed interleaved; `choices` kept only when faster by the
    margin (tune_search.validate)."""
    from graphc.codegen.build import compile_kernels, complete_plan, generate_for_archs
    from graphc.codegen.memory import plan_memory
    from graphc.codegen.tune_search import validate
    from graphc.runtime.cuda import CUDAExecutor

    arch = f"sm_{DeviceInfo.of(device).sm}"

    def build(ch: dict[str, dict[str, Any]]) -> Any:
        ks = generate_for_archs(plan, weights, [arch], precision=precision, allow_tf32=allow_tf32, choices=ch)
        final = complete_plan(plan, ks)
        compile_kernels(ks, [arch], cache_dir=cache_dir)
        return CUDAExecutor(final.for_arch(arch), plan_memory(final), weights, ks.cubins[arch], ks.names,
                            device=device, launch_arch=arch)  # fmt: skip

    try:
        return validate(choices, build, graph_replay_ms)
    finally:
        import cupy

        cupy.get_default_memory_pool().free_all_blocks()  # the two engines' arenas and weights


def graph_replay_ms(executors: list[Any], rounds: int = 7, calls: int = 20) -> list[float]:
    """Median GPU time of one replay of each executor's CUDA graph (events around `calls` replays),
    the executors taking turns round by round so that clock and thermal drift fall on all of them."""
    import cupy

    rng = np.random.default_rng(0)
    ctxs = [e.default for e in executors]
    for c in ctxs:
        with cupy.cuda.Device(c.device):
            for name in c.plan.inputs:  # random floats, zero indices: valid for any gather
                view = c.views[name]
                dt = np.dtype(view.dtype)
                host = np.zeros(view.shape, dt)
                if dt.kind == "f" or dt.name == "bfloat16":
                    host = rng.standard_normal(view.shape).astype(dt)
                view.set(host)
            c.run({n: c.views[n] for n in c.plan.inputs}, sync=True)  # captures the graph
    # the launch sequence's own graph: the ordinary call replays an output slot's copy of it
    # (runtime/output_ring.py), and the context's is captured on first use
    return replay_ms([(c.replay_graph(), c.stream, c.device) for c in ctxs], rounds, calls)


def replay_ms(graphs: list[tuple[Any, Any, int]], rounds: int = 7, calls: int = 20) -> list[float]:
    """Median GPU time of one replay of each captured CUDA graph (graph, stream, device): events
    around `calls` replays, the graphs taking turns round by round (graph_replay_ms's timer, also
    for graphs that are not an engine's, as tools/bench_lnfold.py's single launches)."""
    import cupy

    times: list[list[float]] = [[] for _ in graphs]
    for _ in range(rounds):
        for k, (graph, stream, device) in enumerate(graphs):
            with cupy.cuda.Device(device):
                for _ in range(2):  # warm-up after the other graph ran
                    graph.launch(stream=stream)
                start, end = cupy.cuda.Event(), cupy.cuda.Event()
                start.record(stream)
                for _ in range(calls):
                    graph.launch(stream=stream)
                end.record(stream)
                end.synchronize()
                times[k].append(cupy.cuda.get_elapsed_time(start, end) / calls)
    return [float(np.median(t)) for t in times]


def _outputs_match(ctx: StepContext, out: dict[str, np.ndarray], ref: dict[str, np.ndarray]) -> bool:
    from graphc.runtime.cpu import numpy_dtype

    for name, a in out.items():
        t = ctx.tensors[name]
        dt = numpy_dtype(t.dtype)
        x = a.view(dt).astype(np.float64) if dt.kind == "f" or dt.name == "bfloat16" else a.view(dt)
        y = ref[name].view(dt).astype(np.float64) if dt.kind == "f" or dt.name == "bfloat16" else ref[name].view(dt)
        if dt.kind in "iub":
            if not np.array_equal(x, y):
                return False
            continue
        scale = max(float(np.max(np.abs(y))), 1e-30)
        tol = 2e-2 if dt.itemsize == 2 else (5e-3 if ctx.allow_tf32 else 1e-4)
        if not np.all(np.isfinite(x) == np.isfinite(y)) or float(np.max(np.abs(x - y))) > tol * scale:
            return False
    return True
