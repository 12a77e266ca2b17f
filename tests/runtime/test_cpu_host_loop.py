"""Host loops on the CPU engine (graphc/host_loop.py, runtime/host_loop_cpu.py): a Loop or Scan
the optimizer does not unroll (a trip count or exit known only at run time, or more iterations than
MAX_UNROLL) runs its body as a planned sub-plan once per iteration. Checks: numerics against ONNX
Runtime (a run-time trip count, a while loop, a greedy decode-like loop with an early exit, a long
static loop with a scan output, a long Scan over two axes and directions), zero iterations, saved
engines, the report, nested control flow in the body, the ONNX node tests, and one-line refusals."""

from __future__ import annotations

import copy
import subprocess
import sys

import cf_models as M
import host_loop_models as H
import numpy as np
import onnx
import pytest

import graphc
import graphc.runtime
from graphc.errors import GraphcError
from graphc.passes import fold_control_flow
from graphc.runtime.errors import EngineError
from helpers import run_ort


def _close(out: dict, ref: dict, tol: float = 1e-5) -> None:
    assert set(ref) <= set(out)
    for k, r in ref.items():
        assert out[k].shape == r.shape and out[k].dtype == r.dtype, k
        np.testing.assert_allclose(out[k], r, rtol=tol, atol=tol, err_msg=k)


@pytest.fixture(scope="module")
def engines():
    models = {name: mk() for name, mk in H.MODELS.items()}  # once each: the builders draw random weights
    return {name: (m, graphc.compile(m, target="cpu")) for name, m in models.items()}


@pytest.mark.parametrize("name", list(H.MODELS))
def test_host_loops_match_onnx_runtime(engines, name):
    model, eng = engines[name]
    assert any(line.startswith(("Loop node", "Scan node")) for line in eng.report["control_flow"])
    for seed in range(4):
        feeds = H.feeds_for(name, seed)
        _close(eng.run(feeds), run_ort(model, feeds))


def test_the_greedy_loop_exits_early_on_some_inputs_and_runs_to_the_bound_on_others(engines):
    model, eng = engines["greedy"]
    lengths = set()
    for seed in range(12):
        feeds = H.feeds_for("greedy", seed)
        toks = eng.run(feeds)["tokens"]
        np.testing.assert_array_equal(toks, run_ort(model, feeds)["tokens"])
        lengths.add(int((toks >= 0).sum()))
    assert min(lengths) < 6 and 6 in lengths, lengths  # both exits are exercised


def test_zero_iterations_give_the_initial_values(engines):
    model, eng = engines["trip_count"]
    feeds = {**H.feeds_for("trip_count"), "M": np.array(0, np.int64)}
    _close(eng.run(feeds), run_ort(model, feeds))
    model, eng = engines["while"]
    feeds = {"v0": np.ones(3, np.float32), "limit": np.array(1.0, np.float32)}  # the condition is false on entry
    out = eng.run(feeds)
    assert int(out["n"]) == 0
    _close(out, run_ort(model, feeds))


def test_an_exported_while_loop_with_an_int64_max_trip_count():
    model = H.while_model(max_trip=np.iinfo(np.int64).max)
    eng = graphc.compile(model, target="cpu")
    assert "at most 9223372036854775807 iterations, with an exit computed from data" in eng.report["control_flow"][0]
    for seed in range(3):
        feeds = H.feeds_for("while", seed)
        _close(eng.run(feeds), run_ort(model, feeds))


def test_the_report_says_how_each_loop_runs(engines):
    lines = {n: " ".join(e.report["control_flow"]) for n, (_m, e) in engines.items()}
    assert "trip count and exit known only at run time" in lines["trip_count"]
    assert "the body's condition read every iteration" in lines["while"]
    assert "at most 6 iterations, with an exit computed from data" in lines["greedy"]
    assert "100 iterations, more than fold_control_flow's MAX_UNROLL" in lines["long_loop"]
    assert "preallocated at their static length" in lines["long_loop"]
    assert "80 steps" in lines["long_scan"]


@pytest.mark.parametrize("name", ["greedy", "long_scan"])
def test_a_saved_engine_runs_its_loops(engines, name, tmp_path):
    model, eng = engines[name]
    path = tmp_path / f"{name}.engine"
    eng.save(path)
    loaded = graphc.runtime.load(path)
    feeds = H.feeds_for(name, 3)
    _close(loaded.run(feeds), run_ort(model, feeds))


@pytest.fixture
def no_unroll(monkeypatch):
    """Every loop stays a loop: the host-loop path for the small control-flow models too."""
    monkeypatch.setattr(fold_control_flow, "MAX_UNROLL", 0)


@pytest.mark.parametrize("nested_if", [False, True])
def test_a_body_with_a_data_dependent_if_of_its_own(no_unroll, nested_if):
    model = M.loop_static(7, nested_if=nested_if)
    eng = graphc.compile(model, target="cpu")
    text = " ".join(eng.report["control_flow"])
    assert "Loop node" in text and ("If node" in text) == nested_if
    rng = np.random.default_rng(3)
    feeds = {
        "x": rng.standard_normal((2, 3)).astype(np.float32),
        "acc0": rng.standard_normal((2, 3)).astype(np.float32),
    }
    _close(eng.run(feeds), run_ort(model, feeds))


@pytest.mark.parametrize(("reverse", "out_axis"), [(False, 0), (True, 0), (True, 2), (False, -1)])
def test_scan_directions_and_axes(no_unroll, reverse, out_axis):
    model = M.scan_cumsum(5, reverse, out_axis)
    eng = graphc.compile(model, target="cpu")
    assert any(line.startswith("Scan node") for line in eng.report["control_flow"])
    rng = np.random.default_rng(4)
    feeds = {
        "s0": rng.standard_normal((2, 3)).astype(np.float32),
        "x": rng.standard_normal((2, 5, 3)).astype(np.float32),
    }
    _close(eng.run(feeds), run_ort(model, feeds))


def _node_case(name: str):
    sys.path.insert(0, "tools")
    from conformance import collect_cases

    (case,) = collect_cases(rf"^{name}$")
    model = onnx.load_from_string(case.model)
    ins, outs = case.data_sets[0]
    feeds = {i.name: a for i, a in zip(model.graph.input, ins, strict=True)}
    return model, feeds, dict(zip([o.name for o in model.graph.output], outs, strict=True))


@pytest.mark.parametrize("name", ["test_scan9_sum", "test_scan9_multi_state", "test_scan9_scalar"])
@pytest.mark.parametrize("unroll", [True, False])
def test_onnx_node_tests_of_scan_on_the_cpu_engine(monkeypatch, unroll, name):
    if not unroll:
        monkeypatch.setattr(fold_control_flow, "MAX_UNROLL", 0)
    model, feeds, want = _node_case(name)
    eng = graphc.compile(model, target="cpu", shapes={k: v.shape for k, v in feeds.items()})
    assert ("control_flow" in eng.report) != unroll
    _close(eng.run(feeds), want)


@pytest.mark.parametrize(
    "name",
    ["test_loop11", "test_range_float_type_positive_delta_expanded", "test_range_int32_type_negative_delta_expanded"],
)
def test_onnx_node_tests_whose_scan_length_is_a_run_time_value_are_refused_in_one_line(name):
    # their scan output's length is the trip count, an input's value: the engines plan static shapes
    model, feeds, _ = _node_case(name)
    with pytest.raises(GraphcError, match=r"^Loop node '[^']+': output '[^']+' has shape .*\[\?\].*run-time values"):
        graphc.compile(model, target="cpu", shapes={k: v.shape for k, v in feeds.items()})


def test_a_loop_that_grows_its_carried_value_is_refused_in_one_line(tmp_path):
    path = tmp_path / "grow.onnx"
    onnx.save(H.growing_loop_model(), path)
    with pytest.raises(GraphcError, match=r"^Loop node 'grow': output 'v' has shape"):
        graphc.compile(str(path), target="cpu")
    r = subprocess.run(
        [sys.executable, "-m", "graphc", "compile", str(path), "-o", str(tmp_path / "g.engine"), "--target", "cpu"],
        capture_output=True,
        text=True,
    )
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "Loop node 'grow'" in r.stderr


def test_a_static_loop_with_an_early_exit_and_a_scan_output_is_refused(no_unroll):
    # its scan output's length is the number of iterations run, which the data decides
    with pytest.raises(GraphcError, match=r"^Loop node '[^']+': output 'scans' has shape"):
        graphc.compile(M.loop_static(5, early_exit=True), target="cpu")


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (lambda a: a.update(host_loop_version=9), "loop layout 9"),
        (lambda a: a.update(num_carried=5), "carried"),
        (lambda a: a["body"].pop("plan"), "body sub-plan is malformed"),
        (lambda a: a["body"].update(inputs_from=[7]), "inputs do not match"),
        (lambda a: a.update(trip_count=-1), "trip_count"),
    ],
)
def test_a_malformed_loop_step_is_one_engine_error(engines, edit, match):
    from graphc.cpu_kernels import cpu_kernel
    from graphc.runtime.cpu import CPUExecutor

    _model, eng = engines["long_loop"]
    plan = copy.deepcopy(eng.plan)
    step = next(s for s in plan.steps if s.op == "Loop")
    edit(step.attrs)
    with pytest.raises(EngineError, match=match):
        CPUExecutor(plan, eng.memory, eng.weights, cpu_kernel)
