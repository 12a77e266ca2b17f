"""ConvTranspose as a convolution, for the CUDA target (which has convolution kernels, not
transposed ones).

A transposed convolution with strides s, dilations d, kernel k and begin pads p scatters every
input element over the output; the same numbers come from a stride-1 convolution of the input with
s - 1 zeros inserted between neighbours, padded by d*(k-1) - p on each side (the end side also
absorbing output_padding and output_shape), with the kernel flipped in space and its two channel
axes swapped per group. Here:

    x [N, C, D...] -> Reshape [N, C, D1, 1, D2, 1, ...] -> Pad the unit axes to s - 1 more
      -> Reshape [N, C, D1*s1, ...]                (zeros inserted; skipped where s = 1)
      -> Slice                                     (only where a pad comes out negative: a crop)
      -> Conv(w', b, dilations=d, pads=...)        (w' transposed and flipped at compile time)

The convolution then takes part in everything else (NHWC layout, tensor cores, bias and
activation epilogues). The cost: with strides s the convolution multiplies by s1*s2*... times more
zeros than a direct kernel would skip, which the compile log reports as a warning for each such
node. The weight must be a constant (it is re-laid-out here); otherwise the node stays and the
CUDA target names it as an op without a kernel.
"""

from __future__ import annotations

import logging
import math

import numpy as np

from graphc.ir.builder import GraphBuilder
from graphc.ir.graph import Graph, Node, Value
from graphc.ops.nn import conv_transpose_geometry
from graphc.passes.rewrite import Const, Match, Op, Rule, Var, apply_rules, static_shape

log = logging.getLogger(__name__)

RULE = "conv_transpose(x, w, b) -> conv(zero_insert(x), flip(swap(w)), b)"


def conv_weight_of(w: np.ndarray, group: int) -> np.ndarray:
    """ConvTranspose's weight (C_in, C_out/g, *k) as Conv's (C_out, C_in/g, *k), flipped in space."""
    c_in, m_g = w.shape[:2]
    k = w.shape[2:]
    per_group = w.reshape(group, c_in // group, m_g, *k).swapaxes(1, 2)
    conv_w = per_group.reshape(group * m_g, c_in // group, *k)
    return np.ascontiguousarray(np.flip(conv_w, axis=tuple(range(2, 2 + len(k)))))


def _zero_insert(b: GraphBuilder, x: Value, shape: tuple[int, ...], strides: tuple[int, ...], name: str) -> Value:
    """x with s - 1 zeros after every element along each spatial axis (also after the last one)."""
    spread = [*shape[:2]]
    for size in shape[2:]:
        spread += [size, 1]
    x = b.op("Reshape", [x, b.add_constant(np.array(spread, np.int64), f"{name}/spread_shape")], name=f"{name}/spread")
    pads = [0] * (2 * len(spread))
    for i, s in enumerate(strides):
        pads[len(spread) + 3 + 2 * i] = s - 1  # the end of the unit axis after spatial dim i
    x = b.op("Pad", [x, b.add_constant(np.array(pads, np.int64), f"{name}/zeros")], name=f"{name}/insert_zeros")
    merged = [*shape[:2], *(size * s for size, s in zip(shape[2:], strides, strict=True))]
    return b.op(
        "Reshape", [x, b.add_constant(np.array(merged, np.int64), f"{name}/merged_shape")], name=f"{name}/merge"
    )


def _rewrite(m: Match, b: GraphBuilder) -> Value | None:
    root: Node = m.root
    shape = static_shape(root.inputs[0])
    out = static_shape(root.outputs[0])
    if shape is None or out is None:
        return None
    a = root.attrs
    w = m.const("w")
    n = len(shape) - 2
    geom = conv_transpose_geometry(a, shape[2:], w.shape[2:], _raise)
    name = root.name
    x = m.value("x")
    strided = any(s > 1 for s in geom.strides)
    if strided:
        x = _zero_insert(b, x, shape, geom.strides, name)
        log.warning(
            "ConvTranspose node '%s' (strides %s): runs as a convolution over a zero-upsampled input, "
            "%dx the multiplications of a direct kernel (graphc has no transposed-convolution kernel)",
            name,
            list(geom.strides),
            math.prod(geom.strides),
        )
    # Window of the (zero-inserted) input the convolution reads, per spatial dim: from -left to
    # -left + out + d*(k-1), where left = d*(k-1) - pads_begin. Positive parts are the conv's pads,
    # negative parts a crop.
    pads_begin, pads_end, starts, ends, sizes = [], [], [], [], []
    for i in range(n):
        size = shape[2 + i] * geom.strides[i] if strided else shape[2 + i]
        reach = geom.dilations[i] * (geom.kernel[i] - 1)
        left = reach - int(geom.pads_begin[i])  # type: ignore[arg-type]
        right = out[2 + i] + reach - left - size
        pads_begin.append(max(left, 0))
        pads_end.append(max(right, 0))
        starts.append(max(-left, 0))
        ends.append(size + min(right, 0))
        sizes.append(size)
    if starts != [0] * n or ends != sizes:
        x = b.op(
            "Slice",
            [
                x,
                b.add_constant(np.array(starts, np.int64), f"{name}/crop_starts"),
                b.add_constant(np.array(ends, np.int64), f"{name}/crop_ends"),
                b.add_constant(np.array(range(2, 2 + n), np.int64), f"{name}/crop_axes"),
            ],
            name=f"{name}/crop",
        )
    conv_w = b.add_constant(conv_weight_of(w, int(a.group)), f"{name}/conv_weight")
    bias = m.new(root.inputs[2]) if len(root.inputs) > 2 else None
    attrs = {
        "group": int(a.group),
        "dilations": list(geom.dilations),
        "kernel_shape": list(geom.kernel),
        "pads": pads_begin + pads_end,
        "strides": [1] * n,
    }
    return b.op("Conv", [x, conv_w, bias], attrs, name=name)


def _raise(message: str):
    raise ValueError(message)


RULES = [Rule(RULE, Op("ConvTranspose", Var("x"), Const("w"), any_inputs=True), _rewrite)]


def decompose_conv_transpose(graph: Graph, *, fired: list[str] | None = None) -> Graph:
    """Every ConvTranspose with a constant weight and static shapes, as above."""
    return apply_rules(graph, RULES, fired=fired)
