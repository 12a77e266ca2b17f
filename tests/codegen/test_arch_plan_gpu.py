"""One engine, a plan per arch, on a GPU: a small transformer compiled with the DEFAULT arch list
(sm_80, sm_86, sm_89, sm_90: what a cross-compile without a GPU gets), saved, loaded and run. The
loaded engine must run the launches of this GPU's arch (on an H200 the sm_90a TMA GEMMs) and match
the CPU target.

Run on a GPU machine:  python -m pytest tests/codegen/test_arch_plan_gpu.py -q
"""

from __future__ import annotations

import numpy as np
import pytest

import graphc
import models
from graphc.codegen.nvrtc import DEFAULT_ARCHS

pytestmark = pytest.mark.gpu

# One encoder layer at batch 32 x 128 tokens: M = 4096, so sm_90 runs every GEMM on the TMA kernel.
SIZES = {"hidden_size": 256, "intermediate_size": 1024, "num_heads": 4, "num_layers": 1, "max_positions": 128}


def test_default_arch_engine_runs_its_gpus_launches(tmp_path):
    from graphc.runtime.cuda import cubin_arch_for, device_arch

    model = models.build("bert", size="tiny", batch=32, vocab_size=512, **SIZES)
    feeds = models.sample_inputs("bert", model, seed=3, batch=32, seq=128)
    eng = graphc.compile(model, target="cuda", precision="fp16", arch=list(DEFAULT_ARCHS), shapes={"seq": 128})
    assert eng.plan.launch_archs() == ["sm_90"]
    path = tmp_path / "bert.engine"
    eng.save(path)
    loaded = graphc.runtime.load(path)

    device = device_arch()
    expected = cubin_arch_for(device, DEFAULT_ARCHS) or device
    ex = loaded.executor
    assert ex.launch_arch == expected
    ran = [[ln.digest for ln in s.launches] for s in ex.plan.steps]
    assert ran == [[ln.digest for ln in s.launches_for(expected)] for s in eng.plan.steps]
    gemm_paths = [ln.params.get("path") for s in ex.plan.steps for ln in s.launches if ln.family == "gemm"]
    if device == "sm_90":
        assert "tma" in gemm_paths, gemm_paths

    cpu = graphc.compile(model, target="cpu", shapes={"seq": 128}).run(feeds)
    for run in (loaded.run, loaded.create_context().run):
        for _ in range(2):  # capture, then replay
            got = run(feeds, to_numpy=True)
            for name, ref in cpu.items():
                g = np.asarray(got[name], np.float64)
                r = np.asarray(ref, np.float64)
                err = np.linalg.norm(g - r) / np.linalg.norm(r)
                # fp16 activations and weights against the fp32 CPU target over one encoder layer
                assert err < 1e-2, (name, err)
