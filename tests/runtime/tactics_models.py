"""Small fp16 ONNX GEMM models for the cuBLASLt tactic's tests (CPU and GPU)."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper


def gemm_model(m: int, n: int, k: int, epilogue: str = "bias_gelu", *, trans_b: bool = False, batch: int = 0,
               alpha: float = 1.0, seed: int = 0):  # fmt: skip
    """y = epi(x @ W (+ b)), x [m, k] (or [batch, m, k]), W [k, n] (Gemm transB=1: W stored [n, k]).
    epilogue: none | bias | bias_relu | bias_gelu | bias_gelu_erf | bias_res | res. Returns the model
    and a numpy function of the feeds."""
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((n, k) if trans_b else (k, n)) / np.sqrt(k)).astype(np.float16)
    b = (rng.standard_normal(n) * 0.5).astype(np.float16)
    xs = [batch, m, k] if batch else [m, k]
    ys = [batch, m, n] if batch else [m, n]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT16, xs)]
    inits = [numpy_helper.from_array(w, "W")]
    if trans_b:
        nodes = [helper.make_node("Gemm", ["x", "W"], ["mm"], transB=1, alpha=alpha)]
    else:
        nodes = [helper.make_node("MatMul", ["x", "W"], ["mm0"])]
        if alpha != 1.0:
            inits.append(numpy_helper.from_array(np.array(alpha, np.float16), "alpha"))
            nodes.append(helper.make_node("Mul", ["mm0", "alpha"], ["mm"]))
        else:
            nodes[0] = helper.make_node("MatMul", ["x", "W"], ["mm"])
    cur = "mm"
    if epilogue.startswith("bias"):
        inits.append(numpy_helper.from_array(b, "b"))
        nodes.append(helper.make_node("Add", [cur, "b"], ["ab"]))
        cur = "ab"
    if epilogue == "bias_relu":
        nodes.append(helper.make_node("Relu", [cur], ["act"]))
        cur = "act"
    if epilogue in ("bias_gelu", "bias_gelu_erf"):
        kw = {"approximate": "tanh"} if epilogue == "bias_gelu" else {}
        nodes.append(helper.make_node("Gelu", [cur], ["act"], **kw))
        cur = "act"
    if epilogue.endswith("res"):
        inputs.append(helper.make_tensor_value_info("r", TensorProto.FLOAT16, ys))
        nodes.append(helper.make_node("Add", [cur, "r"], ["res"]))
        cur = "res"
    nodes[-1].output[0] = "y"  # the last node writes the graph output
    g = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT16, ys)], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)])

    def ref(feeds):
        x = feeds["x"].astype(np.float32)
        wf = w.astype(np.float32)
        y = alpha * (x @ (wf.T if trans_b else wf))
        if epilogue.startswith("bias"):
            y = y + b.astype(np.float32)
        if epilogue == "bias_relu":
            y = np.maximum(y, 0)
        if epilogue == "bias_gelu":
            y = 0.5 * y * (1 + np.tanh(np.sqrt(2 / np.pi) * (y + 0.044715 * y**3)))
        if epilogue == "bias_gelu_erf":
            from math import erf

            y = 0.5 * y * (1 + np.vectorize(erf)(y / np.sqrt(2)))
        if epilogue.endswith("res"):
            y = y + feeds["r"].astype(np.float32)
        return y

    def feeds(seed: int = 1):
        r = np.random.default_rng(seed)
        f = {"x": r.standard_normal(xs).astype(np.float16)}
        if epilogue.endswith("res"):
            f["r"] = r.standard_normal(ys).astype(np.float16)
        return f

    return model, ref, feeds


def softmax_between_matmuls(rng: np.random.Generator):
    """MatMul -> Softmax -> MatMul in fp16 ([256, 64] in and out; a graphc kernel between two vendor
    steps), with x drawn from `rng` and the numpy reference: (model, x, want)."""
    w1 = (rng.standard_normal((64, 128)) / 8).astype(np.float16)
    w2 = (rng.standard_normal((128, 64)) / 11).astype(np.float16)
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["h"]),
        helper.make_node("Softmax", ["h"], ["s"], axis=-1),
        helper.make_node("MatMul", ["s", "W2"], ["y"]),
    ]
    g = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [256, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [256, 64])],
        [numpy_helper.from_array(w1, "W1"), numpy_helper.from_array(w2, "W2")],
    )  # fmt: skip
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)])
    x = rng.standard_normal((256, 64)).astype(np.float16)
    h = x.astype(np.float32) @ w1.astype(np.float32)
    s = np.exp(h - h.max(-1, keepdims=True))
    return model, x, (s / s.sum(-1, keepdims=True)) @ w2.astype(np.float32)
