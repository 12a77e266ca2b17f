"""tools/bench_profiles.py on the CPU target with the tiny zoo models: every engine is built, each
batch is timed on the dynamic engine and on the static engine of that batch, a batch that is no
bucket is marked padded, outputs agree with the static engine's, the Batcher load runs, and the
JSON and Markdown say so (the numbers themselves are the GPU run's business)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
import bench_profiles  # noqa: E402


def test_cpu_dry_run(tmp_path):
    md, js = tmp_path / "r.md", tmp_path / "r.json"
    argv = ["--zoo", "tiny", "--target", "cpu", "--precision", "fp32", "--min", "3", "--opt", "3", "--max", "5"]
    argv += ["--static", "3,5", "--extra", "4", "--seq", "6", "--concurrency", "4", "--requests", "40"]
    argv += ["--calls", "2", "--rounds", "1", "--warmup", "0", "--jobs", "2", "--work", str(tmp_path / "w")]
    assert bench_profiles.main([*argv, "--out-md", str(md), "--out-json", str(js)]) == 0
    r = json.loads(js.read_text())
    assert not [b for b in r["builds"] if b["error"]]
    dyn = {b["model"]: b for b in r["builds"] if b["kind"] == "dynamic"}
    assert {m: [s["batch"] for s in b["buckets"]] for m, b in dyn.items()} == {"bert": [3, 5], "resnet": [3, 5]}
    rows = {(x["model"], x["batch"]): x for x in r["rows"]}
    assert set(rows) == {(m, b) for m in ("bert", "resnet") for b in (3, 5, 4)}
    for (_m, batch), x in rows.items():
        assert "error" not in x
        assert x["opt"] == (batch == 3) and x["bar"] == (1.10 if batch == 3 else 1.25)
        assert x["bucket"] == {"batch": 5 if batch == 4 else batch} and x["bucket_shape"] == (batch != 4)
        assert x["dyn_a_ms"] > 0 and x["static_a_ms"] > 0
        assert x["dyn_b_ms"] is None and "b_ratio" not in x  # no graph replays on the CPU target
        assert x["a_ratio"] == round(x["dyn_a_ms"] / x["static_a_ms"], 3)
        # the same plan at a bucket's shape: the same numbers; padded, the real rows agree closely
        if batch == 4:
            assert x["max_rel_diff_vs_static"] < 1e-5
        else:
            assert x["max_rel_diff_vs_static"] == 0.0
    bt = r["batcher"]
    assert bt["model"] == "bert" and bt["requests"] == 40 and bt["max_batch"] == 5
    assert bt["p99_bound_ms"] == round(2 * 2.0 + bt["batch_ms"], 4)
    assert bt["speedup"] == bt["batcher"]["throughput_per_s"] / bt["unbatched"]["throughput_per_s"]
    text = md.read_text()
    assert "| bert | 4* | 5 |" in text and "| resnet | 3 (opt) | 3 |" in text and "## Batcher" in text
    assert "  - dim 'batch': rows ladder (at most 1.25x the rows): target cpu" in text  # how the buckets were chosen


def test_ladder_lines_show_the_estimate_beside_the_measured_static_times():
    lad = {"method": "time", "limit": 1.2, "max_padding": 1.25, "sizes": [1, 21, 32], "est_s": 8.6,
           "est_ms_every_size": {"1": 0.35, "20": 0.74, "21": 0.78, "22": 0.97, "32": 1.09}}  # fmt: skip
    build = {"model": "resnet50", "dims": [{"name": "batch", "ladder": lad}]}
    rows = [{"model": "resnet50", "batch": 20, "static_b_ms": 0.89}, {"model": "bert", "batch": 22, "static_b_ms": 1.4}]
    (line,) = bench_profiles._ladder_lines(build, rows)
    assert line.endswith("1: 0.350, 20: 0.740 (static 0.890), 21: 0.780, 32: 1.090")
    assert "est(bucket) <= 1.2 est(n), rows <= 1.25 n" in line
