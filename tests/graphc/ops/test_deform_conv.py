"""DeformConv (opsets 19, 22) against ONNX's ReferenceEvaluator (its definition: GridSample with
align_corners=1 and zero padding per tap), through the interpreter and a CPU engine."""

from __future__ import annotations

import numpy as np
import pytest

import graphc
from helpers import make_node_model, rand


def _case(n=2, c=4, h=6, w=7, oc=6, k=(3, 3), group=1, og=1, strides=(1, 1), dil=(1, 1), pads=(1, 1, 1, 1),
          mask=False, bias=False, spread=1.5, seed=0):  # fmt: skip
    oh = (h + pads[0] + pads[2] - ((k[0] - 1) * dil[0] + 1)) // strides[0] + 1
    ow = (w + pads[1] + pads[3] - ((k[1] - 1) * dil[1] + 1)) // strides[1] + 1
    feeds = {
        "X": rand((n, c, h, w), seed=seed),
        "W": rand((oc, c // group, *k), seed=seed + 1),
        # offsets of up to `spread` pixels: taps between pixels, across the edge, outside the image
        "offset": rand((n, og * 2 * k[0] * k[1], oh, ow), seed=seed + 2, low=-spread, high=spread),
    }
    order = ["X", "W", "offset"]
    if bias or mask:
        feeds["B"] = rand((oc,), seed=seed + 3) if bias else np.zeros((oc,), np.float32)
        order.append("B")
    if mask:
        feeds["mask"] = rand((n, og * k[0] * k[1], oh, ow), seed=seed + 4, low=0.0, high=1.0)
        order.append("mask")
    attrs = {"kernel_shape": list(k), "group": group, "offset_group": og, "strides": list(strides),
             "dilations": list(dil), "pads": list(pads)}  # fmt: skip
    return feeds, attrs, order


CASES = {
    "plain": {},
    "no-pads": {"pads": (0, 0, 0, 0)},
    "mask-bias": {"mask": True, "bias": True},
    "groups": {"group": 2, "og": 2, "mask": True},
    "offset-groups": {"og": 4, "c": 8, "oc": 4},
    "strided-dilated": {"strides": (2, 1), "dil": (1, 2), "pads": (2, 1, 0, 2), "h": 9},
    "far-offsets": {"spread": 6.0, "k": (2, 3), "pads": (0, 1, 1, 0)},
    "1x1": {"k": (1, 1), "pads": (0, 0, 0, 0), "mask": True},
}


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("opset", [19, 22])
def test_deform_conv_against_the_onnx_reference(name, opset):
    from onnx.reference import ReferenceEvaluator

    feeds, attrs, order = _case(**CASES[name])
    model = make_node_model("DeformConv", feeds, attrs, opset=opset, input_order=order)
    (want,) = ReferenceEvaluator(model).run(None, feeds)
    got = next(iter(graphc.interpret(graphc.load_onnx(model), feeds).values()))
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    cpu = graphc.compile(model, target="cpu")
    np.testing.assert_allclose(np.asarray(next(iter(cpu.run(feeds).values()))), want, rtol=1e-5, atol=1e-5)


def test_deform_conv_zero_offsets_is_conv():
    # with zero offsets and no mask DeformConv is Conv: checked against graphc's own Conv reference
    feeds, attrs, order = _case(group=2, strides=(2, 2), spread=0.0)
    feeds["offset"] = np.zeros_like(feeds["offset"])
    model = make_node_model("DeformConv", feeds, attrs, opset=19, input_order=order)
    got = next(iter(graphc.interpret(graphc.load_onnx(model), feeds).values()))
    conv_attrs = {k: v for k, v in attrs.items() if k != "offset_group"}
    conv = make_node_model("Conv", {"X": feeds["X"], "W": feeds["W"]}, conv_attrs, opset=19)
    want = next(iter(graphc.interpret(graphc.load_onnx(conv), {"X": feeds["X"], "W": feeds["W"]}).values()))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"offset": np.zeros((2, 10, 6, 7), np.float32)}, r"offset .* must have offset_group \* 2 \* kH \* kW = 18"),
        ({"W": np.zeros((6, 3, 3, 3), np.float32)}, r"X has 4 channels, W .* with group 1 takes 3"),
        ({"offset": np.zeros((2, 18, 5, 7), np.float32)}, r"offset .* has spatial dims \[5, 7\], the output is \[6, 7"),
    ],
)
def test_deform_conv_bad_shapes_are_one_line(change, message):
    feeds, attrs, order = _case()
    feeds.update(change)
    model = make_node_model("DeformConv", feeds, attrs, opset=19, input_order=order)
    with pytest.raises(graphc.GraphcError, match=message) as e:
        graphc.load_onnx(model)
    assert "\n" not in str(e.value) and "DeformConv" in str(e.value)
