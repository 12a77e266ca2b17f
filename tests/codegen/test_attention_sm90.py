"""The sm_90a wgmma flash-attention kernel without a GPU: which problems the selection gives it, and
that its variants (head dims 64 / 128, fp16 / bf16, each tile, causal and windowed bands, bool and
additive masks, softcap, nonpad_kv_seqlen, GQA, 3-D and 4-D layouts) compile through NVRTC for
sm_90a into SASS with HGMMA for both products (S = Q K^T from shared memory; O += P V with P from
registers and V transposed) and no local memory (no register spills).

cuobjdump comes from the `nvidia-cuda-cuobjdump` package (the test extra); without it the SASS test
is skipped with that reason.
"""

from __future__ import annotations

import re
import subprocess
from typing import Any

import pytest

from graphc.codegen.families.attention import (
    SM90_SWEEP,
    problem_of,
    select_sm90,
    sm90_candidates,
    sm90_heuristic,
    standalone_context,
    valid,
)
from graphc.codegen.kernel import family_for
from graphc.errors import CompileError
from graphc.ir.types import DType
from graphc.ops.registry import get_op
from helpers import cuobjdump_path

try:
    from graphc.codegen.nvrtc import nvrtc_version

    nvrtc_version()
    HAVE_NVRTC = True
except Exception:
    HAVE_NVRTC = False

CUOBJDUMP = cuobjdump_path()
F16, BF16 = DType.float16, DType.bfloat16


def _ctx(shape, dtype=F16, extra=(), params=None, **attrs):
    """A 4-D (b, h, s, d) problem, or 3-D when attrs name the heads; extra: (shape, dtype) inputs
    after Q, K, V (the mask, then None, None, nonpad_kv_seqlen)."""
    return standalone_context(
        "Attention", [(shape, dtype)] * 3 + list(extra), get_op("Attention").attrs(**attrs), params=params
    )


def test_selection_takes_head_dims_64_and_128_in_half_precision():
    assert select_sm90(_ctx((2, 12, 128, 64)))[0].params["path"] == "sm90"
    assert select_sm90(_ctx((2, 12, 197, 128), BF16, is_causal=1))[0].params["path"] == "sm90"
    for shape, dt in (((2, 12, 128, 80), F16), ((2, 12, 128, 32), F16), ((2, 12, 128, 64), DType.float32)):
        assert select_sm90(_ctx(shape, dt)) == []  # the default kernels ("flash", "simple") instead
    # forced parameters are the caller's (the tuner's): no substitution
    assert select_sm90(_ctx((2, 12, 128, 64), params={"path": "flash", "BM": 64, "BN": 64, "WARPS": 4})) == []
    # without the sm_90 plan, the family's default is unchanged
    ctx = _ctx((2, 12, 128, 64))
    assert family_for(ctx).generate(ctx)[0].params["path"] == "flash"


def test_sm90_parameters():
    prob = problem_of(_ctx((32, 12, 197, 64)))
    cands = sm90_candidates(prob)
    assert {(p["WG"], p["BN"]) for p in cands} == {(1, 64), (2, 64), (1, 128), (2, 128)}
    assert all(p["STAGES"] == 2 for p in cands)  # 197 keys never fit one tile
    # one stage only where every key fits one tile
    assert not valid(prob, {"path": "sm90", "WG": 1, "BN": 128, "STAGES": 1})
    assert valid(problem_of(_ctx((32, 12, 128, 64))), {"path": "sm90", "WG": 1, "BN": 128, "STAGES": 1})
    assert len(sm90_candidates(problem_of(_ctx((1, 2, 300, 128))))) == 4  # head dim 128: every tile
    assert sm90_candidates(problem_of(_ctx((1, 2, 300, 80)))) == []
    # one warpgroup a CTA; registers capped for as many CTAs an SM as shared memory holds (at most 3)
    p = sm90_heuristic(problem_of(_ctx((32, 12, 128, 64))))
    assert (p["WG"], p["BN"], p["STAGES"], p["MINB"]) == (1, 128, 1, 3)  # 41 KB: 5 CTAs by shared memory
    p = sm90_heuristic(problem_of(_ctx((32, 12, 197, 64))))
    assert (p["WG"], p["BN"], p["STAGES"], p["MINB"]) == (1, 128, 2, 3)  # 73 KB: 3
    p = sm90_heuristic(problem_of(_ctx((1, 12, 512, 128))))
    assert (p["WG"], p["BN"], p["STAGES"], p["MINB"]) == (1, 64, 2, 2)  # 82 KB: 2
    # long sequences with CTAs enough for every SM: two warpgroups (K and V read once for 128 rows)
    p = sm90_heuristic(problem_of(_ctx((8, 12, 1024, 64), is_causal=1)))
    assert (p["WG"], p["BN"], p["MINB"]) == (2, 128, 2)
    p = sm90_heuristic(problem_of(_ctx((2, 32, 2048, 128))))
    assert (p["WG"], p["BN"], p["MINB"]) == (2, 64, 2)
    assert sm90_heuristic(problem_of(_ctx((1, 12, 1024, 64), is_causal=1)))["WG"] == 1  # 96 CTAs of two
    # a cap below the live accumulators is not offered (ptxas fails to allocate)
    prob = problem_of(_ctx((1, 12, 512, 128)))
    assert not valid(prob, {"path": "sm90", "WG": 1, "BN": 128, "STAGES": 2, "MINB": 4})
    assert valid(prob, {"path": "sm90", "WG": 1, "BN": 128, "STAGES": 2, "MINB": 3})
    assert all(valid(prob, p) for p in sm90_candidates(prob, SM90_SWEEP))
    # the overlapped schedule only where every key fits the two stages
    vit = problem_of(_ctx((32, 12, 197, 64)))
    assert valid(vit, {"path": "sm90", "WG": 1, "BN": 128, "STAGES": 2, "OVERLAP": 1})
    assert not valid(vit, {"path": "sm90", "WG": 1, "BN": 64, "STAGES": 2, "OVERLAP": 1})
    with pytest.raises(CompileError, match="sm90"):
        ctx = _ctx((1, 2, 64, 80), params={"path": "sm90", "WG": 1, "BN": 64, "STAGES": 1})
        family_for(ctx).generate(ctx)


def _variants() -> list[tuple[str, Any]]:
    mask_b = ((2, 1, 1, 200), DType.bool)
    return [
        # the defaults (sm90_heuristic) of issue 10's cases: BERT s128, ViT s197, GPT-2 causal s128
        ("bert-default", _ctx((32, 12, 128, 64))),
        ("vit-default", _ctx((32, 12, 197, 64))),
        ("gpt2-default", _ctx((32, 12, 128, 64), is_causal=1)),
        # the overlapped schedule (both tiles up front): head dims 64 / 128, with a mask and the band
        (
            "vit-overlap-w1n128",
            _ctx((32, 12, 197, 64), params={"path": "sm90", "WG": 1, "BN": 128, "STAGES": 2, "OVERLAP": 1}),
        ),
        (
            "d128-bf16-overlap-causal-bool-w2n64",
            _ctx(
                (2, 4, 100, 128),
                BF16,
                extra=[((2, 1, 1, 100), DType.bool)],
                is_causal=1,
                params={"path": "sm90", "WG": 2, "BN": 64, "STAGES": 2, "OVERLAP": 1},
            ),
        ),
        ("d64-fp16-w1n128", _ctx((2, 12, 128, 64), params={"path": "sm90", "WG": 1, "BN": 128, "STAGES": 1})),
        (
            "d64-bf16-causal-w2n64",
            _ctx((2, 12, 197, 64), BF16, is_causal=1, params={"path": "sm90", "WG": 2, "BN": 64, "STAGES": 2}),
        ),
        ("d128-fp16-w2n128", _ctx((1, 4, 300, 128), params={"path": "sm90", "WG": 2, "BN": 128, "STAGES": 2})),
        (
            "d128-fp16-bool-w2n64",
            _ctx((2, 4, 200, 128), extra=[mask_b], params={"path": "sm90", "WG": 2, "BN": 64, "STAGES": 2}),
        ),
        (
            "d128-bf16-add-softcap-w1n64",
            _ctx(
                (2, 4, 200, 128),
                BF16,
                extra=[((200, 200), BF16)],
                softcap=2.0,
                params={"path": "sm90", "WG": 1, "BN": 64, "STAGES": 2},
            ),
        ),
        # masked_rows "mean" (a row with no kept key stores the mean of V): the default BERT
        # kernel, the overlapped causal one with a bool mask, two warpgroups with GQA and nonpad
        ("bert-default-mean", _ctx((32, 12, 128, 64), extra=[((32, 1, 1, 128), DType.bool)], masked_rows="mean")),
        (
            "d128-bf16-overlap-causal-bool-w2n64-mean",
            _ctx(
                (2, 4, 100, 128),
                BF16,
                extra=[((2, 1, 1, 100), DType.bool)],
                is_causal=1,
                masked_rows="mean",
                params={"path": "sm90", "WG": 2, "BN": 64, "STAGES": 2, "OVERLAP": 1},
            ),
        ),
        (
            "d64-fp16-3d-gqa-nonpad-w2n128-mean",
            standalone_context(
                "Attention",
                [
                    ((3, 300, 12 * 64), F16),
                    ((3, 300, 4 * 64), F16),
                    ((3, 300, 4 * 64), F16),
                    None,
                    None,
                    None,
                    ((3,), DType.int64),
                ],
                get_op("Attention").attrs(q_num_heads=12, kv_num_heads=4, is_causal=1, masked_rows="mean"),
                params={"path": "sm90", "WG": 2, "BN": 128, "STAGES": 2},
            ),
        ),
        (
            "d64-fp16-3d-gqa-window-nonpad-w2n128",
            standalone_context(
                "Attention",
                [
                    ((3, 300, 12 * 64), F16),
                    ((3, 300, 4 * 64), F16),
                    ((3, 300, 4 * 64), F16),
                    None,
                    None,
                    None,
                    ((3,), DType.int64),
                ],
                get_op("Attention").attrs(q_num_heads=12, kv_num_heads=4, is_causal=1, left_window_size=100),
                params={"path": "sm90", "WG": 2, "BN": 128, "STAGES": 2},
            ),
        ),
    ]


def _opcodes(text: str) -> list[str]:
    return re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)[^;]*;", text)


@pytest.mark.skipif(not HAVE_NVRTC, reason="needs NVRTC (cuda-bindings)")
@pytest.mark.skipif(CUOBJDUMP is None, reason="cuobjdump not found: pip install nvidia-cuda-cuobjdump")
@pytest.mark.parametrize(("name", "ctx"), _variants(), ids=[n for n, _ in _variants()])
def test_sm90_variant_compiles_to_hgmma(tmp_path, name, ctx):
    from graphc.codegen.nvrtc import compile_cubin

    (k,) = family_for(ctx).generate(ctx) if ctx.params else select_sm90(ctx)
    assert k.params["path"] == "sm90" and k.params["requires_arch"] == "sm_90a"
    f = tmp_path / f"{name}.cubin"
    f.write_bytes(compile_cubin(k.source, k.name, "sm_90a"))
    sass = subprocess.run([CUOBJDUMP, "-sass", str(f)], capture_output=True, text=True, check=True).stdout
    # S: D / 16 shared-memory products of 64 x BN; O: BN / 16 register-A products of 64 x D with V
    # transposed; each issued back to back (one wgmma batch, no WARPGROUP.ARRIVE between them: not
    # serialized; the last tile's path, which skips k16 steps, may issue them one by one)
    d, bn = k.params["d"], k.params["BN"]
    runs, run = [], []
    for ln in sass.splitlines():
        if "HGMMA" in ln:
            run.append(ln)
        elif "WARPGROUP" in ln:
            runs, run = runs + [run], []
    runs.append(run)
    qk = f"HGMMA.64x{bn}x16"
    pv = f"HGMMA.64x{d}x16"
    lines = [ln for r in runs for ln in r]
    assert sum(qk in ln and "tnspB" not in ln for ln in lines) >= d // 16, lines
    assert sum(pv in ln and "tnspB" in ln for ln in lines) >= bn // 16, lines
    if k.params.get("OVERLAP") and k.params.get("MINB"):
        # the overlapped schedule under a register cap: ptxas serializes its wgmmas (C7512,
        # "insufficient register resources"); measured the fastest anyway (ViT s197, H200)
        return
    assert any(len(r) == d // 16 and all(qk in ln and "tnspB" not in ln for ln in r) for r in runs), runs
    assert any(len(r) == bn // 16 and all(pv in ln and "tnspB" in ln for ln in r) for r in runs), runs
    ops = set(_opcodes(sass))
    assert not {o for o in ops if o.startswith(("LDL", "STL"))}, "local memory (register spills)"


def test_masked_rows_mean_is_a_cold_path_of_its_own():
    # "zero" is the kernel as it was (same source: same digest, same cubin); "mean" adds one
    # block-wide test and the mean of V behind it, in the same shared memory and grid.
    mask = [((32, 1, 1, 128), DType.bool)]
    (zero,) = select_sm90(_ctx((32, 12, 128, 64), extra=mask))
    (explicit,) = select_sm90(_ctx((32, 12, 128, 64), extra=mask, masked_rows="zero"))
    (mean,) = select_sm90(_ctx((32, 12, 128, 64), extra=mask, masked_rows="mean"))
    assert explicit.source == zero.source and "__syncthreads_or" not in zero.source
    assert mean.source.count("__syncthreads_or") == 1 and "r < 128;" in mean.source
    assert (mean.shared_bytes, mean.grid, mean.block) == (zero.shared_bytes, zero.grid, zero.block)
    assert mean.params == zero.params
