"""The grid_sample family without a GPU: every mode x padding mode x align_corners x dtype (and 1-D,
3-D, size-1 axes, mixed X/grid dtypes) renders, takes this family (not apache-tvm), compiles with
NVRTC for sm_80 and sm_90, and, compiled for the host by cuda_emulator.py (the kernel's own text,
one thread at a time), equals the numpy reference: nearest exactly (ties round half to even, the
coordinate is the reference's double), linear and cubic to float32 rounding. graphc.compile and
`graphc check` take GridSample on the cuda target without TVM; the onnx package's GridSample node
tests' expected outputs come out of the host-compiled kernel. test_grid_sample_gpu.py checks the
engine on a GPU."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import graphc

sys.path.insert(0, str(Path(__file__).parent))  # rd_helpers beside this file
from grid_sample_cases import CASES, case  # noqa: E402
from rd_helpers import compile_each, kernels_of  # noqa: E402

# The host's versions of what the emulator cannot take from common.cuh (PTX conversions, intrinsics).
_HOST_PRELUDE = """\
#include <cstring>
typedef unsigned short gc_half;
typedef unsigned short gc_bf16;
static inline float gc_h2f(gc_half h) { _Float16 f; std::memcpy(&f, &h, 2); return (float)f; }
static inline gc_half gc_f2h(float x) { _Float16 f = (_Float16)x; gc_half h; std::memcpy(&h, &f, 2); return h; }
static inline float gc_bf2f(gc_bf16 h) { unsigned u = ((unsigned)h) << 16; float f; std::memcpy(&f, &u, 4); return f; }
static inline gc_bf16 gc_f2bf(float f) {
  unsigned u; std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (gc_bf16)((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (gc_bf16)(u >> 16);
}
static inline double __dmul_rn(double a, double b) { return a * b; }
"""
TEMPLATE_MARK = "// ---- grid_sample.cu.j2 ----"
# (rtol, atol relative to max(1, |expected|)) of linear and cubic; nearest is exact
TOLERANCE = {"float32": (1e-5, 1e-5), "float64": (1e-12, 1e-12), "float16": (2e-3, 2e-3), "bfloat16": (1e-2, 1e-2)}


def _reference(model, feeds):
    (y,) = graphc.interpret(graphc.load_onnx(model), feeds).values()
    return np.asarray(y)


def _emulate(src, feeds) -> np.ndarray:
    """The kernel's own text (common.cuh swapped for host shims) run on the host."""
    from cuda_emulator import run_launches

    body = src.source.split(TEMPLATE_MARK, 1)[1]
    x, grid = feeds["x"], feeds["grid"]
    nd = x.ndim - 2
    y = np.empty((*x.shape[:2], *grid.shape[1 : 1 + nd]), x.dtype)
    y.reshape(-1).view(np.uint8)[...] = 0xFF  # NaN: an element the kernel skips shows
    tensors = {"x": np.ascontiguousarray(x), "grid": np.ascontiguousarray(grid), "y": y}
    run_launches([(_HOST_PRELUDE + body, src.name, src.grid, src.block, src.args)], tensors)
    return y


def _assert_matches(got: np.ndarray, want: np.ndarray, mode: str, what: str) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    if mode == "nearest":  # a copy of the sampled element (or 0): bit for bit
        np.testing.assert_array_equal(got.astype(np.float64), want.astype(np.float64), err_msg=what)
        return
    rtol, atol = TOLERANCE[np.dtype(want.dtype).name]
    w = want.astype(np.float64)
    scale = max(1.0, float(np.abs(w).max()))
    np.testing.assert_allclose(got.astype(np.float64), w, rtol=rtol, atol=atol * scale, err_msg=what)


@pytest.mark.parametrize("name", list(CASES))
def test_kernel_compiles_and_matches_reference_on_host(name):
    kw = CASES[name]
    model, feeds = case(**kw)
    (src,) = kernels_of(model, family="grid_sample")  # this family, not apache-tvm's
    assert src.family == "grid_sample" and src.args == ["x", "grid", "y"]
    assert src.params["mode"] == kw["mode"] and src.params["padding_mode"] == kw["padding"]
    nd = len(kw.get("xshape", (0, 0, 0, 0))) - 2
    assert src.params["nd"] == nd and src.params["align_corners"] == kw["align"]
    # the coordinate rules as written: rint for nearest only, the reflection helper for reflection only
    assert ("rint(c)" in src.source) == (kw["mode"] == "nearest")
    assert ("_reflect(" in src.source) == (kw["padding"] == "reflection")
    assert "__dmul_rn(" in src.source  # coordinate products are never fma-contracted
    if kw["mode"] == "cubic":
        assert "-0.75" in src.source
    compile_each([src])
    got = _emulate(src, feeds)
    _assert_matches(got, _reference(model, feeds), kw["mode"], name)


def test_grid_order_and_strides_in_the_source():
    """grid[..., 0] is the last spatial axis (W): the innermost offsets (stride 1) come from g[0]."""
    model, _ = case("linear", "zeros", 0, xshape=(1, 2, 3, 5, 7), out=(2, 2, 2))
    (src,) = kernels_of(model, family="grid_sample")
    body = src.source.split(TEMPLATE_MARK, 1)[1]
    blocks = body.split("long long o")[1:]
    assert [b.split("[", 1)[0] for b in blocks] == ["0", "1", "2"]
    assert "g[2]" in blocks[0] and "* 35ll" in blocks[0]  # D: stride 5 * 7
    assert "g[1]" in blocks[1] and "* 7ll" in blocks[1]
    assert "g[0]" in blocks[2] and "* 1ll" in blocks[2]


@pytest.mark.parametrize("align", [0, 1])
def test_nearest_ties_round_half_to_even(align):
    """Coordinates exactly halfway between pixels go to the even pixel (x = its index, so the
    output is the index chosen), as numpy's rint and the reference do."""
    # sizes whose ties are float32 numbers: (2k + 1) / 4 - 1 (align_corners=1, S = 5), 2(k + 1) / 8 - 1 (S = 8)
    size = 5 if align else 8
    ks = np.arange(0, size - 1, dtype=np.float64)
    v = (2 * ks + 1) / (size - 1) - 1 if align else 2 * (ks + 1) / size - 1  # coordinate k + 0.5
    x = np.arange(size, dtype=np.float32).reshape(1, 1, 1, size)  # x[..., w] = w
    grid = np.zeros((1, 1, len(v), 2), np.float32)
    grid[0, 0, :, 0] = v
    from helpers import make_node_model

    model = make_node_model("GridSample", {"x": x, "grid": grid}, {"mode": "nearest", "align_corners": align})
    (src,) = kernels_of(model, family="grid_sample")
    got = _emulate(src, {"x": x, "grid": grid})
    want = _reference(model, {"x": x, "grid": grid})
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got.reshape(-1), [2 * ((k + 1) // 2) for k in range(size - 1)])  # 0, 2, 2, 4, 4, ...


@pytest.mark.parametrize(
    "precision,kw",
    [
        ("fp32", dict(mode="linear", padding="zeros", align=0, xshape=(8, 32, 20, 20), out=(300, 4))),
        ("fp16", dict(mode="linear", padding="zeros", align=0)),
        ("bf16", dict(mode="cubic", padding="reflection", align=1)),
        ("fp16", dict(mode="nearest", padding="border", align=1, xshape=(2, 2, 3, 4, 5), out=(3, 2, 4))),
    ],
)
def test_compile_takes_the_family_without_tvm(precision, kw, tmp_path):
    """graphc.compile for the cuda target (NVRTC, sm_90): the GridSample step's one launch is this
    family's, with --no-tvm too; under fp16/bf16 its tensors are 16-bit (no float32 boundary)."""
    model, _ = case(**kw)
    engine = graphc.compile(
        model, target="cuda", arch=["sm_90"], precision=precision, tvm=False, cache_dir=str(tmp_path)
    )
    (step,) = [s for s in engine.plan.steps if s.op == "GridSample"]
    assert [ln.family for ln in step.launches] == ["grid_sample"]
    assert "tvm" not in engine.report
    want = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}[precision]
    assert engine.plan.tensors[step.inputs[0]].dtype == want
    assert engine.plan.tensors[step.outputs[0]].dtype == want


def test_check_names_no_gridsample(tmp_path):
    """`graphc check --target cuda` (graphc.support.check_model, what the CLI prints) passes a
    GridSample model, --no-tvm included, with no finding or note on GridSample (it is counted
    among the model's ops, no more)."""
    from graphc.support import check_model

    model, _ = case("linear", "zeros", 0, xshape=(8, 32, 20, 20), out=(300, 4))
    path = tmp_path / "gs.onnx"
    path.write_bytes(model.SerializeToString())
    for tvm in (True, False):
        r = check_model(str(path), target="cuda", tvm=tvm)
        assert r.supported, r.lines()
        assert not any(f.op == "GridSample" for f in [*r.findings, *r.notes]), r.lines()
        assert not any("no CUDA kernel" in line or "apache-tvm" in line for line in r.lines()), r.lines()


def test_cli_check_passes(tmp_path, capsys):
    from graphc.cli import main

    model, _ = case("cubic", "border", 0)
    path = tmp_path / "gs.onnx"
    path.write_bytes(model.SerializeToString())
    rc = main(["check", str(path), "--target", "cuda", "--no-tvm"])
    out = capsys.readouterr().out
    assert rc == 0 and "every op compiles for cuda" in out, out
    assert "no CUDA kernel" not in out and "apache-tvm" not in out, out


def test_empty_output_has_no_kernel():
    from helpers import make_node_model

    x = np.ones((1, 2, 3, 4), np.float32)
    grid = np.zeros((1, 0, 5, 2), np.float32)
    model = make_node_model("GridSample", {"x": x, "grid": grid})
    assert kernels_of(model, family="grid_sample") == []


def _node_tests():
    import warnings

    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        return [c for c in collect_testcases() if c.name.startswith("test_gridsample")]


def test_onnx_node_tests_on_host():
    """The installed onnx's GridSample node tests (18 in onnx 1.23: 2-D, volumetric, every mode and
    padding), run as the kernel's own text on the host: their expected outputs (some written by
    hand to 4 decimals, hence atol 1e-4; nearest exact)."""
    cases = _node_tests()
    assert cases
    for c in cases:
        (src,) = kernels_of(c.model, family="grid_sample")
        mode = next((a.s.decode() for a in c.model.graph.node[0].attribute if a.name == "mode"), "linear")
        src.args = ["x", "grid", "y"]  # the emulator's tensor names for the node's inputs and output
        for ins, outs in c.data_sets:
            got = _emulate(src, {"x": ins[0], "grid": ins[1]}).astype(np.float64)
            want = np.asarray(outs[0], np.float64)
            if mode == "nearest":
                np.testing.assert_array_equal(got, want, err_msg=c.name)
            else:
                np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=c.name)
