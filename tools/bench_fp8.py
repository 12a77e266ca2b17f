"""FP8 E4M3 GEMMs on graphc's Hopper TMA kernel against torch._scaled_mm (issue 13, FP8 kernels).

    python tools/bench_fp8.py --out fp8_bench.md [--iterations 50] [--sweep]

For each (M, N, K): A [M, K] and B [N, K] in float8_e4m3fn (torch's cast of normal samples), per-tensor
scales s_a, s_b; out [M, N] fp16 = s_a * s_b * A . B^T with fp32 accumulation, by
- graphc: gemm_sm90.fp8_gemm (wgmma m64nBNk32.f32.e4m3.e4m3, TMA loads of the raw e4m3 bytes, the
  scales folded into the epilogue's alpha), its cubin launched directly (cupy) with the tensor maps
  encoded as an engine's are (runtime/tensormap.py);
- torch._scaled_mm(A, B.t(), s_a, s_b, out_dtype=float16) (cuBLASLt's FP8 GEMM);
- and for the ratio to 16-bit, torch.matmul on the fp16 values (cuBLAS).
Each output is checked against the fp16 matmul of the dequantized operands (fp32 accumulation order
differs: max error within 1% of the output's largest magnitude). Times: CUDA events around each
single call on the same stream, the median of `--iterations`; one run, one GPU.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

GEMMS = [(4096, 3072, 768), (4096, 768, 3072), (4096, 768, 768), (4096, 2304, 768), (8192, 8192, 8192)]
SWEEP = [
    {"BN": 128},
    {"BN": 256},
    {"BN": 128, "OVERLAP": 1},
    {"BN": 192, "OVERLAP": 1},
    {"BN": 128, "PINGPONG": 1},
    {"BN": 256, "WARP_EPI": 1},
]
SCALE_A, SCALE_B = 0.5, 0.25


class Fp8Kernel:
    """One fp8_gemm kernel, compiled and loaded, with its tensor maps over A and B."""

    def __init__(self, m: int, n: int, k: int, a, b, params: dict | None = None):
        import cupy

        from graphc.codegen.families.gemm_sm90 import fp8_gemm
        from graphc.codegen.nvrtc import CompileJob, compile_all
        from graphc.ir.types import DType
        from graphc.runtime.cuda import SHARED_OPT_IN_BYTES, allow_large_shared_memory
        from graphc.runtime.tensormap import TensorMapTable, spec_from_json

        self.src = fp8_gemm(m, n, k, DType.float16, alpha=SCALE_A * SCALE_B, params=params)
        (cubin,) = compile_all([CompileJob(self.src.name, self.src.source, self.src.params["requires_arch"])])
        self.module = cupy.cuda.function.Module()
        self.module.load(cubin)
        self.fn = self.module.get_function(self.src.name)
        if self.src.shared_bytes > SHARED_OPT_IN_BYTES:
            allow_large_shared_memory(self.fn, self.src.shared_bytes)
        specs = [spec_from_json(d, "fp8 bench") for d in self.src.params["tmaps"]]
        ptrs = {"a": a.data_ptr(), "b": b.data_ptr()}
        self.maps = TensorMapTable(cupy, [(s, ptrs[s.tensor]) for s in specs])
        self.cubin = cubin

    def __call__(self, out) -> None:
        args = (self.maps.arg(0), self.maps.arg(1), np.uint64(out.data_ptr()))
        self.fn(tuple(self.src.grid), tuple(self.src.block), args, shared_mem=self.src.shared_bytes)


def time_ms(fn, iterations: int) -> float:
    import torch

    for _ in range(5):
        fn()
    times = []
    for _ in range(iterations):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return float(np.median(times))


def check(got, ref, what: str) -> float:
    """The largest error relative to the reference's largest magnitude (SystemExit above 1%)."""
    g, r = got.float(), ref.float()
    rel = float((g - r).abs().max() / r.abs().max())
    if not rel <= 1e-2:
        raise SystemExit(f"{what}: max error {rel:.3g} of the largest output")
    return rel


def bench_problem(m: int, n: int, k: int, gen, iterations: int, sweep: bool, checks: list[str]) -> dict:
    """One (M, N, K): random operands, every side checked, then timed."""
    import torch

    a16 = torch.randn(m, k, device="cuda", generator=gen, dtype=torch.float16)
    b16 = torch.randn(n, k, device="cuda", generator=gen, dtype=torch.float16)
    a8, b8 = a16.to(torch.float8_e4m3fn), b16.to(torch.float8_e4m3fn)
    sa = torch.tensor(SCALE_A, device="cuda")
    sb = torch.tensor(SCALE_B, device="cuda")
    ref = (a8.to(torch.float16) @ b8.to(torch.float16).t()) * (SCALE_A * SCALE_B)
    out = torch.empty(m, n, device="cuda", dtype=torch.float16)
    row: dict = {"problem": f"{m}x{n}x{k}"}
    ker = Fp8Kernel(m, n, k, a8, b8)
    row["graphc_params"] = {key: v for key, v in ker.src.params.items() if key != "tmaps"}
    ker(out)
    torch.cuda.synchronize()
    checks.append(f"{row['problem']} graphc: max error {check(out, ref, 'graphc'):.2e} of the largest output")
    row["graphc_ms"] = time_ms(lambda: ker(out), iterations)

    def scaled_mm():
        return torch._scaled_mm(a8, b8.t(), scale_a=sa, scale_b=sb, out_dtype=torch.float16)

    try:
        checks.append(f"{row['problem']} torch._scaled_mm: max error {check(scaled_mm(), ref, 'torch'):.2e}")
        row["torch_fp8_ms"] = time_ms(scaled_mm, iterations)
    except (RuntimeError, AttributeError) as e:  # no FP8 GEMM in this torch build
        row["torch_fp8_ms"] = None
        checks.append(f"{row['problem']} torch._scaled_mm: {type(e).__name__}: {str(e)[:120]}")
    row["torch_fp16_ms"] = time_ms(lambda: a16 @ b16.t(), iterations)
    row["graphc_tflops"] = 2.0 * m * n * k / row["graphc_ms"] / 1e9
    row["sweep"] = []
    for forced in SWEEP if sweep else []:
        try:
            kv = Fp8Kernel(m, n, k, a8, b8, forced)
        except Exception as e:  # a schedule that does not fit: reported, not fatal
            print(f"  {forced}: {type(e).__name__}: {str(e)[:160]}", flush=True)
            continue
        out.zero_()
        kv(out)
        check(out, ref, f"graphc {forced}")
        ms = time_ms(lambda kv=kv: kv(out), iterations)
        row["sweep"].append((forced, ms))
        print(f"  {forced}: {ms:.4f} ms", flush=True)
    return row


def warm(sweep: bool) -> None:
    """Every kernel of the run compiled first, in parallel (into the kernel cache, before any CUDA
    context: compile_all forks its workers)."""
    from graphc.codegen.families.gemm_sm90 import fp8_gemm
    from graphc.codegen.nvrtc import CompileJob, compile_all
    from graphc.ir.types import DType

    t0 = time.time()
    jobs = []
    for m, n, k in GEMMS:
        for forced in [None, *(SWEEP if sweep else [])]:
            try:
                src = fp8_gemm(m, n, k, DType.float16, alpha=SCALE_A * SCALE_B, params=forced)
            except Exception:  # reported when the run renders it again
                continue
            jobs.append(CompileJob(src.name, src.source, src.params["requires_arch"]))
    compile_all(jobs)
    print(f"compiled {len(jobs)} kernels in {time.time() - t0:.0f} s", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="markdown file to write (and .json beside it)")
    ap.add_argument("--iterations", type=int, default=50)
    ap.add_argument("--sweep", action="store_true", help="also time the SWEEP schedules of the graphc kernel")
    args = ap.parse_args(argv)
    warm(args.sweep)
    import cupy
    import torch

    # cupy launches on its current stream: torch's, so that events and both sides share one stream
    stream = torch.cuda.current_stream()
    cupy.cuda.ExternalStream(stream.cuda_stream).use()
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows, checks = [], []
    for m, n, k in GEMMS:
        row = bench_problem(m, n, k, gen, args.iterations, args.sweep, checks)
        rows.append(row)
        tf = row["torch_fp8_ms"]
        print(
            f"{row['problem']:18s} graphc fp8 {row['graphc_ms']:.4f} ms  torch fp8 "
            f"{tf if tf is None else round(tf, 4)} ms  torch fp16 {row['torch_fp16_ms']:.4f} ms",
            flush=True,
        )
    props = torch.cuda.get_device_properties(0)
    lines = [
        f"date {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; GPU {props.name}; torch {torch.__version__} "
        f"(CUDA {torch.version.cuda}); CUDA events around single calls, median of {args.iterations}",
        "",
        "| problem | graphc fp8 ms | TFLOP/s | torch._scaled_mm ms | torch / graphc | torch fp16 ms "
        "| fp16 / graphc fp8 | graphc schedule |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for r in rows:
        tf, ms = r["torch_fp8_ms"], r["graphc_ms"]
        p = r["graphc_params"]
        sched = {key: p[key] for key in ("BN", "STAGES", "PINGPONG", "OVERLAP", "WARP_EPI", "VEC_EPI") if key in p}
        torch8 = "- | -" if tf is None else f"{tf:.4f} | {tf / ms:.2f}"
        lines.append(
            f"| {r['problem']} | {ms:.4f} | {r['graphc_tflops']:.0f} | {torch8} | "
            f"{r['torch_fp16_ms']:.4f} | {r['torch_fp16_ms'] / ms:.2f} | {sched} |"
        )
    for r in rows:
        for forced, ms in r.get("sweep", []):
            lines.append(f"- sweep {r['problem']}: {forced} {ms:.4f} ms")
    lines += ["", "Output checks (against the fp16 product of the dequantized operands):", *[f"- {c}" for c in checks]]
    args.out.write_text("\n".join(lines) + "\n")
    args.out.with_suffix(".json").write_text(json.dumps(rows, indent=1, default=str))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
