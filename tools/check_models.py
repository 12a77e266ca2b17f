"""Check models end to end and write a table: load, (interpret,) compile, save, load the engine, run,
compare with ONNX Runtime, and optionally benchmark.

    python tools/check_models.py --zoo tiny --target cpu --interpret
    python tools/check_models.py --exports /path/to/exports --target cuda --precision fp32,fp16 --bench \
        --out docs/models_gpu.md

Exports are NAME.{torchscript,dynamo}.onnx with NAME.json input specs (tools/export_torch.py writes
them); zoo models come from models/.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

import graphc  # noqa: E402
import graphc.runtime  # noqa: E402
import models  # noqa: E402
from graphc.cli import compare_outputs  # noqa: E402


def ort_run(path: str, feeds: dict) -> dict:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    sess = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feeds), strict=True))


def export_inputs(spec_path: Path, batch: int, seq: int, seed: int = 0) -> dict:
    spec = json.loads(spec_path.read_text())
    rng = np.random.default_rng(seed)
    dims = {"batch": batch, "seq": seq}
    feeds = {}
    for i in spec["inputs"]:
        shape = [dims.get(d, d) if isinstance(d, str) else d for d in i["shape"]]
        if i.get("kind") == "int" or i["dtype"].startswith("int"):
            lo, hi = i.get("low", 0), i.get("high", 2)
            a = rng.integers(lo, hi, size=shape).astype(i["dtype"])
            if "mask" in i["name"]:
                a = np.ones(shape, dtype=i["dtype"])
                a[..., shape[-1] * 3 // 4 :] = 0  # some padding
            feeds[i["name"]] = a
        else:
            feeds[i["name"]] = rng.standard_normal(shape).astype(i["dtype"])
    return feeds


def cases(args) -> list[tuple[str, str, dict]]:
    out = []
    if args.zoo:
        tmp = Path(tempfile.mkdtemp(prefix="graphc-zoo-"))
        for name in args.models.split(",") if args.models else models.list_models():
            m = models.build(name, size=args.zoo)
            p = tmp / f"{name}.{args.zoo}.onnx"
            models.save(m, p)
            out.append((f"zoo:{name}.{args.zoo}", str(p), models.sample_inputs(name, m)))
    if args.exports:
        for f in sorted(glob.glob(os.path.join(args.exports, "*.onnx"))):
            base = Path(f).name.split(".")[0]
            if args.models and base not in args.models.split(","):
                continue
            spec = Path(args.exports) / f"{base}.json"
            if not spec.exists():
                continue
            out.append((Path(f).name, f, export_inputs(spec, args.batch, args.seq)))
    return out


def check(label: str, path: str, feeds: dict, args) -> list[dict]:
    rows = []
    shapes = {k: v.shape for k, v in feeds.items()}
    ref = ort_run(path, feeds)
    if args.interpret:
        t0 = time.perf_counter()
        g = graphc.load_onnx(path)
        load_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        out = graphc.interpret(g, feeds)
        ok, lines = compare_outputs(out, ref, "fp32", args.rtol or 1e-4)
        rows.append(
            {
                "model": label,
                "mode": "interpret",
                "ok": ok,
                "details": lines,
                "load_s": round(load_s, 3),
                "run_s": round(time.perf_counter() - t0, 3),
            }
        )
        print(f"{label} interpret: {'OK' if ok else 'MISMATCH'}  " + " | ".join(lines), flush=True)
    for precision in args.precision.split(","):
        row = {"model": label, "mode": f"{args.target}/{precision}"}
        try:
            t0 = time.perf_counter()
            arch = args.arch.split(",") if args.arch else None
            eng = graphc.compile(
                path, target=args.target, precision=precision, shapes=shapes, opt_level=args.opt_level, arch=arch
            )
            row["compile_s"] = round(time.perf_counter() - t0, 2)
            rep = eng.report
            row["optimize_s"] = rep["timings"].get("optimize")
            row["nodes"] = f"{rep['nodes_before']} -> {rep['nodes_after']}"
            row["ops_after"] = rep["ops_after"]
            row["arena_over_lb"] = rep["memory"]["arena_over_lower_bound"]
            row["arena_mib"] = round(rep["memory"]["arena_bytes"] / 2**20, 2)
            with tempfile.TemporaryDirectory() as tmp:
                ep = Path(tmp) / "m.engine"
                eng.save(ep)
                loaded = graphc.runtime.load(ep)
                outs = loaded.run(feeds, to_numpy=True) if args.target == "cuda" else loaded.run(feeds)
                ok, lines = compare_outputs({k: np.asarray(v) for k, v in outs.items()}, ref, precision, args.rtol)
                row["ok"], row["details"] = ok, lines
                if args.bench and args.target == "cuda":
                    from graphc.bench import benchmark

                    b = benchmark(loaded, feeds, iterations=args.iterations, warmup=10)
                    row["latency_ms"] = round(b["latency"]["median_ms"], 4)
                    row["p99_ms"] = round(b["latency"]["p99_ms"], 4)
                    row["device"] = b.get("device")
        except Exception as e:  # recorded, never hidden
            row["ok"] = False
            row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
            if args.debug:
                traceback.print_exc()
        rows.append(row)
        status = "OK" if row.get("ok") else "FAIL"
        print(
            f"{label} {row['mode']}: {status} {row.get('error', '')} {' | '.join(row.get('details', []))}"
            f" arena/LB={row.get('arena_over_lb')} latency={row.get('latency_ms')}",
            flush=True,
        )
    return rows


def write_markdown(rows: list[dict], path: str, args) -> None:
    lines = [
        f"# Model checks ({time.strftime('%Y-%m-%d')})",
        "",
        f"`python tools/check_models.py {' '.join(sys.argv[1:])}`",
        "",
        "| model | mode | ok | nodes | arena MiB | arena / lower bound | latency ms (p99) | error / details |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lat = f"{r['latency_ms']} ({r['p99_ms']})" if "latency_ms" in r else ""
        det = r.get("error") or "; ".join(d.replace("|", "/") for d in r.get("details", []))
        lines.append(
            f"| {r['model']} | {r['mode']} | {'yes' if r.get('ok') else 'NO'} | {r.get('nodes', '')} | "
            f"{r.get('arena_mib', '')} | {r.get('arena_over_lb', '')} | {lat} | {det} |"
        )
    Path(path).write_text("\n".join(lines) + "\n")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--zoo", choices=["tiny", "full"])
    p.add_argument("--exports")
    p.add_argument("--models", help="comma-separated names to keep")
    p.add_argument("--target", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--precision", default="fp32")
    p.add_argument("--opt-level", type=int, default=2)
    p.add_argument("--arch", help="comma-separated CUDA archs to build (default: graphc.compile's)")
    p.add_argument("--interpret", action="store_true")
    p.add_argument("--bench", action="store_true")
    p.add_argument("--iterations", type=int, default=100)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--rtol", type=float)
    p.add_argument("--out", help="markdown table")
    p.add_argument("--json", help="all rows as JSON")
    p.add_argument("--debug", action="store_true")
    args = p.parse_args()
    rows = []
    for label, path, feeds in cases(args):
        rows += check(label, path, feeds, args)
    if args.out:
        write_markdown(rows, args.out, args)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1, default=str))
    bad = [r for r in rows if not r.get("ok")]
    print(f"{len(rows) - len(bad)}/{len(rows)} checks passed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
