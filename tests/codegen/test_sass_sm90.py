"""The sm_90 GEMM cubins, disassembled without a GPU: the TMA GEMM uses HGMMA (warpgroup MMA) fed
by UTMALDG (TMA loads), has no local-memory traffic (no register spills), and an sm_90 engine of a
transformer-sized MLP runs its GEMMs on it.

cuobjdump comes from the `nvidia-cuda-cuobjdump` package (the test extra); without it the test is
skipped with that reason.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

from graphc.codegen.families import gemm_sm90
from graphc.codegen.families.gemm import standalone_context
from graphc.codegen.nvrtc import compile_cubin
from graphc.ir.types import DType
from graphc.ops.fused import ACC, IN, OP, EpilogueOp
from graphc.ops.registry import get_op
from helpers import cuobjdump_path, residual_mlp_model  # noqa: E402

CUOBJDUMP = cuobjdump_path()
needs_cuobjdump = pytest.mark.skipif(
    CUOBJDUMP is None, reason="cuobjdump not found: pip install nvidia-cuda-cuobjdump (the test extra)"
)


def sass(cubin: bytes, tmp_path: Path, name: str) -> str:
    f = tmp_path / f"{name}.cubin"
    f.write_bytes(cubin)
    out = subprocess.run([CUOBJDUMP, "-sass", str(f)], capture_output=True, text=True, check=True)
    return out.stdout


def _opcodes(text: str) -> set[str]:
    return set(re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", text))


def _ctx(m: int, n: int, k: int, dtype: DType, b_layout: str, epilogue: bool = False):
    shapes = [(m, k), (n, k) if b_layout == "k" else (k, n)]
    kw = {}
    if b_layout == "k":
        kw = {"domain": "graphc", "attrs": get_op("MatMul", "graphc").attrs(trans_b=1)}
    if epilogue:  # Gelu(acc + bias) + residual
        shapes += [(n,), (m, n)]
        kw["n_anchor"] = 2
        kw["epilogue"] = (
            EpilogueOp("Add", get_op("Add").attrs(), (ACC, IN(2))),
            EpilogueOp("Gelu", get_op("Gelu").attrs(), (OP(0),)),
            EpilogueOp("Add", get_op("Add").attrs(), (OP(1), IN(3))),
        )
        kw["outputs"] = (OP(2),)
    return standalone_context("MatMul", shapes, dtype, **kw)


# BERT-base / GPT-2 / ViT-B linear layers at batch 32 and a square GEMM, both B layouts, both dtypes
SHAPES = [
    (4096, 768, 768, DType.float16, "mn", False),
    (4096, 3072, 768, DType.float16, "mn", True),
    (6304, 768, 3072, DType.bfloat16, "k", False),
    (4096, 2304, 768, DType.bfloat16, "mn", True),
    (4096, 4096, 4096, DType.float16, "k", False),
]


# forced variants: ping-pong consumers, split-K
FORCED = [
    (4096, 768, 768, DType.float16, "mn", True, {"BN": 192, "PINGPONG": 1}),
    (128, 768, 3072, DType.bfloat16, "k", True, {"BN": 128, "PINGPONG": 1}),
    (197, 2304, 768, DType.float16, "mn", False, {"BN": 256, "SPLITS": 3}),
]


@needs_cuobjdump
@pytest.mark.parametrize(("m", "n", "k", "dtype", "b_layout", "epi", "params"), [(*s, None) for s in SHAPES] + FORCED)
def test_tma_gemm_sass(tmp_path, m, n, k, dtype, b_layout, epi, params):
    ks = gemm_sm90.generate(_ctx(m, n, k, dtype, b_layout, epi), params)
    main = ks[0]
    assert main.params["requires_arch"] == "sm_90a"
    text = sass(compile_cubin(main.source, main.name, "sm_90a"), tmp_path, main.name)
    ops = _opcodes(text)
    assert "HGMMA" in ops, "no warpgroup MMA in the TMA GEMM"
    assert "UTMALDG" in ops, "no TMA load in the TMA GEMM"
    assert "USETMAXREG" in ops, "no register reallocation between producer and consumers"
    assert not ops & {"LDL", "STL"}, "local-memory traffic (register spills)"
    assert "HMMA" not in ops
    # the vector epilogue: 16-byte output stores (8 fp16/bf16 columns), none narrower
    stores = set(re.findall(r"\bSTG\.E(?:\.(\d+))?", text))
    if main.params["VEC_EPI"]:
        assert stores == {"128"}, f"global stores {stores}: not only 16-byte ones"
    else:
        assert main.params["SPLITS"] > 1 and stores == {""}, (main.params, stores)  # fp32 partials


@needs_cuobjdump
def test_sm90_engine_gemms_use_tma(tmp_path):
    """An engine for sm_90 of an MLP block at batch 32 x 128 tokens: every GEMM cubin has HGMMA
    and UTMALDG."""

    import graphc

    rng = np.random.default_rng(0)
    m, d, h = 4096, 768, 3072
    model, _ = residual_mlp_model(m, d, h, rng, scaled=False)
    eng = graphc.compile(model, target="cuda", precision="fp16", arch=["sm_90"], cache_dir=str(tmp_path / "cache"))
    gemms = [ln for s in eng.plan.steps for ln in s.launches if ln.family == "gemm"]
    assert len(gemms) == 2 and all(ln.params.get("path") == "tma" for ln in gemms), [ln.params for ln in gemms]
    for ln in gemms:
        ops = _opcodes(sass(eng.kernels.cubins["sm_90"][ln.digest], tmp_path, ln.kernel))
        assert {"HGMMA", "UTMALDG"} <= ops, ln.kernel
