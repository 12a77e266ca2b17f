"""Small ONNX models around 1x1 convolutions, shared by the conv_sm90 tests (with and without a GPU)."""

from __future__ import annotations

import numpy as np
from onnx import ModelProto, TensorProto, helper, numpy_helper


def conv1x1_model(
    n: int, c: int, hw: int, k: int, *, bias: bool = True, residual: bool = True, stride: int = 1, seed: int = 0
) -> tuple[ModelProto, dict[str, np.ndarray]]:
    """y = Relu(Conv1x1(x, w) (+ b) (+ r)), NCHW in and out, and a feed for it. A 3x3 conv in front
    keeps the 1x1 conv's input inside the NHWC region (as in a ResNet block)."""
    rng = np.random.default_rng(seed)
    out_hw = (hw - 1) // stride + 1
    inits = {
        "w0": (rng.standard_normal((c, c, 3, 3)) / np.sqrt(9 * c)).astype(np.float32),
        "w": (rng.standard_normal((k, c, 1, 1)) / np.sqrt(c)).astype(np.float32),
    }
    conv_in = ["x1", "w"]
    if bias:
        inits["b"] = rng.standard_normal(k).astype(np.float32)
        conv_in.append("b")
    nodes = [
        helper.make_node("Conv", ["x", "w0"], ["x1"], pads=[1, 1, 1, 1]),
        helper.make_node("Conv", conv_in, ["t"], strides=[stride, stride]),
    ]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, c, hw, hw])]
    last = "t"
    if residual:
        nodes.append(helper.make_node("Add", ["t", "r"], ["u"]))
        inputs.append(helper.make_tensor_value_info("r", TensorProto.FLOAT, [n, k, out_hw, out_hw]))
        last = "u"
    nodes.append(helper.make_node("Relu", [last], ["y"]))
    g = helper.make_graph(
        nodes,
        "conv1x1",
        inputs,
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [n, k, out_hw, out_hw])],
        [numpy_helper.from_array(a, name) for name, a in inits.items()],
    )
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 10
    feeds = {"x": rng.standard_normal((n, c, hw, hw)).astype(np.float32)}
    if residual:
        feeds["r"] = rng.standard_normal((n, k, out_hw, out_hw)).astype(np.float32)
    return model, feeds


def reference(model: ModelProto, feeds: dict[str, np.ndarray]) -> np.ndarray:
    """float64 numpy: the 3x3 conv, the 1x1 conv, bias, residual, ReLU."""
    w = {t.name: numpy_helper.to_array(t).astype(np.float64) for t in model.graph.initializer}
    x = feeds["x"].astype(np.float64)
    n, c, h, wd = x.shape
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    x1 = np.zeros_like(x)
    for dy in range(3):
        for dx in range(3):
            x1 += np.einsum("nchw,kc->nkhw", xp[:, :, dy : dy + h, dx : dx + wd], w["w0"][:, :, dy, dx])
    conv = next(nd for nd in model.graph.node if nd.input[0] == "x1")
    stride = next((a.ints[0] for a in conv.attribute if a.name == "strides"), 1)
    y = np.einsum("nchw,kc->nkhw", x1[:, :, ::stride, ::stride], w["w"][:, :, 0, 0])
    if "b" in w:
        y += w["b"][None, :, None, None]
    if "r" in feeds:
        y += feeds["r"]
    return np.maximum(y, 0.0)
