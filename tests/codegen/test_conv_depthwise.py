"""Depthwise conv kernels without a GPU: the register-blocked strips (QT output pixels along W per
thread) render and compile with NVRTC for the geometries of ConvNeXt-T and MobileNetV2 and for the
odd cases (dilation, a channel multiplier, W not a multiple of QT, a channel tail), and the launch
covers every strip exactly once. Numerics are in test_conv_gpu.py (marker gpu)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from graphc.codegen.families import conv as conv_family
from graphc.codegen.nvrtc import compile_cubin
from graphc.errors import CompileError
from tests.codegen.test_conv import ARCHS, conv_graph, generate

# (id, dtype, (n, h, w, c), (k, r, s), kwargs, params forced or None)
CASES = [
    *[
        (f"convnext-c{c}-n{n}", np.float16, (n, hw, hw, c), (c, 7, 7), {"pad": 3}, None)
        for c, hw in ((96, 56), (192, 28), (384, 14), (768, 7))
        for n in (32, 1)
    ],
    ("mbv2-c144-s1", np.float16, (32, 56, 56, 144), (144, 3, 3), {"pad": 1}, None),
    ("mbv2-c144-s2", np.float16, (32, 56, 56, 144), (144, 3, 3), {"pad": 1, "stride": 2}, None),
    ("mbv2-c960-s1", np.float16, (32, 7, 7, 960), (960, 3, 3), {"pad": 1}, None),
    ("mbv2-c960-s2", np.float16, (32, 14, 14, 960), (960, 3, 3), {"pad": 1, "stride": 2}, None),
    ("dil2", np.float16, (2, 13, 13, 32), (32, 3, 3), {"pad": 2, "dil": 2}, {"qt": 4}),
    ("dil2-s2-5x5", np.float16, (2, 15, 15, 32), (32, 5, 5), {"pad": 4, "dil": 2, "stride": 2}, {"qt": 3}),
    ("mult2-f32", np.float32, (1, 8, 8, 8), (16, 5, 5), {"pad": 2}, {"qt": 3}),
    ("odd-w7", np.float16, (3, 9, 7, 64), (64, 3, 3), {"pad": 1}, {"qt": 4}),
    ("odd-w13-s2", np.float16, (2, 11, 13, 64), (64, 3, 3), {"pad": 1, "stride": 2}, {"qt": 4}),
    ("tail-c17", np.float16, (2, 9, 9, 17), (17, 3, 3), {"pad": 1}, {"qt": 3, "vc": 8}),
    ("f64", np.float64, (2, 13, 13, 96), (96, 7, 7), {"pad": 3}, {"qt": 5}),
    ("bf16", "bfloat16", (2, 13, 13, 96), (96, 3, 3), {"pad": 1}, {"qt": 6}),
]


def _dtype(d):
    from graphc.ir.types import DType

    return DType.bfloat16.numpy if d == "bfloat16" else d


def _depthwise(dtype, xs, wk, kw, params=None):
    c = xs[3]
    k, r, s = wk
    g = conv_graph(_dtype(dtype), xs, (k, r, s, 1), group=c, **kw)
    _, _, (src,) = generate(g, params=params)
    return src


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_depthwise_strips_compile_and_cover(case):
    cid, dtype, xs, wk, kw, forced = case
    src = _depthwise(dtype, xs, wk, kw, forced)
    p = src.params
    assert p["variant"] == "depthwise"
    n, h, w, c = xs
    k, r, s = wk
    st, pad, dil = kw.get("stride", 1), kw["pad"], kw.get("dil", 1)
    pp = (h + 2 * pad - dil * (r - 1) - 1) // st + 1
    q = (w + 2 * pad - dil * (s - 1) - 1) // st + 1
    qt = p["qt"]
    if forced:
        assert qt == forced["qt"] and p["vc"] == forced.get("vc", p["vc"])
    # every strip of QT pixels (the last of a row may be short) has exactly one thread row
    assert p["strips"] == n * pp * math.ceil(q / qt)
    assert src.block == (p["cvb"], p["pix"], 1)
    assert (src.grid[0] - 1) * p["pix"] < p["strips"] <= src.grid[0] * p["pix"]
    cv = math.ceil(k / p["vc"])
    assert (src.grid[1] - 1) * p["cvb"] < cv <= src.grid[1] * p["cvb"]
    assert p["tail"] == (k % p["vc"] != 0)
    assert f"QT = {qt}" in src.source
    if p["vc"] > 1 and not p["tail"]:  # the epilogue into registers, one vector store a pixel
        assert f"{src.name}_epv(v, o + e, in3, &st0.e[e]);" in src.source
        assert f"*reinterpret_cast<gc_out0_{src.name}*>(out0 + o) = st0;" in src.source
    else:
        assert f"{src.name}_epi(v, (pix0 + t) * K + k, in3, out0);" in src.source
    for arch in ARCHS if cid in ("convnext-c96-n32", "mbv2-c144-s2", "tail-c17", "bf16") else ARCHS[-1:]:
        assert compile_cubin(src.source, src.name, arch)


@pytest.mark.parametrize(
    "xs,wk,kw,qt",
    [
        ((32, 56, 56, 96), (96, 7, 7), {"pad": 3}, 4),  # ConvNeXt-T stage 0: 14 strips of 4 a row
        ((32, 28, 28, 192), (192, 7, 7), {"pad": 3}, 4),
        ((32, 56, 56, 144), (144, 3, 3), {"pad": 1}, 6),  # 10 strips of 6 (4 idle) edge out 14 of 4
        ((32, 56, 56, 144), (144, 3, 3), {"pad": 1, "stride": 2}, 4),
        ((1, 7, 7, 768), (768, 7, 7), {"pad": 3}, 1),  # 49 pixels: every thread counts
    ],
)
def test_depthwise_heuristic_qt(xs, wk, kw, qt):
    assert _depthwise(np.float16, xs, wk, kw).params["qt"] == qt


def test_depthwise_qt1_is_one_pixel_a_thread():
    """QT = 1 (forced, as the tuner or a benchmark may) launches one thread row per output pixel."""
    src = _depthwise(np.float16, (32, 56, 56, 96), (96, 7, 7), {"pad": 3}, {"qt": 1})
    assert src.params["strips"] == 32 * 56 * 56
    assert src.grid == (math.ceil(32 * 56 * 56 / src.params["pix"]), 1, 1)
    assert compile_cubin(src.source, src.name, "sm_90")


def test_depthwise_register_budget():
    """The default QT keeps the accumulators, weights and raw inputs within the budget."""
    for s, st in ((3, 1), (3, 2), (5, 1), (7, 1), (7, 2)):
        geo = conv_family.ConvGeometry(
            "nhwc", 32, 96, 96, 96, (56, 56), (56 // st, 56 // st), (s, s), (st, st), (s // 2,) * 2, (1, 1),
            conv_family.DType.float16,
        )  # fmt: skip
        p = conv_family._depthwise_params(geo)
        jw = (p["qt"] - 1) * st + s
        assert p["qt"] > 1 and (p["qt"] + s) * 8 + jw * 4 <= conv_family.DW_REG_BUDGET
        assert p["min_blocks"] == 2


@pytest.mark.parametrize("params,match", [({"qt": 0}, "qt=0"), ({"vc": 3}, "vc=3"), ({"vc": 16}, "vc=16")])
def test_depthwise_bad_forced_params_are_named(params, match):
    with pytest.raises(CompileError, match=match):
        _depthwise(np.float16, (1, 9, 9, 16), (16, 3, 3), {"pad": 1}, params)
    with pytest.raises(CompileError, match="vc=2"):  # a multiplier reads one channel a thread
        _depthwise(np.float32, (1, 8, 8, 8), (16, 5, 5), {"pad": 2}, {"vc": 2})


@pytest.mark.parametrize(
    "xs,wk,kw",
    [((32, 56, 56, 96), (96, 7, 7), {"pad": 3}), ((32, 56, 56, 144), (144, 3, 3), {"pad": 1, "stride": 2})],
    ids=["convnext-s0", "mbv2-s2"],
)
def test_the_tuners_depthwise_candidates_differ_from_the_default_and_compile(xs, wk, kw):
    # every candidate of the search space renders, compiles for sm_90 and launches the QT/VC it names
    k, r, s = wk
    g = conv_graph(np.float16, xs, (k, r, s, 1), group=xs[3], **kw)
    fam, ctx, (default,) = generate(g)
    space = fam.search_space(ctx)
    assert len(space) >= 6 and {} not in space
    qt0, vc0 = default.params["qt"], default.params["vc"]
    assert all((p["qt"], p.get("vc", vc0)) != (qt0, vc0) for p in space)
    assert abs(space[0]["qt"] - qt0) == 1 and "vc" not in space[0]  # --tune fast's first few: the nearest
    for params in space:
        (src,) = fam.generate(ctx.with_params(params))
        assert src.params["qt"] == params["qt"] and src.params["vc"] == params.get("vc", vc0)
        assert compile_cubin(src.source, src.name, "sm_90")
