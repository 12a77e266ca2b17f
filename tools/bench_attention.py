"""Benchmark graphc's attention kernel against torch.nn.functional.scaled_dot_product_attention
(flash backend) in the same run, on the same GPU.

    python tools/bench_attention.py            # BERT-base, GPT-2 and a long-context case, fp16
    python tools/bench_attention.py --quick    # BERT-base seq 128/512 and GPT-2, fewer iterations
    python tools/bench_attention.py --tune     # also time every candidate of the search space
    python tools/bench_attention.py --shape 8x12x512x64 --causal --dtype bf16

Both sides read (batch, heads, seq, head_dim) tensors (graphc's 4-D Attention form, torch's own
layout). Times are CUDA-event medians over many replays of a CUDA graph of launches (so host
launch cost is not timed), each launch reading another of several input sets (together larger than
L2). Each kernel's output is checked against an fp32 reference before its time is reported.
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
TORCH_DTYPES = {"fp16": "float16", "bf16": "bfloat16"}


def parse_shape(s: str) -> tuple[str, int, int, int, int]:
    b, h, n, d = (int(x) for x in s.lower().split("x"))
    return (s, b, h, n, d)


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
        from graphc.codegen.families.attention import standalone_context
        from graphc.ops.registry import get_op

        shape = (self.b, self.h, self.s, self.d)
        attrs = get_op("Attention").attrs(scale=self.scale, is_causal=int(self.causal))
        return standalone_context("Attention", [(shape, self.dtype)] * 3, attrs, params=params)

    def build(self, params: dict[str, Any] | None, arch: str):
        import cupy

        from graphc.codegen.kernel import family_for
        from graphc.codegen.nvrtc import CompileJob, compile_all

        torch = self.torch
        ctx = self.context(params)
        (k,) = family_for(ctx).generate(ctx)
        (cubin,) = compile_all([CompileJob(k.name, k.source, arch)])
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

        be = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION}[backend]

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
    ap.add_argument("--dtype", action="append", choices=list(TORCH_DTYPES), help="default: fp16")
    ap.add_argument("--shape", action="append", type=parse_shape, help="BxHxSxD (repeatable)")
    ap.add_argument("--causal", action="store_true", help="with --shape: causal")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--params", type=json.loads, help="force kernel parameters (JSON)")
    ap.add_argument("--tune", action="store_true", help="time every candidate of the search space")
    ap.add_argument("--json", type=Path, help="write the results here")
    args = ap.parse_args(argv)

    import torch

    from graphc.runtime.cuda import device_arch

    arch = device_arch()
    modes = args.dtype or ["fp16"]
    cases = [(*s, args.causal) for s in args.shape] if args.shape else (QUICK_CASES if args.quick else DEFAULT_CASES)
    iters = 20 if args.quick and args.iters == 50 else args.iters
    props = torch.cuda.get_device_properties(0)
    print(
        f"# {props.name}, {props.multi_processor_count} SMs, arch {arch}, torch {torch.__version__}, "
        f"CUDA {torch.version.cuda}; torch = SDPA flash backend"
    )
    header = (
        f"{'mode':5} {'case':28} {'B x H x S x D':>16} {'graphc ms':>10} {'TFLOP/s':>8} {'torch ms':>9} "
        f"{'TFLOP/s':>8} {'ratio':>6} {'rel err':>8}  params"
    )
    print(header)
    rows = []
    for mode in modes:
        for name, b, h, s, d, causal in cases:
            r = Runner(mode, b, h, s, d, causal)
            try:
                t_ref = r.time(r.torch_launch("flash"), iters)
            except RuntimeError as e:  # no flash kernel for this case in this torch
                print(f"  torch flash backend failed ({str(e)[:120]}); using the efficient backend")
                t_ref = r.time(r.torch_launch("efficient"), iters)
            cands: list[dict[str, Any] | None] = [args.params]
            if args.tune:
                from graphc.codegen.families.attention import search_space

                cands = [None, *search_space(r.context(None))]
            best = None
            for params in cands:
                try:
                    launch, k = r.build(params, arch)
                    err = r.check(launch)
                    t = r.time(launch, iters)
                except Exception as e:  # a failing candidate is infinitely slow
                    print(f"  failed {params}: {str(e)[:300]}")
                    continue
                p = {key: k.params[key] for key in ("path", "BM", "BN", "WARPS") if key in k.params}
                row = {
                    "mode": mode,
                    "case": name,
                    "shape": [b, h, s, d],
                    "causal": causal,
                    "ms": t,
                    "tflops": r.flop / t / 1e9,
                    "torch_ms": t_ref,
                    "torch_tflops": r.flop / t_ref / 1e9,
                    "ratio": t_ref / t,
                    "err": err,
                    "params": p,
                    "heuristic": params is None,
                }
                if args.tune:
                    print(f"  {t:8.4f} ms {row['tflops']:7.1f}  err {err:.1e}  {p}")
                if best is None or t < best["ms"]:
                    best = row
                if params is None or not args.tune:
                    rows.append(row)
                    _print(row)
            if args.tune and best is not None and not best["heuristic"]:
                rows.append(dict(best, tuned=True))
                _print(rows[-1])
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


def _print(row: dict[str, Any]) -> None:
    shape = "x".join(str(x) for x in row["shape"])
    tag = " (tuned)" if row.get("tuned") else ""
    print(
        f"{row['mode']:5} {row['case'][:28]:28} {shape:>16} {row['ms']:10.4f} {row['tflops']:8.1f} "
        f"{row['torch_ms']:9.4f} {row['torch_tflops']:8.1f} {row['ratio']:6.2f} {row['err']:8.1e}  "
        f"{row['params']}{tag}"
    )


if __name__ == "__main__":
    sys.exit(main())
