"""Dynamic engines (optimization profiles) against static ones, and the Batcher under load (issue 14).

    python tools/bench_profiles.py --out-md R.md --out-json R.json \
        [--onnx bert=bert.onnx --onnx resnet50=resnet50.onnx | --zoo full|tiny] \
        [--target cuda] [--precision fp16] [--arch sm_90] [--min 1 --opt 8 --max 32] \
        [--static 1,8,32] [--extra 20] [--seq 128] [--concurrency 32] [--max-wait-ms 2] [--jobs 8]

For each model it builds one dynamic engine (batch min..max, tuned for opt; a text model's sequence
fixed at --seq) and one static engine per batch of --static and --extra, in parallel worker
processes (`--jobs`), then times the dynamic engine and the static engine of each batch at that
batch with tools/bench_timing.py's two methods: (a) ordinary calls back to back (engine.run on
device inputs, one sync per round) and (b) CUDA-graph replays (of the bucket the shape runs on, for
the dynamic engine). --extra batches are shapes that are not buckets (the dynamic engine pads them).
Then the Batcher load test on the text model's dynamic engine: batch-1 requests from --concurrency
threads, through graphc.runtime.Batcher and as unbatched calls (graphc.bench.benchmark_batcher,
the `graphc bench --batcher` path), with the default eager Batcher at each of --pipelines (and with
--hold, each again holding a partial batch for max_wait). The issue's bars are checked on the first
eager run and written beside the numbers:
dynamic at opt within 10% of static, other shapes within 25%, Batcher >= 5x unbatched throughput,
p99 <= 2 x max_wait + one batch time (engine.run of a max_batch batch from host arrays, median).

Models: --onnx NAME=PATH (text models are those with an int64 input; images have one float input),
--export-torch DIR (tools/export_torch.py exports BERT-base and ResNet-50 there first, with dynamic
axes, one process per model; needs torch and transformers), or the zoo's bert and resnet (--zoo
full: BERT-base and ResNet-50 built with onnx.helper). The JSON and Markdown are
rewritten after every stage, so an interrupted run keeps what it measured.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import platform
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: the zoo's models package
sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_timing  # noqa: E402  (tools/ is not a package)

log = logging.getLogger("bench_profiles")

OPT_BAR = 1.10  # the dynamic engine at opt against the static engine of that shape
OTHER_BAR = 1.25  # at any other shape
BATCHER_BAR = 5.0  # Batcher throughput over unbatched calls


@dataclass
class ModelSpec:
    name: str
    path: Path
    text: bool
    inputs: list[tuple[str, str, list[Any]]]  # name, numpy dtype, shape (symbolic dims as str)


@dataclass
class Build:
    model: str
    kind: str  # "dynamic" | "static"
    batch: int | None
    path: Path
    seconds: float | None = None
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


# ---- models and shapes ---------------------------------------------------------------------------


def read_spec(name: str, path: Path) -> ModelSpec:
    import onnx

    proto = onnx.load(str(path), load_external_data=False)
    inits = {i.name for i in proto.graph.initializer}
    inputs = []
    for i in proto.graph.input:
        if i.name in inits:
            continue
        t = i.type.tensor_type
        dtype = onnx.helper.tensor_dtype_to_np_dtype(t.elem_type).name
        shape = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in t.shape.dim]
        inputs.append((i.name, dtype, shape))
    text = any(d.startswith("int") for _n, d, _s in inputs)
    return ModelSpec(name, path, text, inputs)


def input_shape(spec: ModelSpec, shape: list[Any], batch: int, seq: int) -> list[int]:
    """dim 0 is the batch; any other symbolic dim is the sequence (fixed at --seq)."""
    out = []
    for axis, d in enumerate(shape):
        if axis == 0:
            out.append(batch)
        elif isinstance(d, int) and d > 0:
            out.append(d)
        else:
            out.append(seq)
    return out


def shapes_at(spec: ModelSpec, batch: int, seq: int) -> dict[str, list[int]]:
    return {n: input_shape(spec, s, batch, seq) for n, _d, s in spec.inputs}


def feeds_at(spec: ModelSpec, batch: int, seq: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Random inputs: ids in [0, 64) (inside every config's vocabulary), masks of ones with the last
    token of the first row masked, token types zero, images standard normal."""
    rng = np.random.default_rng(seed)
    out = {}
    for n, dtype, s in spec.inputs:
        shape = input_shape(spec, s, batch, seq)
        if not dtype.startswith("int"):
            out[n] = rng.standard_normal(shape).astype(dtype)
        elif "mask" in n:
            m = np.ones(shape, dtype)
            if m.ndim == 2 and shape[1] > 1:
                m[0, -1] = 0
            out[n] = m
        elif "type" in n:
            out[n] = np.zeros(shape, dtype)
        else:
            out[n] = rng.integers(0, 64, size=shape).astype(dtype)
    return out


def export_torch(out: Path, exporter: str, seq: int, names: tuple[str, ...] = ("bert", "resnet50")) -> dict[str, Path]:
    """BERT-base and ResNet-50 exported by tools/export_torch.py (dynamic batch and sequence), the
    two at once in processes of their own; a failed export is an error that names its log."""
    out.mkdir(parents=True, exist_ok=True)
    tool = Path(__file__).resolve().parent / "export_torch.py"
    procs = {}
    for name in names:
        cmd = [sys.executable, str(tool), "--out", str(out), "--models", name, "--exporter", exporter]
        cmd += ["--seq", str(seq)]
        log_file = (out / f"{name}.export.log").open("w")
        procs[name] = (subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT), log_file)
    paths = {}
    t0 = time.perf_counter()
    for name, (proc, log_file) in procs.items():
        rc = proc.wait()
        log_file.close()
        path = out / f"{name}.{exporter}.onnx"
        if rc != 0 or not path.exists():
            raise SystemExit(f"export of {name} failed (rc {rc}); see {out / f'{name}.export.log'}")
        paths[name] = path
    log.info("exported %s in %.1f s", ", ".join(paths), time.perf_counter() - t0)
    return paths


# ---- building engines in worker processes --------------------------------------------------------


def build_one(job: dict[str, Any]) -> dict[str, Any]:
    """Compile one engine (the --build-job mode of this tool) and save it; returns its timings."""
    import graphc

    kw: dict[str, Any] = dict(target=job["target"], precision=job["precision"])
    if job["target"] == "cuda":
        kw["arch"] = job["arch"]
    if job["cache_dir"]:
        kw["cache_dir"] = job["cache_dir"]
    if job["kind"] == "dynamic":
        kw.update(min_shapes=job["min"], opt_shapes=job["opt"], max_shapes=job["max"])
    else:
        kw["shapes"] = job["shapes"]
    t0 = time.perf_counter()
    engine = graphc.compile(job["model"], **kw)
    seconds = time.perf_counter() - t0
    engine.save(job["out"])
    extra: dict[str, Any] = {"kernels": engine.report.get("kernels")}
    if engine.profiles:
        extra["buckets"] = [b.sizes for b in engine.profiles[0].buckets]
        extra["dims"] = engine.report["profiles"][0]["dims"]
    return {"seconds": round(seconds, 2), "bytes": Path(job["out"]).stat().st_size, **extra}


def _ladder_lines(build: dict[str, Any], rows: list[dict[str, Any]]) -> list[str]:
    """How a dynamic build's padded dims got their buckets (graphc/profiles.py padded_ladders): the
    time ladder's estimate (est ms) at its buckets and at every batch this run timed, beside the
    static engines' measured times, so the estimate can be checked; or why the rows ladder."""
    out = []
    for d in build.get("dims") or []:
        lad = d.get("ladder")
        if not lad:
            continue
        if lad["method"] != "time":
            out.append(f"  - dim '{d['name']}': rows ladder (at most {lad['max_padding']}x the rows): {lad.get('why')}")
            continue
        every = {int(k): v for k, v in lad.get("est_ms_every_size", {}).items()}
        static = {r["batch"]: r.get("static_b_ms") for r in rows if r.get("model") == build["model"]}
        shown = ", ".join(
            f"{n}: {every[n]:.3f}" + (f" (static {static[n]:.3f})" if static.get(n) else "")
            for n in sorted(set(every) & (set(lad["sizes"]) | set(static)))
        )
        out.append(
            f"  - dim '{d['name']}': time ladder (est(bucket) <= {lad['limit']} est(n), rows <= "
            f"{lad['max_padding']} n; estimated in {lad.get('est_s')} s); est ms (measured static b ms): {shown}"
        )
    return out


def run_builds(builds: list[Build], specs: dict[str, ModelSpec], a: argparse.Namespace) -> None:
    """Every engine of `builds`, `a.jobs` at a time, each in a process of its own (the compiler's
    Python is single-threaded; NVRTC already runs a process per kernel inside each)."""

    def one(b: Build) -> None:
        spec = specs[b.model]
        job: dict[str, Any] = {
            "model": str(spec.path),
            "kind": b.kind,
            "target": a.target,
            "precision": a.precision,
            "arch": [x for x in a.arch.split(",") if x],
            "cache_dir": a.cache_dir,
            "out": str(b.path),
        }
        if b.kind == "dynamic":
            job.update({k: shapes_at(spec, n, a.seq) for k, n in (("min", a.min), ("opt", a.opt), ("max", a.max))})
        else:
            job["shapes"] = shapes_at(spec, b.batch or 1, a.seq)
        jf = b.path.with_suffix(".job.json")
        jf.write_text(json.dumps(job))
        env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}
        p = subprocess.run(
            [sys.executable, __file__, "--build-job", str(jf)], capture_output=True, text=True, env=env, check=False
        )
        lines = p.stdout.strip().splitlines()
        if p.returncode != 0 or not lines:
            tail = (p.stderr.strip().splitlines() or ["no output"])[-1]
            b.error = f"build failed (rc {p.returncode}): {tail}"[:400]
            log.error("%s %s %s: %s", b.model, b.kind, b.batch, b.error)
            return
        res = json.loads(lines[-1])
        b.seconds = res.pop("seconds")
        b.extra = res
        log.info("built %s %s%s in %.1f s", b.model, b.kind, f" b{b.batch}" if b.batch else "", b.seconds)

    with ThreadPoolExecutor(max_workers=max(1, a.jobs)) as pool:
        list(pool.map(one, builds))


# ---- timing --------------------------------------------------------------------------------------


class Timer:
    """The two methods of tools/bench_timing.py on one target."""

    def __init__(self, target: str, protocol: bench_timing.Protocol):
        self.target, self.p = target, protocol
        if target == "cuda":
            import cupy

            self.cupy = cupy
            self.sync = cupy.cuda.runtime.deviceSynchronize
            self.kwargs: dict[str, Any] = {"sync": False}  # as tools/bench_torch.py: one wait per round
        else:
            self.sync = lambda: None
            self.kwargs = {}

    def device_feeds(self, feeds: dict[str, np.ndarray]) -> dict[str, Any]:
        return {k: self.cupy.asarray(v) for k, v in feeds.items()} if self.target == "cuda" else dict(feeds)

    def time(self, engine: Any, feeds: dict[str, np.ndarray]) -> dict[str, Any]:
        """(a) and (b) of `engine` at the shapes of `feeds`; (b) replays the plan those shapes run on."""
        dev = self.device_feeds(feeds)
        outs = engine.run(dev)  # first run: a bucket's engine is made, its graph captured
        self.sync()
        row: dict[str, Any] = {
            "a_ms": round(bench_timing.steady_ms(lambda: engine.run(dev, **self.kwargs), self.sync, self.p), 4)
        }
        plan_engine, bucket = engine, None
        if engine.dynamic is not None:
            _p, b, _sizes = engine.dynamic.resolve(engine, engine.check_feeds(dev))
            plan_engine, bucket = engine.dynamic.bucket_engine(engine, b), dict(b.sizes)
        row["bucket"] = bucket
        row["b_ms"] = round(bench_timing.graphc_replay_ms(plan_engine, self.p), 4) if self.target == "cuda" else None
        row["outputs"] = {k: np.asarray(self.cupy.asnumpy(v) if self.target == "cuda" else v) for k, v in outs.items()}
        return row

    def host_call_ms(self, engine: Any, feeds: dict[str, np.ndarray], calls: int = 20) -> float:
        """Median engine.run from host arrays to device outputs, synchronized: one batch's time as
        the Batcher's worker sees it."""
        engine.run(feeds)
        ms = []
        for _ in range(calls):
            t0 = time.perf_counter()
            engine.run(feeds)
            self.sync()
            ms.append((time.perf_counter() - t0) * 1000)
        return float(np.median(ms))


def rel_diff(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> float:
    """Largest |a - b| over the outputs, relative to b's scale: the dynamic engine against static."""
    worst = 0.0
    for k, ref in b.items():
        r = ref.astype(np.float64)
        scale = float(np.abs(r).max()) or 1.0
        worst = max(worst, float(np.abs(a[k].astype(np.float64) - r).max()) / scale)
    return worst


def bench_model(spec: ModelSpec, builds: dict[tuple, Build], a: argparse.Namespace, timer: Timer) -> list[dict]:
    import graphc.runtime

    dyn_b = builds[(spec.name, "dynamic", None)]
    if dyn_b.error:
        return [{"model": spec.name, "error": dyn_b.error}]
    dyn = graphc.runtime.load(dyn_b.path)
    rows = []
    for batch in [*a.static_batches, *a.extra_batches]:
        feeds = feeds_at(spec, batch, a.seq, seed=batch)
        row: dict[str, Any] = {"model": spec.name, "batch": batch, "opt": batch == a.opt}
        sb = builds[(spec.name, "static", batch)]
        try:
            d = timer.time(dyn, feeds)
            row.update(dyn_a_ms=d["a_ms"], dyn_b_ms=d["b_ms"], bucket=d["bucket"])
            row["bucket_shape"] = batch in (d["bucket"] or {}).values()  # else padded to the bucket
            if sb.error:
                row["error"] = sb.error
            else:
                st = graphc.runtime.load(sb.path)
                s = timer.time(st, feeds)
                row.update(static_a_ms=s["a_ms"], static_b_ms=s["b_ms"])
                row["max_rel_diff_vs_static"] = rel_diff(d["outputs"], s["outputs"])
                del st
        except Exception as e:  # noqa: BLE001  (recorded in the table; the other rows still run)
            log.exception("%s batch %d", spec.name, batch)
            row["error"] = f"{type(e).__name__}: {e}"[:400]
        _ratios(row)
        rows.append(row)
        log.info("%s b%d: %s", spec.name, batch, {k: v for k, v in row.items() if k.endswith(("ms", "ratio"))})
        if timer.target == "cuda":
            timer.cupy.get_default_memory_pool().free_all_blocks()
    return rows


def _ratios(row: dict[str, Any]) -> None:
    bar = OPT_BAR if row["opt"] else OTHER_BAR
    row["bar"] = bar
    oks = []
    for m in ("a", "b"):
        d, s = row.get(f"dyn_{m}_ms"), row.get(f"static_{m}_ms")
        if d is not None and s:
            row[f"{m}_ratio"] = round(d / s, 3)
            oks.append(d / s <= bar)
    row["ok"] = bool(oks) and all(oks)


def bench_batcher(spec: ModelSpec, builds: dict[tuple, Build], a: argparse.Namespace, timer: Timer) -> dict:
    """The Batcher load at each of --pipelines (batches in flight), each beside its own unbatched
    load; the first pipeline's is the result, the others are kept under "variants"."""
    import graphc.runtime
    from graphc.bench import benchmark_batcher

    b = builds[(spec.name, "dynamic", None)]
    if b.error:
        return {"model": spec.name, "error": b.error}
    engine = graphc.runtime.load(b.path)
    feeds = feeds_at(spec, a.max, a.seq, seed=99)
    runs: list[dict[str, Any]] = []
    failed: list[dict[str, Any]] = []
    # each pipeline with the default Batcher (eager: a batch closes as soon as none runs); --hold:
    # each again with Batcher(eager=False) (a partial batch held for max_wait), as further variants
    combos = [(p, True) for p in a.pipelines] + [(p, False) for p in a.pipelines if a.hold]
    for pipeline, eager in combos:
        try:
            res = benchmark_batcher(
                engine,
                feeds,
                concurrency=a.concurrency,
                requests=a.requests,
                max_batch=a.max,
                max_wait_ms=a.max_wait_ms,
                pipeline=pipeline,
                eager=eager,
            )
        except Exception as e:  # noqa: BLE001  (the other pipelines still run; the error is recorded)
            log.exception("batcher pipeline %d (%s)", pipeline, "eager" if eager else "hold")
            if not runs and (pipeline, eager) == combos[-1]:
                raise
            failed.append({"pipeline": pipeline, "eager": eager, "error": f"{type(e).__name__}: {e}"[:400]})
            continue
        p99 = res["batcher"]["latency"]["p99_ms"]
        log.info("batcher pipeline %d (%s): %.2fx, p99 %.3f ms", pipeline, _mode(res), res["speedup"], p99)
        runs.append(res)
    batch_ms = round(timer.host_call_ms(engine, feeds), 4)
    for res in runs:
        res["model"] = spec.name
        res["batch_ms"] = batch_ms
        res["p99_bound_ms"] = round(2 * a.max_wait_ms + batch_ms, 4)
        res["p99_ok"] = res["batcher"]["latency"]["p99_ms"] <= res["p99_bound_ms"]
        res["speedup_ok"] = res["speedup"] >= BATCHER_BAR
    if not runs:
        return {
            "model": spec.name,
            "error": "; ".join(f"pipeline {f['pipeline']}, {_mode(f)}: {f['error']}" for f in failed),
        }
    first = runs[0]
    if len(runs) > 1:
        first["variants"] = runs[1:]
    if failed:
        first["failed_pipelines"] = failed
    return first


# ---- environment and output ----------------------------------------------------------------------


def environment(a: argparse.Namespace) -> dict[str, Any]:
    import importlib.metadata as md

    env: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "python": platform.python_version(),
        "host": platform.node(),
        "cpu_count": os.cpu_count(),
        "command": " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]]),
        "commit": a.commit or _git_commit(),
    }
    for pkg in ("graphc", "numpy", "onnx", "onnxruntime", "cupy-cuda13x", "cupy-cuda12x", "cuda-python", "torch"):
        with contextlib.suppress(md.PackageNotFoundError):
            env[pkg] = md.version(pkg)
    if a.target == "cuda":
        import cupy

        props = cupy.cuda.runtime.getDeviceProperties(0)
        name = props["name"]
        env["gpu"] = name.decode() if isinstance(name, bytes) else str(name)
        env["cuda_driver_api"] = cupy.cuda.runtime.driverGetVersion()
        env["cuda_runtime"] = cupy.cuda.runtime.runtimeGetVersion()
        try:
            smi = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True, text=True
            )
            env["driver"] = smi.stdout.strip().splitlines()[0]
        except (OSError, IndexError):
            pass
        try:
            from cuda.bindings import nvrtc

            env["nvrtc"] = ".".join(str(x) for x in nvrtc.nvrtcVersion()[1:])
        except Exception:  # noqa: BLE001  (a version string only)
            pass
    return env


def _git_commit() -> str | None:
    try:
        p = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True,
                           cwd=Path(__file__).resolve().parent)  # fmt: skip
        return p.stdout.strip() or None
    except (OSError, subprocess.CalledProcessError):
        return None


def _f(x: Any, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}f}" if isinstance(x, float) else str(x)


def markdown(result: dict[str, Any]) -> str:
    env, cfg = result["environment"], result["config"]
    lines = [
        f"# Dynamic engines against static ones, and the Batcher ({env['date']})",
        "",
        f"`{env['command']}`",
        "",
        ", ".join(f"{k} {v}" for k, v in env.items() if k not in ("date", "command")),
        "",
        f"Target {cfg['target']}, {cfg['precision']}; dynamic engines: batch {cfg['min']}..{cfg['max']}, opt "
        f"{cfg['opt']}, text models at seq {cfg['seq']}. (a) ordinary calls back to back (engine.run on device "
        "inputs, one sync per round of calls; best round's mean); (b) CUDA-graph replays of the plan the shape runs "
        "on (best round's mean). Ratio = dynamic / static engine built for that batch; the bar is "
        f"{OPT_BAR:.2f} at opt, {OTHER_BAR:.2f} elsewhere. Batches marked * are not buckets: the dynamic "
        "engine pads them to the bucket shown.",
        "",
        "| model | batch | bucket | dynamic a / b ms | static a / b ms | ratio a / b | bar | met | max rel diff "
        "| note |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    if cfg.get("batcher_only"):
        lines = [*lines[:6], "--batcher-only: the Batcher load alone, on the text model's dynamic engine."]
    for r in result["rows"]:
        if "batch" not in r:
            lines.append(f"| {r['model']} | - | - | - | - | - | - | no | - | {r.get('error', '')} |")
            continue
        bucket = ",".join(str(v) for v in (r.get("bucket") or {}).values()) or "-"
        star = "" if r.get("bucket_shape", True) else "*"
        lines.append(
            f"| {r['model']} | {r['batch']}{star}{' (opt)' if r['opt'] else ''} | {bucket} | "
            f"{_f(r.get('dyn_a_ms'), 4)} / {_f(r.get('dyn_b_ms'), 4)} | "
            f"{_f(r.get('static_a_ms'), 4)} / {_f(r.get('static_b_ms'), 4)} | "
            f"{_f(r.get('a_ratio'))} / {_f(r.get('b_ratio'))} | {r['bar']:.2f} | {'yes' if r['ok'] else 'no'} | "
            f"{_f(r.get('max_rel_diff_vs_static'), 6) if 'max_rel_diff_vs_static' in r else '-'} | "
            f"{r.get('error', '')} |"
        )
    lines += ["", "Builds (compile seconds, each in its own process, several at once):", ""]
    for b in result["builds"]:
        what = f"{b['model']} {b['kind']}" + (f" batch {b['batch']}" if b["batch"] else "")
        extra = (
            f", buckets {[list(s.values())[0] if len(s) == 1 else s for s in b['buckets']]}" if b.get("buckets") else ""
        )
        lines.append(
            f"- {what}: {_f(b['seconds'], 1)} s, {_f(b.get('bytes'))} bytes{extra}"
            + (f" {b['error']}" if b["error"] else "")
        )
        lines += _ladder_lines(b, result["rows"])
    bt = result.get("batcher")
    if bt:
        lines += ["", "## Batcher"]
        if "error" in bt:
            lines += ["", f"{bt['model']}: {bt['error']}"]
        else:
            lines += [
                "",
                f"{bt['model']}: {bt['concurrency']} client threads, {bt['requests']} batch-1 requests each way "
                f"(host arrays in, device arrays out); Batcher max_batch {bt['max_batch']}, max_wait "
                f"{bt['max_wait_ms']:g} ms, {_mode(bt)} ({MODES[_mode(bt)]}), pipeline {bt.get('pipeline', 1)} "
                "(batches in flight); unbatched: one "
                "engine.run per request at batch 1, under a lock. Each way starts with "
                f"{bt.get('warmup_requests', 0)} untimed warm-up requests.",
                "",
                "| | p50 ms | p99 ms | requests/s | mean batch |",
                "| --- | --- | --- | --- | --- |",
            ]
            for k in ("unbatched", "batcher"):
                x = bt[k]
                lines.append(
                    f"| {k} ({_mode(bt)}) | {x['latency']['median_ms']:.3f} | {x['latency']['p99_ms']:.3f} | "
                    f"{x['throughput_per_s']:.1f} | {x['mean_batch']:.2f} |"
                )
            for v in bt.get("variants", []):
                for k in ("unbatched", "batcher"):
                    x = v[k]
                    lines.append(
                        f"| {k} (pipeline {v['pipeline']}, {_mode(v)} run) | {x['latency']['median_ms']:.3f} | "
                        f"{x['latency']['p99_ms']:.3f} | {x['throughput_per_s']:.1f} | {x['mean_batch']:.2f} |"
                    )
            lines += [
                "",
                f"{_mode(bt).capitalize()}, pipeline {bt.get('pipeline', 1)}: "
                f"throughput {bt['speedup']:.2f}x unbatched "
                f"(bar {BATCHER_BAR:g}x: {'met' if bt['speedup_ok'] else 'not met'}); "
                f"p99 {bt['batcher']['latency']['p99_ms']:.3f} ms against 2 x max_wait + one batch "
                f"({bt['batch_ms']:.3f} ms: engine.run of {bt['max_batch']} rows from host arrays, median) = "
                f"{bt['p99_bound_ms']:.3f} ms: {'met' if bt['p99_ok'] else 'not met'}.",
            ]
            for v in bt.get("variants", []):
                lines.append(
                    f"Pipeline {v['pipeline']}, {_mode(v)}: {v['speedup']:.2f}x its unbatched run, p99 "
                    f"{v['batcher']['latency']['p99_ms']:.3f} ms."
                )
    return "\n".join(lines) + "\n"


MODES = {"eager": "a batch closes as soon as none runs", "hold": "a partial batch is held for max_wait"}


def _mode(run: dict[str, Any]) -> str:
    """The run's Batcher mode; a result from before eager became the default (no "eager" key) held."""
    return "eager" if run.get("eager") else "hold"


def write(result: dict[str, Any], a: argparse.Namespace) -> None:
    Path(a.out_json).write_text(json.dumps(result, indent=1, default=str) + "\n")
    Path(a.out_md).write_text(markdown(result))


# ---- main ----------------------------------------------------------------------------------------


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--onnx", action="append", default=[], help="NAME=PATH of a model with a dynamic batch (repeat)")
    p.add_argument("--zoo", choices=["tiny", "full"], default=None, help="the zoo's bert and resnet instead")
    p.add_argument("--export-torch", default=None, help="export bert and resnet50 here first (tools/export_torch.py)")
    p.add_argument("--exporter", choices=["torchscript", "dynamo"], default="torchscript", help="for --export-torch")
    p.add_argument("--target", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--precision", default="fp16")
    p.add_argument("--arch", default="sm_90", help="CUDA archs to build (comma-separated)")
    p.add_argument("--min", type=int, default=1)
    p.add_argument("--opt", type=int, default=8)
    p.add_argument("--max", type=int, default=32)
    p.add_argument("--seq", type=int, default=128, help="the text models' sequence length (fixed)")
    p.add_argument("--static", default="1,8,32", help="batches of the static engines, timed on both")
    p.add_argument("--extra", default="", help="batches that are no bucket of the dynamic engine, also timed")
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--requests", type=int, default=None, help="Batcher load: requests each way (default 20 x threads)")
    p.add_argument("--max-wait-ms", type=float, default=2.0)
    p.add_argument("--no-batcher", action="store_true")
    p.add_argument(
        "--batcher-only",
        action="store_true",
        help="build only the text model's dynamic engine and run only the Batcher load (a short GPU call)",
    )
    p.add_argument("--pipelines", default="2", help="Batcher batches in flight, one load each (comma-separated)")
    p.add_argument(
        "--hold",
        action="store_true",
        help="also run each pipeline with Batcher(eager=False) (a partial batch held for max_wait), as further"
        " variants; the default (eager) runs are the result",
    )
    p.add_argument("--jobs", type=int, default=max(1, min(8, (os.cpu_count() or 2) // 2)), help="builds at once")
    p.add_argument("--calls", type=int, default=50, help="calls per timed round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--work", default="/tmp/bench_profiles", help="folder for the engines and zoo models")
    p.add_argument("--cache-dir", default=None, help="graphc's kernel cache (default its own)")
    p.add_argument("--commit", default=None, help="the commit that ran (default: git here)")
    p.add_argument("--out-md", required=True)
    p.add_argument("--out-json", required=True)
    a = p.parse_args(argv)
    a.static_batches, a.extra_batches = _ints(a.static), _ints(a.extra)
    if a.opt not in a.static_batches:
        p.error(f"--static must hold --opt {a.opt}: the opt shape is compared with its static engine")
    bad = [b for b in [*a.static_batches, *a.extra_batches] if not a.min <= b <= a.max]
    if bad:
        p.error(f"batches {bad} are outside --min {a.min} .. --max {a.max}")
    if not a.onnx and not a.zoo and not a.export_torch:
        p.error("give models with --onnx NAME=PATH, --export-torch DIR or --zoo tiny|full")
    a.requests = a.requests or 20 * a.concurrency
    a.pipelines = _ints(a.pipelines)
    if not a.pipelines or min(a.pipelines) < 1:
        p.error("--pipelines takes positive integers, e.g. 1,2")
    if a.batcher_only and a.no_batcher:
        p.error("--batcher-only and --no-batcher exclude each other")
    return a


def main(argv: list[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["--build-job"]:
        print(json.dumps(build_one(json.loads(Path(argv[1]).read_text()))))
        return 0
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    for noisy in ("graphc", "passes", "codegen"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    a = parse_args(argv)
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {}
    for item in a.onnx:
        name, _, path = item.partition("=")
        if not path:
            raise SystemExit(f"--onnx {item}: give NAME=PATH")
        paths[name] = Path(path)
    export_s = None
    if a.export_torch:
        t_export = time.perf_counter()
        names = ("bert",) if a.batcher_only else ("bert", "resnet50")
        paths.update(export_torch(Path(a.export_torch), a.exporter, a.seq, names))
        export_s = round(time.perf_counter() - t_export, 1)
    if a.zoo:
        import models

        for name, family in (("bert", "bert"), ("resnet50" if a.zoo == "full" else "resnet", "resnet")):
            if a.batcher_only and family != "bert":
                continue
            p = work / f"{name}.zoo-{a.zoo}.onnx"
            models.save(models.build(family, size=a.zoo), p)
            paths[name] = p
    specs = {n: read_spec(n, p) for n, p in paths.items()}
    builds: dict[tuple, Build] = {}
    for n in specs:
        if a.batcher_only and not specs[n].text:
            continue  # the Batcher load runs on the text model's dynamic engine only
        builds[(n, "dynamic", None)] = Build(n, "dynamic", None, work / f"{n}.dynamic.engine")
        for b in [] if a.batcher_only else [*a.static_batches, *a.extra_batches]:
            builds[(n, "static", b)] = Build(n, "static", b, work / f"{n}.static{b}.engine")
    result: dict[str, Any] = {
        "environment": environment(a),
        "config": {
            k: getattr(a, k)
            for k in (
                "target",
                "precision",
                "arch",
                "min",
                "opt",
                "max",
                "seq",
                "static_batches",
                "extra_batches",
                "concurrency",
                "requests",
                "max_wait_ms",
                "pipelines",
                "hold",
                "batcher_only",
                "calls",
                "rounds",
                "warmup",
            )
        },  # fmt: skip
        "models": {n: {"path": str(s.path), "inputs": s.inputs, "text": s.text} for n, s in specs.items()},
        "export_s": export_s,
        "builds": [],
        "rows": [],
    }
    t0 = time.perf_counter()
    run_builds(list(builds.values()), specs, a)
    result["build_wall_s"] = round(time.perf_counter() - t0, 1)
    result["builds"] = [{"model": b.model, "kind": b.kind, "batch": b.batch, "seconds": b.seconds,
                         "error": b.error, **b.extra} for b in builds.values()]  # fmt: skip
    write(result, a)
    timer = Timer(a.target, bench_timing.Protocol(a.warmup, a.rounds, a.calls))
    for spec in [] if a.batcher_only else specs.values():
        result["rows"] += bench_model(spec, builds, a, timer)
        write(result, a)
    text = [s for s in specs.values() if s.text]
    if text and not a.no_batcher:
        try:
            result["batcher"] = bench_batcher(text[0], builds, a, timer)
        except Exception as e:  # noqa: BLE001  (written to the results, not lost)
            log.exception("batcher")
            result["batcher"] = {"model": text[0].name, "error": f"{type(e).__name__}: {e}"[:400]}
    result["total_s"] = round(time.perf_counter() - t0, 1)
    write(result, a)
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
