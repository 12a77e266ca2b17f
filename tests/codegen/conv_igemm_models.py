"""One-conv ONNX models for the wgmma implicit-GEMM conv tests (with and without a GPU), and their
float64 numpy reference."""

from __future__ import annotations

import numpy as np
from onnx import ModelProto, TensorProto, helper, numpy_helper


def out_size(hw: int, r: int, stride: int, pad: int) -> int:
    return (hw + 2 * pad - r) // stride + 1


def conv_model(
    n: int,
    c: int,
    hw: int,
    k: int,
    r: int,
    stride: int = 1,
    *,
    bias: bool = True,
    residual: bool = False,
    relu: bool = True,
    seed: int = 0,
) -> tuple[ModelProto, dict[str, np.ndarray]]:
    """y = [Relu](Conv_RxR(x, w, pads R // 2, strides) [+ b] [+ r]), NCHW in and out, and a feed."""
    rng = np.random.default_rng(seed)
    pad = r // 2
    oh = out_size(hw, r, stride, pad)
    inits = {"w": (rng.standard_normal((k, c, r, r)) / np.sqrt(c * r * r)).astype(np.float32)}
    conv_in = ["x", "w"]
    if bias:
        inits["b"] = rng.standard_normal(k).astype(np.float32)
        conv_in.append("b")
    nodes = [helper.make_node("Conv", conv_in, ["t"], strides=[stride, stride], pads=[pad] * 4)]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, c, hw, hw])]
    last = "t"
    if residual:
        nodes.append(helper.make_node("Add", [last, "res"], ["u"]))
        inputs.append(helper.make_tensor_value_info("res", TensorProto.FLOAT, [n, k, oh, oh]))
        last = "u"
    if relu:
        nodes.append(helper.make_node("Relu", [last], ["v"]))
        last = "v"
    nodes.append(helper.make_node("Identity", [last], ["y"]))
    g = helper.make_graph(
        nodes,
        "conv",
        inputs,
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [n, k, oh, oh])],
        [numpy_helper.from_array(a, name) for name, a in inits.items()],
    )
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 10
    feeds = {"x": rng.standard_normal((n, c, hw, hw)).astype(np.float32)}
    if residual:
        feeds["res"] = rng.standard_normal((n, k, oh, oh)).astype(np.float32)
    return model, feeds


def reference(model: ModelProto, feeds: dict[str, np.ndarray]) -> np.ndarray:
    """float64 numpy: the convolution as a sum over taps, bias, residual, ReLU."""
    w = {t.name: numpy_helper.to_array(t).astype(np.float64) for t in model.graph.initializer}
    conv = model.graph.node[0]
    stride = next(a.ints[0] for a in conv.attribute if a.name == "strides")
    pad = next(a.ints[0] for a in conv.attribute if a.name == "pads")
    x = feeds["x"].astype(np.float64)
    n, c, hw, _ = x.shape
    k, _, r, _ = w["w"].shape
    oh = out_size(hw, r, stride, pad)
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    y = np.zeros((n, k, oh, oh))
    for dy in range(r):
        for dx in range(r):
            win = xp[:, :, dy : dy + stride * (oh - 1) + 1 : stride, dx : dx + stride * (oh - 1) + 1 : stride]
            y += np.einsum("nchw,kc->nkhw", win, w["w"][:, :, dy, dx])
    if "b" in w:
        y += w["b"][None, :, None, None]
    if "res" in feeds:
        y += feeds["res"]
    if any(nd.op_type == "Relu" for nd in model.graph.node):
        y = np.maximum(y, 0.0)
    return y
