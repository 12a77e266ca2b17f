"""Where the GPU time goes: graphc's kernels per step and PyTorch eager's kernels, per model and batch.

    python tools/profile_kernels.py --exports DIR --models bert,vit,gpt2,resnet50 --batch 1,32 --out prof.md

DIR holds tools/export_torch.py's exports (NAME.torchscript.onnx with symbolic dims). graphc: an fp16
engine per batch, every launch of its CUDA graph timed alone (graphc.bench per_kernel), grouped by
kernel. PyTorch: the same model in fp16 eager under torch.profiler, CUDA kernels grouped by name, as
the vendor reference (cuBLAS, cuDNN, flash SDPA) for each kernel family.
"""

from __future__ import annotations

import argparse
import collections
import re
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))


def _family(kernel: str) -> str:
    """A kernel name without the hash and shape suffixes graphc's templates add."""
    return re.sub(r"_[0-9a-f]{8,}$", "", re.sub(r"(_\d+)+$", "", kernel))


def graphc_rows(
    path: Path, feeds: dict[str, np.ndarray], iterations: int, tactics: tuple[str, ...] = ()
) -> tuple[float, list[dict]]:
    import graphc
    from graphc.bench import benchmark

    engine = graphc.compile(str(path), target="cuda", precision="fp16", tactics=tactics,
                            shapes={k: list(v.shape) for k, v in feeds.items()})  # fmt: skip
    feeds = {s.name: feeds[s.name].astype(s.dtype) for s in engine.inputs}
    r = benchmark(engine, feeds, iterations=iterations, warmup=10, per_kernel=True)
    return r["latency"]["median_ms"], r["kernels"]


def torch_rows(
    case: Any, feeds: dict[str, np.ndarray], dims: dict[str, int], compiled: bool = False
) -> tuple[float, dict[str, list]]:
    import torch
    from export_torch import _module
    from torch.profiler import ProfilerActivity, profile

    module = _module(case, 0, "scaled", dims).cuda().half()
    if compiled:  # inductor's kernels (torch.compile mode default), the ones reduce-overhead replays
        module = torch.compile(module, dynamic=False)
    args = []
    for s in case.inputs:
        x = torch.from_numpy(feeds[s.name]).cuda()
        args.append(x.half() if x.is_floating_point() else x)
    with torch.no_grad():
        for _ in range(5):
            module(*args)
        torch.cuda.synchronize()
        reps = 10
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(reps):
                module(*args)
            torch.cuda.synchronize()
    by: dict[str, list] = collections.defaultdict(lambda: [0.0, 0])
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            by[ev.name][0] += ev.device_time / 1000 / reps
            by[ev.name][1] += 1 / reps
    total = sum(v[0] for v in by.values())
    return total, by


def main(argv: list[str] | None = None) -> int:
    from export_torch import CASES, _example

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--exports", type=Path, required=True)
    p.add_argument("--models", default="bert,vit,gpt2,resnet50")
    p.add_argument("--batch", default="1,32")
    p.add_argument("--iterations", type=int, default=30)
    p.add_argument("--top", type=int, default=14)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--tactics", default="", help="graphc compile --tactics (e.g. cublaslt)")
    p.add_argument("--torch-compile", action="store_true", help="profile torch.compile's kernels, not eager's")
    a = p.parse_args(argv)
    tactics = tuple(t for t in a.tactics.split(",") if t)
    torch_side = "torch.compile (mode default)" if a.torch_compile else "PyTorch fp16 eager"
    ours = "graphc fp16 engine" + (f", --tactics {a.tactics}" if tactics else "")
    lines = [f"# Kernel time per model ({ours} vs {torch_side})", ""]
    for name in a.models.split(","):
        case = CASES[name]
        for batch in (int(b) for b in a.batch.split(",")):
            dims = {"batch": batch, "seq": 128}
            rng = np.random.default_rng(0)
            feeds = {s.name: _example(s, dims, rng) for s in case.inputs}
            lines += [f"## {name} batch {batch}", ""]
            try:
                replay, rows = graphc_rows(a.exports / f"{name}.torchscript.onnx", feeds, a.iterations, tactics)
                fam: dict[str, list] = collections.defaultdict(lambda: [0.0, 0, ""])
                for r in rows:
                    f = fam[_family(r["kernel"])]
                    f[0] += r["median_ms"]
                    f[1] += 1
                    f[2] = f[2] or r["step"]
                total = sum(r["median_ms"] for r in rows)
                lines.append(f"graphc: replay {replay:.3f} ms, {len(rows)} launches, sum of kernels alone "
                             f"{total:.3f} ms")  # fmt: skip
                lines += ["", "| graphc kernel | launches | ms | share | first step |"]
                lines.append("| --- | --- | --- | --- | --- |")
                for k, (ms, n, step) in sorted(fam.items(), key=lambda kv: -kv[1][0])[: a.top]:
                    lines.append(f"| {k[:70]} | {n} | {ms:.4f} | {ms / total:.1%} | {step[:50]} |")
                lines += ["", "| graphc step (slowest) | ms | grid | block |", "| --- | --- | --- | --- |"]
                for r in sorted(rows, key=lambda r: -r["median_ms"])[:8]:
                    lines.append(f"| {r['step'][:60]} | {r['median_ms']:.4f} | {r['grid']} | {r['block']} |")
            except Exception as e:
                lines.append(f"graphc failed: {type(e).__name__}: {str(e)[:300]}")
            try:
                ttotal, by = torch_rows(case, feeds, dims, a.torch_compile)
                lines += ["", f"{torch_side}: kernels {ttotal:.3f} ms per call", "",
                          "| torch kernel | per call | ms | share |", "| --- | --- | --- | --- |"]  # fmt: skip
                for k, (ms, n) in sorted(by.items(), key=lambda kv: -kv[1][0])[: a.top]:
                    lines.append(f"| {k[:90]} | {n:.0f} | {ms:.4f} | {ms / ttotal:.1%} |")
            except Exception as e:
                lines.append(f"torch failed: {type(e).__name__}: {str(e)[:300]}")
            lines.append("")
            a.out.write_text("\n".join(lines) + "\n")
            print(f"{name} b{batch} done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
