"""Benchmark graphc's GEMM kernels against cuBLAS (torch.matmul) in the same run, on the same GPU.

    python tools/bench_gemm.py                 # the default table (fp16, bf16, fp32, tf32)
    python tools/bench_gemm.py --quick         # fp16 4096^3 and two model shapes
    python tools/bench_gemm.py --dtype fp16 --shape 4096x4096x4096 --tune   # time the search space
    python tools/bench_gemm.py --wgmma         # also the sm_90a wgmma variant (fp16/bf16, H100/H200)

Times are CUDA-event medians over many launches after a warm-up, each launch reading another of
several input sets (together larger than L2), so neither side is timed on cached operands. Each
kernel's output is checked against torch's before its time is reported.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

DEFAULT_SHAPES = [
    (4096, 4096, 4096),
    (8192, 8192, 8192),
    (128, 768, 768),  # BERT-base, one sequence
    (128, 3072, 768),
    (128, 768, 3072),
    (2048, 768, 768),  # 16 sequences
    (2048, 3072, 768),
    (2048, 768, 3072),
    (1, 4096, 4096),  # decode GEMV
    (64, 64, 8192),  # split-K
    (1000, 1000, 1000),
]
QUICK_SHAPES = [(4096, 4096, 4096), (2048, 3072, 768), (64, 64, 8192)]
MODES = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32", "tf32": "float32"}


def parse_shape(s: str) -> tuple[int, int, int]:
    m, n, k = (int(x) for x in s.lower().split("x"))
    return m, n, k


def set_max_dynamic_shared(fn, nbytes: int) -> None:
    """Let a kernel take more than 48 KB of dynamic shared memory (cupy 14's Function has no
    property for it: set the attribute through the driver)."""
    import cupy

    drv = cupy.cuda.driver
    attr = getattr(drv, "CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES", 8)
    drv.funcSetAttribute(fn.ptr, attr, nbytes)


class Runner:
    """Builds, loads and times one GEMM configuration."""

    def __init__(self, mode: str, m: int, n: int, k: int, trans_b: bool = False):
        import torch

        from graphc.ir.types import DType

        self.torch = torch
        self.mode, self.m, self.n, self.k, self.trans_b = mode, m, n, k, trans_b
        self.dtype = DType.from_short({"fp16": "f16", "bf16": "bf16", "fp32": "f32", "tf32": "f32"}[mode])
        tdt = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32, "tf32": torch.float32}[mode]
        per_set = (m * k + k * n) * self.dtype.itemsize
        self.sets = max(2, min(16, -(-3 * 64 * 2**20 // per_set)))  # > 3 x L2 of operands in rotation
        g = torch.Generator(device="cuda").manual_seed(0)
        b_shape = (n, k) if trans_b else (k, n)
        self.a = [
            torch.rand((m, k), generator=g, device="cuda", dtype=torch.float32).sub_(0.5).to(tdt)
            for _ in range(self.sets)
        ]
        self.b = [
            torch.rand(b_shape, generator=g, device="cuda", dtype=torch.float32).sub_(0.5).to(tdt)
            for _ in range(self.sets)
        ]
        self.out = torch.empty((m, n), device="cuda", dtype=tdt)

    def context(self, params: dict[str, Any] | None):
        from graphc.codegen.families.gemm import standalone_context
        from graphc.ops.registry import get_op

        b_shape = (self.n, self.k) if self.trans_b else (self.k, self.n)
        if self.trans_b:
            attrs = get_op("MatMul", "graphc").attrs(trans_b=1)
            return standalone_context(
                "MatMul",
                [(self.m, self.k), b_shape],
                self.dtype,
                domain="graphc",
                attrs=attrs,
                allow_tf32=self.mode == "tf32",
                params=params,
            )
        return standalone_context(
            "MatMul", [(self.m, self.k), b_shape], self.dtype, allow_tf32=self.mode == "tf32", params=params
        )

    def build(self, params: dict[str, Any] | None, arch: str):
        import cupy

        from graphc.codegen.kernel import family_for
        from graphc.codegen.nvrtc import CompileJob, compile_all

        ctx = self.context(params)
        kernels = family_for(ctx).generate(ctx)
        cubins = compile_all([CompileJob(k.name, k.source, k.params.get("requires_arch", arch)) for k in kernels])
        fns = []
        for k, cubin in zip(kernels, cubins, strict=True):
            mod = cupy.cuda.function.Module()
            mod.load(cubin)
            fn = mod.get_function(k.name)
            if k.shared_bytes > 48 * 1024:
                set_max_dynamic_shared(fn, k.shared_bytes)
            fns.append((fn, k, mod))
        ws_bytes = max(k.workspace_bytes for k in kernels)
        ws = cupy.empty(max(ws_bytes, 1), dtype=cupy.uint8)
        outv = cupy.asarray(self.out)
        av = [cupy.asarray(x) for x in self.a]
        bv = [cupy.asarray(x) for x in self.b]

        def launch(i: int) -> None:
            names = {"x0": av[i % self.sets], "x1": bv[i % self.sets], "y0": outv, "@workspace": ws}
            for fn, k, _ in fns:
                fn(k.grid, k.block, tuple(names[a] for a in k.args), shared_mem=k.shared_bytes)

        return launch, kernels

    def torch_launch(self):
        torch = self.torch

        def launch(i: int) -> None:
            b = self.b[i % self.sets]
            torch.matmul(self.a[i % self.sets], b.t() if self.trans_b else b, out=self.out)

        return launch

    def time(self, launch, iters: int, warmup: int = 10) -> float:
        torch = self.torch
        for i in range(warmup):
            launch(i)
        torch.cuda.synchronize()
        times = []
        for i in range(iters):
            s = torch.cuda.Event(enable_timing=True)
            e = torch.cuda.Event(enable_timing=True)
            s.record()
            launch(i)
            e.record()
            times.append((s, e))
        torch.cuda.synchronize()
        return statistics.median(s.elapsed_time(e) for s, e in times)

    def check(self, launch) -> float:
        torch = self.torch
        launch(0)
        torch.cuda.synchronize()
        ours = self.out.float().clone()
        b = self.b[0].float()
        ref = self.a[0].float() @ (b.t() if self.trans_b else b)
        return float((ours - ref).norm() / ref.norm().clamp_min(1e-30))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fp16 only, three shapes, fewer iterations")
    ap.add_argument("--dtype", action="append", choices=list(MODES), help="precision modes (default: all)")
    ap.add_argument("--shape", action="append", type=parse_shape, help="MxNxK (repeatable)")
    ap.add_argument("--trans-b", action="store_true", help="B stored [N, K] (K contiguous)")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--params", type=json.loads, help="force kernel parameters (JSON)")
    ap.add_argument("--wgmma", action="store_true", help="fp16/bf16 through the sm_90a wgmma variant")
    ap.add_argument("--tune", action="store_true", help="time every candidate of the search space")
    ap.add_argument("--tune-limit", type=int, default=40, help="candidates timed per shape with --tune")
    ap.add_argument("--json", type=Path, help="write the results here")
    args = ap.parse_args(argv)

    import torch

    from graphc.runtime.cuda import device_arch

    arch = device_arch()
    modes = args.dtype or (["fp16"] if args.quick else ["fp16", "bf16", "fp32", "tf32"])
    shapes = args.shape or (QUICK_SHAPES if args.quick else DEFAULT_SHAPES)
    iters = 20 if args.quick and args.iters == 50 else args.iters
    props = torch.cuda.get_device_properties(0)
    print(
        f"# {props.name}, {props.multi_processor_count} SMs, arch {arch}, torch {torch.__version__}, "
        f"CUDA {torch.version.cuda}"
    )
    rows = []
    header = (
        f"{'mode':5} {'M x N x K':>20} {'graphc ms':>10} {'TFLOP/s':>8} {'cuBLAS ms':>10} {'TFLOP/s':>8} "
        f"{'ratio':>6} {'rel err':>8}  params"
    )
    print(header)
    for mode in modes:
        torch.backends.cuda.matmul.allow_tf32 = mode == "tf32"
        torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
        torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
        for m, n, k in shapes:
            if mode in ("fp32", "tf32") and m * n * k > 4096**3:
                continue  # minutes of SIMT time for nothing new
            r = Runner(mode, m, n, k, args.trans_b)
            flop = 2.0 * m * n * k
            t_ref = r.time(r.torch_launch(), iters)
            cands = [args.params]
            if args.wgmma and mode in ("fp16", "bf16") and not args.params:
                from graphc.codegen.families.gemm import heuristic, problem_of

                prob = problem_of(r.context(None))
                cands = [None, {k: v for k, v in heuristic(prob, "wgmma").items() if not k.startswith("_")}]
            if args.tune:
                from graphc.codegen.families.gemm import search_space

                space = search_space(r.context(None))
                if args.wgmma and mode in ("fp16", "bf16"):
                    from graphc.codegen.families.gemm import candidates, problem_of

                    prob = problem_of(r.context(None))
                    space = [
                        {k: v for k, v in q.items() if k[0] != "_"}
                        for q in candidates(prob, "wgmma")
                        if q["SPLITS"] == 1 or m * n < 2**22
                    ]
                cands = [None] + space[: args.tune_limit] if len(space) > args.tune_limit else [None, *space]
            best = None
            shown = []
            for params in cands:
                try:
                    launch, kernels = r.build(params, arch)
                    err = r.check(launch)
                    t = r.time(launch, iters)
                except Exception as e:  # a failing candidate is infinitely slow
                    print(f"  failed {params}: {str(e)[:200]}")
                    continue
                p = {k: v for k, v in kernels[0].params.items() if k not in ("M", "N", "K", "batch")}
                row = {
                    "mode": mode,
                    "M": m,
                    "N": n,
                    "K": k,
                    "ms": t,
                    "tflops": flop / t / 1e9,
                    "cublas_ms": t_ref,
                    "cublas_tflops": flop / t_ref / 1e9,
                    "ratio": t_ref / t,
                    "err": err,
                    "params": p,
                    "heuristic": params is None,
                }
                if args.tune:
                    print(f"  {t:8.4f} ms  {row['tflops']:7.1f}  err {err:.1e}  {p}")
                if best is None or t < best["ms"]:
                    best = row
                if not args.tune or params is None:
                    shown.append(row)
            if args.tune and best is not None and not best["heuristic"]:
                shown.append(dict(best, tuned=True))
            rows += shown
            for row in shown:
                tag = " (tuned)" if row.get("tuned") else ""
                print(
                    f"{mode:5} {f'{m}x{n}x{k}':>20} {row['ms']:10.4f} {row['tflops']:8.1f} {t_ref:10.4f} "
                    f"{row['cublas_tflops']:8.1f} {row['ratio']:6.2f} {row['err']:8.1e}  {row['params']}{tag}"
                )
    if args.json:
        args.json.write_text(json.dumps({"gpu": props.name, "arch": arch, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
