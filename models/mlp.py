"""MLP: fully connected layers with ReLU, as Gemm or as MatMul + Add."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from models._graph import DEFAULT_OPSET, Dim, GraphWriter

DESCRIPTION = "multilayer perceptron: Gemm (or MatMul+Add) + Relu layers"
PRESETS: dict[str, dict] = {
    "tiny": {"in_features": 64, "hidden": [128, 128], "out_features": 10},
    "full": {"in_features": 1024, "hidden": [4096, 4096, 4096], "out_features": 1000},
}


def build(
    *,
    in_features: int = 64,
    hidden: Sequence[int] = (128, 128),
    out_features: int = 10,
    linear: str = "gemm",
    batch: Dim = "batch",
    opset: int = DEFAULT_OPSET,
    seed: int = 0,
) -> onnx.ModelProto:
    """Input `input` [batch, in_features] -> `logits` [batch, out_features].

    linear="gemm" writes Gemm(x, W, b, transB=1) per layer; "matmul" writes MatMul + Add."""
    if linear not in ("gemm", "matmul"):
        raise ValueError(f"linear must be 'gemm' or 'matmul', not {linear!r}")
    config = {
        "model": "mlp",
        "in_features": in_features,
        "hidden": list(hidden),
        "out_features": out_features,
        "linear": linear,
        "batch": batch,
        "opset": opset,
        "seed": seed,
    }
    w = GraphWriter("mlp", opset, seed)
    x = w.input("input", TensorProto.FLOAT, [batch, in_features])
    widths = [in_features, *hidden, out_features]
    for i, (d_in, d_out) in enumerate(zip(widths[:-1], widths[1:], strict=True)):
        last = i == len(widths) - 2
        # He init before a ReLU keeps the activations' second moment near 1; the last layer is linear.
        std = math.sqrt((1.0 if last else 2.0) / d_in)
        prefix = f"layers.{i}"
        x = w.gemm(x, d_in, d_out, prefix, std) if linear == "gemm" else w.linear(x, d_in, d_out, prefix, std)
        if not last:
            x = w.op("Relu", [x], f"{prefix}/Relu")
    w.output(x, "logits", TensorProto.FLOAT, [batch, out_features])
    return w.model(config, f"MLP {in_features}-{'-'.join(map(str, hidden))}-{out_features} ({linear})")


def sample_inputs(config: dict, shapes: dict[str, list[int]], rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {"input": rng.standard_normal(shapes["input"]).astype(np.float32)}


def residual_mlp_model(m: int, d: int, h: int, rng: np.random.Generator, scaled: bool = True):
    """y = relu(x @ w1 + b1) @ w2 + x over x [m, d] float32 (a transformer MLP block with a
    residual), and its weights by name; `scaled` divides each weight by sqrt(fan-in). Here rather
    than in tests/ so that tools run on the GPU machine import it too (with tests/ on sys.path,
    tests/graphc would shadow the installed package)."""
    w1 = rng.standard_normal((d, h)) / (np.sqrt(d) if scaled else 1.0)
    b1 = rng.standard_normal(h)
    w2 = rng.standard_normal((h, d)) / (np.sqrt(h) if scaled else 1.0)
    weights = {"w1": w1.astype(np.float32), "b1": b1.astype(np.float32), "w2": w2.astype(np.float32)}
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["t"]),
        helper.make_node("Add", ["t", "b1"], ["u"]),
        helper.make_node("Relu", ["u"], ["v"]),
        helper.make_node("MatMul", ["v", "w2"], ["z"]),
        helper.make_node("Add", ["z", "x"], ["y"]),
    ]
    g = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, d])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, d])],
        [numpy_helper.from_array(a, n) for n, a in weights.items()],
    )
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 10
    return model, weights
