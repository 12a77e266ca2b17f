"""An fp8 CUDA engine on a GPU (issue 13): a residual MLP of BERT-base FFN shapes (x [M, 768] ->
768x3072 + bias -> Relu -> 3072x768 -> + x, M = 32 x 128 tokens), the fp8 CUDA engine against the
fp8 CPU engine (the same arithmetic, so they differ only by the order of the fp32 sums and by the
fused epilogue keeping fp32 between ops where the CPU rounds each to fp16, which can move an
element to the neighbouring e4m3 value), and its time against the fp16 CUDA engine's (CUDA-graph
replays, same run, same GPU).

    python3 tools/bench_fp8_engine.py --out result.json [--rows 4096]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

import graphc
from graphc.bench import benchmark
from models.mlp import residual_mlp_model


def _cos(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--d", type=int, default=768)
    ap.add_argument("--h", type=int, default=3072)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    m, _ = residual_mlp_model(args.rows, args.d, args.h, rng)
    calib = [{"x": rng.standard_normal((args.rows, args.d)).astype(np.float32)} for _ in range(4)]
    x = {"x": rng.standard_normal((args.rows, args.d)).astype(np.float32)}
    kw = {"calibration_data": calib}
    cuda8 = graphc.compile(m, target="cuda", precision="fp8", arch=["sm_90"], **kw)
    cpu8 = graphc.compile(m, target="cpu", precision="fp8", **kw)
    cuda16 = graphc.compile(m, target="cuda", precision="fp16", arch=["sm_90"])
    # CUDA engines return device arrays unless asked for numpy
    y8, y16 = (np.asarray(e.run(x, to_numpy=True)["y"], np.float64) for e in (cuda8, cuda16))
    c8 = np.asarray(cpu8.run(x)["y"], np.float64)
    scale = float(np.abs(c8).max())
    r: dict = {
        "shape": [args.rows, args.d, args.h],
        "fp8_cuda_vs_fp8_cpu": {
            "max_abs_over_scale": float(np.abs(y8 - c8).max()) / scale,
            "exact_fraction": float(np.mean(y8 == c8)),
            "within_1e-3_of_scale": float(np.mean(np.abs(y8 - c8) <= 1e-3 * scale)),
            "cosine": _cos(y8, c8),
        },
        "fp8_cuda_vs_fp16_cuda_cosine": _cos(y8, y16),
        "families": cuda8.report["cuda"]["families"],
        "quantization": {k: v for k, v in cuda8.report["quantization"].items() if k != "tensors"},
    }
    print(json.dumps(r), flush=True)  # before the timing, in case it fails
    t8 = benchmark(cuda8, x, iterations=200, warmup=20)["latency"]["median_ms"]
    t16 = benchmark(cuda16, x, iterations=200, warmup=20)["latency"]["median_ms"]
    r["replay_ms"] = {"fp8": t8, "fp16": t16, "fp16_over_fp8": t16 / t8}
    text = json.dumps(r, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
