"""The partial-wave cost of codegen/families/conv_sm90.py: waves(), the TMA GEMM tile of a 1x1 conv
(tma_heuristic, which with a whole-wave tail is gemm_sm90.heuristic exactly), and the implicit GEMM's
choice, which changes only where a launch has more tiles than SMs (batch-1 rules as measured)."""

from __future__ import annotations

import pytest

from graphc.codegen.families import conv_sm90, gemm_sm90
from graphc.codegen.families.conv import ConvGeometry
from graphc.codegen.families.gemm import SM_COUNT, OperandLayout, Problem
from graphc.ir.types import DType

# ResNet-50's distinct convs: (input size, Cin, Cout, kernel, stride)
LAYERS = [
    (56, 64, 64, 1, 1), (56, 64, 64, 3, 1), (56, 64, 256, 1, 1), (56, 256, 64, 1, 1), (56, 256, 128, 1, 1),
    (56, 128, 128, 3, 2), (56, 256, 512, 1, 2), (28, 128, 512, 1, 1), (28, 512, 128, 1, 1), (28, 128, 128, 3, 1),
    (28, 512, 256, 1, 1), (28, 256, 256, 3, 2), (28, 512, 1024, 1, 2), (14, 256, 1024, 1, 1), (14, 1024, 256, 1, 1),
    (14, 256, 256, 3, 1), (14, 1024, 512, 1, 1), (14, 512, 512, 3, 2), (14, 1024, 2048, 1, 2), (7, 512, 2048, 1, 1),
    (7, 2048, 512, 1, 1), (7, 512, 512, 3, 1),
]  # fmt: skip


def _geometry(n: int, hw: int, cin: int, cout: int, k: int, s: int) -> ConvGeometry:
    out = (hw + 2 * (k // 2) - k) // s + 1
    pad = k // 2
    return ConvGeometry(
        "nhwc", n, cin, cout, 1, (hw, hw), (out, out), (k, k), (s, s), (pad, pad), (1, 1), DType.float16
    )


def _problem(g: ConvGeometry) -> Problem:
    m = g.m
    return Problem(
        dtype=DType.float16, M=m, N=g.k, K=g.c, a=OperandLayout(m, g.c, 1, []), b=OperandLayout(g.k, g.c, 1, []),
        batch_dims=[], out_shape=(g.n, *g.out_spatial, g.k), n_anchor=2, epilogue=(), outputs=(),
    )  # fmt: skip


def test_waves_counts_a_tail_as_part_of_a_wave(monkeypatch):
    monkeypatch.setattr(conv_sm90, "TAIL_BASE", 0.6)
    assert conv_sm90.waves(1) == conv_sm90.waves(SM_COUNT) == 1.0  # at most one wave: one, as before
    assert conv_sm90.waves(2 * SM_COUNT) == 2.0 and conv_sm90.waves(3 * SM_COUNT) == 3.0
    t = conv_sm90.TAIL_BASE
    assert conv_sm90.waves(SM_COUNT + 4) == pytest.approx(1 + t + (1 - t) * 4 / SM_COUNT)
    assert conv_sm90.waves(2 * SM_COUNT - 1) < 2.0
    # monotonic: more tiles never cost fewer waves
    costs = [conv_sm90.waves(u) for u in range(1, 5 * SM_COUNT)]
    assert all(b >= a for a, b in zip(costs, costs[1:], strict=False))


@pytest.mark.parametrize("batch", [1, 8, 16, 20, 22, 24, 32])
def test_with_whole_wave_tails_the_1x1_tile_is_gemm_sm90s(batch, monkeypatch):
    monkeypatch.setattr(conv_sm90, "TAIL_BASE", 1.0)  # a partial wave costs a whole one: ceil
    for hw, cin, cout, k, s in LAYERS:
        if k != 1 or s != 1:
            continue
        prob = _problem(_geometry(batch, hw, cin, cout, k, s))
        want = gemm_sm90.heuristic(prob)
        got = conv_sm90.tma_heuristic(prob)
        assert {k: got[k] for k in ("BN", "SPLITS", "STAGES")} == {k: want[k] for k in ("BN", "SPLITS", "STAGES")}


@pytest.mark.parametrize("batch", [1, 2])
def test_at_batch_1_and_2_the_partial_wave_cost_changes_nothing(batch, monkeypatch):
    # the batch-1 rules were measured with whole waves; these choices fit one wave or are far past it
    picks = {}
    for tail in (1.0, 0.6, 0.3):
        monkeypatch.setattr(conv_sm90, "TAIL_BASE", tail)
        picks[tail] = [
            conv_sm90.tma_heuristic(_problem(g)) if k == 1 and s == 1 else conv_sm90.igemm_heuristic(g)
            for hw, cin, cout, k, s in LAYERS
            for g in [_geometry(batch, hw, cin, cout, k, s)]
        ]
    assert picks[1.0] == picks[0.6] == picks[0.3]


def test_batch_22_keeps_batch_20s_tiles_where_a_few_tiles_spill_over(monkeypatch):
    # 14x14, 256 -> 1024 (1x1): batch 20 is 31 row tiles x 4 of BN 256 = 124 (one wave); batch 22 is
    # 34 x 4 = 136, four over. Counted as two whole waves the heuristic fled to BN 192 (204 tiles);
    # with the tail at its measured cost BN 256 stays
    g20, g22 = _geometry(20, 14, 256, 1024, 1, 1), _geometry(22, 14, 256, 1024, 1, 1)
    for tail in (1.0, 0.3):
        monkeypatch.setattr(conv_sm90, "TAIL_BASE", tail)
        assert conv_sm90.tma_heuristic(_problem(g20))["BN"] == 256  # one wave: the tail cost plays no part
    monkeypatch.setattr(conv_sm90, "TAIL_BASE", 1.0)
    assert conv_sm90.tma_heuristic(_problem(g22))["BN"] == 192  # 204 tiles: "2 waves" of thinner tiles
    monkeypatch.setattr(conv_sm90, "TAIL_BASE", 0.3)
    assert conv_sm90.tma_heuristic(_problem(g22))["BN"] == 256  # 136 tiles: a wave and a cheap tail
