"""Host loops on the CUDA engine, at run time (issue 12 item 1).

graphc/host_loop.py plans a Loop or Scan the optimizer could not unroll as a step whose body is a
sub-plan with its own kernels (the layout is documented there). runtime/host_if_cuda.py cuts the
main plan into captured segments at such a step (as at a host If) and calls `HostLoop.run`:

- The body runs in an execution context of its own (its own arena and workspace, the engine's
  weights and kernels, the parent's stream). Its fixed-address work is one unit: the captures
  copied into its input slots (the memory plan may reuse an input's bytes once it is read, so they
  are copied every iteration), its launches, then the carried values (and the condition) copied
  device to device from its output slots into its input slots for the next iteration. Where an
  output was computed in place over an input the copy is skipped (same bytes); where the copies
  would overwrite each other's sources they go through a staging buffer.
- Per iteration, outside that unit (the addresses move): the iteration number copied from a
  device table (0, 1, 2, ...; no host-to-device traffic), a Scan's slices copied in, and each scan
  output's element copied into place in the step's preallocated output.
- A loop with a static trip count and no early exit (every Scan, a long static Loop) issues all of
  that without a host sync; with CUDA graphs on, the whole loop (every iteration) is captured as
  one graph on first use when it has at most WHOLE_GRAPH_MAX_ITERATIONS iterations, so a run
  replays it as one launch. Otherwise the unit is captured once as the body's CUDA graph and
  replayed per iteration: with a trip count known only at run time, the trip count (and initial
  condition) is read back once per run (one small device-to-host copy each); with an exit
  computed from data, the body's condition is read back after every iteration (one 1-byte
  device-to-host copy and a stream sync per iteration: the cost `graphc bench` reports under
  `host_if`, as `condition_reads`).

Counters (`HostIfContext.host_if_stats`): "<step>/body:iterations", ":captures" (the body's graph),
":loop_captures" (the whole loop's graph), and "condition_reads" (trip counts and conditions read).
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter
from typing import Any

import numpy as np

from graphc.runtime.errors import EngineError
from graphc.runtime.host_loop_cpu import loop_layout
from graphc.runtime.plan import Step

log = logging.getLogger(__name__)

# A static loop of at most this many iterations is captured whole (one graph launch per run);
# a longer one replays its body's graph per iteration (the graph's size grows with the count).
WHOLE_GRAPH_MAX_ITERATIONS = 1024

Copy = tuple[int, int, int]  # dst address, src address, bytes


def _view(ctx: Any, name: str | None, where: str) -> Any:
    if name is None or name not in ctx.views:
        raise EngineError(f"{where}: '{name}' is no tensor of the plan")
    return ctx.views[name]


def _copy(dst: Any, src: Any, where: str, what: str, any_shape: bool = False) -> Copy:
    """A copy of `src` into `dst`, which must agree in dtype and shape (`any_shape`: in size only,
    for a condition of one element written as [] or [1])."""
    same = math.prod(dst.shape) == math.prod(src.shape) if any_shape else tuple(dst.shape) == tuple(src.shape)
    if dst.dtype != src.dtype or not same:
        raise EngineError(
            f"{where}: {what} is {src.dtype}{list(src.shape)} on one side and {dst.dtype}{list(dst.shape)} on the other"
        )
    return int(dst.data.ptr), int(src.data.ptr), int(dst.nbytes)


def _overlaps(a: Copy, b: Copy, dst_of_b: bool = True) -> bool:
    """Whether copy `a`'s source overlaps copy `b`'s destination."""
    s, n = a[1], a[2]
    d, m = (b[0], b[2]) if dst_of_b else (b[1], b[2])
    return n > 0 and m > 0 and s < d + m and d < s + n


def _chunks(base: int, shape: tuple[int, ...], axis: int, pos: int, itemsize: int) -> list[tuple[int, int]]:
    """(address, bytes) of the contiguous pieces of x[..., pos, ...] (index `pos` along `axis`)."""
    outer = int(np.prod(shape[:axis], dtype=np.int64))
    inner = int(np.prod(shape[axis + 1 :], dtype=np.int64)) * itemsize
    return [(base + (o * shape[axis] + pos) * inner, inner) for o in range(outer)]


class HostLoop:
    """A host-loop step of a HostIfContext: its body context, copies, and graphs."""

    def __init__(self, parent: Any, step: Step):
        from graphc.runtime.host_if_cuda import HostIfContext, make_context, set_stream

        lay = loop_layout(step)
        self.lay, self.step, self.where = lay, step, lay["where"]
        self.name = f"{step.name}/body"
        plan = lay["plan"].for_arch(parent.arch or "")
        self.ctx = make_context(plan, lay["memory"], parent.weights_arg, parent.functions, parent.device, parent.arch)
        self.nested = isinstance(self.ctx, HostIfContext)
        set_stream(self.ctx, parent.stream)
        cupy, where = parent.cupy, self.where
        n, c = lay["num_carried"], lay["num_captures"]
        ins = list(step.inputs)
        caps = ins[len(ins) - c :] if c else []
        body_in = [self.ctx.views[x] for x in plan.inputs]
        body_out = [self.ctx.views[x] for x in plan.outputs]
        nf = lay["formals"]
        self.cap_copies = [
            _copy(body_in[nf + j], _view(parent, caps[i], where), where, f"capture {i}")
            for j, i in enumerate(lay["take"])
        ]
        outs = [_view(parent, o, where) for o in step.outputs]
        if step.op == "Loop":
            self.m = None if ins[0] is None else _view(parent, ins[0], where)
            self.cond0 = None if len(ins) < 2 or ins[1] is None else _view(parent, ins[1], where)
            init = [_view(parent, x, where) for x in ins[2 : 2 + n]]
            self.iter_slot, cond_slot = body_in[0], body_in[1]
            carried_in, first_out = body_in[2 : 2 + n], 1
            # the condition is read from the body's condition input, where the carry copies put it: its
            # output's slot may be another carried value's input slot (the memory plan reuses an input's
            # bytes once it is read), which that value's copy overwrites
            self.cond_now = cond_slot
            carry = [_copy(cond_slot, body_out[0], where, "the condition", any_shape=True)]
            self.true = cupy.asarray(np.ones((), np.bool_))  # the condition before the first iteration
            first = self.cond0 if self.cond0 is not None else self.true
            self.cond_init = _copy(cond_slot, first, where, "the condition", any_shape=True)
        else:
            init = [_view(parent, x, where) for x in ins[:n]]
            carried_in, first_out, carry = body_in[:n], 0, []
            m = lay["num_scan_inputs"]
            xs = [_view(parent, x, where) for x in ins[n : n + m]]
            self.slices = [(x, s, ax, d) for x, s, ax, d in zip(xs, body_in[n : n + m], lay["in_axes"], lay["in_dirs"],
                                                                  strict=True)]  # fmt: skip
        carry += [_copy(carried_in[j], body_out[first_out + j], where, f"carried value {j}") for j in range(n)]
        self.init_copies = [_copy(carried_in[j], init[j], where, f"carried value {j}") for j in range(n)]
        self.final_copies = [_copy(outs[j], carried_in[j], where, f"carried value {j}") for j in range(n)]
        self.scan_srcs = body_out[first_out + n :]
        self.scan_outs = outs[n:]
        carry = [cp for cp in carry if cp[0] != cp[1]]  # computed in place over its input: nothing to copy
        self.carry, self.staging = self._stage(cupy, carry)
        # a scan output read from a slot the carry copies overwrite must be copied out before them
        scan_reads = [(0, int(s.data.ptr), int(s.nbytes)) for s in self.scan_srcs]
        self.carry_after_scans = any(_overlaps(r, cp) for r in scan_reads for cp in self.carry)
        self.table: Any = None  # the iteration numbers on the device
        self._old_tables: list[Any] = []
        self.body_graph: Any = None
        self.whole_graph: Any = None
        self.static_trip = lay["length"] if step.op == "Scan" else (
            lay["trip_count"] if lay["body_cond"] is not None else None
        )  # fmt: skip
        if step.op == "Loop" and lay["body_cond"] is None:
            log.info("%s: the body's condition is read back after every iteration", self.where)

    @staticmethod
    def _stage(cupy: Any, carry: list[Copy]) -> tuple[list[Copy], Any]:
        """The carry copies, through a staging buffer where one would overwrite another's source."""
        clash = any(i != j and _overlaps(a, b) for i, a in enumerate(carry) for j, b in enumerate(carry))
        if not clash:
            return carry, None
        total = sum(cp[2] for cp in carry)
        staging = cupy.empty(max(total, 1), dtype=cupy.uint8)
        base, off, first, second = int(staging.data.ptr), 0, [], []
        for dst, src, nb in carry:
            first.append((base + off, src, nb))
            second.append((dst, base + off, nb))
            off += nb
        log.info("carried values overlap each other's slots: copied through a staging buffer")
        return first + second, staging

    # ---- the work ----

    def _memcpys(self, parent: Any, copies: list[Copy]) -> None:
        copy, d2d, stream = parent.cupy.cuda.runtime.memcpyAsync, parent._d2d, parent.stream.ptr
        for dst, src, nb in copies:
            if nb:
                copy(dst, src, nb, d2d, stream)

    def _unit(self, parent: Any, use_graph: bool) -> None:
        """The fixed-address work of one iteration: captures in, the body, the carried values back."""
        self._memcpys(parent, self.cap_copies)
        if self.nested and use_graph:
            self.ctx.graph.launch(stream=parent.stream)  # its segments are graphs, chosen on the host
        else:
            self.ctx.launch_all()
        if not self.carry_after_scans:
            self._memcpys(parent, self.carry)

    def _ensure_table(self, parent: Any, n: int) -> None:
        if self.step.op != "Loop" or (self.table is not None and self.table.shape[0] >= n):
            return
        size = max(n, 2 * (self.table.shape[0] if self.table is not None else 32))
        if self.table is not None:  # queued copies may still read the old table: it stays allocated
            self._old_tables.append(self.table)
        self.table = parent.cupy.asarray(np.arange(size, dtype=np.int64))
        log.debug("%s: iteration table of %d entries", self.where, size)

    def _iteration(self, parent: Any, i: int, body: Any) -> None:
        """Iteration `i`: its number or slices in, the body unit (`body()`), its scan elements out."""
        nb = self.iter_slot.nbytes if self.step.op == "Loop" else 0
        if self.step.op == "Loop":
            self._memcpys(parent, [(int(self.iter_slot.data.ptr), int(self.table.data.ptr) + 8 * i, nb)])
            pos_out = i
        else:
            length = self.lay["length"]
            for x, slot, ax, d in self.slices:
                pos = length - 1 - i if d else i
                dst = int(slot.data.ptr)
                copies = []
                for addr, size in _chunks(int(x.data.ptr), tuple(x.shape), ax, pos, x.dtype.itemsize):
                    copies.append((dst, addr, size))
                    dst += size
                self._memcpys(parent, copies)
            pos_out = None
        body()
        scans = []
        for j, (src, out) in enumerate(zip(self.scan_srcs, self.scan_outs, strict=True)):
            if self.step.op == "Loop":
                ax, pos = 0, pos_out
            else:
                ax = self.lay["out_axes"][j]
                pos = self.lay["length"] - 1 - i if self.lay["out_dirs"][j] else i
            s = int(src.data.ptr)
            for addr, size in _chunks(int(out.data.ptr), tuple(out.shape), ax, pos, out.dtype.itemsize):
                scans.append((addr, s, size))
                s += size
        self._memcpys(parent, scans)
        if self.carry_after_scans:
            self._memcpys(parent, self.carry)

    def _read(self, parent: Any, view: Any, stats: Counter) -> Any:
        t0 = time.perf_counter()
        v = np.asarray(parent.cupy.asnumpy(view, stream=parent.stream)).reshape(-1)
        parent.condition_wait_s += time.perf_counter() - t0
        stats["condition_reads"] += 1
        if v.size != 1:
            raise EngineError(f"{self.where}: the trip count and condition must have one element, got {v.size}")
        return v[0]

    def _all_iterations(self, parent: Any, trip: int, use_graph: bool, stats: Counter, grow: bool = True) -> None:
        """A static loop: every iteration queued with no host sync. `grow`: extend the iteration
        table as it goes (not while capturing: the caller made it large enough first)."""
        self._memcpys(parent, self.init_copies)
        if self.step.op == "Loop":
            self._memcpys(parent, [self.cond_init])
        for i in range(trip):
            if grow:
                self._ensure_table(parent, i + 1)
            self._iteration(parent, i, lambda: self._unit(parent, use_graph))
        self._memcpys(parent, self.final_copies)
        stats[f"{self.name}:iterations"] += trip

    def run(self, parent: Any, use_graph: bool, stats: Counter) -> None:
        trip = self.static_trip
        if trip is not None:
            whole = use_graph and not self.nested and trip <= WHOLE_GRAPH_MAX_ITERATIONS
            if whole:
                if self.whole_graph is None:
                    from graphc.runtime.host_if_cuda import capture

                    self._ensure_table(parent, trip)  # before the capture: nothing is allocated inside it
                    parent.stream.synchronize()  # capture starts on an idle stream (first use only)
                    self.whole_graph = capture(
                        parent.stream, lambda: self._all_iterations(parent, trip, False, Counter(), grow=False)
                    )
                    stats[f"{self.name}:loop_captures"] += 1  # the whole loop, every iteration
                self.whole_graph.launch(stream=parent.stream)
                stats[f"{self.name}:iterations"] += trip
                return
            if not use_graph or self.nested:
                self._all_iterations(parent, trip, use_graph, stats)
                return
        # per iteration: the body unit replayed as its graph; the trip count / condition on the host
        if trip is not None:
            m = trip
        elif self.step.op == "Loop" and self.lay["trip_bound"] is not None:
            m = self.lay["trip_bound"]  # a constant M: known without a read
        else:
            m = None if self.step.op != "Loop" or self.m is None else int(self._read(parent, self.m, stats))
        keep = True if self.step.op != "Loop" or self.cond0 is None else bool(self._read(parent, self.cond0, stats))
        self._memcpys(parent, self.init_copies)
        if self.step.op == "Loop":
            self._memcpys(parent, [self.cond_init])
        body = self._body(parent, use_graph, stats)
        i = 0
        body_cond = self.lay.get("body_cond") if self.step.op == "Loop" else True  # a Scan has no condition
        while keep and (m is None or i < m):
            self._ensure_table(parent, i + 1)
            self._iteration(parent, i, body)
            i += 1
            if m is not None and i >= m:
                break  # the trip count ends it: no condition to read back
            keep = bool(self._read(parent, self.cond_now, stats)) if body_cond is None else bool(body_cond)
        self._memcpys(parent, self.final_copies)
        stats[f"{self.name}:iterations"] += i

    def _body(self, parent: Any, use_graph: bool, stats: Counter) -> Any:
        if not use_graph or self.nested:
            return lambda: self._unit(parent, use_graph)
        if self.body_graph is None:
            from graphc.runtime.host_if_cuda import capture

            parent.stream.synchronize()  # capture starts on an idle stream (first use only)
            self.body_graph = capture(parent.stream, lambda: self._unit(parent, False))
            stats[f"{self.name}:captures"] += 1
        return lambda: self.body_graph.launch(stream=parent.stream)

    def contexts(self) -> list[Any]:
        return [self.ctx]


__all__ = ["WHOLE_GRAPH_MAX_ITERATIONS", "HostLoop"]
