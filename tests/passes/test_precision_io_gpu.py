"""An fp16-IO CUDA engine on the GPU: it takes and returns fp16 (numpy and cupy), its outputs match
numpy's fp32 reference within fp16 tolerance and the default (fp32-IO) fp16 engine's closely, and
fp32 feeds are refused with one line naming the input."""

from __future__ import annotations

import numpy as np
import pytest

import graphc
import models
from graphc.runtime.errors import EngineInputError

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("name", ["mlp", "bert", "resnet"])
def test_fp16_io_engine_matches_numpy(name):
    import cupy

    m = models.build(name, size="tiny")
    feeds = models.sample_inputs(name, m)
    shapes = {k: v.shape for k, v in feeds.items()}
    ref = graphc.interpret(graphc.bind_shapes(graphc.load_onnx(m), shapes), feeds)  # numpy, fp32
    io = graphc.compile(m, target="cuda", precision="fp16", io_precision="fp16", shapes=shapes)
    kept = graphc.compile(m, target="cuda", precision="fp16", shapes=shapes)
    half = {s.name: feeds[s.name].astype(s.dtype) for s in io.inputs}
    got = io.run(half, to_numpy=True)
    dev = io.run({k: cupy.asarray(v) for k, v in half.items()})
    base = kept.run(feeds, to_numpy=True)
    for k, r in ref.items():
        if r.dtype != np.float32:
            continue
        assert got[k].dtype == np.float16 and dev[k].dtype == np.float16, k
        np.testing.assert_array_equal(cupy.asnumpy(dev[k]), got[k])
        a = got[k].astype(np.float32)
        scale = float(np.abs(r).max()) or 1.0
        np.testing.assert_allclose(a, r, rtol=2e-2, atol=2e-2 * scale, err_msg=k)
        # the same fp16 arithmetic as the fp32-IO engine: only the last rounding (to fp16) differs
        np.testing.assert_allclose(a, base[k], rtol=5e-3, atol=5e-3 * scale, err_msg=k)
    name0 = next((s.name for s in io.inputs if s.dtype == "float16"), None)  # bert's inputs are ids
    if name0 is not None:
        with pytest.raises(EngineInputError, match=f"input '{name0}' has dtype float32, the engine takes float16"):
            io.run({**half, name0: feeds[name0].astype(np.float32)})
