"""Count the kernel launches of CUDA engines, per model, exporter and batch, by the kind of step.

    python tools/count_launches.py DIR [--models bert,gpt2,vit,resnet50] [--exporter both]
        [--batch 1,32] [--seq 128] [--arch sm_90] [--precision fp16] [--nvrtc] [--json OUT]
        [--row-norm-epilogues] [--deep-k-cluster]

DIR holds the exports of tools/export_torch.py (NAME.EXPORTER.onnx and NAME.json, whose input
specs give the dims to bind). For each model it runs the compiler's own passes, lowering and code
generation for CUDA (the kernel plan a GPU would replay) and counts, for the given arch, every
launch of every step: a step with a split-K GEMM counts its reduce kernel too. With --nvrtc it runs
the whole `graphc.compile` (NVRTC included; slower, same counts). The table has one row per
(model, exporter, batch): the total, then the launches per step kind (Fused[MatMul], LayerNorm...).
With --by-family it counts by kernel family instead (gemm, rowwise, elementwise...).
--row-norm-epilogues and --deep-k-cluster count the plans of two options that are off by default
(the compile option row_norm_epilogues; gemm_sm90.DEEP_K_CLUSTER: batch-1 K >= 3072 GEMMs as one
cluster instead of the TMA GEMM and its reduce launch).

    python tools/count_launches.py --corpus tests/corpus [--json OUT]

counts every file of the exporter corpus (tests/corpus/manifest.json: fixed input shapes, one row
per file: the model, the exporter with its torch version and ``+ort`` for ONNX Runtime's twin).
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger("count_launches")

EXPORTERS = ("torchscript", "dynamo")


@dataclass
class Count:
    model: str
    exporter: str
    batch: int
    launches: int
    kernels: int  # distinct kernels (sources)
    by_kind: dict[str, int] = field(default_factory=dict)
    by_family: dict[str, int] = field(default_factory=dict)


def input_shapes(spec: dict[str, Any], batch: int, seq: int | None) -> dict[str, int]:
    """The symbolic dims of an export's inputs bound to `batch` (and `seq` for text models)."""
    dims: dict[str, int] = {}
    example = spec.get("example_dims", {})
    for inp in spec["inputs"]:
        for d in inp["shape"]:
            if isinstance(d, str):
                if d == "batch":
                    dims[d] = batch
                elif d == "seq" and seq is not None:
                    dims[d] = seq
                elif d in example:
                    dims[d] = int(example[d])
                else:
                    raise SystemExit(f"input '{inp['name']}': no size for dim '{d}' (give --seq or export it)")
    return dims


def count_plan(plan: Any, arch: str, families: dict[str, str] | None = None) -> tuple[int, dict, dict]:
    """Launches of a complete KernelPlan on `arch`: total, per step kind, per kernel family."""
    by_kind: collections.Counter[str] = collections.Counter()
    by_family: collections.Counter[str] = collections.Counter()
    total = 0
    for step in plan.steps:
        launches = step.launches_for(arch)
        for ln in launches:
            total += 1
            by_kind[step.kind] += 1
            by_family[ln.family] += 1
    return total, dict(by_kind.most_common()), dict(by_family.most_common())


def count_model(
    path: Path, shapes: dict[str, int], *, arch: str, precision: str, nvrtc: bool, row_norm: bool = False
) -> tuple[int, int, dict, dict]:
    import graphc

    if nvrtc:
        engine = graphc.compile(
            str(path), target="cuda", precision=precision, shapes=shapes, arch=[arch], row_norm_epilogues=row_norm
        )
        plan = engine.plan
        return (*_counted(plan, arch, len(engine.kernels.digests_for(arch))),)
    from graphc.codegen.build import complete_plan, generate_for_archs
    from graphc.codegen.capabilities import CUDA
    from graphc.codegen.lower import lower_to_plan
    from graphc.frontend import load_onnx
    from graphc.ir.shapes import bind_shapes
    from graphc.passes.manager import OptimizeOptions, optimize
    from graphc.passes.target import Target

    graph = bind_shapes(load_onnx(str(path)), shapes)
    target = Target("cuda", precision, False, capabilities=CUDA, row_norm_epilogues=row_norm)
    optimized = optimize(graph, OptimizeOptions(opt_level=2, target=target)).graph
    lowered = lower_to_plan(optimized)
    weights = {name: c.data for name, c in optimized.constants.items()}
    kernels = generate_for_archs(lowered, weights, [arch], precision=precision)
    return (*_counted(complete_plan(lowered, kernels), arch, len(kernels.digests_for(arch))),)


def _counted(plan: Any, arch: str, distinct: int) -> tuple[int, int, dict, dict]:
    total, by_kind, by_family = count_plan(plan, arch)
    return total, distinct, by_kind, by_family


def count_corpus(folder: Path, *, arch: str, precision: str) -> list[Count]:
    """One row per file of a corpus folder (its manifest.json gives model, exporter, torch version)."""
    manifest = json.loads((folder / "manifest.json").read_text())
    rows = []
    for key in sorted(manifest):
        rec = manifest[key]
        exporter = f"{rec['exporter']} {rec['torch'].split('+')[0]}" + ("+ort" if "source" in rec else "")
        model = f"{rec['model']} ({rec['attn_implementation']})"
        batch = int(next(iter(rec["inputs"].values()))[0])
        total, distinct, kinds, fams = count_model(
            folder / rec["file"], {}, arch=arch, precision=precision, nvrtc=False
        )
        rows.append(Count(model, exporter, batch, total, distinct, kinds, fams))
        print(f"{key}: {total} launches", file=sys.stderr)
    return rows


def table(rows: list[Count], *, by_family: bool) -> str:
    cols: collections.Counter[str] = collections.Counter()
    for r in rows:
        cols.update(r.by_family if by_family else r.by_kind)
    names = [c for c, _ in cols.most_common()]
    head = ["model", "exporter", "batch", "launches", "kernels", *names]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        per = r.by_family if by_family else r.by_kind
        cells = [
            r.model,
            r.exporter,
            str(r.batch),
            str(r.launches),
            str(r.kernels),
            *(str(per.get(c, 0)) for c in names),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("dir", type=Path, nargs="?", help="folder of tools/export_torch.py exports")
    p.add_argument("--corpus", type=Path, default=None, help="count a corpus folder (manifest.json) instead")
    p.add_argument("--models", default="bert,gpt2,vit,resnet50")
    p.add_argument("--exporter", choices=[*EXPORTERS, "both"], default="both")
    p.add_argument("--batch", default="1,32", help="comma-separated batch sizes")
    p.add_argument("--seq", type=int, default=128, help="sequence length of text models")
    p.add_argument("--arch", default="sm_90")
    p.add_argument("--precision", default="fp16")
    p.add_argument("--nvrtc", action="store_true", help="run the whole graphc.compile, NVRTC included")
    p.add_argument("--by-family", action="store_true", help="columns by kernel family instead of step kind")
    p.add_argument("--json", type=Path, default=None, help="also write the rows as JSON here")
    p.add_argument("--row-norm-epilogues", action="store_true", help="count with the row_norm_epilogues option")
    p.add_argument(
        "--deep-k-cluster", action="store_true", help="count with gemm_sm90.DEEP_K_CLUSTER (one-launch deep K)"
    )
    args = p.parse_args(argv)
    if args.deep_k_cluster:
        from graphc.codegen.families import gemm_sm90

        gemm_sm90.DEEP_K_CLUSTER = True
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    from graphc.errors import CompileError

    if args.corpus is not None:
        try:
            rows = count_corpus(args.corpus, arch=args.arch, precision=args.precision)
        except (CompileError, OSError, KeyError, ValueError) as e:
            print(f"{args.corpus}: {e}", file=sys.stderr)
            return 1
        print(table(rows, by_family=args.by_family))
        if args.json is not None:
            args.json.write_text(json.dumps([r.__dict__ for r in rows], indent=1) + "\n")
        return 0
    if args.dir is None:
        p.error("give DIR (exports) or --corpus FOLDER")
    exporters = EXPORTERS if args.exporter == "both" else (args.exporter,)
    rows: list[Count] = []
    for model in [m for m in args.models.split(",") if m]:
        spec_path = args.dir / f"{model}.json"
        if not spec_path.exists():
            print(f"{model}: no {spec_path} (export it with tools/export_torch.py)", file=sys.stderr)
            return 2
        spec = json.loads(spec_path.read_text())
        for exporter in exporters:
            path = args.dir / f"{model}.{exporter}.onnx"
            if not path.exists():
                print(f"{model}: no {path}; skipped", file=sys.stderr)
                continue
            for batch in [int(b) for b in args.batch.split(",")]:
                shapes = input_shapes(spec, batch, args.seq)
                try:
                    total, distinct, kinds, fams = count_model(
                        path,
                        shapes,
                        arch=args.arch,
                        precision=args.precision,
                        nvrtc=args.nvrtc,
                        row_norm=args.row_norm_epilogues,
                    )
                except CompileError as e:
                    print(f"{path.name} batch {batch}: {e}", file=sys.stderr)
                    return 1
                rows.append(Count(model, exporter, batch, total, distinct, kinds, fams))
                print(f"{model} {exporter} b{batch}: {total} launches", file=sys.stderr)
    print(table(rows, by_family=args.by_family))
    if args.json is not None:
        args.json.write_text(json.dumps([r.__dict__ for r in rows], indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
