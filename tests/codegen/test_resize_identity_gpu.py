"""GPU numerics of an identity Resize (same size, scale 1): bit-exact copies of the input for
every mode / coordinate transformation mode combination of test_resize_identity.py.

Run on a GPU machine: python -m pytest tests/codegen/test_resize_identity_gpu.py -q
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))  # rd_helpers and the CPU test beside this file
from rd_helpers import check_on_gpu  # noqa: E402
from test_resize_identity import COMBOS, identity_model  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("by", ["scales", "sizes"])
@pytest.mark.parametrize("mode,ctm,nearest_mode", COMBOS)
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.uint8], ids=lambda d: np.dtype(d).name)
def test_identity_resize_on_gpu(mode, ctm, nearest_mode, by, dtype):
    model, x = identity_model(mode, ctm, nearest_mode, by, dtype=dtype)
    check_on_gpu(model, {"x": x}, exact=True)
