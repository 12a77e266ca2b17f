"""Kernel launches of CUDA fp16 engines (sm_90 plans, no GPU and no NVRTC needed) of corpus files,
exactly: the total, and every launch that is not a GEMM, conv, attention, norm, pool or rotary
kernel, by step kind. A Cast, a mask broadcast or an input transpose that comes back as a kernel
of its own fails here (docs/results/launch_census.md lists what remains and why).

The exports are tiny configs (two layers, widths 8-64) from the TorchScript and dynamo exporters
of torch 2.11 and from ONNX Runtime's transformer optimizer (tests/corpus/manifest.json).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tools.count_launches import count_model

CORPUS = Path(__file__).resolve().parents[1] / "corpus"
LAYERS = 2  # attention layers of each export

# Kernels whose work is the model's: every other launch is counted by kind below.
CORE = frozenset(
    {
        "Fused[MatMul]",
        "MatMul",
        "graphc.MatMul",
        "Fused[Gemm]",
        "Gemm",
        "Attention",
        "LayerNormalization",
        "RMSNormalization",
        "Fused[LayerNormalization]",
        "Fused[RMSNormalization]",
        "graphc.ConvNHWC",
        "Fused[ConvNHWC]",
        "RotaryEmbedding",
    }
)
# BERT: the token-type lookup; the word lookup adding it and the positions; the mask's cast to bool.
# (The rows these exports' finite-fill mask, finfo.min, leaves no key are the mean of V: the
# Attention kernels store it themselves, masked_rows "mean", no launch of its own.)
_BERT = {"Gather": 1, "Fused[Gather]": 1, "Fused[Elementwise]": 1}
_GPT2 = {"Fused[Gather]": 1, "Fused[Elementwise]": 1}  # tokens + positions; the mask's cast to bool
# LLaMA: the token lookup, the mask's cast to bool, silu(gate) * up of each layer
_LLAMA = {"Gather": 1, "Fused[Elementwise]": 1 + LAYERS}
_VIT = {"Fused[Transpose]": 1, "Fused[Concat]": 1}  # image cast + NHWC; [cls; patches] + positions
# Swin: each torch.roll one Gather (passes/canonicalize_gathers.py), the window partitions and
# reverses real Transposes, the residual add in the store of the unshifted block's window reverse
# and of the shifted block's roll back, the image cast in the NHWC transpose
_SWIN = {"Transpose": 3, "Gather": 3, "Fused[Transpose]": 2, "Fused[Gather]": 1}
# (file, total launches, the non-core launches by kind)
EXPECTED = [
    ("bert.eager.torchscript.torch2.11", 18, _BERT),
    ("bert.eager.dynamo.torch2.11", 18, _BERT),
    ("bert.sdpa.dynamo.torch2.11", 18, _BERT),
    ("gpt2.eager.torchscript.torch2.11", 17, _GPT2),
    ("gpt2.eager.dynamo.torch2.11", 17, _GPT2),
    ("vit.eager.torchscript.torch2.11", 22, _VIT),
    ("vit.eager.dynamo.torch2.11", 22, _VIT),
    ("vit.eager.dynamo.torch2.11.ort", 22, _VIT),
    ("clip_vision.eager.dynamo.torch2.11", 22, _VIT),
    ("llama.eager.dynamo.torch2.11", 25, _LLAMA),
    ("swin.eager.torchscript.torch2.11", 26, _SWIN),
    ("swin.eager.dynamo.torch2.11", 26, _SWIN),
]


@pytest.mark.parametrize(("key", "total", "rest"), EXPECTED, ids=[e[0] for e in EXPECTED])
def test_launches_of_corpus_exports(key, total, rest):
    launches, _, by_kind, _ = count_model(CORPUS / f"{key}.onnx", {}, arch="sm_90", precision="fp16", nvrtc=False)
    assert {k: n for k, n in by_kind.items() if k not in CORE} == rest, by_kind
    assert launches == total, by_kind
