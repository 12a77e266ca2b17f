"""io_precision="fp16" (TensorRT's --inputIOFormats/--outputIOFormats=fp16, ONNX Runtime's float16
converter with keep_io_types=False): an fp16 engine declares its float inputs and outputs as fp16,
with no Cast at the edges; the default keeps the model's types. The CPU target runs fp16 engines
(numpy references in fp16), so the numerics are checked here; the CUDA plan is compiled (NVRTC, no
GPU needed) and checked for its IO types and the absence of edge Casts."""

from __future__ import annotations

import json

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import graphc
import models
from graphc.errors import CompileError
from graphc.ir import DType, verify_graph
from graphc.passes.precision import convert_precision
from graphc.runtime.errors import EngineInputError


def _mlp():
    m = models.build("mlp", size="tiny")
    feeds = models.sample_inputs("mlp", m)
    return m, feeds, {k: v.shape for k, v in feeds.items()}


def _casts(plan) -> list[str]:
    """Steps that cast at the engine's edges: a Cast kernel, or a Cast in a fused step's epilogue,
    that reads a float input of the engine or writes one of its outputs (a model's own casts in
    between, such as BERT's int64 mask to fp16, are no edge)."""
    floats = {n for n in plan.inputs if plan.tensors[n].dtype.startswith(("float", "bfloat"))}
    return [
        s.name
        for s in plan.steps
        if (s.op == "Cast" or '"Cast"' in json.dumps(s.attrs))
        and (set(s.inputs) & floats or set(s.outputs) & set(plan.outputs))
    ]


def _small_graph():
    """y = relu(x @ w + b) (float input and output), plus an int64 input passed through."""
    rng = np.random.default_rng(0)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 8])
    ids = helper.make_tensor_value_info("ids", TensorProto.INT64, [3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 4])
    ids_out = helper.make_tensor_value_info("ids_out", TensorProto.INT64, [3])
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["xw"]),
        helper.make_node("Add", ["xw", "b"], ["pre"]),
        helper.make_node("Relu", ["pre"], ["y"]),
        helper.make_node("Identity", ["ids"], ["ids_out"]),
    ]
    inits = [
        numpy_helper.from_array(rng.standard_normal((8, 4)).astype(np.float32), "w"),
        numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "b"),
    ]
    g = helper.make_graph(nodes, "g", [x, ids], [y, ids_out], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_the_pass_declares_fp16_io_and_drops_the_edge_casts():
    g = graphc.load_onnx(_small_graph())
    kept = convert_precision(g, "fp16")
    io = convert_precision(g, "fp16", "fp16")
    verify_graph(io)
    assert [v.type.dtype for v in kept.inputs] == [DType.float32, DType.int64]
    assert [v.type.dtype for v in io.inputs] == [DType.float16, DType.int64]  # ints are left alone
    assert [v.type.dtype for v in io.outputs] == [DType.float16, DType.int64]
    assert sum(n.op == "Cast" for n in kept.nodes) == 2 and not any(n.op == "Cast" for n in io.nodes)
    x = np.random.default_rng(1).standard_normal((3, 8)).astype(np.float32)
    ids = np.arange(3, dtype=np.int64)
    ref = graphc.interpret(g, {"x": x, "ids": ids})
    got = graphc.interpret(io, {"x": x.astype(np.float16), "ids": ids})
    assert got["y"].dtype == np.float16 and np.array_equal(got["ids_out"], ids)
    np.testing.assert_allclose(got["y"].astype(np.float32), ref["y"], rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize(
    "precision, io, message",
    [
        ("fp32", "fp16", "io_precision fp16 needs precision fp16 (got fp32)"),
        ("bf16", "fp16", "io_precision fp16 needs precision fp16 (got bf16)"),
        ("fp16", "fp8", "io_precision must be one of"),
    ],
)
def test_io_precision_must_be_the_engines_own(precision, io, message):
    with pytest.raises(CompileError, match=message.replace("(", r"\(").replace(")", r"\)")):
        graphc.compile(_small_graph(), target="cpu", precision=precision, io_precision=io)


def test_cpu_fp16_io_engine_matches_numpy_and_refuses_fp32_feeds():
    m, feeds, shapes = _mlp()
    eng = graphc.compile(m, target="cpu", precision="fp16", io_precision="fp16", shapes=shapes)
    assert [(s.name, s.dtype) for s in eng.inputs] == [("input", "float16")]
    assert [s.dtype for s in eng.outputs] == ["float16"]
    assert not _casts(eng.plan)
    ref = graphc.interpret(graphc.bind_shapes(graphc.load_onnx(m), shapes), feeds)
    got = eng.run({k: v.astype(np.float16) for k, v in feeds.items()})
    for k, r in ref.items():
        assert got[k].dtype == np.float16
        np.testing.assert_allclose(got[k].astype(np.float32), r, rtol=2e-2, atol=2e-2)
    with pytest.raises(EngineInputError) as e:
        eng.run(feeds)  # fp32, as the model declares: the engine takes fp16
    assert str(e.value) == "input 'input' has dtype float32, the engine takes float16"
    default = graphc.compile(m, target="cpu", precision="fp16", shapes=shapes)
    assert [s.dtype for s in default.inputs] == ["float32"] and [s.dtype for s in default.outputs] == ["float32"]
    assert _casts(default.plan)  # the default keeps the edge casts (so the check above can fail)


@pytest.mark.parametrize("name", ["mlp", "bert"])
def test_cuda_fp16_io_plan_has_no_edge_casts(name):
    m = models.build(name, size="tiny")
    feeds = models.sample_inputs(name, m)
    shapes = {k: v.shape for k, v in feeds.items()}
    io = graphc.compile(m, target="cuda", precision="fp16", io_precision="fp16", shapes=shapes, arch=["sm_90"])
    kept = graphc.compile(m, target="cuda", precision="fp16", shapes=shapes, arch=["sm_90"])
    for s_io, s_kept in zip(io.inputs + io.outputs, kept.inputs + kept.outputs, strict=True):
        want = "float16" if s_kept.dtype == "float32" else s_kept.dtype
        assert s_io.dtype == want and s_io.shape == s_kept.shape, (s_io, s_kept)
    assert any(s.dtype == "float16" for s in io.outputs)
    assert not _casts(io.plan) and _casts(kept.plan)
    out = io.plan.tensors[io.plan.outputs[0]]
    assert out.dtype == "float16" and out.nbytes == 2 * int(np.prod(out.shape))


def test_cli_compile_io_precision_and_inspect(tmp_path, capsys):
    from graphc.cli import main

    m, _feeds, _shapes = _mlp()
    src = tmp_path / "mlp.onnx"
    models.save(m, src)
    eng = tmp_path / "mlp.engine"
    args = ["compile", str(src), "-o", str(eng), "--shapes", "batch=2", "--target", "cuda", "--arch", "sm_90"]
    args += ["--precision", "fp16"]
    assert main([*args, "--io-precision", "fp16", "-q"]) == 0
    capsys.readouterr()
    assert main(["inspect", str(eng)]) == 0
    text = capsys.readouterr().out
    assert "inputs:  input float16[" in text and "logits float16[" in text, text
    assert main(["compile", str(src), "-o", str(eng), "--shapes", "batch=2", "--io-precision", "fp16", "-q"]) != 0
    assert "io_precision fp16 needs precision fp16" in capsys.readouterr().err


def test_bench_torch_io_precision_flag_applies_to_its_own_precision_rows():
    import sys
    from pathlib import Path
    from types import SimpleNamespace

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
    import bench_torch as B

    assert B.parse(["--dry-run"]).io_precision == "model"  # off by default
    a = B.parse(["--io-precision", "fp16", "--precision", "fp16,bf16", "--dry-run"])
    bench = SimpleNamespace(args=a)
    assert B.Bench.io_precision(bench, "fp16") == "fp16" and B.Bench.io_precision(bench, "bf16") == "model"


def test_cli_run_compare_casts_fp16_feeds_to_the_models_input_types(tmp_path, capsys):
    """`graphc run --compare` of an fp16-IO engine: ONNX Runtime takes the model's fp32 inputs, so
    the engine's fp16 feeds reach it cast back (the same values), and the outputs compare."""
    from graphc.cli import main

    m, _feeds, _shapes = _mlp()
    src = tmp_path / "mlp.onnx"
    models.save(m, src)
    eng = tmp_path / "mlp.engine"
    args = ["compile", str(src), "-o", str(eng), "--shapes", "batch=2", "--target", "cpu", "--precision", "fp16"]
    assert main([*args, "--io-precision", "fp16", "-q"]) == 0
    capsys.readouterr()
    assert main(["run", str(eng), "--compare", str(src)]) == 0
    out = capsys.readouterr().out
    assert "compared with ONNX Runtime" in out and "float16" in out, out
