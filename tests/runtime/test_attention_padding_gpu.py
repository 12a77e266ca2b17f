"""CUDA engines on rows whose every key is masked (tests/passes/test_fuse_attention_padding.py on
the CPU): the fused attention (masked_rows "mean" where the mask's fill is finite) computes what
ONNX Runtime computes, in fp32 (1e-3 of the output's scale) and fp16 (cosine >= 0.999, every
element within 2e-2 of scale), for hand-built mask spellings and for committed corpus exports with
padded inputs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import graphc
from tests.passes.test_fuse_attention_padding import H, _feeds, _model
from tools.make_corpus import CASES

pytestmark = pytest.mark.gpu
CORPUS = Path(__file__).resolve().parents[1] / "corpus"


def _ort(model: onnx.ModelProto, feeds) -> dict[str, np.ndarray]:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds), strict=True))


def _check(model: onnx.ModelProto, feeds, precision: str, tmp_path) -> None:
    want = _ort(model, feeds)
    shapes = {k: v.shape for k, v in feeds.items()}
    engine = graphc.compile(model, target="cuda", precision=precision, shapes=shapes, cache_dir=str(tmp_path))
    got = engine.run(feeds, to_numpy=True)
    for name, w in want.items():
        g = np.asarray(got[name], np.float64)
        scale = float(np.abs(w).max())
        if precision == "fp32":
            np.testing.assert_allclose(g, w, rtol=0, atol=1e-3 * scale, err_msg=name)
        else:
            assert np.isfinite(g).all(), name
            cos = float(g.ravel() @ w.ravel() / (np.linalg.norm(g) * np.linalg.norm(w)))
            assert cos >= 0.999, (name, cos)
            np.testing.assert_allclose(g, w, rtol=0, atol=2e-2 * scale, err_msg=name)  # the padded rows too


@pytest.mark.parametrize("spelling", ["eager:window", "eager:causal", "where_min:window", "sdpa:window", "bias:window"])
@pytest.mark.parametrize("kv_heads", [H, 2])
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_mask_spellings(spelling, kv_heads, precision, tmp_path):
    _check(_model(spelling, kv_heads=kv_heads), _feeds(), precision, tmp_path)


def test_legacy_gpt2_float_mask(tmp_path):
    # Where(causal, s, finfo.min) + (1 - mask) * finfo.min as one float mask (fp32: in fp16 the
    # fill itself is out of fp16 range)
    _check(_model("legacy:causal"), _feeds(), "fp32", tmp_path)


@pytest.mark.parametrize(
    "key", ["bert.eager.dynamo.torch2.11", "gpt2.eager.torchscript.torch2.11", "llama.eager.dynamo.torch2.11"]
)
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_corpus_exports_with_wholly_padded_rows(key, precision, tmp_path):
    model = onnx.load(str(CORPUS / f"{key}.onnx"))
    feeds = CASES[key.split(".")[0]].inputs(np.random.default_rng(7))
    mask = feeds["attention_mask"].copy()
    mask[0] = 0  # batch entry 0 wholly padded
    mask[1, :3] = 0  # left padding: under a causal mask its first rows see only padding
    feeds["attention_mask"] = mask
    _check(model, feeds, precision, tmp_path)


@pytest.mark.parametrize("name", ["deberta", "bloom"])
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_bmm_score_spellings(name, precision, tmp_path):
    """DeBERTa-v2's disentangled bias inside the fill's Where and BLOOM's ALiBi beside a causal and
    padding mask (3-D batch*heads scores; tests/passes/test_canonicalize_bmm_attention.py): one fused
    Attention with a float mask, is_causal for BLOOM, masked_rows "mean", on rows with no key."""
    from tests.passes.test_canonicalize_bmm_attention import MODELS
    from tests.passes.test_canonicalize_bmm_attention import _feeds as bmm_feeds

    _check(MODELS[name](), bmm_feeds(), precision, tmp_path)
