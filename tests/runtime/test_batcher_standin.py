"""tools/bench_batcher_standin.py: the Batcher load on a stand-in CUDA engine (a fake GPU thread that
sleeps per batch) answers every request, reports batches no larger than the clients, and runs with
BERT-base's measured bucket times, eager (the default) and held (--hold)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
import bench_batcher_standin  # noqa: E402


def test_bert_cost_interpolates_the_measured_buckets():
    assert bench_batcher_standin.bert_ms(1) == 0.456 and bench_batcher_standin.bert_ms(32) == 1.947
    assert bench_batcher_standin.bert_ms(8) < bench_batcher_standin.bert_ms(10) < bench_batcher_standin.bert_ms(13)
    assert bench_batcher_standin.bert_ms(17) == pytest.approx(1.141 + (1.378 - 1.141) * 4 / 9)


@pytest.mark.parametrize("eager", [False, True])
def test_standin_load_answers_every_request(eager):
    r = bench_batcher_standin.measure(8, 1.0, 200, 2, 2.0, cost="bert", eager=eager)
    assert r["latency"]["samples"] == 200  # every request answered once
    assert 1.0 <= r["mean_batch"] <= 8.0  # never more rows than clients
    assert 0.0 < r["gpu_busy"] <= 1.0 and r["throughput_per_s"] > 0
    assert r["eager"] is eager and r["mode"] == ("eager" if eager else "hold") and r["cpu_us_per_request"] > 0
