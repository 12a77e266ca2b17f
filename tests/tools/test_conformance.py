"""tools/conformance.py on a small subset: comparison rules, workers, time-outs, reports, --expect."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from helpers import make_node_model, rand

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
import conformance as C  # noqa: E402

from graphc.frontend.registry import find_converter  # noqa: E402

SUBSET = r"^test_(relu|softmax_axis_0|softmax_axis_0_expanded|flexattention_expanded_ver26|abs)$"


@pytest.fixture(scope="module")
def subset() -> list[C.Case]:
    return C.collect_cases(SUBSET)


def relu_case(name: str = "test_my_relu", expected: np.ndarray | None = None) -> C.Case:
    x = rand((3, 4), seed=1)
    model = make_node_model("Relu", {"x": x})
    want = np.maximum(x, 0) if expected is None else expected
    return C.Case(name, "Relu", model.SerializeToString(), [([x], [want])], rtol=1e-3, atol=1e-7)


# ---- case collection and op attribution ------------------------------------------------------


def test_collect_filters_and_names_the_op(subset):
    by_name = {c.name: c for c in subset}
    assert set(by_name) == {
        "test_relu",
        "test_abs",
        "test_softmax_axis_0",
        "test_softmax_axis_0_expanded",
        "test_flexattention_expanded_ver26",
    }
    assert by_name["test_relu"].op == "Relu"
    # an expanded case counts under the op it expands: from its twin, or from its name
    assert by_name["test_softmax_axis_0_expanded"].op == "Softmax"
    assert by_name["test_flexattention_expanded_ver26"].op == "FlexAttention"
    assert all(c.data_sets and isinstance(c.model, bytes) for c in subset)


def test_run_subset_in_workers(subset):
    if find_converter("Relu", "", 28) is None or find_converter("Abs", "", 28) is None:
        pytest.skip("elementwise converters have not landed")
    results = C.run_cases(subset, jobs=2, timeout_s=60)
    assert [r.name for r in results] == [c.name for c in subset]
    status = {r.name: r.status for r in results}
    assert status["test_relu"] == "passed" and status["test_abs"] == "passed"
    assert all(r.status in C.STATUSES for r in results)


# ---- comparison, as ONNX's runner compares ----------------------------------------------------


def test_compare_outputs_rules():
    a = np.array([1.0, 2.0, np.nan], np.float32)
    assert C.compare_outputs([a], [a.copy()], 1e-3, 1e-7) is None  # NaNs equal
    assert "values differ" in C.compare_outputs([a], [a + 1], 1e-3, 1e-7)
    assert C.compare_outputs([a], [a * (1 + 1e-4)], 1e-3, 1e-7) is None  # within rtol
    assert "dtype float64" in C.compare_outputs([a], [a.astype(np.float64)], 1e-3, 1e-7)
    assert "shape (1, 3)" in C.compare_outputs([a], [a.reshape(1, 3)], 1e-3, 1e-7)
    assert "2 outputs, expected 1" in C.compare_outputs([a], [a, a], 1e-3, 1e-7)
    s = np.array(["a", "b"], dtype=object)
    assert C.compare_outputs([s], [s.copy()], 0, 0) is None
    assert C.compare_outputs([s], [np.array(["a", "c"], dtype=object)], 0, 0) == "output 0: strings differ"
    seq = [np.zeros(2, np.float32), np.ones(3, np.float32)]
    assert C.compare_outputs([seq], [[x.copy() for x in seq]], 1e-3, 1e-7) is None
    assert "element 1" in C.compare_outputs([seq], [[seq[0], seq[1] + 1]], 1e-3, 1e-7)
    assert "sequence of 1" in C.compare_outputs([seq], [seq[:1]], 1e-3, 1e-7)
    assert "expected a sequence" in C.compare_outputs([seq], [seq[0]], 1e-3, 1e-7)
    # bfloat16: two ULPs at least, as ONNX's runner allows
    b = np.array([1.0, 3.0], ml_dtypes.bfloat16)
    assert C.compare_outputs([b], [(b.astype(np.float32) * 1.01).astype(ml_dtypes.bfloat16)], 1e-7, 0) is None
    assert C.compare_outputs([b], [(b.astype(np.float32) * 1.1).astype(ml_dtypes.bfloat16)], 1e-7, 0)
    i = np.array([1, 2], np.int64)
    assert C.compare_outputs([i], [i + 1], 0, 0)


def test_run_case_statuses():
    if find_converter("Relu", "", 28) is None:
        pytest.skip("elementwise converters have not landed")
    assert C.run_case(relu_case()).status == "passed"
    wrong = C.run_case(relu_case(expected=np.zeros((3, 4), np.float32) - 1))
    assert wrong.status == "failed" and "values differ" in wrong.reason
    model = make_node_model("Relu", {"x": rand((2,))})
    model.graph.node[0].op_type, model.graph.node[0].domain = "Nope", "com.example"
    model.opset_import.add(domain="com.example", version=1)
    unsupported = C.run_case(C.Case("test_nope", "Nope", model.SerializeToString(), [], 1e-3, 1e-7))
    assert unsupported.status == "unsupported" and unsupported.missing == ["com.example.Nope"]
    broken = C.run_case(C.Case("test_broken", "Relu", b"not a model", [], 1e-3, 1e-7))
    assert broken.status == "failed" and broken.reason.startswith("load: ModelLoadError")


# ---- workers: a hang or a crash costs one case --------------------------------------------


def _slow_or_dying(case: C.Case) -> C.Result:
    if case.name == "test_hang":
        time.sleep(60)
    if case.name == "test_crash":
        os._exit(3)
    return C.Result(case.name, case.op, "passed")


def test_time_limit_and_crash_fail_one_case_each(monkeypatch):
    if C._mp_context().get_start_method() != "fork":
        pytest.skip("the patched run_case reaches workers only when they fork")
    monkeypatch.setattr(C, "run_case", _slow_or_dying)
    cases = [relu_case(n) for n in ("test_a", "test_hang", "test_b", "test_crash", "test_c")]
    t0 = time.monotonic()
    results = {r.name: r for r in C.run_cases(cases, jobs=2, timeout_s=1.0)}
    assert time.monotonic() - t0 < 20
    assert results["test_hang"].status == "failed" and "timed out" in results["test_hang"].reason
    assert results["test_crash"].status == "failed" and "worker died" in results["test_crash"].reason
    assert all(results[n].status == "passed" for n in ("test_a", "test_b", "test_c"))


# ---- reports and the regression check ---------------------------------------------------


def _results() -> list[C.Result]:
    return [
        C.Result("test_relu", "Relu", "passed"),
        C.Result("test_softmax_axis_0", "Softmax", "failed", "output 0: values differ | x"),
        C.Result("test_softmax_axis_0_expanded", "Softmax", "unsupported", "no", missing=["ReduceMax"]),
    ]


def test_reports(tmp_path):
    md, js = tmp_path / "c.md", tmp_path / "c.json"
    C.write_reports(_results(), md, js, "softmax|relu")
    text = md.read_text()
    assert "| 1 | 1 | 1 | 3 | 33.3% |" in text
    assert "| Softmax | 0 | 1 | 1 | 2 |" in text
    # a failure and a missing op with their why (a case no one has analysed says so)
    assert "| test_softmax_axis_0 | Softmax | not yet analysed | output 0: values differ \\| x |" in text
    assert "| ReduceMax | 1 | not implemented |" in text
    data = json.loads(js.read_text())
    assert data["totals"] == {"passed": 1, "failed": 1, "unsupported": 1, "total": 3}
    assert data["cases"]["test_relu"]["status"] == "passed"
    assert {"onnx", "numpy", "date"} <= set(data["environment"])


def test_regressions():
    recorded = {
        "cases": {
            "test_relu": {"status": "passed"},
            "test_softmax_axis_0": {"status": "passed"},
            "test_softmax_axis_0_expanded": {"status": "unsupported"},
            "test_gone": {"status": "passed"},  # not run now: not a regression
        }
    }
    bad = C.regressions(_results(), recorded)
    assert [r.name for r, _ in bad] == ["test_softmax_axis_0"]


def test_cli_writes_reports_and_checks_expectations(tmp_path, capsys):
    if find_converter("Relu", "", 28) is None:
        pytest.skip("elementwise converters have not landed")
    md = tmp_path / "conformance.md"
    assert C.main(["--filter", "^test_relu$", "--jobs", "1", "--out", str(md), "-q"]) == 0
    data = json.loads(md.with_suffix(".json").read_text())
    assert data["cases"]["test_relu"]["status"] == "passed"
    assert C.main(["--filter", "^test_relu$", "--jobs", "1", "--expect", str(md.with_suffix(".json")), "-q"]) == 0
    # A record saying an unsupported case passed: the check fails.
    data["cases"]["test_relu"]["status"] = "passed"
    data["cases"]["test_regex_full_match_basic"] = {"op": "RegexFullMatch", "status": "passed"}
    expect = tmp_path / "expect.json"
    expect.write_text(json.dumps(data))
    code = C.main(["--filter", "^test_(relu|regex_full_match_basic)$", "--jobs", "1", "--expect", str(expect), "-q"])
    out = capsys.readouterr().out
    if "1 case(s) passed" in out:
        assert code == 1 and "test_regex_full_match_basic" in out
    else:  # graphc learned RegexFullMatch meanwhile
        assert code == 0


def test_every_recorded_failure_and_missing_op_has_its_why():
    # docs/conformance.md says why each case that does not pass does not (issue 12)
    from pathlib import Path

    recorded = json.loads((Path(__file__).parents[2] / "docs" / "conformance.json").read_text())["cases"]
    for name, case in recorded.items():
        if case["status"] == "failed":
            assert C.why_failed(name) != "not yet analysed", name
        for op in case.get("missing") or []:
            assert C.why_missing(op) != "not implemented", (name, op)
