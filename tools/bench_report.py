"""The results of tools/bench_torch.py: one Row per (model, exporter, batch, precision), and their
Markdown table and JSON file with the run's environment in a header and geometric means at the bottom.

A Measure is one side (graphc, or one PyTorch mode) at one configuration: (a) the best mean of the
ordinary call back to back, (b) the GPU time of one CUDA-graph replay, the worst cosine of its outputs
to the fp32 reference, its kernel count and its setup time. A measurement that did not run says why
(`skipped`) or how it failed (`errors`); neither is ever left blank without a reason.

    python tools/bench_report.py a.json b.json --out all.md --json-out all.json   # runs merged
"""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# PyTorch's modes, in the order of the table's columns.
TORCH_MODES = ("eager", "default", "reduce-overhead", "max-autotune-no-cudagraphs")
METHODS = ("a", "b")


@dataclass
class Measure:
    a_ms: float | None = None  # (a) ordinary call, back to back: best mean of the rounds
    b_ms: float | None = None  # (b) one CUDA-graph replay, GPU time (CUDA events)
    cosine: float | None = None  # worst over the outputs, against PyTorch fp32 eager
    kernels: int | None = None  # GPU kernels of one call (profiler; graphc: also its plan)
    setup_s: float | None = None  # build/compile through the end of the third call
    skipped: str | None = None  # why it did not run (budget, not applicable, CPU)
    b_skipped: str | None = None  # why (b) did not run when (a) did
    errors: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    def value(self, method: str) -> float | None:
        return self.a_ms if method == "a" else self.b_ms


@dataclass
class Row:
    model: str
    exporter: str
    batch: int
    precision: str
    graphc: Measure = field(default_factory=Measure)
    torch: dict[str, Measure] = field(default_factory=dict)  # shared by the rows of every exporter
    attention: str = ""  # PyTorch's attention implementation (sdpa or eager)

    def best_torch(self, method: str) -> tuple[str, float] | None:
        timed = [(m, v) for m, t in self.torch.items() if (v := t.value(method)) is not None]
        return min(timed, key=lambda mv: mv[1]) if timed else None

    def ratio(self, method: str) -> float | None:
        """graphc / best PyTorch under one method (below 1: graphc is faster)."""
        ours, best = self.graphc.value(method), self.best_torch(method)
        return ours / best[1] if ours is not None and best else None

    def complete(self) -> bool:
        """Every PyTorch mode asked for ran (none skipped for the budget or not reached). A ratio
        against fewer modes would flatter graphc: it is marked, and kept out of the geometric means."""
        return all(t.skipped is None for t in self.torch.values())


def row_from_dict(d: dict[str, Any]) -> Row:
    """A Row back from the JSON file (its derived keys, ratio and best_torch, are recomputed)."""
    fields = {k: v for k, v in d.items() if k not in ("ratio", "best_torch", "complete", "graphc", "torch")}
    return Row(**fields, graphc=Measure(**d["graphc"]), torch={m: Measure(**t) for m, t in d["torch"].items()})


def merge(paths: list[Path]) -> tuple[list[Row], dict[str, Any], list[str], list[str]]:
    """Several runs' JSON files as one table (e.g. the ten models in two GPU calls): rows in order,
    the first run's header with every run's command and date, the union of their skips and modes."""
    docs = [json.loads(Path(p).read_text()) for p in paths]
    rows = [row_from_dict(r) for doc in docs for r in doc["rows"]]
    header = dict(docs[0]["header"])
    header["command"] = " ; ".join(doc["header"]["command"] for doc in docs)
    header["date"] = " ; ".join(dict.fromkeys(doc["header"]["date"] for doc in docs))
    envs = [doc["header"].get("environment") for doc in docs]
    if any(e != envs[0] for e in envs):
        header["environment_differs"] = envs
    modes = [m for m in TORCH_MODES if any(m in r.torch for r in rows)]
    return rows, header, modes, [s for doc in docs for s in doc.get("skipped", [])]


def geomean(values: Iterable[float]) -> float | None:
    vals = [v for v in values if v is not None and v > 0]
    return math.exp(sum(math.log(v) for v in vals) / len(vals)) if vals else None


def geomeans(rows: list[Row]) -> list[dict[str, Any]]:
    """graphc / best PyTorch per (exporter, precision, batch) and method: geometric mean and worst
    over the complete rows, how many those are (n) of the group's rows (of), and how many rows have
    a ratio but are incomplete (a mode was skipped) and so are left out."""
    out = []
    for key in sorted({(r.exporter, r.precision, r.batch) for r in rows}):
        group = [r for r in rows if (r.exporter, r.precision, r.batch) == key]
        entry: dict[str, Any] = {"exporter": key[0], "precision": key[1], "batch": key[2]}
        for method in METHODS:
            ratios = [x for r in group if (x := r.ratio(method)) is not None and r.complete()]
            entry[method] = {
                "geomean": _round(geomean(ratios)),
                "worst": _round(max(ratios)) if ratios else None,
                "n": len(ratios),
                "of": len(group),
                "incomplete": sum(1 for r in group if r.ratio(method) is not None and not r.complete()),
            }
        out.append(entry)
    return out


def _round(v: float | None, digits: int = 4) -> float | None:
    return None if v is None else float(f"{v:.{digits}g}")


def _ms(v: float | None) -> str:
    return "" if v is None else f"{v:.3g}" if v < 100 else f"{v:.0f}"


def _cell(m: Measure | None, method: str | None = None) -> str:
    """One timing cell: 'a / b'; a reason in place of a number that did not run."""
    if m is None:
        return "not run"
    if m.skipped:
        return "skipped"
    if m.errors and m.a_ms is None:
        return "failed"
    if method:
        v = m.value(method)
        return _ms(v) if v is not None else "-"
    return f"{_ms(m.a_ms) or '-'} / {_ms(m.b_ms) or '-'}"


def _ratio(v: float | None) -> str:
    return "" if v is None else f"{v:.2f}"


def markdown(rows: list[Row], header: dict[str, Any], modes: list[str], skipped: list[str]) -> str:
    env = header.get("environment", {})
    lines = [
        f"# graphc against PyTorch ({header.get('date', '')})",
        "",
        f"`{header.get('command', '')}`",
        "",
        ", ".join(f"{k} {v}" for k, v in env.items()),
        "",
        header.get("method", ""),
        "",
    ]
    head = ["model", "exporter", "batch", "precision", "graphc a / b ms"]
    head += [f"{m} a / b ms" for m in modes]
    head += ["graphc / best (a)", "graphc / best (b)", "cosine graphc / PyTorch (worst mode)"]
    head += ["kernels graphc / eager / inductor", "setup s graphc / " + " / ".join(m for m in modes if m != "eager")]
    head += ["notes"]
    lines += ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for r in rows:
        cells = [r.model, r.exporter, str(r.batch), r.precision, _cell(r.graphc)]
        cells += [_cell(r.torch.get(m)) for m in modes]
        for method in METHODS:
            best = r.best_torch(method)
            mark = "" if r.complete() else "*"
            cells.append(f"{_ratio(r.ratio(method))} ({best[0]}){mark}" if r.ratio(method) is not None and best else "")
        torch_cos = [t.cosine for t in r.torch.values() if t.cosine is not None]
        cells.append(f"{_cos(r.graphc.cosine)} / {_cos(min(torch_cos) if torch_cos else None)}")
        compiled = [m for m in modes if m != "eager" and m in r.torch]
        inductor = next((r.torch[m].kernels for m in compiled if r.torch[m].kernels), None)
        eager = r.torch["eager"].kernels if "eager" in r.torch else None
        cells.append(" / ".join(str(k) if k is not None else "-" for k in (r.graphc.kernels, eager, inductor)))
        setups = [r.graphc.setup_s] + [r.torch[m].setup_s if m in r.torch else None for m in modes if m != "eager"]
        cells.append(" / ".join(f"{s:.1f}" if s is not None else "-" for s in setups))
        cells.append(_notes(r, modes))
        lines.append("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
    lines += ["", "\\* not every PyTorch mode ran (see the notes): against fewer modes, so not in the means.", ""]
    lines += ["Geometric mean of graphc / best PyTorch (below 1: graphc faster), the worst row, complete rows of all:"]
    lines += [""]
    lines += [
        "| exporter | precision | batch | (a) ordinary call | (b) graph replay |",
        "| --- | --- | --- | --- | --- |",
    ]
    for g in geomeans(rows):
        cells = [g["exporter"], g["precision"], str(g["batch"])]
        for method in METHODS:
            e = g[method]
            cells.append(f"{_ratio(e['geomean'])} (worst {_ratio(e['worst'])}, {e['n']}/{e['of']})" if e["n"] else "")
        lines.append("| " + " | ".join(cells) + " |")
    if skipped:
        lines += ["", "Skipped:", ""] + [f"- {s}" for s in skipped]
    return "\n".join(lines) + "\n"


def _cos(v: float | None) -> str:
    return "-" if v is None else f"{v:.6f}"


def _notes(r: Row, modes: list[str]) -> str:
    """Reasons and errors, short; the JSON file has them in full."""
    notes = []
    for name, m in [("graphc", r.graphc)] + [(k, r.torch[k]) for k in modes if k in r.torch]:
        if m.skipped:
            notes.append(f"{name} skipped: {m.skipped}")
        for e in m.errors:
            notes.append(f"{name}: {e[:160]}")
    return "; ".join(notes)


def write(rows: list[Row], header: dict[str, Any], modes: list[str], skipped: list[str],
          md: Path | None, js: Path | None) -> None:  # fmt: skip
    """Rewritten after every measurement, so a run cut short keeps what it measured; each file is
    replaced whole (written beside, then renamed), so a run killed while writing leaves the last one."""
    if md:
        _replace(md, markdown(rows, header, modes, skipped))
    if js:
        doc = {"header": header, "rows": [asdict(r) for r in rows], "geomeans": geomeans(rows), "skipped": skipped}
        for out, r in zip(doc["rows"], rows, strict=True):
            out["ratio"] = {m: _round(r.ratio(m)) for m in METHODS}
            out["best_torch"] = {m: (b[0] if (b := r.best_torch(m)) else None) for m in METHODS}
            out["complete"] = r.complete()
        _replace(js, json.dumps(doc, indent=1) + "\n")


def _replace(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".part")
    tmp.write_text(text)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(description="Merge tools/bench_torch.py JSON files into one table and JSON file.")
    p.add_argument("json", nargs="+", type=Path, help="bench_torch.py --json files")
    p.add_argument("--out", type=Path, help="Markdown table")
    p.add_argument("--json-out", type=Path, help="merged JSON file")
    a = p.parse_args(argv)
    try:
        rows, header, modes, skipped = merge(a.json)
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"bench_report: cannot read {', '.join(map(str, a.json))}: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    write(rows, header, modes, skipped, a.out, a.json_out)
    if not a.out:
        print(markdown(rows, header, modes, skipped), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
