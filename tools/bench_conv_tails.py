"""ResNet-50 static engines at several batches, each built with the partial-wave cost of
codegen/families/conv_sm90.py (TAIL_BASE) set to given values, timed as CUDA-graph replays in one
run on one GPU: which tail cost picks the faster kernels, and the batch-to-batch cliff it leaves.

    python tools/bench_conv_tails.py --engines 20@1.0,22@1.0,22@0.6,22@0.3 --jobs 16 \
        --work /tmp/ct --out-md ct.md --out-json ct.json

`B@T`: batch B with TAIL_BASE T (1.0 counts a partial wave as a whole one: the heuristics as they
were before the partial-wave cost). The model is the zoo's ResNet-50 (models/resnet.py, full: 224x224),
fp16, sm_90. The builds run in processes of their own (--jobs at a time); the timing is
tools/bench_timing.py's graph replay (best round's mean), all engines in this process, one after another.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
# the zoo (models/) is a folder of the checkout, not an installed package: a build process started
# as `python tools/bench_conv_tails.py` has tools/ on its path, not the checkout (the first GPU run
# of this tool failed so: ModuleNotFoundError: No module named 'models')
sys.path.insert(1, str(ROOT))
import bench_timing  # noqa: E402

log = logging.getLogger("bench_conv_tails")


def build(batch: int, tail: float, out: str, cache_dir: str | None) -> dict[str, Any]:
    """Compile one engine in this process (the --build mode) with conv_sm90.TAIL_BASE = tail."""
    import graphc
    import models
    from graphc.codegen.families import conv_sm90

    conv_sm90.TAIL_BASE = tail
    kw: dict[str, Any] = {"target": "cuda", "precision": "fp16", "arch": ["sm_90"], "shapes": {"batch": batch}}
    if cache_dir:
        kw["cache_dir"] = cache_dir
    t0 = time.perf_counter()
    engine = graphc.compile(models.build("resnet", size="full"), **kw)
    seconds = time.perf_counter() - t0
    engine.save(out)
    convs = []
    for s in engine.plan.steps:
        for ln in s.launches:
            p = ln.params
            if p.get("variant") in ("tma_gemm", "igemm"):
                convs.append(f"{p['variant']}:{p.get('BN')}/{p.get('SPLITS', 1)}/{p.get('STAGES')}")
    return {"seconds": round(seconds, 1), "convs": convs}


def _spawn(job: dict[str, Any]) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--build", str(job["batch"]), str(job["tail"]), job["out"]]
    if job.get("cache_dir"):
        cmd += ["--cache-dir", job["cache_dir"]]
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    lines = p.stdout.strip().splitlines()
    if p.returncode != 0 or not lines:
        tail = (p.stderr.strip().splitlines() or ["no output"])[-1]
        return {**job, "error": f"build failed (rc {p.returncode}): {tail}"[:400]}
    return {**job, **json.loads(lines[-1])}


def time_engine(path: str, batch: int, protocol: bench_timing.Protocol) -> dict[str, Any]:
    import cupy

    import graphc.runtime

    engine = graphc.runtime.load(path)
    x = cupy.asarray(np.random.default_rng(0).standard_normal((batch, 3, 224, 224)).astype(np.float32))
    name = engine.inputs[0].name
    engine.run({name: x})
    cupy.cuda.runtime.deviceSynchronize()
    return {"replay_ms": round(bench_timing.graphc_replay_ms(engine, protocol), 4)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--build", nargs=3, metavar=("BATCH", "TAIL", "OUT"), help=argparse.SUPPRESS)
    p.add_argument("--engines", default="20@1.0,22@1.0,22@0.6")
    p.add_argument("--jobs", type=int, default=4)
    p.add_argument("--work", default="/tmp/conv_tails")
    p.add_argument("--cache-dir", default=None)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--calls", type=int, default=50)
    p.add_argument("--out-md", default=None)
    p.add_argument("--out-json", default=None)
    a = p.parse_args(argv)
    if a.build:
        print(json.dumps(build(int(a.build[0]), float(a.build[1]), a.build[2], a.cache_dir)))
        return 0
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    jobs = []
    for item in a.engines.split(","):
        b, t = item.split("@")
        jobs.append({"batch": int(b), "tail": float(t), "out": str(work / f"resnet_b{b}_t{t}.engine")})
        jobs[-1]["cache_dir"] = a.cache_dir
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=max(1, a.jobs)) as pool:
        results = list(pool.map(_spawn, jobs))
    log.info("built %d engines in %.1f s", len(results), time.perf_counter() - t0)
    protocol = bench_timing.Protocol(a.warmup, a.rounds, a.calls)
    timed: dict[tuple, dict[str, Any]] = {}  # (batch, conv kernels) -> timing: equal plans timed once
    for r in results:
        if "error" in r:
            log.error("b%d t%s: %s", r["batch"], r["tail"], r["error"])
            continue
        same = timed.get((r["batch"], tuple(r["convs"])))
        if same is not None:
            r["replay_ms"], r["same_plan_as"] = same["replay_ms"], same["tail"]
            continue
        try:
            r.update(time_engine(r["out"], r["batch"], protocol))
            timed[(r["batch"], tuple(r["convs"]))] = {"replay_ms": r["replay_ms"], "tail": r["tail"]}
        except Exception as e:  # noqa: BLE001  (the other engines are still timed)
            r["error"] = f"{type(e).__name__}: {e}"[:400]
        log.info("b%d tail %s: %s", r["batch"], r["tail"], r.get("replay_ms", r.get("error")))
        if a.out_json:  # written after each engine: a run cut short keeps what it measured
            Path(a.out_json).write_text(json.dumps(results, indent=1) + "\n")
    if a.out_md:
        ref = {r["batch"]: r.get("replay_ms") for r in results if r["tail"] == 1.0 and r.get("replay_ms")}
        lines = [
            "| batch | TAIL_BASE | replay ms | ms per row | vs TAIL_BASE 1.0 | convs changed vs 1.0 |",
            "| --- | --- | --- | --- | --- | --- |",
        ]
        base = {r["batch"]: r.get("convs") for r in results if r["tail"] == 1.0}
        for r in sorted(results, key=lambda r: (r["batch"], -r["tail"])):
            ms = r.get("replay_ms")
            if ms is None:
                lines.append(f"| {r['batch']} | {r['tail']} | {r.get('error')} | | | |")
                continue
            vs = f"{ms / ref[r['batch']]:.3f}" if ref.get(r["batch"]) else "-"
            b0 = base.get(r["batch"])
            changed = sum(x != y for x, y in zip(b0, r["convs"], strict=False)) if b0 else "-"
            lines.append(f"| {r['batch']} | {r['tail']} | {ms:.4f} | {ms / r['batch']:.4f} | {vs} | {changed} |")
        Path(a.out_md).write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
