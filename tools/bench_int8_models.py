"""Whole models as int8 CUDA engines against graphc's own fp16 and fp32 engines (issue 13).

    python tools/bench_int8_models.py --models resnet,bert --batch 32 --samples 8 --out int8_models.md

Each model (the zoo's `full` preset) is calibrated on --samples random feeds (the zoo's sample
inputs, --method of graphc/calibrate.py), compiled for the local GPU as int8, fp16 and fp32 engines,
and timed as CUDA graph replays (graphc.bench, median); accuracy is the cosine of the int8 and fp16
outputs to the fp32 engine's on a held-out feed. One run, one GPU, same feeds.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np


def _cos(a, b) -> float:
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def run_model(name: str, batch: int, samples: int, method: str, iterations: int, seq: int, size: str = "full") -> dict:
    import graphc
    import models
    from graphc.bench import benchmark

    m = models.build(name, size=size, batch=batch)
    calib = [models.sample_inputs(name, m, seed=i, batch=batch, seq=seq) for i in range(samples)]
    feeds = models.sample_inputs(name, m, seed=1000, batch=batch, seq=seq)
    shapes = {k: v.shape for k, v in feeds.items()}
    row: dict = {"model": name, "batch": batch, "samples": samples, "method": method}
    outs = {}
    for prec in ("fp32", "fp16", "int8"):
        t0 = time.perf_counter()
        kw = {"calibration_data": calib, "calibration_method": method} if prec == "int8" else {}
        eng = graphc.compile(m, target="cuda", precision=prec, shapes=shapes, **kw)
        row[f"{prec}_compile_s"] = round(time.perf_counter() - t0, 1)
        if prec == "int8":
            q = eng.report["quantization"]
            row["integer_ops"] = q["integer_ops"]
            row["calibration_s"] = q["seconds"]
        typed = {s.name: feeds[s.name].astype(s.dtype) for s in eng.inputs}
        outs[prec] = next(iter(eng.run(typed, to_numpy=True).values()))
        r = benchmark(eng, typed, iterations=iterations, warmup=10)
        row[f"{prec}_ms"] = r["latency"]["median_ms"]
        row["device"] = r["device"]
        del eng
    row["int8_cos"] = _cos(outs["int8"], outs["fp32"])
    row["fp16_cos"] = _cos(outs["fp16"], outs["fp32"])
    row["speedup_vs_fp16"] = row["fp16_ms"] / row["int8_ms"]
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="resnet,bert")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq", type=int, default=128, help="sequence length of the transformers")
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--size", default="full", choices=["tiny", "full"])
    ap.add_argument("--method", default="entropy", choices=["minmax", "entropy", "percentile"])
    ap.add_argument("--iterations", type=int, default=50)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    rows = []
    for name in args.models.split(","):
        row = run_model(name, args.batch, args.samples, args.method, args.iterations, args.seq, args.size)
        rows.append(row)
        print(json.dumps(row, default=str), flush=True)
    dev = rows[0]["device"]
    lines = [
        f"date {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; GPU {dev['name']} (sm_{dev['sm']}); driver "
        f"{dev['driver']}, CUDA runtime {dev['runtime']}; graph replay medians, {args.iterations} iterations; "
        f"int8 calibrated on {args.samples} samples ({args.method})",
        "",
        "| model | batch | fp32 ms | fp16 ms | int8 ms | fp16 / int8 | cos int8 vs fp32 | cos fp16 vs fp32 |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['batch']} | {r['fp32_ms']:.3f} | {r['fp16_ms']:.3f} | {r['int8_ms']:.3f} | "
            f"{r['speedup_vs_fp16']:.2f} | {r['int8_cos']:.5f} | {r['fp16_cos']:.5f} |"
        )
    args.out.write_text("\n".join(lines) + "\n")
    args.out.with_suffix(".json").write_text(json.dumps(rows, indent=1, default=str))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
