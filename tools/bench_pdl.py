"""Programmatic dependent launch against plain launches: one engine file per model and batch, loaded
twice in one process (graphc.runtime.load(path, pdl=True) and pdl=False), timed interleaved.

    python tools/bench_pdl.py --exports DIR --models bert,gpt2,resnet50 --batch 1,32 --json pdl.json --md pdl.md
    python tools/bench_pdl.py --models bert:full,resnet:full --batch 1,32 ...

A model without a colon is an export in DIR (tools/export_torch.py's NAME.torchscript.onnx, symbolic
batch, sequence 128); NAME:SIZE is a model of graphc's zoo. Per model and batch, an fp16 engine for
this GPU, and for each of the two loads:
- `replay_ms`: GPU time of one CUDA-graph replay (CUDA events around N back-to-back replays);
- `run_ms`: the ordinary call, back to back: N engine.run(cupy feeds, sync=False), then one sync,
  host wall time per call (what a serving loop sees; its device work is the replay);
- `stream_ms`: the same with use_graph=False (every kernel launched from Python, no graph; N/5 calls);
N makes a measurement about --window-ms long (10 to --calls); best (lowest) mean over `rounds`
rounds, the two loads alternating round by round. `exact`: the
PDL engine's outputs equal the plain engine's bit for bit, over several replays of changing inputs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def _feeds_export(name: str, batch: int, seed: int) -> dict[str, np.ndarray]:
    from export_torch import CASES, _example

    rng = np.random.default_rng(seed)
    return {s.name: _example(s, {"batch": batch, "seq": 128}, rng) for s in CASES[name].inputs}


def _source(spec: str, exports: Path | None, batch: int) -> tuple[Any, Callable[[int], dict[str, np.ndarray]]]:
    """(the model to compile, feeds of this batch by seed)."""
    if ":" not in spec:
        if exports is None:
            raise ValueError(f"model {spec}: an export needs --exports DIR (or give a zoo model as NAME:SIZE)")
        return str(exports / f"{spec}.torchscript.onnx"), lambda seed: _feeds_export(spec, batch, seed)
    import models

    name, _, size = spec.partition(":")
    m = models.build(name, size=size or "full", batch=batch)
    return m, lambda seed: models.sample_inputs(name, m, seed=seed, batch=batch)


def _timed(call: Callable[[], Any], sync: Callable[[], Any], calls: int) -> float:
    sync()
    t0 = time.perf_counter()
    for _ in range(calls):
        call()
    sync()
    return (time.perf_counter() - t0) * 1000 / calls


def _replay_ms(cupy: Any, ctx: Any, calls: int) -> float:
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    start.record(ctx.stream)
    for _ in range(calls):
        ctx.replay_graph().launch(stream=ctx.stream)
    end.record(ctx.stream)
    end.synchronize()
    return cupy.cuda.get_elapsed_time(start, end) / calls


def _numpy(outs: dict[str, Any]) -> dict[str, np.ndarray]:
    return {k: (v.get() if hasattr(v, "get") else np.asarray(v)) for k, v in outs.items()}


def bench_one(
    spec: str, exports: Path | None, batch: int, max_calls: int, rounds: int, window_ms: float, workdir: Path
) -> dict[str, Any]:
    import cupy

    import graphc
    import graphc.runtime

    model, feeds_of = _source(spec, exports, batch)
    feeds = feeds_of(0)
    t0 = time.perf_counter()
    built = graphc.compile(model, target="cuda", precision="fp16", shapes={k: v.shape for k, v in feeds.items()})
    compile_s = time.perf_counter() - t0
    path = workdir / f"{spec.replace(':', '_')}_b{batch}.engine"
    built.save(path)
    del built
    sms = str(cupy.cuda.runtime.getDeviceProperties(0)["multiProcessorCount"])
    engines = {"pdl": _load(path, True, "0"), "wave": _load(path, True, sms), "plain": _load(path, False, None)}
    row: dict[str, Any] = {"model": spec, "batch": batch, "compile_s": round(compile_s, 2)}
    ctxs = {k: e.executor.default for k, e in engines.items()}
    row["launches"] = len(ctxs["pdl"].launches)
    row["programmatic"] = sum(p is not None for p in ctxs["pdl"].programmatic)
    row["programmatic_wave"] = sum(p is not None for p in ctxs["wave"].programmatic)
    assert not any(p is not None for p in ctxs["plain"].programmatic)

    def dev(f: dict[str, np.ndarray], e: Any) -> dict[str, Any]:
        return {s.name: cupy.asarray(f[s.name].astype(s.dtype)) for s in e.inputs}

    # exactness: several input sets through replays, and once through stream launches
    exact, worst = True, 0.0
    for seed in (1, 2, 3, 1):
        f = feeds_of(seed)
        got = {k: _numpy(e.run(dev(f, e))) for k, e in engines.items()}
        for variant in ("pdl", "wave"):
            for name in got["plain"]:
                a, b = got[variant][name].astype(np.float32), got["plain"][name].astype(np.float32)
                same = np.array_equal(a, b, equal_nan=True)
                exact &= bool(same)
                if not same:
                    worst = max(worst, float(np.nanmax(np.abs(a - b))))
    f = feeds_of(4)
    s_pdl = _numpy(ctxs["pdl"].run(dev(f, engines["pdl"]), use_graph=False))
    s_plain = _numpy(ctxs["plain"].run(dev(f, engines["plain"]), use_graph=False))
    exact &= all(np.array_equal(s_pdl[k], s_plain[k], equal_nan=True) for k in s_plain)
    row["exact"], row["max_abs_diff"] = exact, worst
    ok = all(np.isfinite(v.astype(np.float32)).all() for v in s_plain.values())
    row["outputs_finite"] = bool(ok)

    feeds_dev = {k: dev(feeds, e) for k, e in engines.items()}
    for k, e in engines.items():  # warm-up: capture done above; a few of each
        for _ in range(10):
            e.run(feeds_dev[k], sync=False)
        ctxs[k].stream.synchronize()
    calls = int(min(max_calls, max(10, window_ms / max(_replay_ms(cupy, ctxs["plain"], 5), 1e-3))))
    row["calls"] = calls
    times: dict[str, dict[str, list[float]]] = {k: {"replay_ms": [], "run_ms": [], "stream_ms": []} for k in engines}
    for _ in range(rounds):
        for k, e in engines.items():
            c, fd = ctxs[k], feeds_dev[k]
            times[k]["replay_ms"].append(_replay_ms(cupy, c, calls))
            times[k]["run_ms"].append(_timed(lambda e=e, fd=fd: e.run(fd, sync=False), c.stream.synchronize, calls))
            times[k]["stream_ms"].append(
                _timed(
                    lambda c=c, fd=fd: c.run(fd, use_graph=False, sync=False), c.stream.synchronize, max(5, calls // 5)
                )
            )
    for k in engines:
        for what, v in times[k].items():
            row[f"{what}_{k}"] = round(min(v), 4)
            row[f"{what}_{k}_median"] = round(statistics.median(v), 4)
    for what in ("replay_ms", "run_ms", "stream_ms"):
        row[f"{what}_ratio"] = round(row[f"{what}_pdl"] / row[f"{what}_plain"], 3)
        row[f"{what}_ratio_wave"] = round(row[f"{what}_wave"] / row[f"{what}_plain"], 3)
    del engines, ctxs
    cupy.get_default_memory_pool().free_all_blocks()
    return row


def _load(path: Path, pdl: bool, max_ctas: str | None) -> Any:
    """The engine loaded with PDL on or off (forced: not the runtime's default choice); max_ctas:
    GRAPHC_PDL_MAX_CTAS for this load ("0": every PDL-ready launch; None: the runtime's default)."""
    import os

    import graphc.runtime

    old = os.environ.pop("GRAPHC_PDL_MAX_CTAS", None)
    try:
        if max_ctas is not None:
            os.environ["GRAPHC_PDL_MAX_CTAS"] = max_ctas
        return graphc.runtime.load(path, pdl=pdl)
    finally:
        os.environ.pop("GRAPHC_PDL_MAX_CTAS", None)
        if old is not None:
            os.environ["GRAPHC_PDL_MAX_CTAS"] = old


def environment() -> dict[str, Any]:
    import platform
    import subprocess

    import cupy

    env: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "python": platform.python_version(),
    }
    props = cupy.cuda.runtime.getDeviceProperties(0)
    env["gpu"] = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    try:
        env["driver"] = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True, text=True
        ).stdout.strip()
    except OSError:
        env["driver"] = f"CUDA {cupy.cuda.runtime.driverGetVersion()}"
    env["cupy"] = cupy.__version__
    try:
        import cuda.bindings

        env["cuda_bindings"] = cuda.bindings.__version__
    except ImportError:
        env["cuda_bindings"] = None
    from graphc.codegen.nvrtc import nvrtc_version

    env["nvrtc"] = nvrtc_version()
    return env


def markdown(env: dict[str, Any], rows: list[dict[str, Any]], command: str) -> str:
    lines = [
        "# PDL (programmatic dependent launch) against plain launches",
        "",
        f"{env['date']}, {env['gpu']}, driver {env['driver']}, cupy {env['cupy']}, cuda-bindings "
        f"{env['cuda_bindings']}, NVRTC {env['nvrtc']}, Python {env['python']}; fp16 engines.",
        "",
        f"    {command}",
        "",
        "Best mean of the rounds (ms). PDL: every PDL-ready launch programmatic (GRAPHC_PDL_MAX_CTAS=0); "
        "one-wave: only between launches of at most one CTA per SM (GRAPHC_PDL_MAX_CTAS=SM count); "
        "ratios against plain; "
        "exact: both PDL loads give the plain load's outputs bit for bit.",
        "",
        "| model | batch | launches (PDL / one-wave) | replay plain | PDL | ratio | one-wave | ratio "
        "| run plain | PDL | ratio | one-wave | ratio | exact |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['batch']} | failed: {r['error'][:200]} |")
            continue
        cells = [r["model"], r["batch"], f"{r['launches']} ({r['programmatic']} / {r['programmatic_wave']})"]
        for what in ("replay_ms", "run_ms"):
            cells += [f"{r[what + '_plain']:.4f}", f"{r[what + '_pdl']:.4f}", f"{r[what + '_ratio']:.3f}"]
            cells += [f"{r[what + '_wave']:.4f}", f"{r[what + '_ratio_wave']:.3f}"]
        lines.append("| " + " | ".join(str(c) for c in [*cells, r["exact"]]) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--exports", type=Path, help="tools/export_torch.py's output folder")
    p.add_argument("--models", default="bert,gpt2,resnet50", help="exports by name, zoo models as NAME:SIZE")
    p.add_argument("--batch", default="1,32")
    p.add_argument("--calls", type=int, default=50, help="the most calls per measurement")
    p.add_argument("--window-ms", type=float, default=40.0, help="about how long one measurement takes")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--json", type=Path)
    p.add_argument("--md", type=Path)
    a = p.parse_args(argv)
    specs = a.models.split(",")
    batches = [int(b) for b in a.batch.split(",")]
    env = environment()
    rows: list[dict[str, Any]] = []
    command = "python tools/bench_pdl.py " + " ".join(argv if argv is not None else sys.argv[1:])
    with tempfile.TemporaryDirectory() as tmp:
        for batch in batches:  # every model at the first batch first: the figures that matter most
            for spec in specs:
                try:
                    row = bench_one(spec, a.exports, batch, a.calls, a.rounds, a.window_ms, Path(tmp))
                except Exception as e:  # one model failing must not lose the others' figures
                    row = {"model": spec, "batch": batch, "error": f"{type(e).__name__}: {str(e).splitlines()[0]}"}
                rows.append(row)
                print(json.dumps(row), flush=True)
                if a.json:
                    a.json.write_text(json.dumps({"environment": env, "command": command, "rows": rows}, indent=1))
                if a.md:
                    a.md.write_text(markdown(env, rows, command))
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
