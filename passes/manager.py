"""The pass manager: an ordered pipeline of named passes, per optimization level.

Ordering rules (why the list below is in this order):
1. `cleanup` first and again after each rewriting stage: constant folding turns the exporters'
   shape arithmetic (Shape -> Gather -> Concat -> Reshape) into constants once shapes are static,
   simplify removes what became a no-op, CSE merges the duplicates exporters emit, DCE drops the
   rest. These enable each other, so they run as a group to a fixed point.
2. Pattern fusion (LayerNorm, RMSNorm, GELU) before BatchNorm folding and epilogue fusion:
   their patterns contain Add/Mul/Div by constants that affine folding would otherwise fold into
   a preceding MatMul and break up.
3. Transpose elimination after cleanup (perms are constants by then) and before attention
   fusion, which expects the Q, K, V layouts in canonical form.
4. BatchNorm and affine folding before epilogue fusion: the scale goes into the conv weights,
   leaving a bias that the epilogue absorbs. Folding emits arithmetic on constants, so cleanup
   (constant folding) runs right after.
5. Attention fusion before epilogue fusion: the QK^T and PV MatMuls must not be taken as anchors
   first.
6. Epilogue fusion (anchor + elementwise) before plain elementwise fusion, so that activations
   join their conv/matmul rather than a standalone elementwise kernel.
7. Quantize/DequantizeLinear decomposition after the first cleanup (constant folding turns the
   weights' DequantizeLinear into float constants with the op's own reference first) and before
   the fusions, which then take the activations' quantize-dequantize arithmetic into epilogues.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from graphc.ir.graph import Graph
from graphc.ir.verify import verify_graph

log = logging.getLogger(__name__)

PassFn = Callable[[Graph], Graph]
MAX_FIXED_POINT_ITERATIONS = 10


@dataclass(frozen=True)
class Pass:
    name: str
    fn: PassFn
    min_level: int = 1


@dataclass(frozen=True)
class FixedPoint:
    """Passes that enable each other: run in order, repeatedly, until none changes the graph."""

    name: str
    passes: tuple[Pass, ...]


Stage = Pass | FixedPoint


@dataclass
class PassRecord:
    name: str
    seconds: float
    nodes_before: int
    nodes_after: int
    changed: bool


@dataclass
class OptimizeOptions:
    opt_level: int = 2
    verify: bool = False
    dump_ir: Path | None = None


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
    """Run the pipeline for `options.opt_level` (0 runs nothing)."""
    options = options or OptimizeOptions()
    stages = default_pipeline() if stages is None else stages
    result = OptimizeResult(graph)
    dump = Path(options.dump_ir) if options.dump_ir else None
    counter = [0]
    if dump:
        dump.mkdir(parents=True, exist_ok=True)
        _dump(dump, counter, "input", graph)
    if options.opt_level <= 0:
        return result

    def run_pass(p: Pass, g: Graph) -> Graph:
        t0 = time.perf_counter()
        new = p.fn(g)
        dt = time.perf_counter() - t0
        changed = new is not g
        result.records.append(PassRecord(p.name, dt, len(g.nodes), len(new.nodes), changed))
        if changed and options.verify:
            verify_graph(new)
        if changed and dump:
            _dump(dump, counter, p.name, new)
        log.debug("pass %s: %d -> %d nodes in %.3fs", p.name, len(g.nodes), len(new.nodes), dt)
        return new

    g = graph
    for stage in stages:
        if isinstance(stage, Pass):
            if stage.min_level <= options.opt_level:
                g = run_pass(stage, g)
            continue
        active = [p for p in stage.passes if p.min_level <= options.opt_level]
        for _round in range(MAX_FIXED_POINT_ITERATIONS):
            before = g
            for p in active:
                g = run_pass(p, g)
            if g is before:
                break
        else:
            log.warning("%s did not reach a fixed point in %d rounds", stage.name, MAX_FIXED_POINT_ITERATIONS)
    result.graph = g
    return result


def _dump(folder: Path, counter: list[int], name: str, graph: Graph) -> None:
    (folder / f"{counter[0]:02d}-{name}.txt").write_text(str(graph))
    counter[0] += 1
