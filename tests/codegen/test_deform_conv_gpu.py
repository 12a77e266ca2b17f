"""DeformConv's CUDA engine on a GPU against the numpy reference (ONNX's definition), fp32 and
fp16, every case of tests/graphc/ops/test_deform_conv.py. test_deform_conv_kernel.py checks the
same kernel text on the host without a GPU."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import graphc
from helpers import make_node_model

sys.path.insert(0, str(Path(__file__).parent.parent / "graphc" / "ops"))
from test_deform_conv import CASES, _case  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("name", list(CASES))
def test_deform_conv_engine_matches_reference(name, precision):
    feeds, attrs, order = _case(**CASES[name])
    model = make_node_model("DeformConv", feeds, attrs, opset=19, input_order=order)
    (want,) = graphc.interpret(graphc.load_onnx(model), feeds).values()
    eng = graphc.compile(model, target="cuda", precision=precision)
    for _ in range(2):  # the first run and a graph replay
        (got,) = eng.run(feeds, to_numpy=True).values()
        w = want.astype(np.float64)
        err = np.linalg.norm(got.astype(np.float64) - w) / max(np.linalg.norm(w), 1e-12)
        assert err < (1e-5 if precision == "fp32" else 3e-3), f"{name} {precision}: relative error {err:.3g}"
