"""codegen/cuda_types.py's dtype_from_numpy_name: the table lookup gives what a scan of DType in
its order gives, for every numpy name and for the other arguments callers pass."""

from __future__ import annotations

import pytest

from graphc.codegen.cuda_types import dtype_from_numpy_name
from graphc.errors import CompileError
from graphc.ir.types import DType


def _scan(name) -> DType | None:
    return next((d for d in DType if d is not DType.string and d.numpy.name == name), None)


@pytest.mark.parametrize("d", [d for d in DType if d is not DType.string], ids=lambda d: d.name)
def test_every_dtype_by_its_numpy_name_and_dtype(d):
    assert dtype_from_numpy_name(d.numpy.name) is _scan(d.numpy.name) is d
    assert dtype_from_numpy_name(d.numpy) is d  # a numpy dtype compares equal to its name


@pytest.mark.parametrize("name", ["object", "float31", "", "str"])
def test_unknown_names_raise(name):
    with pytest.raises(CompileError, match="unknown dtype"):
        dtype_from_numpy_name(name)
