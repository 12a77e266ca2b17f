"""The wgmma implicit-GEMM convolution (conv_sm90.igemm_generate) on an sm_90 GPU: engines whose convs
the rules route to it (3x3 stride 1 and 2, the 7x7/s2 stem with 3 channels, a strided 1x1; bias,
residual and ReLU fused; M and Cout tails; split-K; fp16 and bf16), run with CUDA-graph capture and
replay, against float64 numpy.

Run on a GPU machine:  python -m pytest tests/codegen/test_conv_sm90_igemm_gpu.py -q
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import graphc

sys.path.insert(0, str(Path(__file__).parent))
from conv_igemm_models import conv_model, reference  # noqa: E402

pytestmark = pytest.mark.gpu


def _fresh(feeds: dict, i: int) -> dict:
    """Run i's inputs: the given ones first, then new values of the same spread (a kernel reading
    a buffer before the kernel that writes it has completed returns the last run's values there)."""
    if i == 0:
        return feeds
    rng = np.random.default_rng(100 + i)
    return {k: (rng.standard_normal(v.shape) * float(np.std(v))).astype(v.dtype) for k, v in feeds.items()}

TOL = {"fp16": 1e-2, "bf16": 4e-2}  # relative Frobenius error of an fp16/bf16 conv against float64

# (precision, (n, c, hw, k, r, stride), model keywords, forced kernel parameters or None)
CASES = [
    ("fp16", (2, 64, 28, 64, 3, 1), {"residual": True}, None),  # 3x3, bias + residual + ReLU
    ("fp16", (3, 128, 15, 200, 3, 1), {}, None),  # M = 675 (a tile tail), Cout = 200 (a column tail)
    ("fp16", (3, 64, 29, 128, 3, 2), {"bias": False}, None),  # stride 2, odd input, no bias
    ("fp16", (2, 3, 64, 64, 7, 2), {}, None),  # the stem: Cin = 3 gathered element by element
    ("fp16", (1, 3, 224, 64, 7, 2), {}, {"MINB": 2, "STAGES": 4}),  # the stem at 224, two blocks per SM
    ("fp16", (3, 256, 28, 512, 1, 2), {"relu": False}, None),  # a strided 1x1 shortcut
    ("fp16", (2, 256, 14, 256, 3, 1), {"residual": True}, {"BN": 128, "SPLITS": 3, "SERIAL": 1}),  # one launch
    ("fp16", (2, 256, 14, 200, 3, 1), {}, {"BN": 128, "SPLITS": 3, "SERIAL": 0}),  # + the reduce kernel
    ("fp16", (1, 512, 7, 512, 3, 1), {}, None),  # batch 1, M = 49: split-K by the heuristic
    ("fp16", (2, 64, 28, 64, 3, 1), {}, {"BN": 64, "B_MODE": "cp", "MINB": 2, "STAGES": 4}),
    ("fp16", (3, 128, 14, 256, 3, 1), {"residual": True}, {"BN": 256, "VEC_EPI": 0}),
    ("bf16", (3, 128, 14, 128, 3, 1), {"residual": True}, None),
    # cluster split-K (one launch, the K slices of a tile sum over DSMEM): the vector epilogue with a
    # residual, 8 slices; a column tail (Cout 200) and a tile tail (M = 392) without it; M = 675;
    # stride 2 in bf16; a strided 1x1 with an uneven last slice (16 K tiles as 6 + 6 + 4); two
    # blocks per SM
    ("fp16", (1, 512, 7, 512, 3, 1), {"residual": True}, {"BN": 64, "SPLITS": 8, "CLUSTER": 1}),
    ("fp16", (2, 256, 14, 200, 3, 1), {}, {"BN": 128, "SPLITS": 3, "CLUSTER": 1, "VEC_EPI": 0}),
    ("fp16", (3, 128, 15, 200, 3, 1), {"residual": True}, {"BN": 64, "SPLITS": 2, "CLUSTER": 1}),
    ("bf16", (1, 256, 14, 256, 3, 2), {}, {"BN": 64, "SPLITS": 6, "CLUSTER": 1}),
    ("fp16", (1, 1024, 14, 2048, 1, 2), {"relu": False}, {"BN": 64, "SPLITS": 3, "CLUSTER": 1}),
    ("fp16", (2, 256, 14, 256, 3, 1), {}, {"BN": 64, "SPLITS": 4, "CLUSTER": 1, "MINB": 2, "STAGES": 4}),
]


def _sm90() -> bool:
    from graphc.runtime.cuda import device_arch

    return device_arch() == "sm_90"


@pytest.mark.parametrize(
    ("mode", "shape", "kw", "params"),
    CASES,
    ids=[f"{m}-{'x'.join(map(str, s))}-{i}" for i, (m, s, _, _) in enumerate(CASES)],
)
def test_conv_on_wgmma_igemm(tmp_path, monkeypatch, mode, shape, kw, params):
    if not _sm90():
        pytest.skip("needs an sm_90 GPU (wgmma, TMA)")
    from graphc.codegen.families import conv_sm90

    if params is not None:  # force a variant the heuristic would not take
        real = conv_sm90.igemm_heuristic

        def forced(g):
            p = {**real(g), **params}
            if "STAGES" not in params:
                p["STAGES"] = 4 if p["BN"] == 64 else conv_sm90.igemm_max_stages(p["BN"], p["B_MODE"])
            return p

        monkeypatch.setattr(conv_sm90, "igemm_heuristic", forced)
    n, c, hw, k, r, stride = shape
    model, feeds = conv_model(n, c, hw, k, r, stride, **kw)
    eng = graphc.compile(model, target="cuda", precision=mode, arch=["sm_90"], cache_dir=str(tmp_path / "c"))
    ig = [ln.params for s in eng.plan.steps for ln in s.launches if ln.params.get("variant") == "igemm"]
    assert len(ig) == 1, [ln.params for s in eng.plan.steps for ln in s.launches]
    if params is not None:
        assert all(ig[0][q] == v for q, v in params.items()), ig[0]
    for i in range(3):  # capture, then replays, new inputs each time (a stale read shows)
        run_feeds = _fresh(feeds, i)
        ref = reference(model, run_feeds)
        g = np.asarray(eng.run(run_feeds, to_numpy=True)["y"], np.float64)
        assert np.isfinite(g).all()
        err = np.linalg.norm(g - ref) / np.linalg.norm(ref)
        assert err < TOL[mode], f"run {i}: {err}"


@pytest.mark.parametrize("cluster", [0, 1])
def test_stride1_1x1_conv_on_the_igemm_with_split_k(tmp_path, monkeypatch, cluster):
    """A stride-1 1x1 conv (the TMA GEMM's by default) on the implicit GEMM with 4 K slices, as a
    cluster and as two launches: ResNet-50's 14x14 1024 -> 256 at batch 1 with its residual."""
    if not _sm90():
        pytest.skip("needs an sm_90 GPU (wgmma, TMA)")
    from graphc.codegen.families import conv_sm90

    real = conv_sm90.igemm_heuristic
    monkeypatch.setattr(conv_sm90, "selected", lambda prob: False)
    monkeypatch.setattr(conv_sm90, "igemm_heuristic", lambda g: {**real(g), "SPLITS": 4, "CLUSTER": cluster})
    model, feeds = conv_model(1, 1024, 14, 256, 1, 1, residual=True)
    eng = graphc.compile(model, target="cuda", precision="fp16", arch=["sm_90"], cache_dir=str(tmp_path / "c"))
    conv = [ln.params for s in eng.plan.steps for ln in s.launches if ln.family == "conv"]
    assert [p["variant"] for p in conv] == ["igemm"] + ([] if cluster else ["igemm_reduce"]), conv
    assert conv[0]["SPLITS"] == 4 and conv[0]["CLUSTER"] == cluster
    for i in range(3):  # capture, then replays, new inputs each time
        run_feeds = _fresh(feeds, i)
        ref = reference(model, run_feeds)
        g = np.asarray(eng.run(run_feeds, to_numpy=True)["y"], np.float64)
        err = np.linalg.norm(g - ref) / np.linalg.norm(ref)
        assert err < TOL["fp16"], f"run {i}: {err}"
