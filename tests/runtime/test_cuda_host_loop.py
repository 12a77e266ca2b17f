"""Host loops on the CUDA target (graphc/host_loop.py, runtime/host_loop_cuda.py), without a GPU:
the engine is compiled for sm_90 (NVRTC runs here: the plan holds the body sub-plans with their
kernels), then run through graphc's CUDA run path with tools/fake_cupy.py for cupy and each
kernel's numpy reference for the kernel (tests/fake_gpu.py). Checks: numerics against ONNX Runtime
with and without CUDA graphs, the body's graph captured once and replayed per iteration, a static
loop captured whole, how many values are read back to the host per run, saved engines, nested
control flow in the body, and overlapping carried slots."""

from __future__ import annotations

import cf_models as M
import fake_gpu as G
import host_loop_models as H
import numpy as np
import pytest

import graphc
from graphc.passes import fold_control_flow
from graphc.runtime.format import read_engine
from graphc.runtime.host_loop_cuda import HostLoop, _overlaps
from helpers import run_ort

ARCH = "sm_90"


def _close(out: dict, ref: dict, tol: float = 1e-5) -> None:
    for k, r in ref.items():
        np.testing.assert_allclose(out[k], r, rtol=tol, atol=tol, err_msg=k)


@pytest.fixture(scope="module")
def built():
    models = {name: mk() for name, mk in H.MODELS.items()}  # once each: the builders draw random weights
    return {name: (m, graphc.compile(m, target="cuda", arch=[ARCH])) for name, m in models.items()}


def _fake(monkeypatch, eng, plan=None, memory=None, weights=None, cubins=None):
    return G.fake_executor(
        monkeypatch,
        plan or eng.plan,
        memory or eng.memory,
        weights or eng.weights,
        cubins or eng.kernels.cubins[ARCH],
        eng.kernels.names,
        ARCH,
    )


def test_the_plan_holds_each_body_with_its_kernels(built):
    for name, (_m, eng) in built.items():
        (step,) = [s for s in eng.plan.steps if s.op in ("Loop", "Scan")]
        assert "host_loop_version" in step.attrs and not step.launches, name
        body = step.attrs["body"]["plan"]
        launches = [ln for s in body["steps"] for ln in s.get("launches", [])]
        assert launches, name
        digests = {ln["digest"] for ln in launches}
        assert digests <= set(eng.kernels.cubins[ARCH]), name  # compiled by the same NVRTC run


@pytest.mark.parametrize("name", list(H.MODELS))
@pytest.mark.parametrize("use_graph", [True, False])
def test_host_loops_match_onnx_runtime(built, monkeypatch, name, use_graph):
    model, eng = built[name]
    ex = _fake(monkeypatch, eng)
    for seed in range(3):
        feeds = H.feeds_for(name, seed)
        _close(G.host(ex.run(feeds, use_graph=use_graph)), run_ort(model, feeds))


def _iterations(name: str, feeds: dict, model) -> int:
    if name == "trip_count":
        return int(feeds["M"])
    if name == "while":
        return int(run_ort(model, feeds)["n"])
    if name == "greedy":
        return int((run_ort(model, feeds)["tokens"] >= 0).sum())
    return {"long_loop": 100, "long_scan": 80}[name]


@pytest.mark.parametrize(
    ("name", "reads"),
    [
        ("trip_count", lambda it: 1),  # the trip count, once per run
        ("while", lambda it: 1 + it),  # the initial condition, then the body's after every iteration
        ("greedy", lambda it: min(it, 5)),  # the body's condition after every iteration but the 6th (M = 6 ends it)
        ("long_loop", lambda it: 0),  # static: nothing read back
        ("long_scan", lambda it: 0),
    ],
)
def test_what_each_run_reads_back_and_which_graphs_are_replayed(built, monkeypatch, name, reads):
    model, eng = built[name]
    ex = _fake(monkeypatch, eng)
    stats = ex.default.host_if_stats
    total = 0
    for seed in range(3):
        feeds = H.feeds_for(name, seed)
        it = _iterations(name, feeds, model)
        G.F.COUNTS.clear()
        before = stats["condition_reads"]
        ex.run(feeds)
        assert stats["condition_reads"] - before == reads(it), (seed, it)
        assert G.F.COUNTS["d2h"] == reads(it)
        total += it
    key = f"{eng.plan.steps[[s.op for s in eng.plan.steps].index('Loop' if name != 'long_scan' else 'Scan')].name}/body"
    assert stats[f"{key}:iterations"] == total
    if name in ("long_loop", "long_scan"):  # the whole loop is one graph, captured once
        assert stats[f"{key}:loop_captures"] == 1 and not stats[f"{key}:captures"]
    else:  # the body's graph, captured once and replayed per iteration
        assert stats[f"{key}:captures"] == 1 and not stats[f"{key}:loop_captures"]


def test_an_exported_while_loop_with_an_int64_max_trip_count(monkeypatch):
    # the trip count is a constant (not read back) too large to preallocate anything by: the
    # iteration table grows as the loop runs
    model = H.while_model(max_trip=np.iinfo(np.int64).max)
    eng = graphc.compile(model, target="cuda", arch=[ARCH])
    ex = _fake(monkeypatch, eng)
    for seed in range(2):
        feeds = H.feeds_for("while", seed)
        ref = run_ort(model, feeds)
        before = ex.default.host_if_stats["condition_reads"]
        _close(G.host(ex.run(feeds)), ref)
        assert ex.default.host_if_stats["condition_reads"] - before == int(ref["n"]) + 1


def test_a_static_loop_replays_as_one_graph_launch(built, monkeypatch):
    model, eng = built["long_loop"]
    ex = _fake(monkeypatch, eng)
    feeds = H.feeds_for("long_loop")
    ex.run(feeds)  # the captures
    G.F.COUNTS.clear()
    _close(G.host(ex.run(feeds)), run_ort(model, feeds))
    assert G.F.COUNTS["graph_launch"] == 1 and G.F.COUNTS["d2h"] == 0


def test_zero_iterations_on_the_gpu_path(built, monkeypatch):
    model, eng = built["trip_count"]
    ex = _fake(monkeypatch, eng)
    feeds = {**H.feeds_for("trip_count"), "M": np.array(0, np.int64)}
    _close(G.host(ex.run(feeds)), run_ort(model, feeds))
    model, eng = built["while"]
    ex = _fake(monkeypatch, eng)
    feeds = {"v0": np.ones(3, np.float32), "limit": np.array(1.0, np.float32)}
    _close(G.host(ex.run(feeds)), run_ort(model, feeds))


@pytest.mark.parametrize("name", ["greedy", "long_scan"])
def test_a_saved_engine_validates_its_bodies_and_runs(built, monkeypatch, tmp_path, name):
    from graphc.inspect import describe_engine

    model, eng = built[name]
    path = tmp_path / f"{name}.engine"
    eng.save(path)
    ef = read_engine(path)
    assert "runs on the host: it is a loop the optimizer did not unroll" in describe_engine(ef, path.name)
    ex = _fake(monkeypatch, eng, ef.plan, ef.memory, ef.weights, ef.cubins[ARCH])
    feeds = H.feeds_for(name, 2)
    _close(G.host(ex.run(feeds)), run_ort(model, feeds))


def test_a_loop_body_with_a_data_dependent_if_on_the_gpu_path(monkeypatch):
    monkeypatch.setattr(fold_control_flow, "MAX_UNROLL", 0)
    model = M.loop_static(6, nested_if=True)
    eng = graphc.compile(model, target="cuda", arch=[ARCH])
    ex = _fake(monkeypatch, eng)
    rng = np.random.default_rng(5)
    feeds = {
        "x": rng.standard_normal((2, 3)).astype(np.float32),
        "acc0": rng.standard_normal((2, 3)).astype(np.float32),
    }
    for use_graph in (True, False):
        _close(G.host(ex.run(feeds, use_graph=use_graph)), run_ort(model, feeds))
    (loop,) = [s for s in ex.default.segments if isinstance(s, HostLoop)]
    stats = loop.ctx.host_if_stats  # the body's own context chooses its If's branch
    assert stats["condition_reads"] == 12  # the nested If's condition, every iteration of both runs
    runs = sum(v for k, v in stats.items() if k.endswith(("/then:runs", "/else:runs")))
    assert runs == 12, dict(stats)


@pytest.mark.parametrize(("reverse", "out_axis"), [(False, 0), (True, 2)])
def test_scan_slices_and_outputs_along_inner_axes(monkeypatch, reverse, out_axis):
    monkeypatch.setattr(fold_control_flow, "MAX_UNROLL", 0)
    model = M.scan_cumsum(5, reverse, out_axis)
    eng = graphc.compile(model, target="cuda", arch=[ARCH])
    ex = _fake(monkeypatch, eng)
    rng = np.random.default_rng(6)
    feeds = {
        "s0": rng.standard_normal((2, 3)).astype(np.float32),
        "x": rng.standard_normal((2, 5, 3)).astype(np.float32),
    }
    for use_graph in (True, False):
        _close(G.host(ex.run(feeds, use_graph=use_graph)), run_ort(model, feeds))


def test_carried_copies_that_overwrite_each_others_sources_go_through_staging():
    # a swap: out0 lives where in1 is, out1 where in0 is (as in-place planning may place them)
    carry = [(100, 200, 8), (200, 100, 8)]
    staged, buf = HostLoop._stage(G.F.cupy, carry)
    assert buf is not None and len(staged) == 4
    mem = {100: b"A" * 8, 200: b"B" * 8}
    for dst, src, _n in staged:  # the staged order moves both values intact
        mem[dst] = mem[src]
    assert mem[100] == b"B" * 8 and mem[200] == b"A" * 8
    assert HostLoop._stage(G.F.cupy, [(100, 300, 8), (200, 400, 8)])[1] is None  # disjoint: direct
    assert _overlaps((0, 100, 8), (104, 0, 8)) and not _overlaps((0, 100, 8), (108, 0, 8))


@pytest.mark.parametrize("name", ["test_scan9_sum", "test_scan9_multi_state", "test_scan9_scalar"])
def test_onnx_node_tests_of_scan_as_host_loops(monkeypatch, name):
    import sys

    import onnx

    monkeypatch.setattr(fold_control_flow, "MAX_UNROLL", 0)
    sys.path.insert(0, "tools")
    from conformance import collect_cases

    (case,) = collect_cases(rf"^{name}$")
    model = onnx.load_from_string(case.model)
    ins, outs = case.data_sets[0]
    feeds = {i.name: np.asarray(a) for i, a in zip(model.graph.input, ins, strict=True)}  # a scalar as 0-d
    eng = graphc.compile(model, target="cuda", arch=[ARCH], shapes={k: v.shape for k, v in feeds.items()})
    assert any(line.startswith("Scan node") for line in eng.report["control_flow"])
    ex = _fake(monkeypatch, eng)
    want = dict(zip([o.name for o in model.graph.output], outs, strict=True))
    for use_graph in (True, False):
        _close(G.host(ex.run(feeds, use_graph=use_graph)), want)
