"""The wgmma implicit-GEMM convolution (codegen/families/conv_sm90.py, templates/conv_sm90_igemm.cu.j2)
without a GPU: which convs an sm_90 engine routes to it, its launch (grid, tensor map of the weights,
arguments), parameter checks, and the SASS of its cubins (HGMMA; UTMALDG where TMA loads the weights;
cp.async gathers; no local memory)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import graphc

sys.path.insert(0, str(Path(__file__).parent))
from conv_igemm_models import conv_model  # noqa: E402
from test_sass_sm90 import _opcodes, needs_cuobjdump, sass  # noqa: E402


def _compile(model, arch, tmp_path, precision="fp16"):
    return graphc.compile(model, target="cuda", precision=precision, arch=arch, cache_dir=str(tmp_path / "cache"))


def _conv_launches(eng, arch: str = "sm_90"):
    return [(s, ln) for s in eng.plan.steps for ln in s.launches_for(arch) if ln.family == "conv"]


def test_3x3_conv_runs_on_the_igemm(tmp_path):
    model, _ = conv_model(2, 64, 28, 128, 3, 1, residual=True)  # M = 1568, K = 576
    eng = _compile(model, ["sm_90"], tmp_path)
    ((step, ln),) = _conv_launches(eng)
    p = ln.params
    assert (p["variant"], p["M"], p["N"], p["K"], p["a"], p["B_MODE"]) == ("igemm", 1568, 128, 576, "gather16", "tma")
    assert p["requires_arch"] == "sm_90a" and p["VEC_EPI"] == 1
    (tb,) = p["tmaps"]  # the [Cout, 3, 3, Cin] weight read in place as [Cout, 576], K inner
    assert (tb["tensor"], tb["dims"], tb["strides"], tb["box"]) == (
        step.inputs[1],
        [576, 128, 1],
        [1152, 147456],
        [64, p["BN"], 1],
    )
    assert ln.args[:2] == [step.inputs[0], "@tmap:0"]
    assert ln.grid[0] == 13 * (128 // p["BN"]) and ln.block == [256, 1, 1]


def test_stem_gathers_elements_and_loads_weights_without_tma(tmp_path):
    model, _ = conv_model(2, 3, 64, 64, 7, 2)  # K = 147: 16-byte rows nowhere
    eng = _compile(model, ["sm_90"], tmp_path)
    ((step, ln),) = _conv_launches(eng)
    p = ln.params
    assert (p["variant"], p["a"], p["B_MODE"], p["K"]) == ("igemm", "gather1", "elem", 147)
    assert "tmaps" not in p and ln.args[:2] == [step.inputs[0], step.inputs[1]]


def test_patch_conv_with_three_channels_and_tma_weights_fits_its_shared_memory(tmp_path):
    # ViT's patch embedding at batch 32 (16x16 kernel over 3 channels, 768 out): the element gather
    # asks for two blocks per SM, while its 768-wide weight rows go by TMA; the heuristic must pick
    # stages that fit (it asked for 132 KB of two blocks' 113 KB on the H200's first ViT run)
    model, _ = conv_model(32, 3, 224, 768, 16, 16, relu=False)
    eng = _compile(model, ["sm_90"], tmp_path)
    ((_, ln),) = _conv_launches(eng)
    p = ln.params
    assert (p["variant"], p["a"], p["B_MODE"], p["K"]) == ("igemm", "gather1", "tma", 768)
    assert p["MINB"] in (1, 2) and 3 <= p["STAGES"] <= 8


def test_multi_arch_engine_keeps_the_old_kernel_for_sm80(tmp_path):
    model, _ = conv_model(2, 64, 56, 64, 3, 2)  # M = 2 * 28 * 28
    eng = _compile(model, ["sm_80", "sm_90"], tmp_path)
    assert [ln.params["variant"] for _, ln in _conv_launches(eng, "sm_80")] == ["tc"]
    assert [ln.params["variant"] for _, ln in _conv_launches(eng, "sm_90")] == ["igemm"]


def test_narrow_convs_stay(tmp_path):
    model, _ = conv_model(2, 64, 28, 32, 3, 1)  # Cout = 32 < IGEMM_MIN_COUT: not measured
    eng = _compile(model, ["sm_90"], tmp_path)
    assert [ln.params["variant"] for _, ln in _conv_launches(eng)] == ["tc"]


def test_batch1_convs_taken(tmp_path):
    model, _ = conv_model(1, 512, 7, 512, 3, 1)  # M = 49: 8 K slices as one cluster
    eng = _compile(model, ["sm_90"], tmp_path)
    ((_, ln),) = _conv_launches(eng)
    assert ln.params["variant"] == "igemm" and ln.params["SPLITS"] == 8 and ln.params["SERIAL"] == 0
    assert ln.params["CLUSTER"] == 1 and "@workspace" not in ln.args


def test_fp32_engine_keeps_the_conv_kernel(tmp_path):
    model, _ = conv_model(2, 64, 28, 64, 3, 1)
    eng = _compile(model, ["sm_90"], tmp_path, precision="fp32")
    assert all(ln.params["variant"] != "igemm" for _, ln in _conv_launches(eng))


def _ctx(c, hw, k, r, stride, n=2):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
    from bench_conv_sm90 import conv_ctx

    return conv_ctx(n, hw, c, k, False, True, r, stride)


@pytest.mark.parametrize(
    ("params", "msg"),
    [
        ({"BN": 96}, "BN 96"),
        ({"BN": 256, "MINB": 2}, "shared memory"),
        ({"B_MODE": "tma", "BN": 64}, "not a multiple of 8"),
    ],
)
def test_bad_parameters_are_named(params, msg):
    from graphc.codegen.families import conv_sm90
    from graphc.errors import CompileError

    ctx = _ctx(3, 32, 64, 7, 2) if params.get("B_MODE") == "tma" else _ctx(64, 28, 128, 3, 1)
    with pytest.raises(CompileError, match=msg):
        conv_sm90.igemm_generate(ctx, params)


def test_split_k_in_one_launch_or_two():
    from graphc.codegen.families import conv_sm90

    ctx = _ctx(256, 14, 256, 3, 1)  # M = 392, K = 2304: 36 K tiles in 3 slices of 12
    (main,) = conv_sm90.igemm_generate(ctx, {"BN": 128, "SPLITS": 3, "SERIAL": 1})  # the last slice reduces
    assert main.grid == (4 * 2, 3, 1) and main.args[-1] == "@workspace" and main.params["SERIAL"] == 1
    assert main.workspace_bytes == 3 * 392 * 256 * 4 and main.params["VEC_EPI"] == 1
    assert "_arrived[8]" in main.source  # one arrival counter per output tile
    main, red = conv_sm90.igemm_generate(ctx, {"BN": 128, "SPLITS": 3, "CLUSTER": 0})  # two launches
    assert main.args[-1] == "@workspace" and red.args[-1] == "@workspace" and red.params["reduce"]
    assert main.params["VEC_EPI"] == 0 and main.params["SERIAL"] == 0 and main.params["CLUSTER"] == 0
    (main,) = conv_sm90.igemm_generate(ctx, {"BN": 128, "SPLITS": 3})  # the default: one cluster
    assert main.params["CLUSTER"] == 1 and main.workspace_bytes == 0


@needs_cuobjdump
@pytest.mark.parametrize(
    ("geom", "params", "tma"),
    [
        ((64, 28, 64, 3, 1), None, True),
        ((128, 14, 256, 3, 2), {"BN": 256}, True),
        ((256, 28, 512, 1, 2), {"BN": 128, "MINB": 2, "STAGES": 3}, True),
        ((512, 7, 512, 3, 1), {"BN": 128, "SPLITS": 2, "SERIAL": 1}, True),  # split-K in one launch
        ((64, 28, 128, 3, 1), {"BN": 128, "B_MODE": "cp"}, False),
        ((3, 64, 64, 7, 2), None, False),
    ],
)
def test_igemm_sass(tmp_path, geom, params, tma):
    from graphc.codegen.families import conv_sm90
    from graphc.codegen.nvrtc import compile_cubin

    main = conv_sm90.igemm_generate(_ctx(*geom), params)[0]
    ops = _opcodes(sass(compile_cubin(main.source, main.name, "sm_90a"), tmp_path, main.name))
    assert "HGMMA" in ops, "no warpgroup MMA"
    assert ("UTMALDG" in ops) == tma
    if geom[0] % 8 == 0:
        assert "LDGSTS" in ops, "the A gather is not cp.async"
    assert not {"LDL", "STL"} & ops, "registers spilled to local memory"
    assert "HMMA" not in ops


def test_cluster_split_k_is_one_launch_without_workspace():
    from graphc.codegen.families import conv_sm90

    ctx = _ctx(512, 7, 512, 3, 1, n=1)  # M = 49, K = 4608: 72 K tiles in 8 slices of 9
    (main,) = conv_sm90.igemm_generate(ctx, {"BN": 64, "SPLITS": 8, "CLUSTER": 1})
    p = main.params
    assert (p["CLUSTER"], p["SERIAL"], p["SPLITS"], p["VEC_EPI"]) == (1, 0, 8, 1)
    assert main.grid == (8, 8, 1) and main.workspace_bytes == 0 and "@workspace" not in main.args
    assert main.args[-1] == ctx.step.outputs[0]  # the output itself, as an unsplit conv
    # the K slices of one tile are one cluster (grid y); no arrival counters
    assert "__cluster_dims__(1, 8, 1) __launch_bounds__(256, 1)" in main.source and "_arrived" not in main.source
    assert main.source.count("gc_cluster_sync();") == 2 and "gc_ld_dsmem_f4" in main.source
    # a column tail (Cout 200) without the vector epilogue: 4-column chunks, element stores
    (tail,) = conv_sm90.igemm_generate(_ctx(256, 14, 200, 3, 1), {"BN": 128, "SPLITS": 3, "CLUSTER": 1, "VEC_EPI": 0})
    assert tail.params["VEC_EPI"] == 0 and "__cluster_dims__(1, 3, 1)" in tail.source and tail.grid == (8, 3, 1)
    # one slice: no cluster
    (one,) = conv_sm90.igemm_generate(_ctx(64, 28, 64, 3, 1), {"SPLITS": 1, "CLUSTER": 1})
    assert one.params["CLUSTER"] == 0 and "__cluster_dims__" not in one.source


@pytest.mark.parametrize(
    ("params", "msg"),
    [
        ({"BN": 64, "SPLITS": 12, "CLUSTER": 1}, "at most 8"),
        ({"BN": 64, "SPLITS": 4, "CLUSTER": 1, "SERIAL": 1}, "choose one"),
        ({"BN": 64, "SPLITS": 4, "CLUSTER": 2}, "CLUSTER 2"),
    ],
)
def test_bad_cluster_parameters_are_named(params, msg):
    from graphc.codegen.families import conv_sm90
    from graphc.errors import CompileError

    with pytest.raises(CompileError, match=msg):
        conv_sm90.igemm_generate(_ctx(512, 7, 512, 3, 1, n=1), params)


@needs_cuobjdump
@pytest.mark.parametrize(
    ("geom", "params"),
    [
        ((512, 7, 512, 3, 1), {"BN": 64, "SPLITS": 8, "CLUSTER": 1}),  # the vector epilogue
        ((256, 14, 200, 3, 1), {"BN": 128, "SPLITS": 3, "CLUSTER": 1, "VEC_EPI": 0}),
        ((1024, 14, 256, 1, 1), {"BN": 64, "SPLITS": 4, "CLUSTER": 1}),  # a stride-1 1x1
    ],
)
def test_cluster_split_k_sass(tmp_path, geom, params):
    from graphc.codegen.families import conv_sm90
    from graphc.codegen.nvrtc import compile_cubin

    (main,) = conv_sm90.igemm_generate(_ctx(*geom, n=1), params)
    text = sass(compile_cubin(main.source, main.name, "sm_90a"), tmp_path, main.name)
    ops = _opcodes(text)
    assert {"HGMMA", "UTMALDG", "UCGABAR_ARV", "UCGABAR_WAIT"} <= ops, "no cluster barrier"
    assert "LD" in ops, "no generic (distributed shared memory) load"
    assert not {"LDL", "STL"} & ops, "registers spilled to local memory"
    # the PDL entry first: griddepcontrol.wait (ACQBULK) before the first global access of every CTA
    first_global = min(text.find(op) for op in ("LDG", "LDGSTS", "UTMALDG", "STG") if op in text)
    assert 0 <= text.find("ACQBULK") < first_global
