"""The tuner's search and its proof, apart from the GPU: candidates are objects (compile jobs, load,
outputs, benchmark; the step's cache key beside them, as Inductor's ChoiceCaller has), the search runs
under a wall-clock budget, compiles the next step's candidates (NVRTC in worker processes) while the
current step's are timed, and the final set of choices is kept only when whole-graph replays prove it
faster than the untuned engine. Timing, compiling and the clock are injected, so all of this is
tested on a CPU with fakes (tests/codegen/test_tune_search.py); codegen/tuner.py supplies the GPU.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

log = logging.getLogger("graphc.codegen.tuner")

# Wall-clock budgets per model (seconds), the whole of tuning: search, engines and their check.
MODE_BUDGET_S = {"fast": 60.0, "full": 600.0}
# The share of the budget kept for the whole-graph check (two engines built, their graphs timed).
VALIDATION_SHARE = 0.2
# A candidate replaces its step's default only when this much faster in isolation (a gain inside the
# noise of a few-microsecond kernel did not hold in the whole graph: ResNet-50 on an H200 ran 3% slower).
STEP_MARGIN = 0.03
# The tuned engine is kept only when its graph replays this much faster than the untuned one's.
GRAPH_MARGIN = 0.02


class Choice(Protocol):
    """One way to run one step. `params` None is the heuristic default (what an untuned engine runs)."""

    params: dict[str, Any] | None

    def compile_jobs(self) -> list[Any]:  # NVRTC jobs (safe to run in worker processes)
        ...

    def load(self, cubins: Sequence[bytes]) -> None:  # the compiled jobs' cubins, in order
        ...

    def outputs(self) -> dict[str, Any]:  # one run's outputs, to check against the default's
        ...

    def benchmark(self) -> float:  # milliseconds
        ...


@dataclass
class Task:
    """One tuning problem: a cache key, the steps that share it, and a maker of its choices (the
    default first); making them renders templates, so it runs beside the timing of the task before."""

    key: Any
    steps: list[str]
    make: Callable[[], list[Choice]]
    label: str = ""


@dataclass
class Budget:
    """Seconds of wall clock from construction, on an injectable clock."""

    seconds: float
    clock: Callable[[], float] = time.monotonic
    start: float = field(init=False)

    def __post_init__(self) -> None:
        self.start = self.clock()

    def spent(self) -> float:
        return self.clock() - self.start

    def left(self) -> float:
        return self.seconds - self.spent()

    def part(self, share: float) -> Budget:
        """A budget of `share` of what is left, on the same clock."""
        return Budget(max(0.0, self.left() * share), self.clock)


def budget_seconds(mode: str, override: float | None = None) -> float:
    if override is not None:
        if not (override > 0 and math.isfinite(override)):
            raise ValueError(f"tune budget must be a positive number of seconds, got {override}")
        return float(override)
    return MODE_BUDGET_S[mode]


@dataclass
class Pick:
    params: dict[str, Any] | None  # None: the default stays
    ms: float
    default_ms: float
    timed: int


@dataclass
class SearchReport:
    picks: dict[Any, Pick] = field(default_factory=dict)  # by cache key
    tasks: int = 0
    timed_tasks: int = 0
    stopped_by_budget: bool = False
    untouched: int = 0  # tasks never reached (budget)
    seconds: float = 0.0


def _prepared(task: Task, compile_fn: Callable[[list[Any]], list[bytes]]) -> list[tuple[Choice, Any]]:
    """The task's choices with their cubins (or the exception that compiling raised), compiled in one
    batch where every job compiles, else one choice at a time (a failing candidate fails alone)."""
    choices = task.make()
    jobs = [c.compile_jobs() for c in choices]
    flat = [j for js in jobs for j in js]
    try:
        cubins = compile_fn(flat) if flat else []
    except Exception:
        out: list[tuple[Choice, Any]] = []
        for c, js in zip(choices, jobs, strict=True):
            try:
                out.append((c, compile_fn(js) if js else []))
            except Exception as e:  # infinitely slow
                out.append((c, e))
        return out
    out, i = [], 0
    for c, js in zip(choices, jobs, strict=True):
        out.append((c, cubins[i : i + len(js)]))
        i += len(js)
    return out


def pick_best(
    prepared: list[tuple[Choice, Any]],
    check: Callable[[dict[str, Any], dict[str, Any]], bool],
    budget: Budget,
    margin: float = STEP_MARGIN,
    label: str = "",
) -> Pick | None:
    """The fastest correct choice; the default (first) competes with a head start of `margin`. None
    when the default cannot be loaded or timed: no candidate can then be proved faster than it."""
    reference: dict[str, Any] | None = None
    default_ms = math.inf
    best: Pick | None = None
    timed = 0
    for i, (choice, cubins) in enumerate(prepared):
        if i > 0 and budget.left() <= 0:
            log.info("tuning %s: budget spent after %d of %d candidates", label, i, len(prepared))
            break
        try:
            if isinstance(cubins, BaseException):
                raise cubins
            choice.load(cubins)
            out = choice.outputs()
            if reference is None:
                reference = out
            elif not check(out, reference):
                log.info("tuning %s: candidate %s gives different outputs; rejected", label, choice.params)
                continue
            ms = choice.benchmark()
            timed += 1
        except Exception as e:  # a failing candidate is infinitely slow
            log.info("tuning %s: candidate %s failed: %s", label, choice.params, e)
            if i == 0:
                log.info("tuning %s: the default cannot be timed; the step keeps it untuned", label)
                return None
            continue
        if i == 0:
            default_ms = ms
            best = Pick(None, ms, ms, 0)
        elif ms < default_ms * (1 - margin) and best is not None and ms < best.ms:
            best = Pick(dict(choice.params or {}), ms, default_ms, 0)
    if best is not None:
        best.timed = timed
    return best


def search(
    tasks: Iterable[Task],
    *,
    budget: Budget,
    compile_fn: Callable[[list[Any]], list[bytes]],
    check: Callable[[dict[str, Any], dict[str, Any]], bool],
    margin: float = STEP_MARGIN,
    on_task: Callable[[Task, Pick | None], None] | None = None,
) -> SearchReport:
    """Every task's pick, in order, until the budget is spent. The next task's candidates are
    rendered and compiled in a background thread (NVRTC itself in worker processes) while the
    current one's are timed on the GPU (the main thread alone touches the GPU)."""
    tasks = list(tasks)
    report = SearchReport(tasks=len(tasks))
    t0 = budget.clock()
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="graphc-tune-compile") as pool:
        future: Future | None = pool.submit(_prepared, tasks[0], compile_fn) if tasks else None
        for i, task in enumerate(tasks):
            if budget.left() <= 0:
                report.stopped_by_budget = True
                report.untouched = len(tasks) - i
                log.info(
                    "tuning stopped by its budget (%.0f s) after %d of %d kernels; the rest keep their defaults",
                    budget.seconds, i, len(tasks),
                )  # fmt: skip
                if future is not None:
                    future.cancel()
                break
            assert future is not None
            try:
                prepared = future.result()
            except Exception as e:  # rendering failed as a whole: the step stays untuned
                log.info("tuning %s: candidates could not be made: %s", task.label, e)
                prepared = []
            future = pool.submit(_prepared, tasks[i + 1], compile_fn) if i + 1 < len(tasks) else None
            pick = pick_best(prepared, check, budget, margin, task.label) if prepared else None
            if pick is not None:
                report.picks[task.key] = pick
                report.timed_tasks += 1
            if on_task:
                on_task(task, pick)
    report.seconds = round(budget.clock() - t0, 3)
    return report


@dataclass
class Validation:
    kept: bool
    untuned_ms: float | None
    tuned_ms: float | None
    margin: float
    reason: str

    def as_json(self) -> dict[str, Any]:
        return {
            "kept": self.kept,
            "untuned_ms": self.untuned_ms,
            "tuned_ms": self.tuned_ms,
            "margin": self.margin,
            "reason": self.reason,
        }


def validate(
    choices: dict[str, dict[str, Any]],
    build: Callable[[dict[str, dict[str, Any]]], Any],
    replay_ms: Callable[[list[Any]], list[float]],
    margin: float = GRAPH_MARGIN,
) -> tuple[dict[str, dict[str, Any]], Validation]:
    """Keep `choices` only when the engine built with them replays its graph at least `margin`
    faster than the engine built without; otherwise drop them all, with a log line saying so.
    `replay_ms` times both engines (interleaved, so drift hits both) and returns their times."""
    if not any(choices.values()):  # every step kept its default: nothing to prove
        return choices, Validation(True, None, None, margin, "no step changed")
    try:
        untuned, tuned = build({}), build(choices)
        base_ms, tuned_ms = replay_ms([untuned, tuned])
    except Exception as e:
        log.warning("tuning dropped: the whole-graph check failed (%s); the engine stays untuned", e)
        return {}, Validation(False, None, None, margin, f"check failed: {e}")
    if tuned_ms <= base_ms * (1 - margin):
        log.info("tuning kept: graph replay %.4f ms tuned against %.4f ms untuned", tuned_ms, base_ms)
        return choices, Validation(True, base_ms, tuned_ms, margin, "faster")
    log.warning(
        "tuning dropped: the tuned engine replays in %.4f ms against %.4f ms untuned (not %.0f%% faster); "
        "the engine stays untuned", tuned_ms, base_ms, margin * 100,
    )  # fmt: skip
    return {}, Validation(False, base_ms, tuned_ms, margin, "not faster")
