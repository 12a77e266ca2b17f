"""Epilogue fusion through a view: a residual of the reshaped output's own shape joins the GEMM's
epilogue at any batch (GPT-2's Conv1D: Gemm on [B*S, K], Reshape to [B, S, N], + residual)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import graphc
from tests.helpers import assert_close, rand, run_ort


def _model(batch: int, seq: int = 8, k: int = 32, n: int = 48):
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array((rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32), "W"),
        numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), "b"),
        numpy_helper.from_array(np.array([batch * seq, k], dtype=np.int64), "s2"),
        numpy_helper.from_array(np.array([batch, seq, n], dtype=np.int64), "s3"),
    ]
    nodes = [
        helper.make_node("Reshape", ["x", "s2"], ["x2"]),
        helper.make_node("Gemm", ["x2", "W", "b"], ["g"]),
        helper.make_node("Reshape", ["g", "s3"], ["g3"]),
        helper.make_node("Add", ["g3", "r"], ["y"]),
    ]
    g = helper.make_graph(
        nodes,
        "residual_view",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, seq, k]),
            helper.make_tensor_value_info("r", TensorProto.FLOAT, [batch, seq, n]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, seq, n])],
        inits,
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


@pytest.mark.parametrize("batch", [1, 3])
def test_residual_of_the_views_shape_joins_the_epilogue(batch):
    model = _model(batch)
    eng = graphc.compile(model, target="cpu")
    kernels = [s for s in eng.plan.steps if not s.alias]
    assert len(kernels) == 1 and kernels[0].kind == "Fused[Gemm]", [s.kind for s in kernels]
    feeds = {"x": rand((batch, 8, 32), seed=1), "r": rand((batch, 8, 48), seed=2)}
    assert_close(eng.run(feeds)["y"], run_ort(model, feeds)["y"], rtol=1e-5, atol=1e-5)
    cuda = graphc.compile(model, target="cuda", precision="fp16", arch=["sm_90"])
    # x and r cast to fp16, the fused GEMM, y cast back: no separate residual Add
    assert sum(len(s.launches) for s in cuda.plan.steps) == 4
    assert [s.kind for s in cuda.plan.steps if s.launches].count("Fused[Gemm]") == 1
