"""The TVM-sourced kernels (graphc[tvm]) on a GPU against graphc's numpy reference: every case of
tvm_cases.py, through an engine's own launch path (outputs poisoned first, so a kernel that writes
too little fails). Needs TVM and a GPU on one machine; the H200 machine has no TVM, so there
tools/tvm_gpu_check.py runs the same cases from engines built here.

Run on a GPU machine with graphc[tvm]: python -m pytest tests/codegen/test_tvm_kernels_gpu.py -q
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from rd_helpers import check_on_gpu  # noqa: E402
from tvm_cases import CASES  # noqa: E402

pytest.importorskip("tvm", reason="graphc[tvm] (apache-tvm) is not installed")
pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("case", list(CASES))
def test_tvm_kernel_matches_reference(case):
    model, feeds = CASES[case]()
    check_on_gpu(model, feeds)
