"""The model zoo: every tiny model builds, passes the full checker and runs in ONNX Runtime.

tests/models/ has no __init__.py on purpose: pytest puts tests/ on sys.path before the repo root,
and a regular package here would shadow the `models` package that these tests import.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import models

REPO = Path(__file__).resolve().parents[2]
NAMES = models.list_models()
EXPECTED_OUTPUTS = {
    "mlp": {"logits": (2, 10)},
    "resnet": {"logits": (2, 10)},
    "mobilenetv2": {"logits": (2, 10)},
    "bert": {"last_hidden_state": (2, 16, 32)},
    "vit": {"logits": (2, 10)},
}


def run_ort(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds), strict=True))


def check(model: onnx.ModelProto, name: str, **sample: object) -> dict[str, np.ndarray]:
    onnx.checker.check_model(model, full_check=True)
    outs = run_ort(model, models.sample_inputs(name, model, **sample))
    for out_name, value in outs.items():
        assert np.isfinite(value).all(), f"{name}: {out_name} is not finite"
    return outs


@pytest.mark.parametrize("name", NAMES)
def test_tiny_model_builds_checks_and_runs(name: str) -> None:
    model = models.build(name, "tiny")
    assert model.ByteSize() < 2**20, f"tiny {name} is {model.ByteSize()} bytes"
    assert model.opset_import[0].version == models.DEFAULT_OPSET
    outs = check(model, name)
    assert {k: v.shape for k, v in outs.items()} == EXPECTED_OUTPUTS[name]
    # Activations are O(1): neither vanishing (every comparison would pass) nor exploding.
    for out_name, value in outs.items():
        assert 0.1 < float(np.sqrt(np.mean(value**2))) < 10, f"{name}: {out_name} has rms {value.std()}"


@pytest.mark.parametrize("opset", [11, 13, 15, 18, onnx.defs.onnx_opset_version()])
@pytest.mark.parametrize("name", NAMES)
def test_opsets(name: str, opset: int) -> None:
    """Same seed, other opset: the op spellings change (Unsqueeze, ReduceMean, Split, LayerNorm
    below 17), the function does not."""
    model = models.build(name, "tiny", opset=opset)
    assert model.opset_import[0].version == opset
    outs = check(model, name)
    reference = run_ort(models.build(name, "tiny"), models.sample_inputs(name, model))
    for k, v in outs.items():
        np.testing.assert_allclose(v, reference[k], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("opset", [13, 17, 18])
@pytest.mark.parametrize("name", ["bert", "vit"])
def test_decomposed_layernorm_matches_fused(name: str, opset: int) -> None:
    decomposed = models.build(name, "tiny", opset=opset, layernorm="decomposed")
    ops = {n.op_type for n in decomposed.graph.node}
    assert "LayerNormalization" not in ops and {"ReduceMean", "Pow", "Sqrt"} <= ops
    got = check(decomposed, name)
    fused = models.build(name, "tiny", layernorm="fused")
    assert "LayerNormalization" in {n.op_type for n in fused.graph.node}
    want = run_ort(fused, models.sample_inputs(name, fused))
    for k, v in got.items():
        np.testing.assert_allclose(v, want[k], rtol=1e-4, atol=1e-4)


def test_fused_layernorm_needs_opset_17() -> None:
    with pytest.raises(ValueError, match="opset >= 17"):
        models.build("bert", "tiny", opset=16, layernorm="fused")
    assert "LayerNormalization" not in {n.op_type for n in models.build("vit", "tiny", opset=16).graph.node}


@pytest.mark.parametrize(
    ("name", "options", "ops"),
    [
        ("mlp", {"linear": "matmul"}, {"MatMul", "Add", "Relu"}),
        ("mlp", {"linear": "gemm"}, {"Gemm", "Relu"}),
        ("vit", {"qkv": "fused", "opset": 11}, {"Split"}),
        ("vit", {"qkv": "fused", "opset": 18}, {"Split"}),
        ("bert", {"pooler": True}, {"Tanh", "Gemm"}),
        ("bert", {"token_type_input": True}, {"Gather"}),
        ("resnet", {"batch": 3}, {"BatchNormalization"}),
        ("mobilenetv2", {"width_mult": 0.5}, {"Clip"}),
    ],
)
def test_options(name: str, options: dict, ops: set[str]) -> None:
    model = models.build(name, "tiny", **options)
    assert ops <= {n.op_type for n in model.graph.node}
    check(model, name, batch=options.get("batch", 2))


def test_bert_inputs_and_masking() -> None:
    model = models.build("bert", "tiny")
    inputs = {i.name: i.type.tensor_type for i in model.graph.input}
    assert list(inputs) == ["input_ids", "attention_mask"]
    for t in inputs.values():
        assert t.elem_type == onnx.TensorProto.INT64
        assert [d.dim_param for d in t.shape.dim] == ["batch", "seq"]
    feeds = models.sample_inputs("bert", model, seed=3, batch=3, seq=20)
    assert feeds["input_ids"].shape == (3, 20)
    assert feeds["input_ids"].min() >= 0 and feeds["input_ids"].max() < 128
    mask = feeds["attention_mask"]
    assert mask[0].all() and not mask[1:].all(axis=1).any() and mask[:, 0].all()
    # Padding works: changing a padded token does not change the other tokens' outputs.
    out = run_ort(model, feeds)["last_hidden_state"]
    row, col = 1, int(np.argmin(mask[1]))
    feeds["input_ids"][row, col:] = (feeds["input_ids"][row, col:] + 1) % 128
    out2 = run_ort(model, feeds)["last_hidden_state"]
    np.testing.assert_allclose(out2[row, :col], out[row, :col], rtol=1e-5, atol=1e-5)
    assert not np.allclose(out2[row, col:], out[row, col:])


def test_static_dims() -> None:
    model = models.build("bert", "tiny", batch=1, seq=8)
    check(model, "bert")
    assert models.sample_inputs("bert", model)["input_ids"].shape == (1, 8)


def test_seeds_and_config() -> None:
    a, b, c = (models.build("resnet", "tiny", seed=s) for s in (0, 0, 1))
    assert a.SerializeToString() == b.SerializeToString()
    assert a.graph.initializer[0].raw_data != c.graph.initializer[0].raw_data
    config = models.config_of(a)
    assert config["model"] == "resnet" and config["size"] == "tiny" and config["seed"] == 0
    with pytest.raises(ValueError, match="unknown model"):
        models.build("nope")
    with pytest.raises(ValueError, match="unexpected keyword"):
        models.build("mlp", "tiny", layernorm="fused")
    with pytest.raises(ValueError, match="built as"):
        models.sample_inputs("vit", a)


def test_save_small_and_external(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = models.build("mlp", "tiny")
    assert models.save(model, tmp_path / "small.onnx") == [tmp_path / "small.onnx"]
    monkeypatch.setattr(models, "EXTERNAL_DATA_THRESHOLD", 1000)
    files = models.save(model, tmp_path / "big.onnx")
    assert files == [tmp_path / "big.onnx", tmp_path / "big.onnx.data"]
    assert model.graph.initializer[0].HasField("raw_data")  # the caller's model stays inline
    onnx.checker.check_model(str(tmp_path / "big.onnx"), full_check=True)
    loaded = onnx.load(str(tmp_path / "big.onnx"))
    feeds = models.sample_inputs("mlp", loaded)
    np.testing.assert_array_equal(run_ort(loaded, feeds)["logits"], run_ort(model, feeds)["logits"])


def test_cli_writes_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "m.onnx"
    cmd = [sys.executable, "-m", "models", "bert", "--size", "tiny", "-o", str(out), "--opset", "13", "--seed", "5",
           "--set", "layernorm=decomposed"]  # fmt: skip
    res = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=True)
    assert "wrote" in res.stdout
    model = onnx.load(str(out))
    assert model.opset_import[0].version == 13
    config = json.loads(model.metadata_props[0].value)
    assert config["seed"] == 5 and config["layernorm"] == "decomposed"
    check(model, "bert")
    from models.__main__ import main

    assert main(["--list"]) == 0
    listing = capsys.readouterr().out
    assert all(name in listing for name in NAMES)


def test_full_presets_are_the_real_architectures() -> None:
    """Counted from the presets' shapes without drawing the weights (ResNet-50 has 25,557,032
    parameters plus 53,120 BN running statistics; MobileNetV2 3,504,872 plus 34,112; BERT-base
    108,891,648 without the pooler; ViT-B/16 86,567,656)."""
    expected = {"resnet": 25_557_032 + 53_120, "mobilenetv2": 3_504_872 + 34_112, "bert": 108_891_648,
                "vit": 86_567_656}  # fmt: skip
    for name, count in expected.items():
        assert parameter_count(name, "full") == count, name


def parameter_count(name: str, size: str) -> int:
    """Floats in the initializers, built with a stub that records shapes instead of drawing."""
    shapes: list[tuple[int, ...]] = []
    from models import _graph

    class Counting(_graph.GraphWriter):
        def normal(self, name: str, shape, std: float, mean: float = 0.0) -> str:  # type: ignore[override]
            shapes.append(tuple(shape))
            return self.initializer(np.zeros((1,) * len(shape), np.float32), name)

        def uniform(self, name: str, shape, low: float, high: float) -> str:  # type: ignore[override]
            return self.normal(name, shape, 0.0)

    family = models.FAMILIES[name]
    saved = family.GraphWriter
    family.GraphWriter = Counting
    try:
        models.build(name, size)
    finally:
        family.GraphWriter = saved
    return sum(int(np.prod(s)) for s in shapes)
