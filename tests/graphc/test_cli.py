"""The command line end to end on the CPU target."""

from __future__ import annotations

import numpy as np
import pytest

import models
from graphc.cli import main, parse_shapes


@pytest.fixture(scope="module")
def bert_onnx(tmp_path_factory):
    path = tmp_path_factory.mktemp("cli") / "bert.onnx"
    models.save(models.build("bert", size="tiny"), path)
    return path


def test_shapes_parsing():
    assert parse_shapes("input:1x3x224x224,mask:1x128") == {"input": (1, 3, 224, 224), "mask": (1, 128)}
    assert parse_shapes("batch=8, seq=16") == {"batch": 8, "seq": 16}


def test_compile_run_compare_bench_inspect(bert_onnx, tmp_path, capsys):
    eng = tmp_path / "b.engine"
    assert (
        main(
            [
                "compile",
                str(bert_onnx),
                "-o",
                str(eng),
                "--target",
                "cpu",
                "--shapes",
                "batch=2,seq=8",
                "--report",
                str(tmp_path / "r.json"),
                "--dump-ir",
                str(tmp_path / "ir"),
                "-q",
            ]
        )
        == 0
    )
    assert eng.exists() and (tmp_path / "r.json").exists() and any((tmp_path / "ir").iterdir())
    feeds = models.sample_inputs("bert", models.build("bert", size="tiny"), batch=2, seq=8)
    np.savez(tmp_path / "in.npz", **feeds)
    assert (
        main(
            [
                "run",
                str(eng),
                "--inputs",
                str(tmp_path / "in.npz"),
                "--outputs",
                str(tmp_path / "out.npz"),
                "--compare",
                str(bert_onnx),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "OK" in out and "MISMATCH" not in out
    assert np.load(tmp_path / "out.npz")["last_hidden_state"].shape == (2, 8, 32)
    assert main(["bench", str(eng), "--iterations", "20", "--warmup", "2"]) == 0
    assert "median" in capsys.readouterr().out
    assert main(["inspect", str(eng)]) == 0
    assert "memory: arena" in capsys.readouterr().out


def test_user_errors_are_one_line_and_exit_2(tmp_path, capsys):
    assert main(["compile", str(tmp_path / "missing.onnx"), "-o", str(tmp_path / "x.engine")]) == 2
    err = capsys.readouterr().err
    assert "graphc: error:" in err and "Traceback" not in err
    bad = tmp_path / "bad.engine"
    bad.write_bytes(b"not a zip")
    assert main(["run", str(bad)]) == 2
    assert "not a graphc engine" in capsys.readouterr().err
    assert main(["compile", str(tmp_path / "m.onnx"), "-o", "x", "--shapes", "input:1xq"]) == 2


def test_wrong_input_shape_is_a_clear_error(bert_onnx, tmp_path, capsys):
    eng = tmp_path / "b.engine"
    assert main(["compile", str(bert_onnx), "-o", str(eng), "--target", "cpu", "--shapes", "batch=2,seq=8", "-q"]) == 0
    np.savez(tmp_path / "in.npz", input_ids=np.zeros((1, 8), np.int64), attention_mask=np.ones((1, 8), np.int64))
    assert main(["run", str(eng), "--inputs", str(tmp_path / "in.npz")]) == 2
    assert "shape" in capsys.readouterr().err


def test_check_lists_unsupported(bert_onnx, capsys):
    # Symbolic input dims: the compile would fail without --shapes, so check does too.
    assert main(["check", str(bert_onnx)]) == 1
    assert "--shapes" in capsys.readouterr().out
    assert main(["check", str(bert_onnx), "--shapes", "batch=2,seq=8"]) == 0
    assert "every op compiles for cpu" in capsys.readouterr().out


def test_version_and_help(capsys):
    with pytest.raises(SystemExit):
        main(["--version"])
    assert "graphc" in capsys.readouterr().out
    assert main([]) == 0
