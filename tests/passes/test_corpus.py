"""The exporter corpus (tests/corpus/, made by tools/make_corpus.py): every transformer export
fuses its attention, ends with as few Transposes as the TorchScript export of the same model,
and computes what ONNX Runtime computes on the file. For the CUDA target in fp16 (the pipeline of
`graphc compile --precision fp16`, no GPU needed to run the passes) every export of a model,
whichever exporter, torch version or ONNX Runtime transformer optimizer wrote it, ends with the
same fused ops: the exact counts of CUDA_FUSED, so that a lost fusion fails here.

The files are committed, so these tests need no torch. manifest.json says which torch and
transformers versions wrote each file (and, for ``*.ort`` entries, which ORT optimized which).
"""

from __future__ import annotations

import collections
import dataclasses
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

# Transposes left after optimization (CPU target), whatever the exporter: ViT and CLIP keep their
# patch embedding's flatten-transpose, which no attention or GEMM absorbs; Swin that one and its
# window partition and reverse in each block (real permutations of the tokens); the rest none.
TRANSPOSES = {"bert": 0, "distilbert": 0, "gpt2": 0, "vit": 1, "llama": 0, "qwen2": 0, "clip_vision": 1, "swin": 5}
DECODERS = ("llama", "qwen2")  # rotary on Q and K of every layer, GQA, SwiGLU

# The CUDA fp16 pipeline's result per model, the same for every export of it: fused nodes (also
# inside a fused kernel's epilogue) and Transpose kernels. SiLU: Sigmoids in a GEMM's epilogue
# (LLaMA's and Qwen2's SwiGLU gate, CLIP's quick GELU x * sigmoid(1.702 x)). On CUDA the patch
# embedding's conv runs in NHWC; its NCHW restore, the flatten and the transpose collapse into one
# reshape (passes/canonicalize_views.py), so only the input's NCHW -> NHWC transpose is left.
_ENC = {"Attention": 2, "LayerNormalization": 5, "Gelu": 2}
_DEC = {"Attention": 2, "RMSNormalization": 5, "RotaryEmbedding": 4, "SiLU": 2}
CUDA_FUSED = {
    "bert": {**_ENC, "Transpose": 0},
    "distilbert": {**_ENC, "Transpose": 0},
    "gpt2": {**_ENC, "Transpose": 0},
    "vit": {**_ENC, "Transpose": 1},
    "clip_vision": {"Attention": 2, "LayerNormalization": 5, "SiLU": 2, "Transpose": 1},
    "swin": {"Attention": 2, "LayerNormalization": 6, "Gelu": 2, "Transpose": 5},
    "llama": {**_DEC, "Transpose": 0},
    "qwen2": {**_DEC, "Transpose": 0},
}
COUNTED = ("Attention", "LayerNormalization", "RMSNormalization", "Gelu", "RotaryEmbedding", "SiLU", "Transpose",
           "Softmax", "Expand", "Erf", "Tanh", "ReduceMean")  # fmt: skip


def _optimized(key: str):
    rec = MANIFEST[key]
    model = onnx.load(str(CORPUS / rec["file"]))
    g0 = graphc.bind_shapes(graphc.load_onnx(model), {})
    g1 = optimize(g0, OptimizeOptions(opt_level=2, verify=True)).graph
    return model, g0, g1


# The sets of exports in the corpus: torch 2.14 (untagged, the first five models), torch 2.13 and
# torch 2.11 with transformers 5.17 (every model; 2.11 is the version whose SDPA spelling, split
# sqrt scales, a bool-mask Where and an IsNaN guard, fused nowhere before canonicalization); ORT's
# transformer optimizer on the eager exports of the models it knows, one twin per distinct file.
SETS = {"": ("bert", "distilbert", "gpt2", "vit", "llama"), ".torch2.13": tuple(CASES), ".torch2.11": tuple(CASES)}


def test_corpus_is_complete():
    # Every model of each set from both exporters and each of transformers' attention paths it
    # has; ORT-optimized twins only of files that are there.
    want = {f"{m}.{i}.{e}{tag}" for tag, models in SETS.items() for m in models for i in CASES[m].impls
            for e in ("torchscript", "dynamo")}  # fmt: skip
    plain = {k for k, rec in MANIFEST.items() if "source" not in rec}
    assert plain == want
    twins = {k: rec for k, rec in MANIFEST.items() if "source" in rec}
    assert twins, "no ORT-optimized files"
    for key, rec in twins.items():
        assert key == rec["source"] + ".ort" and rec["source"] in plain
    for rec in MANIFEST.values():
        assert (CORPUS / rec["file"]).stat().st_size < 200_000


@pytest.mark.parametrize("key", sorted(MANIFEST))
def test_attention_fuses_and_matches_onnxruntime(key):
    rec = MANIFEST[key]
    model, g0, g1 = _optimized(key)
    counts = g1.op_counts()
    assert counts.get("Attention", 0) == rec["layers"], (counts, g1.meta.get("near_misses"))
    assert "Softmax" not in counts and "Expand" not in counts, counts
    # a Transpose that carries an epilogue (passes/fuse_data_epilogues.py: Swin's residual add after
    # its window reverse) is still one
    assert counts.get("Transpose", 0) + counts.get("Fused[Transpose]", 0) == TRANSPOSES[rec["model"]], counts
    if rec["model"] in DECODERS:  # rotary on Q and K of every layer, on the 3-D projections
        assert counts.get("RotaryEmbedding") == 2 * rec["layers"], counts
    feeds = CASES[rec["model"]].inputs(np.random.default_rng(7))
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds), strict=True))
    got = graphc.interpret(g1, feeds)
    for name, w in want.items():
        scale = float(np.abs(w).max())
        np.testing.assert_allclose(got[name], w, rtol=0, atol=1e-4 * scale, err_msg=f"{key}: {name}")


def _fused_counts(graph) -> dict[str, int]:
    ops: collections.Counter = collections.Counter()
    for n in graph.nodes:
        if n.op != "Fused":
            ops[n.op] += 1
            continue
        a = n.attrs
        ops[a.anchor_op or "Elementwise"] += 1
        for ep in a.epilogue:
            ops[ep.op] += 1
            # in a GEMM's epilogue, or (SwiGLU after passes/fuse_horizontal.py ran gate and up as one
            # GEMM) in the one elementwise kernel that computes silu(gate) * up
            ops["SiLU"] += ep.op == "Sigmoid" and (a.anchor_op in ("MatMul", "Gemm") or not a.anchor_op)
    return {k: ops[k] for k in COUNTED}


@pytest.mark.parametrize("key", sorted(MANIFEST))
def test_cuda_fp16_fusion_counts_are_the_same_for_every_export(key):
    from graphc.codegen.capabilities import CUDA
    from graphc.passes.target import Target

    rec = MANIFEST[key]
    model = onnx.load(str(CORPUS / rec["file"]))
    target = dataclasses.replace(Target("cuda", "fp16", False), capabilities=CUDA)
    g1 = optimize(graphc.bind_shapes(graphc.load_onnx(model), {}), OptimizeOptions(opt_level=2, target=target)).graph
    want = {k: 0 for k in COUNTED} | CUDA_FUSED[rec["model"]]
    assert _fused_counts(g1) == want, key
    # The rows a finite-fill mask (eager masks, dynamo's SDPA) leaves no key are Attention's own
    # (masked_rows "mean"); a -inf mask leaves them 0. Every layer's mask is the same kind.
    modes = {n.attrs.masked_rows for n in g1.nodes if n.op == "Attention"}
    assert len(modes) == 1, key
    # The fp16 graph still computes the model: fp16 rounding is ~1e-3 of the output's scale, a
    # wrong mask, scale or layout is O(1).
    feeds = CASES[rec["model"]].inputs(np.random.default_rng(7))
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want_out = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds), strict=True))
    got = graphc.interpret(g1, feeds)
    for name, w in want_out.items():
        err = float(np.abs(got[name].astype(np.float32) - w).max()) / float(np.abs(w).max())
        assert err < 1e-2, f"{key}: {name}: {err:.2e}"


@pytest.mark.parametrize(
    "key",
    sorted(
        k for k, rec in MANIFEST.items() if "attention_mask" in CASES[rec["model"]].inputs(np.random.default_rng(0))
    ),
)
def test_wholly_padded_rows_match_onnxruntime(key):
    """Rows whose every key is masked (a wholly padded batch entry; left padding under the
    decoders' causal mask): what each exporter's mask makes of them (the mean of V for a finite
    fill, 0 for -inf and torch's NaN guard) is what the fused graph computes."""
    rec = MANIFEST[key]
    model, _, g1 = _optimized(key)
    feeds = CASES[rec["model"]].inputs(np.random.default_rng(7))
    mask = feeds["attention_mask"].copy()
    mask[0] = 0
    mask[1, :3] = 0
    feeds["attention_mask"] = mask
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds), strict=True))
    got = graphc.interpret(g1, feeds)
    for name, w in want.items():
        assert not np.isnan(w).any(), f"{key}: {name}"
        scale = float(np.abs(w).max())
        np.testing.assert_allclose(got[name], w, rtol=0, atol=1e-4 * scale, err_msg=f"{key}: {name}")
