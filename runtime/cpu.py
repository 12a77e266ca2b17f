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


def _is_host_if(step: Step) -> bool:
    return step.op == "If" and step.domain == "" and "host_if_version" in step.attrs


HOST_IF_VERSION = 1  # the sub-plan layout graphc/host_if.py writes


def host_if_kernel(step: Step, plan: KernelPlan, weights: Mapping[str, np.ndarray], factory: KernelFactory) -> StepFn:
    """A data-dependent If: each branch is a planned sub-plan (kernel plan + memory plan) with an
    executor and arena of its own; the condition, read on the host, picks the one that runs."""
    from graphc.runtime.plan import KernelPlan, memory_plan_from_json

    where = f"step '{step.name}' (If)"
    if step.attrs.get("host_if_version") != HOST_IF_VERSION:
        raise EngineError(f"{where}: sub-plan layout {step.attrs.get('host_if_version')!r}, expected {HOST_IF_VERSION}")
    branches: list[Any] = []
    for key in ("then_branch", "else_branch"):
        d = step.attrs.get(key)
        if isinstance(d, dict) and isinstance(d.get("refused"), str):  # it cannot run on these shapes
            branches.append((None, int(d.get("num_captures", 0)), d["refused"]))
            continue
        try:
            sub_plan = KernelPlan.from_json(d["plan"])
            for_plan = getattr(factory, "for_plan", None)  # the loader's factory checks each step's results
            sub_factory = for_plan(sub_plan) if for_plan else factory
            sub = CPUExecutor(sub_plan, memory_plan_from_json(d["memory"]), weights, sub_factory)
            n_caps = int(d["num_captures"])
            # the captures the sub-plan takes as inputs (the others were constants, folded into it)
            take = [int(i) for i in d["inputs_from"]]
        except EngineError as e:
            raise EngineError(f"{where} {key}: {e}") from None
        except (KeyError, TypeError, ValueError) as e:  # a malformed or edited sub-plan
            raise EngineError(f"{where}: its {key} sub-plan is malformed ({type(e).__name__}: {e})") from None
        if len(sub_plan.inputs) != len(take) or any(not 0 <= i < n_caps for i in take):
            raise EngineError(f"{where}: its {key} sub-plan's inputs do not match the captures it names")
        if len(sub_plan.outputs) != len(step.outputs):
            raise EngineError(f"{where}: its {key} sub-plan takes or gives a different number of values")
        for name, out in zip(sub_plan.outputs, step.outputs, strict=True):
            a, b = sub_plan.tensors[name], plan.tensors[out]
            if (a.dtype, list(a.shape)) != (b.dtype, list(b.shape)):
                raise EngineError(
                    f"{where}: {key} output {name} is {a.dtype}{a.shape}, the step's {out} {b.dtype}{b.shape}"
                )
        branches.append((sub, n_caps, take))
    (then_x, nt, then_take), (else_x, _, else_take) = branches

    def run(inputs: list[Any]) -> list[Any]:
        c = np.asarray(inputs[0])
        if c.size != 1:
            raise EngineError(f"{where}: the condition must have one element, it has shape {c.shape}")
        caps = inputs[1:]
        x, bound, take = (then_x, caps[:nt], then_take) if bool(c.reshape(())) else (else_x, caps[nt:], else_take)
        if x is None:
            raise EngineError(f"{where}: {take}")
        outs = x.run(dict(zip(x.plan.inputs, [bound[i] for i in take], strict=True)))
        return [outs[p] for p in x.plan.output_names]

    return run


def _is_host_loop(step: Step) -> bool:
    from graphc.runtime.host_loop_cpu import is_host_loop

    return is_host_loop(step)


def _host_loop_kernel(
    step: Step, plan: KernelPlan, weights: Mapping[str, np.ndarray], factory: KernelFactory
) -> StepFn:
    from graphc.runtime.host_loop_cpu import host_loop_kernel  # a Loop/Scan whose body is a sub-plan

    return host_loop_kernel(step, plan, weights, factory)


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
            if t.kind in (ARENA, INPUT) and dt.hasobject:
                # strings are Python objects: a view of the arena's bytes as object pointers would
                # hand numpy garbage pointers (a crash), so each gets an array of its own
                self.views[name] = np.full(tuple(t.shape), "", dtype=dt)
            elif t.kind in (ARENA, INPUT):
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
            if plan.tensors[root].kind == WEIGHT or numpy_dtype(t.dtype).hasobject:
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
        self.kernels: list[StepFn | None] = [
            None
            if s.alias
            else host_if_kernel(s, plan, weights, kernel_factory)
            if _is_host_if(s)
            else _host_loop_kernel(s, plan, weights, kernel_factory)
            if _is_host_loop(s)
            else kernel_factory(s)
            for s in plan.steps
        ]

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
