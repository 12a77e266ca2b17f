"""Issue 15 C: every ordinary mistake a new user makes with the CLI either works or ends in a one-line
error with a non-zero exit and no traceback. One test per case, through `graphc.cli.main`."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

import graphc
import models
from graphc.cli import EXIT_USER_ERROR, UsageError, main, parse_arch


def cli(argv: list[str]) -> int:
    """main(), with argparse's own exits turned into a return code."""
    try:
        return main([str(a) for a in argv])
    except SystemExit as e:
        return int(e.code or 0)


def assert_clean_error(rc: int, err: str, *needles: str) -> None:
    assert rc == EXIT_USER_ERROR, err
    assert "Traceback" not in err
    lines = [ln for ln in err.splitlines() if ln.startswith("graphc")]
    assert len(lines) == 1, err
    assert "error:" in lines[0]
    for n in needles:
        assert n in lines[0], lines[0]


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    d = tmp_path_factory.mktemp("zoo")
    models.save(models.build("bert", size="tiny"), d / "bert.onnx")
    models.save(models.build("mlp", size="tiny"), d / "mlp.onnx")
    return d


@pytest.fixture(scope="module")
def bert_engine(zoo):
    path = zoo / "bert.engine"
    assert cli(["compile", zoo / "bert.onnx", "-o", path, "--target", "cpu", "--shapes", "batch=2,seq=8", "-q"]) == 0
    return path


@pytest.fixture(scope="module")
def mlp_engine(zoo):
    path = zoo / "mlp.engine"
    assert cli(["compile", zoo / "mlp.onnx", "-o", path, "--target", "cpu", "--shapes", "batch=3", "-q"]) == 0
    return path


def compile_cpu(zoo, out, *extra):
    return cli(["compile", zoo / "bert.onnx", "-o", out, "--target", "cpu", "-q", *extra])


# ---- --shapes ----------------------------------------------------------------------------------


@pytest.mark.parametrize("shapes", ["batch=-2,seq=8", "input_ids:2x-8,attention_mask:2x8"])
def test_negative_dim(zoo, tmp_path, capsys, shapes):
    rc = compile_cpu(zoo, tmp_path / "x.engine", "--shapes", shapes)
    assert_clean_error(rc, capsys.readouterr().err, "at least 1")
    assert not (tmp_path / "x.engine").exists()


def test_zero_batch(zoo, tmp_path, capsys):
    rc = compile_cpu(zoo, tmp_path / "x.engine", "--shapes", "batch=0,seq=8")
    assert_clean_error(rc, capsys.readouterr().err, "batch=0", "at least 1")


def test_unknown_dim_name(zoo, tmp_path, capsys):
    rc = compile_cpu(zoo, tmp_path / "x.engine", "--shapes", "batch=2,seq=8,sequence=8")
    assert_clean_error(rc, capsys.readouterr().err, "'sequence'", "batch, seq")


def test_unknown_input_name_and_input_given_a_size(zoo, tmp_path, capsys):
    rc = compile_cpu(zoo, tmp_path / "x.engine", "--shapes", "ids:2x8")
    assert_clean_error(rc, capsys.readouterr().err, "no input 'ids'", "input_ids")
    rc = compile_cpu(zoo, tmp_path / "x.engine", "--shapes", "input_ids=8")
    assert_clean_error(rc, capsys.readouterr().err, "is an input", "input_ids:NxN")


# ---- files the CLI writes ----------------------------------------------------------------------


def test_output_into_missing_folder(zoo, tmp_path, capsys):
    rc = compile_cpu(zoo, tmp_path / "no" / "x.engine", "--shapes", "batch=2,seq=8")
    assert_clean_error(rc, capsys.readouterr().err, "-o", "does not exist")


def test_report_into_missing_folder_fails_before_the_engine_is_written(zoo, tmp_path, capsys):
    eng = tmp_path / "x.engine"
    rc = compile_cpu(zoo, eng, "--shapes", "batch=2,seq=8", "--report", tmp_path / "no" / "r.json")
    assert_clean_error(rc, capsys.readouterr().err, "--report", "does not exist")
    assert not eng.exists()


def test_output_naming_the_model_never_overwrites_it(zoo, tmp_path, capsys):
    model = tmp_path / "m.onnx"
    model.write_bytes((zoo / "bert.onnx").read_bytes())
    before = model.read_bytes()
    for spelling in (model, tmp_path / "." / "m.onnx"):
        rc = cli(["compile", model, "-o", spelling, "--target", "cpu", "--shapes", "batch=2,seq=8", "-q"])
        assert_clean_error(rc, capsys.readouterr().err, "the input model")
    rc = cli(["compile", model, "-o", tmp_path / "m.engine", "--report", model, "--target", "cpu", "-q"])
    assert_clean_error(rc, capsys.readouterr().err, "--report", "the input model")
    assert model.read_bytes() == before


def test_output_is_a_folder(zoo, tmp_path, capsys):
    assert_clean_error(compile_cpu(zoo, tmp_path, "--shapes", "batch=2,seq=8"), capsys.readouterr().err, "folder")


def test_bench_json_and_inspect_memory_into_missing_folder(bert_engine, tmp_path, capsys):
    rc = cli(["bench", bert_engine, "--iterations", "1", "--json", tmp_path / "no" / "b.json"])
    assert_clean_error(rc, capsys.readouterr().err, "--json", "does not exist")
    rc = cli(["inspect", bert_engine, "--memory", tmp_path / "no" / "m.png"])
    assert_clean_error(rc, capsys.readouterr().err, "--memory", "does not exist")
    rc = cli(["run", bert_engine, "--outputs", tmp_path / "no" / "o.npz"])
    assert_clean_error(rc, capsys.readouterr().err, "--outputs", "does not exist")


# ---- flags that do not apply -------------------------------------------------------------------


@pytest.mark.parametrize("flags", [["--arch", "sm_90"], ["--tune", "fast"], ["--allow-tf32"]])
def test_cuda_flags_with_cpu_target(zoo, tmp_path, capsys, flags):
    rc = compile_cpu(zoo, tmp_path / "x.engine", "--shapes", "batch=2,seq=8", *flags)
    assert_clean_error(rc, capsys.readouterr().err, flags[0], "--target cuda")


@pytest.mark.parametrize("arch", ["90", "sm90", "compute_90", ","])
def test_arch_spelling(zoo, tmp_path, capsys, arch):
    rc = cli(["compile", zoo / "bert.onnx", "-o", tmp_path / "x.engine", "--shapes", "batch=2,seq=8", "--arch", arch])
    assert_clean_error(rc, capsys.readouterr().err, "--arch", "sm_NN")
    assert parse_arch("sm_80, sm_90a,") == ["sm_80", "sm_90a"]


@pytest.mark.parametrize("command", ["run", "bench"])
def test_device_on_a_cpu_engine(bert_engine, capsys, command):
    assert_clean_error(cli([command, bert_engine, "--device", "1"]), capsys.readouterr().err, "cpu engine")
    assert_clean_error(cli([command, bert_engine, "--device", "-1"]), capsys.readouterr().err, "--device -1")


@pytest.mark.parametrize("n", ["0", "-5", "many"])
def test_bench_iterations_must_be_positive(bert_engine, capsys, n):
    assert_clean_error(cli(["bench", bert_engine, "--iterations", n]), capsys.readouterr().err, "--iterations")


def test_int8_for_cuda_without_calibration_data_says_what_it_needs(zoo, tmp_path, capsys):
    rc = cli(["compile", zoo / "bert.onnx", "-o", tmp_path / "x.engine", "--int8", "--shapes", "batch=1,seq=8"])
    assert_clean_error(rc, capsys.readouterr().err, "--calibration-data")


def test_int8_without_calibration_data_says_what_it_needs(zoo, tmp_path, capsys):
    args = ["compile", zoo / "bert.onnx", "-o", tmp_path / "x.engine", "--precision", "int8", "--target", "cpu"]
    assert_clean_error(cli([*args, "--shapes", "batch=1,seq=8"]), capsys.readouterr().err, "--calibration-data")


def test_fp16_flag_disagreeing_with_precision(zoo, tmp_path, capsys):
    rc = cli(["compile", zoo / "bert.onnx", "-o", tmp_path / "x.engine", "--fp16", "--precision", "bf16"])
    assert_clean_error(rc, capsys.readouterr().err, "--fp16", "bf16")


# ---- inputs ------------------------------------------------------------------------------------


def test_npy_inputs(mlp_engine, bert_engine, tmp_path, capsys):
    x = np.random.default_rng(0).standard_normal((3, 64)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    # a one-input engine takes an .npy as is, and its result is the same as through an .npz
    assert cli(["run", mlp_engine, "--inputs", tmp_path / "x.npy", "--outputs", tmp_path / "a.npz"]) == 0
    np.savez(tmp_path / "x.npz", input=x)
    assert cli(["run", mlp_engine, "--loadInputs", tmp_path / "x.npz", "--outputs", tmp_path / "b.npz"]) == 0
    a, b = np.load(tmp_path / "a.npz"), np.load(tmp_path / "b.npz")
    assert a.files == b.files and all(np.array_equal(a[k], b[k]) for k in a.files)
    capsys.readouterr()
    # two inputs: an .npy alone is ambiguous; NAME:FILE.npy pairs (trtexec's form) work
    rc = cli(["run", bert_engine, "--inputs", tmp_path / "x.npy"])
    assert_clean_error(rc, capsys.readouterr().err, "2 inputs", "NAME:FILE.npy")
    np.save(tmp_path / "ids.npy", np.arange(16, dtype=np.int64).reshape(2, 8))
    np.save(tmp_path / "mask.npy", np.ones((2, 8), np.int64))
    pairs = f"input_ids:{tmp_path / 'ids.npy'},attention_mask:{tmp_path / 'mask.npy'}"
    assert cli(["run", bert_engine, "--inputs", pairs]) == 0
    rc = cli(["run", bert_engine, "--inputs", f"token_ids:{tmp_path / 'ids.npy'}"])
    assert_clean_error(rc, capsys.readouterr().err, "no input 'token_ids'")
    rc = cli(["run", bert_engine, "--inputs", tmp_path / "missing.npz"])
    assert_clean_error(rc, capsys.readouterr().err, "no such file")


@pytest.mark.parametrize("bad", [128, 5000, -129])
def test_token_ids_beyond_the_vocabulary(bert_engine, tmp_path, capsys, bad):
    ids = np.zeros((2, 8), np.int64)
    ids[1, 3] = bad
    np.savez(tmp_path / "in.npz", input_ids=ids, attention_mask=np.ones((2, 8), np.int64))
    rc = cli(["run", bert_engine, "--inputs", tmp_path / "in.npz"])
    assert_clean_error(rc, capsys.readouterr().err, "input_ids", str(bad), "[1, 3]", "Gather", "-128..127")


def test_token_ids_at_the_edges_run(bert_engine, tmp_path):
    ids = np.array([[0, 127, -128, -1, 5, 6, 7, 8]] * 2, np.int64)
    np.savez(tmp_path / "in.npz", input_ids=ids, attention_mask=np.ones((2, 8), np.int64))
    assert cli(["run", bert_engine, "--inputs", tmp_path / "in.npz"]) == 0


def test_run_without_inputs_says_what_it_draws(bert_engine, tmp_path, capsys):
    from graphc.feeds import random_inputs

    assert cli(["run", bert_engine, "--seed", "3"]) == 0
    err = capsys.readouterr().err
    assert "random inputs (seed 3)" in err
    assert re.search(r"input_ids int64\[2, 8\]: integers uniform in \[0, 128\)", err), err
    assert re.search(r"attention_mask int64\[2, 8\]: integers uniform in \[0, 2\)", err), err
    feeds, _ = random_inputs(graphc.runtime.load(bert_engine), seed=3)
    ids = feeds["input_ids"]
    assert ids.min() >= 0 and ids.max() < 128 and len(np.unique(ids)) > 2  # token ids, not only 0/1


# ---- --compare ---------------------------------------------------------------------------------


def test_compare_with_a_missing_file(bert_engine, zoo, capsys):
    rc = cli(["run", bert_engine, "--compare", zoo / "nope.onnx"])
    assert_clean_error(rc, capsys.readouterr().err, "--compare", "no such file")


def test_compare_with_another_model(bert_engine, zoo, capsys):
    rc = cli(["run", bert_engine, "--compare", zoo / "mlp.onnx"])
    assert_clean_error(rc, capsys.readouterr().err, "--compare", "['input']", "the model the engine was built from")


def test_compare_with_another_model_of_the_same_inputs(bert_engine, tmp_path, capsys):
    other = tmp_path / "other.onnx"
    models.save(models.build("bert", size="tiny", seed=5), other)  # same names, other weights
    assert cli(["run", bert_engine, "--compare", other]) == 1
    out = capsys.readouterr().out
    assert "MISMATCH" in out and "note: the engine was built from" in out and "bert.onnx" in out


def test_compare_with_a_file_that_is_not_onnx(bert_engine, zoo, tmp_path, capsys):
    (tmp_path / "junk.onnx").write_bytes(b"not a model")
    rc = cli(["run", bert_engine, "--compare", tmp_path / "junk.onnx"])
    assert_clean_error(rc, capsys.readouterr().err, "--compare", "cannot load")


def test_compare_atol_beside_rtol(bert_engine, zoo, capsys):
    # fp32 agrees with ONNX Runtime to about 1e-6 here: atol 1e-3 alone passes, zero tolerance fails
    assert cli(["run", bert_engine, "--compare", zoo / "bert.onnx", "--rtol", "0", "--atol", "1e-3"]) == 0
    assert "OK" in capsys.readouterr().out
    assert cli(["run", bert_engine, "--compare", zoo / "bert.onnx", "--rtol", "0", "--atol", "0"]) == 1
    assert "MISMATCH" in capsys.readouterr().out
    assert_clean_error(cli(["run", bert_engine, "--atol", "-1"]), capsys.readouterr().err, "--atol")


# ---- what the CLI prints -----------------------------------------------------------------------


def test_cpu_bench_times_the_count_it_prints(bert_engine, tmp_path, capsys):
    assert cli(["bench", bert_engine, "--iterations", "7", "--warmup", "1", "--json", tmp_path / "b.json"]) == 0
    out = capsys.readouterr().out
    assert "(7 timed runs, 1 warm-up)" in out
    assert "p99" not in out and "p90" not in out  # 7 samples make no p90 or p99
    r = json.loads((tmp_path / "b.json").read_text())
    assert r["latency"]["samples"] == 7 and r["iterations"] == 7


def test_benchmark_runs_exactly_warmup_plus_iterations(bert_engine):
    from graphc.bench import benchmark

    engine = graphc.runtime.load(bert_engine)
    calls = []
    real = engine.run
    engine.run = lambda feeds, **kw: calls.append(1) or real(feeds, **kw)
    from graphc.feeds import random_inputs

    feeds, _ = random_inputs(engine)
    r = benchmark(engine, feeds, iterations=5, warmup=3)
    assert len(calls) == 8 and r["latency"]["samples"] == 5 and r["iterations"] == 5


def test_no_tick_for_a_failed_load(tmp_path, capsys):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x08\x07garbage that is not a protobuf of a model")
    rc = cli(["compile", bad, "-o", tmp_path / "x.engine", "--target", "cpu"])
    err = capsys.readouterr().err
    assert rc == EXIT_USER_ERROR and "Traceback" not in err
    assert "✓ load" not in err and re.search(r"(✗|FAILED) load", err), err


def test_compile_and_inspect_count_kernels_alike(bert_engine, zoo, tmp_path, capsys):
    eng = tmp_path / "b.engine"
    assert cli(["compile", zoo / "bert.onnx", "-o", eng, "--target", "cpu", "--shapes", "batch=2,seq=8"]) == 0
    cap = capsys.readouterr()
    wrote = re.search(r"; (\d+ steps \(\d+ views\), .*)\)$", cap.out.strip()).group(1)
    assert cli(["inspect", eng]) == 0
    assert f"kernels: {wrote}" in capsys.readouterr().out
    assert "nodes removed" not in cap.err  # node changes are signed changes: -8 nodes
    assert re.search(r"fuse_gelu .* -\d+ nodes", cap.err)
    # every time in ms, every size through one formatter
    for line in cap.err.splitlines():
        if line.strip().startswith(("✓", "✗")):
            assert line.rstrip().endswith(" ms"), line
    assert re.search(r"memory: arena [\d.]+ KiB", cap.err)


def test_compile_and_inspect_count_cuda_kernels_alike(zoo, tmp_path, capsys):
    pytest.importorskip("cuda.bindings.nvrtc")
    eng = tmp_path / "m.engine"
    assert cli(["compile", zoo / "mlp.onnx", "-o", eng, "--shapes", "batch=3", "--arch", "sm_80", "-q"]) == 0
    wrote = re.search(r"; (\d+ steps .*)\)$", capsys.readouterr().out.strip()).group(1)
    assert "launches of" in wrote and "distinct kernels" in wrote
    assert cli(["inspect", eng]) == 0
    assert f"kernels: {wrote}" in capsys.readouterr().out


def test_report_json_says_what_it_is_about(zoo, tmp_path):
    report = tmp_path / "r.json"
    assert compile_cpu(zoo, tmp_path / "x.engine", "--shapes", "batch=2,seq=8", "--report", report) == 0
    r = json.loads(report.read_text())
    assert r["graphc_version"] == graphc.__version__
    assert r["model"] == str(zoo / "bert.onnx")
    assert r["input_shapes"] == {"input_ids": [2, 8], "attention_mask": [2, 8]}


def test_repr_of_an_engine_is_one_short_line(bert_engine):
    text = repr(graphc.runtime.load(bert_engine))
    assert "\n" not in text and len(text) < 300 and "input_ids" in text


@pytest.mark.parametrize("where", ["before", "after"])
def test_debug_before_or_after_the_command(tmp_path, where):
    args = ["compile", tmp_path / "missing.onnx", "-o", tmp_path / "x.engine"]
    args = ["--debug", *args] if where == "before" else [*args, "--debug"]
    with pytest.raises(UsageError):  # --debug: the exception itself, with its traceback
        main([str(a) for a in args])


def test_trtexec_names(zoo, tmp_path, capsys):
    eng = tmp_path / "x.engine"
    rc = cli(["compile", zoo / "mlp.onnx", "--saveEngine", eng, "--target", "cpu", "--shapes", "batch=3", "--fp16"])
    assert rc == 0 and eng.exists()
    assert graphc.runtime.load(eng).build_info["precision"] == "fp16"


def test_no_message_suggests_installing_graphc_from_the_index():
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    hits = [
        str(p.relative_to(root))
        for folder in ("graphc", "passes", "codegen", "runtime", "docs", "tools")
        for p in (root / folder).rglob("*")
        if p.suffix in (".py", ".md") and re.search(r"pip install ['\"]?graphc\[", p.read_text())
    ]
    assert not hits, f"graphc is not on the package index; these say pip install graphc[...]: {hits}"


def test_index_range_through_casts_and_views_takes_the_tightest_table(tmp_path, capsys):
    from onnx import TensorProto, helper, numpy_helper

    from graphc.feeds import index_ranges

    rng = np.random.default_rng(0)
    big = numpy_helper.from_array(rng.standard_normal((10, 4)).astype(np.float32), "big")
    small = numpy_helper.from_array(rng.standard_normal((7, 4)).astype(np.float32), "small")
    shape = numpy_helper.from_array(np.array([6], np.int64), "flat")
    nodes = [
        helper.make_node("Cast", ["ids"], ["ids32"], to=TensorProto.INT32),
        helper.make_node("Gather", ["big", "ids32"], ["a"]),
        helper.make_node("Reshape", ["ids", "flat"], ["ids_flat"]),
        helper.make_node("Gather", ["small", "ids_flat"], ["b"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [2, 3])],
        [
            helper.make_tensor_value_info("a", TensorProto.FLOAT, [2, 3, 4]),
            helper.make_tensor_value_info("b", TensorProto.FLOAT, [6, 4]),
        ],
        [big, small, shape],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path / "g.onnx"
    path.write_bytes(model.SerializeToString())
    eng = tmp_path / "g.engine"
    assert cli(["compile", path, "-o", eng, "--target", "cpu", "-q"]) == 0
    r = index_ranges(graphc.runtime.load(eng).plan)["ids"]
    assert r.size == 7
    np.save(tmp_path / "ok.npy", np.array([[0, 6, -7], [1, 2, 3]], np.int64))
    assert cli(["run", eng, "--inputs", tmp_path / "ok.npy"]) == 0
    np.save(tmp_path / "bad.npy", np.array([[0, 7, 0], [1, 2, 3]], np.int64))  # in the big table, not the small
    assert_clean_error(cli(["run", eng, "--inputs", tmp_path / "bad.npy"]), capsys.readouterr().err, "-7..6")


def test_as_a_process_the_exit_code_and_one_line(bert_engine, tmp_path):
    import subprocess
    import sys

    for args in (["bench", bert_engine, "--iterations", "-5"], ["run", bert_engine, "--device", "1"]):
        out = subprocess.run(
            [sys.executable, "-m", "graphc", *map(str, args)], capture_output=True, text=True, timeout=120
        )
        assert out.returncode == EXIT_USER_ERROR, out.stderr
        assert "Traceback" not in out.stderr
        assert len([ln for ln in out.stderr.splitlines() if ln.startswith("graphc")]) == 1, out.stderr
