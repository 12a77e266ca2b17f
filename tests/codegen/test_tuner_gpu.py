"""The auto-tuner on a GPU: a tuned engine still computes the model, its decisions persist and a
second compile takes them from the cache without timing anything; tuning that does not make the
whole graph faster is dropped; the budget stops the search."""

from __future__ import annotations

import sqlite3

import numpy as np
import pytest

import graphc
import models

pytestmark = pytest.mark.gpu


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def _model(name: str):
    m = models.build(name, size="tiny")
    feeds = models.sample_inputs(name, m)
    return m, feeds, {k: v.shape for k, v in feeds.items()}


def _digests(engine) -> list[str]:
    return [ln.digest for s in engine.plan.steps for ln in s.launches]


@pytest.mark.parametrize("name", ["resnet", "bert"])
def test_tuned_engine_is_correct_validated_and_cached(name, tmp_path, monkeypatch):
    import graphc.codegen.tuner as tuner

    m, feeds, shapes = _model(name)
    ref = graphc.interpret(graphc.load_onnx(m), feeds)
    eng = graphc.compile(m, target="cuda", precision="fp16", shapes=shapes, tune="fast", cache_dir=tmp_path)
    rep = eng.report["tune"]
    assert rep["distinct_steps"] > 0 and rep["timed"] > 0 and not rep["stopped_by_budget"], rep
    assert rep["tune_s"] <= 60.0 and rep["budget_s"] == pytest.approx(48.0, abs=1.0), rep
    v = rep["validation"]
    if v["kept"] and v["tuned_ms"] is not None:  # kept only when the whole graph got faster
        assert v["tuned_ms"] <= v["untuned_ms"] * (1 - v["margin"]), v
    else:
        assert eng.report["tuning"] == {}, v
    out = eng.run(feeds, to_numpy=True)
    for k, r in ref.items():
        assert np.isfinite(out[k]).all()
        assert _cosine(np.asarray(out[k]), r) >= 0.999, k
    with sqlite3.connect(tmp_path / "tuning.sqlite") as db:
        (rows,) = db.execute("SELECT COUNT(*) FROM records").fetchone()
    assert rows == rep["timed"]  # one record per distinct step timed: repeated layers share theirs

    class NoTiming:  # a cache hit must not bench a single candidate
        def __init__(self, *a, **k):
            raise AssertionError("the second compile timed a kernel instead of using the tuning cache")

    monkeypatch.setattr(tuner, "StepBench", NoTiming)
    again = graphc.compile(m, target="cuda", precision="fp16", shapes=shapes, tune="fast", cache_dir=tmp_path)
    assert again.report["tune"]["cache_hits"] == rep["timed"]
    assert again.report["tune"]["changed_steps"] == rep["changed_steps"]


def test_tuning_that_is_not_faster_on_the_whole_graph_is_dropped(tmp_path, monkeypatch):
    """A real tuned choice (a non-default GEMM tile) and a whole-graph timer that says it is slower:
    the engine is the untuned one, kernel for kernel."""
    import graphc.codegen.tuner as tuner
    from graphc.codegen.kernel import family_for

    m, feeds, shapes = _model("bert")

    def fake_tune(plan, weights, *, precision, allow_tf32, **kw):
        for step in plan.steps:
            if step.alias:
                continue
            ctx = plan.context(step, weights, precision=precision, allow_tf32=allow_tf32)
            fam = family_for(ctx)
            if fam.name == "gemm" and fam.search_space is not None and len(fam.search_space(ctx)) > 1:
                return tuner.TuneResult({step.name: fam.search_space(ctx)[-1]}, {"changed_steps": 1})
        raise AssertionError("no tunable GEMM in the tiny BERT")

    timed = []

    def slower(executors, **kw):
        timed.append(len(executors))
        return [1.0, 1.5]

    monkeypatch.setattr(tuner, "tune_plan", fake_tune)
    monkeypatch.setattr(tuner, "graph_replay_ms", slower)
    eng = graphc.compile(m, target="cuda", precision="fp16", shapes=shapes, tune="fast", cache_dir=tmp_path)
    assert timed == [2] and eng.report["tuning"] == {}
    assert eng.report["tune"]["validation"] == {
        "kept": False, "untuned_ms": 1.0, "tuned_ms": 1.5, "margin": 0.02, "reason": "not faster",
    }  # fmt: skip
    untuned = graphc.compile(m, target="cuda", precision="fp16", shapes=shapes, cache_dir=tmp_path)
    assert _digests(eng) == _digests(untuned)


def test_real_replay_timer_times_both_engines(tmp_path):
    from graphc.codegen.tuner import graph_replay_ms

    m, feeds, shapes = _model("resnet")
    a = graphc.compile(m, target="cuda", precision="fp16", shapes=shapes, cache_dir=tmp_path)
    b = graphc.compile(m, target="cuda", precision="fp16", shapes=shapes, cache_dir=tmp_path)
    ta, tb = graph_replay_ms([a.executor, b.executor], rounds=3, calls=5)
    assert 0 < ta < 100 and 0 < tb < 100 and 0.5 < ta / tb < 2.0  # the same engine twice
    out = a.run(feeds, to_numpy=True)  # the timer's own inputs did not break the engine's next run
    ref = graphc.interpret(graphc.load_onnx(m), feeds)
    assert all(_cosine(np.asarray(out[k]), r) >= 0.999 for k, r in ref.items())


def test_the_budget_stops_tuning(tmp_path):
    m, feeds, shapes = _model("bert")
    eng = graphc.compile(
        m, target="cuda", precision="fp16", shapes=shapes, tune="full", tune_budget_s=1.0, cache_dir=tmp_path
    )
    rep = eng.report["tune"]
    assert rep["stopped_by_budget"] and rep["not_reached"] > 0 and rep["budget_s"] == pytest.approx(0.8), rep
    assert rep["search_s"] < 30.0, rep  # one step's candidates at most once the budget is gone
