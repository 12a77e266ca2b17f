"""tools/make_arch_corpus.py's list, tools/check_models.py --arch-corpus (check_corpus.py: stages, rows of
failed exports, a reference that disagrees, the per-model processes, the table) and
tools/gpu_corpus_session.sh's non-GPU path, on a hand-made corpus folder (no torch needed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import check_corpus as CC  # noqa: E402
import make_arch_corpus as MA  # noqa: E402


def _model(path: Path) -> None:
    """y = softmax(x @ w + b) over the last axis: an attention-score-like graph with a dynamic batch."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((6, 5)).astype(np.float32)
    b = rng.standard_normal(5).astype(np.float32)
    g = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w"], ["m"]),
            helper.make_node("Add", ["m", "b"], ["a"]),
            helper.make_node("Softmax", ["a"], ["y"], axis=-1),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 5])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    path.write_bytes(m.SerializeToString())


@pytest.fixture()
def corpus(tmp_path: Path) -> Path:
    """Two models as make_arch_corpus writes them: one exported by both exporters (the dynamo file's
    stored reference is off by 1e-2, as a wrong reference would be), one whose dynamo export failed."""
    x = np.random.default_rng(1).standard_normal((3, 6)).astype(np.float32)
    models = {}
    for name in ("good", "half"):
        exports = {}
        for exporter in ("torchscript", "dynamo"):
            if name == "half" and exporter == "dynamo":
                exports[exporter] = {"ok": False, "stage": "export", "error": "TorchExportError: data-dependent"}
                continue
            path = tmp_path / f"{name}.{exporter}.onnx"
            _model(path)
            (y,) = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})
            if name == "good" and exporter == "dynamo":
                y = y + np.float32(1e-2)
            np.savez(path.with_suffix(".npz"), **{"in.x": x, "out.y": y})
            exports[exporter] = {"ok": True, "file": path.name, "npz": path.with_suffix(".npz").name}
        spec = [{"name": "x", "dtype": "float32", "shape": ["batch", 6], "low": 0, "high": 1, "kind": "normal"}]
        models[name] = {"model": name, "family": "test", "exports": exports, "static": False, "inputs": spec,
                        "example_dims": {"batch": 3}, "seed": 0}  # fmt: skip
    manifest = {"date": "2026-12-01", "versions": {"torch": "t", "transformers": "tf", "onnxscript": "o"}, "seed": 0,
                "example_dims": {"batch": 3}, "torchscript_opset": 17, "models": models}  # fmt: skip
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    return tmp_path


def test_the_architecture_list_spans_the_families_issue_12_asks_for():
    fams: dict[str, int] = {}
    for a in MA.ARCHS.values():
        fams[a.family] = fams.get(a.family, 0) + 1
    assert len(MA.ARCHS) >= 20
    assert fams["text-encoder"] >= 5 and fams["decoder"] >= 5 and fams["vision"] >= 5 and fams["speech"] >= 2
    assert fams["detection"] >= 1 and fams["segmentation"] >= 1
    assert {"llama", "mistral", "qwen2", "whisper_encoder", "wav2vec2", "swin", "segformer", "yolos"} <= set(MA.ARCHS)
    # an encoder-decoder with cross-attention takes its decoder's ids through the wrapper too
    bart = MA.ARCHS["bart"]
    assert bart.family == "seq2seq" and [s.name for s in bart.inputs][-1] == "decoder_input_ids"


def test_items_carry_stored_inputs_references_and_failed_exports(corpus):
    items = {i.key: i for i in CC.arch_items(str(corpus))}
    assert set(items) == {"arch:good.torchscript", "arch:good.dynamo", "arch:half.torchscript", "arch:half.dynamo"}
    assert items["arch:half.dynamo"].export_error == "export: TorchExportError: data-dependent"
    assert items["arch:good.torchscript"].feeds["x"].shape == (3, 6)
    assert set(items["arch:good.torchscript"].ref) == {"y"}


def test_stages_pass_on_a_right_reference_and_fail_on_a_wrong_one(corpus):
    items = {i.key: i for i in CC.arch_items(str(corpus))}
    good = CC.check_item(items["arch:good.torchscript"], ["interpret", "cpu"], [])
    assert good["interpret"] and good["cpu"], good
    assert good["interpret_detail"].startswith("rel ")
    off = CC.check_item(items["arch:good.dynamo"], ["interpret", "cpu"], [])
    assert off["interpret"] is False and off["cpu"] is False  # 1e-2 over outputs of scale < 1: over 1e-4
    assert "MISMATCH" in off["interpret_detail"]
    failed = CC.check_item(items["arch:half.dynamo"], ["interpret", "cpu"], [])
    assert failed["export"] is False and "interpret" not in failed and "data-dependent" in CC.stops(failed)


def test_a_second_shape_binds_the_symbolic_batch_and_compares_with_ort_there(corpus):
    it = {i.key: i for i in CC.arch_items(str(corpus))}["arch:good.dynamo"]
    assert it.feeds2["x"].shape == (4, 6)
    row = CC.check_item(it, ["cpu-shape2"], [])
    assert row["cpu-shape2"] is True, row  # ORT's outputs at (4, 6), not the wrong stored ones


def test_check_models_runs_each_model_in_its_own_process_and_writes_the_table(corpus, tmp_path):
    md, js = tmp_path / "t.md", tmp_path / "t.json"
    cmd = [sys.executable, str(ROOT / "tools" / "check_models.py"), "--arch-corpus", str(corpus), "--stages",
           "interpret,cpu", "--jobs", "2", "--out", str(md), "--json", str(js)]  # fmt: skip
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 1, proc.stdout + proc.stderr  # the wrong reference and the failed export
    data = json.loads(js.read_text())
    rows = {r["key"]: r for r in data["rows"]}
    assert rows["arch:good.torchscript"]["cpu"] is True and rows["arch:half.torchscript"]["interpret"] is True
    assert rows["arch:good.dynamo"]["cpu"] is False
    c = data["counts"]["arch-corpus"]
    assert (c["rows"], c["exported"], c["interpret_ok"], c["interpret_run"]) == (4, 3, 2, 3)
    text = md.read_text()
    assert "interpret 2/3, cpu 2/3" in text and "| half | test | dynamo | - | - | export: " in text


def test_a_deadline_turns_unstarted_models_into_rows(corpus):
    items = CC.arch_items(str(corpus))
    rows = CC.run_items(items, [f"--arch-corpus={corpus}", "--stages=interpret"], 1, 60, deadline_s=-1)
    assert [r["error"] for r in rows if r.get("export")] == ["not run: the session's time was spent"] * 3


def test_gpu_session_script_runs_its_non_gpu_path(corpus, tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "SKIP_INSTALL": "1", "CHECK_PY": sys.executable,
           "EXPORT_PY": sys.executable, "EXPORT_S": "0", "TESTC_S": "0", "CORPUS": str(corpus),
           "STAGES": "interpret", "JOBS": "2", "ARCH_S": "120"}  # fmt: skip
    proc = subprocess.run(["bash", str(ROOT / "tools" / "gpu_corpus_session.sh")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    log = (out / "session.log").read_text()
    assert "arch exports: skipped" in log and "arch corpus: rc=1" in log and "trained: no TRAINED" in log
    rows = json.loads((out / "arch_corpus_cuda.json").read_text())["rows"]
    assert sum(bool(r.get("interpret")) for r in rows) == 2


def test_a_timed_out_child_takes_its_own_children_with_it(tmp_path):
    pid_file = tmp_path / "pid"
    cmd = ["bash", "-c", f"sleep 60 & echo $! > {pid_file}; wait"]
    start = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        CC.run_group(cmd, dict(os.environ), 2)
    # a surviving grandchild keeps the pipes open, so run_group would wait out its 60 s sleep
    assert time.monotonic() - start < 30
    grandchild = int(pid_file.read_text())
    assert _dead_within(grandchild, 10.0), f"pid {grandchild} (the child's own child) outlived the timeout"


def _dead_within(pid: int, seconds: float) -> bool:
    """Gone, or a zombie (killed; reaped when its new parent gets to it: a container's init may not
    do so at once)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.05)
    return False


def test_an_ort_failure_at_the_second_shape_is_told_apart_from_one_at_the_stored_inputs():
    feeds = {"input_ids": np.zeros((2, 16), np.int64)}
    second = CC._ort_note("AssertionError: y differs from PyTorch by 2.3 (inputs {'input_ids': (3, 11)})", feeds)
    stored = CC._ort_note("AssertionError: y differs from PyTorch by 2.3 (inputs {'input_ids': (2, 16)})", feeds)
    assert second.startswith("ORT matches PyTorch at the stored inputs, not at a second shape")
    assert stored.startswith("ORT vs PyTorch: ")
