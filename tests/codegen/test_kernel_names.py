"""Kernels are named after their code: identical layers share one source (one NVRTC compile, one
cubin), every launch's kernel is defined in its source, and the engine round-trips through its file."""

from __future__ import annotations

import re

import graphc
import models
from graphc.runtime.format import read_engine


def test_identical_layers_share_kernels(tmp_path):
    m = models.build("bert", size="tiny", num_layers=3)
    feeds = models.sample_inputs("bert", m)
    eng = graphc.compile(
        m, target="cuda", precision="fp16", shapes={k: v.shape for k, v in feeds.items()}, arch=["sm_90"]
    )
    launches = [ln for s in eng.plan.steps for ln in s.launches]
    sources = eng.kernels.sources
    # three layers, one set of kernels (20 launches at most 10 sources since q/k/v is one GEMM and
    # the norms run in the GEMMs: the embedding, head and layer kernels are about as many)
    assert len(sources) <= len(launches) / 2
    for ln in launches:
        assert re.search(
            rf"__global__\s+void\s+(__launch_bounds__\([^)]*\)\s+)?{ln.kernel}\s*\(", sources[ln.digest]
        ), ln.kernel
        assert ln.kernel.startswith(f"gc_{ln.family}_")
    by_layer = {}
    outputs = set(eng.plan.outputs)
    for s in eng.plan.steps:
        # (the last layer's output norm also stores the fp32 model output: passes/fuse_casts.py)
        if "layer." in s.name and s.launches and not outputs & set(s.outputs):
            role = s.name.split("layer.", 1)[1].split(".", 1)[1]
            by_layer.setdefault(role, set()).add(tuple(ln.digest for ln in s.launches))
    assert by_layer and all(len(d) == 1 for d in by_layer.values()), by_layer
    # The engine file's validation (hashes, plan, each launch's kernel and argument count in its
    # source) accepts the shared kernels; loading it needs a GPU, reading it does not.
    path = tmp_path / "bert.engine"
    eng.save(path)
    ef = read_engine(path)
    assert len(ef.sources) == len(sources)
