"""The TVM-sourced kernels (graphc[tvm]) on a GPU that has no TVM: build here, run there.

The H200 machine has no internet and TVM cannot travel in a run's carry, but an engine needs no
TVM (its kernels are CUDA source and cubin). So:

  build (here, with graphc[tvm]): one small CUDA engine per case of tests/codegen/tvm_cases.py
      (every op and form whose kernels apache-tvm writes), with its feeds and graphc's numpy
      reference outputs, into DIR (NAME.engine + NAME.npz, a few MB in all).
      .venv/bin/python tools/tvm_gpu_check.py build .gpuwork/tvm_engines

  run (on the GPU machine, graphc installed, no TVM): each engine through graphc.runtime.load,
      run, compared with the reference; a Markdown and a JSON table under OUT; exit status 1 if
      any case fails.
      python3 tools/tvm_gpu_check.py run .gpuwork/tvm_engines --out $OUT

The .npz files hold plain arrays (numpy.load with allow_pickle=False).
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
# rtol, and atol relative to max(1, |reference|.max()): float32 kernels against a float64-free
# numpy reference (DFT sums of up to 16 terms)
TOLERANCE = {"float32": (1e-4, 1e-4), "float64": (1e-10, 1e-10)}


def build(folder: Path, archs: list[str], names: list[str] | None) -> int:
    sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "codegen")]
    from tvm_cases import CASES

    import graphc

    folder.mkdir(parents=True, exist_ok=True)
    chosen = names or list(CASES)
    unknown = [n for n in chosen if n not in CASES]
    if unknown:
        print(f"unknown case(s): {', '.join(unknown)}; known: {', '.join(CASES)}", file=sys.stderr)
        return 2
    for name in chosen:
        t0 = time.perf_counter()
        model, feeds = CASES[name]()
        graph = graphc.load_onnx(model)
        ref = graphc.interpret(graph, feeds)
        engine = graphc.compile(model, target="cuda", arch=archs, opt_level=0)
        if "tvm" not in engine.report:
            print(f"{name}: no step took apache-tvm's kernels ({engine.report['cuda']['families']})", file=sys.stderr)
            return 1
        engine.save(folder / f"{name}.engine")
        arrays = {f"in__{k}": v for k, v in feeds.items()}
        arrays.update({f"ref__{v.name}": np.asarray(ref[v.name]) for v in graph.outputs})
        np.savez(folder / f"{name}.npz", **arrays)
        print(f"{name}: {engine.report['tvm']['kernels']} TVM kernel(s), {time.perf_counter() - t0:.1f} s")
    total = sum(p.stat().st_size for p in folder.iterdir())
    print(f"{len(chosen)} engines in {folder} ({total / 1e6:.1f} MB)")
    return 0


def _compare(got: np.ndarray, want: np.ndarray) -> tuple[bool, float]:
    if got.shape != want.shape or got.dtype != want.dtype:
        return False, float("inf")
    if want.dtype.kind in "iub":
        return bool(np.array_equal(got, want)), float(np.count_nonzero(got != want))
    rtol, atol = TOLERANCE.get(want.dtype.name, (1e-3, 1e-3))
    scale = max(1.0, float(np.abs(want).max())) if want.size else 1.0
    err = float(np.abs(got.astype(np.float64) - want).max()) if want.size else 0.0
    ok = bool(np.allclose(got, want, rtol=rtol, atol=atol * scale, equal_nan=True))
    return ok, err


def run(folder: Path, out: Path) -> int:
    from graphc.runtime import load

    out.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    for path in sorted(folder.glob("*.engine")):
        name = path.stem
        row: dict[str, Any] = {"case": name}
        try:
            with np.load(folder / f"{name}.npz", allow_pickle=False) as z:
                feeds = {k[4:]: z[k] for k in z.files if k.startswith("in__")}
                refs = {k[5:]: z[k] for k in z.files if k.startswith("ref__")}
            engine = load(path)
            got = engine.run(feeds, to_numpy=True)  # host arrays: the CUDA engine returns device arrays by default
            results = [(o, *_compare(np.asarray(got[o]), refs[o])) for o in refs]
            row["ok"] = all(ok for _, ok, _ in results)
            row["max_abs_err"] = max(err for _, _, err in results)
            row["outputs"] = {o: {"ok": ok, "max_abs_err": err} for o, ok, err in results}
        except Exception as e:  # noqa: BLE001 - one failing case is a row of the table, not the end
            row.update(ok=False, error=f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}")
        rows.append(row)
        print(f"{name}: {'ok' if row['ok'] else 'FAIL'} {row.get('max_abs_err', row.get('error'))}")
    info = _machine()
    (out / "tvm_gpu_check.json").write_text(json.dumps({"machine": info, "cases": rows}, indent=1))
    passed = sum(1 for r in rows if r["ok"])
    lines = [
        "# TVM-sourced kernels on the GPU (tools/tvm_gpu_check.py run)",
        "",
        f"{info['date']}, {info['gpu']}, driver {info['driver']}, Python {info['python']}, numpy {info['numpy']}",
        "",
        f"{passed} of {len(rows)} cases match graphc's numpy reference.",
        "",
        "| case | result | max abs error |",
        "| --- | --- | --- |",
    ]
    for r in rows:
        err = f"{r['max_abs_err']:.3g}" if "max_abs_err" in r else r.get("error", "")
        lines.append(f"| {r['case']} | {'ok' if r['ok'] else 'FAIL'} | {err} |")
    (out / "tvm_gpu_check.md").write_text("\n".join(lines) + "\n")
    print(f"{passed} of {len(rows)} cases match")
    return 0 if rows and passed == len(rows) else 1


def _machine() -> dict[str, str]:
    gpu = driver = "?"
    try:
        q = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        gpu, driver = (s.strip() for s in q.stdout.splitlines()[0].split(","))
    except Exception:  # noqa: BLE001 - the table still says what it can
        pass
    return {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "gpu": gpu,
        "driver": driver,
        "python": platform.python_version(),
        "numpy": np.__version__,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="engines, feeds and references (needs graphc[tvm])")
    b.add_argument("folder", type=Path)
    b.add_argument("--arch", default="sm_90", help="comma-separated archs (default sm_90, the H200)")
    b.add_argument("--case", action="append", help="only these cases (repeatable)")
    r = sub.add_parser("run", help="load, run and compare each engine (needs a GPU, not TVM)")
    r.add_argument("folder", type=Path)
    r.add_argument("--out", type=Path, required=True)
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    if a.cmd == "build":
        return build(a.folder, [s.strip() for s in a.arch.split(",") if s.strip()], a.case)
    if not a.folder.is_dir():
        print(f"{a.folder}: no such folder (run `build` first)", file=sys.stderr)
        return 2
    return run(a.folder, a.out)


if __name__ == "__main__":
    sys.exit(main())
