"""Programmatic dependent launch on a GPU: an engine loaded with PDL gives the outputs of the same
engine loaded without it, bit for bit, over several replays of changing inputs and through stream
launches; on sm_90+ every launch of a PDL-ready kernel after the first is programmatic, elsewhere
none is; GRAPHC_PDL=0 and load(pdl=False) switch it off."""

from __future__ import annotations

import numpy as np
import pytest

import graphc
import graphc.runtime
import models
from graphc.runtime.cuda import device_arch
from graphc.runtime.pdl import arch_has_pdl

pytestmark = pytest.mark.gpu

# bert: GEMMs, attention, row-wise norms, elementwise, gathers; resnet: convolutions (split-K with
# module-global counters among them), pools; the mlp at batch 512: large GEMMs
CASES = [("bert", {}, 2), ("resnet", {}, 2), ("mlp", {"hidden": [1024, 1024], "in_features": 1024}, 512)]


@pytest.fixture(scope="module", params=CASES, ids=[c[0] for c in CASES])
def engine_file(request, tmp_path_factory):
    name, opts, batch = request.param
    m = models.build(name, size="tiny", **opts)
    feeds = [models.sample_inputs(name, m, seed=s, batch=batch) for s in range(4)]
    eng = graphc.compile(m, target="cuda", precision="fp16", shapes={k: v.shape for k, v in feeds[0].items()})
    path = tmp_path_factory.mktemp("pdl") / f"{name}.engine"
    eng.save(path)
    return path, [{s.name: f[s.name].astype(s.dtype) for s in eng.inputs} for f in feeds]


def _outs(engine, feeds, **kw):
    return {k: np.asarray(v) for k, v in engine.run(feeds, to_numpy=True, **kw).items()}


def test_pdl_engine_matches_plain_engine_bit_for_bit(engine_file, monkeypatch):
    path, feeds = engine_file
    monkeypatch.setenv("GRAPHC_PDL_MAX_CTAS", "0")  # every PDL-ready launch programmatic, whatever its grid
    on, off = graphc.runtime.load(path, pdl=True), graphc.runtime.load(path, pdl=False)
    ctx_on, ctx_off = on.executor.default, off.executor.default
    programmatic = sum(p is not None for p in ctx_on.programmatic)
    if arch_has_pdl(device_arch()):
        assert programmatic == len(ctx_on.launches) - 1  # every kernel is PDL-ready; the first stays plain
    else:
        assert programmatic == 0
    assert all(p is None for p in ctx_off.programmatic)
    for _ in range(3):  # replays of changing inputs: a stale read would show as a difference
        for f in feeds:
            want, got = _outs(off, f), _outs(on, f)
            for k in want:
                np.testing.assert_array_equal(got[k], want[k])
    f = feeds[1]
    want = {k: v.get() for k, v in ctx_off.run(f, use_graph=False).items()}
    got = {k: v.get() for k, v in ctx_on.run(f, use_graph=False).items()}
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])
        assert np.isfinite(want[k].astype(np.float32)).all()


def test_cta_limit_keeps_multi_wave_launches_plain(engine_file, monkeypatch):
    import cupy

    path, _ = engine_file
    sms = cupy.cuda.runtime.getDeviceProperties(0)["multiProcessorCount"]
    monkeypatch.setenv("GRAPHC_PDL_MAX_CTAS", str(sms))
    ctx = graphc.runtime.load(path, pdl=True).executor.default
    ctas = [int(np.prod(g)) for _fn, g, *_ in ctx.launches]
    for i, p in enumerate(ctx.programmatic):
        if p is not None:
            assert i > 0 and ctas[i] <= sms and ctas[i - 1] <= sms


def test_environment_switch_turns_pdl_off(engine_file, monkeypatch):
    path, _ = engine_file
    monkeypatch.setenv("GRAPHC_PDL", "0")
    eng = graphc.runtime.load(path)
    assert all(p is None for p in eng.executor.default.programmatic)
    assert not eng.executor.pdl_kernels
