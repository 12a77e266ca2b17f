"""The exporter corpus (tests/corpus/, made by tools/make_corpus.py): every transformer export
fuses its attention, ends with as few Transposes as the TorchScript export of the same model,
and computes what ONNX Runtime computes on the file.

The files are committed, so these tests need no torch. manifest.json says which torch and
transformers versions wrote each file.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import graphc
from graphc.passes import OptimizeOptions, optimize
from tools.make_corpus import CASES

CORPUS = Path(__file__).resolve().parents[1] / "corpus"
MANIFEST = json.loads((CORPUS / "manifest.json").read_text())

# Transposes left after optimization, whatever the exporter: ViT keeps its patch embedding's
# flatten-transpose, which no attention or GEMM absorbs; the rest keep none.
TRANSPOSES = {"bert": 0, "distilbert": 0, "gpt2": 0, "vit": 1, "llama": 0}


def _optimized(key: str):
    rec = MANIFEST[key]
    model = onnx.load(str(CORPUS / rec["file"]))
    g0 = graphc.bind_shapes(graphc.load_onnx(model), {})
    g1 = optimize(g0, OptimizeOptions(opt_level=2, verify=True)).graph
    return model, g0, g1


def test_corpus_is_complete():
    # Every model from both exporters and both of transformers' attention paths.
    want = {f"{m}.{i}.{e}" for m in CASES for i in ("eager", "sdpa") for e in ("torchscript", "dynamo")}
    assert set(MANIFEST) == want
    for rec in MANIFEST.values():
        assert (CORPUS / rec["file"]).stat().st_size < 200_000


@pytest.mark.parametrize("key", sorted(MANIFEST))
def test_attention_fuses_and_matches_onnxruntime(key):
    rec = MANIFEST[key]
    model, g0, g1 = _optimized(key)
    counts = g1.op_counts()
    assert counts.get("Attention", 0) == rec["layers"], (counts, g1.meta.get("near_misses"))
    assert "Softmax" not in counts and "Expand" not in counts, counts
    assert counts.get("Transpose", 0) == TRANSPOSES[rec["model"]], counts
    if rec["model"] == "llama":  # rotary on Q and K of every layer, on the 3-D projections
        assert counts.get("RotaryEmbedding") == 2 * rec["layers"], counts
    feeds = CASES[rec["model"]].inputs(np.random.default_rng(7))
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds), strict=True))
    got = graphc.interpret(g1, feeds)
    for name, w in want.items():
        scale = float(np.abs(w).max())
        np.testing.assert_allclose(got[name], w, rtol=0, atol=1e-4 * scale, err_msg=f"{key}: {name}")
