"""Benchmark graphc's attention kernels against torch.nn.functional.scaled_dot_product_attention
in the same run, on the same GPU: torch through each SDPA backend it has for the case (flash,
efficient, cudnn, math; one that raises is skipped), the best of them the reference.

    python tools/bench_attention.py              # BERT-base, GPT-2 and a long-context case, fp16
    python tools/bench_attention.py --quick      # BERT-base seq 128/512 and GPT-2, fewer iterations
    python tools/bench_attention.py --done-when  # issue 10's cases: BERT s128, ViT s197, GPT-2 causal s128, b1 / b32
    python tools/bench_attention.py --tune       # also time every candidate of the search space
    python tools/bench_attention.py --sweep      # also time every tile of the sm_90 wgmma kernel
    python tools/bench_attention.py --shape 8x12x512x64 --causal --dtype bf16

graphc's kernels: "flash" (mma.sync, what every arch but sm_90 runs) and, on an sm_90 GPU, "sm90"
(wgmma, what an sm_90 plan runs where it applies), each with its default parameters.

Both sides read (batch, heads, seq, head_dim) tensors (graphc's 4-D Attention form, torch's own
layout). Times are CUDA-event medians over many replays of a CUDA graph of launches (so host
launch cost is not timed), each launch reading another of several input sets (together larger than
L2). Each graphc kernel's output is checked against an fp32 reference before its time is reported.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# (name, batch, heads, seq, head_dim, causal)
DEFAULT_CASES = [
    ("bert-base s128", 8, 12, 128, 64, False),
    ("bert-base s512", 8, 12, 512, 64, False),
    ("gpt2 s1024 causal", 8, 12, 1024, 64, True),
    ("gpt2 s1024 causal b1", 1, 12, 1024, 64, True),
    ("llama-ish s2048 d128 causal", 2, 32, 2048, 128, True),
    ("d128 s4096", 1, 16, 4096, 128, False),
]
QUICK_CASES = DEFAULT_CASES[:3]
# issue 10's done-when: graphc >= the best torch SDPA backend at these, fp16, on an H200
DONE_WHEN_CASES = [
    (name, b, 12, s, 64, causal)
    for name, s, causal in (("bert s128", 128, False), ("vit s197", 197, False), ("gpt2 s128 causal", 128, True))
    for b in (1, 32)
]
TORCH_BACKENDS = ("flash", "efficient", "cudnn", "math")
TORCH_DTYPES = {"fp16": "float16", "bf16": "bfloat16"}


def parse_shape(s: str) -> tuple[str, int, int, int, int]:
    b, h, n, d = (int(x) for x in s.lower().split("x"))
    return (s, b, h, n, d)


def problem_context(mode: str, b: int, h: int, s: int, d: int, causal: bool, params: dict[str, Any] | None):
    """The one-step plan of a case (no GPU needed)."""
    from graphc.codegen.families.attention import standalone_context
    from graphc.ir.types import DType
    from graphc.ops.registry import get_op

    dtype = {"fp16": DType.float16, "bf16": DType.bfloat16}[mode]
    attrs = get_op("Attention").attrs(scale=d**-0.5, is_causal=int(causal))
    return standalone_context("Attention", [((b, h, s, d), dtype)] * 3, attrs, params=params)


def precompile(jobs: list[tuple[str, tuple, dict[str, Any] | None]], arch: str) -> None:
    """NVRTC for every (mode, case, params) at once, in parallel, into the kernel cache that
    Runner.build then reads (one compile at a time there would dominate a sweep's time)."""
    from graphc.codegen.kernel import family_for
    from graphc.codegen.nvrtc import CompileJob, compile_all

    todo = []
    for mode, case, params in jobs:
        ctx = problem_context(mode, *case, params)
        try:
            todo += [
                CompileJob(k.name, k.source, k.params.get("requires_arch") or arch)
                for k in family_for(ctx).generate(ctx)
            ]
        except Exception as e:  # noqa: BLE001  (reported again when the candidate is built)
            print(f"  does not render: {params}: {str(e)[:200]}")
    compile_all(todo)


class Runner:
    """Builds, loads and times one attention problem, graphc's kernel and torch's."""

    def __init__(self, mode: str, b: int, h: int, s: int, d: int, causal: bool):
        import torch

        from graphc.ir.types import DType

        self.torch = torch
        self.mode, self.b, self.h, self.s, self.d, self.causal = mode, b, h, s, d, causal
        self.dtype = {"fp16": DType.float16, "bf16": DType.bfloat16}[mode]
        tdt = getattr(torch, TORCH_DTYPES[mode])
        per_set = 3 * b * h * s * d * 2
        self.sets = max(2, min(16, -(-3 * 64 * 2**20 // per_set)))
        g = torch.Generator(device="cuda").manual_seed(0)

        def rnd():
            return torch.randn((b, h, s, d), generator=g, device="cuda", dtype=torch.float32).to(tdt)

        self.q = [rnd() for _ in range(self.sets)]
        self.k = [rnd() for _ in range(self.sets)]
        self.v = [rnd() for _ in range(self.sets)]
        self.out = torch.empty((b, h, s, d), device="cuda", dtype=tdt)
        self.scale = d**-0.5

    def context(self, params: dict[str, Any] | None):
        return problem_context(self.mode, self.b, self.h, self.s, self.d, self.causal, params)

    def build(self, params: dict[str, Any] | None, arch: str):
        import cupy

        from graphc.codegen.kernel import family_for
        from graphc.codegen.nvrtc import CompileJob, compile_all

        torch = self.torch
        ctx = self.context(params)
        (k,) = family_for(ctx).generate(ctx)
        (cubin,) = compile_all([CompileJob(k.name, k.source, k.params.get("requires_arch") or arch)])
        mod = cupy.cuda.function.Module()
        mod.load(cubin)
        fn = mod.get_function(k.name)
        if k.shared_bytes > 48 * 1024:
            drv = cupy.cuda.driver
            attr = getattr(drv, "CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES", 8)
            drv.funcSetAttribute(fn.ptr, attr, k.shared_bytes)

        def raw(t):  # cupy has no bfloat16: pass the bits
            return cupy.asarray(t.view(torch.int16))

        qv, kv, vv = ([raw(x) for x in xs] for xs in (self.q, self.k, self.v))
        outv = raw(self.out)

        streams: dict[int, Any] = {}  # torch's current stream (a capture stream under graph capture)

        def launch(i: int) -> None:
            ptr = torch.cuda.current_stream().cuda_stream
            stream = streams.get(ptr)
            if stream is None:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", DeprecationWarning)
                    stream = streams[ptr] = cupy.cuda.ExternalStream(ptr)
            j = i % self.sets
            names = {"x0": qv[j], "x1": kv[j], "x2": vv[j], "y0": outv}
            fn(k.grid, k.block, tuple(names[a] for a in k.args), shared_mem=k.shared_bytes, stream=stream)

        launch.keep = mod  # keep the module loaded while the launcher lives
        return launch, k

    def torch_launch(self, backend: str):
        from torch.nn.attention import SDPBackend, sdpa_kernel
        from torch.nn.functional import scaled_dot_product_attention as sdpa

        be = {
            "flash": SDPBackend.FLASH_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION,
            "cudnn": SDPBackend.CUDNN_ATTENTION,
            "math": SDPBackend.MATH,
        }[backend]

        def launch(i: int) -> None:
            j = i % self.sets
            with sdpa_kernel(be):
                sdpa(self.q[j], self.k[j], self.v[j], is_causal=self.causal, scale=self.scale)

        return launch

    def time(self, launch, iters: int, graph: bool = True) -> float:
        """Median ms a launch. The launches (one a rotated input set) are captured into a CUDA
        graph and replayed, so that host-side launch cost (cupy's, torch's Python dispatch) is
        not what is timed: BERT-sized attention takes microseconds."""
        torch = self.torch
        for i in range(3):
            launch(i)
        torch.cuda.synchronize()
        per = max(self.sets, 8)

        def run() -> None:
            for i in range(per):
                launch(i)

        if graph:
            try:
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    run()
                run = g.replay  # noqa: F811
            except Exception as e:  # noqa: BLE001
                print(f"  CUDA graph capture failed ({str(e)[:120]}): timing plain launches")
        for _ in range(3):
            run()
        torch.cuda.synchronize()
        times = []
        for _ in range(iters):
            s = torch.cuda.Event(enable_timing=True)
            e = torch.cuda.Event(enable_timing=True)
            s.record()
            run()
            e.record()
            times.append((s, e))
        torch.cuda.synchronize()
        return statistics.median(s.elapsed_time(e) for s, e in times) / per

    def check(self, launch) -> float:
        """||ours - torch's math reference|| / ||ref||, on input set 0."""
        torch = self.torch
        launch(0)
        torch.cuda.synchronize()
        q, k, v = (x[0].float() for x in (self.q, self.k, self.v))
        ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=self.causal, scale=self.scale)
        return float((self.out.float() - ref).norm() / ref.norm().clamp_min(1e-30))

    @property
    def flop(self) -> float:
        f = 4.0 * self.b * self.h * self.s * self.s * self.d
        return f / 2 if self.causal else f


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="three cases, fewer iterations")
    ap.add_argument("--done-when", action="store_true", help="issue 10's cases (batch 1 and 32)")
    ap.add_argument("--dtype", action="append", choices=list(TORCH_DTYPES), help="default: fp16")
    ap.add_argument("--shape", action="append", type=parse_shape, help="BxHxSxD (repeatable)")
    ap.add_argument("--causal", action="store_true", help="with --shape: causal")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--params", type=json.loads, help="force kernel parameters (JSON; replaces the defaults)")
    ap.add_argument("--tune", action="store_true", help="time every candidate of the search space")
    ap.add_argument("--sweep", action="store_true", help="time every tile of the sm_90 kernel")
    ap.add_argument("--json", type=Path, help="write the results here")
    args = ap.parse_args(argv)

    import torch

    from graphc.runtime.cuda import device_arch

    arch = device_arch()
    modes = args.dtype or ["fp16"]
    if args.shape:
        cases = [(*s, args.causal) for s in args.shape]
    else:
        cases = DONE_WHEN_CASES if args.done_when else (QUICK_CASES if args.quick else DEFAULT_CASES)
    iters = 20 if args.quick and args.iters == 50 else args.iters
    props = torch.cuda.get_device_properties(0)
    print(
        f"# {props.name}, {props.multi_processor_count} SMs, arch {arch}, torch {torch.__version__}, "
        f"CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}; "
        "torch = the fastest SDPA backend of the case"
    )
    header = (
        f"{'mode':5} {'case':22} {'B x H x S x D':>14} {'kernel':7} {'graphc ms':>10} {'TFLOP/s':>8} "
        f"{'torch ms':>9} {'(backend)':11} {'ratio':>6} {'rel err':>8}  params"
    )
    print(header)
    precompile(
        [(mode, c[1:], p) for mode in modes for c in cases for _, p in _graphc_candidates(mode, c[1:], arch, args)],
        arch,
    )
    rows = []
    for mode in modes:
        for name, b, h, s, d, causal in cases:
            r = Runner(mode, b, h, s, d, causal)
            torch_ms: dict[str, float] = {}
            for be in TORCH_BACKENDS:
                try:
                    torch_ms[be] = r.time(r.torch_launch(be), iters)
                except Exception as e:  # noqa: BLE001  (no such kernel for this case in this torch)
                    print(f"  torch {be}: skipped ({str(e).splitlines()[0][:100]})")
            best_be = min(torch_ms, key=torch_ms.__getitem__)
            t_ref = torch_ms[best_be]
            print("  torch: " + ", ".join(f"{be} {ms:.4f} ms" for be, ms in torch_ms.items()))
            for label, params in _graphc_candidates(mode, (b, h, s, d, causal), arch, args):
                try:
                    launch, k = r.build(params, arch)
                    err = r.check(launch)
                    t = r.time(launch, iters)
                except Exception as e:  # a failing candidate is infinitely slow
                    print(f"  failed {label} {params}: {str(e)[:300]}")
                    continue
                p = {
                    key: k.params[key]
                    for key in ("path", "BM", "BN", "WARPS", "WG", "STAGES", "MINB", "OVERLAP")
                    if key in k.params
                }
                row = {
                    "mode": mode,
                    "case": name,
                    "shape": [b, h, s, d],
                    "causal": causal,
                    "kernel": label,
                    "ms": t,
                    "tflops": r.flop / t / 1e9,
                    "torch_ms": t_ref,
                    "torch_backend": best_be,
                    "torch_all_ms": torch_ms,
                    "torch_tflops": r.flop / t_ref / 1e9,
                    "ratio": t_ref / t,
                    "err": err,
                    "params": p,
                }
                rows.append(row)
                _print(row)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


def _graphc_candidates(mode: str, case: tuple, arch: str, args) -> list[tuple[str, dict[str, Any] | None]]:
    """(label, forced parameters) of the graphc kernels to time: "flash" and, on sm_90, "sm90" with
    their defaults; --tune adds the search space (flash tiles), --sweep every sm_90 tile."""
    from graphc.codegen.families.attention import (
        SM90_SWEEP,
        problem_of,
        search_space,
        sm90_candidates,
        sm90_heuristic,
    )

    if args.params is not None:
        return [(args.params.get("path", "forced"), args.params)]
    prob = problem_of(problem_context(mode, *case, None))
    out: list[tuple[str, dict[str, Any] | None]] = [("flash", None)]
    sm90 = arch == "sm_90" and sm90_heuristic(prob) is not None
    if sm90:
        out.append(("sm90", sm90_heuristic(prob)))
    if args.tune:
        out += [("tune", p) for p in search_space(problem_context(mode, *case, None))]
    if args.sweep and sm90:
        out += [("sweep", p) for p in sm90_candidates(prob, SM90_SWEEP) if p != sm90_heuristic(prob)]
    return out


def _print(row: dict[str, Any]) -> None:
    shape = "x".join(str(x) for x in row["shape"])
    print(
        f"{row['mode']:5} {row['case'][:22]:22} {shape:>14} {row['kernel']:7} {row['ms']:10.4f} {row['tflops']:8.1f} "
        f"{row['torch_ms']:9.4f} {'(' + row['torch_backend'] + ')':11} {row['ratio']:6.2f} {row['err']:8.1e}  "
        f"{row['params']}"
    )


if __name__ == "__main__":
    sys.exit(main())
