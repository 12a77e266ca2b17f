"""Programmatic dependent launch (PDL, sm_90+): which kernels may be launched programmatically.

A kernel is PDL-ready when the first statement of its body is GC_PDL_ENTRY() (common.cuh:
griddepcontrol.wait, then launch_dependents) and its source defines that macro with the wait: no
thread then touches global memory before the grids it depends on have completed. codegen/kernel.py
writes the entry into every rendered kernel (`add_pdl_entries`); the engine records the ready
kernels (manifest `kernels[digest].pdl`) and the loader checks each record against the source.
Launching a kernel that does not wait programmatically would race with the kernel before it, so
the runtime launches only recorded, checked kernels that way (docs/launches.md).
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass

from graphc.runtime.errors import EngineError

ENTRY = "GC_PDL_ENTRY();"
# the macro as common.cuh defines it for sm_90+ (the wait must be its first instruction)
_DEFINE = re.compile(r'#define GC_PDL_ENTRY\(\) asm volatile\("griddepcontrol\.wait;')
_GLOBAL = re.compile(r'^[ \t]*(?:extern[ \t]+"C"[ \t]+)?__global__\b', re.MULTILINE)
_IDENT = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*$")
# the oldest arch with griddepcontrol
MIN_ARCH = 90


@dataclass(frozen=True)
class KernelEntry:
    name: str  # the __global__ function's name
    body: int  # index of the character after the body's opening brace


def kernel_entries(source: str) -> list[KernelEntry]:
    """Every __global__ function definition of `source` (declarations without a body are skipped):
    its name (the identifier before its last top-level parenthesis group, so __launch_bounds__(..)
    and __cluster_dims__(..) before the name are passed over) and where its body begins."""
    out = []
    for m in _GLOBAL.finditer(source):
        depth, group_start, last_group = 0, -1, -1
        i = m.end()
        while i < len(source):
            c = source[i]
            if c == "(":
                if depth == 0:
                    group_start = i
                depth += 1
            elif c == ")":
                depth -= 1
                if depth == 0:
                    last_group = group_start
            elif depth == 0 and c == ";":
                break  # a declaration
            elif depth == 0 and c == "{":
                name = _IDENT.search(source, m.end(), last_group) if last_group > 0 else None
                if name is not None:
                    out.append(KernelEntry(name.group(1), i + 1))
                break
            i += 1
    return out


def add_pdl_entries(source: str) -> str:
    """`source` with GC_PDL_ENTRY() as the first statement of every kernel body (on the brace's
    line, so NVRTC's line numbers stay those of the template)."""
    parts, last = [], 0
    for e in kernel_entries(source):
        if source[e.body :].lstrip().startswith(ENTRY):
            continue
        parts += [source[last : e.body], " " + ENTRY]
        last = e.body
    return "".join(parts) + source[last:]


def waits_first(source: str, name: str) -> bool:
    """Whether kernel `name` of `source` waits for the grids before it first thing (see above)."""
    if not _DEFINE.search(source):
        return False
    entries = [e for e in kernel_entries(source) if e.name == name]
    return len(entries) == 1 and source[entries[0].body :].lstrip().startswith(ENTRY)


def has_cluster_shape(source: str, name: str) -> bool:
    """Whether kernel `name` of `source` carries a compile-time cluster shape (__cluster_dims__ on
    its definition or on a declaration of it)."""
    pattern = r"__global__[^;{]*__cluster_dims__\s*\([^)]*\)[^;{]*\b" + re.escape(name) + r"\s*\("
    return re.search(pattern, source) is not None


# Cluster kernels that may launch programmatically, by the family prefix of their name (kernel names
# are gc_<family>_<digest>, codegen/kernel.py). Measured on the H200 (driver 580.159.04, 2026-12-04,
# docs/launches.md, tools/probe_pdl_cluster.py): a probe of PDL into and out of cluster kernels
# (compile-time and launch-time cluster shapes, four load kinds, coalesced and scattered 16-bit
# writes, stream launches and graph replays, early entry confirmed) saw no stale word; the wgmma
# GEMM with cluster split-K after a kernel writing its A operand was right on 18 of 18 replays of new
# inputs under PDL (128x768x768 S 4, 197x2304x768 S 2). The split-K convolution cluster
# (conv_sm90_igemm.cu.j2) is still wrong under PDL (13-17 of 18 replays) and right launched through
# cuLaunchKernelEx without the PDL attribute; a 100 us sleep after its wait does not fix it (so it
# is not a read before the previous grid completed), nor L2-only residual loads or a proxy fence,
# while two special-register reads and a printf at its entry do: not understood, so it stays plain.
# The GEMM clusters are opt-in (GRAPHC_PDL_CLUSTERS=1) until the GPU suite has run with them and the
# whole-model A/B (tools/bench_small_m_rule.py) says what they buy; the GPU machine was withdrawn
# before either ran.
CLUSTER_PDL_PREFIXES = ("gc_gemm_",)


def env_pdl_clusters() -> bool:
    """GRAPHC_PDL_CLUSTERS=1: the cluster kernels of CLUSTER_PDL_PREFIXES may launch programmatically
    (read when an engine is built, saved or loaded); unset or 0: every cluster kernel plain."""
    return os.environ.get("GRAPHC_PDL_CLUSTERS", "").strip().lower() in ("1", "on", "true", "yes")


@contextlib.contextmanager
def pdl_clusters(on: bool) -> Iterator[None]:
    """GRAPHC_PDL_CLUSTERS set to `on` inside the block and restored after it: for benchmarks that
    build the same engine with GEMM clusters plain and programmatic in one process."""
    old = os.environ.get("GRAPHC_PDL_CLUSTERS")
    os.environ["GRAPHC_PDL_CLUSTERS"] = "1" if on else "0"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("GRAPHC_PDL_CLUSTERS", None)
        else:
            os.environ["GRAPHC_PDL_CLUSTERS"] = old


def pdl_ready(source: str, name: str) -> bool:
    """Whether kernel `name` of `source` may be launched programmatically: it waits first thing and
    it is not a thread-block-cluster kernel, or (with GRAPHC_PDL_CLUSTERS=1) a cluster kernel of a
    family measured right under PDL (CLUSTER_PDL_PREFIXES, above). A split-K
    convolution cluster launched programmatically inside a CUDA graph gave wrong results (H200,
    driver 580.159.04, 2026-12-02: tests/codegen/test_conv_serial_split_gpu.py wrong on 17 of 18
    replays, right on every stream launch and on every replay once launched plain), so convolution
    clusters are always launched plain."""
    if not waits_first(source, name):
        return False
    if not has_cluster_shape(source, name):
        return True
    return env_pdl_clusters() and name.startswith(CLUSTER_PDL_PREFIXES)


def arch_has_pdl(arch: str | None) -> bool:
    """Whether cubins for `arch` ("sm_90", "sm_90a", "sm_100") can be launched programmatically."""
    if not arch or not arch.startswith("sm_"):
        return False
    digits = arch[3:].rstrip("a")
    return digits.isdigit() and int(digits) >= MIN_ARCH


def env_pdl() -> bool | None:
    """GRAPHC_PDL=0 turns programmatic launches off in this process, =1 on; unset: the default."""
    v = os.environ.get("GRAPHC_PDL", "").strip().lower()
    if v in ("0", "off", "false", "no"):
        return False
    if v in ("1", "on", "true", "yes"):
        return True
    return None


def programmatic_launches(
    digests: list[str],
    ready: set[str] | frozenset[str],
    ctas: list[int] | None = None,
    max_ctas: int | None = None,
) -> list[bool]:
    """Per launch of a sequence, whether it is launched programmatically: a PDL-ready kernel that
    follows a kernel of the same sequence. The first launch stays plain: what is before it on the
    stream (input copies, the previous call's output copies) is not a kernel of this plan. With
    `max_ctas`, only where this launch and the one before have at most that many CTAs (`ctas`, per
    launch): the overlap PDL buys is a launch's ramp-up under a short kernel's tail."""
    out = []
    for i, d in enumerate(digests):
        on = i > 0 and d in ready
        if on and max_ctas is not None and ctas is not None:
            on = ctas[i] <= max_ctas and ctas[i - 1] <= max_ctas
        out.append(on)
    return out


def env_max_ctas() -> int | None | str:
    """GRAPHC_PDL_MAX_CTAS: an int (0: no limit) overrides the default CTA limit; unset: "default"."""
    v = os.environ.get("GRAPHC_PDL_MAX_CTAS", "").strip()
    if not v:
        return "default"
    try:
        n = int(v)
    except ValueError:
        raise EngineError(f"GRAPHC_PDL_MAX_CTAS={v!r}: give a number of CTAs (0: no limit)") from None
    return None if n <= 0 else n


__all__ = [
    "ENTRY",
    "KernelEntry",
    "add_pdl_entries",
    "arch_has_pdl",
    "env_max_ctas",
    "env_pdl",
    "kernel_entries",
    "pdl_ready",
    "programmatic_launches",
]
