"""Engine: a compiled model, ready to run. Made by `graphc.compile()` or `graphc.runtime.load()`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from graphc.runtime.errors import EngineInputError
from graphc.runtime.plan import KernelPlan, MemoryPlan


def _as_array(x: Any, target: str) -> Any:
    """numpy and cupy arrays as they are; any other tensor (torch, jax...) through the CUDA array
    interface or DLPack without a copy (cupy for cuda engines, numpy for cpu ones)."""
    if isinstance(x, np.ndarray):
        return x
    if type(x).__module__.startswith("cupy"):
        return x
    if target == "cuda" and (hasattr(x, "__cuda_array_interface__") or hasattr(x, "__dlpack__")):
        import cupy

        return cupy.asarray(x) if hasattr(x, "__cuda_array_interface__") else cupy.from_dlpack(x)
    if hasattr(x, "__dlpack__"):
        try:
            return np.from_dlpack(x)
        except (RuntimeError, TypeError, BufferError):
            pass
    return np.asarray(x)


def _dtype_or_none(name: str) -> np.dtype | None:
    """The numpy dtype of a dtype name (ml_dtypes' for bfloat16 and the float8s), None where there
    is none (such an input is always checked by name, the slow way)."""
    try:
        return np.dtype(name)
    except TypeError:
        try:
            import ml_dtypes

            return np.dtype(getattr(ml_dtypes, name))
        except (ImportError, AttributeError, TypeError):
            return None


def _exact_runner(executor: Any, dynamic: Any) -> Any:
    """The default CUDA context's run_exact (None for other executors, and for an engine with
    profiles, whose feeds choose a bucket): it runs feeds of the exact form and returns None,
    having done nothing, for any other."""
    if dynamic is not None:
        return None
    ctx = getattr(executor, "default", None)
    return getattr(ctx, "run_exact", None)


@dataclass
class IOSpec:
    name: str
    dtype: str
    shape: list[int]


@dataclass
class Engine:
    """`engine.run(feeds)` or `engine(**feeds)`; `engine.report` says what the compiler did."""

    target: str
    plan: KernelPlan
    memory: MemoryPlan
    weights: dict[str, np.ndarray]
    executor: Any
    report: dict[str, Any] = field(default_factory=dict)
    build_info: dict[str, Any] = field(default_factory=dict)
    kernels: Any = None  # the CUDA target's KernelSet (sources and cubins)
    # optimization profiles (runtime/profiles.py DynamicShapes); None: a fixed-shape engine
    dynamic: Any = None

    @property
    def profiles(self) -> list[Any]:
        """The optimization profiles (min/opt/max shapes per input); [] for a fixed-shape engine."""
        return list(self.dynamic.profiles) if self.dynamic is not None else []

    @property
    def batch_sizes(self) -> Any:
        """For the Batcher: a callable giving the batch sizes an engine with profiles runs at, or
        None for a fixed-shape engine (the Batcher then takes the one batch of its inputs)."""
        if self.dynamic is None:
            return None
        from graphc.runtime.profiles import batch_sizes

        return lambda: batch_sizes(self.dynamic.profiles)

    @property
    def inputs(self) -> list[IOSpec]:
        return [self._spec(n, n) for n in self.plan.inputs]

    @property
    def outputs(self) -> list[IOSpec]:
        return [self._spec(p, n) for p, n in zip(self.plan.output_names, self.plan.outputs, strict=True)]

    def _spec(self, public: str, name: str) -> IOSpec:
        t = self.plan.tensors[name]
        return IOSpec(public, t.dtype, list(t.shape))

    def check_feeds(self, feeds: Mapping[str, Any]) -> dict[str, Any]:
        """The feeds as arrays, each checked against its input's dtype and shape (with profiles:
        its rank; the profiles check the dims)."""
        if getattr(self, "dynamic", None) is None:  # a fixed-shape engine: the per-call fast path first
            fast = self._checked_fast(feeds)
            if fast is not None:
                return fast
        expected = {s.name: s for s in self.inputs}
        unknown = sorted(set(feeds) - set(expected))
        if unknown:
            raise EngineInputError(f"unknown input(s) {unknown}; the engine takes {sorted(expected)}")
        out = {}
        for name, spec in expected.items():
            if name not in feeds:
                raise EngineInputError(f"input '{name}' ({spec.dtype}{spec.shape}) is missing")
            x = _as_array(feeds[name], self.target)
            dtype, shape = str(x.dtype), list(x.shape)
            if dtype != spec.dtype:
                raise EngineInputError(f"input '{name}' has dtype {dtype}, the engine takes {spec.dtype}")
            if self.dynamic is not None:
                if len(shape) != len(spec.shape):
                    raise EngineInputError(
                        f"input '{name}' has rank {len(shape)} (shape {tuple(shape)}), the engine takes rank "
                        f"{len(spec.shape)}"
                    )
            elif shape != spec.shape:
                raise EngineInputError(
                    f"input '{name}' has shape {tuple(shape)}, the engine was built for {tuple(spec.shape)}"
                )
            out[name] = x
        return out

    def run(self, feeds: Mapping[str, Any], **kwargs: Any) -> dict[str, Any]:
        """One inference: input name -> array (numpy, cupy, or any DLPack / CUDA array interface
        tensor); returns output name -> array. CUDA keywords (runtime/cuda.py CUDAContext.run):
        sync, to_numpy, use_graph, out= (the caller's arrays), reuse_outputs=True (the engine's own
        output buffers, valid until the next run)."""
        # the fast path (issue 11, host overhead): feeds of the exact form (every input and nothing
        # else, cupy arrays of the input's dtype and shape) are checked by the CUDA context alone;
        # any other feeds take the checks of check_feeds, whose errors name the input
        exact = self.__dict__.get("_run_exact")
        if exact is None or exact[0] is not self.executor or exact[1] is not self.dynamic:
            exact = (self.executor, self.dynamic, _exact_runner(self.executor, self.dynamic))
            self.__dict__["_run_exact"] = exact
        if exact[2] is not None:
            outs = exact[2](feeds, **kwargs)
            if outs is not None:
                return outs
        if self.dynamic is not None:
            # the profile's bucket for these shapes, padded where the compiler proved it safe
            return self.dynamic.run(self, feeds, **kwargs)  # it checks the feeds (once per request shape)
        return self.run_static(feeds, **kwargs)

    def run_static(self, feeds: Mapping[str, Any], **kwargs: Any) -> dict[str, Any]:
        """Run this engine's own plan at exactly its input shapes."""
        if self.executor is None:
            from graphc.runtime.errors import EngineError

            raise EngineError(
                f"this {self.target} engine was built on a machine without a GPU; save it "
                "(engine.save(path)) and load it where there is one"
            )
        if self.dynamic is not None:
            expected = {s.name: s.shape for s in self.inputs}
            for name, x in feeds.items():
                if list(x.shape) != expected[name]:
                    raise EngineInputError(
                        f"input '{name}' has shape {tuple(x.shape)}, the plan is for {expected[name]}"
                    )
            return self.executor.run(feeds, **kwargs)
        return self.executor.run(self.check_feeds(feeds), **kwargs)

    def __repr__(self) -> str:
        # one line: the dataclass repr would print every weight and step (445,000 characters for BERT)
        ios = ", ".join(f"{s.name} {s.dtype}{s.shape}" for s in self.inputs)
        return (
            f"<graphc Engine {self.target} {self.build_info.get('precision', '')}: {len(self.plan.steps)} steps, "
            f"inputs {ios}; outputs {', '.join(s.name for s in self.outputs)}"
            + (f"; {len(self.profiles)} profile(s): {self.profiles[0].describe()}" if self.dynamic else "")
            + ">"
        )

    def __call__(self, **feeds: Any) -> dict[str, Any]:
        return self.run(feeds)

    def save(self, path: Any) -> None:
        """Write the engine file (see graphc.runtime.format)."""
        from graphc.runtime.format import save_engine

        save_engine(self, path)

    def _checked_fast(self, feeds: Mapping[str, Any]) -> dict[str, Any] | None:
        """The feeds as arrays when every input is there with its dtype and shape, else None (then
        check_feeds' full path says what is wrong). The (name, numpy dtype, shape) of each input is
        made once: a call compares dtype objects and shape tuples and builds nothing (engine.run's
        host overhead, issue 11)."""
        checks = self.__dict__.get("_feed_checks")
        if checks is None:
            checks = tuple((s.name, _dtype_or_none(s.dtype), tuple(s.shape)) for s in self.inputs)
            self.__dict__["_feed_checks"] = checks
        if len(feeds) != len(checks):
            return None
        out = {}
        for name, dtype, shape in checks:
            x = feeds.get(name)
            if x is None:
                return None
            x = _as_array(x, self.target)
            if dtype is None or x.dtype != dtype or x.shape != shape:
                return None
            out[name] = x
        return out

    def create_context(self) -> Any:
        """A new execution context (own arena and stream, shared weights) for another thread."""
        if self.executor is None or not hasattr(self.executor, "create_context"):
            from graphc.runtime.errors import EngineError

            raise EngineError(f"{self.target} engines have no execution contexts")
        return self.executor.create_context()
