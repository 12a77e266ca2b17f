"""The kernel plan and memory plan: what an engine runs, in order, and where every tensor lives.

These are plain data (JSON in the engine's manifest), shared by the compiler, which writes them,
and the runtime, which reads them; so this module imports nothing but the standard library.

Where tensors live:
- graph inputs are copied into their arena slots at the start of a run (a CUDA graph needs fixed
  addresses);
- every intermediate and every graph output lives in the one arena, at a planned offset; outputs
  are live until the end of the run and `run()` returns copies of them, so results stay valid
  across runs;
- weights live in their own buffer, uploaded once; the workspace is one scratch buffer shared by
  the steps that need one.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

ALIGNMENT = 256

# Where a step argument lives.
INPUT = "input"  # a graph input (its arena slot)
ARENA = "arena"  # an intermediate or output in the arena
WEIGHT = "weight"  # a constant in the weights buffer
ALIAS = "alias"  # a view of another tensor (Reshape and friends): same bytes, other shape


def align(n: int, a: int = ALIGNMENT) -> int:
    return (n + a - 1) // a * a


@dataclass
class TensorSpec:
    """A tensor of the plan: its dtype (numpy name), shape, and byte size."""

    name: str
    dtype: str
    shape: list[int]
    nbytes: int
    kind: str = ARENA  # INPUT | ARENA | WEIGHT | ALIAS
    alias_of: str | None = None  # for ALIAS: the tensor whose bytes this one views
    # for ALIAS: where in alias_of's bytes the view starts (a slab such as x[i] of a contiguous x;
    # a multiple of ALIGNMENT, so kernels keep their aligned vector loads); 0 for reshapes
    alias_offset: int = 0


def alias_byte_offset(tensors: dict[str, TensorSpec], name: str) -> int:
    """Where `name`'s bytes start within the tensor its chain of views ends at (0 for a non-view)."""
    off = 0
    seen = set()
    t = tensors[name]
    while t.kind == ALIAS and t.alias_of is not None and t.name not in seen:
        seen.add(t.name)
        off += t.alias_offset
        t = tensors[t.alias_of]
    return off


@dataclass
class Launch:
    """One CUDA kernel launch of a step: which kernel (by source digest), geometry, arguments."""

    kernel: str  # the extern "C" function name
    digest: str  # SHA-256 of its CUDA source: the key of its cubin and source in the engine
    grid: list[int]
    block: list[int]
    args: list[str]  # tensor names; "@workspace" for the workspace pointer
    shared_bytes: int = 0
    family: str = ""
    params: dict[str, Any] = field(default_factory=dict)


@dataclass
class Step:
    """One kernel launch (or one view, for alias steps, which launch nothing)."""

    index: int
    name: str  # the node's name
    kind: str  # for reports: "Fused[Conv]", "Softmax", ...
    op: str
    domain: str
    attrs: dict[str, Any]  # JSON form of the node's attrs
    inputs: list[str | None]  # tensor names (None: omitted optional input)
    outputs: list[str]
    alias: bool = False  # a view: no kernel, no memory of its own
    origins: list[str] = field(default_factory=list)  # the original nodes it stands for
    inplace: list[int] = field(default_factory=list)  # inputs whose buffer the output may reuse
    workspace_bytes: int = 0  # the most any arch's launches need
    launches: list[Launch] = field(default_factory=list)  # CUDA target only; every arch not in arch_launches
    # arch ("sm_90") -> this step's launches on that arch, where they differ from `launches`
    arch_launches: dict[str, list[Launch]] = field(default_factory=dict)
    # a vendor tactic instead of launches (runtime/tactics_cublaslt.py VendorGemm.as_json): the same
    # library call on every arch; None for a step of graphc's own kernels
    vendor: dict[str, Any] | None = None

    def launches_for(self, arch: str) -> list[Launch]:
        return self.arch_launches.get(arch, self.launches)


@dataclass
class TensorPlacement:
    name: str
    offset: int
    nbytes: int
    first: int  # first step that writes it (-1: a graph input, written before step 0)
    last: int  # last step that reads it (len(steps): a graph output)


@dataclass
class MemoryPlan:
    arena_bytes: int
    workspace_bytes: int
    placements: dict[str, TensorPlacement]
    aliases: dict[str, str]  # alias tensor -> the tensor it views (resolved to a placed one)
    algorithm: str = ""
    lower_bound_bytes: int = 0
    naive_bytes: int = 0
    candidates: dict[str, int] = field(default_factory=dict)  # algorithm -> arena bytes

    def offset_of(self, name: str) -> int:
        return self.placements[self.aliases.get(name, name)].offset


@dataclass
class KernelPlan:
    tensors: dict[str, TensorSpec]
    steps: list[Step]
    inputs: list[str]  # graph input tensor names, in order
    outputs: list[str]  # graph output tensor names, in order
    output_names: list[str]  # their public names

    def to_json(self) -> dict[str, Any]:
        return {
            "tensors": {k: asdict(v) for k, v in self.tensors.items()},
            "steps": [asdict(s) for s in self.steps],
            "inputs": list(self.inputs),
            "outputs": list(self.outputs),
            "output_names": list(self.output_names),
        }

    def launch_archs(self) -> list[str]:
        """The archs that have launches of their own in some step."""
        return sorted({a for s in self.steps for a in s.arch_launches})

    def for_arch(self, arch: str) -> KernelPlan:
        """The plan as `arch` runs it: each step's launches for that arch, no per-arch table (the
        tensors, and so the memory plan, are the same for every arch)."""
        return KernelPlan(
            tensors=self.tensors,
            steps=[replace(s, launches=list(s.launches_for(arch)), arch_launches={}) for s in self.steps],
            inputs=list(self.inputs),
            outputs=list(self.outputs),
            output_names=list(self.output_names),
        )

    @staticmethod
    def from_json(d: dict[str, Any]) -> KernelPlan:
        return KernelPlan(
            tensors={k: TensorSpec(**v) for k, v in d["tensors"].items()},
            steps=[_step_from_json(s) for s in d["steps"]],
            inputs=list(d["inputs"]),
            outputs=list(d["outputs"]),
            output_names=list(d["output_names"]),
        )


def _step_from_json(d: dict[str, Any]) -> Step:
    d = dict(d)
    d["launches"] = [Launch(**x) for x in d.get("launches", [])]
    own = d.get("arch_launches", {})
    if not isinstance(own, dict):  # a TypeError, which the engine reader reports as a malformed plan
        raise TypeError(f"step {d.get('name')!r}: arch_launches is not a table of arch -> launches")
    d["arch_launches"] = {a: [Launch(**x) for x in ls] for a, ls in own.items()}
    return Step(**d)


def memory_plan_to_json(m: MemoryPlan) -> dict[str, Any]:
    d = asdict(m)
    return d


def memory_plan_from_json(d: dict[str, Any]) -> MemoryPlan:
    d = dict(d)
    d["placements"] = {k: TensorPlacement(**v) for k, v in d["placements"].items()}
    return MemoryPlan(**d)
