"""Optimization profiles at run time: which plan runs a request, and how it is padded to it.

An engine with profiles (docs/dynamic_shapes.md) holds, per profile, a few fully static plans
("buckets"), each built by the ordinary static compiler for one set of input shapes. A request
is checked against the profiles (one line naming the input, dim and range when it is outside),
then runs on the smallest bucket that holds it: dims the compiler proved paddable are padded up
to the bucket (rows repeated from the last real one, so the padding is as finite as the data)
and the outputs sliced back; every other dynamic dim has a bucket per size, so it runs exactly.
Buckets other than the engine's own plan get their executor (and arena) on first use.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from graphc.runtime.errors import EngineError, EngineInputError
from graphc.runtime.plan import KernelPlan, MemoryPlan

MAX_BUCKETS = 64  # per profile: each is a full plan (compile time, engine size)


@dataclass
class DimGroup:
    """One dynamic dim: the input axes it is on (they always agree), its range, and whether
    requests are padded along it (then `outputs`: output name -> (axis, mult), sliced to mult*n)."""

    name: str
    positions: list[tuple[str, int]]
    min: int
    opt: int
    max: int
    padded: bool
    reason: str = ""
    outputs: dict[str, tuple[int, int]] = field(default_factory=dict)


@dataclass
class Bucket:
    sizes: dict[str, int]  # dim group name -> size
    shapes: dict[str, list[int]]  # input name -> shape
    plan: KernelPlan | None = None  # None: the engine's own plan
    memory: MemoryPlan | None = None
    own_weights: dict[str, np.ndarray] = field(default_factory=dict)  # weights not shared with the engine's plan
    engine: Any = None  # the static Engine that runs it, made on first use
    member: str | None = None  # the engine file member holding own_weights

    @property
    def main(self) -> bool:
        return self.plan is None


@dataclass
class Profile:
    min: dict[str, list[int]]
    opt: dict[str, list[int]]
    max: dict[str, list[int]]
    dims: list[DimGroup]
    buckets: list[Bucket]

    def violation(self, shapes: Mapping[str, tuple[int, ...]]) -> str | None:
        """Why a request's shapes are outside this profile (one line), or None."""
        seen: dict[str, tuple[str, int, int]] = {}
        group_of = {p: g for g in self.dims for p in g.positions}
        for name, shape in shapes.items():
            lo, hi = self.min[name], self.max[name]
            for axis, d in enumerate(shape):
                if not lo[axis] <= d <= hi[axis]:
                    rng = f"{lo[axis]}..{hi[axis]}" if lo[axis] != hi[axis] else f"fixed at {lo[axis]}"
                    return f"input '{name}' dim {axis} is {d}, outside the profile's range {rng}"
                g = group_of.get((name, axis))
                if g is None:
                    continue
                if g.name in seen and seen[g.name][2] != d:
                    other, oaxis, od = seen[g.name]
                    return (
                        f"input '{name}' dim {axis} is {d} but input '{other}' dim {oaxis} is {od}; "
                        f"both are dim '{g.name}'"
                    )
                seen[g.name] = (name, axis, d)
        return None

    def sizes_of(self, shapes: Mapping[str, tuple[int, ...]]) -> dict[str, int]:
        return {g.name: int(shapes[g.positions[0][0]][g.positions[0][1]]) for g in self.dims}

    def bucket_for(self, sizes: Mapping[str, int]) -> Bucket:
        """The smallest bucket holding `sizes`: equal on exact dims, at least as large on padded ones."""
        fits = [
            b
            for b in self.buckets
            if all(
                (b.sizes[g.name] >= sizes[g.name]) if g.padded else (b.sizes[g.name] == sizes[g.name])
                for g in self.dims
            )
        ]
        if not fits:  # validate_profiles proved every size in range has one
            raise EngineError(f"no bucket of the profile holds dims {dict(sizes)}")
        return min(fits, key=lambda b: (sum(math.prod(s) for s in b.shapes.values()), sorted(b.sizes.items())))

    def describe(self) -> str:
        parts = []
        for name in self.min:
            lo, op, hi = self.min[name], self.opt[name], self.max[name]
            parts.append(f"{name} min {_x(lo)} opt {_x(op)} max {_x(hi)}")
        return "; ".join(parts)


def _x(shape: list[int]) -> str:
    return "x".join(str(d) for d in shape) or "scalar"


class DynamicShapes:
    """The profiles of one engine and the buckets' engines; `make_engine(bucket)` builds a static
    Engine for a bucket (it is called at most once per bucket, under a lock)."""

    def __init__(self, profiles: list[Profile], make_engine: Callable[[Bucket], Any] | None = None):
        self.profiles = profiles
        self.make_engine = make_engine
        self._lock = threading.Lock()
        # (name, dtype, shape) of every input of a request that passed the checks -> where it runs:
        # a repeated request shape skips check_feeds and resolve (about 90 us of Python per call
        # measured on the 2-core CI machine, against 3.5 us for a static engine's checked fast path)
        self._seen: dict[tuple, tuple[Profile, Bucket, dict[str, int], bool]] = {}  # bool: no padding

    def resolve(self, engine: Any, feeds: Mapping[str, Any]) -> tuple[Profile, Bucket, dict[str, int]]:
        """The profile and bucket a request runs on, or a one-line EngineInputError."""
        shapes = {k: tuple(int(d) for d in v.shape) for k, v in feeds.items()}
        reasons = []
        for i, p in enumerate(self.profiles):
            why = p.violation(shapes)
            if why is None:
                sizes = p.sizes_of(shapes)
                return p, p.bucket_for(sizes), sizes
            reasons.append(why if len(self.profiles) == 1 else f"profile {i}: {why}")
        raise EngineInputError("; ".join(reasons))

    def bucket_engine(self, engine: Any, bucket: Bucket) -> Any:
        if bucket.main:
            return engine
        with self._lock:
            if bucket.engine is None:
                if self.make_engine is None:
                    raise EngineError("this engine cannot build its other shape buckets here")
                bucket.engine = self.make_engine(bucket)
        return bucket.engine

    def run(self, engine: Any, feeds: Mapping[str, Any], **kwargs: Any) -> dict[str, Any]:
        """Check the feeds (engine.check_feeds, then the profiles), run them on their bucket,
        padded, and slice the outputs back. A request whose inputs' names, dtypes and shapes
        equal those of one already checked (numpy or cupy arrays only) goes straight to its bucket."""
        key = _request_key(feeds)
        hit = self._seen.get(key) if key is not None else None
        if hit is not None:  # checked before: straight to the bucket's executor
            profile, bucket, sizes, exact = hit
            target = engine if bucket.main else bucket.engine
            if exact:
                return target.executor.run(feeds, **kwargs)
            outs = target.executor.run(pad_feeds(profile, bucket, feeds), **kwargs)
            return slice_outputs(profile, sizes, bucket, outs)
        feeds = engine.check_feeds(feeds)
        profile, bucket, sizes = self.resolve(engine, feeds)
        padded = pad_feeds(profile, bucket, feeds)
        # run_static checks the padded shapes against the bucket's plan (once per request shape)
        outs = self.bucket_engine(engine, bucket).run_static(padded, **kwargs)
        if key is not None and len(self._seen) < MAX_SEEN_SHAPES:
            exact = all(tuple(x.shape) == tuple(bucket.shapes[n]) for n, x in feeds.items())
            self._seen[key] = (profile, bucket, sizes, exact)
        return slice_outputs(profile, sizes, bucket, outs)


MAX_SEEN_SHAPES = 1024  # request shapes remembered per engine (a bound, not a cache policy)


def _request_key(feeds: Mapping[str, Any]) -> tuple | None:
    """The request's (name, dtype, shape) per input when every input is a numpy or cupy array
    (those check_feeds passes through unchanged), else None (the full checks run every time)."""
    key = []
    for name, x in feeds.items():
        if not (isinstance(x, np.ndarray) or type(x).__module__.startswith("cupy")):
            return None
        key.append((name, x.dtype, x.shape))
    return tuple(key)


def pad_feeds(profile: Profile, bucket: Bucket, feeds: Mapping[str, Any]) -> dict[str, Any]:
    """Each input grown to the bucket's shape along its padded dims, repeating the last real row."""
    out = {}
    for name, x in feeds.items():
        want = bucket.shapes[name]
        if list(x.shape) == list(want):
            out[name] = x
            continue
        xp = _array_module(x)
        widths = [(0, int(w) - int(d)) for d, w in zip(x.shape, want, strict=True)]
        out[name] = xp.pad(x, widths, mode="edge")
    return out


def slice_outputs(
    profile: Profile, sizes: Mapping[str, int], bucket: Bucket, outs: Mapping[str, Any]
) -> dict[str, Any]:
    """The real rows of each output: mult*n along each padded dim's axis."""
    res = dict(outs)
    for g in profile.dims:
        if not g.padded or bucket.sizes[g.name] == sizes[g.name]:
            continue
        for name, (axis, mult) in g.outputs.items():
            y = res[name]
            index = [slice(None)] * y.ndim
            index[axis] = slice(0, mult * sizes[g.name])
            res[name] = _array_module(y).ascontiguousarray(y[tuple(index)])
    return res


def _array_module(x: Any) -> Any:
    if type(x).__module__.startswith("cupy"):
        import cupy

        return cupy
    return np


def bucket_shapes(opt: Mapping[str, list[int]], dims: list[DimGroup], sizes: Mapping[str, int]) -> dict[str, list[int]]:
    """A bucket's input shapes: the opt shapes with every dynamic dim at the bucket's size."""
    shapes = {k: list(v) for k, v in opt.items()}
    for g in dims:
        for name, axis in g.positions:
            shapes[name][axis] = int(sizes[g.name])
    return shapes


def batch_sizes(profiles: list[Profile]) -> range | tuple[int, ...]:
    """The batch sizes (dim 0) a Batcher may run: one dim on axis 0 of every input, over all profiles."""
    sizes: set[int] = set()
    for p in profiles:
        heads = set()
        for name in p.min:
            if not p.min[name]:
                raise EngineError(f"cannot batch this engine: input '{name}' is a scalar")
            g = next((g for g in p.dims if (name, 0) in g.positions), None)
            heads.add(g.name if g else ("fixed", p.min[name][0]))
        if len(heads) != 1:
            raise EngineError("cannot batch this engine: its inputs do not share one batch dim 0")
        name = next(iter(p.min))
        sizes.update(range(p.min[name][0], p.max[name][0] + 1))
    lo, hi = min(sizes), max(sizes)
    return range(lo, hi + 1) if sizes == set(range(lo, hi + 1)) else tuple(sorted(sizes))


# ---- the manifest's form -----------------------------------------------------------------------


def profiles_to_json(profiles: list[Profile], plan_json: Callable[[Bucket], dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {
            "min": p.min,
            "opt": p.opt,
            "max": p.max,
            "dims": [
                {
                    "name": g.name,
                    "positions": [[n, a] for n, a in g.positions],
                    "min": g.min,
                    "opt": g.opt,
                    "max": g.max,
                    "padded": g.padded,
                    "reason": g.reason,
                    "outputs": {k: [a, m] for k, (a, m) in g.outputs.items()},
                }
                for g in p.dims
            ],
            "buckets": [{"sizes": b.sizes, **plan_json(b)} for b in p.buckets],
        }
        for p in profiles
    ]


def describe_profiles(profiles: list[Profile]) -> list[str]:
    """Lines for `graphc inspect`: each profile's ranges, dims and buckets."""
    lines = []
    for i, p in enumerate(profiles):
        lines.append(f"profile {i}: {p.describe()}")
        for g in p.dims:
            how = "padded to a bucket" if g.padded else f"exact sizes ({g.reason})"
            lines.append(f"  dim '{g.name}' {g.min}..{g.max} (opt {g.opt}) on {_positions(g)}: {how}")
        sizes = [
            ", ".join(f"{k}={v}" for k, v in b.sizes.items()) + (" [engine plan]" if b.main else "") for b in p.buckets
        ]
        lines.append(f"  {len(p.buckets)} bucket(s): " + "; ".join(sizes))
    return lines


def _positions(g: DimGroup) -> str:
    return ", ".join(f"{n}[{a}]" for n, a in g.positions)


__all__ = [
    "MAX_BUCKETS",
    "Bucket",
    "DimGroup",
    "DynamicShapes",
    "Profile",
    "batch_sizes",
    "bucket_shapes",
    "describe_profiles",
    "pad_feeds",
    "profiles_to_json",
    "slice_outputs",
]
