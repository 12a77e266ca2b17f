"""A stand-in for the part of cupy that the CUDA executor's run path calls, on host memory: arrays
with addresses, a device-to-device memcpy that copies bytes between them, streams and devices as
no-op context managers, and counters of what a call did (allocations, copy kernels, memcpys, host
uploads). tools/bench_host_overhead.py --fake times graphc's own Python in engine.run with it;
tests/runtime/test_cuda_run_path.py checks the run path's copies and checks with it, without a GPU.
"""

from __future__ import annotations

import math
import threading
import types
from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np

COUNTS: Counter = Counter()
MOVE = [True]  # copy bytes and count (tests); the benchmark turns it off: the fake then costs next to nothing
_BUFFERS: dict[int, np.ndarray] = {}  # base address -> its bytes
_NEXT = [1 << 20]
# freed addresses by rounded size: as cupy's memory pool does, a new array takes the block of one
# freed before it (engine.run's graphs with their copies are keyed on addresses, so this matters)
_FREE: dict[int, list[int]] = {}


def _alloc(nbytes: int, store: bool = True) -> int:
    size = (max(nbytes, 1) + 255) // 256 * 256
    free = _FREE.get(size)
    if free:
        ptr = free.pop()
    else:
        ptr = _NEXT[0]
        _NEXT[0] += size
    if store:
        _BUFFERS[ptr] = np.zeros(max(nbytes, 1), np.uint8)
    return ptr


def _free(ptr: int, nbytes: int) -> None:
    _BUFFERS.pop(ptr, None)
    _FREE.setdefault((max(nbytes, 1) + 255) // 256 * 256, []).append(ptr)


def _bytes_at(ptr: int, nbytes: int) -> np.ndarray:
    for base, buf in _BUFFERS.items():
        if base <= ptr and ptr + nbytes <= base + buf.size:
            return buf[ptr - base : ptr - base + nbytes]
    raise ValueError(f"address {ptr:#x} (+{nbytes}) is in no fake allocation")


class _Data:
    device_id = 0

    def __init__(self, ptr: int):
        self.ptr = ptr

    def __add__(self, offset: int) -> _Data:
        return _Data(self.ptr + offset)


class _Flags:
    def __init__(self, c: bool):
        self.c_contiguous = c


class _Device:
    def __init__(self, id: int = 0):
        self.id = id

    def __enter__(self) -> _Device:
        return self

    def __exit__(self, *a: Any) -> None:
        return None


class FakeArray:
    """A device array of the fake: a dtype, a shape and an address in host memory."""

    def __init__(self, shape: tuple[int, ...], dtype: Any, memptr: _Data | None = None, strided: bool = False):
        self.shape, self.dtype = (shape,) if isinstance(shape, int) else tuple(shape), np.dtype(dtype)
        self.nbytes = math.prod(self.shape) * self.dtype.itemsize
        self._owned = memptr is None
        if memptr is None:
            if MOVE[0]:
                COUNTS["alloc"] += 1
            # with MOVE off an address alone: nothing is stored there
            memptr = _Data(_alloc(self.nbytes, store=MOVE[0]))
        self.data = memptr
        self.flags = _Flags(not strided)
        self._c_contiguous = not strided
        self.device = _Device(0)

    def __del__(self) -> None:
        if self._owned:  # back to the pool with its owner
            _free(self.data.ptr, self.nbytes)

    def host(self) -> np.ndarray:
        return _bytes_at(self.data.ptr, self.nbytes).view(self.dtype).reshape(self.shape)

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        return {"shape": self.shape, "typestr": self.dtype.str, "data": (self.data.ptr, False), "version": 3}

    def copy(self) -> FakeArray:
        if MOVE[0]:
            COUNTS["copy_kernel"] += 1
        out = FakeArray(self.shape, self.dtype)
        if MOVE[0]:
            out.host()[...] = self.host()
        return out

    def set(self, arr: np.ndarray, stream: Any = None) -> None:
        if MOVE[0]:
            COUNTS["h2d"] += 1
        if MOVE[0]:
            self.host()[...] = arr

    def __setitem__(self, key: Any, value: Any) -> None:
        if MOVE[0]:
            COUNTS["copy_kernel"] += 1
        if MOVE[0]:
            self.host()[key] = value.host() if isinstance(value, FakeArray) else value


FakeArray.__module__ = "cupy_fake"  # engine._as_array passes arrays of a module named cupy* through


# Stream capture: while a stream captures, work is recorded into the graph being built instead of
# run (as CUDA does); the graph's launch runs it. Fake kernels and memcpys go through enqueue().
_CAPTURE: list[list[Callable[[], None]] | None] = [None]


def enqueue(op: Callable[[], None]) -> None:
    """Run `op` now, or record it into the graph being captured."""
    if _CAPTURE[0] is not None:
        _CAPTURE[0].append(op)
    else:
        op()


class _Stream:
    ptr = 0

    def __init__(self, non_blocking: bool = False):
        pass

    def begin_capture(self, mode: Any = None) -> None:
        if _CAPTURE[0] is not None:
            raise RuntimeError("fake cupy: a capture is already in progress")
        _CAPTURE[0] = []

    def end_capture(self) -> FakeGraph:
        ops, _CAPTURE[0] = _CAPTURE[0], None
        if MOVE[0]:
            COUNTS["capture"] += 1
        return FakeGraph(ops or [])

    def __enter__(self) -> _Stream:
        return self

    def __exit__(self, *a: Any) -> None:
        return None

    def synchronize(self) -> None:
        if _CAPTURE[0] is not None:
            raise RuntimeError("fake cupy: a stream synchronized while it captures (CUDA refuses it)")
        if MOVE[0]:
            COUNTS["sync"] += 1


class FakeGraph:
    def __init__(self, ops: list[Callable[[], None]] | None = None):
        self.ops = ops or []

    def launch(self, stream: Any = None) -> None:
        if _CAPTURE[0] is not None:
            raise RuntimeError("fake cupy: a graph launched while a stream captures")
        if MOVE[0]:
            COUNTS["graph_launch"] += 1
        for op in self.ops:
            op()


def _memcpy_async(dst: int, src: int, nbytes: int, kind: int, stream: int) -> None:
    """Counted where the host makes the call: "memcpy_d2d" (a cudaMemcpyAsync of the call), or
    "captured_memcpy" (a copy node recorded into a graph being captured)."""
    assert kind == 3, "only device-to-device copies are faked"
    if MOVE[0]:
        COUNTS["captured_memcpy" if _CAPTURE[0] is not None else "memcpy_d2d"] += 1

    def op() -> None:
        if MOVE[0]:
            _bytes_at(dst, nbytes)[...] = _bytes_at(src, nbytes)

    enqueue(op)


def _asnumpy(x: FakeArray, stream: Any = None) -> np.ndarray:
    if _CAPTURE[0] is not None:
        raise RuntimeError("fake cupy: a device-to-host copy while a stream captures (CUDA refuses it)")
    COUNTS["d2h"] += 1
    return x.host().copy()


cupy = types.SimpleNamespace(
    ndarray=FakeArray,
    empty=lambda shape, dtype=None: FakeArray(shape if isinstance(shape, tuple) else (shape,), dtype),
    uint8=np.uint8,
    asarray=lambda x: x if isinstance(x, FakeArray) else _upload(x),
    from_dlpack=lambda x: _upload(np.from_dlpack(x)),
    asnumpy=_asnumpy,
    cuda=types.SimpleNamespace(
        Device=_Device,
        Stream=_Stream,
        runtime=types.SimpleNamespace(memcpyAsync=_memcpy_async, memcpyDeviceToDevice=3, getDevice=lambda: 0),
    ),
)


def _upload(a: np.ndarray) -> FakeArray:
    out = FakeArray(a.shape, a.dtype)
    out.host()[...] = a
    return out


def array(a: np.ndarray) -> FakeArray:
    """A fake device array holding `a` (made outside any count)."""
    out = _upload(np.ascontiguousarray(a))
    COUNTS["alloc"] -= 1
    return out


def fake_engine(
    inputs: int = 2, outputs: int = 1, shape: tuple[int, ...] = (1, 128), const_output: bool = False
) -> tuple[Any, Any, dict]:
    """An Engine whose CUDA context runs on the fake: `inputs` inputs (int64 ids, then float16) and
    `outputs` float16 outputs of `shape`, no steps; the graph launch copies input 0's first row into
    each output, so a test sees data go through (a launch list of one fake kernel, captured into a
    fake graph as the real one is). const_output: one more output, "yc", that is a weight of the
    plan (the constant 7). Returns (engine, context, feeds as fake arrays)."""
    from graphc.runtime.cuda import CUDAContext, CUDAExecutor
    from graphc.runtime.engine import Engine
    from graphc.runtime.plan import ARENA, INPUT, WEIGHT, KernelPlan, TensorSpec

    n = int(np.prod(shape))
    tensors = {}
    for i in range(inputs):
        dt = "int64" if i == 0 else "float16"
        tensors[f"in{i}"] = TensorSpec(f"in{i}", dt, list(shape), n * np.dtype(dt).itemsize, INPUT)
    for i in range(outputs):
        tensors[f"out{i}"] = TensorSpec(f"out{i}", "float16", list(shape), n * 2, ARENA)
    names, public = [f"out{i}" for i in range(outputs)], [f"y{i}" for i in range(outputs)]
    if const_output:
        tensors["c0"] = TensorSpec("c0", "float16", list(shape), n * 2, WEIGHT)
        names, public = [*names, "c0"], [*public, "yc"]
    plan = KernelPlan(tensors, [], [f"in{i}" for i in range(inputs)], names, public)
    ctx = object.__new__(CUDAContext)
    ctx.cupy, ctx.plan, ctx.device, ctx.stream = cupy, plan, 0, _Stream()
    ctx.views = {name: FakeArray(tuple(t.shape), t.dtype) for name, t in tensors.items()}
    if const_output:
        ctx.views["c0"].host()[...] = 7
    ctx.lock = threading.Lock()

    def kernel(grid: Any, block: Any, args: tuple, shared_mem: int = 0, stream: Any = None) -> None:
        """The plan's one fake kernel: input 0 into every output (recorded while capturing)."""

        def op() -> None:
            for i in range(outputs if MOVE[0] else 0):
                ctx.views[f"out{i}"].host()[...] = ctx.views["in0"].host().astype(np.float16)

        enqueue(op)

    ctx.launches, ctx.programmatic, ctx.graph = [(kernel, (1, 1, 1), (1, 1, 1), (), 0, "fake")], [None], None
    ctx.prepare_io()
    executor = object.__new__(CUDAExecutor)
    executor.default = ctx
    engine = Engine("cuda", plan, None, {}, executor)
    rng = np.random.default_rng(0)
    feeds = {
        f"in{i}": array(rng.integers(0, 100, shape) if i == 0 else rng.standard_normal(shape).astype(np.float16))
        for i in range(inputs)
    }
    COUNTS.clear()
    return engine, ctx, feeds


def counts_per_call(call: Callable[[], Any]) -> dict[str, int]:
    """What one call did (allocations, copies, launches), counted with MOVE on."""
    was, MOVE[0] = MOVE[0], True
    COUNTS.clear()
    try:
        call()
        return dict(COUNTS)
    finally:
        COUNTS.clear()
        MOVE[0] = was
