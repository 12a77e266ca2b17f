"""A Resize whose output has the input's size at scale 1 (issue 12: exporters write one for a
target size equal to the input's) renders as a plain copy for every mode and coordinate
transformation mode that real models use, compiles with NVRTC, and agrees with ONNX Runtime on
the CPU. It used to raise IndexError in the family (no resized axis left). The GPU numerics are in
test_resize_identity_gpu.py."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from helpers import assert_close, make_node_model, rand, run_graphc, run_ort

sys.path.insert(0, str(Path(__file__).parent))  # rd_helpers beside this file
from rd_helpers import compile_each, kernels_of  # noqa: E402

F32 = np.float32

# (mode, coordinate_transformation_mode, nearest_mode) as exporters write them: PyTorch's
# nearest/bilinear/bicubic upsampling (align_corners both ways), TF/Keras, and the ONNX default.
COMBOS = [
    ("nearest", "asymmetric", "floor"),
    ("nearest", "half_pixel", "round_prefer_floor"),
    ("nearest", "pytorch_half_pixel", "round_prefer_ceil"),
    ("nearest", "align_corners", "round_prefer_ceil"),
    ("linear", "half_pixel", "round_prefer_floor"),
    ("linear", "pytorch_half_pixel", "round_prefer_floor"),
    ("linear", "align_corners", "round_prefer_floor"),
    ("linear", "asymmetric", "round_prefer_floor"),
    ("cubic", "half_pixel", "round_prefer_floor"),
    ("cubic", "pytorch_half_pixel", "round_prefer_floor"),
    ("cubic", "align_corners", "round_prefer_floor"),
    ("linear", "tf_crop_and_resize", "round_prefer_floor"),
]


def identity_model(mode: str, ctm: str, nearest_mode: str, by: str, dtype=F32, shape=(1, 3, 7, 9)):
    x = rand(shape, dtype, seed=3)
    attrs = {"mode": mode, "coordinate_transformation_mode": ctm, "nearest_mode": nearest_mode}
    roi = np.array([0, 0, 0, 0, 1, 1, 1, 1], F32) if ctm == "tf_crop_and_resize" else np.array([], F32)
    if by == "scales":
        inits = {"roi": roi, "sc": np.ones(len(shape), F32)}
    else:
        inits = {"roi": roi, "sc": np.array([], F32), "sz": np.array(shape, np.int64)}
    return make_node_model("Resize", {"x": x}, attrs, initializers=inits), x


@pytest.mark.parametrize("by", ["scales", "sizes"])
@pytest.mark.parametrize("mode,ctm,nearest_mode", COMBOS)
def test_identity_resize_is_a_copy(mode, ctm, nearest_mode, by):
    model, x = identity_model(mode, ctm, nearest_mode, by)
    assert_close(run_graphc(model, {"x": x})["y"], run_ort(model, {"x": x})["y"], rtol=0, atol=0)
    ks = kernels_of(model, family="data")
    assert len(ks) == 1
    assert "// ---- data_copy.cu.j2 ----" in ks[0].source, "an identity Resize must be a copy"
    compile_each(ks, archs=("sm_80",))


def test_identity_resize_of_ints_and_half():
    for dtype in (np.uint8, np.float16):
        model, x = identity_model("linear", "half_pixel", "round_prefer_floor", "sizes", dtype=dtype)
        assert_close(run_graphc(model, {"x": x})["y"], x)
        ks = kernels_of(model, family="data")
        assert "data_copy.cu.j2" in ks[0].source
        compile_each(ks, archs=("sm_80",))


def test_partial_identity_still_resizes():
    # One axis kept, one doubled: a resize kernel (not a copy), and the kept axis has no table.
    x = rand((1, 3, 7, 9), F32, seed=4)
    model = make_node_model(
        "Resize",
        {"x": x},
        {"mode": "linear"},
        initializers={"roi": np.array([], F32), "sc": np.array([1, 1, 1, 2], F32)},
    )
    ks = kernels_of(model, family="data")
    assert "data_resize.cu.j2" in ks[0].source and "gc_ri3" in ks[0].source and "gc_ri2" not in ks[0].source
    compile_each(ks, archs=("sm_80",))
