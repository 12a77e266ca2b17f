"""The command line with optimization profiles: compile --min/--opt/--max-shapes, inspect, run,
bench --shapes, and their one-line errors (exit 2)."""

from __future__ import annotations

import json
import zipfile

import numpy as np
import pytest

import models
from graphc.cli import main


@pytest.fixture(scope="module")
def cnn(tmp_path_factory):
    d = tmp_path_factory.mktemp("clip")
    onnx_path = d / "resnet.onnx"
    models.save(models.build("resnet", size="tiny"), onnx_path)
    engine = d / "r.engine"
    args = ["compile", str(onnx_path), "-o", str(engine), "--target", "cpu", "-q"]
    args += ["--min-shapes", "pixel_values:1x3x32x32", "--opt-shapes", "pixel_values:2x3x32x32"]
    args += ["--max-shapes", "pixel_values:4x3x32x32"]
    assert main(args) == 0
    return onnx_path, engine


def test_compile_writes_the_profile(cnn):
    _onnx, engine = cnn
    with zipfile.ZipFile(engine) as z:
        m = json.loads(z.read("manifest.json"))
    (p,) = m["profiles"]
    assert p["min"] == {"pixel_values": [1, 3, 32, 32]} and p["max"] == {"pixel_values": [4, 3, 32, 32]}
    assert sorted(b["sizes"]["batch"] for b in p["buckets"]) == [1, 2, 3, 4]


def test_inspect_shows_the_profiles(cnn, capsys):
    _onnx, engine = cnn
    assert main(["inspect", str(engine)]) == 0
    out = capsys.readouterr().out
    assert "profile 0: pixel_values min 1x3x32x32 opt 2x3x32x32 max 4x3x32x32" in out
    assert "dim 'batch' 1..4 (opt 2) on pixel_values[0]: padded to a bucket" in out
    assert "4 bucket(s): batch=1; batch=2 [engine plan]; batch=3; batch=4" in out
    assert "profile 0 dim 'batch': rows ladder (at most 1.25x the rows: target cpu" in out  # how they were chosen


def test_run_compare_at_a_shape_in_range(cnn, tmp_path, capsys):
    onnx_path, engine = cnn
    x = np.random.default_rng(0).standard_normal((3, 3, 32, 32)).astype(np.float32)
    np.savez(tmp_path / "in.npz", pixel_values=x)
    args = ["run", str(engine), "--inputs", str(tmp_path / "in.npz"), "--compare", str(onnx_path)]
    assert main([*args, "--outputs", str(tmp_path / "o.npz")]) == 0
    assert "OK" in capsys.readouterr().out
    assert np.load(tmp_path / "o.npz")["logits"].shape == (3, 10)


def test_bench_times_a_shape_in_range(cnn, tmp_path, capsys):
    _onnx, engine = cnn
    js = tmp_path / "b.json"
    assert (
        main(["bench", str(engine), "--shapes", "pixel_values:3x3x32x32", "--iterations", "2", "--json", str(js)]) == 0
    )
    out = capsys.readouterr().out
    assert "(batch 3)" in out
    r = json.loads(js.read_text())
    assert r["shapes"] == {"pixel_values": [3, 3, 32, 32]} and r["batch"] == 3


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--shapes", "pixel_values:5x3x32x32"], "input 'pixel_values' dim 0 is 5, outside the profile's range 1..4"),
        (["--shapes", "nope:1x2"], "--shapes: the engine has no input 'nope'"),
        (["--shapes", "batch=3"], "give input shapes"),
        (["--shapes", "pixel_values:3x3x32x32", "--batcher"], "--shapes and --batcher"),
    ],
)
def test_bench_shape_errors(cnn, capsys, extra, message):
    _onnx, engine = cnn
    assert main(["bench", str(engine), "--iterations", "1", *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_run_outside_the_profile_is_one_line(cnn, tmp_path, capsys):
    _onnx, engine = cnn
    np.savez(tmp_path / "in.npz", pixel_values=np.zeros((6, 3, 32, 32), np.float32))
    assert main(["run", str(engine), "--inputs", str(tmp_path / "in.npz")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == "graphc: error: input 'pixel_values' dim 0 is 6, outside the profile's range 1..4"


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--min-shapes", "pixel_values:1x3x32x32"], "needs --min-shapes, --opt-shapes and --max-shapes"),
        (
            ["--min-shapes", "batch=1", "--opt-shapes", "batch=2", "--max-shapes", "batch=4"],
            "--min-shapes: 'batch=1': give input shapes",
        ),
        (
            ["--min-shapes", "pixel_values:1xq", "--opt-shapes", "x:1", "--max-shapes", "x:1"],
            "--min-shapes: 'pixel_values:1xq': dims must be integers",
        ),
        (
            ["--min-shapes", "pixel_values:2x3x32x32", "--opt-shapes", "pixel_values:1x3x32x32"]
            + ["--max-shapes", "pixel_values:4x3x32x32"],
            "needs min <= opt <= max, got 2, 1, 4",
        ),
        (
            ["--min-shapes", "x:1x3x32x32", "--opt-shapes", "x:2x3x32x32", "--max-shapes", "x:4x3x32x32"],
            "the model has no input 'x'",
        ),
    ],
)
def test_compile_profile_flag_errors(cnn, tmp_path, capsys, flags, message):
    onnx_path, _engine = cnn
    rc = main(["compile", str(onnx_path), "-o", str(tmp_path / "e.engine"), "--target", "cpu", "-q", *flags])
    assert rc == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "e.engine").exists()
