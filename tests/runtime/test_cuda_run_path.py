"""engine.run's CUDA path without a GPU (tools/fake_cupy.py stands for cupy, on host memory): the
inputs' data reaches the engine's slots by one device-to-device memcpy each (none when the input is
the slot), strided inputs through a copy kernel with a log line, numpy inputs by an upload; outputs
are new arrays, or land in out= arrays with no allocation; the checks name the input or output."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
import fake_cupy as F  # noqa: E402

from graphc.runtime.errors import EngineError, EngineInputError  # noqa: E402


@pytest.fixture
def fake():
    F.MOVE[0] = True
    engine, ctx, feeds = F.fake_engine(inputs=2, outputs=2)
    return engine, ctx, feeds


def test_device_inputs_are_one_memcpy_each_and_data_goes_through(fake) -> None:
    engine, ctx, feeds = fake
    counts = F.counts_per_call(lambda: engine.run(feeds, sync=False))
    # two inputs: two memcpys; two outputs: a new array (allocation) and a memcpy each; no copy kernel
    assert counts == {"memcpy_d2d": 4, "graph_launch": 1, "alloc": 2}
    outs = engine.run(feeds)
    assert set(outs) == {"y0", "y1"}
    np.testing.assert_array_equal(ctx.views["in1"].host(), feeds["in1"].host())
    np.testing.assert_array_equal(outs["y0"].host(), feeds["in0"].host().astype(np.float16))
    assert outs["y0"].data.ptr != ctx.views["out0"].data.ptr  # a copy: valid after the next run


def test_out_buffers_take_the_outputs_without_an_allocation(fake) -> None:
    engine, ctx, feeds = fake
    out = {s.name: F.array(np.zeros(tuple(s.shape), np.float16)) for s in engine.outputs}
    counts = F.counts_per_call(lambda: engine.run(feeds, sync=False, out=out))
    assert counts == {"memcpy_d2d": 4, "graph_launch": 1}  # 2 in, 2 out; no alloc, no kernel
    got = engine.run(feeds, out=out)
    assert got["y1"] is out["y1"]
    np.testing.assert_array_equal(out["y1"].host(), feeds["in0"].host().astype(np.float16))
    as_host = engine.run(feeds, out=out, to_numpy=True)
    assert isinstance(as_host["y0"], np.ndarray) and np.array_equal(as_host["y0"], out["y0"].host())


@pytest.mark.parametrize(
    "bad, message",
    [
        ({"y0": "wrong-shape"}, "out['y0'] must be a cupy array of dtype float16 and shape (1, 128)"),
        ({"y0": "missing"}, "out= has no array for output 'y0'"),
        ({"y0": "strided"}, "out['y0'] must be C-contiguous"),
        ({"extra": True}, "out= names"),
    ],
)
def test_out_buffers_are_checked(fake, bad, message) -> None:
    engine, _ctx, feeds = fake
    out = {s.name: F.array(np.zeros(tuple(s.shape), np.float16)) for s in engine.outputs}
    what = next(iter(bad.values()))
    if what == "wrong-shape":
        out["y0"] = F.array(np.zeros((1, 64), np.float16))
    elif what == "missing":
        out["z"] = out.pop("y0")
    elif what == "strided":
        out["y0"] = F.FakeArray((1, 128), np.float16, strided=True)
    else:
        out["extra"] = F.array(np.zeros(1, np.float16))
    with pytest.raises(EngineError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        engine.run(feeds, out=out)


def test_an_input_that_is_the_slot_is_not_copied(fake) -> None:
    engine, ctx, feeds = fake
    own = {n: ctx.views[n] for n in ctx.plan.inputs}
    assert F.counts_per_call(lambda: engine.run(own, sync=False))["memcpy_d2d"] == 2  # the two outputs' alone


def test_strided_inputs_take_a_copy_kernel_and_say_so(fake, caplog) -> None:
    engine, ctx, feeds = fake
    strided = dict(feeds, in1=F.FakeArray((1, 128), np.float16, strided=True))
    with caplog.at_level(logging.INFO, logger="graphc.runtime.cuda"):
        counts = F.counts_per_call(lambda: engine.run(strided, sync=False))
        engine.run(strided, sync=False)
    assert counts["memcpy_d2d"] == 3 and counts["copy_kernel"] == 1  # in1 by a kernel; in0 and the outputs by memcpy
    assert caplog.text.count("input 'in1': not a C-contiguous array") == 1  # logged once, not per call


def test_numpy_inputs_are_uploaded(fake) -> None:
    engine, ctx, feeds = fake
    host = {k: v.host().copy() for k, v in feeds.items()}
    host["in1"] = np.asfortranarray(host["in1"])  # made contiguous on the way
    counts = F.counts_per_call(lambda: engine.run(host, sync=False))
    assert counts["h2d"] == 2 and counts["memcpy_d2d"] == 2  # uploads in, memcpys to the new outputs
    np.testing.assert_array_equal(ctx.views["in1"].host(), host["in1"])


def _int32(f):
    f["in0"] = F.array(np.zeros((1, 128), np.int32))


def _batch2(f):
    f["in1"] = F.array(np.zeros((2, 128), np.float16))


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda f: f.pop("in1"), "input 'in1' (float16[1, 128]) is missing"),
        (lambda f: f.update(extra=f["in0"]), "unknown input(s) ['extra']"),
        (_int32, "input 'in0' has dtype int32, the engine takes int64"),
        (_batch2, "input 'in1' has shape (2, 128), the engine was built for (1, 128)"),
    ],
)
def test_feed_checks_name_the_input(fake, change, message) -> None:
    engine, _ctx, feeds = fake
    feeds = dict(feeds)
    change(feeds)
    with pytest.raises(EngineInputError) as e:
        engine.run(feeds)
    assert message in str(e.value)


def test_the_host_overhead_tool_runs_on_the_fake(tmp_path) -> None:
    import json

    import bench_host_overhead as H

    try:
        assert H.main(["--fake", "--calls", "20", "--rounds", "2", "--json", str(tmp_path / "h.json")]) == 0
    finally:
        F.MOVE[0] = True
    r = json.loads((tmp_path / "h.json").read_text())
    assert r["run"] > 0 and r["run_out"] > 0 and r["check_feeds"] > 0
    assert r["counts_per_call"] == {"memcpy_d2d": 3, "graph_launch": 1, "alloc": 1}
