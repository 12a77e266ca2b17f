"""The tuner's search and whole-graph rule without a GPU: fake candidates, an injected timer and
clock. The tuned engine is never kept when it is not faster; the budget stops the search; the cache
key separates GPUs and shapes."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pytest

from graphc.codegen import tune_search as S
from graphc.codegen.families.gemm import standalone_context
from graphc.codegen.tuner import DeviceInfo, TuningCache, tuning_key
from graphc.ir.types import DType


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class FakeChoice:
    """A candidate whose benchmark is a number and costs `cost_s` of the fake clock."""

    def __init__(self, params, ms: float, clock: Clock, cost_s: float = 1.0, out: float = 1.0, fails: bool = False):
        self.params, self.ms, self.clock, self.cost_s, self.out, self.fails = params, ms, clock, cost_s, out, fails
        self.loaded = self.timed = 0

    def compile_jobs(self) -> list[Any]:
        return [("job", self.params)]

    def load(self, cubins) -> None:
        assert list(cubins) == [b"cubin"]
        self.loaded += 1

    def outputs(self) -> dict[str, Any]:
        if self.fails:
            raise RuntimeError("launch failed")
        return {"y": np.full(4, self.out)}

    def benchmark(self) -> float:
        self.timed += 1
        self.clock.t += self.cost_s
        return self.ms


def compile_fn(jobs):
    return [b"cubin" for _ in jobs]


def same(out, ref) -> bool:
    return bool(np.allclose(out["y"], ref["y"]))


def prepared(choices):
    return [(c, [b"cubin"]) for c in choices]


def test_a_candidate_must_beat_the_default_by_the_margin_and_match_it() -> None:
    clk = Clock()
    b = S.Budget(100.0, clk)
    default = FakeChoice(None, 1.00, clk)
    assert S.pick_best(prepared([default, FakeChoice({"bm": 64}, 0.98, clk)]), same, b).params is None  # 2% < 3%
    pick = S.pick_best(
        prepared([default, FakeChoice({"bm": 64}, 0.90, clk), FakeChoice({"bm": 32}, 0.95, clk)]), same, b
    )
    assert pick.params == {"bm": 64} and pick.ms == 0.90 and pick.default_ms == 1.00 and pick.timed == 3
    wrong = FakeChoice({"bm": 16}, 0.10, clk, out=2.0)  # fastest, but computes something else
    broken = FakeChoice({"bm": 8}, 0.05, clk, fails=True)
    failing_compile = (FakeChoice({"bm": 4}, 0.01, clk), RuntimeError("nvrtc"))
    pick = S.pick_best([*prepared([default, wrong, broken]), failing_compile], same, b)
    assert pick.params is None and wrong.timed == 0 and broken.timed == 0
    # a default that cannot run: nothing can be proved faster than it, the step stays untuned
    assert (
        S.pick_best(prepared([FakeChoice(None, 1.0, clk, fails=True), FakeChoice({"bm": 64}, 0.5, clk)]), same, b)
        is None
    )


def tasks(clock: Clock, n: int, made: list[int]) -> list[S.Task]:
    def make(i: int):
        def f():
            made.append(i)
            return [FakeChoice(None, 1.0, clock, cost_s=5.0), FakeChoice({"i": i}, 0.5, clock, cost_s=5.0)]

        return f

    return [S.Task(("key", i), [f"step{i}"], make(i), label=f"step{i}") for i in range(n)]


def test_the_budget_stops_the_search(caplog: pytest.LogCaptureFixture) -> None:
    clk = Clock()
    made: list[int] = []
    seen = []
    with caplog.at_level(logging.INFO, logger="graphc.codegen.tuner"):
        rep = S.search(
            tasks(clk, 10, made), budget=S.Budget(22.0, clk), compile_fn=compile_fn, check=same,
            on_task=lambda t, p: seen.append(t.label),
        )  # fmt: skip
    # each task costs 10 s of the clock: tasks 0 and 1 finish (20 s), task 2 starts at 20 s, times its
    # default, finds the budget spent (25 s) before its candidate, and keeps what it has; then it stops
    assert rep.stopped_by_budget and rep.tasks == 10 and rep.untouched == 7
    assert set(rep.picks) == {("key", 0), ("key", 1), ("key", 2)}
    assert rep.picks[("key", 0)].params == {"i": 0} and rep.picks[("key", 2)].params is None
    assert seen == ["step0", "step1", "step2"] and rep.seconds == pytest.approx(25.0)
    assert max(made) <= 3  # at most the next task was prepared ahead
    assert "tuning stopped by its budget (22 s) after 3 of 10" in caplog.text


def test_without_a_budget_problem_every_task_is_picked() -> None:
    clk = Clock()
    rep = S.search(tasks(clk, 4, []), budget=S.Budget(1e9, clk), compile_fn=compile_fn, check=same)
    assert not rep.stopped_by_budget and rep.timed_tasks == 4
    assert [p.params for p in rep.picks.values()] == [{"i": i} for i in range(4)]


def test_budgets_of_the_modes_and_overrides() -> None:
    assert S.budget_seconds("fast") == 60.0 and S.budget_seconds("full") == 600.0
    assert S.budget_seconds("fast", 12.5) == 12.5
    for bad in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError):
            S.budget_seconds("full", bad)
    clk = Clock()
    b = S.Budget(100.0, clk)
    clk.t += 40
    part = b.part(0.8)
    assert part.seconds == pytest.approx(48.0) and b.left() == pytest.approx(60.0)


def timed(untuned_ms: float, tuned_ms: float):
    built: list[dict] = []

    def build(choices):
        built.append(choices)
        return "tuned" if choices else "untuned"

    def replay(engines):
        assert engines == ["untuned", "tuned"]
        return [untuned_ms, tuned_ms]

    return build, replay, built


CHOICES = {"gemm_1": {"BM": 64}, "conv_2": {"BM": 32}}


@pytest.mark.parametrize("tuned_ms", [1.30, 1.00, 0.99])  # slower, equal, faster but within the 2% margin
def test_the_tuned_engine_is_never_kept_when_not_faster(tuned_ms: float, caplog: pytest.LogCaptureFixture) -> None:
    build, replay, built = timed(1.00, tuned_ms)
    with caplog.at_level(logging.INFO, logger="graphc.codegen.tuner"):
        kept, v = S.validate(CHOICES, build, replay)
    assert kept == {} and not v.kept and v.reason == "not faster"
    assert (v.untuned_ms, v.tuned_ms) == (1.00, tuned_ms) and built == [{}, CHOICES]
    assert "tuning dropped" in caplog.text and "stays untuned" in caplog.text


def test_the_tuned_engine_is_kept_when_faster_by_the_margin() -> None:
    build, replay, _ = timed(1.00, 0.95)
    kept, v = S.validate(CHOICES, build, replay)
    assert kept == CHOICES and v.kept and v.as_json()["tuned_ms"] == 0.95


def test_a_failed_check_drops_the_tuning_and_no_change_needs_none() -> None:
    def build(choices):
        raise RuntimeError("out of memory")

    kept, v = S.validate(CHOICES, build, lambda e: [1.0, 0.5])
    assert kept == {} and not v.kept and "out of memory" in v.reason
    kept, v = S.validate({}, build, lambda e: pytest.fail("timed although nothing changed"))
    assert kept == {} and v.kept and v.reason == "no step changed"


def test_the_cache_key_includes_gpu_and_shape(tmp_path) -> None:
    small = standalone_context("MatMul", [(128, 768), (768, 768)], DType.float16)
    large = standalone_context("MatMul", [(4096, 768), (768, 768)], DType.float16)
    h200 = DeviceInfo("NVIDIA H200", "90", "13000")
    a100 = DeviceInfo("NVIDIA A100-SXM4-80GB", "80", "13000")
    k = tuning_key(small, "gemm", h200)
    assert k == tuning_key(standalone_context("MatMul", [(128, 768), (768, 768)], DType.float16), "gemm", h200)
    assert k.gpu == "NVIDIA H200" and k.sm == "90"
    assert tuning_key(large, "gemm", h200).signature != k.signature  # the shape
    assert tuning_key(small, "gemm", a100) != k  # the GPU
    bf16 = standalone_context("MatMul", [(128, 768), (768, 768)], DType.bfloat16)
    assert tuning_key(bf16, "gemm", h200).signature != k.signature  # the dtype
    cache = TuningCache(tmp_path / "t.sqlite")
    cache.put(k, {"BM": 64}, 0.1, 6)
    assert cache.get(k) == ({"BM": 64}, 0.1)
    assert cache.get(tuning_key(small, "gemm", a100)) is None and cache.get(tuning_key(large, "gemm", h200)) is None
    cache.close()


def _nvrtc_ok() -> bool:
    try:
        from graphc.codegen.nvrtc import nvrtc_version

        nvrtc_version()
        return True
    except Exception:
        return False


@pytest.mark.skipif(not _nvrtc_ok(), reason="NVRTC (cuda-bindings) is not installed")
def test_candidates_compile_in_threads_through_the_cache(tmp_path) -> None:
    from graphc.codegen.families.gemm import search_space
    from graphc.codegen.kernel import family_for
    from graphc.codegen.tuner import KernelChoice, compile_in_threads

    ctx = standalone_context("MatMul", [(64, 128), (128, 128)], DType.float16)
    fam = family_for(ctx)
    choices = [KernelChoice.from_sources(p, fam.generate(ctx.with_params(p)), "sm_80", None, None)
               for p in search_space(ctx)[:2]]  # fmt: skip
    jobs = [j for c in choices for j in c.compile_jobs()]
    assert jobs and all(j.arch == "sm_80" for j in jobs)
    assert [ln.kernel for c in choices for ln in c.launches] == [j.name for j in jobs]
    cubins = compile_in_threads([*jobs, jobs[0]], tmp_path, workers=2)  # a duplicate: compiled once
    assert len(cubins) == len(jobs) + 1 and cubins[-1] == cubins[0]
    assert all(c[:4] == b"\x7fELF" for c in cubins)
    assert len(list(tmp_path.glob("*.cubin"))) == len({j.source for j in jobs})


def test_cli_tune_budget_needs_tune_and_a_positive_number(tmp_path, capsys) -> None:
    import models
    from graphc.cli import EXIT_USER_ERROR, main

    models.save(models.build("mlp", size="tiny"), tmp_path / "mlp.onnx")
    base = ["compile", str(tmp_path / "mlp.onnx"), "-o", str(tmp_path / "m.engine"), "--target", "cuda"]
    assert main([*base, "--tune-budget-s", "30"]) == EXIT_USER_ERROR
    assert "--tune-budget-s: only with --tune fast or --tune full" in capsys.readouterr().err
    assert main([*base, "--tune", "fast", "--tune-budget-s", "-5"]) == EXIT_USER_ERROR
    err = capsys.readouterr().err
    assert "tune_budget_s must be a positive number of seconds" in err and "Traceback" not in err
