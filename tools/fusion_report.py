"""Fusion coverage: what graphc's CUDA fp16 pipeline fused in each ONNX export, as a Markdown table.

    python tools/fusion_report.py --dir /tmp/exports/tiny [--dir tests/corpus ...] \
        [--ort] [--build] [--md docs/results/fusion_coverage.md] [--json FILE]

Each folder holds exports from tools/export_torch.py (``NAME.EXPORTER.onnx`` beside ``NAME.json``,
whose first checked input shapes are bound) or the corpus of tools/make_corpus.py (its
``manifest.json`` gives the shapes). For every file it optimizes for the CUDA target in fp16
(the pipeline `graphc compile --precision fp16` runs), lowers to the kernel plan and counts:

- attention: graphc Attention nodes after optimization / attention blocks in the file (its
  Softmax nodes plus any ONNX or com.microsoft attention op), and the Softmaxes left over;
- Transposes in the file and left as kernels; kernels in the plan;
- the fused ops LayerNormalization, RMSNormalization, Gelu, RotaryEmbedding (as nodes or inside a
  fused kernel's epilogue), and SiLU as a Sigmoid inside a GEMM epilogue (SwiGLU: gate GEMM with
  x * sigmoid(x) in its epilogue) against the Sigmoids left standalone;
- leftovers that mean a missed fusion: ReduceMean, Pow, Sqrt, Erf, Tanh, Expand, Where, Softmax.

``--ort`` also runs ONNX Runtime's transformer optimizer (onnxruntime.transformers.optimizer) on
every export whose model it knows (bert, distilbert, gpt2, vit, clip_vision, swin), so the table has
rows for files holding com.microsoft Attention / SkipLayerNormalization / FastGelu / BiasGelu.
``--build`` also builds the engine with NVRTC (sm_90 cubin; no GPU needed), so a row says the
fused plan really compiles. A file that fails to optimize gets a row saying where, and the tool
goes on; the exit status is 1 when any did.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import logging
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import onnx

log = logging.getLogger("fusion_report")

MS = "com.microsoft"
ATTENTION_OPS = {"Attention", "MultiHeadAttention", "GroupQueryAttention", "PackedAttention"}
FUSED_OPS = ("LayerNormalization", "RMSNormalization", "Gelu", "RotaryEmbedding")
LEFTOVERS = ("Softmax", "ReduceMean", "Pow", "Sqrt", "Erf", "Tanh", "Expand", "Where")
# ORT transformer optimizer's model_type per tools/export_torch.py model (none for the rest)
ORT_TYPES = {"bert": "bert", "distilbert": "bert", "gpt2": "gpt2", "vit": "vit", "clip_vision": "clip", "swin": "swin"}
# (heads, hidden) the optimizer needs to fuse attention (it finds none with 0, 0 on these exports),
# per config: tools/export_torch.py's tiny and full configs, tools/make_corpus.py's corpus. Swin's
# heads differ per stage, so it gets (0, 0).
ORT_SIZES = {
    "tiny": {"bert": (2, 32), "distilbert": (2, 32), "gpt2": (2, 32), "vit": (2, 32), "clip_vision": (2, 32)},
    "full": {m: (12, 768) for m in ("bert", "distilbert", "gpt2", "vit", "clip_vision")},
    "corpus": {m: (4, 32) for m in ("bert", "distilbert", "gpt2", "vit")},
}


@dataclasses.dataclass
class Export:
    path: Path
    model: str
    config: str  # tiny | full | corpus
    exporter: str  # torchscript | dynamo | ...+ort
    shapes: dict[str, list[int]]
    heads: int = 0
    hidden: int = 0


@dataclasses.dataclass
class Row:
    export: Export
    ok: bool = True
    error: str = ""
    nodes: int = 0
    kernels: int = 0
    attention_present: int = 0
    attention_fused: int = 0
    transposes_in: int = 0
    transposes_left: int = 0
    fused: dict[str, int] = dataclasses.field(default_factory=dict)
    silu_in_epilogue: int = 0
    sigmoid_alone: int = 0
    leftovers: dict[str, int] = dataclasses.field(default_factory=dict)
    contrib_ops: dict[str, int] = dataclasses.field(default_factory=dict)
    built: str = ""  # "", "ok" or the build error
    seconds: float = 0.0


def _exports_of_folder(folder: Path) -> list[Export]:
    found: list[Export] = []
    manifest = folder / "manifest.json"
    data = json.loads(manifest.read_text()) if manifest.exists() else None
    if isinstance(data, dict) and isinstance(data.get("models"), dict):  # tools/make_arch_corpus.py's
        torch = ".".join(data.get("versions", {}).get("torch", "?").split("+")[0].split(".")[:2])
        for name, rec in sorted(data["models"].items()):
            dims = rec.get("example_dims", data.get("example_dims", {}))
            shapes = {i["name"]: [dims.get(d, d) for d in i["shape"]] for i in rec["inputs"]}
            for exporter, res in sorted(rec.get("exports", {}).items()):
                # an export that failed only the exporter's check at a second shape still has a file
                if res.get("file") and (folder / res["file"]).exists():
                    found.append(Export(folder / res["file"], name, f"arch corpus torch {torch}", exporter, shapes))
        return found
    if data is not None:  # tools/make_corpus.py's corpus
        for rec in sorted(data.values(), key=lambda r: r["file"]):
            # an ORT-optimized twin (tools/make_corpus.py --ort-optimize) is marked as such
            exporter = rec["exporter"] + ("+ort" if "source" in rec else "")
            torch = ".".join(rec.get("torch", "?").split("+")[0].split(".")[:2])
            config = f"corpus {rec['attn_implementation']} torch {torch}"
            found.append(Export(folder / rec["file"], rec["model"], config, exporter, rec["inputs"]))
        return found
    for meta_path in sorted(folder.glob("*.json")):
        meta = json.loads(meta_path.read_text())
        if "exports" not in meta:
            continue
        config = "tiny" if "tiny" in meta.get("description", "") else "full"
        for exporter, res in meta["exports"].items():
            if not res.get("ok"):
                log.warning("%s.%s: the export failed, no row", meta["model"], exporter)
                continue
            found.append(Export(folder / res["file"], meta["model"], config, exporter, res["checked_shapes"][0]))
    return found


def _ort_optimized(e: Export, out_dir: Path) -> Export | None:
    """ONNX Runtime's transformer optimizer on the export (its own fusions only: opt_level 0)."""
    model_type = ORT_TYPES.get(e.model)
    if model_type is None:
        return None
    from onnxruntime.transformers.optimizer import optimize_model

    dst = out_dir / f"{e.path.stem}.ort.onnx"
    logging.getLogger("onnxruntime.transformers").setLevel(logging.ERROR)
    opt = optimize_model(str(e.path), model_type=model_type, num_heads=e.heads, hidden_size=e.hidden, opt_level=0)
    opt.save_model_to_file(str(dst))
    return dataclasses.replace(e, path=dst, exporter=e.exporter + "+ort")


def _source_counts(model: onnx.ModelProto) -> tuple[int, collections.Counter]:
    ops: collections.Counter = collections.Counter()
    for n in model.graph.node:
        ops[(n.domain or "", n.op_type)] += 1
    attention = ops[("", "Softmax")] + ops[("", "Attention")] + sum(ops[(MS, o)] for o in ATTENTION_OPS)
    return attention, ops


def _graph_counts(graph: Any) -> tuple[collections.Counter, int, int]:
    """Op counts of the optimized graph, with the epilogue ops of fused nodes counted too; and the
    Sigmoids inside a GEMM's epilogue (SiLU/SwiGLU fused) and those standing alone."""
    ops: collections.Counter = collections.Counter()
    silu = alone = 0
    for n in graph.nodes:
        if n.op == "Fused":
            a = n.attrs
            if a.anchor_op:
                ops[a.anchor_op] += 1
            for ep in a.epilogue:
                ops[ep.op] += 1
                if ep.op == "Sigmoid":
                    if a.anchor_op in ("MatMul", "Gemm"):
                        silu += 1
                    else:
                        alone += 1
        else:
            ops[n.op] += 1
            alone += n.op == "Sigmoid"
    return ops, silu, alone


def measure(e: Export, build: bool) -> Row:
    from graphc.codegen.capabilities import CUDA
    from graphc.codegen.lower import lower_to_plan
    from graphc.frontend import load_onnx
    from graphc.ir.shapes import bind_shapes
    from graphc.passes.manager import OptimizeOptions, optimize
    from graphc.passes.target import Target

    row = Row(e)
    t0 = time.perf_counter()
    try:
        model = onnx.load(str(e.path))
        row.attention_present, src = _source_counts(model)
        row.nodes = len(model.graph.node)
        row.transposes_in = src[("", "Transpose")]
        row.contrib_ops = {op: c for (dom, op), c in sorted(src.items()) if dom == MS}
        graph = bind_shapes(load_onnx(model), e.shapes)
        target = dataclasses.replace(Target("cuda", "fp16", False), capabilities=CUDA)
        optimized = optimize(graph, OptimizeOptions(opt_level=2, target=target)).graph
        plan = lower_to_plan(optimized)
    except Exception as err:  # one bad file must not stop the table; the row says what failed
        row.ok, row.error = False, f"{type(err).__name__}: {str(err).splitlines()[0][:160]}"
        return row
    ops, row.silu_in_epilogue, row.sigmoid_alone = _graph_counts(optimized)
    row.kernels = sum(1 for s in plan.steps if not s.alias)
    row.attention_fused = ops["Attention"]
    row.transposes_left = sum(1 for s in plan.steps if not s.alias and s.op == "Transpose")
    row.fused = {k: ops[k] for k in FUSED_OPS}
    row.leftovers = {k: ops[k] for k in LEFTOVERS if ops[k]}
    if build:
        import graphc

        try:
            graphc.compile(model, target="cuda", precision="fp16", shapes=e.shapes, arch=["sm_90"])
            row.built = "ok"
        except Exception as err:  # the row says the engine did not build, and why
            row.built = f"{type(err).__name__}: {str(err).splitlines()[0][:120]}"
    row.seconds = round(time.perf_counter() - t0, 1)
    return row


def _key(file_name: str, config: str) -> str:
    """Rows of two runs match by file name and kind of config (tiny, full, corpus)."""
    return f"{config.split()[0]}/{file_name}"


def _was(now: str, before: str | None) -> str:
    """`before -> now` where an earlier run (--before) counted otherwise, else `now`."""
    return now if before is None or before == now else f"{before} → {now}"


def markdown(rows: list[Row], title: str, before: dict[str, dict] | None = None) -> str:
    before = before or {}
    lines = [
        f"# {title}",
        "",
        "CUDA target, fp16, opt level 2 (`graphc compile --precision fp16`'s pipeline), counted by "
        "tools/fusion_report.py. attn: graphc Attention nodes / attention blocks in the file; T: "
        "Transposes in the file -> Transpose kernels left; LN, RMS, GELU, RoPE: fused nodes (GELU "
        "inside GEMM epilogues counted); SiLU: Sigmoids in a GEMM epilogue / standing alone; "
        "left: ops that mean a missed fusion." + (" `a → b`: a in the --before run, b now." if before else ""),
        "",
        "| model | config | exporter | nodes | kernels | attn | T | LN | RMS | GELU | RoPE | SiLU | left "
        "| ORT contrib ops |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        e = r.export
        if not r.ok:
            lines.append(f"| {e.model} | {e.config} | {e.exporter} | {r.nodes} | failed: {r.error} |" + " |" * 9)
            continue
        f = r.fused
        left = ", ".join(f"{k} {v}" for k, v in r.leftovers.items()) or "-"
        contrib = ", ".join(f"{k} {v}" for k, v in r.contrib_ops.items()) or "-"
        built = "" if not r.built else (" (built)" if r.built == "ok" else f" (build failed: {r.built})")
        b = before.get(_key(e.path.name, e.config))
        ok_before = b is not None and b.get("ok")
        kernels = _was(str(r.kernels), str(b["kernels"]) if ok_before else ("failed" if b else None))
        attn = _was(f"{r.attention_fused}/{r.attention_present}",
                    f"{b['attention_fused']}/{b['attention_present']}" if ok_before else None)  # fmt: skip
        left_t = _was(str(r.transposes_left), str(b["transposes_left"]) if ok_before else None)
        lines.append(
            f"| {e.model} | {e.config} | {e.exporter} | {r.nodes} | {kernels}{built} | "
            f"{attn} | {r.transposes_in} -> {left_t} | "
            f"{f['LayerNormalization']} | {f['RMSNormalization']} | {f['Gelu']} | {f['RotaryEmbedding']} | "
            f"{r.silu_in_epilogue}/{r.sigmoid_alone} | {left} | {contrib} |"
        )
    return "\n".join(lines) + "\n"


def _heads_and_hidden(e: Export) -> tuple[int, int]:
    return ORT_SIZES.get(e.config.split()[0], {}).get(e.model, (0, 0))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", type=Path, action="append", default=[], help="a folder of exports (repeatable)")
    ap.add_argument("--models", default="", help="only these models (comma-separated)")
    ap.add_argument("--ort", action="store_true", help="also rows for ONNX Runtime's transformer optimizer's output")
    ap.add_argument("--ort-dir", type=Path, default=None, help="where --ort writes its files (default: a temp dir)")
    ap.add_argument("--build", action="store_true", help="also build each engine with NVRTC (sm_90)")
    ap.add_argument("--md", type=Path, default=None, help="write the Markdown table here")
    ap.add_argument("--json", type=Path, default=None, help="write the rows as JSON here")
    ap.add_argument("--title", default="Fusion coverage")
    ap.add_argument("--before", type=Path, action="append", default=[],
                    help="--json of an earlier run (e.g. on main): its counts beside these (repeatable)")  # fmt: skip
    ap.add_argument("--rows", type=Path, action="append", default=[],
                    help="measure nothing: the table of these --json files (repeatable)")  # fmt: skip
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    for noisy in ("graphc", "onnxruntime"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    if not a.dir and not a.rows:
        ap.error("give --dir (measure) or --rows (tabulate earlier runs)")
    exports: list[Export] = []
    for folder in a.dir:
        if not folder.is_dir():
            print(f"error: --dir {folder}: not a folder", file=sys.stderr)
            return 2
        exports += _exports_of_folder(folder)
    wanted = {m for m in a.models.split(",") if m}
    exports = [e for e in exports if not wanted or e.model in wanted]
    rows: list[Row] = []
    ort_dir = a.ort_dir or Path(tempfile.mkdtemp(prefix="fusion_report_"))
    ort_dir.mkdir(parents=True, exist_ok=True)
    for e in exports:
        todo = [e]
        if a.ort and not e.exporter.endswith("+ort"):
            heads, hidden = _heads_and_hidden(e)
            try:
                opt = _ort_optimized(dataclasses.replace(e, heads=heads, hidden=hidden), ort_dir)
            except Exception as err:  # ORT's optimizer failing on a file is a finding, not a crash
                log.warning("%s: ORT's optimizer failed: %s", e.path.name, str(err).splitlines()[0][:160])
                opt = None
            if opt is not None:
                todo.append(opt)
        for x in todo:
            row = measure(x, a.build)
            rows.append(row)
            status = "ok" if row.ok else row.error
            log.info("%s (%s): attn %d/%d, T %d->%d, kernels %d, %s [%.1fs]", x.path.name, x.config,
                     row.attention_fused, row.attention_present, row.transposes_in, row.transposes_left,
                     row.kernels, status, row.seconds)  # fmt: skip
    for path in a.rows:
        for rec in json.loads(path.read_text()):
            e = Export(**{**rec["export"], "path": Path(rec["export"]["path"])})
            rows.append(Row(**{**rec, "export": e}))
    before: dict[str, dict] = {}
    for path in a.before:
        for rec in json.loads(path.read_text()):
            before[_key(Path(rec["export"]["path"]).name, rec["export"]["config"])] = rec
    md = markdown(rows, a.title, before)
    if a.md:
        a.md.parent.mkdir(parents=True, exist_ok=True)
        a.md.write_text(md)
    else:
        print(md)
    if a.json:
        a.json.write_text(json.dumps([dataclasses.asdict(r) | {"export": {**dataclasses.asdict(r.export),
                                      "path": str(r.export.path)}} for r in rows], indent=1) + "\n")  # fmt: skip
    return 0 if all(r.ok for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
