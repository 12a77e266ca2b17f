"""RoiAlign's CUDA engine on a GPU against the numpy reference (ONNX's definition), fp32 and fp16,
both modes and coordinate modes; test_roi_align_kernel.py checks the same kernel text on the host
without a GPU."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import graphc

sys.path.insert(0, str(Path(__file__).parent))
from test_roi_align_kernel import _model  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("mode", ["avg", "max"])
@pytest.mark.parametrize(("ctm", "sampling", "scale"), [("half_pixel", 0, 1.0), ("output_half_pixel", 2, 0.5)])
def test_roi_align_engine_matches_reference(mode, ctm, sampling, scale, precision):
    model, feeds = _model(mode, ctm, sampling, scale, np.float32)
    (want,) = graphc.interpret(graphc.load_onnx(model), feeds).values()
    eng = graphc.compile(model, target="cuda", precision=precision)
    for _ in range(2):  # the first run and a graph replay
        (got,) = eng.run(feeds, to_numpy=True).values()
        w = want.astype(np.float64)
        err = np.linalg.norm(got.astype(np.float64) - w) / max(np.linalg.norm(w), 1e-12)
        assert err < (1e-6 if precision == "fp32" else 3e-3), f"{mode} {ctm} {precision}: relative error {err:.3g}"
