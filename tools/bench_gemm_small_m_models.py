"""Zoo models at batch 1 on sm_90 with and without the small-M GEMM rules, in one process.

    python tools/bench_gemm_small_m_models.py [--models bert,vit] [--out DIR]

Each model (models.build at full size, batch 1; BERT at 128 tokens, ViT-B/16's 197) is compiled
twice for the local GPU: as the code stands (gemm_sm90.small_m_params decides every GEMM with
M <= 256), and with those rules switched off for the time of one compile (every such GEMM on the
default mma.sync heuristic with one-launch split-K, or the TMA GEMM where K >= 3072: the code before
this change). Both engines run the same inputs; their outputs are compared with each other; time is
the median CUDA-graph replay (graphc.bench.benchmark), plus each GEMM launch alone (per_kernel).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


@contextlib.contextmanager
def small_m_rules(on: bool):
    from graphc.codegen.families import gemm_sm90

    orig = gemm_sm90.small_m
    if not on:
        gemm_sm90.small_m = lambda prob: False
    try:
        yield
    finally:
        gemm_sm90.small_m = orig


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="bert,vit")
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--out", type=Path, default=Path("."))
    a = ap.parse_args(argv)

    import numpy as np

    import graphc
    import models
    from graphc.bench import benchmark

    a.out.mkdir(parents=True, exist_ok=True)
    log = (a.out / "small_m_models.jsonl").open("a")
    for name in [m for m in a.models.split(",") if m]:
        model = models.build(name, size="full", batch=1)
        shapes = {"seq": 128} if name == "bert" else None
        feeds = models.sample_inputs(name, model, seed=0, batch=1, seq=128 if name == "bert" else None)
        res = {}
        for on in (False, True):
            t0 = time.time()
            with small_m_rules(on):
                eng = graphc.compile(model, target="cuda", precision="fp16", shapes=shapes)
            cs = time.time() - t0
            r = benchmark(eng, feeds, iterations=a.iters, warmup=20, per_kernel=True)
            out = {k: np.asarray(v, np.float64) for k, v in eng.run(feeds, to_numpy=True).items()}
            gemm_steps = {s.name for s in eng.plan.steps for ln in s.launches if ln.family == "gemm"}
            forms: dict[str, int] = {}
            for s in eng.plan.steps:
                for ln in s.launches:
                    if ln.family == "gemm" and not ln.params.get("reduce"):
                        p = ln.params
                        f = "cluster" if p.get("CLUSTER") else "serial" if p.get("SERIAL") else p.get("path", "?")
                        forms[f] = forms.get(f, 0) + 1
            ks = r["kernels"]
            res[on] = {
                "replay_ms": r["latency"]["median_ms"],
                "launches": len(ks),
                "gemm_alone_ms": sum(k["median_ms"] for k in ks if k["step"] in gemm_steps),
                "forms": forms,
                "compile_s": cs,
                "out": out,
            }
            print(
                f"{name} b1 rules {'on ' if on else 'off'}: replay {res[on]['replay_ms']:.4f} ms, "
                f"{len(ks)} launches, GEMM launches alone {res[on]['gemm_alone_ms']:.4f} ms, {forms} "
                f"(compile {cs:.0f} s)",
                flush=True,
            )
        diff = max(
            float(
                np.linalg.norm(res[True]["out"][k] - res[False]["out"][k])
                / max(np.linalg.norm(res[False]["out"][k]), 1e-30)
            )
            for k in res[False]["out"]
        )
        print(f"{name}: outputs on/off relative difference {diff:.2e}", flush=True)
        row = {"model": name, "batch": 1, "rel_diff": diff}
        for on in (False, True):
            row["on" if on else "off"] = {k: v for k, v in res[on].items() if k != "out"}
        log.write(json.dumps(row) + "\n")
        log.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
