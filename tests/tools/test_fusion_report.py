"""tools/fusion_report.py on a two-file corpus: the table's counts are those of the CUDA fp16
pipeline, --ort adds a row for ONNX Runtime's transformer optimizer's output (com.microsoft ops),
and a file that does not optimize gets a row saying so and a non-zero exit."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tools import fusion_report

CORPUS = Path(__file__).resolve().parents[1] / "corpus"
KEYS = ("bert.eager.torchscript", "llama.sdpa.dynamo")


def _mini_corpus(tmp_path: Path, extra: dict | None = None) -> Path:
    manifest = json.loads((CORPUS / "manifest.json").read_text())
    sub = {k: manifest[k] for k in KEYS} | (extra or {})
    for rec in sub.values():
        if (CORPUS / rec["file"]).exists():
            shutil.copy(CORPUS / rec["file"], tmp_path / rec["file"])
    (tmp_path / "manifest.json").write_text(json.dumps(sub))
    return tmp_path


def _rows(md: str) -> dict[tuple[str, str], list[str]]:
    rows = {}
    for line in md.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) > 3 and cells[1].startswith("corpus"):
            rows[(cells[0], cells[2])] = cells
    return rows


def test_table_counts_fusions(tmp_path):
    folder = _mini_corpus(tmp_path)
    md_path = tmp_path / "out.md"
    assert fusion_report.main(["--dir", str(folder), "--md", str(md_path)]) == 0
    rows = _rows(md_path.read_text())
    bert, llama = rows[("bert", "torchscript")], rows[("llama", "dynamo")]
    # model | config | exporter | nodes | kernels | attn | T | LN | RMS | GELU | RoPE | SiLU | left | contrib
    assert bert[5:12] == ["2/2", "8 -> 0", "5", "0", "2", "0", "0/0"]
    # SwiGLU: gate and up run as one horizontal GEMM (passes/fuse_horizontal.py), so silu(gate) * up
    # is one elementwise kernel, not a GEMM epilogue
    assert llama[5:12] == ["2/2", "10 -> 0", "0", "5", "0", "4", "0/2"]
    assert int(bert[4]) > 10


def test_ort_rows_hold_contrib_ops(tmp_path):
    pytest.importorskip("sympy", reason="ORT's transformer optimizer needs sympy")
    folder = _mini_corpus(tmp_path)
    out = tmp_path / "rows.json"
    rc = fusion_report.main(["--dir", str(folder), "--models", "bert", "--ort", "--ort-dir", str(tmp_path / "ort"),
                             "--json", str(out)])  # fmt: skip
    assert rc == 0
    rows = {r["export"]["exporter"]: r for r in json.loads(out.read_text())}
    ort_row = rows["torchscript+ort"]
    assert ort_row["contrib_ops"]["Attention"] == 2 and "SkipLayerNormalization" in ort_row["contrib_ops"]
    assert ort_row["attention_fused"] == ort_row["attention_present"] == 2


def test_a_file_that_fails_gets_a_row_and_exit_1(tmp_path):
    bad = {"broken": {"file": "broken.onnx", "model": "bert", "attn_implementation": "eager",
                      "exporter": "torchscript", "inputs": {}}}  # fmt: skip
    folder = _mini_corpus(tmp_path, bad)
    (folder / "broken.onnx").write_bytes(b"not an onnx file")
    md_path = tmp_path / "out.md"
    assert fusion_report.main(["--dir", str(folder), "--md", str(md_path)]) == 1
    assert "failed:" in md_path.read_text()


def test_rows_and_before_tabulate_earlier_runs(tmp_path):
    folder = _mini_corpus(tmp_path)
    now = tmp_path / "now.json"
    assert fusion_report.main(["--dir", str(folder), "--models", "llama", "--json", str(now)]) == 0
    earlier = json.loads(now.read_text())
    earlier[0]["kernels"] += 7
    earlier[0]["attention_fused"] = 0
    (tmp_path / "before.json").write_text(json.dumps(earlier))
    md = tmp_path / "out.md"
    args = ["--rows", str(now), "--before", str(tmp_path / "before.json"), "--md", str(md)]
    assert fusion_report.main(args) == 0
    row = _rows(md.read_text())[("llama", "dynamo")]
    k = int(row[4].split("→")[1])
    assert row[4] == f"{k + 7} → {k}" and row[5] == "0/2 → 2/2"


def test_reads_the_architecture_corpus_manifest(tmp_path):
    """tools/make_arch_corpus.py's manifest ({"models": {name: {inputs with symbolic dims,
    exports: {exporter: {file, ok}}}}}): a row per export file present, its dims bound from
    example_dims (an export that failed only the exporter's second-shape check still counts)."""
    rec = json.loads((CORPUS / "manifest.json").read_text())["bert.eager.torchscript"]
    shutil.copy(CORPUS / rec["file"], tmp_path / "bert.torchscript.onnx")
    ins = [{"name": n, "dtype": "int64", "shape": ["batch", "seq"]} for n in rec["inputs"]]
    manifest = {
        "versions": {"torch": "2.13.0+cpu"},
        "example_dims": {"batch": 2, "seq": 8},
        "models": {
            "bert": {
                "inputs": ins,
                "exports": {
                    "torchscript": {"file": "bert.torchscript.onnx", "ok": False},
                    "dynamo": {"file": "bert.dynamo.onnx", "ok": False},  # no file: no row
                },
            }
        },
    }
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    md_path = tmp_path / "out.md"
    assert fusion_report.main(["--dir", str(tmp_path), "--md", str(md_path)]) == 0
    rows = [r for r in md_path.read_text().splitlines() if r.startswith("| bert ")]
    assert len(rows) == 1, rows
    cells = [c.strip() for c in rows[0].strip("|").split("|")]
    assert cells[1:3] == ["arch corpus torch 2.13", "torchscript"] and cells[5] == "2/2", cells
