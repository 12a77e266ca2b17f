"""Data-dependent If on a GPU (runtime/host_if_cuda.py): the CUDA engine against ONNX Runtime for the
models of tests/host_if_models.py and cf_models (fp32 within 1e-4 of each output's scale, fp16 cosine
>= 0.999), graph replay against plain launches, a saved and reloaded engine, graphc bench's host-If
figures, and the trained corpus models with If where tools/fetch_trained_models.py's cache is here."""

from __future__ import annotations

import sys
from pathlib import Path

import cf_models as M
import numpy as np
import pytest
from host_if_models import data_if_model, ill_typed_else_model, nested_if_model

import graphc
import graphc.runtime
from graphc.cli import compare_outputs
from graphc.runtime.errors import EngineError
from helpers import run_ort

pytestmark = pytest.mark.gpu
RNG = np.random.default_rng(3)


def _feeds(name: str, sign: float) -> dict[str, np.ndarray]:
    if name == "data_if":
        return {"x": (np.abs(RNG.standard_normal((3, 6))) * sign).astype(np.float32)}
    if name == "nested":
        return {"x": np.full((2, 5), 2.0 if sign > 0 else -1.0, np.float32) * RNG.uniform(0.6, 1.0)}
    return {"c": np.array(sign > 0), "x": RNG.standard_normal((2, 3)).astype(np.float32)}


MODELS = {"data_if": data_if_model, "nested": nested_if_model, "if_on_input": M.if_on_input}


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_the_cuda_engine_matches_onnx_runtime_on_both_branches(name, precision, tmp_path):
    model = MODELS[name]()
    eng = graphc.compile(model, target="cuda", precision=precision)
    eng.save(tmp_path / "e.engine")
    loaded = graphc.runtime.load(tmp_path / "e.engine")
    for sign in (1, -1, 1, -1):
        feeds = _feeds(name, sign)
        ref = run_ort(model, feeds)
        for e in (eng, loaded):
            graph = e.run(feeds, to_numpy=True)
            plain = e.executor.run(e.check_feeds(feeds), use_graph=False, to_numpy=True)
            for outs in (graph, plain):
                ok, lines = compare_outputs(outs, ref, precision, 1e-4 if precision == "fp32" else None)
                assert ok, lines
    stats = loaded.executor.default.host_if_stats
    assert stats["condition_reads"] == 8  # per input: one read in the graph run, one in the plain run
    assert all(v == 1 for k, v in stats.items() if k.endswith(":captures"))


def test_a_refused_branch_is_one_line_on_the_gpu():
    eng = graphc.compile(ill_typed_else_model(), target="cuda", shapes={"x": (2, 3)})
    x = RNG.standard_normal((2, 3)).astype(np.float32)
    ok, lines = compare_outputs(eng.run({"c": np.array(True), "x": x}, to_numpy=True), {"y": x * 2}, "fp32", 1e-6)
    assert ok, lines
    with pytest.raises(EngineError, match="the else-branch cannot run on these input shapes"):
        eng.run({"c": np.array(False), "x": x})
    # the engine still runs after a refusal
    ok, _ = compare_outputs(eng.run({"c": np.array(True), "x": x}, to_numpy=True), {"y": x * 2}, "fp32", 1e-6)
    assert ok


def test_bench_reports_the_host_round_trip():
    from graphc.bench import benchmark, format_bench

    eng = graphc.compile(data_if_model(), target="cuda")
    r = benchmark(eng, _feeds("data_if", 1), iterations=30, warmup=5)
    h = r["host_if"]
    assert h["if_steps"] == 1 and h["segments"] == 2 and h["condition_reads_per_run"] == 1.0
    assert h["condition_wait_ms_per_run"] > 0
    assert "data-dependent If: 1 step(s) chosen on the host" in format_bench(r)


def _corpus() -> Path:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
    from fetch_trained_models import default_cache

    return default_cache() / "models"


CORPUS_IF_MODELS = ["silero_vad", "openwakeword_silero_vad", "silero_vad_op18_ifless", "openwakeword_hey_jarvis"]


@pytest.mark.parametrize("name", CORPUS_IF_MODELS)
def test_trained_models_with_if_match_onnx_runtime(name):
    path = _corpus() / f"{name}.onnx"
    if not path.exists():
        pytest.skip(f"{path} is not here (python tools/fetch_trained_models.py --fetch-only)")
    import check_models as CM

    feeds = CM.export_inputs(path.with_suffix(".json"), 1, 128)
    ref = CM.ort_run(str(path), feeds)
    for precision in ("fp32", "fp16"):
        eng = graphc.compile(
            str(path), target="cuda", precision=precision, shapes={k: v.shape for k, v in feeds.items()}
        )
        ok, lines = compare_outputs(
            eng.run(feeds, to_numpy=True), ref, precision, 1e-3 if precision == "fp32" else None
        )
        assert ok, (precision, lines)
