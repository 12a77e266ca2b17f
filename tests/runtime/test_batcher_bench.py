"""tools/bench_profiles.py --batcher-only on the CPU target with the tiny zoo BERT: only the text
model's dynamic engine is built, only the Batcher load runs, once per --pipelines value, each beside
its own unbatched run, with the same untimed warm-up on both sides (the numbers are the GPU's)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
import bench_profiles  # noqa: E402


def test_batcher_only_with_two_pipelines(tmp_path):
    md, js = tmp_path / "r.md", tmp_path / "r.json"
    argv = ["--zoo", "tiny", "--target", "cpu", "--precision", "fp32", "--min", "1", "--opt", "2", "--max", "4"]
    argv += ["--static", "2", "--seq", "6", "--concurrency", "4", "--requests", "40", "--jobs", "1"]
    argv += ["--batcher-only", "--pipelines", "2,1", "--work", str(tmp_path / "w")]
    assert bench_profiles.main([*argv, "--out-md", str(md), "--out-json", str(js)]) == 0
    r = json.loads(js.read_text())
    assert [(b["model"], b["kind"]) for b in r["builds"]] == [("bert", "dynamic")]  # no resnet, no statics
    assert r["rows"] == []
    bt = r["batcher"]
    assert bt["model"] == "bert" and bt["pipeline"] == 2 and bt["max_batch"] == 4
    assert [v["pipeline"] for v in bt["variants"]] == [1]
    for run in (bt, *bt["variants"]):
        assert run["warmup_requests"] == 16  # 4 x concurrency, untimed, on both sides
        for side in ("unbatched", "batcher"):
            assert run[side]["latency"]["samples"] == 40  # every timed request answered once
        assert 1.0 <= run["batcher"]["mean_batch"] <= 4.0
        assert run["speedup"] == run["batcher"]["throughput_per_s"] / run["unbatched"]["throughput_per_s"]
        assert run["p99_bound_ms"] == round(2 * 2.0 + run["batch_ms"], 4)
    text = md.read_text()
    assert "--batcher-only: the Batcher load alone" in text and "| model | batch |" not in text
    assert "| batcher (pipeline 1 run) |" in text and "Pipeline 1: " in text


def test_batcher_only_and_no_batcher_exclude_each_other(capsys):
    argv = ["--zoo", "tiny", "--batcher-only", "--no-batcher", "--out-md", "a", "--out-json", "b"]
    with pytest.raises(SystemExit) as e:
        bench_profiles.parse_args(argv)
    assert e.value.code == 2
    assert "--batcher-only and --no-batcher exclude each other" in capsys.readouterr().err
