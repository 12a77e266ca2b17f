"""engine.run's CUDA path on a GPU: cupy inputs by device-to-device memcpy, strided ones by a kernel,
the engine's own slots as inputs, out= buffers, all giving the numpy path's outputs; and the host
overhead tool's GPU mode end to end."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

import graphc
import models

pytestmark = pytest.mark.gpu
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))


@pytest.fixture(scope="module")
def bert():
    m = models.build("bert", size="tiny")
    feeds = models.sample_inputs("bert", m)
    eng = graphc.compile(m, target="cuda", precision="fp16", shapes={k: v.shape for k, v in feeds.items()})
    feeds = {s.name: feeds[s.name].astype(s.dtype) for s in eng.inputs}
    return eng, feeds, eng.run(feeds, to_numpy=True)


def test_every_input_form_gives_the_same_outputs(bert):
    import cupy

    eng, feeds, ref = bert
    dev = {k: cupy.asarray(v) for k, v in feeds.items()}
    for k, v in eng.run(dev, to_numpy=True).items():
        np.testing.assert_array_equal(v, ref[k])
    strided = {}
    for k, v in feeds.items():  # the same values, every other column of an array twice as wide
        wide = cupy.zeros((*v.shape[:-1], 2 * v.shape[-1]), dtype=v.dtype)
        wide[..., ::2] = cupy.asarray(v)
        strided[k] = wide[..., ::2]
        assert not strided[k].flags.c_contiguous
    for k, v in eng.run(strided, to_numpy=True).items():
        np.testing.assert_array_equal(v, ref[k])
    ctx = eng.executor.default
    for name in ctx.plan.inputs:  # the caller writes into the engine's own slots
        ctx.views[name][...] = dev[name]
    own = {n: ctx.views[n] for n in ctx.plan.inputs}
    for k, v in eng.run(own, to_numpy=True).items():
        np.testing.assert_array_equal(v, ref[k])


def test_out_buffers_hold_the_outputs_and_stay_valid(bert):
    import cupy

    eng, feeds, ref = bert
    dev = {k: cupy.asarray(v) for k, v in feeds.items()}
    ctx = eng.executor.default
    out = {
        s.name: cupy.full(tuple(s.shape), 7, dtype=ctx.views[n].dtype)
        for s, n in zip(eng.outputs, ctx.plan.outputs, strict=True)
    }
    got = eng.run(dev, out=out)
    assert all(got[k] is out[k] for k in out)
    for k in ref:
        np.testing.assert_array_equal(cupy.asnumpy(out[k]), ref[k])
    first = {k: v.copy() for k, v in eng.run(dev).items()}  # a run without out= returns new arrays
    eng.run({k: cupy.zeros_like(v) for k, v in dev.items()})
    for k in ref:
        np.testing.assert_array_equal(cupy.asnumpy(first[k]), ref[k])


def test_graphs_with_the_copies_inside_take_each_calls_values(bert):
    """Calls at the same addresses replay a graph with the copies captured inside: new values
    written into the same input arrays must come out, for new arrays, out= and reuse_outputs."""
    import cupy

    eng, feeds, ref = bert
    ctx = eng.executor.default
    dev = {k: cupy.asarray(v) for k, v in feeds.items()}
    zeros = {k: cupy.zeros_like(v) for k, v in dev.items()}
    ref_zeros = eng.run({k: cupy.asnumpy(v) for k, v in zeros.items()}, to_numpy=True)
    out = {
        s.name: cupy.empty(tuple(s.shape), dtype=ctx.views[n].dtype)
        for s, n in zip(eng.outputs, ctx.plan.outputs, strict=True)
    }
    for mode in ({}, {"out": out}, {"reuse_outputs": True}):
        for step in range(4):  # the same arrays, alternately holding the two feeds' values
            src, want = (feeds, ref) if step % 2 == 0 else ({k: cupy.asnumpy(v) for k, v in zeros.items()}, ref_zeros)
            for k, v in dev.items():
                v.set(np.asarray(src[k]))
            got = eng.run(dev, **mode)
            for k in want:
                np.testing.assert_array_equal(cupy.asnumpy(got[k]), want[k], err_msg=f"{mode} call {step}")
    assert 1 <= len(ctx._copy_graphs) <= 4
    reused = eng.run(dev, reuse_outputs=True)
    assert all(
        reused[s.name].data.ptr == ctx.views[n].data.ptr for s, n in zip(eng.outputs, ctx.plan.outputs, strict=True)
    )


def test_host_overhead_tool_on_the_gpu(tmp_path):
    import bench_host_overhead as H

    js = tmp_path / "h.json"
    assert H.main(["--model", "bert", "--calls", "200", "--rounds", "3", "--json", str(js)]) == 0
    r = json.loads(js.read_text())
    assert r["outputs_finite"] and r["launch"] > 0 and r["run"] > r["launch"] * 0.5, r
    assert r["outputs_match"] and r["copy_graphs"] >= 1, r
    for k in ("run_out", "run_reuse", "run_numpy", "run_sync", "launch_sync", "run_noop_launch", "replay_gpu"):
        assert r[k] > 0, (k, r)


def test_the_output_ring_writes_in_place_and_never_overwrites_a_held_result(bert):
    """runtime/output_ring.py on a GPU: back-to-back calls return arrays over the ring's slots
    (no copy out); a view or a DLPack export of a result keeps its slot from being reused."""
    import cupy

    eng, feeds, ref = bert
    ctx = eng.executor.default
    dev = {k: cupy.asarray(v) for k, v in feeds.items()}
    name = next(iter(ref))
    y = None
    for _ in range(4):
        y = eng.run(dev)
        np.testing.assert_array_equal(cupy.asnumpy(y[name]), ref[name])
    ring = ctx._ring
    assert ring is not None and len(ring.slots) == 2
    slot_ptrs = {int(b.data.ptr) for s in ring.slots for b in s.buffers}
    assert int(y[name].data.ptr) in slot_ptrs
    view = y[name][0]  # a view of a result, then the result dropped
    exported = cupy.from_dlpack(eng.run(dev)[name])  # a DLPack consumer of another result
    del y
    other = {k: cupy.zeros_like(v) for k, v in dev.items()}  # different outputs from here on
    for _ in range(4):
        eng.run(other)
    np.testing.assert_array_equal(cupy.asnumpy(view), ref[name][0])
    np.testing.assert_array_equal(cupy.asnumpy(exported), ref[name])
