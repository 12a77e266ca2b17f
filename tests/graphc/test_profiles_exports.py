"""Optimization profiles on PyTorch exports (issue 14's CPU done-when): a dynamic-batch CNN (a tiny
transformers ResNet) and a dynamic batch+sequence transformer (a tiny BERT), each from both exporters
(TorchScript and dynamo), compiled once with a profile, run at min, a middle shape and max against
ONNX Runtime within 1e-4 of its output scale, and refused outside the profile with one line; the CUDA
target compiles the same profiles (NVRTC, no GPU).

The exports are files made by tools/export_torch.py (`--tiny --exporter both`, dynamic axes) with the
torch named in their manifest (this machine has no torch); where torch and transformers are
installed, the same models are also exported here, in the test, and checked the same way."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

import graphc
from graphc.runtime.errors import EngineInputError

DATA = Path(__file__).parent / "data" / "profile_exports"
EXPORTERS = ("torchscript", "dynamo")

# (input shapes min, opt, max) per model; the text model's batch and sequence both range
PROFILES = {
    "resnet50": {"pixel_values": ([1, 3, 32, 32], [4, 3, 32, 32], [8, 3, 32, 32])},
    "bert": {n: ([1, 4], [2, 5], [6, 6]) for n in ("input_ids", "attention_mask", "token_type_ids")},
}
# min, a middle shape and max of each profile; the middle batch is no bucket (buckets: CNN 1 2 3 4 5
# 7 8, BERT 1 2 3 5 6), so it is padded (6 -> 7, 4 -> 5), while BERT's sequence runs exactly
SHAPES = {
    "resnet50": [{"batch": 1}, {"batch": 6}, {"batch": 8}],
    "bert": [{"batch": 1, "seq": 4}, {"batch": 4, "seq": 5}, {"batch": 6, "seq": 6}],
}


# the CUDA build's smaller ranges: every bucket is a full NVRTC build (minutes on the 2-core CI machine)
CUDA_PROFILES = {
    "resnet50": {"pixel_values": ([1, 3, 32, 32], [2, 3, 32, 32], [3, 3, 32, 32])},
    "bert": {n: ([1, 4], [2, 4], [2, 5]) for n in ("input_ids", "attention_mask", "token_type_ids")},
}


def _profile(model: str, inputs: list[str], table: dict = PROFILES) -> dict:
    p = {n: v for n, v in table[model].items() if n in inputs}
    return {k: {n: v[i] for n, v in p.items()} for i, k in enumerate(("min_shapes", "opt_shapes", "max_shapes"))}


def _feeds(model: str, inputs: list[str], dims: dict[str, int], seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    if model == "resnet50":
        return {"pixel_values": rng.standard_normal((dims["batch"], 3, 32, 32)).astype(np.float32)}
    shape = (dims["batch"], dims["seq"])
    feeds = {"input_ids": rng.integers(0, 100, size=shape).astype(np.int64)}
    mask = np.ones(shape, np.int64)
    mask[0, -1] = 0  # one padded token: the mask takes part
    feeds["attention_mask"] = mask
    feeds["token_type_ids"] = rng.integers(0, 2, size=shape).astype(np.int64)
    return {k: v for k, v in feeds.items() if k in inputs}


def _inputs(path: Path) -> list[str]:
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return [i.name for i in sess.get_inputs()]


def _check_across_the_range(model: str, path: Path) -> None:
    names = _inputs(path)
    engine = graphc.compile(str(path), target="cpu", **_profile(model, names))
    (p,) = engine.profiles
    dims = {g.name: g for g in p.dims}
    assert dims["batch"].padded, dims["batch"].reason  # the padding analysis proves the batch independent
    if model == "bert":
        assert not dims["seq"].padded  # attention mixes the sequence: a bucket per size
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for k, sizes in enumerate(SHAPES[model]):
        feeds = _feeds(model, names, sizes, seed=k)
        _prof, bucket, _sizes = engine.dynamic.resolve(engine, feeds)
        assert (bucket.sizes["batch"] > sizes["batch"]) == (k == 1)  # the middle shape is padded
        got = engine.run(feeds)
        outs = [o.name for o in sess.get_outputs()]
        for name, ref in zip(outs, sess.run(None, feeds), strict=True):
            assert got[name].shape == ref.shape, (name, sizes)
            scale = float(np.abs(ref).max()) or 1.0
            err = float(np.abs(got[name].astype(np.float64) - ref).max())
            assert err <= 1e-4 * scale, f"{path.name} {sizes} {name}: max abs err {err:.3g} at scale {scale:.3g}"
    # outside the profile: one line naming the input, the dim and the range
    top = SHAPES[model][-1]["batch"]
    big = dict(SHAPES[model][-1], batch=top + 1)
    with pytest.raises(EngineInputError) as e:
        engine.run(_feeds(model, names, big, seed=9))
    first = names[0]
    assert str(e.value) == f"input '{first}' dim 0 is {top + 1}, outside the profile's range 1..{top}"
    if model == "bert":
        with pytest.raises(
            EngineInputError, match=r"^input 'input_ids' dim 1 is 7, outside the profile's range 4\.\.6$"
        ):
            engine.run(_feeds(model, names, {"batch": 2, "seq": 7}, seed=9))


def _committed() -> list[tuple[str, str]]:
    return [(m, e) for m in PROFILES for e in EXPORTERS]


@pytest.mark.parametrize("model, exporter", _committed())
def test_export_runs_across_its_profile(model, exporter):
    path = DATA / f"{model}.{exporter}.onnx"
    manifest = json.loads((DATA / f"{model}.json").read_text())
    assert manifest["exports"][exporter]["ok"] and not manifest["static"]  # dynamic axes, checked by the tool
    _check_across_the_range(model, path)


@pytest.mark.slow
@pytest.mark.parametrize("model", sorted(PROFILES))
def test_cuda_target_compiles_the_same_profile(model, tmp_path):
    """Both exporters' files, the CUDA target, sm_90 (NVRTC needs no GPU); the engine file validates."""
    from graphc.runtime.format import read_engine

    for exporter in EXPORTERS:
        path = DATA / f"{model}.{exporter}.onnx"
        engine = graphc.compile(str(path), target="cuda", arch=["sm_90"], cache_dir=tmp_path / "cache",
                                **_profile(model, _inputs(path), CUDA_PROFILES))  # fmt: skip
        out = tmp_path / f"{model}.{exporter}.engine"
        engine.save(out)
        ef = read_engine(out)
        assert [p.describe() for p in ef.profiles] == [p.describe() for p in engine.profiles]
        assert len(ef.profiles[0].buckets) == len(engine.profiles[0].buckets) == {"resnet50": 3, "bert": 4}[model]
        assert any(g.padded for g in ef.profiles[0].dims)  # the batch, padded as on the CPU target


@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("model", sorted(PROFILES))
def test_fresh_torch_export_runs_across_its_profile(model, exporter, tmp_path):
    """Where torch and transformers are installed: export the tiny model here, then the same checks."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    pytest.importorskip("onnxscript")
    import sys

    sys.path.insert(0, str(Path(__file__).parents[2] / "tools"))
    import export_torch

    rc = export_torch.main(["--out", str(tmp_path), "--models", model, "--exporter", exporter, "--tiny",
                            "--batch", "2", "--seq", "8"])  # fmt: skip
    assert rc == 0
    _check_across_the_range(model, tmp_path / f"{model}.{exporter}.onnx")
