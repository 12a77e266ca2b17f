"""The cuBLASLt tactic on a GPU: engines with vendor steps against numpy, through CUDA-graph
replay and plain launches, in a second execution context, after save and load, and next to
graphc's own kernels (PDL on)."""

from __future__ import annotations

import numpy as np
import pytest

import graphc
import graphc.runtime
from tests.runtime.tactics_models import gemm_model, softmax_between_matmuls

pytestmark = pytest.mark.gpu

CASES = [
    dict(m=64, n=96, k=32, epilogue="bias_gelu"),
    dict(m=64, n=96, k=32, epilogue="bias_gelu_erf"),
    dict(m=64, n=96, k=32, epilogue="bias_relu"),
    dict(m=33, n=40, k=24, epilogue="bias_res"),
    dict(m=33, n=40, k=24, epilogue="res"),
    dict(m=16, n=24, k=40, epilogue="bias", trans_b=True, alpha=0.5),
    dict(m=16, n=24, k=40, epilogue="none", alpha=0.25),
    dict(m=8, n=24, k=16, epilogue="bias", batch=3),
    dict(m=256, n=3072, k=768, epilogue="bias_gelu"),
    dict(m=197, n=768, k=3072, epilogue="bias_res"),
]


def _np(x):
    return x.get() if hasattr(x, "get") else np.asarray(x)


def _check(out, want):
    got = _np(out).astype(np.float32)
    err = np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30)
    assert err < 3e-3, err  # fp16 outputs, fp32 accumulation: ~5e-4 here


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()))
def test_a_tactic_engine_equals_numpy(case, tmp_path):
    model, ref, make_feeds = gemm_model(**case)
    eng = graphc.compile(model, target="cuda", precision="fp16", tactics=["cublaslt"], extra={"tactics_force": True})
    assert any(s.vendor for s in eng.plan.steps)
    feeds = make_feeds()
    want = ref(feeds)
    _check(eng.run(feeds)["y"], want)  # captured and replayed
    _check(eng.run(make_feeds())["y"], ref(make_feeds()))  # a second replay, the same inputs again
    ctx = eng.executor.default
    _check(ctx.run(feeds, use_graph=False)["y"], want)  # plain calls
    other = eng.create_context()  # its own handle, workspace, arena and graph
    _check(other.run(feeds)["y"], want)
    path = tmp_path / "t.engine"
    eng.save(path)
    loaded = graphc.runtime.load(path)
    _check(loaded.run(feeds)["y"], want)


def test_vendor_steps_next_to_graphc_kernels_with_pdl():
    model, x, want = softmax_between_matmuls(np.random.default_rng(0))
    eng = graphc.compile(model, target="cuda", precision="fp16", tactics=["cublaslt"], extra={"tactics_force": True})
    assert sum(1 for st in eng.plan.steps if st.vendor) == 2
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        eng.save(f"{d}/m.engine")
        for pdl in (True, False):
            loaded = graphc.runtime.load(f"{d}/m.engine", pdl=pdl)
            for _ in range(3):
                _check(loaded.run({"x": x})["y"], want)
