"""Whole-model latency and accuracy: graphc engines against PyTorch eager and torch.compile, on the
same GPU, the same weights and the same inputs.

    python tools/bench_torch.py --models resnet50,bert --precision fp16 --batch 1 \
        --modes eager,compile,compile-cudagraphs --out docs/results/torch_h200.md --json r.json

Every model comes from tools/export_torch.py (transformers classes, variance-preserving random
weights, seed 0); the PyTorch module is exported with the TorchScript exporter (static shapes) and
compiled by graphc for the GPU's own arch. PyTorch runs the same module, cast to the precision, with
attention through scaled_dot_product_attention (transformers' "sdpa", the fast default) where the
model has attention.

Timing: CUDA events around one inference, median of --iterations after warm-up. graphc is timed as
CUDA-graph replays (graphc.bench); "compile-cudagraphs" is torch.compile(mode="reduce-overhead"),
which also replays CUDA graphs, so those two columns compare like with like. Eager includes
PyTorch's launch overhead, as a user sees it. Accuracy: the cosine similarity of each output to
PyTorch's fp32 output, for graphc and for PyTorch at the same precision. Memory: graphc's arena
against PyTorch's peak allocation above its weights during one inference.

Needs torch and transformers (not graphc's own dependencies). ``--device cpu`` runs eager PyTorch
against graphc's CPU engine (a smoke test of this tool without a GPU).
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import export_torch  # noqa: E402
import numpy as np  # noqa: E402

import graphc  # noqa: E402

log = logging.getLogger("bench_torch")

MODES = ("eager", "compile", "compile-cudagraphs")
TORCH_DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}


@dataclass
class Row:
    model: str
    precision: str
    batch: int
    graphc_ms: float | None = None
    graphc_compile_s: float | None = None
    graphc_arena_mib: float | None = None
    graphc_cosine: float | None = None
    torch_ms: dict[str, float] = field(default_factory=dict)
    torch_setup_s: dict[str, float] = field(default_factory=dict)
    torch_peak_mib: float | None = None
    torch_cosine: float | None = None
    attention: str = ""
    errors: list[str] = field(default_factory=list)


def torch_tf32_off() -> None:
    """PyTorch's defaults allow TF32 in cuDNN convolutions; without --allow-tf32 both sides are fp32."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a = np.asarray(a, dtype=np.float64).ravel()
    b = np.asarray(b, dtype=np.float64).ravel()
    den = np.linalg.norm(a) * np.linalg.norm(b)
    return float(a @ b / den) if den else float(np.array_equal(a, b))


def use_sdpa(module: Any) -> str:
    """Switch transformers' attention to scaled_dot_product_attention (export_torch builds the
    models with the written-out "eager" attention, which exports to plain ONNX ops)."""
    inner = module.model
    if not hasattr(inner.config, "_attn_implementation"):
        return ""
    if hasattr(inner, "set_attn_implementation"):
        try:
            inner.set_attn_implementation("sdpa")
        except Exception as e:  # a model without SDPA support keeps eager attention, and says so
            log.warning("sdpa not available (%s); eager attention", e)
    else:
        inner.config._attn_implementation = "sdpa"
    return inner.config._attn_implementation


def time_ms(fn: Any, iterations: int, warmup: int, device: str, step_marker: Any = None) -> float:
    import torch

    for _ in range(warmup):
        if step_marker:
            step_marker()
        fn()
    if device == "cpu":
        times = []
        for _ in range(max(1, iterations // 10)):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1000)
        return statistics.median(times)
    torch.cuda.synchronize()
    times = []
    for _ in range(iterations):
        if step_marker:
            step_marker()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def first_output(out: Any) -> Any:
    return out[0] if isinstance(out, (tuple, list)) else out


def bench_model(name: str, precision: str, batch: int, args: argparse.Namespace, tmp: Path) -> Row:
    import torch

    case = export_torch.CASES[name]
    dims = {"batch": batch, "seq": args.seq}
    row = Row(name, precision, batch)
    dev = torch.device(args.device)
    module = export_torch._module(case, args.seed, "scaled", dims)
    rng = np.random.default_rng(args.seed)
    feeds = {s.name: export_torch._example(s, dims, rng) for s in case.inputs}

    # graphc: export the module as it is (eager attention, fp32), compile, run, time.
    onnx_path = tmp / f"{name}.onnx"
    t_args = tuple(torch.from_numpy(feeds[s.name]) for s in case.inputs)
    export_torch._export_torchscript(module, case, t_args, onnx_path, True, 17)
    ref32 = None
    try:
        t0 = time.perf_counter()
        arch = None
        if args.device == "cuda":
            major, minor = torch.cuda.get_device_capability()
            arch = [f"sm_{major}{minor}"]
        eng = graphc.compile(
            str(onnx_path), target=args.device, precision=precision, arch=arch, allow_tf32=args.allow_tf32
        )
        row.graphc_compile_s = round(time.perf_counter() - t0, 2)
        row.graphc_arena_mib = round(eng.report["memory"]["arena_bytes"] / 2**20, 2)
        from graphc.bench import benchmark

        outs = eng.run(feeds, to_numpy=True) if args.device == "cuda" else eng.run(feeds)
        graphc_out = np.asarray(outs[case.outputs[0]], dtype=np.float32)
        b = benchmark(eng, feeds, iterations=args.iterations, warmup=args.warmup)
        row.graphc_ms = round(b["latency"]["median_ms"], 4)
    except Exception as e:  # recorded in the table, never hidden
        graphc_out = None
        row.errors.append(f"graphc: {type(e).__name__}: {str(e).splitlines()[0][:200]}")

    # PyTorch: fp32 reference, then the same module in the precision, eager and compiled.
    row.attention = use_sdpa(module)
    module = module.to(dev)
    inputs = {k: torch.from_numpy(v).to(dev) for k, v in feeds.items()}
    with torch.inference_mode():
        ref32 = first_output(module(**inputs)).float().cpu().numpy()
        dtype = getattr(torch, TORCH_DTYPES[precision])
        module = module.to(dtype)
        typed = {k: (v.to(dtype) if v.is_floating_point() else v) for k, v in inputs.items()}
        if args.device == "cuda":
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
        out = first_output(module(**typed)).float().cpu().numpy()
        if args.device == "cuda":
            row.torch_peak_mib = round((torch.cuda.max_memory_allocated() - base) / 2**20, 2)
        row.torch_cosine = round(cosine(ref32, out), 6)
        if graphc_out is not None:
            row.graphc_cosine = round(cosine(ref32, graphc_out), 6)
        for mode in args.modes:
            try:
                t0 = time.perf_counter()
                marker = None
                if mode == "eager":
                    fn = module
                else:
                    torch._dynamo.reset()
                    cmode = "reduce-overhead" if mode == "compile-cudagraphs" else "default"
                    fn = torch.compile(module, mode=cmode)
                    if mode == "compile-cudagraphs":
                        marker = torch.compiler.cudagraph_mark_step_begin
                    for _ in range(3):  # compiles (and records the graphs) outside the timing
                        if marker:
                            marker()
                        fn(**typed)
                    if args.device == "cuda":
                        torch.cuda.synchronize()
                row.torch_setup_s[mode] = round(time.perf_counter() - t0, 2)
                row.torch_ms[mode] = round(
                    time_ms(lambda f=fn: f(**typed), args.iterations, args.warmup, args.device, marker), 4
                )
            except Exception as e:
                row.errors.append(f"torch {mode}: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
    return row


def markdown(rows: list[Row], modes: list[str], argv: list[str]) -> str:
    head = ["model", "precision", "batch", "graphc ms"] + [f"torch {m} ms" for m in modes]
    head += [f"speed-up vs {m}" for m in modes]
    head += ["graphc cos", "torch cos", "graphc arena MiB", "torch peak MiB", "graphc compile s"]
    head += [f"torch {m} setup s" for m in modes if m != "eager"] + ["attention", "errors"]
    lines = [
        f"# graphc against PyTorch ({time.strftime('%Y-%m-%d')})",
        "",
        f"`python tools/bench_torch.py {' '.join(argv)}`",
        "",
        "| " + " | ".join(head) + " |",
        "|" + " --- |" * len(head),
    ]

    def f(v: Any) -> str:
        return "" if v is None else str(v)

    for r in rows:
        cells = [r.model, r.precision, str(r.batch), f(r.graphc_ms)]
        cells += [f(r.torch_ms.get(m)) for m in modes]
        cells += [f"{r.torch_ms[m] / r.graphc_ms:.2f}x" if r.graphc_ms and m in r.torch_ms else "" for m in modes]
        cells += [f(r.graphc_cosine), f(r.torch_cosine), f(r.graphc_arena_mib), f(r.torch_peak_mib)]
        cells += [f(r.graphc_compile_s)] + [f(r.torch_setup_s.get(m)) for m in modes if m != "eager"]
        cells += [r.attention, "; ".join(r.errors).replace("|", "/")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="resnet50,mobilenetv2,bert,vit,gpt2")
    p.add_argument("--precision", default="fp16", help="comma-separated: fp32,fp16,bf16")
    p.add_argument("--batch", default="1", help="comma-separated batch sizes")
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--modes", default=",".join(MODES), help=f"comma-separated PyTorch modes: {', '.join(MODES)}")
    p.add_argument("--iterations", type=int, default=100)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--allow-tf32", action="store_true", help="fp32 matmuls and convs on TF32 tensor cores, in graphc and PyTorch"
    )
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--out", help="markdown table")
    p.add_argument("--json", help="rows as JSON")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if args.allow_tf32:
        import torch

        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    else:
        torch_tf32_off()
    args.modes = [m for m in args.modes.split(",") if m]
    bad = [m for m in args.modes if m not in MODES] + [m for m in args.models.split(",") if m not in export_torch.CASES]
    if bad:
        p.error(f"unknown mode or model: {', '.join(bad)} (models: {', '.join(export_torch.CASES)})")
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            for precision in args.precision.split(","):
                for batch in (int(b) for b in args.batch.split(",")):
                    row = bench_model(name, precision, batch, args, Path(tmp))
                    rows.append(row)
                    print(json.dumps(asdict(row)), flush=True)
                    if args.out:  # rewritten after every row: a run cut short keeps what it measured
                        Path(args.out).write_text(markdown(rows, args.modes, argv))
                    if args.json:
                        Path(args.json).write_text(json.dumps([asdict(r) for r in rows], indent=1))
    failed = [r for r in rows if r.errors]
    print(f"{len(rows) - len(failed)}/{len(rows)} rows without errors")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
