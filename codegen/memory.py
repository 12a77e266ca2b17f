"""Liveness and memory planning: every activation of an engine in one arena.

1. Liveness: each arena tensor's first step (the one that writes it; -1 for graph inputs, which
   are copied in before step 0) and last step (the last that reads it, through any alias; the
   end for graph outputs).
2. In-place: where an elementwise step's input dies at that step and has the output's size, the
   output takes over the input's buffer (the two form one group).
3. Placement: several heuristics (greedy by size with first fit and with best fit, greedy by
   first use, greedy by lifetime), all at 256-byte alignment; the smallest arena wins.

The lower bound is the largest total of (aligned) bytes live at one step: no placement can do
better. The naive size is the sum of every tensor's bytes (no reuse at all).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from graphc.runtime.plan import ALIAS, ARENA, INPUT, WEIGHT, KernelPlan, MemoryPlan, TensorPlacement, align

log = logging.getLogger(__name__)


@dataclass
class Group:
    """Tensors sharing one buffer: a tensor and the in-place outputs that took it over."""

    root: str
    nbytes: int  # aligned
    first: int
    last: int
    members: list[str] = field(default_factory=list)


@dataclass
class Lifetimes:
    groups: list[Group]
    group_of: dict[str, str]  # tensor -> group root
    aliases: dict[str, str]  # alias tensor -> the arena/input/weight tensor it views
    lower_bound: int
    naive: int


def resolve_alias(plan: KernelPlan, name: str) -> str:
    seen = set()
    while plan.tensors[name].kind == ALIAS:
        if name in seen:
            raise ValueError(f"alias cycle at {name}")
        seen.add(name)
        name = plan.tensors[name].alias_of  # type: ignore[assignment]
    return name


def lifetimes_from_plan(plan: KernelPlan, *, inplace: bool = True) -> Lifetimes:
    n_steps = len(plan.steps)
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    aliases: dict[str, str] = {}
    for name, t in plan.tensors.items():
        if t.kind == ALIAS:
            aliases[name] = resolve_alias(plan, name)
        elif t.kind == INPUT:
            first[name] = -1
            last[name] = -1
    planned = {n for n, t in plan.tensors.items() if t.kind in (ARENA, INPUT)}
    for step in plan.steps:
        for name in step.inputs:
            if name is None:
                continue
            root = aliases.get(name, name)
            if root in planned:
                last[root] = max(last.get(root, step.index), step.index)
        for name in step.outputs:
            if name in planned:
                first[name] = step.index
                last.setdefault(name, step.index)
    for name in plan.outputs:
        root = aliases.get(name, name)
        if root in planned:
            last[root] = n_steps
    for name in planned:
        first.setdefault(name, -1)
        last.setdefault(name, first[name])

    group_of = {n: n for n in planned}
    groups = {n: Group(n, align(plan.tensors[n].nbytes), first[n], last[n], [n]) for n in planned}
    outputs = {aliases.get(n, n) for n in plan.outputs}
    if inplace:
        for step in plan.steps:
            if len(step.outputs) != 1 or step.outputs[0] not in planned:
                continue
            out = step.outputs[0]
            for i in step.inplace:
                name = step.inputs[i]
                if name is None:
                    continue
                root = aliases.get(name, name)
                if root not in planned or root in outputs:
                    continue
                g = groups[group_of[root]]
                if g.last != step.index or g.nbytes != groups[out].nbytes or last[root] != step.index:
                    continue
                # The output takes over the input's buffer.
                og = groups.pop(out)
                g.last = og.last
                g.members.extend(og.members)
                for m in og.members:
                    group_of[m] = g.root
                break
    glist = list(groups.values())
    return Lifetimes(glist, group_of, aliases, _lower_bound(glist, n_steps), sum(g.nbytes for g in glist))


def _lower_bound(groups: list[Group], n_steps: int) -> int:
    if not groups:
        return 0
    delta = np.zeros(n_steps + 3, dtype=np.int64)
    for g in groups:
        delta[g.first + 1] += g.nbytes
        delta[g.last + 2] -= g.nbytes
    return int(np.cumsum(delta).max())


# ---- placement heuristics ----------------------------------------------------------------------


def _place(groups: list[Group], order: list[int], best_fit: bool) -> tuple[np.ndarray, int]:
    n = len(groups)
    firsts = np.array([g.first for g in groups], dtype=np.int64)
    lasts = np.array([g.last for g in groups], dtype=np.int64)
    sizes = np.array([g.nbytes for g in groups], dtype=np.int64)
    offsets = np.full(n, -1, dtype=np.int64)
    placed = np.zeros(n, dtype=bool)
    top = 0
    for i in order:
        conflict = placed & (firsts <= lasts[i]) & (lasts >= firsts[i])
        idx = np.nonzero(conflict)[0]
        size = sizes[i]
        if idx.size == 0:
            off = 0
        else:
            starts = offsets[idx]
            ends = starts + sizes[idx]
            srt = np.argsort(starts, kind="stable")
            starts, ends = starts[srt], ends[srt]
            best = None
            cursor = 0
            for s, e in zip(starts.tolist(), ends.tolist(), strict=True):
                gap = s - cursor
                if gap >= size:
                    if not best_fit:
                        best = (0, cursor)
                        break
                    if best is None or gap < best[0]:
                        best = (gap, cursor)
                cursor = max(cursor, e)
            off = best[1] if best is not None else cursor
        offsets[i] = off
        placed[i] = True
        top = max(top, off + int(size))
    return offsets, top


def _orders(groups: list[Group]) -> dict[str, Callable[[], list[int]]]:
    idx = range(len(groups))
    return {
        "greedy_by_size_first_fit": lambda: sorted(idx, key=lambda i: (-groups[i].nbytes, groups[i].first)),
        "greedy_by_size_best_fit": lambda: sorted(idx, key=lambda i: (-groups[i].nbytes, groups[i].first)),
        "greedy_by_first_use": lambda: sorted(idx, key=lambda i: (groups[i].first, -groups[i].nbytes)),
        "greedy_by_lifetime": lambda: sorted(
            idx, key=lambda i: (-(groups[i].last - groups[i].first), -groups[i].nbytes)
        ),
    }


# The perturbed search stops at the lower bound, after this many orders, or after this long.
SEARCH_ROUNDS = 256
SEARCH_SECONDS = 0.5


def plan_memory(plan: KernelPlan, *, inplace: bool = True, search: bool = True) -> MemoryPlan:
    """Place every arena tensor; the heuristic with the smallest arena wins. If none reaches the
    lower bound, a seeded search over perturbed size orders (sizes jittered by up to 30%) tries
    more first-fit and best-fit placements, keeping the best (deterministic for a given plan).

    The workspace is sized from the steps' workspace_bytes, an input known once the kernels are
    generated: for the CUDA target, plan the complete plan (codegen.build.complete_plan)."""
    t0 = time.perf_counter()
    lt = lifetimes_from_plan(plan, inplace=inplace)
    candidates: dict[str, int] = {}
    best: tuple[int, str, np.ndarray] | None = None
    for name, make_order in _orders(lt.groups).items():
        offsets, top = _place(lt.groups, make_order(), best_fit=name.endswith("best_fit"))
        candidates[name] = top
        if best is None or top < best[0]:
            best = (top, name, offsets)
    if search and best is not None and best[0] > lt.lower_bound:
        rng = np.random.default_rng(0)
        sizes = np.array([g.nbytes for g in lt.groups], dtype=np.float64)
        search_best = None
        for r in range(SEARCH_ROUNDS):
            if best[0] <= lt.lower_bound or time.perf_counter() - t0 > SEARCH_SECONDS:
                break
            order = np.argsort(-sizes * (1.0 + 0.3 * rng.random(len(sizes))), kind="stable").tolist()
            offsets, top = _place(lt.groups, order, best_fit=bool(r % 2))
            if search_best is None or top < search_best:
                search_best = top
            if top < best[0]:
                best = (top, "perturbed_search", offsets)
        if search_best is not None:
            candidates["perturbed_search"] = int(search_best)
    placements: dict[str, TensorPlacement] = {}
    arena = 0
    if best is not None:
        arena, algo, offsets = best
        for g, off in zip(lt.groups, offsets.tolist(), strict=True):
            for m in g.members:
                placements[m] = TensorPlacement(
                    m, int(off), plan.tensors[m].nbytes, _first(plan, lt, m), _last(plan, lt, m)
                )
    else:
        algo = "empty"
    workspace = max((s.workspace_bytes for s in plan.steps), default=0)
    log.info("memory plan: %d bytes (%s) in %.3fs", arena, algo, time.perf_counter() - t0)
    return MemoryPlan(
        arena_bytes=int(arena),
        workspace_bytes=int(align(workspace)) if workspace else 0,
        placements=placements,
        aliases=dict(lt.aliases),
        algorithm=algo,
        lower_bound_bytes=lt.lower_bound,
        naive_bytes=lt.naive,
        candidates=candidates,
    )


def memory_report(memory: MemoryPlan) -> dict[str, Any]:
    """The memory section of a compile report."""
    return {
        "arena_bytes": memory.arena_bytes,
        "lower_bound_bytes": memory.lower_bound_bytes,
        "naive_bytes": memory.naive_bytes,
        "workspace_bytes": memory.workspace_bytes,
        "algorithm": memory.algorithm,
        "candidates": memory.candidates,
        "arena_over_lower_bound": round(memory.arena_bytes / memory.lower_bound_bytes, 4)
        if memory.lower_bound_bytes
        else 1.0,
    }


def _member_bounds(plan: KernelPlan, lt: Lifetimes) -> dict[str, tuple[int, int]]:
    cache = getattr(lt, "_bounds", None)
    if cache is None:
        cache = {}
        n_steps = len(plan.steps)
        writer = {o: st.index for st in plan.steps for o in st.outputs}
        for g in lt.groups:
            # Members of an in-place group hand over at a step: each lives from its writer to the
            # next member's writer (the last member to the group's end).
            firsts = []
            for m in g.members:
                t = plan.tensors[m]
                firsts.append(-1 if t.kind == INPUT else writer[m])
            for k, m in enumerate(g.members):
                end = firsts[k + 1] if k + 1 < len(g.members) else g.last
                cache[m] = (firsts[k], min(end, n_steps))
        lt._bounds = cache  # type: ignore[attr-defined]
    return cache


def _first(plan: KernelPlan, lt: Lifetimes, m: str) -> int:
    return _member_bounds(plan, lt)[m][0]


def _last(plan: KernelPlan, lt: Lifetimes, m: str) -> int:
    return _member_bounds(plan, lt)[m][1]


# ---- validation --------------------------------------------------------------------------------


def validate_memory_plan(plan: KernelPlan, memory: MemoryPlan) -> list[str]:
    """Problems with a memory plan (empty when valid): overlaps of tensors live at the same step
    (an in-place handover at one step excepted), tensors outside the arena, bad aliases."""
    problems: list[str] = []
    arena_names = [n for n, t in plan.tensors.items() if t.kind in (ARENA, INPUT)]
    for n in arena_names:
        if n not in memory.placements:
            problems.append(f"tensor '{n}' has no placement")
    for n, t in plan.tensors.items():
        if t.kind == ALIAS:
            src = memory.aliases.get(n)
            if src is None:
                problems.append(f"alias '{n}' points nowhere")
            elif plan.tensors[src].kind not in (ARENA, INPUT, WEIGHT):
                problems.append(f"alias '{n}' points to '{src}', which holds no bytes")
            elif plan.tensors[src].nbytes < t.nbytes:
                problems.append(f"alias '{n}' ({t.nbytes} bytes) is larger than its source '{src}'")
    ps = [memory.placements[n] for n in arena_names if n in memory.placements]
    for p in ps:
        if p.offset < 0 or p.offset + p.nbytes > memory.arena_bytes:
            problems.append(
                f"tensor '{p.name}' [{p.offset}, {p.offset + p.nbytes}) is outside the arena "
                f"of {memory.arena_bytes} bytes"
            )
        if p.offset % 256:
            problems.append(f"tensor '{p.name}' at offset {p.offset} is not 256-byte aligned")
    handover = set()
    for s in plan.steps:
        for i in s.inplace:
            name = s.inputs[i]
            if name is not None and len(s.outputs) == 1:
                handover.add((memory.aliases.get(name, name), s.outputs[0]))
    if len(ps) > 1:
        off = np.array([p.offset for p in ps])
        end = off + np.array([p.nbytes for p in ps])
        fi = np.array([p.first for p in ps])
        la = np.array([p.last for p in ps])
        overlap_bytes = (off[:, None] < end[None, :]) & (off[None, :] < end[:, None])
        overlap_time = (fi[:, None] <= la[None, :]) & (fi[None, :] <= la[:, None])
        bad = np.triu(overlap_bytes & overlap_time, k=1)
        for i, j in zip(*np.nonzero(bad), strict=True):
            a, b = ps[i], ps[j]
            is_handover = (a.name, b.name) in handover or (b.name, a.name) in handover
            if is_handover and (a.last == b.first or b.last == a.first):
                continue
            problems.append(
                f"tensors '{a.name}' (steps {a.first}..{a.last}, bytes {a.offset}..{a.offset + a.nbytes}) "
                f"and "
                f"'{b.name}' (steps {b.first}..{b.last}, bytes {b.offset}..{b.offset + b.nbytes}) overlap"
            )
            if len(problems) > 20:
                break
    return problems
