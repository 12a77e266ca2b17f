"""The tuner's whole flow through graphc.compile without a GPU: cupy, the device and the timings are
faked (candidates' cubins too), everything else is real: the untuned defaults from the engine's own
generation for sm_90, the candidates rendered and named by content, the search, the cache, the
whole-graph check building both engines (real NVRTC), and the final engine."""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest

import graphc
import models

try:
    from graphc.codegen.nvrtc import nvrtc_version

    nvrtc_version()
    HAVE_NVRTC = True
except Exception:
    HAVE_NVRTC = False

pytestmark = pytest.mark.skipif(not HAVE_NVRTC, reason="needs NVRTC (cuda-bindings)")


class FakeExecutor:
    def __init__(self, plan, memory, weights, cubins, names, device=0, launch_arch=None, **pdl):  # pdl_ready, pdl
        self.plan, self.cubins, self.launch_arch = plan, cubins, launch_arch


@pytest.fixture
def no_gpu_tuner(monkeypatch):
    """graphc.compile(tune=...) runs here as on an H200 whose every candidate but the first of each step
    is slower than the default, and the first 20% faster; the whole-graph timer is the test's."""
    import graphc.codegen.build as build
    import graphc.codegen.tuner as tuner
    import graphc.runtime.cuda as cuda

    pool = types.SimpleNamespace(free_all_blocks=lambda: None)
    fake_cupy = types.SimpleNamespace(
        uint8=np.uint8,
        empty=lambda n, dtype=None: types.SimpleNamespace(nbytes=int(n)),
        get_default_memory_pool=lambda: pool,
    )
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy)
    monkeypatch.setattr(build, "local_gpu_arch", lambda: "sm_90")
    monkeypatch.setattr(tuner.DeviceInfo, "of", classmethod(lambda cls, device=0: cls("NVIDIA H200", "90", "13000")))
    monkeypatch.setattr(cuda, "CUDAExecutor", FakeExecutor)
    monkeypatch.setattr(tuner, "compile_in_threads", lambda jobs, cache_dir=None: [b"\x7fELF" for _ in jobs])
    seen = {"loads": 0, "timed": []}

    def load(self, cubins):
        assert len(cubins) == len(self.sources) and all(c == b"\x7fELF" for c in cubins)
        seen["loads"] += 1

    def outputs(self):
        return {n: np.zeros(8, np.uint8) for n in self.bench.ctx.step.outputs}

    def benchmark(self):
        b = self.bench
        b.n = getattr(b, "n", 0) + 1  # the default is timed first, then the candidates in order
        seen["timed"].append(self.params)
        return 1.0 if b.n == 1 else (0.8 if b.n == 2 else 1.3)

    monkeypatch.setattr(tuner.KernelChoice, "load", load)
    monkeypatch.setattr(tuner.KernelChoice, "outputs", outputs)
    monkeypatch.setattr(tuner.KernelChoice, "benchmark", benchmark)
    timer = {"ms": [1.0, 0.5], "calls": []}

    def replay(executors):
        timer["calls"].append(executors)
        return list(timer["ms"])

    monkeypatch.setattr(tuner, "graph_replay_ms", replay)
    return seen, timer


def _compile(tmp_path, **kw):
    m = models.build("mlp", size="tiny")
    shapes = {k: v.shape for k, v in models.sample_inputs("mlp", m).items()}
    return graphc.compile(m, target="cuda", precision="fp16", shapes=shapes, cache_dir=tmp_path, **kw)


def _params(engine) -> dict[str, list[dict]]:
    return {s.name: [ln.params for ln in s.launches] for s in engine.plan.steps if s.launches}


def test_winners_are_kept_when_the_whole_graph_is_faster(no_gpu_tuner, tmp_path):
    seen, timer = no_gpu_tuner
    eng = _compile(tmp_path, tune="fast")
    rep = eng.report["tune"]
    assert rep["timed"] > 0 and rep["timed"] == rep["distinct_steps"] and rep["cache_hits"] == 0, rep
    assert seen["timed"][0] is None and seen["loads"] == len(seen["timed"])
    chosen = eng.report["tuning"]
    assert chosen and rep["changed_steps"] == len(chosen) and rep["validation"]["kept"], rep
    # the whole-graph check built the untuned and the tuned engine for sm_90 and timed them together
    (pair,) = timer["calls"]
    assert [e.launch_arch for e in pair] == ["sm_90", "sm_90"]
    untuned, tuned = pair
    # the final engine runs the chosen parameters on the tuned steps, the defaults elsewhere
    final = _params(eng)
    assert _params(types.SimpleNamespace(plan=tuned.plan)) == final
    for step, params in chosen.items():
        assert all(all(p.get(k) == v for k, v in params.items()) for p in final[step]), (step, params, final[step])
    assert _params(types.SimpleNamespace(plan=untuned.plan)) != final
    # a second compile takes every decision from the cache and times nothing
    seen["timed"].clear()
    again = _compile(tmp_path, tune="fast")
    assert seen["timed"] == [] and again.report["tune"]["cache_hits"] == rep["timed"]
    assert again.report["tuning"] == chosen


def test_winners_are_dropped_when_the_whole_graph_is_not_faster(no_gpu_tuner, tmp_path):
    seen, timer = no_gpu_tuner
    timer["ms"] = [1.0, 0.99]  # 1% faster: inside the 2% margin
    eng = _compile(tmp_path, tune="full")
    assert eng.report["tune"]["changed_steps"] > 0 and eng.report["tuning"] == {}
    assert eng.report["tune"]["validation"]["reason"] == "not faster"
    untuned = _compile(tmp_path)
    assert _params(eng) == _params(untuned)
    assert [ln.digest for s in eng.plan.steps for ln in s.launches] == [
        ln.digest for s in untuned.plan.steps for ln in s.launches
    ]
