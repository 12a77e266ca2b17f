"""A tactic engine's real run path without a GPU: CUDAExecutor, CUDAContext with its VendorSteps
(handle, descriptors, layouts, heuristic, workspace, the warm-up call), capture and replay, a second
context, plain launches and graphc kernels between vendor calls, on tools/fake_cupy.py with
tests/runtime/fake_cublaslt.py standing for nvmath's cuBLASLt bindings."""

from __future__ import annotations

import numpy as np
import pytest

import graphc
from graphc.runtime import tactics_cublaslt
from tests import fake_gpu as G
from tests.runtime import fake_cublaslt as FL
from tests.runtime.tactics_models import gemm_model, softmax_between_matmuls

ARCH = "sm_90"
CASES = [
    dict(m=64, n=96, k=32, epilogue="bias_gelu"),
    dict(m=64, n=96, k=32, epilogue="bias_relu"),
    dict(m=33, n=40, k=24, epilogue="bias_res"),
    dict(m=33, n=40, k=24, epilogue="res"),
    dict(m=16, n=24, k=40, epilogue="bias", trans_b=True, alpha=0.5),
    dict(m=16, n=24, k=40, epilogue="none", alpha=0.25),
    dict(m=8, n=24, k=16, epilogue="bias", batch=3),
]


def _fake(monkeypatch, eng):
    monkeypatch.setattr(tactics_cublaslt, "import_cublaslt", lambda n: FL)
    eng.executor = G.fake_executor(
        monkeypatch, eng.plan, eng.memory, eng.weights, eng.kernels.cubins.get(ARCH, {}), eng.kernels.names, ARCH
    )
    return eng.executor


def _close(out, want):
    np.testing.assert_allclose(np.asarray(out, np.float32), want, rtol=2e-2, atol=2e-2)  # fp16 storage


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()))
def test_a_tactic_engine_runs_its_vendor_calls_in_order(case, monkeypatch):
    model, ref, make_feeds = gemm_model(**case)
    eng = graphc.compile(model, target="cuda", precision="fp16", arch=[ARCH], tactics=["cublaslt"],
                         extra={"tactics_force": True})  # fmt: skip
    ex = _fake(monkeypatch, eng)
    FL.calls.clear()
    # The vendor call runs only inside captures (the warm-up at load was before the clear): run 1
    # captures the kernels' graph, run 2 (the same input addresses again) the graph that also holds
    # the input/output copies (runtime/cuda.py), run 3 replays that one.
    for seed in (1, 2):
        feeds = make_feeds(seed)
        _close(G.host(eng.run(feeds))["y"], ref(feeds))
    captured = len(FL.calls)
    assert 1 <= captured <= 2
    feeds = make_feeds(4)
    _close(G.host(eng.run(feeds))["y"], ref(feeds))
    assert len(FL.calls) == captured  # a replay makes no host call
    call = FL.calls[0]
    assert call["ws_size"] == FL.WORKSPACE + (16 if call["epilogue"] != 1 else 0) and call["algo"] != 0
    feeds = make_feeds(3)
    _close(G.host(ex.default.run(feeds, use_graph=False))["y"], ref(feeds))
    other = ex.create_context()  # its own handle, workspace and arena
    _close(G.host(other.run(feeds))["y"], ref(feeds))
    assert other.vendor.handle != ex.default.vendor.handle
    assert other.vendor.workspace.data.ptr != ex.default.vendor.workspace.data.ptr


def test_a_recorded_algo_index_past_the_heuristics_list_takes_its_first(monkeypatch):
    model, ref, make_feeds = gemm_model(64, 96, 32, "bias_gelu")
    eng = graphc.compile(model, target="cuda", precision="fp16", arch=[ARCH], tactics=["cublaslt"],
                         extra={"tactics_force": True})  # fmt: skip
    for s in eng.plan.steps:
        if s.vendor:
            s.vendor["algo_index"] = 1  # the fake's second algorithm: no workspace
    ex = _fake(monkeypatch, eng)
    assert [c["step"] for c in ex.default.vendor.describe()] and ex.default.vendor.describe()[0]["algo_index"] == 1
    assert ex.default.vendor.describe()[0]["workspace_bytes"] == 0
    feeds = make_feeds()
    _close(G.host(eng.run(feeds))["y"], ref(feeds))
    for s in eng.plan.steps:
        if s.vendor:
            s.vendor["algo_index"] = 5
    ex = _fake(monkeypatch, eng)
    assert ex.default.vendor.describe()[0]["algo_index"] == 0


def test_vendor_calls_between_graphc_kernels(monkeypatch):
    model, x, want = softmax_between_matmuls(np.random.default_rng(0))
    eng = graphc.compile(model, target="cuda", precision="fp16", arch=[ARCH], tactics=["cublaslt"],
                         extra={"tactics_force": True})  # fmt: skip
    assert [bool(s.vendor) for s in eng.plan.steps] == [True, False, True]
    ex = _fake(monkeypatch, eng)
    ctx = ex.default
    assert [name for *_x, name in ctx.launches] == [s.name for s in eng.plan.steps]
    for _ in range(2):
        _close(G.host(eng.run({"x": x}))["y"], want)


def test_no_launch_after_a_vendor_call_is_programmatic():
    from graphc.runtime.cuda import launch_digests
    from graphc.runtime.plan import KernelPlan, Launch, Step

    def step(i, vendor):
        ln = [] if vendor else [Launch("k", f"{i:064x}", [1, 1, 1], [1, 1, 1], [])]
        return Step(i, f"s{i}", "K", "Op", "", {}, [], [f"t{i}"], launches=ln, vendor={"x": 1} if vendor else None)

    plan = KernelPlan({}, [step(0, False), step(1, True), step(2, False), step(3, False)], [], [], [])
    assert launch_digests(plan) == [f"{0:064x}", "", "", f"{3:064x}"]


def test_per_kernel_names_line_up_with_the_context_launches(monkeypatch):
    # graphc bench --per-kernel: a vendor step's row says cuBLASLt, graphc's rows their kernel's
    # name, in the order runtime/cuda.py builds the context's launches
    from graphc.bench import _kernel_names

    model, _ref, make_feeds = gemm_model(m=33, n=40, k=24, epilogue="bias_res")
    eng = graphc.compile(model, target="cuda", precision="fp16", arch=[ARCH], tactics=["cublaslt"],
                         extra={"tactics_force": True})  # fmt: skip
    ex = _fake(monkeypatch, eng)
    eng.run(make_feeds(1))
    launches = ex.default.launches
    names = _kernel_names(eng, len(launches))
    assert "cuBLASLt" in names and len(names) == len(launches)
    for (fn, *_rest, step), name in zip(launches, names, strict=True):
        if name == "cuBLASLt":
            assert fn is ex.default.vendor.calls[step]
        else:
            assert name in {ln.kernel for s in eng.plan.steps if s.name == step for ln in s.launches}
    assert _kernel_names(eng, len(launches) + 1) == [""] * (len(launches) + 1)  # no silent misalignment
