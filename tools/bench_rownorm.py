"""LayerNorm / RMSNorm launches at transformer sizes on a GPU: graphc's row-wise kernel with its
scale and bias preloaded (the default) and without (scalar loads after the reductions), against
PyTorch's layer_norm / rms_norm, in one run.

    python tools/bench_rownorm.py [--rows 128,1024,4096] [--width 768] [--depth 8] [--out FILE]

Each side runs a chain of `depth` norms (each with its own scale and bias, so nothing is shared or
folded) as one CUDA graph: graphc's engine graph (fp16 in and out) and a torch.cuda.CUDAGraph
around the same chain in fp16; the graph's replay time over `depth` is the time per launch with
launch gaps included, as in a whole model. Every output is checked against numpy in float64.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def chain_model(op: str, rows: int, width: int, depth: int, seed: int = 0):
    """An ONNX model of `depth` LayerNormalization (or RMSNormalization) nodes in a row, and its
    parameters (scale, bias) per node."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    nodes, inits, params = [], [], []
    prev = "x"
    for i in range(depth):
        s = (1 + 0.1 * rng.standard_normal(width)).astype(np.float32)
        b = (0.1 * rng.standard_normal(width)).astype(np.float32)
        ins = [prev, f"s{i}"] + ([f"b{i}"] if op == "LayerNormalization" else [])
        out = f"y{i}" if i < depth - 1 else "y"
        nodes.append(helper.make_node(op, ins, [out], axis=-1, epsilon=1e-5))
        inits.append(numpy_helper.from_array(s, f"s{i}"))
        if op == "LayerNormalization":
            inits.append(numpy_helper.from_array(b, f"b{i}"))
        params.append((s, b if op == "LayerNormalization" else None))
        prev = out
    g = helper.make_graph(
        nodes,
        "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [rows, width])],
        inits,
    )
    opset = 23 if op == "RMSNormalization" else 17
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)]), params


def reference(x: np.ndarray, params, op: str) -> np.ndarray:
    y = x.astype(np.float64)
    for s, b in params:
        if op == "LayerNormalization":
            y = y - y.mean(-1, keepdims=True)
        y = y / np.sqrt((y * y).mean(-1, keepdims=True) + 1e-5) * s
        if b is not None:
            y = y + b
    return y


def graphc_ms(model, x: np.ndarray, preload: bool) -> tuple[float, np.ndarray]:
    import cupy

    import graphc
    from graphc.codegen.families import reduction
    from tools.bench_timing import Protocol, graphc_replay_ms

    saved = reduction._preloaded
    if not preload:  # the scalar loads of the code before 2026-12-04
        reduction._preloaded = lambda ctx, an, xs, axis, r, vec, scale, bias: (scale, bias, [])
    try:
        eng = graphc.compile(model, target="cuda", precision="fp16", io_precision="fp16")
    finally:
        reduction._preloaded = saved
    feeds = {"x": cupy.asarray(x.astype(np.float16))}
    out = eng.run(feeds)["y"]
    y = cupy.asnumpy(out).astype(np.float64)
    return graphc_replay_ms(eng, Protocol(warmup=20, rounds=5, calls=100)), y


def torch_ms(x: np.ndarray, params, op: str) -> tuple[float, np.ndarray]:
    import torch

    from tools.bench_timing import Protocol, torch_capture, torch_replay_ms

    xt = torch.tensor(x, device="cuda", dtype=torch.float16)
    ws = [
        (
            torch.tensor(s, device="cuda", dtype=torch.float16),
            None if b is None else torch.tensor(b, device="cuda", dtype=torch.float16),
        )
        for s, b in params
    ]
    width = x.shape[-1]

    def chain() -> Any:
        y = xt
        for s, b in ws:
            if op == "LayerNormalization":
                y = torch.nn.functional.layer_norm(y, (width,), s, b, 1e-5)
            else:
                y = torch.nn.functional.rms_norm(y, (width,), s, 1e-5)
        return y

    held: dict[str, Any] = {}
    graph = torch_capture(lambda: held.__setitem__("y", chain()))
    ms = torch_replay_ms(graph, Protocol(warmup=20, rounds=5, calls=100))  # held["y"]: the graph's output
    return ms, held["y"].double().cpu().numpy()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="128,1024,4096")
    ap.add_argument("--width", type=int, default=768)
    ap.add_argument("--depth", type=int, default=8)
    ap.add_argument("--ops", default="LayerNormalization,RMSNormalization")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    lines = [
        "| op | rows x width | graphc preloaded us | graphc scalar us | torch us | max err (graphc, torch) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    bad = 0
    for op in a.ops.split(","):
        for rows in (int(r) for r in a.rows.split(",")):
            model, params = chain_model(op, rows, a.width, a.depth)
            x = np.random.default_rng(1).standard_normal((rows, a.width)).astype(np.float32)
            ref = reference(x.astype(np.float16).astype(np.float64), params, op)
            on, y_on = graphc_ms(model, x, True)
            off, y_off = graphc_ms(model, x, False)
            t, y_t = torch_ms(x, params, op)
            errs = [float(np.abs(y - ref).max()) for y in (y_on, y_off, y_t)]
            bad += errs[0] > 0.05 or errs[1] > 0.05
            per = 1000 / a.depth
            lines.append(
                f"| {op} | {rows} x {a.width} | {on * per:.2f} | {off * per:.2f} | {t * per:.2f} | "
                f"{errs[0]:.3g} / {errs[1]:.3g}, {errs[2]:.3g} |"
            )
            print(lines[-1], flush=True)
    text = "\n".join(lines)
    print(text)
    if a.out:
        a.out.write_text(text + "\n")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
