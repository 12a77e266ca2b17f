"""The auto-tuner on a GPU: a tuned engine still computes the model, its choices persist, and a second
compile takes them from the cache without timing anything."""

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


@pytest.mark.parametrize("name", ["resnet", "bert"])
def test_tuned_engine_is_correct_and_cached(name, tmp_path, monkeypatch):
    import graphc.codegen.tuner as tuner

    m = models.build(name, size="tiny")
    feeds = models.sample_inputs(name, m)
    shapes = {k: v.shape for k, v in feeds.items()}
    ref = graphc.interpret(graphc.load_onnx(m), feeds)
    eng = graphc.compile(m, target="cuda", precision="fp16", shapes=shapes, tune="fast", cache_dir=tmp_path)
    choices = eng.report["tuning"]
    assert choices, "no step of the model was tuned"
    out = eng.run(feeds, to_numpy=True)
    for k, r in ref.items():
        assert np.isfinite(out[k]).all()
        assert _cosine(np.asarray(out[k]), r) >= 0.999, k
    with sqlite3.connect(tmp_path / "tuning.sqlite") as db:
        (rows,) = db.execute("SELECT COUNT(*) FROM records").fetchone()
    # one record per distinct (family, template, signature): repeated layers share theirs
    assert 0 < rows <= len(choices)

    class NoTiming:  # a cache hit must not bench a single candidate
        def __init__(self, *a, **k):
            raise AssertionError("the second compile timed a kernel instead of using the tuning cache")

    monkeypatch.setattr(tuner, "StepBench", NoTiming)
    again = graphc.compile(m, target="cuda", precision="fp16", shapes=shapes, tune="fast", cache_dir=tmp_path)
    assert again.report["tuning"] == choices
