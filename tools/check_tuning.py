"""Is `--tune` never slower than untuned, within its budget? (issue 11 item 4, on a GPU)

    python tools/check_tuning.py --models resnet,bert --batch 1,32 --mode fast --json tuning.json

    python tools/export_torch.py --models gpt2,llama --exporter torchscript --out /tmp/ex
    python tools/check_tuning.py --export-dir /tmp/ex --models gpt2,llama --batch 1,32 --seq 128

For each model (fp16) and batch: an untuned engine and a tuned one (a fresh tuning cache, so every
step is timed), then both CUDA graphs replayed interleaved by the same timer the tuner's
whole-graph check uses (a separate measurement from the check's own). A row passes when the tuned
engine is at most 1% slower (the timer's noise) and tuning stayed within its budget plus 10%.
Exit 1 when any row fails.

Models: the zoo's (models/, at --size), or with --export-dir tools/export_torch.py's, read as
DIR/NAME.EXPORTER.onnx (the files export_torch.py --out DIR writes, as tools/bench_torch.py
--export-dir keeps them), with inputs drawn from export_torch's input specs at --batch and --seq.
--dry-run checks the models, inputs and compiles without a GPU: an untuned CPU engine, run once.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # export_torch (numpy only until it exports)

NOISE = 0.01
BUDGET_SLACK = 1.10


def cosine(a: Any, b: Any) -> float:
    import numpy as np

    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    den = float(np.linalg.norm(a) * np.linalg.norm(b))
    return float(a @ b / den) if den else float(np.array_equal(a, b))


@dataclass(frozen=True)
class Source:
    """Where the models come from: the zoo at `size`, or export_torch's files in `export_dir`."""

    size: str = "full"
    export_dir: Path | None = None
    exporter: str = "torchscript"
    seq: int = 128
    tiny: bool = False  # the exports are export_torch.py --tiny's (their inputs' ranges differ)

    def describe(self) -> dict[str, Any]:
        if self.export_dir is None:
            return {"size": self.size}
        return {"export": str(self.export_dir), "exporter": self.exporter, "seq": self.seq, "tiny": self.tiny}

    def load(self, model: str, batch: int) -> tuple[Any, dict[str, Any]]:
        """(the ONNX model or its path, the feeds at this batch)."""
        if self.export_dir is None:
            import models

            m = models.build(model, size=self.size, batch=batch)
            return m, models.sample_inputs(model, m, batch=batch)
        import export_torch
        import numpy as np

        case = export_torch.CASES.get(model)
        if case is None:
            raise ValueError(f"unknown model {model!r}; tools/export_torch.py has {', '.join(export_torch.CASES)}")
        path = self.export_dir / f"{model}.{self.exporter}.onnx"
        if not path.is_file():
            raise FileNotFoundError(
                f"no export {path}: write it with python tools/export_torch.py --models {model} "
                f"--exporter {self.exporter} --out {self.export_dir}"
            )
        if self.tiny:
            case = case.tiny()
        rng = np.random.default_rng(batch)
        dims = {"batch": batch, "seq": self.seq}
        return str(path), {s.name: export_torch._example(s, dims, rng) for s in case.inputs}


def dry_run(model: str, batch: int, source: Source) -> dict[str, Any]:
    """The model, its inputs and an untuned CPU engine that runs them: no GPU, no timing."""
    import numpy as np

    import graphc

    m, feeds = source.load(model, batch)
    row: dict[str, Any] = {"model": model, **source.describe(), "batch": batch, "dry_run": True}
    t0 = time.perf_counter()
    engine = graphc.compile(m, target="cpu", shapes={k: v.shape for k, v in feeds.items()})
    row["compile_s"] = round(time.perf_counter() - t0, 2)
    out = engine.run(feeds)
    row["outputs"] = {k: list(np.shape(v)) for k, v in out.items()}
    row["pass"] = all(np.isfinite(np.asarray(v, np.float64)).all() for v in out.values())
    return row


def check(model: str, batch: int, mode: str, budget_s: float | None, source: Source) -> dict[str, Any]:
    import graphc
    from graphc.codegen.tune_search import budget_seconds
    from graphc.codegen.tuner import graph_replay_ms

    m, feeds = source.load(model, batch)
    shapes = {k: v.shape for k, v in feeds.items()}
    row: dict[str, Any] = {"model": model, **source.describe(), "batch": batch, "mode": mode}
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
    p.add_argument(
        "--export-dir", type=Path, help="tools/export_torch.py's exports (NAME.EXPORTER.onnx) instead of the zoo"
    )
    p.add_argument("--exporter", choices=["torchscript", "dynamo"], default="torchscript", help="with --export-dir")
    p.add_argument("--seq", type=int, default=128, help="sequence length of text models, with --export-dir")
    p.add_argument("--tiny", action="store_true", help="with --export-dir: the exports are export_torch.py --tiny's")
    p.add_argument("--dry-run", action="store_true", help="no GPU: each model's inputs and an untuned CPU engine")
    p.add_argument("--json", help="write the rows here")
    a = p.parse_args(argv)
    source = Source(a.size, a.export_dir, a.exporter, a.seq, a.tiny)
    try:
        batches = [int(b) for b in a.batch.split(",") if b.strip()]
    except ValueError:
        p.error(f"--batch takes integers, got {a.batch!r}")
    rows = []
    for model in [x.strip() for x in a.models.split(",") if x.strip()]:
        for batch in batches:
            try:
                if a.dry_run:
                    rows.append(dry_run(model, batch, source))
                else:
                    rows.append(check(model, batch, a.mode, a.budget_s, source))
            except Exception as e:  # one model's failure is a failed row; the others go on
                rows.append({"model": model, "batch": batch, "pass": False, "error": f"{type(e).__name__}: {e}"})
            r = rows[-1]
            if "error" in r:
                print(f"{model} b{batch}: FAILED {r['error']}", flush=True)
            elif a.dry_run:
                print(f"{model} b{batch}: dry run, CPU engine in {r['compile_s']} s, outputs {r['outputs']}: "
                      f"{'pass' if r['pass'] else 'FAIL (non-finite outputs)'}", flush=True)  # fmt: skip
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
