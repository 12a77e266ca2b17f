"""Stage-by-stage checks of model corpora for tools/check_models.py (--arch-corpus, --test-corpus, --trained).

A corpus is a list of Items (a file, its inputs, the reference outputs where they were stored) and the
rows of exports that failed before there was a file. check_item runs the stages asked for on one item
and returns its row; run_items runs each item in its own process (`check_models.py --only KEY`), so a
crash or a hang is that model's row and not the end of the run; write_markdown writes the table.

Stages: interpret (graphc.interpret), cpu (the CPU engine, saved and loaded), cpu-shape2 (the CPU engine
compiled at a second shape of a file with symbolic dims, against ONNX Runtime at that shape), cuda-check
(`graphc check --target cuda`), cuda-compile and cuda-compile-fp16 (NVRTC, no GPU needed), cuda-fp32
and cuda-fp16 (the CUDA engine run on a GPU). The interpreter and the CPU engine pass within 1e-4 of
the reference's scale (max |reference|), CUDA fp32 within 1e-3, fp16 at cosine >= 0.999 with no non-finite values.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

STAGES = ("interpret", "cpu", "cpu-shape2", "cuda-check", "cuda-compile", "cuda-compile-fp16", "cuda-fp32",
          "cuda-fp16")  # fmt: skip
CPU_STAGES = ("interpret", "cpu", "cuda-check", "cuda-compile", "cuda-compile-fp16")
TOL = {"interpret": 1e-4, "cpu": 1e-4, "cuda-fp32": 1e-3}


@dataclasses.dataclass
class Item:
    key: str  # "arch:NAME.EXPORTER", "corpus:KEY", "trained:NAME"
    path: str
    source: str  # arch-corpus | tests/corpus | trained
    model: str
    family: str = ""
    exporter: str = ""
    feeds: dict[str, np.ndarray] | None = None
    ref: dict[str, np.ndarray] | None = None  # None: ONNX Runtime runs here
    feeds2: dict[str, np.ndarray] | None = None  # a second shape of a file with symbolic dims (ORT runs here)
    export_error: str = ""  # the export failed: a row with no file
    note: str = ""


def _load_npz(path: Path) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    with np.load(path, allow_pickle=False) as z:  # arrays only: a data file never carries code
        feeds = {k[3:]: z[k] for k in z.files if k.startswith("in.")}
        ref = {k[4:]: z[k] for k in z.files if k.startswith("out.")}
    return feeds, ref


def arch_items(folder: str, load: bool = True) -> list[Item]:
    """tools/make_arch_corpus.py's folder: one item per model and exporter, failed exports included."""
    root = Path(folder)
    manifest = json.loads((root / "manifest.json").read_text())
    items = []
    for name, rec in sorted(manifest["models"].items()):
        for exporter, x in rec["exports"].items():
            it = Item(f"arch:{name}.{exporter}", str(root / x.get("file", f"{name}.{exporter}.onnx")), "arch-corpus",
                      name, rec.get("family", ""), exporter)  # fmt: skip
            npz = root / x["npz"] if x.get("npz") else None
            if npz is not None and npz.exists():
                if load:
                    it.feeds, it.ref = _load_npz(npz)
                if not x["ok"]:  # ORT ran (its outputs are the reference) but then failed a check
                    it.note = _ort_note(x["error"], it.feeds if load else None)
            elif not x["ok"]:
                it.export_error = f"{x.get('stage', 'export')}: {x['error']}"
            else:
                it.export_error = f"{npz} is missing"
            if load and not rec.get("static", True) and not it.export_error:
                it.feeds2 = _second_shape(rec)
            items.append(it)
    return items


def _second_shape(rec: dict) -> dict[str, np.ndarray]:
    """Inputs at make_arch_corpus's second shape (batch + 1, a shorter sequence), from the manifest's
    input specs, drawn as export_torch draws them."""
    import export_torch

    ex = rec["example_dims"]
    dims = {"batch": ex.get("batch", 1) + 1, "seq": ex.get("seq", 16) // 2 + 3}
    rng = np.random.default_rng(rec.get("seed", 0) + 7)
    return {s["name"]: export_torch._example(export_torch.InputSpec(**s), dims, rng) for s in rec["inputs"]}


def _ort_note(error: str, feeds: dict[str, np.ndarray] | None) -> str:
    """make_arch_corpus checks ONNX Runtime against PyTorch at the stored inputs first, then at a second
    shape (batch + 1, a shorter sequence); an error that names other shapes than the stored ones came
    from the second: the export holds a fixed size where the model has a symbolic one."""
    stored = feeds and all(f"'{k}': {tuple(v.shape)}" in error for k, v in feeds.items())
    if feeds and "inputs {" in error and not stored:
        return f"ORT matches PyTorch at the stored inputs, not at a second shape (a size fixed in the export): {error}"
    if "for the following indices" in error or "out of data bounds" in error:
        return f"ORT runs the stored inputs, fails at a second shape (a size fixed in the export): {error}"
    return f"ORT vs PyTorch: {error}"


def test_corpus_items(folder: str) -> list[Item]:
    """tests/corpus (tools/make_corpus.py's committed exports): inputs made as make_corpus makes them."""
    import make_corpus

    root = Path(folder)
    manifest = json.loads((root / "manifest.json").read_text())
    items = []
    for key, rec in sorted(manifest.items()):
        case = make_corpus.CASES.get(rec["model"])
        # the key (model, attention, exporter, torch tag) names the row; several share a model
        it = Item(f"corpus:{key}", str(root / rec["file"]), "tests/corpus", key, rec["model"],
                  rec.get("exporter", "") + (".ort" if "source" in rec else ""))  # fmt: skip
        feeds = case.inputs(np.random.default_rng(0)) if case else {}
        if case is None or {k: list(v.shape) for k, v in feeds.items()} != rec["inputs"]:
            it.export_error = f"make_corpus makes no inputs of shapes {rec['inputs']} for {rec['model']}"
        else:
            it.feeds = feeds
        items.append(it)
    return items


def trained_items(folder: str, batch: int, seq: int) -> list[Item]:
    """A tools/fetch_trained_models.py folder: NAME.onnx + NAME.json."""
    from check_models import export_inputs

    items = []
    for f in sorted(Path(folder).glob("*.onnx")):
        spec = f.with_suffix(".json")
        if spec.exists():
            note = json.loads(spec.read_text()).get("note", "")
            items.append(Item(f"trained:{f.stem}", str(f), "trained", f.stem, "trained", "", note=note,
                              feeds=export_inputs(spec, batch, seq)))  # fmt: skip
    return items


def _first_line(e: BaseException) -> str:
    return f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:240]}"


def _compare(outs: dict, ref: dict, precision: str, rtol: float | None) -> tuple[bool, str]:
    from graphc.cli import compare_outputs

    ok, lines = compare_outputs({k: np.asarray(v) for k, v in outs.items()}, ref, precision, rtol)
    worst = 0.0
    for line in lines:  # "name: max abs err A, max rel err R (scale S), cosine C  OK"
        if "max rel err " in line:
            worst = max(worst, float(line.split("max rel err ")[1].split(" ")[0]))
    bad = [x for x in lines if not x.endswith("OK")]
    return ok, f"rel {worst:.1e}" + (f"; {bad[0][:200]}" if bad else "")


def check_item(it: Item, stages: list[str], arch: list[str], opt_level: int = 2, debug: bool = False) -> dict:
    """The stages asked for on one item; a failed stage records its one-line error, later stages that
    do not need it still run (the CUDA stages need only the file)."""
    import graphc
    import graphc.runtime

    row: dict[str, Any] = {"key": it.key, "model": it.model, "source": it.source, "family": it.family,
                           "exporter": it.exporter, "note": it.note}  # fmt: skip
    if it.export_error:
        row["export"] = False
        row["error"] = f"export: {it.export_error}"
        return row
    row["export"] = True
    feeds = it.feeds or {}
    shapes = {k: v.shape for k, v in feeds.items()}
    ref = it.ref
    if ref is None:
        try:
            from check_models import ort_run

            ref = ort_run(it.path, feeds)
        except Exception as e:  # ONNX Runtime itself does not run it: not graphc's failure
            row["error"] = f"ONNX Runtime: {_first_line(e)}"
            return row

    def stage(name: str, fn: Any) -> None:
        t0 = time.perf_counter()
        try:
            ok, detail = fn()
            row[name] = ok
            if detail:
                row[f"{name}_detail"] = detail
        except Exception as e:  # recorded, never hidden
            row[name] = False
            row[f"{name}_detail"] = _first_line(e)
            if debug:
                traceback.print_exc()
        row[f"{name}_s"] = round(time.perf_counter() - t0, 2)

    def interpret() -> tuple[bool, str]:
        return _compare(graphc.interpret(graphc.load_onnx(it.path), feeds), ref, "fp32", TOL["interpret"])

    def engine(target: str, precision: str, rtol: float | None) -> tuple[bool, str]:
        eng = graphc.compile(it.path, target=target, precision=precision, shapes=shapes, opt_level=opt_level,
                             arch=arch if target == "cuda" and arch else None)  # fmt: skip
        with tempfile.TemporaryDirectory() as tmp:
            ep = Path(tmp) / "m.engine"
            eng.save(ep)
            loaded = graphc.runtime.load(ep)
            outs = loaded.run(feeds, to_numpy=True) if target == "cuda" else loaded.run(feeds)
        return _compare(outs, ref, precision, rtol)

    def shape2(ref2: dict) -> tuple[bool, str]:
        feeds2 = it.feeds2 or {}
        eng = graphc.compile(it.path, target="cpu", shapes={k: v.shape for k, v in feeds2.items()},
                             opt_level=opt_level)  # fmt: skip
        return _compare(eng.run(feeds2), ref2, "fp32", TOL["cpu"])

    def cuda_check() -> tuple[bool, str]:
        from graphc.support import check_model

        rep = check_model(it.path, target="cuda", shapes=shapes)
        return rep.supported, "; ".join(f.line()[:200] for f in rep.findings[:3])

    def cuda_compile(precision: str) -> tuple[bool, str]:
        eng = graphc.compile(it.path, target="cuda", precision=precision, shapes=shapes, opt_level=opt_level,
                             arch=arch or ["sm_90"])  # fmt: skip
        return True, f"{eng.report['cuda']['launches']} launches"

    for name in stages:
        if name == "interpret":
            stage(name, interpret)
        elif name == "cpu":
            stage(name, lambda: engine("cpu", "fp32", TOL["cpu"]))
        elif name == "cpu-shape2":
            if it.feeds2 is None:
                continue  # a static export (or no symbolic dims): nothing to bind differently
            try:
                from check_models import ort_run

                ref2 = ort_run(it.path, it.feeds2)
            except Exception as e:  # the export fixed a size; ORT fails too, so there is nothing to compare
                row["cpu-shape2_detail"] = f"not checked: ONNX Runtime fails at this shape: {_first_line(e)[:120]}"
                continue
            stage(name, lambda r=ref2: shape2(r))
        elif name == "cuda-check":
            stage(name, cuda_check)
        elif name == "cuda-compile":
            stage(name, lambda: cuda_compile("fp32"))
        elif name == "cuda-compile-fp16":
            stage(name, lambda: cuda_compile("fp16"))
        elif name == "cuda-fp32":
            stage(name, lambda: engine("cuda", "fp32", TOL["cuda-fp32"]))
        elif name == "cuda-fp16":
            stage(name, lambda: engine("cuda", "fp16", None))
    if "cuda-check" in row:  # `graphc check` must never say supported for a model whose compile fails
        compiled = None
        if "cuda-compile" in row:
            compiled = bool(row["cuda-compile"])
        elif "cuda-fp32" in row:  # on a GPU: compiled and ran, whether or not the numbers matched
            compiled = bool(row["cuda-fp32"]) or row.get("cuda-fp32_detail", "").startswith("rel ")
        if compiled is not None:
            row["check_agrees"] = bool(row["cuda-check"]) == compiled
    return row


def run_items(
    items: list[Item], argv: list[str], jobs: int, timeout_s: int, deadline_s: float | None = None
) -> list[dict]:
    """Each item in its own process (`check_models.py ARGV --only KEY --part FILE`), `jobs` at a time.
    Past `deadline_s` seconds from now no item starts (its row says so) and running ones are stopped,
    so that a time-boxed session still writes its table."""
    end = time.monotonic() + deadline_s if deadline_s else None
    here = Path(__file__).resolve().parent
    tmp = Path(tempfile.mkdtemp(prefix="graphc-corpus-"))
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}

    def one(it: Item) -> dict:
        if it.export_error:
            return check_item(it, [], [])
        part = tmp / f"{abs(hash(it.key))}.json"
        cmd = [sys.executable, str(here / "check_models.py"), *argv, "--only", it.key, "--part", str(part)]
        t0 = time.perf_counter()
        limit = timeout_s if end is None else min(timeout_s, int(end - time.monotonic()))
        if limit <= 0:
            return _failed_row(it, "not run: the session's time was spent")
        try:
            proc = run_group(cmd, env, limit)
            if part.exists():
                row = json.loads(part.read_text())
            else:
                tail = (proc.stderr.strip().splitlines() or [""])[-1][:200]
                row = _failed_row(it, f"checker rc {proc.returncode}: {tail}")
        except subprocess.TimeoutExpired:
            row = _failed_row(it, f"checker ran past {limit} s")
        row["wall_s"] = round(time.perf_counter() - t0, 1)
        print(summary_line(row), flush=True)
        return row

    with ThreadPoolExecutor(max(1, jobs)) as pool:
        return list(pool.map(one, items))


def run_group(cmd: list[str], env: dict[str, str], timeout_s: float) -> subprocess.CompletedProcess:
    """subprocess.run in a session of its own: on timeout the whole group goes (the compiler's worker
    processes too, which would outlive a killed parent), then TimeoutExpired is raised."""
    import signal

    with subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          start_new_session=True) as proc:  # fmt: skip
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def _failed_row(it: Item, error: str) -> dict:
    return {"key": it.key, "model": it.model, "source": it.source, "family": it.family, "exporter": it.exporter,
            "export": True, "error": error}  # fmt: skip


def summary_line(row: dict) -> str:
    marks = " ".join(f"{s}={'ok' if row[s] else 'FAIL'}" for s in STAGES if s in row)
    why = "; ".join(f"{s}: {row[s + '_detail']}" for s in STAGES if s in row and not row[s] and row.get(s + "_detail"))
    return f"{row['key']}: {marks} {row.get('error', '')} {why}".rstrip()


def _cell(row: dict, stage: str) -> str:
    if stage not in row:
        return "-"
    if row[stage]:
        d = row.get(f"{stage}_detail", "")
        return "yes" + (f" ({d.split(';')[0]})" if d.startswith("rel ") else "")
    return "NO"


def stops(row: dict) -> str:
    """The first reason each failed stage gives, one line."""
    parts = [row["error"]] if row.get("error") else []
    parts += [f"{s}: {row.get(s + '_detail', '')}" for s in STAGES if s in row and not row[s]]
    parts += [f"{s}: {row[s + '_detail']}" for s in STAGES if s not in row and row.get(s + "_detail")]  # skipped
    if row.get("note"):
        parts.append(f"note: {row['note']}")
    return "; ".join(parts).replace("|", "/").replace("\n", " ")[:400]


def counts(rows: list[dict], stages: list[str]) -> dict[str, dict[str, int]]:
    """Per source and stage: passed and run."""
    out: dict[str, dict[str, int]] = {}
    for source in sorted({r["source"] for r in rows}):
        rs = [r for r in rows if r["source"] == source]
        c = {"rows": len(rs), "exported": sum(bool(r.get("export")) for r in rs)}
        for s in stages:
            c[f"{s}_ok"] = sum(bool(r.get(s)) for r in rs)
            c[f"{s}_run"] = sum(s in r for r in rs)
        if any("check_agrees" in r for r in rs):
            c["check_agrees"] = sum(bool(r.get("check_agrees")) for r in rs)
            c["check_compared"] = sum("check_agrees" in r for r in rs)
        out[source] = c
    return out


def write_markdown(rows: list[dict], stages: list[str], path: str, header: list[str]) -> None:
    lines = [*header, ""]
    for source, c in counts(rows, stages).items():
        per = ", ".join(f"{s} {c[f'{s}_ok']}/{c[f'{s}_run']}" for s in stages)
        agree = ""
        if "check_agrees" in c:
            agree = f", check agrees with the compile {c['check_agrees']}/{c['check_compared']}"
        lines.append(f"- **{source}**: {c['rows']} rows, exported {c['exported']}/{c['rows']}; {per}{agree}.")
    lines += ["", "| model | family | exporter | " + " | ".join(stages) + " | what stops it |",
              "| --- | --- | --- | " + " | ".join("---" for _ in stages) + " | --- |"]  # fmt: skip
    for r in rows:
        exp = r.get("exporter", "")
        cells = " | ".join(_cell(r, s) if r.get("export") else "-" for s in stages)
        lines.append(f"| {r['model']} | {r.get('family', '')} | {exp} | {cells} | {stops(r)} |")
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text("\n".join(lines) + "\n")
