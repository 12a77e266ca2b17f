"""ResNet with bottleneck blocks (v1.5: the stride sits on the 3x3 conv, as in torchvision).

Every conv is followed by a BatchNormalization node (not folded), so the graph is what an
exporter writes for a model in training form and Conv+BN folding has work to do.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import onnx
from onnx import TensorProto

from models._graph import DEFAULT_OPSET, Dim, GraphWriter

DESCRIPTION = "ResNet (bottleneck blocks, BatchNormalization); full = ResNet-50 at 224"
PRESETS: dict[str, dict] = {
    "tiny": {"depths": [1, 1, 1, 1], "base_width": 8, "image_size": 32, "num_classes": 10},
    "full": {"depths": [3, 4, 6, 3], "base_width": 64, "image_size": 224, "num_classes": 1000},
}
EXPANSION = 4
BN_EPS = 1e-5
# The last BN of each residual branch scales its output down so the residual sum's variance
# grows slowly with depth instead of doubling block after block (a trained ResNet does the same).
RESIDUAL_GAMMA = 0.35


def conv_bn(
    w: GraphWriter,
    x: str,
    c_in: int,
    c_out: int,
    k: int,
    stride: int,
    conv: str,
    bn: str,
    gamma: float = 1.0,
    relu: bool = True,
) -> str:
    """Conv (no bias) + BatchNormalization with running statistics near identity.

    The conv's init keeps the second moment of its input: He (2 / fan_in) where a ReLU follows
    (the downsample branch counts: a ReLU follows the residual Add), 1 / fan_in for conv3, whose
    output, scaled down by RESIDUAL_GAMMA, is added to the shortcut before any ReLU."""
    gain = 2.0 if relu else 1.0
    weight = w.normal(f"{conv}.weight", (c_out, c_in, k, k), math.sqrt(gain / (c_in * k * k)))
    p = k // 2
    y = w.op(
        "Conv",
        [x, weight],
        f"{conv}/Conv",
        kernel_shape=[k, k],
        strides=[stride, stride],
        pads=[p, p, p, p],
        dilations=[1, 1],
        group=1,
    )
    return batch_norm(w, y, c_out, bn, gamma)


def batch_norm(w: GraphWriter, x: str, c: int, bn: str, gamma: float = 1.0) -> str:
    scale = w.uniform(f"{bn}.weight", (c,), 0.8 * gamma, 1.2 * gamma)
    bias = w.normal(f"{bn}.bias", (c,), 0.05)
    mean = w.normal(f"{bn}.running_mean", (c,), 0.05)
    var = w.uniform(f"{bn}.running_var", (c,), 0.8, 1.25)
    return w.op("BatchNormalization", [x, scale, bias, mean, var], f"{bn}/BatchNormalization", epsilon=BN_EPS)


def bottleneck(w: GraphWriter, x: str, c_in: int, width: int, stride: int, prefix: str) -> str:
    c_out = width * EXPANSION
    y = conv_bn(w, x, c_in, width, 1, 1, f"{prefix}.conv1", f"{prefix}.bn1")
    y = w.op("Relu", [y], f"{prefix}/Relu")
    y = conv_bn(w, y, width, width, 3, stride, f"{prefix}.conv2", f"{prefix}.bn2")
    y = w.op("Relu", [y], f"{prefix}/Relu_1")
    y = conv_bn(w, y, width, c_out, 1, 1, f"{prefix}.conv3", f"{prefix}.bn3", RESIDUAL_GAMMA, relu=False)
    shortcut = x
    if stride != 1 or c_in != c_out:
        ds = f"{prefix}.downsample"
        shortcut = conv_bn(w, x, c_in, c_out, 1, stride, f"{ds}.0", f"{ds}.1")
    y = w.op("Add", [y, shortcut], f"{prefix}/Add")
    return w.op("Relu", [y], f"{prefix}/Relu_2")


def build(
    *,
    depths: Sequence[int] = (3, 4, 6, 3),
    base_width: int = 64,
    image_size: int = 224,
    num_classes: int = 1000,
    in_channels: int = 3,
    batch: Dim = "batch",
    opset: int = DEFAULT_OPSET,
    seed: int = 0,
) -> onnx.ModelProto:
    """Input `pixel_values` [batch, 3, H, W] -> `logits` [batch, num_classes].

    Stage i has depths[i] bottleneck blocks of width base_width * 2**i (output 4x that)."""
    config = {
        "model": "resnet",
        "depths": list(depths),
        "base_width": base_width,
        "image_size": image_size,
        "num_classes": num_classes,
        "in_channels": in_channels,
        "batch": batch,
        "opset": opset,
        "seed": seed,
    }
    w = GraphWriter("resnet", opset, seed)
    x = w.input("pixel_values", TensorProto.FLOAT, [batch, in_channels, image_size, image_size])
    y = conv_bn(w, x, in_channels, base_width, 7, 2, "conv1", "bn1")
    y = w.op("Relu", [y], "Relu")
    y = w.op("MaxPool", [y], "maxpool/MaxPool", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    c = base_width
    for stage, n in enumerate(depths):
        width = base_width * 2**stage
        for block in range(n):
            stride = 2 if stage > 0 and block == 0 else 1
            y = bottleneck(w, y, c, width, stride, f"layer{stage + 1}.{block}")
            c = width * EXPANSION
    y = w.op("GlobalAveragePool", [y], "avgpool/GlobalAveragePool")
    y = w.op("Flatten", [y], "Flatten", axis=1)
    y = w.gemm(y, c, num_classes, "fc")
    w.output(y, "logits", TensorProto.FLOAT, [batch, num_classes])
    return w.model(config, f"ResNet {list(depths)} base width {base_width} at {image_size}x{image_size}")


def sample_inputs(config: dict, shapes: dict[str, list[int]], rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {"pixel_values": rng.standard_normal(shapes["pixel_values"]).astype(np.float32)}
