"""ONNX's backend node tests, run through graphc's ONNX backend: the conformance report.

    python tools/conformance.py                              # all cases -> docs/conformance.{md,json}
    python tools/conformance.py --filter 'softmax|relu'      # a subset (regex on the case name)
    python tools/conformance.py --expect docs/conformance.json   # regression check (exit 1)

The cases are generated from the installed onnx package (`collect_testcases()`), so the suite
follows the onnx version. Each case runs in a worker process with a time limit, so that one hang
or crash cannot stall the run, and is compared as ONNX's backend test runner compares: same
number of outputs, same shape, same dtype, `assert_allclose` with the case's rtol/atol (NaNs
equal), sequences element by element, strings exactly.

A case is `passed`, `unsupported` (graphc raised UnsupportedOpError while loading it: an op or
op form it does not implement), or `failed` (anything else: a wrong answer, an error, a crash,
a time-out).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import json
import multiprocessing
import multiprocessing.connection
import os
import platform
import re
import sys
import time
import warnings
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "docs" / "conformance.md"
DEFAULT_TIMEOUT_S = 60.0
# Address space per worker: a case that asks for more fails with MemoryError instead of taking
# the machine down.
DEFAULT_MEMORY_GB = 6.0
STATUSES = ("passed", "failed", "unsupported")
REASON_MAX = 240


# ---- cases ----------------------------------------------------------------------------------


@dataclasses.dataclass
class Case:
    """One node test case, in a form that pickles cheaply to a worker."""

    name: str
    op: str
    model: bytes
    data_sets: list[tuple[list[Any], list[Any]]]
    rtol: float
    atol: float
    opt_level: int = 0  # > 0: bind the case's input shapes and run the optimizer first


@dataclasses.dataclass
class Result:
    name: str
    op: str
    status: str
    reason: str = ""
    seconds: float = 0.0
    # For unsupported cases: the op types graphc reported as missing.
    missing: list[str] = dataclasses.field(default_factory=list)


_EXPANDED = re.compile(r"_expanded(_ver\d+)?$")


def collect_cases(pattern: str | None = None) -> list[Case]:
    """The node test cases of the installed onnx whose names match `pattern` (re.search)."""
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        all_cases = collect_testcases()
    single = {c.name: c.model.graph.node[0].op_type for c in all_cases if len(c.model.graph.node) == 1}
    rx = re.compile(pattern) if pattern else None
    cases = []
    for c in all_cases:
        if rx is not None and not rx.search(c.name):
            continue
        data_sets = [
            ([_normalize(x) for x in inputs], [_normalize(x) for x in outputs]) for inputs, outputs in c.data_sets
        ]
        cases.append(
            Case(
                name=c.name,
                op=case_op(c.name, c.model, single),
                model=c.model.SerializeToString(),
                data_sets=data_sets,
                rtol=float(c.rtol),
                atol=float(c.atol),
            )
        )
    return cases


def _normalize(x: Any) -> Any:
    """Test data as numpy (TensorProtos converted, as ONNX's runner does); lists stay lists."""
    import onnx

    if isinstance(x, onnx.TensorProto):
        return onnx.numpy_helper.to_array(x)
    if isinstance(x, list):
        return [_normalize(e) for e in x]
    return x


def case_op(name: str, model: Any, single: dict[str, str]) -> str:
    """The op a case tests: its node's op; for an expanded or multi-node case, the op that the
    case's name names (its unexpanded twin's op, else the schema name the case name spells)."""
    nodes = model.graph.node
    base = _EXPANDED.sub("", name)
    if base != name and base in single:
        return single[base]
    if len(nodes) == 1:
        return nodes[0].op_type
    if base in single:
        return single[base]
    return _op_from_name(base) or (nodes[0].op_type if nodes else "?")


def _op_from_name(base: str) -> str | None:
    import onnx

    key = base.removeprefix("test_").replace("_", "").lower()
    best = None
    for s in onnx.defs.get_all_schemas():
        low = s.name.lower()
        if key.startswith(low) and (best is None or len(low) > len(best.lower())):
            best = s.name
    return best


# ---- running one case (in a worker) ---------------------------------------------------------


def run_case(case: Case) -> Result:
    """Run one case through graphc's ONNX backend and compare with the expected outputs."""
    from graphc import onnx_backend
    from graphc.errors import UnsupportedOpError

    t0 = time.perf_counter()

    def done(status: str, reason: str = "", missing: Sequence[str] = ()) -> Result:
        return Result(case.name, case.op, status, _one_line(reason), time.perf_counter() - t0, list(missing))

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            rep = onnx_backend.prepare(case.model, "CPU", opt_level=case.opt_level)
    except UnsupportedOpError as e:
        missing = sorted({f"{dom + '.' if dom else ''}{op}" for op, dom, _, _ in e.unsupported})
        return done("unsupported", str(e), missing)
    except Exception as e:
        return done("failed", f"load: {type(e).__name__}: {e}")
    for k, (inputs, expected) in enumerate(case.data_sets):
        where = f"data set {k}: " if len(case.data_sets) > 1 else ""
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                outputs = list(rep.run(list(inputs)))
        except Exception as e:
            return done("failed", f"{where}run: {type(e).__name__}: {e}")
        problem = compare_outputs(expected, outputs, case.rtol, case.atol)
        if problem:
            return done("failed", where + problem)
    return done("passed")


def compare_outputs(expected: Sequence[Any], actual: Sequence[Any], rtol: float, atol: float) -> str | None:
    """None when `actual` matches `expected` as ONNX's backend test runner judges; else why not."""
    if len(actual) != len(expected):
        return f"{len(actual)} outputs, expected {len(expected)}"
    for i, (ref, out) in enumerate(zip(expected, actual, strict=True)):
        problem = _compare_one(ref, out, rtol, atol)
        if problem:
            return f"output {i}: {problem}"
    return None


def _compare_one(ref: Any, out: Any, rtol: float, atol: float) -> str | None:
    if isinstance(ref, (list, tuple)):
        if not isinstance(out, (list, tuple)):
            return f"got {type(out).__name__}, expected a sequence"
        if len(out) != len(ref):
            return f"sequence of {len(out)} tensors, expected {len(ref)}"
        for j, (r, o) in enumerate(zip(ref, out, strict=True)):
            problem = _compare_one(r, o, rtol, atol)
            if problem:
                return f"element {j}: {problem}"
        return None
    if isinstance(out, (list, tuple)):
        return f"got a sequence of {len(out)}, expected a tensor"
    if ref is None or out is None:
        return None if ref is None and out is None else f"got {out!r}, expected {ref!r}"
    ref = np.asarray(ref)
    out = np.asarray(out)
    if out.shape != ref.shape:
        return f"shape {out.shape}, expected {ref.shape}"
    if ref.dtype == object:
        if out.dtype != object and out.dtype.kind not in "US":
            return f"dtype {out.dtype}, expected strings"
        return None if np.array_equal(out, ref) else "strings differ"
    if out.dtype != ref.dtype:
        return f"dtype {out.dtype}, expected {ref.dtype}"
    if out.dtype.name == "bfloat16":
        # As ONNX's runner: numpy cannot promote bfloat16 with a Python float; allow two ULPs.
        rtol = max(rtol, 2**-6)
        out, ref = out.astype(np.float32), ref.astype(np.float32)
    try:
        np.testing.assert_allclose(out, ref, rtol=rtol, atol=atol)
    except AssertionError as e:
        return _summarize_mismatch(str(e), rtol, atol)
    except Exception as e:  # e.g. a dtype numpy cannot compare
        return f"cannot compare: {type(e).__name__}: {e}"
    return None


def _summarize_mismatch(message: str, rtol: float, atol: float) -> str:
    lines = [ln.strip() for ln in message.splitlines()]
    parts = []
    first = None  # numpy lists mismatches after "Mismatch at index:"; the first says the most
    for prev, ln in zip(["", *lines], lines, strict=False):
        if prev.startswith("Mismatch at ind") and ln.startswith("["):
            first = ln.replace(" (ACTUAL)", " actual").replace(" (DESIRED)", " expected")
        elif ln.startswith("Mismatched elements:"):
            parts.append(ln.removeprefix("Mismatched elements:").strip() + " mismatched")
        elif ln.startswith("Max absolute difference"):
            parts.append("max abs diff " + ln.rsplit(":", 1)[1].strip())
        elif ln.startswith("Max relative difference"):
            parts.append("max rel diff " + ln.rsplit(":", 1)[1].strip())
        elif ln.startswith("x and y nan location mismatch") or "nan location" in ln:
            parts.append("NaN locations differ")
        elif ln.startswith("x and y +inf") or ln.startswith("x and y -inf"):
            parts.append("inf locations differ")
    if not parts:
        parts.append(next((ln for ln in lines if ln), "values differ"))
    if first:
        parts.append(f"first at {first}")
    return f"values differ (rtol={rtol:g}, atol={atol:g}): " + ", ".join(parts)


def _one_line(text: str) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= REASON_MAX else text[: REASON_MAX - 3] + "..."


# ---- workers --------------------------------------------------------------------------------


def _worker(conn: multiprocessing.connection.Connection, memory_gb: float) -> None:
    if memory_gb > 0:
        try:
            import resource

            limit = int(memory_gb * (1 << 30))
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        except (ImportError, ValueError, OSError):
            pass
    import logging

    logging.disable(logging.CRITICAL)
    while True:
        try:
            case = conn.recv()
        except EOFError:
            return
        if case is None:
            return
        try:
            result = run_case(case)
        except BaseException as e:  # MemoryError, RecursionError: report, do not die silently
            result = Result(case.name, case.op, "failed", _one_line(f"{type(e).__name__}: {e}"))
        conn.send(result)


class _Slot:
    """One worker process and the case it is running."""

    def __init__(self, ctx: Any, memory_gb: float):
        self.ctx = ctx
        self.memory_gb = memory_gb
        self.start()

    def start(self) -> None:
        self.conn, child = self.ctx.Pipe()
        self.proc = self.ctx.Process(target=_worker, args=(child, self.memory_gb), daemon=True)
        self.proc.start()
        child.close()
        self.case: Case | None = None
        self.started = 0.0

    def submit(self, case: Case) -> None:
        self.case = case
        self.started = time.monotonic()
        self.conn.send(case)

    def restart(self) -> None:
        self.proc.kill()
        self.proc.join(5)
        self.conn.close()
        self.start()

    def stop(self) -> None:
        with contextlib.suppress(OSError):
            self.conn.send(None)
        self.proc.join(2)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(2)


def _preload() -> None:
    """Import graphc and register its ops before forking, so that workers start warm."""
    try:
        from graphc import onnx_backend  # noqa: F401
        from graphc.frontend.registry import supported_ops
        from graphc.ops.registry import all_ops

        supported_ops()
        all_ops()
    except Exception:  # a broken import fails every case in its worker, with the reason
        pass


def _mp_context() -> Any:
    # fork: the workers start at once and need not re-import anything; spawn where there is no fork.
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("fork" if "fork" in methods else "spawn")


def run_cases(
    cases: Sequence[Case],
    *,
    jobs: int = 2,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    memory_gb: float = DEFAULT_MEMORY_GB,
    progress: bool = False,
) -> list[Result]:
    """Run cases in `jobs` worker processes; a case past `timeout_s` is killed and fails."""
    if jobs <= 0:
        raise ValueError("jobs must be positive")
    pending = list(reversed(cases))
    results: dict[str, Result] = {}
    ctx = _mp_context()
    if ctx.get_start_method() == "fork":
        _preload()
    slots = [_Slot(ctx, memory_gb) for _ in range(min(jobs, max(len(cases), 1)))]
    t0 = time.monotonic()
    try:
        for s in slots:
            if pending:
                s.submit(pending.pop())
        while any(s.case is not None for s in slots):
            busy = [s for s in slots if s.case is not None]
            now = time.monotonic()
            wait_s = max(0.0, min(s.started + timeout_s - now for s in busy))
            ready = multiprocessing.connection.wait([s.conn for s in busy], timeout=wait_s + 0.05)
            for s in busy:
                case = s.case
                assert case is not None
                if s.conn in ready:
                    try:
                        result = s.conn.recv()
                    except (EOFError, OSError):
                        code = s.proc.exitcode if s.proc.exitcode is not None else "?"
                        result = Result(case.name, case.op, "failed", f"worker died (exit code {code})")
                        s.restart()
                elif time.monotonic() - s.started > timeout_s:
                    result = Result(case.name, case.op, "failed", f"timed out after {timeout_s:g} s", timeout_s)
                    s.restart()
                else:
                    continue
                results[case.name] = result
                s.case = None
                if pending:
                    s.submit(pending.pop())
                if progress and len(results) % 100 == 0:
                    print(
                        f"  {len(results)}/{len(cases)} cases, {time.monotonic() - t0:.0f} s",
                        file=sys.stderr,
                        flush=True,
                    )
    finally:
        for s in slots:
            s.stop()
    return [results[c.name] for c in cases]


# ---- reports --------------------------------------------------------------------------------


def totals(results: Iterable[Result]) -> dict[str, int]:
    counts = Counter(r.status for r in results)
    out = {s: counts.get(s, 0) for s in STATUSES}
    out["total"] = sum(out.values())
    return out


def by_op(results: Iterable[Result]) -> dict[str, dict[str, int]]:
    table: dict[str, dict[str, int]] = {}
    for r in results:
        row = table.setdefault(r.op, {s: 0 for s in STATUSES} | {"total": 0})
        row[r.status] += 1
        row["total"] += 1
    return dict(sorted(table.items(), key=lambda kv: kv[0].lower()))


def environment() -> dict[str, str]:
    import onnx

    import graphc

    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "onnx": onnx.__version__,
        "numpy": np.__version__,
        "graphc": graphc.__version__,
        "python": platform.python_version(),
    }


def to_json(results: Sequence[Result], env: dict[str, str], pattern: str | None) -> dict[str, Any]:
    return {
        "environment": env,
        "filter": pattern,
        "totals": totals(results),
        "cases": {
            r.name: {"op": r.op, "status": r.status, "seconds": round(r.seconds, 1)}
            | ({"reason": r.reason} if r.reason else {})
            | ({"missing": r.missing} if r.missing else {})
            for r in sorted(results, key=lambda r: r.name)
        },
    }


def dump_json(data: dict[str, Any]) -> str:
    """JSON with one line per case, so that a change of one case is a one-line diff."""
    head = {k: v for k, v in data.items() if k != "cases"}
    text = json.dumps(head, indent=1)[:-2]  # drop the closing "\n}"
    cases = ",\n".join(f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in data["cases"].items())
    return text + ',\n "cases": {\n' + cases + "\n }\n}\n"


def to_markdown(results: Sequence[Result], env: dict[str, str], pattern: str | None) -> str:
    t = totals(results)
    pct = 100.0 * t["passed"] / t["total"] if t["total"] else 0.0
    lines = [
        "# ONNX backend node tests",
        "",
        "Generated by `python tools/conformance.py"
        + (f" --filter '{pattern}'" if pattern else "")
        + "`; do not edit by hand. `python tools/conformance.py --expect docs/conformance.json` "
        "fails if a case recorded here as passed no longer passes.",
        f"Date {env['date']}; onnx {env['onnx']}, numpy {env['numpy']}, graphc {env['graphc']}, "
        f"Python {env['python']}.",
        "",
        "Every node test case of the installed onnx package runs through `graphc.onnx_backend` "
        "(device CPU: the reference interpreter) and is compared as ONNX's backend test runner "
        "compares, with the case's own rtol/atol. `unsupported`: graphc raised UnsupportedOpError "
        "while loading the model; `failed`: anything else (wrong values, an error, a time-out). "
        "`_expanded` cases (the op spelled with its function body) count under the op they expand.",
        "",
        "## Totals",
        "",
        "| passed | failed | unsupported | total | pass rate |",
        "| ---: | ---: | ---: | ---: | ---: |",
        f"| {t['passed']} | {t['failed']} | {t['unsupported']} | {t['total']} | {pct:.1f}% |",
        "",
    ]
    missing = Counter(m for r in results if r.status == "unsupported" for m in r.missing)
    fail_ops = Counter(r.op for r in results if r.status == "failed")
    if fail_ops:
        lines += ["## Op types with the most failed cases", ""]
        lines += ["| op | failed cases |", "| --- | ---: |"]
        lines += [f"| {op} | {n} |" for op, n in fail_ops.most_common(20)]
        lines.append("")
    if missing:
        lines += ["## Op types graphc lacks (by the number of cases they make unsupported)", ""]
        lines += ["| op | cases | why |", "| --- | ---: | --- |"]
        lines += [f"| {op} | {n} | {_md_cell(why_missing(op))} |" for op, n in missing.most_common()]
        lines.append("")
    slowest = [r for r in sorted(results, key=lambda r: r.seconds, reverse=True)[:10] if r.seconds >= 1.0]
    if slowest:
        lines += ["## Slowest cases", "", "| case | seconds | status |", "| --- | ---: | --- |"]
        lines += [f"| {r.name} | {r.seconds:.1f} | {r.status} |" for r in slowest]
        lines.append("")
    lines += [
        "## By op",
        "",
        "| op | passed | failed | unsupported | total |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for op, row in by_op(results).items():
        lines.append(f"| {op} | {row['passed']} | {row['failed']} | {row['unsupported']} | {row['total']} |")
    lines.append("")
    failures = sorted((r for r in results if r.status == "failed"), key=lambda r: (r.op.lower(), r.name))
    lines += ["## Failures", ""]
    if failures:
        lines += ["| case | op | why | what the runner saw |", "| --- | --- | --- | --- |"]
        lines += [f"| {r.name} | {r.op} | {_md_cell(why_failed(r.name))} | {_md_cell(r.reason)} |" for r in failures]
    else:
        lines.append("None.")
    lines.append("")
    return "\n".join(lines)


# Why the cases that do not pass do not: graphc's choice where ONNX's expected output and ONNX
# Runtime / PyTorch disagree, or what graphc does not model. A case or op not listed says so.
WHY_FAILED = {
    "test_attention_4d_causal_fp16_expanded": "the expanded function's nodes each round to float16, which the "
    "expected output's computation does not: 2 of 192 values 2 fp16 ulps apart; the fused form "
    "(test_attention_4d_causal_fp16) passes",
    "test_training_dropout": "training-mode dropout is random (the expected masks come from numpy's generator); "
    "graphc computes inference and refuses it in one line",
    "test_maxunpool_export_with_output_shape": "graphc reads indices as flat positions in output_shape, as "
    "PyTorch's max_unpool and ONNX Runtime do; ONNX's reference scatters into the default shape and pads it",
    "test_resize_downsample_scales_cubic_align_corners": "align_corners with scales: graphc uses the integer "
    "output length, as ONNX Runtime and PyTorch do; ONNX's reference the fractional in * scale "
    "(runtime/reference/resize.py source_coords)",
}
WHY_FAILED["test_training_dropout_default"] = WHY_FAILED["test_training_dropout_default_mask"] = WHY_FAILED[
    "test_training_dropout_mask"
] = WHY_FAILED["test_training_dropout"]
WHY_FAILED["test_resize_downsample_scales_linear_align_corners"] = WHY_FAILED[
    "test_resize_downsample_scales_cubic_align_corners"
]
_STRINGS = "string tensors (text preprocessing) are not in graphc's IR"
_ML = "the classical-ML domain ai.onnx.ml is not implemented"  # but for the two its converters map
_TRAINING = "a training op (ai.onnx.preview.training); graphc compiles inference"
_RANDOM = "a random generator: its values cannot equal the expected ones (numpy's generator); not implemented"
WHY_MISSING = {
    "ImageDecoder": "decodes encoded image bytes (JPEG, PNG...): input preprocessing, not implemented",
    "StringSplit": _STRINGS,
    "StringNormalizer": _STRINGS,
    "StringConcat": _STRINGS,
    "RegexFullMatch": _STRINGS,
    "Bernoulli": _RANDOM,
    "RandomUniformLike": _RANDOM,
    "Scan": "test_scan_sum is Scan-8 (a batch axis and sequence_lens); graphc implements Scan from opset 9",
}


def why_failed(case: str) -> str:
    return WHY_FAILED.get(case, "not yet analysed")


def why_missing(op: str) -> str:
    if op.startswith("ai.onnx.ml."):
        return _ML + " beyond Binarizer and ArrayFeatureExtractor"
    if op.startswith("ai.onnx.preview.training."):
        return _TRAINING
    return WHY_MISSING.get(op, "not implemented")


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def regressions(results: Sequence[Result], expected: dict[str, Any]) -> list[tuple[Result, str]]:
    """Cases recorded as passed in `expected` (a conformance.json) that did not pass now."""
    recorded = expected.get("cases", {})
    out = []
    for r in results:
        before = recorded.get(r.name)
        if before and before.get("status") == "passed" and r.status != "passed":
            out.append((r, before.get("status", "?")))
    return out


def write_reports(results: Sequence[Result], md_path: Path, json_path: Path, pattern: str | None) -> None:
    env = environment()
    md_path.parent.mkdir(parents=True, exist_ok=True)
    md_path.write_text(to_markdown(results, env, pattern))
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(dump_json(to_json(results, env, pattern)))


# ---- command line ---------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--filter", metavar="REGEX", help="only cases whose name matches (re.search)")
    p.add_argument("--jobs", "-j", type=int, default=min(2, os.cpu_count() or 1), help="worker processes")
    p.add_argument(
        "--out",
        type=Path,
        help=f"markdown report (default {DEFAULT_OUT.relative_to(ROOT)}; with --expect, none unless given)",
    )
    p.add_argument("--json", type=Path, help="machine-readable results (default: --out with .json)")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds per case")
    p.add_argument("--memory-gb", type=float, default=DEFAULT_MEMORY_GB, help="address space per worker")
    p.add_argument(
        "--expect",
        type=Path,
        metavar="JSON",
        help="fail (exit 1) if a case recorded as passed in this file does not pass now",
    )
    p.add_argument("--quiet", "-q", action="store_true", help="no progress lines")
    p.add_argument(
        "--opt-level",
        type=int,
        default=0,
        help="run each case through the optimizer at this level first (its input shapes bound)",
    )
    args = p.parse_args(argv)

    expected = json.loads(args.expect.read_text()) if args.expect else None
    t0 = time.monotonic()
    cases = [dataclasses.replace(c, opt_level=args.opt_level) for c in collect_cases(args.filter)]
    if not cases:
        print(f"no case matches {args.filter!r}", file=sys.stderr)
        return 2
    if not args.quiet:
        print(f"running {len(cases)} cases on {args.jobs} worker(s)...", file=sys.stderr, flush=True)
    results = run_cases(
        cases, jobs=args.jobs, timeout_s=args.timeout, memory_gb=args.memory_gb, progress=not args.quiet
    )
    t = totals(results)
    print(
        f"passed {t['passed']}, failed {t['failed']}, unsupported {t['unsupported']}, total {t['total']} "
        f"({time.monotonic() - t0:.0f} s)"
    )

    # The committed report is the full run's: a --filter or --expect run writes one only when asked.
    out = args.out if args.out is not None else (None if expected is not None or args.filter else DEFAULT_OUT)
    if out is not None:
        json_path = args.json or out.with_suffix(".json")
        write_reports(results, out, json_path, args.filter)
        print(f"wrote {out} and {json_path}")
    elif args.json is not None:
        args.json.write_text(dump_json(to_json(results, environment(), args.filter)))

    if expected is not None:
        bad = regressions(results, expected)
        if bad:
            print(f"{len(bad)} case(s) passed in {args.expect} but not now:")
            for r, _ in bad:
                print(f"  {r.name} [{r.op}]: {r.status}: {r.reason}")
            return 1
        print(f"no regressions against {args.expect}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
