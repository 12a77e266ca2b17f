"""What the CLI prints about a compile and an engine, in one place so that `graphc compile` and
`graphc inspect` count kernels the same way and use the same units (bytes through `format_bytes`,
times in ms); and the memory timeline picture (needs matplotlib: `pip install matplotlib`)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from graphc.errors import GraphcError
from graphc.runtime.plan import KernelPlan, MemoryPlan

# Ops that only move or relabel data: a node of these kinds that stands for several original nodes
# (two transposes merged, a reshape chain collapsed) is a rewrite, not a fusion of computation.
DATA_MOVEMENT = {"Transpose", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Expand", "Concat", "Slice"}


def format_bytes(n: int | float) -> str:
    """Bytes in the unit that suits them: 512 B, 12.5 KiB, 3.25 MiB, 1.50 GiB."""
    n = float(n)
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} B"


def kernel_counts(plan: KernelPlan) -> str:
    """'S steps (V views), L launches of K distinct kernels' (CUDA) or '..., N numpy kernels' (CPU):
    the same words in compile's summary and in inspect."""
    views = sum(1 for s in plan.steps if s.alias)
    launches = [ln for s in plan.steps for ln in s.launches]
    head = f"{len(plan.steps)} steps ({views} views)"
    vendor = sum(1 for s in plan.steps if s.vendor is not None)  # --tactics cublaslt: docs/tactics.md
    tail = f", {vendor} cuBLASLt calls (vendor tactic)" if vendor else ""
    if launches or vendor:
        return f"{head}, {len(launches)} launches of {len({ln.digest for ln in launches})} distinct kernels{tail}"
    return f"{head}, {len(plan.steps) - views} numpy kernels"


def arch_kernel_counts(plan: KernelPlan, archs: list[str]) -> list[str]:
    """One line per arch of a CUDA engine: its launches and distinct kernels, and how many steps
    run launches of their own there (an engine built for several archs carries sm_90a kernels for
    sm_90); [] where no arch has launches of its own."""
    if not plan.launch_archs():
        return []
    lines = []
    for arch in archs:
        own = sum(1 for s in plan.steps if arch in s.arch_launches)
        launches = [ln for s in plan.steps for ln in s.launches_for(arch)]
        lines.append(
            f"  {arch}: {len(launches)} launches of {len({ln.digest for ln in launches})} distinct kernels"
            f" ({own} steps with launches of their own)"
        )
    return lines


def split_fusions(fusions: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The report's nodes that stand for several original nodes: (fusions of computation, data-movement
    rewrites such as merged transposes)."""
    fused, moved = [], []
    for f in fusions:
        (moved if f["kind"] in DATA_MOVEMENT else fused).append(f)
    return fused, moved


def compile_summary(report: dict[str, Any], *, max_lines: int = 12) -> str:
    """A readable summary of a compile report: passes with their node counts, ops after, fusions,
    near misses, memory."""
    lines = [
        f"optimizer: {report['nodes_before']} -> {report['nodes_after']} nodes "
        f"in {report['optimize_seconds'] * 1000:.1f} ms"
    ]
    per_pass: dict[str, list[float]] = {}
    for p in report["passes"]:
        acc = per_pass.setdefault(p["name"], [0.0, 0, 0])
        acc[0] += p["seconds"]
        acc[1] += p["nodes_after"] - p["nodes_before"]
        acc[2] += 1
    for name, (secs, change, runs) in per_pass.items():
        # the change in node count, signed as a change: -136 is 136 nodes fewer
        tail = f"  {int(change):+d} nodes" if change else ""
        label = f"{name} (x{runs})" if runs > 1 else name
        lines.append(f"  {label:<24} {secs * 1000:8.1f} ms{tail}")
    lines.append("ops after: " + ", ".join(f"{k} x{v}" for k, v in report["ops_after"].items()))
    fused, moved = split_fusions(report.get("fusions", []))
    if fused:
        lines.append(f"fusions: {len(fused)}")
        for f in fused[:max_lines]:
            lines.append(f"  {f['kind']} '{f['node']}' <- {', '.join(f['absorbed'])}")
        if len(fused) > max_lines:
            lines.append(f"  ... and {len(fused) - max_lines} more")
    if moved:
        kinds = sorted({f["kind"] for f in moved})
        lines.append(f"data-movement rewrites (not fusions): {len(moved)} ({', '.join(kinds)})")
    misses = report.get("near_misses", [])
    if misses:
        lines.append(f"near misses: {len(misses)}")
        for m in misses[:max_lines]:
            lines.append(f"  {m}")
        if len(misses) > max_lines:
            lines.append(f"  ... and {len(misses) - max_lines} more")
    mem = report.get("memory")
    if mem:
        lines.append(
            f"memory: arena {format_bytes(mem['arena_bytes'])} ({mem['arena_over_lower_bound']:.3f}x the lower "
            f"bound; {format_bytes(mem['naive_bytes'])} without reuse), "
            f"workspace {format_bytes(mem['workspace_bytes'])}"
        )
    return "\n".join(lines)


def describe_engine(ef: Any, name: str) -> str:
    """`graphc inspect`'s text: build info, I/O, memory, kernel counts, then every step."""
    m = ef.manifest
    lines = [f"{name}: graphc engine v{m['format_version']} ({m['target']}), built by graphc {m['graphc_version']}"]
    for k, v in sorted(m["build"].items()):
        if k != "options":
            lines.append(f"  {k}: {v}")
    lines.append("inputs:  " + ", ".join(f"{i['name']} {i['dtype']}{i['shape']}" for i in m["inputs"]))
    lines.append("outputs: " + ", ".join(f"{o['name']} {o['dtype']}{o['shape']}" for o in m["outputs"]))
    mem = ef.memory
    lines.append(
        f"memory: arena {format_bytes(mem.arena_bytes)} ({mem.algorithm}; lower bound "
        f"{format_bytes(mem.lower_bound_bytes)}, no reuse {format_bytes(mem.naive_bytes)}), workspace "
        f"{format_bytes(mem.workspace_bytes)}, weights {format_bytes(sum(w.nbytes for w in ef.weights.values()))}"
    )
    lines.append(f"kernels: {kernel_counts(ef.plan)}")
    archs = sorted(set(m.get("archs", [])) | set(ef.plan.launch_archs()), key=lambda a: (len(a), a))
    lines += arch_kernel_counts(ef.plan, archs)
    for s in ef.plan.steps:
        tag = "view" if s.alias else s.kind
        fused = f" <- {', '.join(s.origins)}" if len(s.origins) > 1 or (s.origins and s.origins[0] != s.name) else ""
        lines.append(f"  [{s.index:3d}] {tag:<22} {s.name}{fused}")
        lines += host_if_lines(s, m["target"])
        if s.vendor is not None:
            v = s.vendor
            extra = [f"bias {v['bias']}"] * bool(v.get("bias")) + [f"C {v['c']} (beta {v['beta']})"] * bool(v.get("c"))
            lines.append(
                f"        vendor {v['library']}: {v.get('batch', 1)} x {v['m']}x{v['n']}x{v['k']} act {v['act']}"
                f"{' (erf GELU as tanh)' if v.get('gelu_from_erf') else ''}{', ' + ', '.join(extra) if extra else ''}"
            )
        for arch, own in [("", s.launches), *sorted(s.arch_launches.items())]:
            for ln in own:
                lines.append(
                    f"        {arch + ' ' if arch else ''}{ln.family}:{ln.kernel} grid {ln.grid} block {ln.block} "
                    f"smem {format_bytes(ln.shared_bytes)}{' ' + json.dumps(ln.params) if ln.params else ''}"
                )
    return "\n".join(lines)


def host_if_lines(step: Any, target: str, indent: str = "        ") -> list[str]:
    """What a data-dependent If step does at run time: it runs on the host (why), and each
    branch's sub-plan (nested Ifs below it)."""
    from graphc.runtime.host_if_cuda import is_host_if

    if not is_host_if(step):
        return []
    how = (
        "reads its condition back (one small device-to-host copy and a stream sync), then replays the chosen "
        "branch's CUDA graph"
        if target == "cuda"
        else "reads its condition, then runs the chosen branch's sub-plan"
    )
    loop = "host_loop_version" in step.attrs  # a host Loop/Scan (graphc/host_loop.py): one body sub-plan
    if loop:
        how = (
            "replays its body's CUDA graph per iteration (or the whole loop as one graph where it is static)"
            if target == "cuda"
            else "runs its body's sub-plan once per iteration"
        )
    what = "it is a loop the optimizer did not unroll" if loop else "its condition is known only at run time"
    out = [f"{indent}runs on the host: {what}; the engine {how}"]
    for key in ("body",) if loop else ("then_branch", "else_branch"):
        d = step.attrs.get(key, {})
        if "refused" in d:
            out.append(f"{indent}{key}: refused at run time: {d['refused']}")
            continue
        sub = KernelPlan.from_json(d["plan"])
        launches = sum(len(x.launches) for x in sub.steps)
        arena = format_bytes(d["memory"]["arena_bytes"])
        out.append(f"{indent}{key}: {len(sub.steps)} steps, {launches} launches, arena {arena}")
        for x in sub.steps:
            out += host_if_lines(x, target, indent + "  ")
    return out


# ---- the memory picture ------------------------------------------------------------------------


@dataclass(frozen=True)
class Peak:
    """The step where the most arena bytes are live at once, and the tensors live there."""

    step: int
    live_bytes: int
    tensors: tuple[str, ...]


def memory_peak(plan: KernelPlan, memory: MemoryPlan) -> Peak:
    """The step with the most live bytes (a tensor lives from the step that writes it to the last
    that reads it; -1 is before step 0) and the tensors that make it up, largest first."""
    places = list(memory.placements.values())
    n = len(plan.steps)
    best = Peak(-1, 0, ())
    for step in range(-1, n + 1):
        live = [p for p in places if p.first <= step <= p.last]
        total = sum(p.nbytes for p in live)
        if total > best.live_bytes:
            names = tuple(p.name for p in sorted(live, key=lambda p: -p.nbytes))
            best = Peak(step, total, names)
    return best


def _producers(plan: KernelPlan, *, names: bool = True) -> dict[str, str]:
    """tensor -> '[step] Kind name' of the step that writes it ('input' for graph inputs)."""
    out: dict[str, str] = {name: "input" for name in plan.inputs}
    for s in plan.steps:
        for t in s.outputs:
            out[t] = f"[{s.index}] {s.kind}" + (f" {s.name}" if names else "")
    return out


def require_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise GraphcError(
            "drawing the memory plan needs matplotlib: pip install matplotlib "
            "(or, in a clone of graphc: pip install -e '.[plot]')"
        ) from None


def _unit(nbytes: int) -> tuple[str, int]:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= size:
            return unit, size
    return "B", 1


def draw_memory(plan: KernelPlan, memory: MemoryPlan, path: str | Path, title: str = "", *, listed: int = 40) -> Peak:
    """Each arena tensor a rectangle over the steps it lives (x) and the bytes it occupies (y), with
    a number that the table beside the plot resolves to the tensor's name, size and the op that
    writes it; the tensors live at the peak step are outlined in red and listed first (marked *).
    Returns the peak."""
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    n_steps = max(len(plan.steps), 1)
    peak = memory_peak(plan, memory)
    at_peak = set(peak.tensors)
    producers = _producers(plan, names=False)
    arena = max(memory.arena_bytes, 1)
    unit, scale = _unit(arena)
    places = sorted(memory.placements.values(), key=lambda p: p.offset)
    # numbering: the peak's tensors first (largest first), then the rest by size
    order = list(peak.tensors) + [p.name for p in sorted(places, key=lambda p: -p.nbytes) if p.name not in at_peak]
    number = {name: i + 1 for i, name in enumerate(order)}

    fig, (ax, side) = plt.subplots(
        1, 2, figsize=(min(8 + n_steps * 0.1, 30), 7.5), gridspec_kw={"width_ratios": [3, 2]}
    )
    cmap = plt.get_cmap("tab20")
    for i, p in enumerate(places):
        x0 = p.first + 0.5 if p.first >= 0 else -0.5
        x1 = min(p.last, n_steps) + 0.5
        hot = p.name in at_peak
        ax.add_patch(
            Rectangle(
                (x0, p.offset / scale),
                x1 - x0,
                max(p.nbytes, 1) / scale,
                facecolor=cmap(i % 20),
                edgecolor="red" if hot else "black",
                linewidth=1.6 if hot else 0.3,
                alpha=0.85,
            )
        )
        if p.nbytes >= 0.03 * arena:  # room for a number
            ax.text(
                (x0 + x1) / 2,
                (p.offset + p.nbytes / 2) / scale,
                str(number[p.name]),
                ha="center",
                va="center",
                fontsize=7,
                clip_on=True,
            )
    ax.axhline(arena / scale, color="red", linewidth=1, label=f"arena {format_bytes(memory.arena_bytes)}")
    ax.axhline(
        memory.lower_bound_bytes / scale,
        color="green",
        linestyle="--",
        linewidth=1,
        label=f"lower bound {format_bytes(memory.lower_bound_bytes)}",
    )
    if peak.tensors:
        ax.axvline(
            peak.step,
            color="red",
            linestyle=":",
            linewidth=1,
            label=f"peak: {format_bytes(peak.live_bytes)} live at step {peak.step} (red outlines)",
        )
    ax.set_xlim(-1, n_steps + 1)
    ax.set_ylim(0, arena / scale * 1.12)
    ax.set_xlabel("step")
    ax.set_ylabel(f"arena offset ({unit})")
    ax.set_title(title or "memory plan")
    ax.legend(loc="upper right", fontsize=7)

    side.axis("off")
    rows = []
    for name in order[:listed]:
        mark = "*" if name in at_peak else " "
        who = producers.get(name, "")
        size = format_bytes(memory.placements[name].nbytes)
        rows.append(f"{mark}{number[name]:>3}  {_short(name, 44):<44} {size:>10}  {_short(who, 40)}")
    if len(order) > listed:
        rows.append(f"      ... and {len(order) - listed} more")
    side.text(
        0,
        1,
        "  #  tensor" + " " * 41 + "size  written by\n" + "\n".join(rows),
        family="monospace",
        fontsize=6,
        va="top",
        ha="left",
        transform=side.transAxes,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return peak


def _short(text: str, width: int) -> str:
    return text if len(text) <= width else "…" + text[-(width - 1) :]


def producers_of_step(plan: KernelPlan, step: int) -> str:
    """'Kind name' of step `step`, or '' when there is none."""
    if 0 <= step < len(plan.steps):
        s = plan.steps[step]
        return f"{s.kind} {s.name}"
    return ""


def describe_peak(plan: KernelPlan, memory: MemoryPlan, peak: Peak, limit: int = 8) -> str:
    """The peak in text: the step and the tensors live there, with the op that writes each."""
    producers = _producers(plan)
    where = "before step 0 (inputs)" if peak.step < 0 else (producers_of_step(plan, peak.step) or "the outputs")
    # tensor sizes as placed, before the planner's alignment (its lower bound counts aligned sizes)
    lines = [f"memory peak: {format_bytes(peak.live_bytes)} of tensors live at step {peak.step} ({where}):"]
    for t in peak.tensors[:limit]:
        lines.append(f"  {t:<40} {format_bytes(memory.placements[t].nbytes):>11}  written by {producers.get(t, '?')}")
    if len(peak.tensors) > limit:
        lines.append(f"  ... and {len(peak.tensors) - limit} more")
    return "\n".join(lines)
