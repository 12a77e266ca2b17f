"""The data movement family renders and compiles (NVRTC, sm_80 and sm_90) for representative
variants, and its index planning (dim merging, wide elements, tiles, Resize tables) is right.
No GPU needed; tests/codegen/test_data_gpu.py checks the numbers on one.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from graphc.codegen.families.data import Affine, interp_taps, raw_bits, wide_factor
from graphc.ir.types import DType
from helpers import make_node_model, rand

sys.path.insert(0, str(Path(__file__).parent))  # rd_helpers beside this file
from rd_helpers import compile_each, kernels_of  # noqa: E402

F32, F16 = np.float32, np.float16


# ---- planning (pure Python) ---------------------------------------------------------------------


def test_affine_merge_and_widen():
    # Every other (6, 8) block of a tensor: dims 1 and 2 merge, then 16-byte elements.
    a = Affine([2, 6, 8], [96, 8, 1], 48).simplified()
    assert (a.shape, a.mults, a.base) == ([2, 48], [96, 1], 48)
    w, k = a.widen(4)
    assert k == 4 and (w.shape, w.mults, w.base) == ([2, 12], [24, 1], 12)
    assert Affine([2, 6, 8], [48, 8, 1], 48).simplified().shape == [96]
    # Broadcast dims (mult 0) merge with each other; an odd inner run stays narrow.
    b = Affine([3, 4, 5], [0, 0, 1]).simplified()
    assert (b.shape, b.mults) == ([12, 5], [0, 1])
    assert b.widen(4)[1] == 1
    assert wide_factor(2, [64, 8]) == 8 and wide_factor(8, [6]) == 2 and wide_factor(1, [3]) == 1


def test_raw_bits_and_their_literals():
    assert raw_bits(1.0, DType.float32) == 1065353216
    assert raw_bits(0, DType.float16, 8) == 0
    assert raw_bits(-1, DType.int8, 2) == 65535
    assert raw_bits(1.0, DType.float16, 8) == sum(0x3C00 << (16 * j) for j in range(8))
    # the templates write them in the wide element's type (16 bytes: gc_v16 {low word, high word})
    pads = {"p": np.array([1, 0, 2, 0]), "v": np.array(1.0, F32)}
    pad = _case("Pad", {"x": rand((3, 5), F32)}, {"mode": "constant"}, pads)
    (k,) = kernels_of(pad, family="data")
    assert ": ((unsigned int)1065353216ull);" in k.source
    value = numpy_helper.from_array(np.array([1.0], F16))
    fill = _case("ConstantOfShape", {}, {"value": value}, {"s": np.array([4, 64])})
    (k,) = kernels_of(fill, family="data")
    assert "gc_v16{4323521613979991040ull, 4323521613979991040ull}" in k.source


@pytest.mark.parametrize(
    "mode,ctm,scale,antialias,exclude",
    [("linear", "half_pixel", 1.7, 0, 0), ("linear", "align_corners", 0.6, 1, 0), ("cubic", "asymmetric", 2.5, 0, 1)],
)
def test_resize_taps_match_reference(mode, ctm, scale, antialias, exclude):
    """The tap tables reproduce the reference's one-axis interpolation."""
    from graphc.ops.resize import _interp_axis, source_coords

    attrs = SimpleNamespace(mode=mode, antialias=antialias, exclude_outside=exclude, cubic_coeff_a=-0.75)
    in_len = 9
    out_len = int(in_len * scale)
    x, _ = source_coords(ctm, out_len, in_len, scale, (0.0, 1.0))
    data = rand((in_len, 3), F32)
    want = _interp_axis(data, 0, x, scale, attrs)
    idx, w = interp_taps(x, in_len, scale, attrs, np.dtype(F32))
    got = (data[idx] * w[..., None]).sum(axis=1)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


# ---- render + compile ---------------------------------------------------------------------------


def _case(op, inputs, attrs=None, inits=None, **kw):
    return make_node_model(op, inputs, attrs, initializers=inits, **kw)


def _pad(mode, x, pads):
    return _case("Pad", {"x": x}, {"mode": mode}, {"p": np.array(pads)})


def _optimized_cuda(model):
    """The CUDA fp32 pipeline's graph: Fused nodes anchored on data ops (passes/fuse_data_epilogues.py)."""
    import graphc
    from graphc.codegen.capabilities import CUDA
    from graphc.passes.manager import OptimizeOptions, optimize
    from graphc.passes.target import Target

    g = graphc.bind_shapes(graphc.load_onnx(model), {})
    return optimize(g, OptimizeOptions(opt_level=2, target=Target("cuda", "fp32", capabilities=CUDA))).graph


def _gather_add():
    # an embedding lookup plus a position table: Fused[Gather]{Add(acc, pos)}, one typed kernel
    nodes = [helper.make_node("Gather", ["t", "i"], ["g"], axis=0), helper.make_node("Add", ["g", "p"], ["y"])]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("i", TensorProto.INT64, [2, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 5, 24])],
        [numpy_helper.from_array(rand((30, 24)), "t"), numpy_helper.from_array(rand((5, 24)), "p")],
    )
    return _optimized_cuda(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


def _cast_transpose():
    # fp16 in, Cast to fp32, then a transpose: Fused[Transpose]{Cast(acc)}
    nodes = [
        helper.make_node("Cast", ["x"], ["c"], to=TensorProto.FLOAT),
        helper.make_node("Transpose", ["c"], ["y"], perm=[0, 2, 3, 1]),
    ]
    graph = helper.make_graph(
        nodes,
        "c",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [2, 3, 5, 7])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 5, 7, 3])],
    )
    return _optimized_cuda(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


_CASES = {
    "fused-gather-add": (_gather_add(), [{"block": 256}]),
    "fused-cast-transpose": (_cast_transpose(), [{"block": 256}]),
    "transpose-tiled-f16": (
        _case("Transpose", {"x": rand((3, 40, 33, 37), F16)}, {"perm": [0, 2, 3, 1]}),
        [{"tiled": True}],
    ),
    "transpose-inner-kept": (_case("Transpose", {"x": rand((2, 3, 5, 64))}, {"perm": [0, 2, 1, 3]}), [{"wide": 4}]),
    "transpose-index-i64": (_case("Transpose", {"x": rand((5, 6, 7), np.int64)}, {"perm": [2, 0, 1]}), [{"wide": 1}]),
    "slice-neg-steps": (
        _case(
            "Slice",
            {"x": rand((3, 7, 40, 33))},
            inits={"s": np.array([1, -1]), "e": np.array([3, -40]), "a": np.array([1, 3]), "st": np.array([1, -2])},
        ),
        [{"wide": 1}],
    ),
    "concat-3": (_case("Concat", {"a": rand((3, 4, 8), F16), "b": rand((3, 2, 8), F16)}, {"axis": 1}), [{}, {}]),
    "split-odd": (
        _case("Split", {"x": rand((3, 10, 7))}, {"axis": 1}, {"sp": np.array([3, 7])}, outputs=("y0", "y1")),
        [{}, {}],
    ),
    "pad-reflect": (
        _case("Pad", {"x": rand((3, 4, 5))}, {"mode": "reflect"}, {"p": np.array([0, 2, 3, 0, 1, 2])}),
        [{}],
    ),
    "pad-edge-crop": (
        _case("Pad", {"x": rand((3, 4, 5))}, {"mode": "edge"}, {"p": np.array([0, 2, -1, 0, 1, 2])}),
        [{}],
    ),
    "pad-wrap": (
        _case("Pad", {"x": rand((3, 4, 5), np.int32)}, {"mode": "wrap"}, {"p": np.array([1, 2, 3, 0, 1, 2])}),
        [{}],
    ),
    "pad-constant-wide": (
        _case("Pad", {"x": rand((3, 4, 64), F16)}, {}, {"p": np.array([1, 2, 0, 0, 1, 0]), "v": np.array(1.5, F16)}),
        [{"wide": 8}],
    ),
    "gather-embedding": (
        _case("Gather", {"x": rand((100, 768), F16), "i": np.array([[1, 5, -1]], np.int64)}, {"axis": 0}),
        [{"wide": 8}],
    ),
    "gather-axis1-i32": (_case("Gather", {"x": rand((10, 7, 3)), "i": np.array([1, -1], np.int32)}, {"axis": 1}), [{}]),
    "gather-elements": (
        _case("GatherElements", {"x": rand((10, 7)), "i": np.array([[1, 5, -1]] * 10, np.int64)}, {"axis": 1}),
        [{}],
    ),
    "gather-nd-batch": (
        _case("GatherND", {"x": rand((4, 5, 6)), "i": np.array([[[1], [2]]] * 4, np.int64)}, {"batch_dims": 1}),
        [{}],
    ),
    "expand": (_case("Expand", {"x": rand((3, 1, 8))}, inits={"sh": np.array([2, 3, 4, 8])}), [{"wide": 4}]),
    "tile": (_case("Tile", {"x": rand((3, 2, 5))}, inits={"r": np.array([2, 3, 2])}), [{"wide": 1}]),
    "d2s-crd": (_case("DepthToSpace", {"x": rand((2, 8, 3, 5))}, {"blocksize": 2, "mode": "CRD"}), [{}]),
    "s2d": (_case("SpaceToDepth", {"x": rand((1, 8, 64, 64), F16)}, {"blocksize": 4}), [{}]),
    "trilu": (_case("Trilu", {"x": rand((2, 5, 7))}, {"upper": 1}, {"k": np.array(-1)}), [{}]),
    "cumsum-block": (
        _case("CumSum", {"x": rand((3, 1000), F16)}, {"exclusive": 1, "reverse": 1}, {"ax": np.array(1)}),
        [{"block_scan": True}],
    ),
    "cumsum-lines-i32": (
        _case("CumSum", {"x": rand((3, 7, 5), np.int32)}, {}, {"ax": np.array(1)}),
        [{"block_scan": False}],
    ),
    "cumprod": (_case("CumProd", {"x": rand((3, 100))}, {"reverse": 1}, {"ax": np.array(1)}), [{"block_scan": True}]),
    "resize-nearest": (
        _case(
            "Resize",
            {"x": rand((1, 3, 7, 9), F16)},
            {"mode": "nearest", "coordinate_transformation_mode": "asymmetric"},
            {"roi": np.array([], F32), "sc": np.array([1, 1, 2, 3], F32)},
        ),
        [{"mode": "nearest"}],
    ),
    "resize-linear-crop": (
        _case(
            "Resize",
            {"x": rand((1, 3, 7, 9))},
            {"mode": "linear", "coordinate_transformation_mode": "tf_crop_and_resize", "axes": [2, 3]},
            {"roi": np.array([0.1, 0.2, 0.9, 0.7], F32), "sc": np.array([], F32), "sz": np.array([11, 6])},
        ),
        [{"mode": "linear"}],
    ),
    "resize-cubic-u8": (
        _case(
            "Resize",
            {"x": rand((1, 3, 7, 9), np.uint8, low=0, high=255)},
            {"mode": "cubic"},
            {"roi": np.array([], F32), "sc": np.array([], F32), "sz": np.array([1, 3, 5, 13])},
        ),
        [{}],
    ),
    "scatter-nd": (
        _case("ScatterND", {"x": rand((4, 5)), "i": np.array([[1], [3]], np.int64), "u": rand((2, 5))}),
        [{}, {}],
    ),
    "scatter-elements-add": (
        _case(
            "ScatterElements",
            {"x": rand((4, 5)), "i": np.array([[1, 0]], np.int64), "u": rand((1, 2))},
            {"axis": 0, "reduction": "add"},
        ),
        [{}, {}],
    ),
    "onehot": (
        _case(
            "OneHot",
            {"i": np.array([[0, 3, -1]], np.int64)},
            {"axis": -1},
            {"d": np.array(10), "v": np.array([0, 1], F32)},
        ),
        [{}],
    ),
    "eyelike": (_case("EyeLike", {"x": rand((4, 5), F16)}, {"k": 1}), [{}]),
    "range-f32": (
        _case("Range", {}, inits={"s": np.array(1.5, F32), "l": np.array(9.0, F32), "d": np.array(0.5, F32)}),
        [{}],
    ),
    "range-i64": (_case("Range", {}, inits={"s": np.array(7), "l": np.array(-5), "d": np.array(-3)}), [{}]),
    "fill-wide": (
        _case(
            "ConstantOfShape", {}, {"value": numpy_helper.from_array(np.array([2], np.int32))}, {"s": np.array([3, 8])}
        ),
        [{"elem_bytes": 16}],
    ),
}


@pytest.mark.parametrize("case", list(_CASES))
def test_data_compiles(case):
    model, expect = _CASES[case]
    ks = kernels_of(model, family="data")
    assert len(ks) == len(expect), [k.name for k in ks]
    for k, want in zip(ks, expect, strict=True):
        for key, v in want.items():
            assert k.params.get(key) == v, (key, k.params)
    compile_each(ks)


def test_every_data_template_is_rendered_by_a_case():
    import re

    from graphc.codegen.kernel import TEMPLATE_DIR

    used = set()
    for model, _ in _CASES.values():
        for k in kernels_of(model, family="data"):
            used |= set(re.findall(r"// ---- (data_\w+\.cu\.j2) ----", k.source))
    kinds = {p.name for p in TEMPLATE_DIR.glob("data_*.cu.j2")} - {"data_common.cu.j2"}
    assert used == kinds, sorted(kinds ^ used)


def test_range_literals():
    ks = kernels_of(_CASES["range-f32"][0], family="data") + kernels_of(_CASES["range-i64"][0], family="data")
    assert "__fadd_rn(1.5f, __fmul_rn((float)i, 0.5f))" in ks[0].source
    assert "(long long)(7ll + i * (-3ll))" in ks[1].source


def test_scatter_mul_is_refused():
    import graphc

    m = _case(
        "ScatterElements",
        {"x": rand((4, 5), F16), "i": np.array([[1, 0]], np.int64), "u": rand((1, 2), F16)},
        {"axis": 0, "reduction": "mul"},
    )
    with pytest.raises(graphc.CompileError, match="reduction 'mul'"):
        kernels_of(m)
