"""SPATIAL_MEAN (passes/canonicalize.py): the dynamo exporter's ReduceMean over every spatial axis
(keepdims) becomes the GlobalAveragePool TorchScript writes, so a squeeze-excitation block of a
CNN stays in the convolutions' NHWC layout on CUDA (no Transposes around the mean), and the
result is the mean it was (against ONNX Runtime)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import graphc
from graphc.passes import OptimizeOptions, optimize
from graphc.passes.target import Target
from tests.helpers import OnnxNet, run_ort

RNG = np.random.default_rng(3)
N, C, HW = 2, 16, 9


def _se_block(mean: str, axes=(-1, -2), keepdims: int = 1) -> onnx.ModelProto:
    """conv -> relu -> mean over H, W -> 1x1 conv -> sigmoid -> scale the channels -> conv."""
    net = OnnxNet()
    x = net.input("x", TensorProto.FLOAT, [N, C, HW, HW])

    def conv(v: str, k: int = 3) -> str:
        w = net.c(RNG.normal(0, 1 / np.sqrt(C * k * k), (C, C, k, k)))
        return net.op("Conv", v, w, net.c(RNG.normal(0, 0.1, C)), pads=[k // 2] * 4)

    h = net.op("Relu", conv(x))
    if mean == "reduce_mean":
        s = net.op("ReduceMean", h, net.i64(list(axes)), keepdims=keepdims)
    else:
        s = net.op("GlobalAveragePool", h)
    if keepdims == 0:
        s = net.op("Unsqueeze", s, net.i64([2, 3]))
    gate = net.op("Sigmoid", conv(s, 1))
    y = conv(net.op("Mul", h, gate))
    return net.make([helper.make_tensor_value_info(y, TensorProto.FLOAT, [N, C, HW, HW])], opset=18)


def _cuda_graph(model: onnx.ModelProto):
    target = Target(name="cuda", precision="fp16")
    return optimize(graphc.load_onnx(model), OptimizeOptions(opt_level=2, target=target)).graph


def test_reduce_mean_becomes_the_pool_and_stays_nhwc():
    dyn, ts = _cuda_graph(_se_block("reduce_mean")).op_counts(), _cuda_graph(_se_block("pool")).op_counts()
    assert "ReduceMean" not in dyn and dyn.get("graphc.GlobalAveragePoolNHWC") == 1, dyn  # the NHWC pool
    assert dyn == ts, (dyn, ts)  # the same plan as TorchScript's spelling: the input's and output's layout changes only


@pytest.mark.parametrize("axes", [(-1, -2), (2, 3), (3, 2)])
def test_same_mean_as_onnxruntime(axes):
    model = _se_block("reduce_mean", axes)
    feeds = {"x": RNG.normal(0, 1, (N, C, HW, HW)).astype(np.float32)}
    want = next(iter(run_ort(model, feeds).values()))
    got = next(iter(graphc.compile(model, target="cpu", shapes={"x": feeds["x"].shape}).run(feeds).values()))
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max()))


@pytest.mark.parametrize(("axes", "keepdims"), [((1, 2, 3), 1), ((2,), 1), ((-1, -2), 0)])
def test_other_means_stay(axes, keepdims):
    """Over the channels too, over one spatial axis, or without the kept dims: not a global pool."""
    net = OnnxNet()
    x = net.input("x", TensorProto.FLOAT, [N, C, HW, HW])
    y = net.op("ReduceMean", x, net.i64(list(axes)), keepdims=keepdims)
    out = helper.make_tensor_value_info(y, TensorProto.UNDEFINED, None)
    g = optimize(graphc.load_onnx(net.make([out], infer=True)))
    assert g.graph.op_counts().get("ReduceMean") == 1 and "GlobalAveragePool" not in g.graph.op_counts()


def test_a_sequence_mean_stays():
    """Rank 3 (batch, seq, hidden) over the last axis is a LayerNorm / RMSNorm statistic: kept as
    ReduceMean for their matchers (LLaMA's RMSNorm from the dynamo exporter)."""
    net = OnnxNet()
    x = net.input("x", TensorProto.FLOAT, [N, 5, C])
    y = net.op("ReduceMean", net.op("Mul", x, x), net.i64([-1]), keepdims=1)
    out = helper.make_tensor_value_info(y, TensorProto.UNDEFINED, None)
    g = optimize(graphc.load_onnx(net.make([out], infer=True)))
    assert g.graph.op_counts().get("ReduceMean") == 1 and "GlobalAveragePool" not in g.graph.op_counts()
