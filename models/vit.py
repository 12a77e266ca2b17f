"""Vision Transformer (pre-LN): patch embedding Conv, class token, position embedding,
transformer blocks, final LayerNorm, class-token head."""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import TensorProto

from models._graph import DEFAULT_OPSET, Dim, GraphWriter, layernorm_form
from models._transformer import attention, mlp

DESCRIPTION = "Vision Transformer (patch Conv, class token, pre-LN blocks, Gemm head); full = ViT-B/16 at 224"
PRESETS: dict[str, dict] = {
    "tiny": {
        "image_size": 32,
        "patch_size": 8,
        "hidden_size": 32,
        "num_layers": 2,
        "num_heads": 4,
        "mlp_size": 64,
        "num_classes": 10,
    },
    "full": {
        "image_size": 224,
        "patch_size": 16,
        "hidden_size": 768,
        "num_layers": 12,
        "num_heads": 12,
        "mlp_size": 3072,
        "num_classes": 1000,
    },
}
LN_EPS = 1e-6


def build(
    *,
    image_size: int = 224,
    patch_size: int = 16,
    hidden_size: int = 768,
    num_layers: int = 12,
    num_heads: int = 12,
    mlp_size: int = 3072,
    num_classes: int = 1000,
    in_channels: int = 3,
    layernorm: str | None = None,
    qkv: str = "separate",
    batch: Dim = "batch",
    opset: int = DEFAULT_OPSET,
    seed: int = 0,
) -> onnx.ModelProto:
    """Input `pixel_values` [batch, 3, H, W] -> `logits` [batch, num_classes].

    layernorm as in bert.build; qkv="separate" (three projections) or "fused" (one, then Split)."""
    ln = layernorm_form(layernorm, opset)
    if image_size % patch_size:
        raise ValueError(f"image size {image_size} is not a multiple of patch size {patch_size}")
    cfg = {
        "model": "vit",
        "image_size": image_size,
        "patch_size": patch_size,
        "hidden_size": hidden_size,
        "num_layers": num_layers,
        "num_heads": num_heads,
        "mlp_size": mlp_size,
        "num_classes": num_classes,
        "in_channels": in_channels,
        "layernorm": ln,
        "qkv": qkv,
        "batch": batch,
        "opset": opset,
        "seed": seed,
    }
    tokens = (image_size // patch_size) ** 2 + 1
    # Each block adds two branches to the residual stream; scaling their output projections by
    # 1/sqrt(2 * layers) keeps the stream O(1) however deep the model is.
    out_std = 1 / math.sqrt(2 * num_layers)
    w = GraphWriter("vit", opset, seed)
    x = w.input("pixel_values", TensorProto.FLOAT, [batch, in_channels, image_size, image_size])

    fan_in = in_channels * patch_size * patch_size
    pw = w.normal("patch_embed.proj.weight", (hidden_size, in_channels, patch_size, patch_size), 1 / math.sqrt(fan_in))
    pb = w.normal("patch_embed.proj.bias", (hidden_size,), 0.02)
    y = w.op(
        "Conv",
        [x, pw, pb],
        "patch_embed.proj/Conv",
        kernel_shape=[patch_size] * 2,
        strides=[patch_size] * 2,
        pads=[0, 0, 0, 0],
        dilations=[1, 1],
        group=1,
    )
    y = w.op("Reshape", [y, w.i64([0, 0, -1])], "patch_embed/Reshape")  # flatten(2): [b, hidden, patches]
    y = w.op("Transpose", [y], "patch_embed/Transpose", perm=[0, 2, 1])  # [b, patches, hidden]

    # The class token, expanded to the batch (taken from the input's shape, so batch may be symbolic).
    cls = w.normal("cls_token", (1, 1, hidden_size), 1.0)
    shape = w.op("Shape", [x], "Shape")
    b = w.slice(shape, w.i64([0]), w.i64([1]), [0], "Slice")
    cls_shape = w.op("Concat", [b, w.i64([1, hidden_size])], "Concat", axis=0)
    cls = w.op("Expand", [cls, cls_shape], "Expand")
    y = w.op("Concat", [cls, y], "Concat_1", axis=1)  # [b, tokens, hidden]
    pos = w.normal("pos_embed", (1, tokens, hidden_size), 0.5)
    y = w.op("Add", [y, pos], "Add")

    for i in range(num_layers):
        p = f"blocks.{i}"
        h = w.layer_norm(y, hidden_size, f"{p}.norm1", ln, LN_EPS)
        h = attention(
            w,
            h,
            hidden_size,
            num_heads,
            f"{p}.attn",
            f"{p}.attn.proj",
            None,
            qkv,
            out_std / math.sqrt(hidden_size),
        )
        y = w.op("Add", [y, h], f"{p}/Add")
        h = w.layer_norm(y, hidden_size, f"{p}.norm2", ln, LN_EPS)
        h = mlp(w, h, hidden_size, mlp_size, f"{p}.mlp.fc1", f"{p}.mlp.fc2", out_std / math.sqrt(mlp_size))
        y = w.op("Add", [y, h], f"{p}/Add_1")
    y = w.layer_norm(y, hidden_size, "norm", ln, LN_EPS)
    y = w.op("Gather", [y, w.i64(0)], "Gather", axis=1)  # the class token: [b, hidden]
    y = w.gemm(y, hidden_size, num_classes, "head")
    w.output(y, "logits", TensorProto.FLOAT, [batch, num_classes])
    return w.model(cfg, f"ViT patch {patch_size} at {image_size}, {num_layers} layers, hidden {hidden_size}")


def sample_inputs(config: dict, shapes: dict[str, list[int]], rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {"pixel_values": rng.standard_normal(shapes["pixel_values"]).astype(np.float32)}
