"""The topk family without a GPU: each variant (shared-memory bitonic sort, K-round select)
renders with the step's geometry and order, and compiles with NVRTC for sm_80 and sm_90.
tests/codegen/test_topk_gpu.py checks the numbers on a GPU."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from graphc.codegen.families.topk import sort_capacity
from helpers import make_node_model, rand

sys.path.insert(0, str(Path(__file__).parent))  # rd_helpers beside this file
from rd_helpers import compile_each, kernels_of  # noqa: E402


def topk_model(shape, k, dtype=np.float32, **attrs):
    x = rand(shape, dtype, seed=7)
    return make_node_model(
        "TopK", {"x": x}, attrs, initializers={"k": np.array([k], np.int64)}, outputs=("values", "indices")
    ), x


CASES = {
    "sort-f32-last": ((4, 37), 5, np.float32, {}, "sort"),
    "sort-f16-axis0-smallest": ((50, 3, 2), 7, np.float16, {"axis": 0, "largest": 0}, "sort"),
    "sort-bf16-mid": ((2, 9, 5), 9, "bfloat16", {"axis": 1, "sorted": 0}, "sort"),
    "sort-i64": ((3, 100), 10, np.int64, {}, "sort"),
    "sort-u8": ((3, 17), 4, np.uint8, {"largest": 0}, "sort"),
    "sort-f64": ((2, 2048), 3, np.float64, {}, "sort"),
    "select-f32": ((2, 10000), 3, np.float32, {}, "select"),
    "select-f64": ((3, 2049), 2, np.float64, {"largest": 0}, "select"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_topk_renders_and_compiles(case):
    shape, k, dtype, attrs, variant = CASES[case]
    if dtype == "bfloat16":
        import ml_dtypes

        dtype = ml_dtypes.bfloat16
    model, _ = topk_model(shape, k, dtype, **attrs)
    (src,) = kernels_of(model, family="topk")
    assert src.params["variant"] == variant
    axis = attrs.get("axis", -1) % len(shape)
    inner = int(np.prod(shape[axis + 1 :]))
    lines = int(np.prod(shape)) // shape[axis]
    assert src.grid == (lines, 1, 1)
    assert f"N = {shape[axis]}, K = {k}" in src.source and f"INNER = {inner}ll" in src.source
    # The order: largest first or smallest first, then the lower index.
    largest = attrs.get("largest", 1)
    assert ("return a > b;" in src.source) == bool(largest)
    assert ("return a < b;" in src.source) == (not largest)
    assert "return ia < ib;" in src.source
    assert src.args == ["x", "values", "indices"]
    if variant == "sort":
        p = src.params["P"]
        assert p >= shape[axis] and p & (p - 1) == 0 and p < 2 * shape[axis] + 1
    compile_each([src])


def test_sort_capacity_fits_shared_memory():
    assert sort_capacity(4) == 4096 and sort_capacity(8) == 2048
    for kb in (4, 8):
        assert sort_capacity(kb) * (kb + 4) < 48 * 1024


def test_integer_keys_have_no_nan_test():
    model, _ = topk_model((3, 17), 4, np.int32)
    (src,) = kernels_of(model, family="topk")
    assert "const bool na = a != a" not in src.source
    model, _ = topk_model((3, 17), 4, np.float32)
    (src,) = kernels_of(model, family="topk")
    assert "const bool na = a != a" in src.source


def test_topk_in_a_cuda_compile():
    import graphc

    model, _ = topk_model((2, 64), 8)
    engine = graphc.compile(model, target="cuda", arch=["sm_80"])
    assert set(engine.kernels.families.values()) == {"topk"}
