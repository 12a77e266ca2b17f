"""Why a Hopper TMA GEMM is slower inside an engine than alone, and what the epilogue costs: a
BERT-like FFN (MatMul [B, S, 768] x [768, 3072] + bias + Gelu) and the plain MatMul, each compiled
by graphc (fp16, this GPU's arch) and timed as a CUDA-graph replay and per kernel
(graphc.bench.benchmark per_kernel), beside torch.matmul and torch's addmm + gelu; optionally zoo
models (ResNet-50, BERT-base at full size) per step.

    python tools/profile_ffn_sm90.py [--batch 32] [--models resnet,bert] [--out DIR]

`--overlap` also compiles the FFN and the plain MatMul with the OVERLAP schedule (the epilogue of a
tile during the next tile's main loop) and the ping-pong one. `--epilogue-forms` also compiles the
FFN with the TMA GEMM's older epilogue (one element per call, erff: VEC_EPI=0, FAST_GELU=0), the
vector epilogue with erff, the epilogue in the accumulator layout (VEC_EPI=2) and the ping-pong
schedule, for a before/after in one run. Each engine's output is checked against float64 numpy
(relative Frobenius error printed).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def ffn_model(batch: int, seq: int, d: int, h: int, epilogue: bool, seed: int = 0):
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    w1 = (rng.standard_normal((d, h)) / np.sqrt(d)).astype(np.float32)
    b1 = rng.standard_normal(h).astype(np.float32) * 0.5
    inits = {"w1": w1}
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["t" if epilogue else "y"])]
    if epilogue:
        inits["b1"] = b1
        nodes += [helper.make_node("Add", ["t", "b1"], ["u"]), helper.make_node("Gelu", ["u"], ["y"])]
    g = helper.make_graph(
        nodes,
        "ffn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, seq, d])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, seq, h])],
        [numpy_helper.from_array(a, n) for n, a in inits.items()],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)])
    m.ir_version = 10
    x = rng.standard_normal((batch, seq, d)).astype(np.float32)
    ref = x.astype(np.float64) @ w1.astype(np.float64)
    if epilogue:
        from math import erf

        u = ref + b1
        ref = 0.5 * u * (1 + np.vectorize(erf)(u / np.sqrt(2)))
    return m, {"x": x}, ref


@contextlib.contextmanager
def tma_params(extra: dict | None):
    """Compile with extra TMA GEMM parameters (the epilogue forms): gemm_sm90.select calls
    generate(ctx) with none, so this wraps generate for the time of one compile."""
    from graphc.codegen.families import gemm_sm90

    orig = gemm_sm90.generate
    if extra:
        gemm_sm90.generate = lambda ctx, params=None, **kw: orig(ctx, {**(params or {}), **extra}, **kw)
    try:
        yield
    finally:
        gemm_sm90.generate = orig


def bench_engine(model, feeds, iters: int, extra=None) -> dict:
    import graphc
    from graphc.bench import benchmark

    t0 = time.time()
    with tma_params(extra):
        eng = graphc.compile(model, target="cuda", precision="fp16")
    compile_s = time.time() - t0
    r = benchmark(eng, feeds, iterations=iters, warmup=10, per_kernel=True)
    out = eng.run(feeds, to_numpy=True)
    tma = [
        {k: v for k, v in ln.params.items() if k != "tmaps"}
        for s in eng.plan.steps
        for ln in s.launches
        if ln.params.get("path") == "tma"
    ]
    return {"replay_ms": r["latency"]["median_ms"], "kernels": r["kernels"], "out": out, "tma": tma,
            "compile_s": compile_s, "device": r.get("device")}  # fmt: skip


def torch_times(batch, seq, d, h, iters: int) -> dict:
    import torch

    x = torch.randn(batch * seq, d, device="cuda", dtype=torch.float16)
    w = torch.randn(d, h, device="cuda", dtype=torch.float16)
    b = torch.randn(h, device="cuda", dtype=torch.float16)
    out = {}
    for name, fn in (
        ("torch.matmul", lambda: torch.matmul(x, w)),
        ("torch addmm+gelu", lambda: torch.nn.functional.gelu(torch.addmm(b, x, w))),
    ):
        for _ in range(5):
            fn()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(20):
                fn()
        ts = []
        for _ in range(max(5, iters // 5)):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            g.replay()
            e.record()
            torch.cuda.synchronize()
            ts.append(s.elapsed_time(e) / 20)
        out[name] = float(np.median(ts))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--epilogue-forms", action="store_true")
    ap.add_argument("--overlap", action="store_true", help="also the OVERLAP schedule (BN 128, 192) and ping-pong")
    ap.add_argument("--models", default="", help="zoo models at full size, e.g. resnet,bert")
    ap.add_argument("--only", help="the FFN forms whose label contains this (e.g. under ncu)")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--out", type=Path, default=Path("."))
    a = ap.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    log = (a.out / "profile_ffn_sm90.jsonl").open("a")
    d, h = 768, 3072
    print(f"# FFN {a.batch}x{a.seq}x{d} @ {d}x{h}: M={a.batch * a.seq} N={h} K={d}")
    if not a.no_torch:
        t = torch_times(a.batch, a.seq, d, h, a.iters)
        print("  " + "  ".join(f"{k} {v:.4f} ms" for k, v in t.items()), flush=True)
        log.write(json.dumps({"torch": t}) + "\n")
    forms = [("plain MatMul", False, None), ("FFN", True, None)]
    if a.epilogue_forms:
        forms += [("FFN VEC_EPI=0 erff (before)", True, {"VEC_EPI": 0, "FAST_GELU": 0}),
                  ("FFN VEC_EPI=1 erff", True, {"VEC_EPI": 1, "FAST_GELU": 0}),
                  ("FFN VEC_EPI=2", True, {"VEC_EPI": 2}),
                  ("FFN ping-pong BN192", True, {"BN": 192, "PINGPONG": 1}),
                  ("FFN ping-pong BN192 VEC_EPI=2", True, {"BN": 192, "PINGPONG": 1, "VEC_EPI": 2}),
                  ("plain MatMul VEC_EPI=2", False, {"VEC_EPI": 2})]  # fmt: skip
    if a.overlap:
        forms += [("FFN ping-pong BN128", True, {"BN": 128, "PINGPONG": 1}),
                  ("FFN OVERLAP BN128", True, {"BN": 128, "OVERLAP": 1}),
                  ("FFN OVERLAP BN192", True, {"BN": 192, "OVERLAP": 1}),
                  ("plain MatMul BN256", False, {"BN": 256}),
                  ("plain MatMul OVERLAP BN192", False, {"BN": 192, "OVERLAP": 1})]  # fmt: skip
    for label, epi, extra in forms:
        if a.only and a.only not in label:
            continue
        model, feeds, ref = ffn_model(a.batch, a.seq, d, h, epi)
        r = bench_engine(model, feeds, a.iters, extra)
        y = np.asarray(r["out"]["y"], np.float64)
        err = float(np.linalg.norm(y - ref) / np.linalg.norm(ref))
        gemm = [k for k in r["kernels"] if k["step"].endswith("MatMul_0") or "MatMul" in k["step"]]
        gk = max(gemm, key=lambda k: k["median_ms"]) if gemm else None
        row = {"form": label, "replay_ms": r["replay_ms"], "gemm_per_kernel_ms": gk and gk["median_ms"],
               "gemm_grid": gk and gk["grid"], "err": err, "tma": r["tma"], "compile_s": r["compile_s"],
               "device": r["device"]}  # fmt: skip
        log.write(json.dumps(row) + "\n")
        log.flush()
        tma = r["tma"][0] if r["tma"] else {}
        print(f"  {label:30} replay {r['replay_ms']:.4f} ms | GEMM alone {row['gemm_per_kernel_ms']:.4f} ms "
              f"| {dict((k, tma.get(k)) for k in ('BN', 'STAGES', 'PINGPONG', 'OVERLAP', 'VEC_EPI', 'FAST_GELU'))} "
              f"| rel err {err:.2e}", flush=True)  # fmt: skip
    for name in [m for m in a.models.split(",") if m]:
        import models

        model = models.build(name, size="full", batch=a.batch)
        seq = a.seq if name == "bert" else None
        feeds = models.sample_inputs(name, model, seed=0, batch=a.batch, seq=seq)
        import graphc
        from graphc.bench import benchmark

        t0 = time.time()
        shapes = {"seq": a.seq} if name == "bert" else None
        eng = graphc.compile(model, target="cuda", precision="fp16", shapes=shapes)
        cs = time.time() - t0
        r = benchmark(eng, feeds, iterations=a.iters, warmup=10, per_kernel=True)
        rows = sorted(r["kernels"], key=lambda k: -k["median_ms"])
        total = sum(k["median_ms"] for k in rows)
        print(f"# {name} full, batch {a.batch}: replay {r['latency']['median_ms']:.3f} ms, "
              f"{len(rows)} launches, sum alone {total:.3f} ms (compile {cs:.0f} s)")  # fmt: skip
        paths = {}
        for s in eng.plan.steps:
            for ln in s.launches:
                paths[s.name] = ln.params.get("variant") or ln.params.get("path") or ""
        for k in rows[:25]:
            print(f"  {k['median_ms']:8.4f} ms  {k['grid']}  {paths.get(k['step'], '')!s:9} {k['step']}")
        log.write(json.dumps({"model": name, "batch": a.batch, "replay_ms": r["latency"]["median_ms"],
                              "kernels": rows, "paths": paths}) + "\n")  # fmt: skip
        log.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
