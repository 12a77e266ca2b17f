"""`graphc bench ENGINE --batcher` on a CPU engine of the zoo built for batch 8: the table of both
loads, its JSON, and one-line usage errors (exit 2) for flags that do not fit."""

from __future__ import annotations

import json
import re

import pytest

import models
from graphc.bench import format_batcher_bench
from graphc.cli import main


@pytest.fixture(scope="module")
def mlp_engine(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli_batcher")
    models.save(models.build("mlp", size="tiny"), d / "mlp.onnx")
    eng = d / "mlp.engine"
    assert main(["compile", str(d / "mlp.onnx"), "-o", str(eng), "--target", "cpu", "--shapes", "batch=8", "-q"]) == 0
    return eng


def test_bench_batcher_prints_both_loads(mlp_engine, tmp_path, capsys):
    out_json = tmp_path / "b.json"
    args = ["bench", str(mlp_engine), "--batcher", "--concurrency", "8", "--requests", "120", "--max-batch", "4"]
    assert main([*args, "--max-wait-ms", "5", "--json", str(out_json)]) == 0
    out = capsys.readouterr().out
    assert "8 client threads, 120 batch-1 requests" in out
    assert "batcher max_batch 4, max_wait 5 ms, eager, pipeline 2" in out  # the default Batcher: eager
    assert re.search(r"p50 ms\s+p99 ms\s+requests/s\s+mean batch", out)
    rows = {
        m.group(1): m.groups()[1:]
        for m in re.finditer(r"^  (unbatched|batcher)\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)$", out, re.M)
    }
    assert rows.keys() == {"unbatched", "batcher"}
    assert rows["unbatched"][3] == "1.00"
    r = json.loads(out_json.read_text())
    for name in ("unbatched", "batcher"):
        assert r[name]["latency"]["samples"] == 120  # every request answered once
        assert float(rows[name][0]) == pytest.approx(r[name]["latency"]["median_ms"], abs=1e-3)
    assert 1.0 <= r["batcher"]["mean_batch"] <= 4.0  # never more than max_batch rows per run
    assert r["batcher"]["batches"] >= 120 / 4
    assert "x unbatched" in out
    assert format_batcher_bench(r) in out
    assert r["eager"] is True and r["mode"] == "eager"


def test_bench_batcher_hold(mlp_engine, tmp_path, capsys, monkeypatch):
    """--hold runs the Batcher with eager=False (a partial batch is held for max_wait even when none
    is running): the Batcher made gets eager=False, and the table and the JSON say "hold"; every
    request is still answered once."""
    import graphc.runtime.batcher as batcher_mod

    made: list[bool] = []
    real = batcher_mod.Batcher

    class Spy(real):  # records what benchmark_batcher asked for, then behaves as the real one
        def __init__(self, *a, **kw):
            made.append(kw.get("eager", "unset"))
            super().__init__(*a, **kw)

    monkeypatch.setattr(batcher_mod, "Batcher", Spy)
    out_json = tmp_path / "b.json"
    args = ["bench", str(mlp_engine), "--batcher", "--concurrency", "4", "--requests", "40", "--hold"]
    assert main([*args, "--json", str(out_json)]) == 0
    out = capsys.readouterr().out
    assert made == [False]
    assert "max_wait 2 ms, hold, pipeline" in out
    r = json.loads(out_json.read_text())
    assert r["eager"] is False and r["mode"] == "hold" and r["batcher"]["latency"]["samples"] == 40


def test_eager_is_no_flag_of_bench(mlp_engine, capsys):
    """--eager was the opt-in before eager became the default; it is gone (argparse refuses it)."""
    with pytest.raises(SystemExit) as e:
        main(["bench", str(mlp_engine), "--batcher", "--eager"])
    assert e.value.code == 2
    assert "unrecognized arguments: --eager" in capsys.readouterr().err


def test_few_requests_show_no_p99(mlp_engine, capsys):
    assert main(["bench", str(mlp_engine), "--batcher", "--concurrency", "2", "--requests", "10"]) == 0
    out = capsys.readouterr().out
    assert "(p99 needs at least 100 requests)" in out


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--concurrency", "4"], "--concurrency sets the load of --batcher; add --batcher"),
        (["--max-wait-ms", "1"], "--max-wait-ms sets the load of --batcher; add --batcher"),
        (["--hold"], "--hold sets the load of --batcher; add --batcher"),
        (["--batcher", "--max-batch", "9"], "runs at most batch 8"),
    ],
)
def test_bench_batcher_usage_errors(mlp_engine, capsys, extra, message):
    assert main(["bench", str(mlp_engine), *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert message in err[-1]
    assert not any("Traceback" in line for line in err)


def test_zero_threads_is_refused_by_the_parser(mlp_engine, capsys):
    with pytest.raises(SystemExit) as e:
        main(["bench", str(mlp_engine), "--batcher", "--concurrency", "0"])
    assert e.value.code == 2
    assert "argument --concurrency: must be at least 1, got 0" in capsys.readouterr().err
