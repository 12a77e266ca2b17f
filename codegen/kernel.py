"""Kernel sources and kernel families.

A family (elementwise, reduction, gemm, conv, pool, data, attention) turns a plan step into one or
more `KernelSource`s: a complete CUDA translation unit rendered from the family's jinja2 template,
specialized to the step's static shapes, with the launch geometry and the argument list.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2
import jinja2.meta

from graphc.errors import CompileError
from graphc.ir.attrs import Attrs
from graphc.ir.graph import Node
from graphc.ir.types import TensorType
from graphc.runtime.pdl import add_pdl_entries
from graphc.runtime.plan import Step, TensorSpec

TEMPLATE_DIR = Path(__file__).parent / "templates"


@dataclass
class KernelSource:
    family: str
    name: str  # the extern "C" __global__ function's name
    source: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    args: list[str]  # tensor names in order, "@workspace" for the workspace pointer
    shared_bytes: int = 0  # dynamic shared memory
    params: dict[str, Any] = field(default_factory=dict)  # template parameters (for reports, tuning)
    workspace_bytes: int = 0

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.source.encode()).hexdigest()


@dataclass
class StepContext:
    """What a family sees of one step: the step (tensor names, index), the IR node it lowers (its
    typed attrs and the TensorTypes of its inputs and outputs), every tensor's spec, weight values
    (for baking small constants), the target arch and the compile options. Families read attrs
    from the node, never from the step's JSON (that is the engine file's record of them)."""

    step: Step
    node: Node
    tensors: Mapping[str, TensorSpec]
    weights: Mapping[str, Any]
    precision: str = "fp32"
    allow_tf32: bool = False
    params: dict[str, Any] | None = None  # forced template parameters (the tuner's choice)

    def __post_init__(self) -> None:
        # The node and the step must be the same op application (a side table gone stale would
        # otherwise compile one node's attrs into another's kernel).
        n, s = self.node, self.step
        if (n.name, n.op, n.domain, n.output_names) != (s.name, s.op, s.domain, tuple(s.outputs)):
            raise CompileError(f"step '{s.name}' ({s.op}) is paired with node '{n.name}' ({n.op}), not its own")

    @property
    def attrs(self) -> Attrs:
        """The node's typed attrs (FusedAttrs for a fused node)."""
        return self.node.attrs

    def input_type(self, i: int) -> TensorType | None:
        v = self.node.input(i)
        return None if v is None else v.ttype

    def output_type(self, i: int = 0) -> TensorType:
        return self.node.outputs[i].ttype

    def with_params(self, params: dict[str, Any] | None) -> StepContext:
        return dataclasses.replace(self, params=params)

    def spec(self, name: str | None) -> TensorSpec:
        assert name is not None
        return self.tensors[name]

    def input_spec(self, i: int) -> TensorSpec | None:
        names = self.step.inputs
        return None if i >= len(names) or names[i] is None else self.tensors[names[i]]

    def kernel_name(self, suffix: str = "") -> str:
        base = "".join(c if c.isalnum() else "_" for c in self.step.name)[:48]
        return f"gc_{self.step.index}_{base}{suffix}"

    def fail(self, message: str) -> CompileError:
        return CompileError(f"{self.step.kind} node '{self.step.name}': {message}")


Generator = Callable[[StepContext], list[KernelSource]]
Matcher = Callable[[StepContext], bool]


@dataclass(frozen=True)
class Family:
    name: str
    matches: Matcher
    generate: Generator
    search_space: Callable[[StepContext], list[dict[str, Any]]] | None = None


_FAMILIES: list[Family] = []


def register_family(
    name: str,
    matches: Matcher,
    generate: Generator,
    search_space: Callable[[StepContext], list[dict[str, Any]]] | None = None,
) -> Family:
    fam = Family(name, matches, generate, search_space)
    _FAMILIES.append(fam)
    return fam


def families() -> list[Family]:
    _ensure_loaded()
    return list(_FAMILIES)


def family_for(ctx: StepContext) -> Family:
    for fam in families():
        if fam.matches(ctx):
            return fam
    raise ctx.fail(
        f"has no CUDA kernel (op {ctx.step.domain + '.' if ctx.step.domain else ''}{ctx.step.op}); "
        "it cannot be compiled for the cuda target"
    )


_loaded = False


def _ensure_loaded() -> None:
    global _loaded
    if not _loaded:
        _loaded = True
        try:
            import graphc.codegen.families  # noqa: F401
        except BaseException:
            _loaded = False
            raise


@functools.cache
def _env() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATE_DIR)),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )


def render(template: str, **context: Any) -> str:
    """Render templates/<template> (a .cu.j2), with common.cuh inlined so that the source is a
    self-contained translation unit (NVRTC needs no include path). Every kernel's body starts with
    GC_PDL_ENTRY() (common.cuh; runtime/pdl.py): written here, once, rather than in each template,
    so that no template can forget it and a kernel may be launched programmatically on sm_90+."""
    common = (TEMPLATE_DIR / "common.cuh").read_text()
    body = add_pdl_entries(_env().get_template(template).render(**context))
    return "// ---- common.cuh ----\n" + common + "\n// ---- " + template + " ----\n" + body


def template_sources(templates: Sequence[str]) -> list[str]:
    """Every template file that rendering `templates` reads: themselves and, transitively, the
    files they `{% include %}` (the shared headers), sorted; common.cuh, which render() prepends,
    is not among them."""
    env = _env()
    seen: set[str] = set()
    todo = list(templates)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        text = (TEMPLATE_DIR / name).read_text()
        todo += [t for t in jinja2.meta.find_referenced_templates(env.parse(text)) if t is not None]
    return sorted(seen)


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def grid_1d(total: int, block: int, max_blocks: int = 65535 * 8) -> tuple[int, int, int]:
    return (max(1, min(ceil_div(total, block), max_blocks)), 1, 1)


def names(seq: Sequence[str | None]) -> list[str]:
    return [n for n in seq if n is not None]
