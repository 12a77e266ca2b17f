"""Data-dependent If on the CUDA target (graphc/host_if.py, graphc/host_if_cuda.py,
runtime/host_if_cuda.py), without a GPU: the engine is compiled for sm_90 (NVRTC runs here), then
run through graphc's CUDA run path with tools/fake_cupy.py for cupy and each kernel's numpy
reference for the kernel (tests/runtime/fake_gpu.py). Checks: numerics against ONNX Runtime, the
branch the data picks is the graph replayed, each graph captured once and reused, the condition
read back once per If per run, a saved engine validated with its sub-plans, malformed sub-plans
refused in one line."""

from __future__ import annotations

import copy

import cf_models as M
import fake_gpu as G
import numpy as np
import pytest
from host_if_models import data_if_model, ill_typed_else_model, nested_if_model
from onnx import TensorProto

import graphc
import graphc.runtime
from graphc.runtime.errors import EngineError
from graphc.runtime.format import read_engine
from helpers import run_ort

FL = TensorProto.FLOAT
RNG = np.random.default_rng(12)
ARCH = "sm_90"


def _close(out: dict, ref: dict) -> None:
    for k, r in ref.items():
        np.testing.assert_allclose(out[k], r, rtol=1e-5, atol=1e-5, err_msg=k)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    model = data_if_model()
    eng = graphc.compile(model, target="cuda", arch=[ARCH])
    path = tmp_path_factory.mktemp("cudaif") / "if.engine"
    eng.save(path)
    return model, eng, path


def _run_on_fake(monkeypatch, eng, plan=None, memory=None, weights=None):
    ex = G.fake_executor(
        monkeypatch,
        plan or eng.plan,
        memory or eng.memory,
        weights or eng.weights,
        eng.kernels.cubins[ARCH],
        eng.kernels.names,
        ARCH,
    )
    eng.executor = ex
    return ex


def test_the_report_says_what_runs_on_the_host(built):
    _, eng, _ = built
    (line,) = eng.report["control_flow"]
    assert "If node 'pick'" in line and "CUDA engine reads the condition back" in line
    step = next(s for s in eng.plan.steps if s.op == "If")
    assert not step.launches  # the If itself launches nothing: its branches do
    for key in ("then_branch", "else_branch"):
        sub = step.attrs[key]["plan"]
        assert sub["steps"] and all(s["launches"] for s in sub["steps"] if not s["alias"])
    # the branches' kernels are the engine's (compiled by the same NVRTC run)
    digests = {ln["digest"] for k in ("then_branch", "else_branch") for s in step.attrs[k]["plan"]["steps"]
               for ln in s["launches"]}  # fmt: skip
    assert digests <= set(eng.kernels.cubins[ARCH])


def test_the_branch_the_data_picks_runs_and_matches_onnx_runtime(built, monkeypatch):
    model, eng, _ = built
    ex = _run_on_fake(monkeypatch, eng)
    ctx = ex.default
    stats = ctx.host_if_stats
    signs = [1, 1, -1, 1, -1]
    for i, sign in enumerate(signs):
        x = (np.abs(RNG.standard_normal((3, 6))) * sign).astype(np.float32)
        ref = run_ort(model, {"x": x})
        G.F.COUNTS.clear()
        out = G.host(eng.run({"x": x}))
        _close(out, ref)
        # one condition read per run, and the branch taken is the one the data says
        assert G.F.COUNTS["d2h"] == 1
        assert stats["condition_reads"] == i + 1
        assert stats["pick/then:runs"] == signs[: i + 1].count(1)
        assert stats["pick/else:runs"] == signs[: i + 1].count(-1)
    # every graph captured once, on first use, and replayed after
    assert stats["pick/then:captures"] == 1 and stats["pick/else:captures"] == 1
    assert stats["segment_captures"] == 2  # the steps before the If, the steps after it


def test_without_graphs_the_same_answer(built, monkeypatch):
    model, eng, _ = built
    ex = _run_on_fake(monkeypatch, eng)
    for sign in (1, -1):
        x = (np.abs(RNG.standard_normal((3, 6))) * sign).astype(np.float32)
        _close(G.host(ex.run({"x": x}, use_graph=False)), run_ort(model, {"x": x}))
    assert not any(k.endswith("captures") for k in ex.default.host_if_stats)


def test_a_second_context_has_its_own_branch_graphs(built, monkeypatch):
    model, eng, _ = built
    ex = _run_on_fake(monkeypatch, eng)
    other = ex.create_context()
    x = np.abs(RNG.standard_normal((3, 6))).astype(np.float32)
    _close(G.host(other.run({"x": x})), run_ort(model, {"x": x}))
    assert other.host_if_stats["pick/then:captures"] == 1 and not ex.default.host_if_stats


def test_a_saved_engine_validates_its_sub_plans_and_runs(built, monkeypatch):
    model, eng, path = built
    ef = read_engine(path)
    from graphc.inspect import describe_engine

    text = describe_engine(ef, "if.engine")  # `graphc inspect` says which step runs on the host, and why
    assert "runs on the host: its condition is known only at run time" in text
    assert "then_branch: 2 steps, 2 launches" in text and "else_branch: 2 steps, 2 launches" in text
    ex = G.fake_executor(monkeypatch, ef.plan, ef.memory, ef.weights, ef.cubins[ARCH], eng.kernels.names, ARCH)
    for sign in (1, -1):
        x = (np.abs(RNG.standard_normal((3, 6))) * sign).astype(np.float32)
        _close(G.host(ex.run({"x": x})), run_ort(model, {"x": x}))


def test_if_on_an_input_scalar(monkeypatch):
    model = M.if_on_input()
    eng = graphc.compile(model, target="cuda", arch=[ARCH])
    _run_on_fake(monkeypatch, eng)
    x = RNG.standard_normal((2, 3)).astype(np.float32)
    for cond in (True, False, True):
        feeds = {"c": np.array(cond), "x": x}
        _close(G.host(eng.run(feeds)), run_ort(model, feeds))
    stats = eng.executor.default.host_if_stats
    assert stats["If_0/then:runs"] == 2 and stats["If_0/then:captures"] == 1
    assert "segment_captures" not in stats  # nothing runs before or after the If


def _edited(eng, edit):
    plan = copy.deepcopy(eng.plan)
    edit(next(s for s in plan.steps if s.op == "If"))
    return plan


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (lambda s: s.attrs["else_branch"].pop("memory"), r"^step 'pick' \(If\): its else_branch sub-plan is malformed"),
        (lambda s: s.attrs["then_branch"].update(inputs_from=[0, 9]), "sub-plan's inputs do not match"),
        (lambda s: s.attrs.update(host_if_version=7), "sub-plan layout 7, expected 1"),
    ],
)
def test_a_malformed_sub_plan_is_one_engine_error(built, monkeypatch, edit, match):
    _, eng, _ = built
    with pytest.raises(EngineError, match=match) as e:
        _run_on_fake(monkeypatch, eng, plan=_edited(eng, edit))
    assert "\n" not in str(e.value)


def test_an_edited_sub_plan_launch_is_refused_at_read(built, tmp_path):
    """The validator reads the branch sub-plans as plans: a launch of a kernel the engine does
    not hold is refused before anything runs."""
    import dataclasses
    import zipfile

    _, eng, path = built
    bad = dataclasses.replace(eng, plan=copy.deepcopy(eng.plan), executor=None)
    bad.kernels = eng.kernels
    index, step = next((i, s) for i, s in enumerate(bad.plan.steps) if s.op == "If")
    ln = next(ln for s in step.attrs["then_branch"]["plan"]["steps"] for ln in s["launches"])
    ln["digest"] = "0" * 64
    bad.save(tmp_path / "bad.engine")
    with pytest.raises(EngineError, match=r"launches kernel 000000000000 that the engine does not hold \(in the "
                       rf"then_branch of step {index} \('pick'\)\)") as e:  # fmt: skip
        read_engine(tmp_path / "bad.engine")
    assert "\n" not in str(e.value)
    with zipfile.ZipFile(path) as z:
        assert any(n.endswith(".cubin") for n in z.namelist())


@pytest.mark.parametrize("target", ["cpu", "cuda"])
def test_a_branch_that_does_not_type_check_is_refused_at_run_time(target, monkeypatch, tmp_path):
    model = ill_typed_else_model()
    eng = graphc.compile(model, target=target, shapes={"x": (2, 3)}, arch=[ARCH] if target == "cuda" else None)
    (line,) = eng.report["control_flow"]
    assert "else refused at run time" in line
    if target == "cuda":
        _run_on_fake(monkeypatch, eng)
    else:  # through a saved engine: the refusal is part of the plan data
        eng.save(tmp_path / "e.engine")
        eng = graphc.runtime.load(tmp_path / "e.engine")
    x = RNG.standard_normal((2, 3)).astype(np.float32)
    out = eng.run({"c": np.array(True), "x": x})
    _close(G.host(out) if target == "cuda" else out, run_ort(model, {"c": np.array(True), "x": x}))
    with pytest.raises(Exception):  # noqa: B017 - ONNX Runtime's own error type
        run_ort(model, {"c": np.array(False), "x": x})
    refusal = r"^step 'sr_if' \(If\): the else-branch cannot run on these input shapes: "
    with pytest.raises(EngineError, match=refusal) as e:
        eng.run({"c": np.array(False), "x": x})
    assert "\n" not in str(e.value) and "Reshape" in str(e.value)


def test_nested_data_dependent_ifs_choose_on_the_host_at_both_levels(monkeypatch, tmp_path):
    model = nested_if_model()
    eng = graphc.compile(model, target="cuda", arch=[ARCH])
    assert len(eng.report["control_flow"]) == 2  # the outer If and the one in its then-branch
    eng.save(tmp_path / "n.engine")
    ef = read_engine(tmp_path / "n.engine")  # the inner If's sub-plans validated too (their weights are the engine's)
    _run_on_fake(monkeypatch, eng, plan=ef.plan, memory=ef.memory, weights=ef.weights)
    seen = set()
    for x in (
        np.full((2, 5), 2.0, np.float32),  # outer then, inner then
        np.full((2, 5), 0.5, np.float32),  # outer then, inner else
        np.full((2, 5), -1.0, np.float32),  # outer else
        np.full((2, 5), 2.0, np.float32),  # the first path again: its graphs replayed
    ):
        ref = run_ort(model, {"x": x})
        seen.add(round(float(ref["y"].sum()), 3))
        _close(G.host(eng.run({"x": x})), ref)
    assert len(seen) == 3
    stats = eng.executor.default.host_if_stats
    assert stats["outer/then:runs"] == 3 and stats["outer/else:runs"] == 1
    assert stats["condition_reads"] == 4  # the outer If every run
    inner = next(s for s in eng.executor.default.segments if hasattr(s, "then_b")).then_b.ctx
    assert inner.host_if_stats["condition_reads"] == 3  # the inner If when the outer takes then
    assert inner.host_if_stats["inner/then:captures"] == 1
    assert inner.host_if_stats["inner/then:runs"] == 2


def test_fp16_keeps_the_if_boundary_in_fp32_and_matches(monkeypatch):
    """passes/precision.py keeps a data-dependent If's fp32 boundary (Casts around it); each branch
    is converted inside, as a graph of its own."""
    from graphc.cli import compare_outputs

    model = data_if_model()
    eng = graphc.compile(model, target="cuda", arch=[ARCH], precision="fp16")
    step = next(s for s in eng.plan.steps if s.op == "If")
    dtypes = {t["dtype"] for t in step.attrs["then_branch"]["plan"]["tensors"].values()}
    assert "float16" in dtypes  # the branch computes in fp16 inside
    _run_on_fake(monkeypatch, eng)
    for sign in (1, -1):
        x = (np.abs(RNG.standard_normal((3, 6))) * sign).astype(np.float32)
        ok, lines = compare_outputs(G.host(eng.run({"x": x})), run_ort(model, {"x": x}), "fp16")
        assert ok, lines


def test_a_launch_that_fails_during_capture_keeps_no_graph(built, monkeypatch):
    """A partial graph would replay later without the failed work: the capture is ended and the
    next run captures again."""
    model, eng, _ = built
    ex = _run_on_fake(monkeypatch, eng)
    real = G.FakeKernel.__call__
    fail = [True]

    def flaky(self, *a, **k):
        if fail[0]:
            fail[0] = False
            raise RuntimeError("launch failed")
        return real(self, *a, **k)

    monkeypatch.setattr(G.FakeKernel, "__call__", flaky)
    x = np.abs(RNG.standard_normal((3, 6))).astype(np.float32)
    with pytest.raises(RuntimeError, match="launch failed"):
        ex.run({"x": x})
    assert G.F._CAPTURE[0] is None  # the capture was ended
    _close(G.host(ex.run({"x": x})), run_ort(model, {"x": x}))


def test_graphc_check_notes_what_runs_on_the_host():
    from graphc.support import check_model

    rep = check_model(data_if_model(), target="cuda")
    assert rep.supported
    (note,) = [f for f in rep.notes if f.op == "If"]
    assert note.nodes == ("pick",) and "condition read back" in note.reason and "on the host" in note.reason
    assert any("pick" in line and "on the host" in line for line in rep.lines())


def test_int8_branches_keep_fp32_and_say_so():
    """Calibration samples feed the main graph's inputs, not a branch's: the branches stay fp32,
    logged and in the report (never silently)."""
    rng = np.random.default_rng(0)
    cal = [{"x": rng.standard_normal((3, 6)).astype(np.float32)} for _ in range(4)]
    eng = graphc.compile(data_if_model(), target="cuda", arch=[ARCH], precision="int8", calibration_data=cal)
    lines = eng.report["control_flow"]
    assert sum("keeps fp32 under int8" in line for line in lines) == 2
    step = next(s for s in eng.plan.steps if s.op == "If")
    dtypes = {t["dtype"] for t in step.attrs["then_branch"]["plan"]["tensors"].values()}
    assert dtypes == {"float32"}
