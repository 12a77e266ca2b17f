"""engine.run's CUDA path without a GPU (tools/fake_cupy.py stands for cupy, on host memory): the
inputs' data reaches the engine's slots by one device-to-device memcpy each (none when the input is
the slot), captured into the graph with the kernels once the same addresses come back; strided
inputs through a copy kernel with a log line, numpy inputs by an upload; outputs are new arrays,
land in out= arrays with no allocation, or are the engine's own buffers (reuse_outputs=True); the
checks name the input or output."""

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


def _calls(engine, n, feeds, **kw):
    """What each of `n` back-to-back calls did (the result dropped at once, as a loop does)."""
    return [F.counts_per_call(lambda: engine.run(feeds, sync=False, **kw)) for _ in range(n)]


def test_device_inputs_are_captured_with_their_copies_once_the_addresses_come_back(fake) -> None:
    engine, ctx, feeds = fake
    first, second, third, fourth = _calls(engine, 4, feeds=feeds)
    # first call: the plain graph captured, a memcpy per input (2) and per new output (2) around it
    assert first == {"capture": 1, "memcpy_d2d": 4, "graph_launch": 1, "alloc": 2}
    # the same addresses again (the outputs take the blocks freed before them): captured with the copies
    assert second == {"capture": 1, "captured_memcpy": 4, "graph_launch": 1, "alloc": 2}
    # from then on one graph launch and the outputs' allocations, nothing else
    assert third == fourth == {"graph_launch": 1, "alloc": 2}
    assert len(ctx._copy_graphs) == 1


def test_replays_take_new_input_values_and_return_new_arrays(fake) -> None:
    engine, ctx, feeds = fake
    kept = []
    for step in range(4):  # the caller writes new values into the same input arrays each time
        feeds["in0"].host()[...] = np.arange(128).reshape(1, 128) * (step + 1)
        outs = engine.run(feeds)
        np.testing.assert_array_equal(outs["y0"].host(), (np.arange(128) * (step + 1)).reshape(1, 128))
        np.testing.assert_array_equal(ctx.views["in1"].host(), feeds["in1"].host())
        kept.append(outs["y1"])  # kept: the next call's outputs are new arrays elsewhere
    assert len({a.data.ptr for a in kept}) == 4
    for step, a in enumerate(kept):  # a kept output still holds its own run's values
        np.testing.assert_array_equal(a.host(), (np.arange(128) * (step + 1)).reshape(1, 128).astype(np.float16))


def test_new_input_addresses_are_copied_by_memcpy_until_they_come_back(fake) -> None:
    engine, ctx, feeds = fake
    out = {s.name: F.array(np.zeros(tuple(s.shape), np.float16)) for s in engine.outputs}
    _calls(engine, 3, feeds=feeds, out=out)
    other = {k: F.array(v.host() + 1) for k, v in feeds.items()}
    a, b, c = _calls(engine, 3, feeds=other, out=out)
    assert a == {"memcpy_d2d": 4, "graph_launch": 1} and b["captured_memcpy"] == 4 and c == {"graph_launch": 1}
    engine.run(other, out=out)
    np.testing.assert_array_equal(out["y0"].host(), other["in0"].host().astype(np.float16))
    assert F.counts_per_call(lambda: engine.run(feeds, sync=False, out=out)) == {"graph_launch": 1}  # both kept
    engine.run(feeds, out=out)
    np.testing.assert_array_equal(out["y0"].host(), feeds["in0"].host().astype(np.float16))


def test_copy_graphs_are_bounded_and_say_so(fake, caplog) -> None:
    from graphc.runtime.cuda import MAX_COPY_GRAPHS

    engine, ctx, feeds = fake
    sets = [{k: F.array(v.host() + i) for k, v in feeds.items()} for i in range(MAX_COPY_GRAPHS + 2)]
    with caplog.at_level(logging.INFO, logger="graphc.runtime.cuda"):
        for f in sets:
            for _ in range(3):
                outs = engine.run(f, reuse_outputs=True)
                np.testing.assert_array_equal(outs["y0"].host(), f["in0"].host().astype(np.float16))
    assert len(ctx._copy_graphs) == MAX_COPY_GRAPHS
    assert caplog.text.count("further ones copy by cudaMemcpyAsync") == 1
    assert F.counts_per_call(lambda: engine.run(sets[-1], sync=False, reuse_outputs=True)) == {
        "memcpy_d2d": 2, "graph_launch": 1,
    }  # fmt: skip


def test_a_failed_copy_capture_falls_back_to_memcpys_and_says_so(fake, caplog, monkeypatch) -> None:
    engine, ctx, feeds = fake
    engine.run(feeds, reuse_outputs=True)  # the plain graph captured, the copies by memcpy
    end = ctx.stream.end_capture

    def refused():
        end()
        raise RuntimeError("capture refused")

    monkeypatch.setattr(ctx.stream, "end_capture", refused)
    with caplog.at_level(logging.WARNING, logger="graphc.runtime.cuda"):
        outs = engine.run(feeds, reuse_outputs=True)  # the second sighting: its capture fails
    assert "capturing the input/output copies into the graph failed (capture refused)" in caplog.text
    np.testing.assert_array_equal(outs["y0"].host(), feeds["in0"].host().astype(np.float16))
    assert not ctx._copy_graphs
    assert F.counts_per_call(lambda: engine.run(feeds, sync=False, reuse_outputs=True)) == {
        "memcpy_d2d": 2, "graph_launch": 1,
    }  # fmt: skip


def test_reused_outputs_are_the_engines_own_buffers(fake) -> None:
    engine, ctx, feeds = fake
    a, b, c = _calls(engine, 3, feeds=feeds, reuse_outputs=True)
    assert a == {"capture": 1, "memcpy_d2d": 2, "graph_launch": 1}  # inputs copied, outputs not
    assert b == {"capture": 1, "captured_memcpy": 2, "graph_launch": 1} and c == {"graph_launch": 1}
    outs = engine.run(feeds, reuse_outputs=True)
    assert outs["y0"] is ctx.views["out0"] and outs["y1"] is ctx.views["out1"]
    np.testing.assert_array_equal(outs["y1"].host(), feeds["in0"].host().astype(np.float16))


def test_a_constant_output_is_reused_through_a_buffer_of_its_own() -> None:
    """reuse_outputs returns engine-owned memory; a weight must not be it (a caller writing into
    what it got back would change the engine): such an output is copied into a context buffer."""
    F.MOVE[0] = True
    engine, ctx, feeds = F.fake_engine(inputs=1, outputs=1, const_output=True)
    for _ in range(3):
        outs = engine.run(feeds, reuse_outputs=True)
    assert outs["y0"] is ctx.views["out0"] and outs["yc"].data.ptr != ctx.views["c0"].data.ptr
    outs["yc"].host()[...] = 0  # the caller scribbles on it
    again = engine.run(feeds, reuse_outputs=True)
    assert (again["yc"].host() == 7).all() and (ctx.views["c0"].host() == 7).all()
    assert F.counts_per_call(lambda: engine.run(feeds, sync=False, reuse_outputs=True)) == {"graph_launch": 1}


def test_without_a_graph_the_copies_are_memcpys_around_the_launches(fake) -> None:
    engine, ctx, feeds = fake
    for _ in range(2):
        assert F.counts_per_call(lambda: engine.run(feeds, sync=False, use_graph=False, reuse_outputs=True)) == {
            "memcpy_d2d": 2
        }
    outs = engine.run(feeds, use_graph=False)
    np.testing.assert_array_equal(outs["y0"].host(), feeds["in0"].host().astype(np.float16))
    assert ctx.graph is None and not ctx._copy_graphs


def test_exact_feeds_skip_the_general_checks(fake, monkeypatch) -> None:
    engine, ctx, feeds = fake

    def refuse(*a, **k):
        raise AssertionError("the general path ran")

    monkeypatch.setattr(type(engine), "check_feeds", refuse)
    monkeypatch.setattr(type(ctx), "_stage_inputs", refuse)
    engine.run(feeds)
    with pytest.raises(AssertionError, match="the general path ran"):  # numpy feeds take it
        engine.run({k: v.host().copy() for k, v in feeds.items()})


def test_out_buffers_take_the_outputs_without_an_allocation(fake) -> None:
    engine, ctx, feeds = fake
    out = {s.name: F.array(np.zeros(tuple(s.shape), np.float16)) for s in engine.outputs}
    counts = F.counts_per_call(lambda: engine.run(feeds, sync=False, out=out))
    assert counts == {"capture": 1, "memcpy_d2d": 4, "graph_launch": 1}  # 2 in, 2 out; no alloc, no kernel
    got = engine.run(feeds, out=out)
    assert got["y1"] is out["y1"]
    np.testing.assert_array_equal(out["y1"].host(), feeds["in0"].host().astype(np.float16))
    as_host = engine.run(feeds, out=out, to_numpy=True)
    assert isinstance(as_host["y0"], np.ndarray) and np.array_equal(as_host["y0"], out["y0"].host())
    assert F.counts_per_call(lambda: engine.run(feeds, sync=False, out=out)) == {"graph_launch": 1}


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
    assert F.counts_per_call(lambda: engine.run(own, sync=False, reuse_outputs=True)) == {"graph_launch": 1}


def test_strided_inputs_take_a_copy_kernel_and_say_so(fake, caplog) -> None:
    engine, ctx, feeds = fake
    strided = dict(feeds, in1=F.FakeArray((1, 128), np.float16, strided=True))
    with caplog.at_level(logging.INFO, logger="graphc.runtime.cuda"):
        counts = F.counts_per_call(lambda: engine.run(strided, sync=False))
        engine.run(strided, sync=False)
    assert counts["memcpy_d2d"] == 3 and counts["copy_kernel"] == 1  # in1 by a kernel; in0 and the outputs by memcpy
    outs = engine.run(strided)
    np.testing.assert_array_equal(outs["y0"].host(), feeds["in0"].host().astype(np.float16))
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
    assert r["counts_per_call"] == {"graph_launch": 1, "alloc": 1}  # the steady state: one launch
    assert r["counts_per_call_reuse"] == {"graph_launch": 1}
