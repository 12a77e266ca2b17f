"""The path an fp16 sm_90 engine gives a GEMM at the M boundaries of its rules (small-M rules up to
M = 256; for 256 < M < 4096 the TMA GEMM with heuristic()'s mid-M tile rule, measured with
tools/bench_gemm_small_m.py --mid and tools/bench_gemm_sm90.py --mid: one K slice, BN 64 where it
fills the SMs best; the TMA GEMM's other rules from 4096), and the --mid sweep itself: its
candidates and their NVRTC compiles."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from graphc.codegen.families.gemm import problem_of
from graphc.ir.types import DType

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tools.bench_gemm_sm90 import context  # noqa: E402
from tools.bench_gemm_small_m import engine_kernels, main, mid_kernels  # noqa: E402

try:
    from graphc.codegen.nvrtc import nvrtc_version

    nvrtc_version()
    HAVE_NVRTC = True
except Exception:  # noqa: BLE001 - no cuda-bindings here
    HAVE_NVRTC = False
needs_nvrtc = pytest.mark.skipif(not HAVE_NVRTC, reason="needs NVRTC (cuda-bindings)")


def _engine(m: int, n: int, k: int):
    ctx = context(m, n, k, DType.float16, "mn")
    return ctx, engine_kernels(ctx, problem_of(ctx))


@pytest.mark.parametrize(
    ("m", "n", "k", "path", "bn", "splits"),
    [
        (256, 768, 768, "wgmma", 64, 4),  # small-M rule 3: wgmma, cluster split-K
        (256, 768, 3072, "tma", 128, 8),  # small-M rule 1: TMA, 8 K slices
        (257, 768, 768, "tma", 64, 1),  # mid-M tile rule: BN 64, one K slice (OVERLAP)
        (384, 768, 3072, "tma", 128, 6),  # K deep, BN 64 would leave most SMs idle: the wave model's split
        (511, 2304, 768, "tma", 128, 1),
        (512, 768, 768, "tma", 64, 1),
        (1024, 768, 768, "tma", 64, 1),
        (1024, 768, 3072, "tma", 64, 1),  # 96 tiles: one K slice
        (1536, 768, 768, "tma", 128, 1),  # 12 x 6 = 72 BN 128 tiles: one wave as BN 64's 144 need two
        (1536, 2304, 768, "tma", 128, 1),  # 216 BN 128 tiles: two waves, as BN 192's 144
        (4095, 768, 768, "tma", 192, 1),
        (4096, 768, 768, "tma", 192, 1),  # SELECT_MIN_M: the TMA GEMM's large-M rules
        (4096, 768, 3072, "tma", 192, 1),
    ],
)
def test_engine_path_at_the_boundaries(m, n, k, path, bn, splits):
    _, ks = _engine(m, n, k)
    p = ks[0].params
    assert (p["path"], p["BN"], p["SPLITS"]) == (path, bn, splits)
    assert (p.get("requires_arch") == "sm_90a") is (path != "mma")
    assert len(ks) == (2 if path == "tma" and splits > 1 else 1)  # TMA split-K: the reduce kernel


@pytest.mark.parametrize(
    ("shapes", "bn", "schedule"),
    [
        ([(3, 1024, 768), (3, 768, 768)], 192, "OVERLAP"),  # BERT's Q/K/V at batch 8: 3072 rows in all
        ([(2, 512, 768), (2, 768, 768)], 64, "OVERLAP"),  # 1024 rows in all: as 1024x768x768
        ([(3, 1400, 768), (3, 768, 768)], None, None),  # 4200 rows: past the mid-M rule
    ],
)
def test_batched_gemm_counts_every_batch(shapes, bn, schedule):
    """The mid-M rules were measured on single GEMMs; a batched one counts all its rows."""
    from graphc.codegen.families.gemm import standalone_context

    ctx = standalone_context("MatMul", shapes, DType.float16)
    p = engine_kernels(ctx, problem_of(ctx))[0].params
    assert p["path"] == "tma" and p["SPLITS"] == 1
    if bn is None:
        assert p["BN"] != 64
    else:
        assert p["BN"] == bn and p.get(schedule) == 1


def test_mid_tile_rule_schedules():
    """The mid-M rule's schedule: OVERLAP, with a Gelu epilogue the per-warp one; N not a multiple
    of 8 or past 3072 is outside the rule."""
    from graphc.codegen.families import gemm_sm90 as g

    gelu = context(1024, 3072, 768, DType.float16, "k", "bias-gelu")
    p = g.heuristic(problem_of(gelu))
    assert (p["BN"], p["SPLITS"], p.get("WARP_EPI"), p.get("OVERLAP")) == (192, 1, 1, None)
    res = context(1024, 768, 3072, DType.float16, "k", "bias-res")
    p = g.heuristic(problem_of(res))
    assert (p["BN"], p["SPLITS"], p.get("OVERLAP")) == (64, 1, 1)
    assert g.mid_tile_bn(problem_of(context(1024, 770, 768, DType.float16, "k"))) is None  # N % 8
    assert g.mid_tile_bn(problem_of(context(1024, 4096, 768, DType.float16, "k"))) is None  # N past 3072


def test_mid_candidates_cover_every_path_and_mark_the_engine():
    ctx = context(1536, 768, 768, DType.float16, "mn")
    cands = mid_kernels(ctx, problem_of(ctx))
    labels = [lab for lab, _, _ in cands]
    # M = 1536 runs the TMA GEMM's heuristic by the mid-M rule: the first candidate is the engine's
    assert labels[0] == "tma*=engine" and any(lab.startswith("tma-bn") for lab in labels)
    assert any(lab.startswith("wgmma") for lab in labels) and "mma" in labels
    assert sum(lab.endswith("engine") for lab in labels) == 1
    sources = [tuple(k.source for k in ks) for _, _, ks in cands]
    assert len(set(sources)) == len(sources)  # no kernel timed twice
    paths = {ks[0].params["path"] for _, _, ks in cands}
    assert paths == {"tma", "wgmma", "mma"}
    for lab, _, ks in cands:  # split TMA variants carry the reduce kernel
        if lab.startswith("tma") and ks[0].params["SPLITS"] > 1:
            assert len(ks) == 2 and ks[0].workspace_bytes == ks[0].params["SPLITS"] * 1536 * 768 * 4


@needs_nvrtc
def test_mid_sweep_compiles_for_sm90a(tmp_path, capsys):
    # the shape with the fewest variants (10): the TMA heuristic (BN 128 OVERLAP), BN 64 unsplit and
    # OVERLAP, BN 128 / 192 / 256 unsplit, BN 192 OVERLAP, wgmma 128x256 / 128x128, mma.sync
    assert main(["--mid", "--compile-only", "--shape", "2560x3072x768", "--cache", str(tmp_path)]) == 0
    assert "# compiled 10 kernels" in capsys.readouterr().out
    assert len(list(tmp_path.glob("*.cubin"))) == 10


def test_bn64_launches_have_a_cost():
    """graphc/bucket_cost.py prices every launch of a plan with the tile model: a BN 64 one too."""
    from graphc.bucket_cost import launch_seconds

    ctx, ks = _engine(1024, 768, 768)
    assert ks[0].params["BN"] == 64
    narrow = launch_seconds(ctx, ks[0])
    wide = launch_seconds(_engine(4096, 768, 768)[0], _engine(4096, 768, 768)[1][0])
    assert 0 < narrow < wide
