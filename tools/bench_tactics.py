"""graphc's GEMM kernels against the cuBLASLt tactic, both in an engine, both as CUDA-graph replays.

Per shape and epilogue, one fp16 ONNX model of COPIES independent GEMMs of the same shape (own
weights, one shared input: launch gaps amortized over many GEMMs), compiled twice for the local
GPU: graphc's kernels (the default plan) and `--tactics cublaslt` with the rule forced (every step
cuBLASLt can run). Each engine's outputs are checked against numpy (fp32 product of the same fp16
values); times are the best of 5 rounds of 20 replays of the engine's captured graph, per GEMM.

    python tools/bench_tactics.py --out results.jsonl [--quick] [--models] [--batches 32,1]

--models: whole zoo models (BERT, ViT, full size) with and without --tactics cublaslt (the measured
rule), CUDA-graph replay and engine.run, and their outputs compared.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# (name, N, K, epilogue) of the linear layers of BERT-base / GPT-2 / ViT-B/16, and GPT-2's lm_head
# qkv: Q, K and V of one input, which horizontal fusion makes one batched GEMM (3 x M x 768 x 768)
LAYERS = [
    ("qkv", 768, 768, "bias"),
    ("proj", 768, 768, "bias_res"),
    ("ffn1", 3072, 768, "bias_gelu"),
    ("ffn2", 768, 3072, "bias_res"),
    ("lm_head", 50257, 768, "none"),
]
MS = [4096, 128, 6304, 197, 1024]  # the most telling first: a time limit cuts the last
WEIGHT_BUDGET = 160 * 2**20  # bytes of weights per model (ONNX's 2 GB protobuf limit is far)


def gemm_model(m: int, n: int, k: int, epilogue: str, copies: int, seed: int = 0, group: int = 1):
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    inits, nodes, outs = [], [], []
    # an input per GEMM: GEMMs sharing an input would be fused into one batched GEMM (horizontal fusion)
    inputs = [helper.make_tensor_value_info(f"x{i}", TensorProto.FLOAT16, [m, k]) for i in range(copies)]
    if epilogue == "bias_res":
        inputs.append(helper.make_tensor_value_info("r", TensorProto.FLOAT16, [m, n]))
    ref = []
    for j in range(copies * group):
        i, x = j, f"x{j // group}"  # `group` GEMMs share an input: one batched GEMM after fusion
        w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float16)
        b = (rng.standard_normal(n) * 0.1).astype(np.float16)
        inits.append(numpy_helper.from_array(w, f"w{i}"))
        cur = f"mm{i}"
        nodes.append(helper.make_node("MatMul", [x, f"w{i}"], [cur]))
        if epilogue != "none":
            inits.append(numpy_helper.from_array(b, f"b{i}"))
            nodes.append(helper.make_node("Add", [cur, f"b{i}"], [f"ab{i}"]))
            cur = f"ab{i}"
        if epilogue == "bias_gelu":
            nodes.append(helper.make_node("Gelu", [cur], [f"g{i}"], approximate="tanh"))
            cur = f"g{i}"
        if epilogue == "bias_res":
            nodes.append(helper.make_node("Add", [cur, "r"], [f"res{i}"]))
            cur = f"res{i}"
        outs.append(helper.make_tensor_value_info(cur, TensorProto.FLOAT16, [m, n]))
        ref.append((cur, x, w, b))
    g = helper.make_graph(nodes, "gemms", inputs, outs, inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)])
    return model, ref


def reference(x: np.ndarray, r: np.ndarray | None, w: np.ndarray, b: np.ndarray, epilogue: str) -> np.ndarray:
    y = x.astype(np.float32) @ w.astype(np.float32)
    if epilogue != "none":
        y = y + b.astype(np.float32)
    if epilogue == "bias_gelu":
        y = 0.5 * y * (1 + np.tanh(np.sqrt(2 / np.pi) * (y + 0.044715 * y**3)))
    if epilogue == "bias_res":
        y = y + r.astype(np.float32)
    return y


def replay_ms(engine, rounds: int = 5, calls: int = 20) -> float:
    import cupy

    ctx = engine.executor.default
    stream, graph = ctx.stream, ctx.replay_graph()
    for _ in range(3):
        graph.launch(stream=stream)
    best = float("inf")
    for _ in range(rounds):
        e0, e1 = cupy.cuda.Event(), cupy.cuda.Event()
        e0.record(stream)
        for _ in range(calls):
            graph.launch(stream=stream)
        e1.record(stream)
        e1.synchronize()
        best = min(best, cupy.cuda.get_elapsed_time(e0, e1) / calls)
    return best


EPILOGUE_KEYS = {"none": ("none", False, False), "bias": ("none", True, False),
                 "bias_res": ("none", True, True), "bias_gelu": ("gelu_tanh", True, False)}  # fmt: skip


def shape_key(row: dict) -> list:
    """gemm_tactics.shape_key of a row's GEMM: (batch, M, N, K, act, bias?, C?)."""
    return [row["group"], row["M"], row["N"], row["K"], *EPILOGUE_KEYS[row["epilogue"]]]


def bench_shape(m, n, k, epilogue, cache_dir, group: int = 1) -> dict:
    import graphc

    copies = max(2, min(8, WEIGHT_BUDGET // (n * k * 2 * group)))
    model, ref = gemm_model(m, n, k, epilogue, copies, group=group)
    rng = np.random.default_rng(1)
    feeds = {f"x{i}": rng.standard_normal((m, k)).astype(np.float16) for i in range(copies)}
    if epilogue == "bias_res":
        feeds["r"] = rng.standard_normal((m, n)).astype(np.float16)
    row = {"M": m, "N": n, "K": k, "epilogue": epilogue, "copies": copies, "group": group}
    for label, kw in (("graphc", {}), ("cublaslt", {"tactics": ["cublaslt"], "extra": {"tactics_force": True}})):
        t0 = time.perf_counter()
        eng = graphc.compile(model, target="cuda", precision="fp16", arch=["sm_90"], cache_dir=cache_dir, **kw)
        row[f"{label}_compile_s"] = round(time.perf_counter() - t0, 2)
        row[f"{label}_vendor_steps"] = sum(1 for s in eng.plan.steps if s.vendor is not None)
        out = eng.run(feeds)
        err = 0.0
        for name, x, w, b in ref[:2]:
            want = reference(feeds[x], feeds.get("r"), w, b, epilogue)
            got = np.asarray(out[name] if isinstance(out[name], np.ndarray) else out[name].get(), dtype=np.float32)
            err = max(err, float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30)))
        row[f"{label}_rel_err"] = err
        row[f"{label}_ms"] = replay_ms(eng, rounds=3, calls=10) / copies
        del eng
    row["speedup"] = row["graphc_ms"] / row["cublaslt_ms"]
    return row


def bench_models(batches: list[int], out_path: Path, cache_dir, prefer: list | None = None) -> None:
    import cupy

    import graphc
    import models
    from tools.bench_timing import Protocol, steady_ms

    tactic = {"tactics": ["cublaslt"]}
    if prefer is not None:  # this run's measured winners instead of the rule in gemm_tactics.py
        tactic["extra"] = {"tactics_prefer": prefer}
    for batch in batches:
        for name in ("bert", "vit"):
            model = models.build(name, size="full", batch=batch)
            feeds = models.sample_inputs(name, model, seed=0, batch=batch)
            shapes = {k: tuple(v.shape) for k, v in feeds.items()}
            row = {"model": name, "batch": batch}
            outs = {}
            for label, kw in (("graphc", {}), ("tactics", tactic)):
                eng = graphc.compile(
                    model, target="cuda", precision="fp16", arch=["sm_90"], shapes=shapes, cache_dir=cache_dir, **kw
                )
                row[f"{label}_vendor_steps"] = sum(1 for s in eng.plan.steps if s.vendor is not None)
                outs[label] = {k: np.asarray(v.get() if hasattr(v, "get") else v, np.float32)
                               for k, v in eng.run(feeds).items()}  # fmt: skip
                row[f"{label}_replay_ms"] = replay_ms(eng, rounds=5, calls=20)
                row[f"{label}_run_ms"] = steady_ms(
                    lambda e=eng, f=feeds: e.run(f), cupy.cuda.runtime.deviceSynchronize, Protocol()
                )
                del eng
            diffs = [float(np.abs(outs["graphc"][k] - outs["tactics"][k]).max()) for k in outs["graphc"]]
            scale = [float(np.abs(outs["graphc"][k]).max()) for k in outs["graphc"]]
            row["max_abs_diff"], row["max_abs_out"] = max(diffs), max(scale)
            row["replay_speedup"] = row["graphc_replay_ms"] / row["tactics_replay_ms"]
            print(json.dumps(row), flush=True)
            with out_path.open("a") as f:
                f.write(json.dumps(row) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="bench_tactics.jsonl")
    ap.add_argument("--quick", action="store_true", help="M = 128 and 4096 only")
    ap.add_argument("--models", action="store_true", help="whole models instead of GEMM shapes")
    ap.add_argument("--batches", default="32,1")
    ap.add_argument("--cache-dir", default=None)
    ap.add_argument("--ms", default=None, help="comma-separated M values (default: all)")
    ap.add_argument(
        "--then-models", action="store_true", help="after the shapes, the models with this run's winners taken"
    )
    ap.add_argument("--models-out", default="bench_tactics_models.jsonl")
    args = ap.parse_args()
    out = Path(args.out)
    batches = [int(b) for b in args.batches.split(",")]
    if args.models:
        bench_models(batches, out, args.cache_dir)
        return
    ms = [4096, 128] if args.quick else [int(x) for x in args.ms.split(",")] if args.ms else MS
    winners = []
    for m in ms:
        for name, n, k, epi in LAYERS:
            if name == "lm_head" and m not in (128, 1024):
                continue  # GPT-2's lm_head runs at batch 1 (M = 128) and on the last tokens
            group = 3 if name == "qkv" else 1
            try:
                row = bench_shape(m, n, k, epi, args.cache_dir, group)
            except Exception as e:  # a failure is a row, not the end of the sweep
                row = {"M": m, "N": n, "K": k, "epilogue": epi, "error": f"{type(e).__name__}: {e}"[:400]}
            row["layer"] = name
            print(json.dumps(row), flush=True)
            with out.open("a") as f:
                f.write(json.dumps(row) + "\n")
            if row.get("speedup", 0) > 1.0:
                winners.append(shape_key(row))
    if args.then_models:
        print("cuBLASLt faster on", winners, flush=True)
        bench_models(batches, Path(args.models_out), args.cache_dir, prefer=winners)


if __name__ == "__main__":
    main()
