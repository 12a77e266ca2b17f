"""tools/bench_profiles.py --batcher-only on the CPU target with the tiny zoo BERT: only the text
model's dynamic engine is built, only the Batcher load runs, once per --pipelines value with the
default (eager) Batcher and, with --hold, once more each holding partial batches, each beside its own
unbatched run, with the same untimed warm-up on both sides (the numbers are the GPU's)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
import bench_profiles  # noqa: E402


def test_batcher_only_with_two_pipelines_eager_and_held(tmp_path):
    md, js = tmp_path / "r.md", tmp_path / "r.json"
    argv = ["--zoo", "tiny", "--target", "cpu", "--precision", "fp32", "--min", "1", "--opt", "2", "--max", "4"]
    argv += ["--static", "2", "--seq", "6", "--concurrency", "4", "--requests", "40", "--jobs", "1"]
    argv += ["--batcher-only", "--pipelines", "2,1", "--hold", "--work", str(tmp_path / "w")]
    assert bench_profiles.main([*argv, "--out-md", str(md), "--out-json", str(js)]) == 0
    r = json.loads(js.read_text())
    assert [(b["model"], b["kind"]) for b in r["builds"]] == [("bert", "dynamic")]  # no resnet, no statics
    assert r["rows"] == []
    bt = r["batcher"]
    assert bt["model"] == "bert" and bt["pipeline"] == 2 and bt["max_batch"] == 4
    assert bt["eager"] is True and bt["mode"] == "eager"  # the result (the bars judge it) is the default Batcher
    assert [(v["pipeline"], v["mode"]) for v in bt["variants"]] == [(1, "eager"), (2, "hold"), (1, "hold")]
    for run in (bt, *bt["variants"]):
        assert run["warmup_requests"] == 16  # 4 x concurrency, untimed, on both sides
        for side in ("unbatched", "batcher"):
            assert run[side]["latency"]["samples"] == 40  # every timed request answered once
        assert 1.0 <= run["batcher"]["mean_batch"] <= 4.0
        assert run["speedup"] == run["batcher"]["throughput_per_s"] / run["unbatched"]["throughput_per_s"]
        assert run["p99_bound_ms"] == round(2 * 2.0 + run["batch_ms"], 4)
    text = md.read_text()
    assert "--batcher-only: the Batcher load alone" in text and "| model | batch |" not in text
    assert "max_wait 2 ms, eager (a batch closes as soon as none runs), pipeline 2" in text
    assert "| batcher (eager) |" in text and "| batcher (pipeline 1, eager run) |" in text
    assert "| batcher (pipeline 2, hold run) |" in text and "| unbatched (pipeline 1, hold run) |" in text
    assert "Eager, pipeline 2: throughput " in text and "(bar 5x: " in text
    assert "Pipeline 1, eager: " in text and "Pipeline 2, hold: " in text


def test_batcher_only_and_no_batcher_exclude_each_other(capsys):
    argv = ["--zoo", "tiny", "--batcher-only", "--no-batcher", "--out-md", "a", "--out-json", "b"]
    with pytest.raises(SystemExit) as e:
        bench_profiles.parse_args(argv)
    assert e.value.code == 2
    assert "--batcher-only and --no-batcher exclude each other" in capsys.readouterr().err
