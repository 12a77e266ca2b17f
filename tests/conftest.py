"""Test configuration: the `gpu` marker skips where no NVIDIA GPU with cupy is present."""

from __future__ import annotations

import functools
import os

# BLAS threads spinning against each other on a 2-core CI machine cost 10x on conv-heavy tests.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest


@functools.cache
def gpu_available() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    if gpu_available():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU with cupy")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
