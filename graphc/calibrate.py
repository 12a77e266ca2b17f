"""Post-training INT8 calibration: activation ranges from running the float graph on samples.

`compile(..., precision="int8", calibration_data=...)` hands a `Calibrator` to the pipeline in the
target context; passes/quantize_int8.py calls it with the graph it is about to rewrite and the
names of the float tensors that feed the ops it quantizes. The calibrator runs that graph (the
interpreter, the same numpy kernels as the CPU engine) on every sample, keeps each tensor's
statistics, and answers one threshold (amax; the int8 scale is amax / 127) per tensor:

- minmax: the largest |x| seen.
- percentile: the given percentile of |x| (99.99 by default), from a 2048-bin histogram.
- entropy: TensorRT's KL-divergence method: over a 2048-bin histogram of |x|, the threshold (128
  bins and up) whose 128-level quantization loses the least information (KL(P || Q)).

The histogram covers [0, amax] of the first sample and doubles its range (merging bin pairs)
whenever a later sample goes beyond, so statistics take one pass over the samples.

Thresholds go into the calibration cache (JSON, never pickle), keyed by a hash of the graph the
int8 pass sees (its structure, shapes and weight digests) and by tensor name; a cache that holds
every asked-for tensor of the same graph and method is used without running any sample.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from graphc.errors import CompileError, GraphcError, InputError

log = logging.getLogger(__name__)

METHODS = ("minmax", "entropy", "percentile")
BINS = 2048
QUANT_LEVELS = 128  # |x| in 128 levels: symmetric int8
CACHE_FORMAT = "graphc-int8-calibration"
CACHE_VERSION = 1


# ---- samples -----------------------------------------------------------------------------------


def load_samples(source: Any, input_names: Sequence[str]) -> list[dict[str, np.ndarray]]:
    """Feed dicts from CALIB.npz (per input an array [N, *input_shape]), a directory of .npz feeds
    (one feed per file, in name order), or any iterable of feed dicts."""
    if isinstance(source, (str, Path)):
        path = Path(source)
        if path.is_dir():
            files = sorted(path.glob("*.npz"))
            if not files:
                raise InputError(f"calibration data {path}: the folder holds no .npz files")
            return [_read_npz(f) for f in files]
        if not path.is_file():
            raise InputError(f"calibration data {path}: no such file or folder")
        stacked = _read_npz(path)
        missing = [n for n in input_names if n not in stacked]
        if missing:
            raise InputError(f"calibration data {path}: no array for input(s) {missing} (it has {sorted(stacked)})")
        counts = {n: stacked[n].shape[0] if stacked[n].ndim else 0 for n in input_names}
        if len(set(counts.values())) != 1 or 0 in counts.values():
            raise InputError(
                f"calibration data {path}: each input needs [N, *input_shape] with the same N >= 1, got {counts}"
            )
        n = next(iter(counts.values()))
        return [{name: stacked[name][i] for name in input_names} for i in range(n)]
    if isinstance(source, Mapping):
        raise InputError("calibration data: give a list (or any iterable) of feed dicts, or an .npz path")
    try:
        samples = [dict(s) for s in source]
    except TypeError as e:
        raise InputError(f"calibration data: expected a path or an iterable of feed dicts ({e})") from None
    if not samples:
        raise InputError("calibration data: no samples")
    return samples


def _read_npz(path: Path) -> dict[str, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as z:  # never pickle: object arrays are refused
            return {k: z[k] for k in z.files}
    except (OSError, ValueError) as e:
        raise InputError(f"calibration data {path}: not a readable .npz ({e})") from None


# ---- statistics and thresholds -----------------------------------------------------------------


@dataclass
class TensorStats:
    """max |x| and a histogram of the non-zero |x| over [0, hist_max] in BINS bins (when
    histograms are kept), with the exact zeros counted apart: post-ReLU tensors are half zeros,
    which quantize exactly at any threshold; as a spike in bin 0 they would make the entropy
    method prefer thresholds that put bin 0 in a level of its own (clipping hard)."""

    amax: float = 0.0
    hist: np.ndarray | None = None
    hist_max: float = 0.0
    zeros: int = 0

    def add(self, x: np.ndarray, keep_histogram: bool) -> None:
        a = np.abs(np.asarray(x, dtype=np.float32)).ravel()  # a fresh array: scaled in place below
        if a.size == 0:
            return
        m = float(a.max())
        if not np.isfinite(m):
            raise CompileError("calibration: a tensor holds inf or NaN on a calibration sample")
        self.amax = max(self.amax, m)
        if not keep_histogram:
            return
        if self.hist is None:
            self.hist_max = m if m > 0 else 1.0
            self.hist = np.zeros(BINS, dtype=np.int64)
        while m > self.hist_max:  # double the range: bin pairs merge, the upper half starts empty
            self.hist = np.concatenate([self.hist.reshape(BINS // 2, 2).sum(axis=1), np.zeros(BINS // 2, np.int64)])
            self.hist_max *= 2.0
        zeros = a.size - int(np.count_nonzero(a))
        np.multiply(a, BINS / self.hist_max, out=a)
        idx = a.astype(np.intp)
        np.minimum(idx, BINS - 1, out=idx)
        counts = np.bincount(idx, minlength=BINS)
        counts[0] -= zeros  # zeros are counted apart (see the class docstring)
        self.zeros += zeros
        self.hist += counts


def percentile_threshold(hist: np.ndarray, hist_max: float, percentile: float) -> float:
    """The upper edge of the bin where the cumulative count of |x| reaches `percentile` percent."""
    cdf = np.cumsum(hist, dtype=np.float64)
    total = cdf[-1]
    if total == 0:
        return 0.0
    i = int(np.searchsorted(cdf, total * percentile / 100.0, side="left"))
    return float((min(i, len(hist) - 1) + 1) * hist_max / len(hist))


def entropy_threshold(hist: np.ndarray, hist_max: float, levels: int = QUANT_LEVELS, coarse: int = 16) -> float:
    """TensorRT's entropy calibration: the threshold i * width (i = levels .. bins) minimizing
    KL(P || Q), P the histogram clipped at i (outliers added to its last bin), Q P's first i bins
    quantized to `levels` levels (chunks [j*i//levels, (j+1)*i//levels)), each level's count
    spread evenly over its non-empty bins. Every `coarse`-th threshold first, then each one within
    `coarse` bins of the best: KL is flat near its minimum, and this lands within a few percent of
    the exhaustive minimum's KL (tested) at a tenth of the time of all 1921 rows."""
    nbins = len(hist)
    h = hist.astype(np.float64)
    if h.sum() == 0:
        return 0.0
    first = np.arange(levels, nbins + 1, max(1, coarse))
    best = int(first[np.argmin(_kl_divergences(h, first, levels))])
    near = np.arange(max(levels, best - coarse), min(nbins, best + coarse) + 1)
    best = int(near[np.argmin(_kl_divergences(h, near, levels))])
    return float(best * hist_max / nbins)


def _kl_divergences(h: np.ndarray, thresholds: np.ndarray, levels: int) -> np.ndarray:
    """KL(P || Q) for each threshold (in bins), one row per threshold."""
    nbins = len(h)
    i = thresholds[:, None]  # [T, 1] candidate thresholds (in bins)
    k = np.arange(nbins)[None, :]  # [1, B] bin index
    inside = k < i
    nonzero = (h != 0)[None, :] & inside
    chunk = ((k + 1) * levels + i - 1) // i - 1  # the level of bin k under threshold i
    chunk = np.where(inside, chunk, 0)
    lo = (np.arange(levels + 1)[None, :] * i) // levels  # [T, levels + 1] chunk bounds
    csum = np.concatenate([[0.0], np.cumsum(h)])
    cnz = np.concatenate([[0], np.cumsum(h != 0)])
    sums = csum[lo[:, 1:]] - csum[lo[:, :-1]]
    counts = cnz[lo[:, 1:]] - cnz[lo[:, :-1]]
    per_bin = np.divide(sums, counts, out=np.zeros_like(sums), where=counts > 0)
    q = np.where(nonzero, np.take_along_axis(per_bin, chunk, axis=1), 0.0)
    p = np.where(inside, h[None, :], 0.0)
    tail = csum[-1] - csum[i[:, 0]]
    p[np.arange(len(i)), i[:, 0] - 1] += tail
    pn = p / p.sum(axis=1, keepdims=True)
    qn = q / np.maximum(q.sum(axis=1, keepdims=True), 1e-300)
    # A P bin with empty Q (only the outlier bin can be) costs as if Q held a tiny mass there.
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(pn > 0, pn * np.log(pn / np.maximum(qn, 1e-12)), 0.0)
    return terms.sum(axis=1)


def threshold(stats: TensorStats, method: str, percentile: float) -> float:
    if method == "minmax" or stats.hist is None:
        return stats.amax
    if method == "percentile":
        hist = stats.hist.copy()
        hist[0] += stats.zeros  # the percentile is of every |x|, zeros included
        return min(percentile_threshold(hist, stats.hist_max, percentile), stats.amax)
    return min(entropy_threshold(stats.hist, stats.hist_max), stats.amax)


# ---- the calibrator ----------------------------------------------------------------------------


def graph_hash(graph: Any) -> str:
    """SHA-256 of the graph's text form (structure, types, constant digests)."""
    from graphc.ir.text import format_graph

    return hashlib.sha256(format_graph(graph).encode()).hexdigest()


@dataclass
class Calibrator:
    """Called by the int8 pass as `calibrator(graph, tensor_names) -> {name: amax}`."""

    samples: Sequence[Mapping[str, np.ndarray]] | None
    method: str = "entropy"
    percentile: float = 99.99
    cache_path: Path | None = None
    progress: Callable[[int, int], None] | None = None
    thresholds: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0
    split: dict[str, float] = field(default_factory=lambda: {"run": 0.0, "statistics": 0.0, "thresholds": 0.0})
    cache: str | None = None  # "hit" | "written" | None
    # graph hash -> thresholds found this session: an accuracy search (graphc/accuracy.py) runs
    # the int8 pass several times over the same graph, and calibrates it once.
    memo: dict[str, dict[str, float]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise CompileError(f"calibration_method must be one of {METHODS}, got {self.method!r}")
        if not 0.0 < float(self.percentile) <= 100.0:
            raise CompileError(f"percentile must be in (0, 100], got {self.percentile}")

    def __call__(self, graph: Any, names: Sequence[str]) -> dict[str, float]:
        key = graph_hash(graph)
        known = self.memo.get(key, {})
        if all(n in known for n in names):
            return {n: known[n] for n in names}
        cached = self._read_cache(key, names)
        if cached is not None:
            self.cache = "hit"
            self.thresholds.update(cached)
            self.memo.setdefault(key, {}).update(cached)
            log.info("int8: calibration cache %s holds all %d tensors; no sample run", self.cache_path, len(names))
            return cached
        if not self.samples:
            where = f" (the cache {self.cache_path} does not cover this graph)" if self.cache_path else ""
            raise CompileError(f"precision int8: calibration needs samples{where}; give calibration_data")
        t0 = time.perf_counter()
        found = self._collect(graph, names)
        self.seconds += time.perf_counter() - t0
        self.thresholds.update(found)
        self.memo.setdefault(key, {}).update(found)
        if self.cache_path is not None:
            self._write_cache(key, found)
            self.cache = "written"
        return found

    def _collect(self, graph: Any, names: Sequence[str]) -> dict[str, float]:
        from graphc.interpreter import interpret

        keep_hist = self.method != "minmax"
        stats = {n: TensorStats() for n in names}
        total = len(self.samples or ())
        for i, feed in enumerate(self.samples or ()):
            t0 = time.perf_counter()
            try:
                env = interpret(graph, feed, keep=tuple(names), check_types=False)
            except InputError as e:
                raise InputError(f"calibration sample {i}: {e}") from None
            except GraphcError as e:
                raise CompileError(f"calibration sample {i}: {e}") from None
            t1 = time.perf_counter()
            for n in names:
                stats[n].add(np.asarray(env[n]), keep_hist)
            self.split["run"] += t1 - t0
            self.split["statistics"] += time.perf_counter() - t1
            if self.progress:
                self.progress(i + 1, total)
        t0 = time.perf_counter()
        found = {n: threshold(s, self.method, float(self.percentile)) for n, s in stats.items()}
        self.split["thresholds"] += time.perf_counter() - t0
        return found

    def _read_cache(self, key: str, names: Sequence[str]) -> dict[str, float] | None:
        if self.cache_path is None or not self.cache_path.is_file():
            return None
        try:
            doc = json.loads(self.cache_path.read_text())
        except (OSError, ValueError) as e:
            raise CompileError(f"calibration cache {self.cache_path}: not readable JSON ({e})") from None
        if not isinstance(doc, dict) or doc.get("format") != CACHE_FORMAT or doc.get("version") != CACHE_VERSION:
            raise CompileError(
                f"calibration cache {self.cache_path}: not a graphc int8 calibration cache (v{CACHE_VERSION})"
            )
        same = doc.get("graph_hash") == key and doc.get("method") == self.method
        if same and self.method == "percentile":
            same = doc.get("percentile") == float(self.percentile)
        tensors = doc.get("tensors")
        if not same or not isinstance(tensors, dict) or not all(n in tensors for n in names):
            log.info(
                "int8: calibration cache %s is for another graph, method or tensors; recalibrating", self.cache_path
            )
            return None
        out: dict[str, float] = {}
        for n in names:
            v = tensors[n].get("amax") if isinstance(tensors[n], dict) else None
            if not isinstance(v, (int, float)) or not np.isfinite(v) or v < 0:
                raise CompileError(f"calibration cache {self.cache_path}: tensor '{n}' has a bad amax {v!r}")
            out[n] = float(v)
        return out

    def _write_cache(self, key: str, found: Mapping[str, float]) -> None:
        doc = {
            "format": CACHE_FORMAT,
            "version": CACHE_VERSION,
            "graph_hash": key,
            "method": self.method,
            "percentile": float(self.percentile),
            "samples": len(self.samples or ()),
            "tensors": {n: {"amax": v, "scale": v / 127.0} for n, v in sorted(found.items())},
        }
        assert self.cache_path is not None
        self.cache_path.write_text(json.dumps(doc, indent=1))

    def report(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "percentile": float(self.percentile) if self.method == "percentile" else None,
            "samples": len(self.samples or ()),
            "seconds": round(self.seconds, 3),
            "seconds_split": {k: round(v, 3) for k, v in self.split.items()},  # float graph runs, histograms, search
            "cache": self.cache,
            "tensors": {n: {"amax": v, "scale": v / 127.0} for n, v in sorted(self.thresholds.items())},
        }


def make_calibrator(
    data: Any,
    input_names: Sequence[str],
    method: str,
    percentile: float,
    cache: str | Path | None,
    progress: Callable[[int, int], None] | None = None,
) -> Calibrator:
    samples = None if data is None else load_samples(data, input_names)
    return Calibrator(samples, method, float(percentile), Path(cache) if cache else None, progress)
