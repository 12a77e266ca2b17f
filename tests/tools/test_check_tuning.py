"""tools/check_tuning.py's model sources, on the CPU (--dry-run: no GPU, no timing): the zoo's
models, and with --export-dir tools/export_torch.py's files, whose inputs come from export_torch's
specs. The export here is a stand-in written with onnx.helper under export_torch's file name
(no torch needed): it reads both text inputs, so feeds outside their ranges fail it."""

from __future__ import annotations

import json

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tools import check_tuning, export_torch

WIDTH = 4


def _stand_in(path, vocab: int) -> None:
    """logits = embedding[input_ids] * attention_mask, (batch, seq, WIDTH): a Gather that fails on
    an id out of range."""
    emb = numpy_helper.from_array(np.random.default_rng(0).normal(size=(vocab, WIDTH)).astype(np.float32), "emb")
    nodes = [
        helper.make_node("Gather", ["emb", "input_ids"], ["e"]),
        helper.make_node("Cast", ["attention_mask"], ["mf"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["mf", "axis"], ["m3"]),
        helper.make_node("Mul", ["e", "m3"], ["logits"]),
    ]
    ins = [
        helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "seq"]) for n in ("input_ids", "attention_mask")
    ]
    out = helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "seq", WIDTH])
    axis = numpy_helper.from_array(np.array([-1], np.int64), "axis")
    model = helper.make_model(
        helper.make_graph(nodes, "gpt2", ins, [out], [emb, axis]), opset_imports=[helper.make_opsetid("", 17)]
    )
    onnx.save(model, str(path))


def _rows(tmp_path, *args: str) -> tuple[int, list[dict]]:
    out = tmp_path / "rows.json"
    rc = check_tuning.main([*args, "--dry-run", "--json", str(out)])
    return rc, json.loads(out.read_text())


def test_export_dir_models_dry_run(tmp_path):
    vocab = export_torch.CASES["gpt2"].tiny().inputs[0].high
    _stand_in(tmp_path / "gpt2.dynamo.onnx", int(vocab))
    rc, rows = _rows(tmp_path, "--export-dir", str(tmp_path), "--exporter", "dynamo", "--tiny",
                     "--models", "gpt2", "--batch", "1,3", "--seq", "5")  # fmt: skip
    assert rc == 0, rows
    assert [(r["model"], r["batch"], r["outputs"]) for r in rows] == [
        ("gpt2", 1, {"logits": [1, 5, WIDTH]}),
        ("gpt2", 3, {"logits": [3, 5, WIDTH]}),
    ]
    assert all(r["pass"] and r["dry_run"] and r["exporter"] == "dynamo" for r in rows)


def test_full_size_inputs_are_the_full_cases(tmp_path):
    # Without --tiny the ids span the full vocabulary: the tiny-vocabulary stand-in fails on them.
    _stand_in(tmp_path / "gpt2.torchscript.onnx", int(export_torch.CASES["gpt2"].tiny().inputs[0].high))
    rc, rows = _rows(tmp_path, "--export-dir", str(tmp_path), "--models", "gpt2", "--batch", "2", "--seq", "64")
    assert rc == 1 and not rows[0]["pass"] and "error" in rows[0]


def test_unknown_and_missing_exports_are_failed_rows(tmp_path):
    rc, rows = _rows(tmp_path, "--export-dir", str(tmp_path), "--models", "nosuch,llama", "--batch", "1")
    assert rc == 1
    assert "unknown model 'nosuch'" in rows[0]["error"] and "gpt2" in rows[0]["error"]
    assert "no export" in rows[1]["error"] and "tools/export_torch.py --models llama" in rows[1]["error"]


def test_zoo_models_without_export_dir(tmp_path):
    rc, rows = _rows(tmp_path, "--models", "mlp,gpt2", "--size", "tiny", "--batch", "2")
    assert rows[0]["pass"] and rows[0]["size"] == "tiny"
    assert rc == 1 and "unknown model 'gpt2'" in rows[1]["error"]  # the zoo has no GPT-2: --export-dir
