"""Accuracy-targeted mixed precision (graphc/accuracy.py): the spec, the metrics, the search on
the tiny zoo models (the chosen point measured again on the engine against ONNX Runtime), the
one-layer runs that reuse the float graph's values, and the errors and the CLI."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import onnxruntime as ort
import pytest

import graphc
import models
from graphc.accuracy import _float_values, _run_changed, compare, parse_accuracy
from graphc.cli import main as cli
from graphc.errors import CompileError
from graphc.interpreter import interpret
from graphc.ir.shapes import bind_shapes
from graphc.passes.manager import OptimizeOptions, optimize
from graphc.passes.quantize_int8 import layer_names, quantize_int8
from graphc.passes.target import Target


@pytest.fixture(scope="module")
def resnet():
    m = models.build("resnet", size="tiny")
    samples = [models.sample_inputs("resnet", m, seed=i) for i in range(8)]
    return m, samples, {k: v.shape for k, v in samples[0].items()}


def _ort_metric(spec: str, engine, model, feeds) -> float:
    t = parse_accuracy(spec)
    sess = ort.InferenceSession(model.SerializeToString())
    return t.worst([compare(t, list(engine.run(f).values()), sess.run(None, f)) for f in feeds])


def test_parse_accuracy_and_its_errors():
    t = parse_accuracy("cosine:0.999")
    assert (t.metric, t.bound) == ("cosine", 0.999) and t.holds(0.9995) and not t.holds(0.998)
    r = parse_accuracy(" MAX_REL:1e-2 ")
    assert (r.metric, r.bound) == ("max-rel", 0.01) and r.holds(0.005) and not r.holds(0.02)
    assert not t.holds(float("nan")) and not r.holds(float("nan"))
    for bad, why in [
        ("cosine", "expected cosine:B"),
        ("snr:20", "expected cosine:B"),
        ("cosine:abc", "not a number"),
        ("cosine:1.5", "in \\(0, 1\\]"),
        ("max-rel:0", "positive finite"),
        ("max-rel:inf", "positive finite"),
    ]:
        with pytest.raises(CompileError, match=why) as e:
            parse_accuracy(bad)
        assert "\n" not in str(e.value)


def test_metrics_against_numpy():
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((2, 50)), rng.standard_normal((2, 50))
    cos = parse_accuracy("cosine:0.9")
    want = float(a.ravel() @ b.ravel() / (np.linalg.norm(a) * np.linalg.norm(b)))
    assert compare(cos, [a], [b]) == pytest.approx(want, rel=1e-12)
    # the worst output counts
    assert compare(cos, [a, b], [a, b * -1]) == pytest.approx(-1.0)
    rel = parse_accuracy("max-rel:1e-2")
    assert compare(rel, [a], [b]) == pytest.approx(np.max(np.abs(a - b)) / np.max(np.abs(b)))
    assert np.isnan(compare(cos, [np.array([np.nan, 1.0])], [np.array([1.0, 1.0])]))
    assert compare(rel, [np.zeros(3)], [np.zeros(3)]) == 0.0


def test_search_keeps_the_fewest_sensitive_layers(resnet):
    m, samples, shapes = resnet
    lines: list[str] = []
    spec = "cosine:0.99999"
    e = graphc.compile(
        m, target="cpu", precision="int8", calibration_data=samples, accuracy=spec, accuracy_progress=lines.append,
        shapes=shapes, verify=True,
    )  # fmt: skip
    a = e.report["quantization"]["accuracy"]
    n = a["layers"]
    assert n == 18 and a["target"] == spec and a["validation_samples"] == 8
    ranked = [s["layer"] for s in a["sensitivity"]]
    values = [s["value"] for s in a["sensitivity"]]
    assert sorted(ranked) == sorted(set(ranked)) and len(ranked) == n
    assert values == sorted(values)  # most sensitive (lowest cosine alone in int8) first
    kept = [k["layer"] for k in a["kept"]]
    assert 0 < len(kept) < n and kept == ranked[: len(kept)]
    pts = {p["kept"]: p for p in a["points"]}
    assert not pts[0]["holds"] and pts[n]["holds"] and pts[len(kept)]["holds"]
    assert not pts[len(kept) - 1]["holds"]  # bisection: one layer fewer was measured and missed
    assert len(a["points"]) <= 2 + int(np.ceil(np.log2(n)))  # not one point per layer
    assert sum(ln.startswith("accuracy: point ") for ln in lines) == len(a["points"])
    # The engine holds what the search measured, against ONNX Runtime's fp32 run, and has
    # the kept layers in float.
    assert sum(e.report["quantization"]["integer_ops"].values()) == n - len(kept)
    got = _ort_metric(spec, e, m, samples)
    assert got >= 0.99999 and abs(got - a["value"]) < 1e-7


def test_a_target_int8_meets_needs_no_ranking(resnet):
    m, samples, shapes = resnet
    e = graphc.compile(
        m, target="cpu", precision="int8", calibration_data=samples, accuracy="cosine:0.99", shapes=shapes
    )
    a = e.report["quantization"]["accuracy"]
    assert a["kept"] == [] and len(a["points"]) == 1 and a["points"][0]["holds"] and "sensitivity" not in a
    assert sum(e.report["quantization"]["integer_ops"].values()) == 18


def test_max_rel_on_a_transformer_with_separate_validation_data():
    m = models.build("bert", size="tiny")
    calib = [models.sample_inputs("bert", m, seed=i) for i in range(4)]
    val = [models.sample_inputs("bert", m, seed=100 + i) for i in range(3)]
    spec = "max-rel:4e-3"
    e = graphc.compile(
        m, target="cpu", precision="int8", calibration_data=calib, validation_data=val, accuracy=spec,
        shapes={k: v.shape for k, v in calib[0].items()},
    )  # fmt: skip
    a = e.report["quantization"]["accuracy"]
    assert a["validation_samples"] == 3 and a["metric"] == "max-rel"
    assert not a["points"][0]["holds"], a["points"][0]  # the bound is tighter than all-int8 (else this tests nothing)
    got = _ort_metric(spec, e, m, val)
    assert got <= 4e-3 and abs(got - a["value"]) < 1e-6


def test_one_layer_runs_equal_a_full_run(resnet):
    """The sensitivity runs recompute only what the int8 layer changes: the same numbers as
    interpreting the whole one-layer graph."""
    m, samples, shapes = resnet
    captured = []
    target = Target("cpu", "int8", calibrator=lambda g, names: captured.append(g) or {n: 3.0 for n in names})
    optimize(bind_shapes(graphc.load_onnx(m), shapes), OptimizeOptions(target=target))
    fg = captured[0]
    names = layer_names(fg)
    base = _float_values(fg, samples[0])
    base_nodes = {id(n) for n in fg.nodes}
    for layer in (names[0], names[len(names) // 2], names[-1]):
        g = quantize_int8(fg, dataclasses.replace(target, keep_float=frozenset(names) - {layer}))
        assert sum(n.op == "ConvInteger" or n.op == "MatMulInteger" for n in g.nodes) == 1
        full = interpret(g, samples[0])
        part = _run_changed(g, base_nodes, base)
        for name, y in zip(g.output_names, part, strict=True):
            assert np.array_equal(full[name], y), layer


def test_unreachable_and_missing_data_are_one_line_errors(resnet, tmp_path):
    m, samples, shapes = resnet
    with pytest.raises(CompileError, match="not reachable: even with every calibrated layer in float") as e:
        graphc.compile(m, target="cpu", precision="int8", calibration_data=samples[:2], accuracy="max-rel:1e-12",
                       shapes=shapes)  # fmt: skip
    assert "\n" not in str(e.value)
    with pytest.raises(CompileError, match="only with precision int8"):
        graphc.compile(m, target="cpu", accuracy="cosine:0.99", shapes=shapes)
    with pytest.raises(CompileError, match="validation_data: only with accuracy"):
        graphc.compile(m, target="cpu", precision="int8", calibration_data=samples, validation_data=samples)
    # a calibration cache alone gives ranges, but nothing to measure on
    cache = tmp_path / "c.json"
    graphc.compile(m, target="cpu", precision="int8", calibration_data=samples[:2], calibration_cache=cache,
                   shapes=shapes)  # fmt: skip
    with pytest.raises(CompileError, match="needs data to measure on"):
        graphc.compile(m, target="cpu", precision="int8", calibration_cache=cache, accuracy="cosine:0.99",
                       shapes=shapes)  # fmt: skip


def test_cli_accuracy(resnet, tmp_path, capsys):
    m, samples, shapes = resnet
    models.save(m, tmp_path / "r.onnx")
    np.savez(tmp_path / "calib.npz", **{k: np.stack([s[k] for s in samples]) for k in samples[0]})
    np.savez(tmp_path / "val.npz", **{k: np.stack([s[k] for s in samples[:3]]) for k in samples[0]})
    name, shape = next(iter(shapes)), "x".join(map(str, next(iter(shapes.values()))))
    base = ["compile", str(tmp_path / "r.onnx"), "-o", str(tmp_path / "r.engine"), "--target", "cpu", "--int8",
            "--shapes", f"{name}:{shape}", "--calibration-data", str(tmp_path / "calib.npz")]  # fmt: skip
    rc = cli([*base, "--accuracy", "cosine:0.99999", "--validation-data", str(tmp_path / "val.npz"),
              "--report", str(tmp_path / "r.json")])  # fmt: skip
    err = capsys.readouterr().err
    assert rc == 0, err
    a = json.loads((tmp_path / "r.json").read_text())["quantization"]["accuracy"]
    assert a["validation_samples"] == 3 and a["kept"]
    assert err.count("accuracy: point ") == len(a["points"])
    assert f"with {len(a['kept'])} of 18 layers kept float" in err and f"kept float: {a['kept'][0]['layer']}" in err
    for args, why in [
        (["--accuracy", "cosine=0.9"], "expected cosine:B"),
        (["--accuracy", "cosine:0.99", "--validation-data", str(tmp_path / "nope.npz")], "no such file"),
        (["--validation-data", str(tmp_path / "val.npz")], "only with --accuracy"),
    ]:
        assert cli([*base, *args]) != 0
        out = capsys.readouterr().err.strip().splitlines()
        assert len(out) >= 1 and why in out[-1] and "Traceback" not in "".join(out), out


def _mlp(rng: np.random.Generator):
    """x -> MatMul+bias -> Relu -> MatMul+bias."""
    from onnx import TensorProto, helper, numpy_helper

    w1 = rng.standard_normal((64, 64)).astype(np.float32) / 8
    w2 = rng.standard_normal((64, 32)).astype(np.float32) / 8
    inits = [numpy_helper.from_array(a, n) for n, a in [("w1", w1), ("w2", w2), ("b1", np.zeros(64, np.float32)),
                                                         ("b2", np.zeros(32, np.float32))]]  # fmt: skip
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["t"], name="fc1"),
        helper.make_node("Add", ["t", "b1"], ["u"]),
        helper.make_node("Relu", ["u"], ["v"]),
        helper.make_node("MatMul", ["v", "w2"], ["z"], name="fc2"),
        helper.make_node("Add", ["z", "b2"], ["y"]),
    ]
    g = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [16, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [16, 32])],
        inits,
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_cuda_engine_keeps_the_chosen_layer_float():
    """On the CUDA target (NVRTC only, no GPU): the search runs on the host in the CPU int8
    arithmetic, and the engine runs the kept layer as a float GEMM, the other as an int8 GEMM."""
    rng = np.random.default_rng(1)
    m = _mlp(rng)
    # one feature of x is 30x the others: fc1's per-tensor input scale is coarse for the rest, so
    # fc1 is the sensitive layer
    feeds = [{"x": (rng.standard_normal((16, 64)) * np.where(np.arange(64) == 0, 30, 1)).astype(np.float32)}
             for _ in range(4)]  # fmt: skip

    e = graphc.compile(m, target="cuda", precision="int8", calibration_data=feeds, accuracy="cosine:0.9998",
                       arch=["sm_80"])  # fmt: skip
    a = e.report["quantization"]["accuracy"]
    assert [k["layer"] for k in a["kept"]] == ["fc1"], a
    assert a["sensitivity"][0]["layer"] == "fc1" and not a["points"][0]["holds"]
    fams = [ln.family for s in e.plan.steps for ln in s.launches]
    assert fams.count("gemm_int8") == 1 and fams.count("gemm") == 1, fams
