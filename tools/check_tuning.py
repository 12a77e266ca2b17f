"""Is `--tune` never slower than untuned, within its budget? (issue 11 item 4, on a GPU)

    python tools/check_tuning.py --models resnet,bert --batch 1,32 --mode fast --json tuning.json

For each zoo model (full size, fp16) and batch: an untuned engine and a tuned one (a fresh tuning
cache, so every step is timed), then both CUDA graphs replayed interleaved by the same timer the
tuner's whole-graph check uses (a separate measurement from the check's own). A row passes when the
tuned engine is at most 1% slower (the timer's noise) and tuning stayed within its budget plus 10%.
Exit 1 when any row fails.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

NOISE = 0.01
BUDGET_SLACK = 1.10


def cosine(a: Any, b: Any) -> float:
    import numpy as np

    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    den = float(np.linalg.norm(a) * np.linalg.norm(b))
    return float(a @ b / den) if den else float(np.array_equal(a, b))


def check(model: str, batch: int, mode: str, budget_s: float | None, size: str) -> dict[str, Any]:
    import graphc
    import models
    from graphc.codegen.tune_search import budget_seconds
    from graphc.codegen.tuner import graph_replay_ms

    m = models.build(model, size=size, batch=batch)
    feeds = models.sample_inputs(model, m, batch=batch)
    shapes = {k: v.shape for k, v in feeds.items()}
    row: dict[str, Any] = {"model": model, "size": size, "batch": batch, "mode": mode}
    with tempfile.TemporaryDirectory(prefix="check_tuning_") as cache:
        t0 = time.perf_counter()
        untuned = graphc.compile(m, target="cuda", precision="fp16", shapes=shapes, cache_dir=cache)
        row["untuned_compile_s"] = round(time.perf_counter() - t0, 2)
        t0 = time.perf_counter()
        tuned = graphc.compile(
            m, target="cuda", precision="fp16", shapes=shapes, cache_dir=cache, tune=mode, tune_budget_s=budget_s
        )
        row["tuned_compile_s"] = round(time.perf_counter() - t0, 2)
        rep = tuned.report["tune"]
        row["tune"] = rep
        row["changed_steps"] = len(tuned.report["tuning"])
        u_ms, t_ms = graph_replay_ms([untuned.executor, tuned.executor], rounds=9, calls=20)
        row["untuned_ms"], row["tuned_ms"] = round(u_ms, 4), round(t_ms, 4)
        row["ratio"] = round(t_ms / u_ms, 4)
        fu = {s.name: feeds[s.name].astype(s.dtype) for s in untuned.inputs}
        a, b = untuned.run(fu, to_numpy=True), tuned.run(fu, to_numpy=True)
        row["cosine"] = round(min(cosine(a[k], b[k]) for k in a), 6)
    limit = budget_seconds(mode, budget_s) * BUDGET_SLACK
    row["pass"] = bool(t_ms <= u_ms * (1 + NOISE) and rep["tune_s"] <= limit and row["cosine"] > 0.999)
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="resnet,bert")
    p.add_argument("--batch", default="1,32")
    p.add_argument("--mode", choices=["fast", "full"], default="fast")
    p.add_argument("--budget-s", type=float, default=None, help="--tune-budget-s (default the mode's)")
    p.add_argument("--size", default="full", help="zoo size preset (default full)")
    p.add_argument("--json", help="write the rows here")
    a = p.parse_args(argv)
    try:
        batches = [int(b) for b in a.batch.split(",") if b.strip()]
    except ValueError:
        p.error(f"--batch takes integers, got {a.batch!r}")
    rows = []
    for model in [x.strip() for x in a.models.split(",") if x.strip()]:
        for batch in batches:
            try:
                rows.append(check(model, batch, a.mode, a.budget_s, a.size))
            except Exception as e:  # one model's failure is a failed row; the others go on
                rows.append({"model": model, "batch": batch, "pass": False, "error": f"{type(e).__name__}: {e}"})
            r = rows[-1]
            if "error" in r:
                print(f"{model} b{batch}: FAILED {r['error']}", flush=True)
            else:
                t = r["tune"]
                print(f"{model} b{batch}: untuned {r['untuned_ms']} ms, tuned {r['tuned_ms']} ms (x{r['ratio']}), "
                      f"{r['changed_steps']} steps changed, kept {t['validation']['kept']} "
                      f"({t['validation']['reason']}), tune {t['tune_s']} s, cosine {r['cosine']}: "
                      f"{'pass' if r['pass'] else 'FAIL'}", flush=True)  # fmt: skip
            if a.json:
                Path(a.json).write_text(json.dumps(rows, indent=1, default=str))
    failed = [r for r in rows if not r["pass"]]
    print(f"{len(rows) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
