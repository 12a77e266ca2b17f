"""TopK on a GPU against the numpy reference (and so ONNX's order: largest/smallest first, the
lower index first among equals, NaN above every number): both variants, every axis position,
float and integer types, many ties, NaNs. Exact: values are copied bits, indices int64.

Run on a GPU machine: python -m pytest tests/codegen/test_topk_gpu.py -q
"""

from __future__ import annotations

import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from helpers import make_node_model, rand

sys.path.insert(0, str(Path(__file__).parent))  # rd_helpers beside this file
from rd_helpers import check_on_gpu  # noqa: E402

pytestmark = pytest.mark.gpu

BF16 = ml_dtypes.bfloat16


def _check(x, k, **attrs):
    model = make_node_model(
        "TopK", {"x": x}, attrs, initializers={"k": np.array([k], np.int64)}, outputs=("values", "indices")
    )
    check_on_gpu(model, {"x": x}, exact=True)


@pytest.mark.parametrize("largest", [1, 0])
@pytest.mark.parametrize(
    "shape,axis,k",
    [
        ((4, 37), -1, 5),
        ((4, 37), -1, 37),  # K = N: a full sort
        ((50, 3, 2), 0, 7),
        ((2, 9, 5), 1, 9),
        ((1, 1), -1, 1),
        ((3, 4096), -1, 100),  # the largest sorted line of 4-byte keys
        ((2, 5000), -1, 9),  # select
        ((3, 6000, 2), 1, 4),  # select, strided lines
    ],
)
@pytest.mark.parametrize(
    "dtype", [np.float32, np.float16, BF16, np.float64, np.int64, np.int32, np.uint8], ids=lambda d: np.dtype(d).name
)
def test_topk(shape, axis, k, largest, dtype):
    # Few distinct values: many ties, which must come out lower index first.
    x = rand(shape, np.float32, seed=11, low=-4, high=4).round().astype(dtype)
    if np.dtype(dtype).kind == "u":
        x = rand(shape, dtype, seed=11, low=0, high=6)
    _check(x, k, axis=axis, largest=largest)


@pytest.mark.parametrize("largest", [1, 0])
@pytest.mark.parametrize("n", [33, 5000])
def test_topk_nan_and_signed_zero(largest, n):
    x = rand((3, n), np.float32, seed=12, low=-2, high=2)
    x[:, ::7] = np.nan
    x[:, 1::5] = 0.0
    x[:, 2::5] = -0.0
    _check(x, min(n, 20), largest=largest)


def test_topk_unsorted_gives_the_reference_order():
    _check(rand((6, 300), np.float32, seed=13), 17, sorted=0)
