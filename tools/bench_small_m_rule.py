"""Whole-model A/B of the batch-1 K >= 3072 GEMM rule on sm_90 (gemm_sm90.small_m_params): the TMA
GEMM with 8 K slices and a reduce launch against the cp.async wgmma kernel with cluster split-K (one
launch, S 4 or S 8), on a zoo model at batch 1, fp16, in one process; each with the GEMM cluster
kernels launched plain (GRAPHC_PDL_CLUSTERS=0, the rule before 2026-12-04) and programmatically.

    python tools/bench_small_m_rule.py [--model bert|vit] [--json OUT]

Per variant: launches, cosine to ONNX Runtime's fp32 output, (a) engine.run back to back (best of
3 x 100 calls, ms) and (b) one CUDA-graph replay (codegen.tuner.graph_replay_ms, ms). Needs a GPU.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="bert", choices=["bert", "vit"])
    ap.add_argument("--json", help="append the rows here")
    args = ap.parse_args(argv)

    import cupy
    import onnxruntime as ort

    import graphc
    import models
    from graphc.codegen.families import gemm_sm90 as g
    from graphc.codegen.tuner import graph_replay_ms
    from graphc.runtime.pdl import pdl_clusters as clusters_env

    m = models.build(args.model, size="full")
    feeds = {k: v[:1] for k, v in models.sample_inputs(args.model, m, seed=0).items()}
    shapes = {k: v.shape for k, v in feeds.items()}
    ref = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    # label -> (DEEP_K_CLUSTER, SMALL_M_MIN_K, WGMMA_CLUSTER_SPLITS, cluster kernels under PDL)
    rule = (g.DEEP_K_CLUSTER, g.SMALL_M_MIN_K, g.WGMMA_CLUSTER_SPLITS)
    variants = {
        "tma_split_clusters_plain": (False, rule[1], rule[2], False),
        "tma_split_clusters_pdl": (False, rule[1], rule[2], True),
        "wgmma_cluster_s8_plain": (True, rule[1], rule[2], False),
        "wgmma_cluster_s8_pdl": (True, rule[1], rule[2], True),
        "wgmma_cluster_s4_pdl": (False, 10**9, rule[2], True),
    }
    engines, rows = {}, {}
    for label, (deep, min_k, splits, pdl_clusters) in variants.items():
        g.DEEP_K_CLUSTER, g.SMALL_M_MIN_K, g.WGMMA_CLUSTER_SPLITS = deep, min_k, splits
        try:
            with clusters_env(pdl_clusters):  # read when the engine is built
                e = graphc.compile(m, target="cuda", precision="fp16", arch=["sm_90"], shapes=shapes)
        finally:
            g.DEEP_K_CLUSTER, g.SMALL_M_MIN_K, g.WGMMA_CLUSTER_SPLITS = rule
        out = np.asarray(next(iter(e.run(feeds, to_numpy=True).values())), np.float64)
        cos = float(out.ravel() @ ref.ravel() / (np.linalg.norm(out) * np.linalg.norm(ref)))
        engines[label] = e
        rows[label] = {"launches": sum(len(s.launches) for s in e.plan.steps), "cos": cos, "a_ms": float("inf")}
    for _ in range(3):  # rounds alternate between the variants
        for label, e in engines.items():
            for _ in range(10):
                e.run(feeds)
            cupy.cuda.Device().synchronize()
            t = time.perf_counter()
            for _ in range(100):
                e.run(feeds)
            cupy.cuda.Device().synchronize()
            rows[label]["a_ms"] = min(rows[label]["a_ms"], (time.perf_counter() - t) * 10)
    for (label, r), b in zip(rows.items(), graph_replay_ms([e.executor for e in engines.values()]), strict=True):
        r["b_ms"] = b
        print(args.model, label, json.dumps(r))
    if args.json:
        with open(args.json, "a") as f:
            for label, r in rows.items():
                f.write(json.dumps({"model": args.model, "variant": label, **r}) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
