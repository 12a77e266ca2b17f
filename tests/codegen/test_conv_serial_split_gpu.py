"""Serial split-K convolutions on a GPU, through the engine: ResNet-50's deep 3x3 stage at batch 1
(split-K in one launch, the last block per tile runs bias + residual + ReLU) against ONNX Runtime,
three runs of one engine (the first captures the CUDA graph, the others replay it: a tile counter
left non-zero would break them).

Run on a GPU machine:  python -m pytest tests/codegen/test_conv_serial_split_gpu.py -q
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.helpers import rand, run_ort

pytestmark = pytest.mark.gpu


def _model():
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((512, 512, 3, 3)) / np.sqrt(512 * 9)).astype(np.float32)
    g = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
            helper.make_node("Add", ["c", "x"], ["s"]),
            helper.make_node("Relu", ["s"], ["y"]),
        ],
        "deep3x3",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 512, 7, 7])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 512, 7, 7])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(rng.standard_normal(512).astype(np.float32), "b")],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def test_deep_conv_split_k_one_launch_matches_ort():
    import graphc

    model = _model()
    eng = graphc.compile(model, target="cuda", precision="fp16")
    convs = [ln for s in eng.plan.steps for ln in s.launches if ln.family == "conv"]
    # K is split: in one launch on conv.cu.j2 (serial), or, on sm_90, by the wgmma implicit GEMM
    # (conv_sm90): its slices as one thread-block cluster summed over DSMEM (CLUSTER 1, one launch)
    # or reducing in a second launch (variant "igemm_reduce")
    main = [ln for ln in convs if ln.params.get("variant") != "igemm_reduce"]
    assert len(main) == 1, [ln.params.get("variant") for ln in convs]
    p = main[0].params
    assert max(int(p.get("splits", 1)), int(p.get("SPLITS", 1))) > 1, p
    one_launch = p.get("serial", p.get("SERIAL", 0)) or p.get("CLUSTER", 0)
    assert len(convs) == (1 if one_launch else 2), p
    for seed in range(3):
        feeds = {"x": rand((1, 512, 7, 7), seed=seed, low=-1.0, high=1.0)}
        ref = run_ort(model, feeds)["y"]
        got = eng.run(feeds, to_numpy=True)["y"].astype(np.float64)
        err = np.linalg.norm(got - ref) / np.linalg.norm(ref)
        assert err < 3e-3, f"run {seed}: relative error {err:.3g}"
