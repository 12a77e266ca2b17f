"""Pass instruments: hooks the pass manager calls around every pass it runs (TVM's PassInstrument).

Dumping the IR, verifying it and timing the passes are instruments, not code inside the
manager's loop, so that a test or a tool can add its own (count rewrites, stop at a pass, bisect)
without touching the manager.

The manager calls, for each pass that runs:
    before_pass hooks in reverse order of the instrument list, then the pass, then
    after_pass hooks in list order,
so instruments nest like context managers: the first in the list (timing, by default) is the
innermost and measures the pass alone, not the verification or the dump that follow it.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from graphc.errors import VerificationError
from graphc.ir.graph import Graph
from graphc.ir.verify import verify_graph

if TYPE_CHECKING:
    from graphc.passes.manager import Pass

log = logging.getLogger(__name__)


class PassInstrument:
    """Base class: every hook does nothing. `after` is the pass's result (`after is before` when
    the pass did not change the graph)."""

    def enter_pipeline(self, graph: Graph) -> None:
        pass

    def before_pass(self, p: Pass, graph: Graph) -> None:
        pass

    def after_pass(self, p: Pass, before: Graph, after: Graph) -> None:
        pass

    def exit_pipeline(self, graph: Graph) -> None:
        pass


@dataclass
class PassRecord:
    name: str
    seconds: float
    nodes_before: int
    nodes_after: int
    changed: bool


@dataclass
class PassTiming(PassInstrument):
    """Time and node counts of every pass run, in order (the compile report's `passes`)."""

    records: list[PassRecord] = field(default_factory=list)
    _t0: float = 0.0

    def before_pass(self, p: Pass, graph: Graph) -> None:
        self._t0 = time.perf_counter()

    def after_pass(self, p: Pass, before: Graph, after: Graph) -> None:
        dt = time.perf_counter() - self._t0
        self.records.append(PassRecord(p.name, dt, len(before.nodes), len(after.nodes), after is not before))
        log.debug("pass %s: %d -> %d nodes in %.3fs", p.name, len(before.nodes), len(after.nodes), dt)


@dataclass
class VerifyIR(PassInstrument):
    """Verify the graph after every pass that changed it; the error names the pass that broke the
    IR. (The pipeline's input was verified when it was built.)"""

    def after_pass(self, p: Pass, before: Graph, after: Graph) -> None:
        if after is before:
            return
        try:
            verify_graph(after)
        except VerificationError as e:
            # The verifier's own message names the node; say which pass made it.
            raise VerificationError(f"after pass {p.name}: {e}") from e


@dataclass
class DumpIR(PassInstrument):
    """Write `NN-input.txt`, then `NN-passname.txt` after every pass that changed the graph
    (AITemplate's numbered dumps): the files in name order are the graph's history."""

    folder: Path
    _count: int = 0

    def __post_init__(self) -> None:
        self.folder = Path(self.folder)

    def enter_pipeline(self, graph: Graph) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        self._write("input", graph)

    def after_pass(self, p: Pass, before: Graph, after: Graph) -> None:
        if after is not before:
            self._write(p.name, after)

    def _write(self, name: str, graph: Graph) -> None:
        (self.folder / f"{self._count:02d}-{name}.txt").write_text(str(graph))
        self._count += 1
