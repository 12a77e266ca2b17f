"""engine.run's output ring (runtime/output_ring.py) without a GPU: a CUDA engine compiled for
sm_90 (NVRTC runs here) runs through graphc's CUDA run path with tools/fake_cupy.py for cupy and
each kernel's numpy reference for the kernel (tests/fake_gpu.py). Checks: the kernels write the
outputs into a slot the caller gave back (no copy out, no allocation), a result the caller keeps
(or keeps a pointer into) is never overwritten, output_ring=0 and plans the ring cannot serve keep
the copy path, and every result matches numpy."""

from __future__ import annotations

import sys
from pathlib import Path

import fake_gpu as G
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import graphc

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
import fake_cupy as F  # noqa: E402

from graphc.runtime.output_ring import ring_roots  # noqa: E402

ARCH = "sm_90"
FL = TensorProto.FLOAT


def _model() -> onnx.ModelProto:
    """Two outputs: relu(x * 2 + b), and a reshaped sigmoid(x) (an output that is a view)."""
    b = helper.make_tensor("b", FL, [16], np.linspace(-1, 1, 16).astype(np.float32))
    nodes = [
        helper.make_node("Mul", ["x", "two"], ["m"]),
        helper.make_node("Add", ["m", "b"], ["a"]),
        helper.make_node("Relu", ["a"], ["y"]),
        helper.make_node("Sigmoid", ["x"], ["s"]),
        helper.make_node("Reshape", ["s", "shape"], ["z"]),
    ]
    inits = [b, helper.make_tensor("two", FL, [], [2.0]), helper.make_tensor("shape", TensorProto.INT64, [2], [16, 4])]
    g = helper.make_graph(
        nodes, "ring", [helper.make_tensor_value_info("x", FL, [4, 16])],
        [helper.make_tensor_value_info("y", FL, [4, 16]), helper.make_tensor_value_info("z", FL, [16, 4])], inits,
    )  # fmt: skip
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _ref(x: np.ndarray) -> dict[str, np.ndarray]:
    b = np.linspace(-1, 1, 16).astype(np.float32)
    return {"y": np.maximum(x * 2 + b, 0), "z": (1 / (1 + np.exp(-x))).reshape(16, 4)}


@pytest.fixture(scope="module")
def built():
    return graphc.compile(_model(), target="cuda", arch=[ARCH])


def _on_fake(monkeypatch, eng, **kw):
    ex = G.fake_executor(
        monkeypatch, eng.plan, eng.memory, eng.weights, eng.kernels.cubins[ARCH], eng.kernels.names, ARCH
    )
    if "output_ring" in kw:
        ex.default.set_output_ring(kw["output_ring"])
    eng.executor = ex
    return ex.default


def _x(i: int) -> np.ndarray:
    return np.random.default_rng(i).standard_normal((4, 16)).astype(np.float32)


def _close(out: dict, x: np.ndarray) -> None:
    for k, r in _ref(x).items():
        np.testing.assert_allclose(out[k].host(), r, rtol=1e-6, atol=1e-6, err_msg=k)


def test_the_plan_has_a_root_per_output(built) -> None:
    roots = ring_roots(built.plan, built.memory)
    assert roots is not None and len(roots) == 2 and len(set(roots)) == 2


def test_back_to_back_calls_write_the_outputs_in_place(built, monkeypatch) -> None:
    ctx = _on_fake(monkeypatch, built)
    x = F.array(_x(0))
    y = None
    counts = []
    for i in range(6):
        x.host()[...] = _x(i)
        counts.append(F.counts_per_call(lambda: ctx.run_exact({"x": x}, sync=False)))
        y = built.run({"x": x})  # the previous result is dropped once this one is assigned
        _close(y, _x(i))
    ring = ctx._ring
    assert len(ring.slots) == 2
    # once both slots and their graphs exist: one graph launch a call, no copy out, no allocation
    assert counts[-1] == counts[-2] == {"graph_launch": 1}
    slot_ptrs = {int(b.data.ptr) for s in ring.slots for b in s.buffers}
    assert {int(v.data.ptr) for v in y.values()} <= slot_ptrs


def test_a_kept_result_is_never_overwritten(built, monkeypatch) -> None:
    ctx = _on_fake(monkeypatch, built)
    x = F.array(_x(0))
    kept = []
    for i in range(5):
        x.host()[...] = _x(i)
        kept.append(built.run({"x": x}))
    for i, out in enumerate(kept):
        _close(out, _x(i))
    assert len(ctx._ring.slots) == 2  # both slots held: the later calls copied into new arrays
    assert len({int(o["y"].data.ptr) for o in kept}) == 5


def test_a_pointer_into_a_result_keeps_its_slot_held(built, monkeypatch) -> None:
    ctx = _on_fake(monkeypatch, built)
    x = F.array(_x(1))
    out = built.run({"x": x})
    ptr = out["y"].data  # what a view, a DLPack capsule or an array interface export keeps alive
    held = int(ptr.ptr)
    del out
    x.host()[...] = _x(2)
    for _ in range(3):
        _close(built.run({"x": x}), _x(2))
    np.testing.assert_allclose(F._bytes_at(held, 4 * 64).view(np.float32).reshape(4, 16), _ref(_x(1))["y"], rtol=1e-6)
    del ptr
    assert any(s.free() for s in ctx._ring.slots)


def test_output_ring_zero_copies_into_new_arrays(built, monkeypatch) -> None:
    ctx = _on_fake(monkeypatch, built, output_ring=0)
    assert ctx._ring is None
    x = F.array(_x(3))
    built.run({"x": x})
    built.run({"x": x})
    c = F.counts_per_call(lambda: built.run({"x": x}, sync=False))
    assert c.get("alloc") == 2  # the two outputs, copied inside the captured graph
    _close(built.run({"x": x}), _x(3))


def test_to_numpy_and_reuse_outputs_still_work(built, monkeypatch) -> None:
    ctx = _on_fake(monkeypatch, built)
    x = F.array(_x(4))
    for _ in range(3):
        res = built.run({"x": x}, to_numpy=True)
        for k, r in _ref(_x(4)).items():
            np.testing.assert_allclose(res[k], r, rtol=1e-6, atol=1e-6)
    own = built.run({"x": x}, reuse_outputs=True)
    assert int(own["y"].data.ptr) == int(ctx.views[ctx.plan.outputs[0]].data.ptr)
    _close(own, _x(4))


def test_outputs_that_are_constants_or_inputs_keep_the_copy_path() -> None:
    engine, ctx, _feeds = F.fake_engine(inputs=1, outputs=1, const_output=True)
    plan = ctx.plan

    class Mem:
        aliases: dict = {}

    assert ring_roots(plan, Mem()) is None  # "yc" is a weight of the plan
