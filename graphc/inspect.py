"""The memory timeline picture: each arena tensor a rectangle over the steps it lives (x) and the
bytes it occupies (y). Needs matplotlib (pip install graphc[plot])."""

from __future__ import annotations

from pathlib import Path

from graphc.errors import GraphcError
from graphc.runtime.plan import KernelPlan, MemoryPlan


def draw_memory(plan: KernelPlan, memory: MemoryPlan, path: str | Path, title: str = "") -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Rectangle
    except ImportError:
        raise GraphcError("drawing the memory plan needs matplotlib: pip install graphc[plot]") from None
    n_steps = max(len(plan.steps), 1)
    fig, ax = plt.subplots(figsize=(min(4 + n_steps * 0.08, 24), 6))
    mib = 2**20
    cmap = plt.get_cmap("tab20")
    for i, p in enumerate(sorted(memory.placements.values(), key=lambda p: p.offset)):
        x0 = p.first + 0.5 if p.first >= 0 else -0.5
        x1 = min(p.last, n_steps) + 0.5
        ax.add_patch(
            Rectangle(
                (x0, p.offset / mib),
                x1 - x0,
                max(p.nbytes, 1) / mib,
                facecolor=cmap(i % 20),
                edgecolor="black",
                linewidth=0.3,
                alpha=0.85,
            )
        )
    ax.axhline(memory.arena_bytes / mib, color="red", linewidth=1, label=f"arena {memory.arena_bytes / mib:.2f} MiB")
    ax.axhline(
        memory.lower_bound_bytes / mib,
        color="green",
        linestyle="--",
        linewidth=1,
        label=f"lower bound {memory.lower_bound_bytes / mib:.2f} MiB",
    )
    ax.set_xlim(-1, n_steps + 1)
    ax.set_ylim(0, max(memory.arena_bytes, 1) / mib * 1.05)
    ax.set_xlabel("step")
    ax.set_ylabel("arena offset (MiB)")
    ax.set_title(title or "memory plan")
    ax.legend(loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
