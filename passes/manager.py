"""The pass manager: runs an ordered pipeline of named passes for an optimization level and a
target, with instruments (dump, verify, timing) around every pass.

The pipeline itself, with the ordering rules beside it, is passes/pipeline.py. Each `Pass` says
from which opt level it runs (`min_level`; 0 means always, for rewrites a target cannot do
without) and on which targets (`when`, a predicate over passes/target.py's `Target`). A
`FixedPoint` is a group of passes that enable each other, run until none changes the graph.

A pass that does nothing must return its input graph itself (`new is graph`): the manager and its
instruments take identity as "unchanged" (no dump, no verification, fixed points end).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from graphc.ir.graph import Graph
from graphc.passes.instruments import DumpIR, PassInstrument, PassRecord, PassTiming, VerifyIR
from graphc.passes.target import CPU, Target

log = logging.getLogger(__name__)

PassFn = Callable[[Graph], Graph]
TargetPassFn = Callable[[Graph, Target], Graph]
MAX_FIXED_POINT_ITERATIONS = 10

__all__ = [
    "FixedPoint",
    "MAX_FIXED_POINT_ITERATIONS",
    "OptimizeOptions",
    "OptimizeResult",
    "Pass",
    "PassRecord",
    "Stage",
    "default_pipeline",
    "optimize",
]


@dataclass(frozen=True)
class Pass:
    """A named rewrite. `fn(graph)`, or `fn(graph, target)` with `takes_target` (a pass whose
    rewrite depends on the target's parameters, e.g. the precision)."""

    name: str
    fn: PassFn | TargetPassFn
    min_level: int = 1
    when: Callable[[Target], bool] | None = None
    takes_target: bool = False

    def active(self, opt_level: int, target: Target) -> bool:
        return self.min_level <= opt_level and (self.when is None or self.when(target))

    def __call__(self, graph: Graph, target: Target = CPU) -> Graph:
        return self.fn(graph, target) if self.takes_target else self.fn(graph)  # type: ignore[call-arg]


@dataclass(frozen=True)
class FixedPoint:
    """Passes that enable each other: run in order, repeatedly, until none changes the graph."""

    name: str
    passes: tuple[Pass, ...]
    max_rounds: int = MAX_FIXED_POINT_ITERATIONS


Stage = Pass | FixedPoint


@dataclass
class OptimizeOptions:
    """opt_level: 0 runs only the passes a target needs (min_level 0), 1 cleanup, 2 everything.
    verify / dump_ir add the VerifyIR / DumpIR instruments; `instruments` are added after them."""

    opt_level: int = 2
    verify: bool = False
    dump_ir: Path | str | None = None
    target: Target = CPU
    instruments: Sequence[PassInstrument] = ()


@dataclass
class OptimizeResult:
    graph: Graph
    records: list[PassRecord] = field(default_factory=list)


def default_pipeline() -> list[Stage]:
    from graphc.passes import pipeline

    return pipeline.stages()


def optimize(
    graph: Graph, options: OptimizeOptions | None = None, stages: Sequence[Stage] | None = None
) -> OptimizeResult:
    """Run the pipeline (default: passes/pipeline.py) for `options.opt_level` and `options.target`."""
    options = options or OptimizeOptions()
    stages = default_pipeline() if stages is None else stages
    timing = PassTiming()
    # Timing first: instruments nest (see passes/instruments.py), so it times the pass alone.
    instruments: list[PassInstrument] = [timing]
    if options.verify:
        instruments.append(VerifyIR())
    if options.dump_ir:
        instruments.append(DumpIR(Path(options.dump_ir)))
    instruments += list(options.instruments)
    runner = _Runner(options.opt_level, options.target, instruments)

    for inst in instruments:
        inst.enter_pipeline(graph)
    g = graph
    for stage in stages:
        g = runner.run_stage(stage, g)
    for inst in instruments:
        inst.exit_pipeline(g)
    return OptimizeResult(g, timing.records)


@dataclass
class _Runner:
    opt_level: int
    target: Target
    instruments: list[PassInstrument]

    def run_pass(self, p: Pass, g: Graph) -> Graph:
        for inst in reversed(self.instruments):
            inst.before_pass(p, g)
        new = p(g, self.target)
        for inst in self.instruments:
            inst.after_pass(p, g, new)
        return new

    def run_stage(self, stage: Stage, g: Graph) -> Graph:
        if isinstance(stage, Pass):
            return self.run_pass(stage, g) if stage.active(self.opt_level, self.target) else g
        active = [p for p in stage.passes if p.active(self.opt_level, self.target)]
        if not active:
            return g
        for _round in range(stage.max_rounds):
            before = g
            for p in active:
                g = self.run_pass(p, g)
            if g is before:
                return g
        log.warning("%s did not reach a fixed point in %d rounds", stage.name, stage.max_rounds)
        return g
