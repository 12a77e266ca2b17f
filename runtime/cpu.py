"""The CPU executor: runs a kernel plan with every tensor a numpy view into one arena.

Each intermediate is written at its planned offset, so a planning bug (two live tensors sharing
bytes) shows up as a wrong answer. The arena starts filled with 0xFF bytes (NaN for floats), so a
step reading bytes that nothing wrote shows up too.

The CPU target's kernels are the numpy reference kernels (graphc.runtime.reference), the code the
interpreter runs too. `reference_kernel` makes one from a plan step: the op name picks a kernel
from the closed kernel table and the attrs are decoded through the closed, versioned attrs table
(graphc.runtime.attrs); nothing of the compiler is imported, and no name in the engine chooses
other code.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from graphc.runtime.attrs import SCHEMA_VERSION, AttrsError, decode_attrs
from graphc.runtime.errors import EngineError
from graphc.runtime.plan import ALIAS, ARENA, INPUT, WEIGHT, KernelPlan, MemoryPlan, Step, alias_byte_offset

StepFn = Callable[[list[Any]], list[Any]]
KernelFactory = Callable[[Step], StepFn]


def check_attrs_schema(version: Any, path: Any = "engine") -> None:
    """Refuse an engine whose attrs were written against another version of the attrs table."""
    if version is None:
        raise EngineError(f"{path}: it records no attrs table version (written by an older graphc): rebuild the engine")
    if version != SCHEMA_VERSION:
        raise EngineError(
            f"{path}: its step attrs follow attrs table version {version!r}, this runtime reads version "
            f"{SCHEMA_VERSION}: rebuild the engine with this graphc"
        )


def reference_kernel(step: Step) -> StepFn:
    """The numpy kernel of one plan step, with its attrs decoded and checked against the table."""
    from graphc.runtime.reference import get_kernel

    try:
        fn = get_kernel(step.op, step.domain)
    except KeyError:
        raise EngineError(f"step '{step.name}': op {step.op!r} (domain {step.domain!r}) has no CPU kernel") from None
    try:
        attrs = decode_attrs(step.op, step.domain, step.attrs)
    except AttrsError as e:
        raise EngineError(f"step '{step.name}': {e}") from None
    if step.op == "Fused" and step.domain == "graphc":
        _check_fused_refs(step, attrs)
    n_out = len(step.outputs)

    def run(inputs: list[Any]) -> list[Any]:
        return fn(inputs, attrs, n_out)

    return run


def _check_fused_refs(step: Step, attrs: Any) -> None:
    """A fused step's anchor and epilogue refer only to inputs the step has."""
    n_in = len(step.inputs)
    refs = [r for e in attrs.epilogue for r in e.args] + list(attrs.outputs)
    if attrs.anchor_inputs > n_in or any(r.kind == "in" and r.index >= n_in for r in refs):
        raise EngineError(f"step '{step.name}': its fused epilogue refers to an input the step does not have")


def numpy_dtype(name: str) -> np.dtype:
    try:
        return np.dtype(name)
    except TypeError:
        import ml_dtypes

        return np.dtype(getattr(ml_dtypes, name))


class CPUExecutor:
    def __init__(
        self,
        plan: KernelPlan,
        memory: MemoryPlan,
        weights: Mapping[str, np.ndarray],
        kernel_factory: KernelFactory,
    ):
        self.plan = plan
        self.memory = memory
        self.arena = np.full(max(memory.arena_bytes, 1), 0xFF, dtype=np.uint8)
        self.views: dict[str, np.ndarray] = {}
        for name, t in plan.tensors.items():
            dt = numpy_dtype(t.dtype)
            if t.kind in (ARENA, INPUT):
                off = memory.placements[name].offset
                self.views[name] = np.ndarray(tuple(t.shape), dtype=dt, buffer=self.arena, offset=off)
            elif t.kind == WEIGHT:
                if name not in weights:
                    raise EngineError(f"weight '{name}' is missing")
                self.views[name] = weights[name]
        for name, t in plan.tensors.items():
            if t.kind != ALIAS:
                continue
            root = memory.aliases[name]
            skip = alias_byte_offset(plan.tensors, name)  # a slab view starts inside its root
            if plan.tensors[root].kind == WEIGHT:
                flat = self.views[root].reshape(-1)
                start = skip // flat.dtype.itemsize
                self.views[name] = flat[start : start + math.prod(t.shape)].reshape(t.shape)
            else:
                self.views[name] = np.ndarray(
                    tuple(t.shape),
                    dtype=numpy_dtype(t.dtype),
                    buffer=self.arena,
                    offset=memory.placements[root].offset + skip,
                )
        self.kernels: list[StepFn | None] = [None if s.alias else kernel_factory(s) for s in plan.steps]

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        for name in self.plan.inputs:
            self.views[name][...] = feeds[name]
        for step, fn in zip(self.plan.steps, self.kernels, strict=True):
            if fn is None:
                continue
            ins = [None if n is None else self.views[n] for n in step.inputs]
            outs = fn(ins)
            for name, val in zip(step.outputs, outs, strict=False):
                self.views[name][...] = val
        return {
            public: np.array(self.views[name], copy=True)
            for public, name in zip(self.plan.output_names, self.plan.outputs, strict=True)
        }
