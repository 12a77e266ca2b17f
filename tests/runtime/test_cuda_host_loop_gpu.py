"""Host loops on a GPU (runtime/host_loop_cuda.py): the CUDA engine against ONNX Runtime for the
models of tests/host_loop_models.py (fp32 within 1e-4 of each output's scale; fp16 cosine >= 0.999
for the float-only ones, whose exits do not hinge on rounding), graph replay against plain
launches, a saved and reloaded engine, the counters (the body's graph captured once, a static loop
captured whole, what is read back per run), a body with a data-dependent If, and graphc bench's
host-loop figures."""

from __future__ import annotations

import cf_models as M
import host_loop_models as H
import numpy as np
import pytest

import graphc
import graphc.runtime
from graphc.cli import compare_outputs
from graphc.passes import fold_control_flow
from helpers import run_ort

pytestmark = pytest.mark.gpu

FLOAT_ONLY = ["trip_count", "long_loop", "long_scan"]  # no integer outputs, no exit decided by a comparison


def _check(e, feeds: dict, ref: dict, precision: str) -> None:
    graph = e.run(feeds, to_numpy=True)
    plain = e.executor.run(e.check_feeds(feeds), use_graph=False, to_numpy=True)
    for outs in (graph, plain):
        ints = {k: v for k, v in ref.items() if v.dtype.kind in "iub"}
        for k, v in ints.items():  # counts and tokens: exact
            np.testing.assert_array_equal(outs[k], v, err_msg=k)
        floats = {k: v for k, v in ref.items() if k not in ints}
        ok, lines = compare_outputs(outs, floats, precision, 1e-4 if precision == "fp32" else None)
        assert ok, lines


@pytest.mark.parametrize("name", list(H.MODELS))
def test_fp32_engines_match_onnx_runtime(name, tmp_path):
    model = H.MODELS[name]()
    eng = graphc.compile(model, target="cuda")
    eng.save(tmp_path / "e.engine")
    loaded = graphc.runtime.load(tmp_path / "e.engine")
    for seed in range(4):
        feeds = H.feeds_for(name, seed)
        ref = run_ort(model, feeds)
        for e in (eng, loaded):
            _check(e, feeds, ref, "fp32")
    stats = loaded.executor.default.host_if_stats
    assert all(v == 1 for k, v in stats.items() if k.endswith((":captures", ":loop_captures"))), dict(stats)
    key = next(s.name for s in eng.plan.steps if s.op in ("Loop", "Scan")) + "/body"
    assert stats[f"{key}:iterations"] > 0
    if name in ("long_loop", "long_scan"):
        assert stats[f"{key}:loop_captures"] == 1 and stats["condition_reads"] == 0


@pytest.mark.parametrize("name", FLOAT_ONLY)
def test_fp16_engines_match_onnx_runtime(name):
    model = H.MODELS[name]()
    eng = graphc.compile(model, target="cuda", precision="fp16")
    for seed in range(3):
        feeds = H.feeds_for(name, seed)
        _check(eng, feeds, run_ort(model, feeds), "fp16")


def test_the_greedy_loop_exits_where_onnx_runtime_does():
    model = H.greedy_decode_model()
    eng = graphc.compile(model, target="cuda")
    lengths = set()
    for seed in range(12):
        feeds = H.feeds_for("greedy", seed)
        toks = eng.run(feeds, to_numpy=True)["tokens"]
        np.testing.assert_array_equal(toks, run_ort(model, feeds)["tokens"])
        lengths.add(int((toks >= 0).sum()))
    assert min(lengths) < 6 and 6 in lengths, lengths


def test_zero_iterations_on_the_gpu():
    model = H.trip_count_model()
    eng = graphc.compile(model, target="cuda")
    feeds = {**H.feeds_for("trip_count"), "M": np.array(0, np.int64)}
    _check(eng, feeds, run_ort(model, feeds), "fp32")


def test_a_body_with_a_data_dependent_if(monkeypatch):
    monkeypatch.setattr(fold_control_flow, "MAX_UNROLL", 0)
    model = M.loop_static(7, nested_if=True)
    eng = graphc.compile(model, target="cuda")
    rng = np.random.default_rng(7)
    feeds = {
        "x": rng.standard_normal((2, 3)).astype(np.float32),
        "acc0": rng.standard_normal((2, 3)).astype(np.float32),
    }
    for _ in range(2):
        _check(eng, feeds, run_ort(model, feeds), "fp32")


def test_bench_reports_the_host_loop():
    from graphc.bench import benchmark, format_bench

    eng = graphc.compile(H.while_model(), target="cuda")
    feeds = H.feeds_for("while", 1)
    iters = int(run_ort(H.while_model(), feeds)["n"])
    r = benchmark(eng, feeds, iterations=30, warmup=5)
    h = r["host_if"]
    assert h["loop_steps"] == 1 and h["loop_iterations_per_run"] == iters
    assert h["condition_reads_per_run"] == iters + 1  # the initial condition, then one per iteration
    assert h["condition_wait_ms_per_run"] > 0
    assert "host loops: 1 step(s) iterated on the host" in format_bench(r)
