"""1x1 convolutions on the Hopper TMA GEMM, on an sm_90 GPU: engines whose 1x1 convs the rules route
to gemm_sm90 (bias, residual, ReLU fused; Cout down to 64, an M tail, no bias; fp16 and bf16), run
with CUDA-graph capture and replay, against float64 numpy; and a multi-arch engine, saved and
loaded, that runs its sm_90 launches.

Run on a GPU machine:  python -m pytest tests/codegen/test_conv_sm90_gpu.py -q
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import graphc

sys.path.insert(0, str(Path(__file__).parent))
from conv_sm90_models import conv1x1_model, reference  # noqa: E402

pytestmark = pytest.mark.gpu

TOL = {"fp16": 1e-2, "bf16": 4e-2}  # relative Frobenius error of two fp16/bf16 convs against float64

CASES = [
    ("fp16", (2, 64, 56, 256), {}),  # ResNet-50 stage 1's expansion conv with its residual
    ("fp16", (1, 256, 64, 64), {"residual": False}),  # Cout = 64: half of a 128-column tile
    ("fp16", (3, 128, 40, 520), {"bias": False}),  # M = 4800 (a tile tail), N = 520 (a column tail)
    ("bf16", (8, 512, 28, 128), {}),  # K = 512: 8 K tiles
]


def _sm90() -> bool:
    from graphc.runtime.cuda import device_arch

    return device_arch() == "sm_90"


def _check(got, ref, mode):
    g = np.asarray(got, np.float64)
    assert np.isfinite(g).all()
    err = np.linalg.norm(g - ref) / np.linalg.norm(ref)
    assert err < TOL[mode], err


@pytest.mark.parametrize(("mode", "shape", "kw"), CASES, ids=[f"{m}-{'x'.join(map(str, s))}" for m, s, _ in CASES])
def test_conv1x1_on_tma_gemm(tmp_path, mode, shape, kw):
    if not _sm90():
        pytest.skip("needs an sm_90 GPU (TMA, wgmma)")
    model, feeds = conv1x1_model(*shape, **kw)
    eng = graphc.compile(model, target="cuda", precision=mode, arch=["sm_90"], cache_dir=str(tmp_path / "c"))
    tma = [ln.params for s in eng.plan.steps for ln in s.launches if ln.family == "conv" and "path" in ln.params]
    assert [p["path"] for p in tma] == ["tma"], tma  # (a split-K reduce launch has no path)
    ref = reference(model, feeds)
    for _ in range(2):  # capture, then replay
        _check(eng.run(feeds, to_numpy=True)["y"], ref, mode)


def test_multi_arch_engine_runs_the_sm90_conv(tmp_path):
    if not _sm90():
        pytest.skip("needs an sm_90 GPU (TMA, wgmma)")
    model, feeds = conv1x1_model(2, 64, 56, 256, seed=5)
    eng = graphc.compile(model, target="cuda", precision="fp16", arch=["sm_80", "sm_90"], cache_dir=str(tmp_path / "c"))
    path = tmp_path / "conv.engine"
    eng.save(path)
    loaded = graphc.runtime.load(path)
    ex = loaded.executor
    assert ex.launch_arch == "sm_90"
    assert any(ln.params.get("variant") == "tma_gemm" for s in ex.plan.steps for ln in s.launches)
    ref = reference(model, feeds)
    for run in (loaded.run, loaded.create_context().run):
        for _ in range(2):
            _check(run(feeds, to_numpy=True)["y"], ref, "fp16")
