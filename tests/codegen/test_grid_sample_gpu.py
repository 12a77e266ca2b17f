"""GridSample's kernel (the grid_sample family) on a GPU, through the engine's own launch path (outputs
poisoned first, so an element the kernel skips shows), against the numpy reference: every case of
grid_sample_cases.py (modes x padding modes x align_corners x fp32/fp16, 1-D and 3-D, size-1 axes,
bf16, float64, mixed X/grid dtypes, RT-DETR's shape), with grids beyond [-1, 1] and on the points
where the rules decide (nearest's ties, pixels, bounds). Nearest is exact (a copy of the sampled
element); linear and cubic within fp32 1e-5, fp16 2e-3, bf16 1e-2 of max(1, |expected|). fp32
linear also against ONNX Runtime (CPU), and fp16/bf16 engines of fp32 models against the reference
on the inputs rounded to that type.

Run on a GPU machine: python -m pytest tests/codegen/test_grid_sample_gpu.py -q
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import graphc

sys.path.insert(0, str(Path(__file__).parent))  # rd_helpers beside this file
from grid_sample_cases import BF16, CASES, case  # noqa: E402
from rd_helpers import run_poisoned  # noqa: E402

pytestmark = pytest.mark.gpu

TOLERANCE = {"float32": (1e-5, 1e-5), "float64": (1e-12, 1e-12), "float16": (2e-3, 2e-3), "bfloat16": (1e-2, 1e-2)}


def _reference(model, feeds) -> np.ndarray:
    (y,) = graphc.interpret(graphc.load_onnx(model), feeds).values()
    return np.asarray(y)


def _engine_output(model, feeds, precision: str = "fp32") -> np.ndarray:
    engine = graphc.compile(model, target="cuda", opt_level=0, precision=precision, tvm=False)
    (step,) = [s for s in engine.plan.steps if s.op == "GridSample"]
    assert [ln.family for ln in step.launches] == ["grid_sample"]
    (y,) = run_poisoned(engine, feeds).values()
    return np.asarray(y)


def _assert_close(got, want, mode: str, dtype_name: str, what: str) -> None:
    assert got.shape == want.shape, what
    g, w = got.astype(np.float64), want.astype(np.float64)
    if mode == "nearest":
        np.testing.assert_array_equal(g, w, err_msg=what)
        return
    rtol, atol = TOLERANCE[dtype_name]
    scale = max(1.0, float(np.abs(w).max()))
    np.testing.assert_allclose(g, w, rtol=rtol, atol=atol * scale, err_msg=what)


@pytest.mark.parametrize("name", list(CASES))
def test_grid_sample_matches_reference(name):
    kw = CASES[name]
    model, feeds = case(**kw)
    want = _reference(model, feeds)
    got = _engine_output(model, feeds)
    assert got.dtype == want.dtype
    _assert_close(got, want, kw["mode"], np.dtype(want.dtype).name, name)


@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align", [0, 1])
def test_fp32_linear_matches_onnxruntime(padding, align):
    from helpers import run_ort

    model, feeds = case("linear", padding, align, seed=3, opset=22)  # GridSample-22: ORT reads it
    (want,) = run_ort(model, feeds).values()
    _assert_close(_engine_output(model, feeds), np.asarray(want), "linear", "float32", f"ort {padding} {align}")


@pytest.mark.parametrize(
    "precision,mode,padding,align",
    [
        ("fp16", "linear", "zeros", 0),
        ("fp16", "nearest", "reflection", 1),
        ("fp16", "cubic", "border", 0),
        ("bf16", "linear", "reflection", 0),
        ("bf16", "nearest", "zeros", 0),
    ],
)
def test_reduced_precision_engine(precision, mode, padding, align):
    """An fp32 model compiled for fp16/bf16: X and grid are cast to 16 bits at the edge and the
    kernel samples in 16-bit storage; the reference on the same rounded inputs."""
    model, feeds = case(mode, padding, align, seed=5)
    dt = np.float16 if precision == "fp16" else BF16
    low = {k: v.astype(dt) for k, v in feeds.items()}
    lmodel, _ = case(mode, padding, align, dtype=dt, seed=5)  # the same graph in that type
    want = _reference(lmodel, low)
    got = _engine_output(model, feeds, precision=precision)
    assert got.dtype == np.float32  # the model's output type, cast at the edge
    _assert_close(got, want, mode, np.dtype(dt).name, f"{precision} {mode} {padding} {align}")
