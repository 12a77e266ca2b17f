"""Accuracy-targeted mixed precision for int8 engines: which layers stay float.

`compile(..., precision="int8", accuracy="cosine:0.999")` (CLI `--accuracy cosine:0.999`) keeps
the fewest quantizable layers (Conv/MatMul/Gemm, passes/quantize_int8.py) in float such that the
int8 graph's outputs meet the target against the fp32 model's outputs on the validation data
(`validation_data`, by default the calibration data):

- cosine:B  every output of every validation sample has cosine similarity >= B to the fp32 one.
- max-rel:B every output of every sample has max|y - y_fp32| / max|y_fp32| <= B (the error
            relative to the output's own scale: an elementwise relative error is undefined near 0).

How (all on the host, in the CPU target's arithmetic, which is the CUDA int8 kernels' too:
exact int32 sums, the same float32 quantize/dequantize steps; docs/results/int8_cuda.md):

1. The compile's own pipeline runs once up to the int8 pass (which also calibrates); the float
   graph the pass sees is kept. Each point tried is that graph rewritten by the int8 pass with a
   set of layers kept float (Target.keep_float), run by the interpreter (the CPU engine's numpy
   kernels) on every validation sample. The reference is the interpreter on the model as loaded
   (fp32, before any optimization).
2. All layers in int8 first: if that meets the target, nothing stays float. Then every calibrated
   layer in float: if even that misses the target (a QDQ model's own int8 layers, a target
   tighter than float rounding), the compile stops with one line saying so.
3. Sensitivity: each layer alone in int8, the others float, measured with the same metric (the
   definition, not a proxy such as the layer's own output SQNR: a local error says little about
   how much of it reaches the output through the layers after it). It costs one run per layer
   and sample, made cheaper by running only what the layer changes: per sample, the float
   graph's values are kept and each one-layer graph recomputes only the nodes downstream of its
   layer (about half the graph on average).
4. Bisection over the ranked list (most sensitive first): the smallest k such that keeping the
   top k layers float meets the target, assuming that keeping more layers float does not hurt
   (log2(layers) points; the chosen point is always one that was measured to hold).

Kept layers are fp32 on both targets: an int8 engine's float part is fp32 today (passes/target.py),
so on CUDA they run graphc's fp32 kernels, not fp16.

The report (`report["quantization"]["accuracy"]`) lists the target, the sensitivity of every
layer, each point tried (layers kept, value, whether it holds) and the layers kept with their
sensitivity; the CLI prints a summary and one progress line per point.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from graphc.errors import CompileError, GraphcError, InputError

log = logging.getLogger(__name__)

METRICS = ("cosine", "max-rel")


# ---- the target --------------------------------------------------------------------------------


@dataclass(frozen=True)
class AccuracyTarget:
    """metric "cosine" (higher is better, bound in (0, 1]) or "max-rel" (lower is better)."""

    metric: str
    bound: float

    @property
    def spec(self) -> str:
        return f"{self.metric}:{self.bound:g}"

    def holds(self, value: float) -> bool:
        if math.isnan(value):
            return False
        return value >= self.bound if self.metric == "cosine" else value <= self.bound

    def worst(self, values: Sequence[float]) -> float:
        """The worst of several measurements (NaN counts as worst)."""
        if any(math.isnan(v) for v in values):
            return float("nan")
        return min(values) if self.metric == "cosine" else max(values)

    def badness(self, value: float) -> float:
        """A sort key: larger is worse (less accurate)."""
        if math.isnan(value):
            return float("inf")
        return -value if self.metric == "cosine" else value

    def __str__(self) -> str:
        return f"{self.metric} {'>=' if self.metric == 'cosine' else '<='} {self.bound:g}"


def parse_accuracy(spec: str) -> AccuracyTarget:
    """'cosine:0.999' or 'max-rel:1e-2'; a one-line CompileError otherwise."""
    if not isinstance(spec, str):
        raise CompileError(f"accuracy must be a string such as 'cosine:0.999', got {type(spec).__name__}")
    metric, sep, text = spec.strip().partition(":")
    metric = metric.strip().lower().replace("_", "-")
    if not sep or metric not in METRICS:
        raise CompileError(f"accuracy {spec!r}: expected cosine:B or max-rel:B (e.g. cosine:0.999, max-rel:1e-2)")
    try:
        bound = float(text)
    except ValueError:
        raise CompileError(f"accuracy {spec!r}: {text.strip()!r} is not a number") from None
    if metric == "cosine" and not 0.0 < bound <= 1.0:
        raise CompileError(f"accuracy {spec!r}: a cosine bound is in (0, 1]")
    if metric == "max-rel" and not (0.0 < bound < math.inf):
        raise CompileError(f"accuracy {spec!r}: a max-rel bound is a positive finite number")
    return AccuracyTarget(metric, bound)


def compare(target: AccuracyTarget, outs: Sequence[np.ndarray], refs: Sequence[np.ndarray]) -> float:
    """The metric for one sample: the worst over its outputs."""
    return target.worst([_one(target.metric, a, b) for a, b in zip(outs, refs, strict=True)])


def _one(metric: str, y: np.ndarray, ref: np.ndarray) -> float:
    a = np.asarray(y, np.float64).ravel()
    b = np.asarray(ref, np.float64).ravel()
    if a.shape != b.shape:
        raise CompileError(f"accuracy: an output has {a.size} values, the fp32 one {b.size}")
    if not np.all(np.isfinite(a)):
        return float("nan")
    if metric == "cosine":
        na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
        if na == 0.0 or nb == 0.0:
            return 1.0 if na == nb else 0.0
        return float(a @ b / (na * nb))
    scale = float(np.max(np.abs(b))) if b.size else 0.0
    err = float(np.max(np.abs(a - b))) if a.size else 0.0
    if scale == 0.0:
        return 0.0 if err == 0.0 else float("inf")
    return err / scale


# ---- running graphs ----------------------------------------------------------------------------


def _interpret(graph: Any, feed: Mapping[str, np.ndarray], what: str) -> list[np.ndarray]:
    from graphc.interpreter import interpret

    try:
        out = interpret(graph, feed, check_types=False)
    except InputError as e:
        raise InputError(f"validation data: {e}") from None
    except GraphcError as e:
        raise CompileError(f"accuracy search ({what}): {e}") from None
    return [np.asarray(out[n]) for n in graph.output_names]


def _float_values(graph: Any, feed: Mapping[str, np.ndarray]) -> dict[str, Any]:
    """Every value of `graph` on `feed` (the float graph's, reused by the one-layer runs)."""
    from graphc.interpreter import interpret

    names = tuple(v.name for n in graph.nodes for v in n.outputs if v is not None)
    try:
        return {**feed, **interpret(graph, feed, check_types=False, keep=names)}
    except GraphcError as e:
        raise CompileError(f"accuracy search (float graph): {e}") from None


def _run_changed(graph: Any, base_nodes: set[int], base: Mapping[str, Any]) -> list[np.ndarray]:
    """`graph`'s outputs, recomputing only the nodes that are not the float graph's own (the int8
    pass keeps every node it leaves alone as the same object) or that read a recomputed value;
    every other value comes from `base`, the float graph's values on the same sample."""
    from graphc.interpreter import _bound_attrs
    from graphc.ops.registry import Category, get_op

    env: dict[str, Any] = {}
    consts = graph.constants

    def value(name: str) -> Any:
        if name in env:
            return env[name]
        if name in consts:
            return consts[name].data
        return base[name]

    for node in graph.nodes:
        if id(node) in base_nodes and not any(v is not None and v.name in env for v in node.inputs):
            continue
        opdef = get_op(node.op, node.domain)
        ins = [None if v is None else value(v.name) for v in node.inputs]
        try:
            with np.errstate(all="ignore"):
                attrs = _bound_attrs(node, False) if opdef.category is Category.CONTROL_FLOW else node.attrs
                outs = opdef.compute(ins, attrs, len(node.outputs))
        except GraphcError as e:
            raise CompileError(f"accuracy search: {node.op} node '{node.name}': {e}") from None
        except Exception as e:  # a numpy kernel's own error: name the node
            raise CompileError(f"accuracy search: {node.op} node '{node.name}' failed: {type(e).__name__}: {e}") from e
        for v, o in zip(node.outputs, outs, strict=False):
            env[v.name] = np.asarray(o)
    return [np.asarray(value(v.name)) for v in graph.outputs]


# ---- the search --------------------------------------------------------------------------------


@dataclass
class _Search:
    target: AccuracyTarget
    float_graph: Any  # the graph the int8 pass rewrites (calibrated, nothing quantized yet)
    int8_target: Any  # passes.target.Target for the CPU int8 form, with the memoized calibrator
    samples: list[dict[str, np.ndarray]]
    refs: list[list[np.ndarray]]
    say: Callable[[str], None]
    points: list[dict[str, Any]] = field(default_factory=list)

    def rewrite(self, keep: frozenset[str]) -> Any:
        from graphc.passes.quantize_int8 import quantize_int8

        return quantize_int8(self.float_graph, dataclasses.replace(self.int8_target, keep_float=keep))

    def point(self, ranked: Sequence[str], k: int, label: str) -> bool:
        keep = frozenset(ranked[:k])
        g = self.rewrite(keep)
        t0 = time.perf_counter()
        vals = [compare(self.target, _interpret(g, s, label), r) for s, r in zip(self.samples, self.refs, strict=True)]
        value = self.target.worst(vals)
        ok = self.target.holds(value)
        self.points.append(
            {
                "kept": k,
                "layers": list(ranked[:k]),
                "value": _num(value),
                "holds": ok,
                "seconds": round(time.perf_counter() - t0, 3),
            }
        )
        self.say(
            f"accuracy: point {len(self.points)} ({label}): {k} of {len(ranked)} layers float: "
            f"{self.target.metric} {_fmt(value)} {'holds' if ok else 'misses'} ({self.target})"
        )
        return ok

    def sensitivities(self, layers: Sequence[str]) -> dict[str, float]:
        """Each layer alone in int8 (the others float), the metric over all samples."""
        all_layers = frozenset(layers)
        graphs = {name: self.rewrite(all_layers - {name}) for name in layers}
        base_nodes = {id(n) for n in self.float_graph.nodes}
        per: dict[str, list[float]] = {name: [] for name in layers}
        for i, (s, r) in enumerate(zip(self.samples, self.refs, strict=True)):
            base = _float_values(self.float_graph, s)
            for name, g in graphs.items():
                per[name].append(compare(self.target, _run_changed(g, base_nodes, base), r))
            del base
            self.say(f"accuracy: sensitivity: sample {i + 1}/{len(self.samples)} ({len(layers)} layers)")
        return {name: self.target.worst(v) for name, v in per.items()}


def _num(v: float) -> float | str:
    return v if math.isfinite(v) else str(v)


def _fmt(v: float) -> str:
    return f"{v:.6f}" if math.isfinite(v) and 1e-3 <= abs(v) < 10 else f"{v:.3e}"


def validation_samples(opts: Any, input_names: Sequence[str], calibrator: Any) -> list[dict[str, np.ndarray]]:
    from graphc.calibrate import load_samples

    if opts.validation_data is None and getattr(calibrator, "samples", None):
        return list(calibrator.samples)  # already loaded (and an iterable of feeds is read only once)
    data = opts.validation_data if opts.validation_data is not None else opts.calibration_data
    if data is None:
        raise CompileError(
            f"accuracy {opts.accuracy}: needs data to measure on: give validation_data (--validation-data V.npz) "
            "or calibration_data"
        )
    try:
        return load_samples(data, input_names)
    except InputError as e:
        raise InputError(str(e).replace("calibration data", "validation data", 1)) from None


def search_keep_float(graph: Any, opts: Any, target: Any) -> tuple[frozenset[str], dict[str, Any]]:
    """The layers to keep float for `opts.accuracy` (see the module docstring), and the report.

    `graph` is the compile's bound graph, `target` its pipeline target (calibrator included)."""
    from graphc.passes.manager import OptimizeOptions, optimize
    from graphc.passes.quantize_int8 import layer_names
    from graphc.passes.target import Target

    acc = parse_accuracy(opts.accuracy)
    say = opts.accuracy_progress or log.info
    t_start = time.perf_counter()
    samples = validation_samples(opts, [v.name for v in graph.inputs], target.calibrator)

    captured: list[Any] = []
    inner = target.calibrator

    def recording(g: Any, names: Sequence[str]) -> Mapping[str, float]:
        answer = dict(inner(g, names)) if inner is not None else {}
        captured.append((g, answer))
        return answer

    # The compile's pipeline up to (and through) the int8 pass, to get the graph that pass sees;
    # the calibrator runs here, and the real compile later asks it again (from its memory).
    optimize(graph, OptimizeOptions(opt_level=opts.opt_level, target=dataclasses.replace(target, calibrator=recording)))
    t_ref = time.perf_counter()
    refs = [_interpret(graph, s, "fp32 reference") for s in samples]
    seconds = {"pipeline": round(t_ref - t_start, 3), "reference": round(time.perf_counter() - t_ref, 3)}
    if not captured:  # no float Conv/MatMul/Gemm with constant weights: nothing to choose
        raise CompileError(
            f"accuracy {acc.spec}: the model has no float Conv/MatMul/Gemm layer to quantize or keep float"
        )
    float_graph, amax = captured[-1]
    # The points are measured in the CPU target's int8 form (the CUDA one computes the same numbers),
    # with the ranges calibrated above (answered here: the graph is the same, no need to hash it again).
    int8_target = Target("cpu", "int8", calibrator=lambda g, names: {n: amax[n] for n in names if n in amax})
    layers = layer_names(float_graph) if inner is not None else []
    s = _Search(acc, float_graph, int8_target, samples, refs, say)
    say(f"accuracy: {acc} on {len(samples)} validation sample(s), {len(layers)} quantizable layer(s)")
    t0 = time.perf_counter()
    report: dict[str, Any] = {
        "target": acc.spec,
        "metric": acc.metric,
        "bound": acc.bound,
        "reference": "fp32: the interpreter on the model as loaded",
        "measured_with": "the CPU int8 arithmetic (interpreter of the int8 pass's output)",
        "validation_samples": len(samples),
        "layers": len(layers),
        "sensitivity_method": "each layer alone in int8, the others float",
        "points": s.points,
    }
    kept: list[str] = []
    sens: dict[str, float] = {}
    if not s.point(layers, 0, "all int8"):
        if not layers or not s.point(layers, len(layers), "all float"):
            value = s.points[-1]["value"]
            what = "every calibrated layer in float" if layers else "the model's own QDQ layers"
            raise CompileError(
                f"accuracy {acc.spec} is not reachable: even with {what}, {acc.metric} is {value} on the "
                f"validation data (the fp32 reference is the model as loaded)"
            )
        t1 = time.perf_counter()
        sens = s.sensitivities(layers)
        seconds["sensitivity"] = round(time.perf_counter() - t1, 3)
        order = {name: i for i, name in enumerate(layers)}
        ranked = sorted(layers, key=lambda n: (-acc.badness(sens[n]), order[n]))
        lo, hi = 0, len(layers)  # lo misses, hi holds
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if s.point(ranked, mid, f"bisect {lo}..{hi}"):
                hi = mid
            else:
                lo = mid
        kept = list(ranked[:hi])
        report["sensitivity"] = [{"layer": n, "value": _num(sens[n])} for n in ranked]
    seconds.setdefault("sensitivity", 0.0)
    seconds["search"] = round(time.perf_counter() - t0, 3)
    seconds["total"] = round(time.perf_counter() - t_start, 3)
    chosen = next(p for p in s.points if p["holds"] and p["kept"] == len(kept))
    report["kept"] = [{"layer": n, "sensitivity": _num(sens[n])} for n in kept]
    report["value"] = chosen["value"]
    report["seconds"] = seconds
    say(
        f"accuracy: {len(kept)} of {len(layers)} layers kept float; {acc.metric} {_fmt(float(chosen['value']))} "
        f"({acc}) in {len(s.points)} points, {seconds['total']:.1f} s"
    )
    return frozenset(kept), report


def summary_lines(report: Mapping[str, Any], max_layers: int = 8) -> list[str]:
    """The CLI's summary of an accuracy search (report["quantization"]["accuracy"])."""
    a = report.get("quantization", {}).get("accuracy")
    if not a:
        return []
    m = a["metric"]
    lines = [
        f"accuracy {a['target']}: {m} {_fmt(float(a['value']))} with {len(a['kept'])} of {a['layers']} layers "
        f"kept float ({len(a['points'])} points tried, {a['validation_samples']} validation samples)"
    ]
    for k in a["kept"][:max_layers]:
        lines.append(f"  kept float: {k['layer']} (alone in int8: {m} {_fmt(float(k['sensitivity']))})")
    if len(a["kept"]) > max_layers:
        lines.append(f"  ... and {len(a['kept']) - max_layers} more (see the report)")
    for i, p in enumerate(a["points"], 1):
        verdict = "holds" if p["holds"] else "misses"
        lines.append(f"  point {i}: {p['kept']} layers float: {m} {_fmt(float(p['value']))} {verdict}")
    return lines


__all__ = ["AccuracyTarget", "parse_accuracy", "compare", "search_keep_float", "summary_lines"]
