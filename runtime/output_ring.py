"""Output buffers written in place by the captured graph (engine.run's ordinary call, issue 11).

engine.run's ordinary call returns new arrays that stay valid after later calls. Before this
module, the graph wrote each output into the arena and a captured device-to-device copy moved it
into a newly allocated array: for GPT-2 at batch 32 (412 MB of fp16 logits) that copy was 0.14 ms
of a 2.5 ms call, the one row where graphc was slower than torch.compile's reduce-overhead
(whose outputs are its graph's own buffers, overwritten by the next replay).

A ring instead gives each context a few sets ("slots") of output buffers outside the arena, each
with its own launch list (the same kernels, the outputs' arguments and tensor maps pointing at the
slot) and its own captured graphs. A call takes a slot that the caller no longer holds and returns
arrays over it: the kernels write the outputs where the caller reads them, no copy. Whether the
caller still holds a slot is read from reference counts: every array returned over a slot, every
view of one and every DLPack or CUDA-array-interface export keeps a reference to the slot's
memory-pointer objects. A slot whose objects are referenced by nothing but the ring is free; when
every slot is held (a caller that keeps its results) the call takes the copy path as before, so
a result is never overwritten.

The ring applies to plans whose outputs each have an arena root of their own, of exactly the
output's bytes (the common case; constant outputs, outputs that are inputs or views into a larger
tensor keep the copy path), and to contexts captured whole (no host-If decisions)."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from graphc.runtime.plan import ALIAS, ARENA, KernelPlan, MemoryPlan, alias_byte_offset

# Slots per context: two serve a loop that keeps the last result while the next call runs
# (`y = engine.run(x)` holds the previous y until the new one is assigned); each costs the
# outputs' bytes once, and its graphs.
DEFAULT_SLOTS = 2


def ring_roots(plan: KernelPlan, memory: MemoryPlan) -> list[str] | None:
    """Per output, the arena tensor that holds it, where every output has one of its own and is
    all of it; else None (the plan keeps the copy path)."""
    roots: list[str] = []
    for name in plan.outputs:
        t = plan.tensors[name]
        root = memory.aliases.get(name, name) if t.kind == ALIAS else name
        r = plan.tensors.get(root)
        if r is None or r.kind != ARENA or int(r.nbytes) != int(t.nbytes):
            return None
        if t.kind == ALIAS and alias_byte_offset(plan.tensors, name) != 0:
            return None
        roots.append(root)
    if not roots or len(set(roots)) != len(roots):
        return None
    return roots


def slot_views(
    plan: KernelPlan, memory: MemoryPlan, views: Mapping[str, Any], buffers: Mapping[str, Any], cupy: Any, dtype_of: Any
) -> dict[str, Any]:
    """The context's views with each root of `buffers` (root name -> a buffer of its bytes) and
    every alias of it moved into that buffer."""
    out = dict(views)
    for root, buf in buffers.items():
        t = plan.tensors[root]
        out[root] = cupy.ndarray(tuple(t.shape), dtype=dtype_of(t.dtype), memptr=buf.data)
    for name, t in plan.tensors.items():
        if t.kind == ALIAS and memory.aliases.get(name) in buffers:
            root = out[memory.aliases[name]]
            skip = alias_byte_offset(plan.tensors, name)
            out[name] = cupy.ndarray(tuple(t.shape), dtype=dtype_of(t.dtype), memptr=root.data + skip)
    return out


def _holders(buf: Any) -> tuple[int, ...]:
    """Reference counts of what a caller's arrays over `buf` keep alive: its memory pointer and,
    in cupy, the memory object behind it (a view of a returned array makes a new pointer to it)."""
    data = buf.data
    mem = getattr(data, "mem", None)
    return (sys.getrefcount(data), sys.getrefcount(mem)) if mem is not None else (sys.getrefcount(data),)


@dataclass(eq=False)
class OutputSlot:
    """One set of output buffers, the launch list that writes them, and its captured graphs (the
    same fields a context keeps for its own launch list)."""

    buffers: list[Any]  # per output root, in output order
    outputs: list[tuple[str, tuple[int, ...], Any, Any]]  # (public name, shape, dtype, memory pointer)
    launches: list[tuple]
    programmatic: list[Any]
    keep: list[Any] = field(default_factory=list)  # what the launch list's arguments point into
    graph: Any = None
    _copy_graphs: dict = field(default_factory=dict)
    _sightings: dict = field(default_factory=dict)
    _base: tuple = ()

    def seal(self) -> None:
        """Record the reference counts the ring itself holds: from now on more means held."""
        self._base = tuple(c for b in self.buffers for c in _holders(b))

    def free(self) -> bool:
        return tuple(c for b in self.buffers for c in _holders(b)) == self._base

    def arrays(self, ndarray: Any) -> dict[str, Any]:
        """New arrays over the slot's buffers, by public output name."""
        return {public: ndarray(shape, dtype=dtype, memptr=ptr) for public, shape, dtype, ptr in self.outputs}


@dataclass(eq=False)
class OutputRing:
    roots: list[str]
    size: int = DEFAULT_SLOTS
    slots: list[OutputSlot] = field(default_factory=list)
    next: int = 0
    held_logged: bool = False

    def take(self) -> OutputSlot | None:
        """A slot the caller holds no array of, the next in turn; None if every built slot is held
        (then the caller may build another while fewer than `size` exist)."""
        n = len(self.slots)
        for i in range(n):
            j = (self.next + i) % n
            if self.slots[j].free():
                self.next = (j + 1) % max(n, 1)
                return self.slots[j]
        return None
