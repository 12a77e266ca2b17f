"""GridSample, Col2Im and DFT against ONNX Runtime (interpreter), and through a CPU engine."""

from __future__ import annotations

import numpy as np
import pytest

import graphc
from helpers import check_against_ort, make_node_model, rand, run_ort


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align", [0, 1])
def test_grid_sample_2d(mode, padding, align):
    x = rand((2, 3, 5, 6), seed=1)
    grid = rand((2, 4, 7, 2), seed=2, low=-1.3, high=1.3)  # some points outside [-1, 1]
    check_against_ort(
        "GridSample",
        {"X": x, "grid": grid},
        {"mode": mode, "padding_mode": padding, "align_corners": align},
        rtol=1e-5,
        atol=1e-5,
        opset=20,
    )


@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_grid_sample_3d(mode):
    x = rand((1, 2, 3, 4, 5), seed=3)
    grid = rand((1, 2, 3, 4, 3), seed=4, low=-1.2, high=1.2)
    check_against_ort("GridSample", {"X": x, "grid": grid}, {"mode": mode}, rtol=1e-5, atol=1e-5, opset=20)


def test_grid_sample_16_mode_names_are_read():
    x, grid = rand((1, 2, 4, 4), seed=5), rand((1, 3, 3, 2), seed=6, low=-1, high=1)
    check_against_ort("GridSample", {"X": x, "grid": grid}, {"mode": "bicubic"}, rtol=1e-5, atol=1e-5, opset=16)


@pytest.mark.parametrize(
    "attrs",
    [{}, {"strides": [2, 2]}, {"pads": [1, 0, 1, 2]}, {"dilations": [2, 1]}],
)
def test_col2im(attrs):
    image, block = np.array([6, 5], np.int64), np.array([2, 3], np.int64)
    s, p, d = attrs.get("strides", [1, 1]), attrs.get("pads", [0, 0, 0, 0]), attrs.get("dilations", [1, 1])
    counts = [(image[i] + p[i] + p[i + 2] - (d[i] * (block[i] - 1) + 1)) // s[i] + 1 for i in range(2)]
    x = rand((2, 3 * 6, int(np.prod(counts))), seed=7)
    check_against_ort(
        "Col2Im", {"x": x}, attrs, initializers={"image": image, "block": block}, rtol=1e-6, atol=1e-6, opset=18
    )


@pytest.mark.parametrize("inverse,onesided,last", [(0, 0, 1), (0, 1, 1), (0, 0, 2), (1, 0, 2), (1, 1, 2)])
def test_dft(inverse, onesided, last):
    x = rand((2, 8, 3, last), seed=8)
    if inverse and onesided:
        x = rand((2, 5, 3, last), seed=8)  # one-sided spectrum of 8 points
    inits = {"axis": np.array(1, np.int64)}
    check_against_ort(
        "DFT",
        {"x": x},
        {"inverse": inverse, "onesided": onesided},
        initializers=inits,
        input_order=["x", "", "axis"],
        rtol=1e-5,
        atol=1e-5,
        opset=20,
    )


def test_dft_17_axis_attribute_and_length():
    x = rand((3, 7, 1), seed=9)
    check_against_ort(
        "DFT", {"x": x}, {"axis": 1}, initializers={"n": np.array(10, np.int64)}, rtol=1e-5, atol=1e-5, opset=17
    )


def test_the_cpu_engine_runs_them():
    x = rand((1, 2, 5, 6), seed=10)
    grid = rand((1, 3, 4, 2), seed=11, low=-1.1, high=1.1)
    model = make_node_model("GridSample", {"X": x, "grid": grid}, {"padding_mode": "reflection"}, opset=20)
    want = run_ort(model, {"X": x, "grid": grid})
    got = graphc.compile(model, target="cpu").run({"X": x, "grid": grid})
    np.testing.assert_allclose(got["y"], want["y"], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("center", [0, 1])
@pytest.mark.parametrize("score_threshold", [None, 0.3])
def test_non_max_suppression(center, score_threshold):
    rng = np.random.default_rng(12)
    xy = rng.uniform(0, 10, (2, 30, 2))
    wh = rng.uniform(1, 4, (2, 30, 2))
    if center:
        boxes = np.concatenate([xy, wh], -1)
    else:  # [y1, x1, y2, x2], some with the corners flipped
        boxes = np.concatenate([xy[..., ::-1], xy[..., ::-1] + wh], -1)
        boxes[:, ::3] = boxes[:, ::3][..., [2, 3, 0, 1]]
    boxes = boxes.astype(np.float32)
    scores = rng.uniform(0, 1, (2, 3, 30)).astype(np.float32)
    scores[0, 0, 5] = scores[0, 0, 6]  # a tie: the lower index goes first
    inits = {"m": np.array([4], np.int64), "iou": np.array([0.2], np.float32)}
    order = ["boxes", "scores", "m", "iou"]
    if score_threshold is not None:
        inits["st"] = np.array([score_threshold], np.float32)
        order.append("st")
    check_against_ort(
        "NonMaxSuppression",
        {"boxes": boxes, "scores": scores},
        {"center_point_box": center},
        initializers=inits,
        input_order=order,
        opset=11,
    )


@pytest.mark.parametrize("with_window,onesided", [(True, 1), (False, 1), (True, 0)])
def test_stft(with_window, onesided):
    x = rand((2, 64, 1), seed=13)
    inits = {"step": np.array(8, np.int64), "fl": np.array(16, np.int64)}
    order = ["x", "step", "", "fl"]
    if with_window:
        inits["win"] = (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(16) / 16)).astype(np.float32)
        order = ["x", "step", "win", "fl"]
    check_against_ort(
        "STFT", {"x": x}, {"onesided": onesided}, initializers=inits, input_order=order, rtol=1e-4, atol=1e-4, opset=17
    )


def test_mel_weight_matrix():
    inits = {
        "n": np.array(8, np.int64),
        "dft": np.array(64, np.int64),
        "sr": np.array(16000, np.int64),
        "lo": np.array(50.0, np.float32),
        "hi": np.array(7000.0, np.float32),
    }
    model = make_node_model("MelWeightMatrix", {}, initializers=inits, opset=17)
    want = run_ort(model, {})
    got = graphc.interpret(graphc.load_onnx(model), {})
    np.testing.assert_allclose(got["y"], want["y"], rtol=1e-6, atol=1e-6)
    assert want["y"].shape == (33, 8) and want["y"].any()


# ---- RoiAlign -----------------------------------------------------------------------------------


def _rois():
    """Boxes inside, across the edge, outside the image, degenerate (x2 < x1), and a tiny one."""
    boxes = [[0.5, 1.0, 6.0, 5.5], [-2.0, -1.5, 3.0, 2.0], [5.0, 4.0, 11.0, 9.0], [4.0, 3.0, 2.5, 2.0]]
    boxes = np.array([*boxes, [2.0, 2.0, 2.2, 2.1]], np.float32)
    return boxes, np.array([0, 1, 1, 0, 1], np.int64)


@pytest.mark.parametrize("mode", ["avg", "max"])
@pytest.mark.parametrize("ctm", ["half_pixel", "output_half_pixel"])
@pytest.mark.parametrize(("sampling", "scale"), [(0, 1.0), (2, 0.5)])
def test_roi_align_against_the_onnx_reference(mode, ctm, sampling, scale):
    from onnx.reference import ReferenceEvaluator

    x = rand((2, 3, 7, 8), seed=11)
    rois, idx = _rois()
    attrs = {
        "mode": mode,
        "coordinate_transformation_mode": ctm,
        "output_height": 3,
        "output_width": 2,
        "sampling_ratio": sampling,
        "spatial_scale": scale,
    }
    feeds = {"X": x, "rois": rois, "batch_indices": idx}
    model = make_node_model("RoiAlign", feeds, attrs, opset=16)
    (want,) = ReferenceEvaluator(model).run(None, feeds)
    got = next(iter(graphc.interpret(graphc.load_onnx(model), feeds).values()))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    if mode == "avg":  # ONNX Runtime's max mode differs from ONNX's definition; its avg does not
        np.testing.assert_allclose(got, next(iter(run_ort(model, feeds).values())), rtol=1e-5, atol=1e-5)
    cpu = graphc.compile(model, target="cpu")
    np.testing.assert_allclose(np.asarray(next(iter(cpu.run(feeds).values()))), want, rtol=1e-5, atol=1e-6)


def test_roi_align_10_is_output_half_pixel():
    x = rand((2, 3, 7, 8), seed=12)
    rois, idx = _rois()
    feeds = {"X": x, "rois": rois, "batch_indices": idx}
    check_against_ort("RoiAlign", feeds, {"output_height": 2, "output_width": 2}, rtol=1e-5, atol=1e-5, opset=10)


def test_roi_align_bad_batch_index_is_one_line():
    x = rand((2, 3, 7, 8), seed=13)
    rois, _ = _rois()
    feeds = {"X": x, "rois": rois, "batch_indices": np.array([0, 1, 2, 0, 1], np.int64)}
    model = make_node_model("RoiAlign", feeds, {}, opset=16)
    with pytest.raises(graphc.GraphcError, match=r"batch_indices\[2\] = 2 is not a batch index of X \(batch 2\)"):
        graphc.interpret(graphc.load_onnx(model), feeds)
