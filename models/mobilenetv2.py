"""MobileNetV2: inverted residual blocks with depthwise convs and ReLU6 written as Clip(0, 6)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import onnx
from onnx import TensorProto

from models._graph import DEFAULT_OPSET, Dim, GraphWriter
from models.resnet import batch_norm

DESCRIPTION = "MobileNetV2 (depthwise convs, BatchNormalization, Clip as ReLU6); full = 1.0 at 224"
# (expansion t, channels c, repeats n, stride s) per stage, as in the paper and torchvision.
V2_SETTINGS = [
    [1, 16, 1, 1],
    [6, 24, 2, 2],
    [6, 32, 3, 2],
    [6, 64, 4, 2],
    [6, 96, 3, 1],
    [6, 160, 3, 2],
    [6, 320, 1, 1],
]
PRESETS: dict[str, dict] = {
    "tiny": {
        "settings": [[1, 8, 1, 1], [6, 8, 2, 2], [6, 16, 2, 2], [6, 24, 2, 2], [6, 32, 1, 1]],
        "stem_channels": 8,
        "last_channel": 64,
        "image_size": 32,
        "num_classes": 10,
    },
    "full": {
        "settings": V2_SETTINGS,
        "width_mult": 1.0,
        "stem_channels": 32,
        "last_channel": 1280,
        "image_size": 224,
        "num_classes": 1000,
    },
}
RESIDUAL_GAMMA = 0.5  # the projection BN of a block with a residual add (see resnet.RESIDUAL_GAMMA)


def make_divisible(v: float, divisor: int = 8) -> int:
    """torchvision's channel rounding: nearest multiple of divisor, never more than 10% below v."""
    new_v = max(divisor, int(v + divisor / 2) // divisor * divisor)
    return new_v + divisor if new_v < 0.9 * v else new_v


def conv_bn_act(
    w: GraphWriter,
    x: str,
    c_in: int,
    c_out: int,
    k: int,
    stride: int,
    prefix: str,
    group: int = 1,
    act: bool = True,
    gamma: float = 1.0,
) -> str:
    fan_in = (c_in // group) * k * k
    # He init before ReLU6; a linear (projection) conv keeps the variance with 1/fan_in.
    weight = w.normal(f"{prefix}.0.weight", (c_out, c_in // group, k, k), math.sqrt((2.0 if act else 1.0) / fan_in))
    p = (k - 1) // 2
    y = w.op(
        "Conv",
        [x, weight],
        f"{prefix}.0/Conv",
        kernel_shape=[k, k],
        strides=[stride, stride],
        pads=[p, p, p, p],
        dilations=[1, 1],
        group=group,
    )
    y = batch_norm(w, y, c_out, f"{prefix}.1", gamma)
    if act:
        y = w.op("Clip", [y, w.const(0.0), w.const(6.0)], f"{prefix}.2/Clip")
    return y


def inverted_residual(w: GraphWriter, x: str, c_in: int, c_out: int, stride: int, t: int, prefix: str) -> str:
    hidden = int(round(c_in * t))
    residual = stride == 1 and c_in == c_out
    y, i = x, 0
    if t != 1:
        y = conv_bn_act(w, y, c_in, hidden, 1, 1, f"{prefix}.conv.{i}")
        i += 1
    y = conv_bn_act(w, y, hidden, hidden, 3, stride, f"{prefix}.conv.{i}", group=hidden)
    y = conv_bn_act(
        w,
        y,
        hidden,
        c_out,
        1,
        1,
        f"{prefix}.conv.{i + 1}",
        act=False,
        gamma=RESIDUAL_GAMMA if residual else 1.0,
    )
    if residual:
        y = w.op("Add", [x, y], f"{prefix}/Add")
    return y


def build(
    *,
    settings: Sequence[Sequence[int]] = V2_SETTINGS,
    width_mult: float = 1.0,
    stem_channels: int = 32,
    last_channel: int = 1280,
    image_size: int = 224,
    num_classes: int = 1000,
    batch: Dim = "batch",
    opset: int = DEFAULT_OPSET,
    seed: int = 0,
) -> onnx.ModelProto:
    """Input `pixel_values` [batch, 3, H, W] -> `logits` [batch, num_classes].

    Channel counts (stem, stages, and the last conv when width_mult > 1) scale by width_mult and
    round to multiples of 8, as torchvision does."""
    config = {
        "model": "mobilenetv2",
        "settings": [list(s) for s in settings],
        "width_mult": width_mult,
        "stem_channels": stem_channels,
        "last_channel": last_channel,
        "image_size": image_size,
        "num_classes": num_classes,
        "batch": batch,
        "opset": opset,
        "seed": seed,
    }
    w = GraphWriter("mobilenetv2", opset, seed)
    x = w.input("pixel_values", TensorProto.FLOAT, [batch, 3, image_size, image_size])
    c = make_divisible(stem_channels * width_mult)
    y = conv_bn_act(w, x, 3, c, 3, 2, "features.0")
    index = 1
    for t, ch, n, s in settings:
        c_out = make_divisible(ch * width_mult)
        for i in range(n):
            y = inverted_residual(w, y, c, c_out, s if i == 0 else 1, t, f"features.{index}")
            c, index = c_out, index + 1
    last = make_divisible(last_channel * max(1.0, width_mult))
    y = conv_bn_act(w, y, c, last, 1, 1, f"features.{index}")
    y = w.op("GlobalAveragePool", [y], "GlobalAveragePool")
    y = w.op("Flatten", [y], "Flatten", axis=1)
    y = w.gemm(y, last, num_classes, "classifier.1")
    w.output(y, "logits", TensorProto.FLOAT, [batch, num_classes])
    return w.model(config, f"MobileNetV2 width {width_mult} at {image_size}x{image_size}")


def sample_inputs(config: dict, shapes: dict[str, list[int]], rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {"pixel_values": rng.standard_normal(shapes["pixel_values"]).astype(np.float32)}
