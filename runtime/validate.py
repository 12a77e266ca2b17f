"""Semantic validation of an engine's plan: what its (schema-checked) fields mean together.

The schema says every field has the right type; this says the plan is one its builder could have
written: every tensor's bytes match its dtype and shape, every step reads only what an earlier
step (or the caller, or the weights) produced, every output is produced, each tensor is written
once, no two tensors share bytes while both are live (except an in-place handover the plan
declares), every size fits the memory it lives in, and (CUDA) every launch names a kernel the
engine holds, with the argument count, constness and element types of its hashed source.
A mutated manifest that changes what the engine computes is refused here.
"""

from __future__ import annotations

import itertools
import math
import re
from pathlib import Path
from typing import Any

from graphc.runtime.container import Limits, sha256
from graphc.runtime.errors import EngineError
from graphc.runtime.plan import (
    ALIAS,
    ALIGNMENT,
    ARENA,
    INPUT,
    WEIGHT,
    KernelPlan,
    Launch,
    MemoryPlan,
    Step,
    TensorPlacement,
    TensorSpec,
)
from graphc.runtime.schema import ManifestDoc
from graphc.runtime.tensormap import is_tmap_arg, tmap_index, validate_launch

ITEMSIZE = {
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "float64": 8,
    "int8": 1,
    "int16": 2,
    "int32": 4,
    "int64": 8,
    "uint8": 1,
    "uint16": 2,
    "uint32": 4,
    "uint64": 8,
    "bool": 1,
    "float8_e4m3fn": 1,
    "float8_e4m3fnuz": 1,
    "float8_e5m2": 1,
    "float8_e5m2fnuz": 1,
    "float8_e8m0fnu": 1,
    "float4_e2m1fn": 1,
    "int4": 1,
    "uint4": 1,
    "int2": 1,
    "uint2": 1,
    "complex64": 8,
    "complex128": 16,
}
WORKSPACE = "@workspace"
MAX_THREADS_PER_BLOCK = 1024
MAX_SHARED_BYTES = 232448  # sm_90's opt-in maximum per block


def _launch(x) -> Launch:
    return Launch(x.kernel, x.digest, list(x.grid), list(x.block), list(x.args), x.shared_bytes, x.family, x.params)


def plan_from_doc(m: ManifestDoc) -> tuple[KernelPlan, MemoryPlan]:
    """The runtime's plan dataclasses from the typed manifest (no further checks here)."""
    p = m.plan
    tensors = {
        k: TensorSpec(t.name, t.dtype, list(t.shape), t.nbytes, t.kind, t.alias_of, t.alias_offset)
        for k, t in p.tensors.items()
    }
    steps = [
        Step(
            index=s.index,
            name=s.name,
            kind=s.kind,
            op=s.op,
            domain=s.domain,
            attrs=s.attrs,
            inputs=list(s.inputs),
            outputs=list(s.outputs),
            alias=s.alias,
            origins=list(s.origins),
            inplace=list(s.inplace),
            workspace_bytes=s.workspace_bytes,
            launches=[_launch(x) for x in s.launches],
            arch_launches={a: [_launch(x) for x in ls] for a, ls in s.arch_launches.items()},
            vendor=_vendor(s.vendor),
        )
        for s in p.steps
    ]
    plan = KernelPlan(tensors, steps, list(p.inputs), list(p.outputs), list(p.output_names))
    mm = m.memory
    memory = MemoryPlan(
        arena_bytes=mm.arena_bytes,
        workspace_bytes=mm.workspace_bytes,
        placements={k: TensorPlacement(v.name, v.offset, v.nbytes, v.first, v.last) for k, v in mm.placements.items()},
        aliases=dict(mm.aliases),
        algorithm=mm.algorithm,
        lower_bound_bytes=mm.lower_bound_bytes,
        naive_bytes=mm.naive_bytes,
        candidates=dict(mm.candidates),
    )
    return plan, memory


def _vendor(v: Any) -> dict[str, Any] | None:
    if v is None:
        return None
    import msgspec

    return msgspec.structs.asdict(v)


class _Checker:
    def __init__(self, path: Path):
        self.path = path

    def fail(self, msg: str) -> EngineError:
        return EngineError(f"{self.path}: {msg}")


def validate_plan(m: ManifestDoc, plan: KernelPlan, memory: MemoryPlan, limits: Limits, path: Path) -> None:
    c = _Checker(path)
    T = plan.tensors
    cap = limits.max_bytes
    # -- tensors: bytes agree with dtype and shape; exact integers, so nothing wraps
    for key, t in T.items():
        if t.name != key:
            raise c.fail(f"tensor '{key}' is named '{t.name}' inside")
        n = math.prod(t.shape) * ITEMSIZE[t.dtype]
        if n != t.nbytes:
            raise c.fail(f"tensor '{key}': {t.nbytes} bytes do not match {t.dtype}{t.shape} ({n} bytes)")
        if t.nbytes > cap:
            raise c.fail(f"tensor '{key}' has {t.nbytes} bytes, over the limit of {cap} (GRAPHC_ENGINE_MAX_BYTES)")
        if (t.kind == ALIAS) != (t.alias_of is not None):
            raise c.fail(f"tensor '{key}' of kind {t.kind} has alias_of={t.alias_of!r}")
    roots = _resolve_aliases(plan, memory, c)
    # -- the memory plan: every placed tensor placed once, inside the arena, aligned
    placed = {n for n, t in T.items() if t.kind in (INPUT, ARENA)}
    if set(memory.placements) != placed:
        extra = sorted(set(memory.placements) ^ placed)[:3]
        raise c.fail(f"the memory plan places other tensors than the plan's inputs and intermediates ({extra})")
    for arena_total, what in ((memory.arena_bytes, "arena"), (memory.workspace_bytes, "workspace")):
        if arena_total > cap:
            raise c.fail(f"the {what} of {arena_total} bytes is over the limit of {cap} (GRAPHC_ENGINE_MAX_BYTES)")
    weight_bytes = sum(t.nbytes for t in T.values() if t.kind == WEIGHT)
    if memory.arena_bytes + memory.workspace_bytes + weight_bytes > cap:
        raise c.fail(
            f"arena, workspace and weights need {memory.arena_bytes + memory.workspace_bytes + weight_bytes} bytes, "
            f"over the limit of {cap} (GRAPHC_ENGINE_MAX_BYTES)"
        )
    for name in placed:
        p, t = memory.placements[name], T[name]
        if p.name != name or p.nbytes != t.nbytes:
            raise c.fail(
                f"the placement of tensor '{name}' says '{p.name}' of {p.nbytes} bytes, the tensor has {t.nbytes}"
            )
        if p.offset % ALIGNMENT or p.offset + t.nbytes > memory.arena_bytes:
            raise c.fail(
                f"tensor '{name}' at offset {p.offset} (+{t.nbytes} bytes) is outside the arena of "
                f"{memory.arena_bytes} bytes or misaligned"
            )
    # -- inputs and outputs
    _check_io(m, plan, c)
    # -- steps: topological order, each tensor written once, outputs produced
    producer = _check_steps(plan, memory, roots, c)
    for name in plan.outputs:
        # A graph may return an input or a constant as it is; any other output is a step's result.
        if name not in producer and T[name].kind not in (INPUT, WEIGHT):
            raise c.fail(f"plan output '{name}' is not produced by any step (a {T[name].kind} tensor)")
    _check_no_dead_steps(plan, roots, c)
    _check_liveness(plan, memory, roots, c)


def _resolve_aliases(plan: KernelPlan, memory: MemoryPlan, c: _Checker) -> dict[str, str]:
    T = plan.tensors
    roots: dict[str, str] = {}
    view_ops = {o: s.op for s in plan.steps if s.alias and s.domain == "" for o in s.outputs}
    for name, t in T.items():
        if t.kind != ALIAS:
            continue
        seen = {name}
        cur = t
        while cur.kind == ALIAS:
            nxt = cur.alias_of
            if nxt not in T:
                raise c.fail(f"alias '{name}' views '{nxt}', which is not a tensor of the plan")
            if nxt in seen:
                raise c.fail(f"alias '{name}' is part of an alias cycle")
            seen.add(nxt)
            cur = T[nxt]
        root = cur.name
        if memory.aliases.get(name) != root:
            raise c.fail(f"alias '{name}' views '{root}', the memory plan says {memory.aliases.get(name)!r}")
        if t.alias_offset % ALIGNMENT:
            raise c.fail(f"tensor '{name}' has alias_offset {t.alias_offset}, not a multiple of {ALIGNMENT}")
        src = T[t.alias_of]
        # A reshape views all of its source; a slab (Gather of one index, codegen/views.py) a part
        # of it, at its offset
        whole = src.nbytes == t.nbytes and t.alias_offset == 0
        slab = view_ops.get(name) == "Gather" and t.alias_offset + t.nbytes <= src.nbytes
        if T[root].dtype != t.dtype or not (whole or slab):
            raise c.fail(
                f"alias '{name}' ({t.dtype}{t.shape} at byte {t.alias_offset}) is not a view inside "
                f"'{src.name}' ({src.dtype}{src.shape})"
            )
        roots[name] = root
    if set(memory.aliases) != set(roots):
        raise c.fail(
            f"the memory plan lists aliases that are not alias tensors ({sorted(set(memory.aliases) - set(roots))[:3]})"
        )
    return roots


def _check_io(m: ManifestDoc, plan: KernelPlan, c: _Checker) -> None:
    T = plan.tensors
    if len(set(plan.inputs)) != len(plan.inputs):
        raise c.fail("the plan lists an input twice")
    for name in (*plan.inputs, *plan.outputs):
        if name not in T:
            raise c.fail(f"I/O tensor '{name}' is not in the plan")
    inputs = {n for n, t in T.items() if t.kind == INPUT}
    if inputs != set(plan.inputs):
        raise c.fail(f"the plan's inputs {sorted(plan.inputs)[:5]} are not its input tensors {sorted(inputs)[:5]}")
    if len(plan.outputs) != len(plan.output_names) or len(set(plan.output_names)) != len(plan.output_names):
        raise c.fail("the plan's output names and outputs differ in length or repeat a name")
    want_in = [(n, T[n].dtype, T[n].shape) for n in plan.inputs]
    if [(s.name, s.dtype, list(s.shape)) for s in m.inputs] != want_in:
        raise c.fail("the manifest's input specs do not match the plan's input tensors")
    want_out = [(p, T[n].dtype, T[n].shape) for p, n in zip(plan.output_names, plan.outputs, strict=True)]
    if [(s.name, s.dtype, list(s.shape)) for s in m.outputs] != want_out:
        raise c.fail("the manifest's output specs do not match the plan's output tensors")


def _sub_plan_reads(steps: Any) -> set[str]:
    """Tensor names the branch sub-plans of If steps read (runtime/cpu.py host_if_kernel), nested
    ones included; the sub-plans themselves are checked when their executors are built."""
    return set().union(*(_attrs_reads(s.attrs) for s in steps if s.op in _SUB_PLAN_OPS)) if steps else set()


_SUB_PLAN_OPS = ("If", "Loop", "Scan")  # a host Loop/Scan's body is a sub-plan too (graphc/host_loop.py)


def _attrs_reads(attrs: Any) -> set[str]:
    out: set[str] = set()
    if not isinstance(attrs, dict) or ("host_if_version" not in attrs and "host_loop_version" not in attrs):
        return out
    for key in ("then_branch", "else_branch", "body"):
        sub = attrs.get(key)
        plan = sub.get("plan", {}) if isinstance(sub, dict) else {}
        plan = plan if isinstance(plan, dict) else {}
        outs = plan.get("outputs", [])
        out |= {n for n in outs if isinstance(n, str)} if isinstance(outs, list) else set()  # a constant returned
        steps = plan.get("steps", [])
        for st in steps if isinstance(steps, list) else []:
            if not isinstance(st, dict):
                continue
            if isinstance(st.get("inputs"), list):
                out |= {n for n in st["inputs"] if isinstance(n, str)}
            if st.get("op") in _SUB_PLAN_OPS:
                out |= _attrs_reads(st.get("attrs"))
    return out


def _check_steps(plan: KernelPlan, memory: MemoryPlan, roots: dict[str, str], c: _Checker) -> dict[str, int]:
    T = plan.tensors
    producer: dict[str, int] = {}
    for i, s in enumerate(plan.steps):
        where = f"step {i} ('{s.name}')"
        if s.index != i:
            raise c.fail(f"{where} has index {s.index}")
        if not s.outputs:
            raise c.fail(f"{where} has no outputs")
        for n in s.inputs:
            if n is None:
                continue
            if n not in T:
                raise c.fail(f"{where} reads unknown tensor '{n}'")
            if T[n].kind in (ARENA, ALIAS) and n not in producer:
                raise c.fail(f"{where} reads '{n}' before any step writes it (steps out of order?)")
        for n in s.outputs:
            if n not in T:
                raise c.fail(f"{where} writes unknown tensor '{n}'")
            if T[n].kind in (INPUT, WEIGHT):
                raise c.fail(f"{where} writes '{n}', which is a graph {T[n].kind}")
            if n in producer:
                raise c.fail(f"{where} writes '{n}', already written by step {producer[n]}")
            if n in s.inputs:
                raise c.fail(f"{where} reads and writes '{n}'")
            producer[n] = i
        for k in s.inplace:
            if k >= len(s.inputs) or s.inputs[k] is None:
                raise c.fail(f"{where} declares in-place input {k}, which it does not have")
        if s.workspace_bytes > memory.workspace_bytes:
            raise c.fail(f"{where} needs {s.workspace_bytes} bytes of workspace, the plan has {memory.workspace_bytes}")
        if s.alias:
            if len(s.outputs) != 1 or not s.inputs or s.inputs[0] is None or s.launches or s.workspace_bytes:
                raise c.fail(f"{where} is a view step but not of one input to one output")
            out = T[s.outputs[0]]
            if out.kind != ALIAS or out.alias_of != s.inputs[0]:
                raise c.fail(f"{where} is a view step whose output '{out.name}' is not a view of '{s.inputs[0]}'")
        else:
            for n in s.outputs:
                if T[n].kind != ARENA:
                    raise c.fail(f"{where} computes '{n}', which is a {T[n].kind} tensor, not an arena one")
    read = {n for s in plan.steps for n in s.inputs if n is not None}
    read |= _sub_plan_reads(plan.steps)  # the weights of a data-dependent If's branch sub-plans
    for name, t in T.items():
        # The builder drops what nothing uses: a weight no step reads, or an intermediate no
        # step writes, is left over from an edit (e.g. a step input retargeted to another weight).
        if t.kind == WEIGHT and name not in read and name not in plan.outputs:
            raise c.fail(f"weight '{name}' is read by no step")
        if t.kind == ARENA and name not in producer:
            raise c.fail(f"tensor '{name}' is written by no step")
        if t.kind == ALIAS and name not in producer:
            # A view nobody makes would be read as whatever its root holds: only the plan's view
            # steps make views.
            raise c.fail(f"alias '{name}' is made by no view step")
    return producer


def _check_no_dead_steps(plan: KernelPlan, roots: dict[str, str], c: _Checker) -> None:
    """The builder removes dead code, so a step whose results nothing reads was not its work:
    e.g. a retargeted output leaves the step that made the real one dead."""
    used = {n for s in plan.steps for n in s.inputs if n is not None} | set(plan.outputs)
    for s in plan.steps:
        if not any(n in used for n in s.outputs):
            raise c.fail(f"step {s.index} ('{s.name}') computes {s.outputs[:3]}, which nothing reads")


def _check_liveness(plan: KernelPlan, memory: MemoryPlan, roots: dict[str, str], c: _Checker) -> None:
    """No two placed tensors share bytes while both are live, computed from the steps as they are
    (not from the placements' own first/last, which are the builder's notes)."""
    T = plan.tensors
    n_steps = len(plan.steps)
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    for name in plan.inputs:
        first[name] = last[name] = -1
    handover: set[tuple[str, str, int]] = set()
    for s in plan.steps:
        for n in s.inputs:
            if n is not None:
                r = roots.get(n, n)
                if T[r].kind != WEIGHT:
                    last[r] = max(last.get(r, s.index), s.index)
        for n in s.outputs:
            if T[n].kind == ARENA:
                first[n] = s.index
                last.setdefault(n, s.index)
        if len(s.outputs) == 1:
            for k in s.inplace:
                inp = s.inputs[k]
                if inp is not None:
                    handover.add((roots.get(inp, inp), s.outputs[0], s.index))
    for name in plan.outputs:
        r = roots.get(name, name)
        if T[r].kind != WEIGHT:
            last[r] = n_steps
    for p in memory.placements.values():
        # The builder notes each tensor's live range; a range that no longer matches the steps
        # means the steps (or the outputs) were edited after it planned the memory.
        want = (first.get(p.name, -1), last.get(p.name, first.get(p.name, -1)))
        if (p.first, p.last) != want:
            raise c.fail(
                f"tensor '{p.name}' is planned live over steps {p.first}..{p.last}, the steps make it "
                f"{want[0]}..{want[1]} (steps or outputs edited after planning)"
            )
    placed = sorted(memory.placements.values(), key=lambda p: p.offset)
    for i, a in enumerate(placed):
        a_end = a.offset + a.nbytes
        fa, la = first.get(a.name, -1), last.get(a.name, first.get(a.name, -1))
        for b in placed[i + 1 :]:
            if b.offset >= a_end:
                break
            if b.nbytes == 0 or a.nbytes == 0:
                continue
            fb, lb = first.get(b.name, -1), last.get(b.name, first.get(b.name, -1))
            if fa <= lb and fb <= la:
                if _is_handover(a, b, la, fb, handover) or _is_handover(b, a, lb, fa, handover):
                    continue
                raise c.fail(
                    f"tensors '{a.name}' and '{b.name}' share arena bytes while both are live "
                    f"(steps {fa}..{la} and {fb}..{lb})"
                )


def _is_handover(x: TensorPlacement, y: TensorPlacement, x_last: int, y_first: int, handover: set) -> bool:
    """y takes over x's buffer in place at the one step where x is last read and y first written."""
    return x_last == y_first and x.offset == y.offset and x.nbytes == y.nbytes and (x.name, y.name, y_first) in handover


# ---- kernels of a CUDA engine ------------------------------------------------------------------

_SIGNATURE = r'extern\s+"C"\s+__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s+)?{name}\s*\(([^)]*)\)'
_PARAM = re.compile(
    r"^(const\s+)?([A-Za-z_][A-Za-z0-9_ ]*?)\s*\*\s*(?:const\s+)?(?:__restrict__\s+)?[A-Za-z_][A-Za-z0-9_]*$"
)
_TYPEDEF = re.compile(r"typedef\s+([A-Za-z_][A-Za-z0-9_ ]*?)\s+([A-Za-z_][A-Za-z0-9_]*)\s*;")
# C element types and the dtypes whose bytes they may point at. Unsigned integers are the
# templates' bit containers (fp16 and bf16 travel as unsigned short, data-movement kernels copy
# float32 as unsigned int, and rows of an even number of 4-byte elements as unsigned long long),
# so they accept any dtype whose size divides theirs; the others are exact.
_BY_SIZE = {n: {d for d, k in ITEMSIZE.items() if k and n % k == 0} for n in (1, 2, 4, 8)}
_C_TYPES = {
    "float": {"float32"},
    "double": {"float64"},
    "int": {"int32"},
    "long long": {"int64"},
    "short": {"int16"},
    "signed char": {"int8"},
    "__half": {"float16"},
    "half": {"float16"},
    "__nv_bfloat16": {"bfloat16"},
    "bool": {"bool"},
    "int8_t": {"int8"},
    "int32_t": {"int32"},
    "int64_t": {"int64"},
    "unsigned char": _BY_SIZE[1],
    "uint8_t": _BY_SIZE[1],
    "unsigned short": _BY_SIZE[2],
    "unsigned": _BY_SIZE[4],
    "unsigned int": _BY_SIZE[4],
    "uint32_t": _BY_SIZE[4],
    "unsigned long long": _BY_SIZE[8],
}


def kernel_params(source: str, name: str) -> list[tuple[bool, str]] | None:
    """(is const, C element type) of each parameter of kernel `name`, or None if it has no
    extern "C" signature in the source."""
    m = re.search(_SIGNATURE.format(name=re.escape(name)), source)
    if not m:
        return None
    text = m.group(1).strip()
    if not text:
        return []
    out = []
    for p in text.split(","):
        pm = _PARAM.match(p.strip())
        out.append((bool(pm.group(1)), " ".join(pm.group(2).split())) if pm else (False, "?"))
    return out


def _element_dtypes(ctype: str, typedefs: dict[str, str]) -> set[str] | None:
    seen = 0
    while ctype in typedefs and seen < 8:
        ctype, seen = typedefs[ctype], seen + 1
    return _C_TYPES.get(ctype)


_COMMON_TYPEDEFS = {
    "gc_half": "unsigned short",
    "gc_bf16": "unsigned short",
    "gc_i64": "long long",
    "gc_u64": "unsigned long long",
}


def validate_kernels(
    m: ManifestDoc,
    plan: KernelPlan,
    sources: dict[str, str],
    cubin_members: list[tuple[str, str]],
    path: Path,
    engine_tensors: dict[str, Any] | None = None,
) -> None:
    """`engine_tensors`: for an If's branch sub-plan, the engine plan's tensors (its weights)."""
    c = _Checker(path)
    T = plan.tensors
    if m.target == "cpu":
        if m.kernels or sources or cubin_members or m.archs or any(s.launches or s.vendor for s in plan.steps):
            raise c.fail("a cpu engine holds CUDA kernels or launches")
        return
    if set(m.kernels) != set(sources):
        raise c.fail(
            f"the kernel table and the kernel sources differ ({sorted(set(m.kernels) ^ set(sources))[0][:12]})"
        )
    params: dict[str, list[tuple[bool, str]]] = {}
    typedefs: dict[str, dict[str, str]] = {}
    for d, src in sources.items():
        if sha256(src.encode()) != d:
            raise c.fail(f"kernel source {d[:12]} is not the source its name (its SHA-256) says")
        k = m.kernels[d]
        ps = kernel_params(src, k.name)
        if ps is None:
            raise c.fail(f'kernel {k.name} has no extern "C" signature in its source')
        if len(ps) != k.args:
            raise c.fail(f"kernel {k.name} takes {len(ps)} arguments, the kernel table says {k.args}")
        params[d] = ps
        typedefs[d] = {**_COMMON_TYPEDEFS, **{b: a for a, b in _TYPEDEF.findall(src)}}
    archs = set(m.archs)
    for arch, d in cubin_members:
        if arch not in archs or d not in m.kernels:
            raise c.fail(
                f"cubin kernels/{arch}/{d[:12]}... is not a kernel of this engine for its archs {sorted(archs)}"
            )
    for s in plan.steps:
        where = f"step {s.index} ('{s.name}')"
        if s.alias:
            continue
        if (
            s.op in _SUB_PLAN_OPS
            and isinstance(s.attrs, dict)
            and ("host_if_version" in s.attrs or "host_loop_version" in s.attrs)
        ):  # a data-dependent If or a host loop: no launches of its own, branch / body sub-plans
            _validate_branches(c, m, s, plan, sources, cubin_members, path, engine_tensors or plan.tensors)
            continue
        if s.vendor is not None:  # a vendor library call (runtime/tactics_cublaslt.py): no kernels
            _check_vendor(c, s, T, where)
            continue
        if not s.launches:
            raise c.fail(f"{where} of a cuda engine has no kernel")
        for arch, launches in [("", s.launches), *s.arch_launches.items()]:
            if arch and arch not in archs:
                raise c.fail(f"{where} has launches for {arch}, which the engine is not built for ({sorted(archs)})")
            _check_launches(c, m, s, launches, params, typedefs, T, f"{where}{' on ' + arch if arch else ''}")


def _check_vendor(c: _Checker, s: Step, T: dict[str, TensorSpec], where: str) -> None:
    from graphc.runtime.tactics_cublaslt import VendorGemm, check_spec

    if s.launches or s.arch_launches or s.workspace_bytes:
        raise c.fail(f"{where} calls {s.vendor.get('library')} and also has launches or a workspace")
    try:
        check_spec(VendorGemm.from_json(s.vendor), T, list(s.inputs), list(s.outputs))
    except (ValueError, TypeError, KeyError) as e:
        raise c.fail(f"{where}: its {s.vendor.get('library')} GEMM: {e}") from None
    extra = [i for i in s.inplace if s.inputs[i] != s.vendor.get("c")]
    if extra:  # cuBLASLt may write D over C (same layout), never over A, B or the bias
        raise c.fail(f"{where}: its {s.vendor.get('library')} GEMM may not write over input {extra[0]}")


def _validate_branches(c, m, s, plan: KernelPlan, sources, cubin_members, path: Path, engine_tensors) -> None:
    """The branch sub-plans of a CUDA If step (runtime/host_if_cuda.py): each a valid plan whose
    I/O are the captures and the step's outputs, whose weights are the engine's, and whose
    launches name kernels the engine holds (nested Ifs the same way)."""
    from graphc.runtime.plan import memory_plan_from_json

    where = f"step {s.index} ('{s.name}')"
    loop = "host_loop_version" in s.attrs  # a host loop (runtime/host_loop_cpu.py loop_layout checks its counts)
    if not loop and s.attrs.get("host_if_version") != 1:
        raise c.fail(f"{where}: sub-plan layout {s.attrs.get('host_if_version')!r}, expected 1")
    if loop:
        from graphc.runtime.host_loop_cpu import loop_layout

        try:
            loop_layout(s)
        except EngineError as e:
            raise c.fail(str(e)) from None
    for key in ("body",) if loop else ("then_branch", "else_branch"):
        d = s.attrs.get(key)
        if isinstance(d, dict) and set(d) == {"refused", "num_captures"} and isinstance(d["refused"], str):
            continue  # a branch that does not type-check on the engine's shapes: a run taking it is refused
        try:
            sub = KernelPlan.from_json(d["plan"])
            memory = memory_plan_from_json(d["memory"])
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise c.fail(f"{where}: its {key} sub-plan is malformed ({type(e).__name__}: {e})") from None
        T = sub.tensors
        if not loop and (
            len(sub.outputs) != len(s.outputs)
            or any(
                (T[a].dtype, list(T[a].shape)) != (plan.tensors[b].dtype, list(plan.tensors[b].shape))
                for a, b in zip(sub.outputs, s.outputs, strict=False)
                if a in T
            )
        ):
            raise c.fail(f"{where}: its {key} sub-plan's outputs are not the step's")
        for n, t in T.items():
            if t.kind == WEIGHT:
                w = engine_tensors.get(n)
                if w is None or w.kind != WEIGHT or (w.dtype, list(w.shape)) != (t.dtype, list(t.shape)):
                    raise c.fail(f"{where}: its {key} sub-plan reads weight '{n}', which the engine does not hold")
        view = _BucketView(
            m,
            [_IO(n, T[n].dtype, list(T[n].shape)) for n in sub.inputs if n in T],
            [
                _IO(p, T[n].dtype, list(T[n].shape))
                for p, n in zip(sub.output_names, sub.outputs, strict=False)
                if n in T
            ],
        )
        try:
            validate_plan(view, sub, memory, Limits.default(), path)  # type: ignore[arg-type]
            validate_kernels(view, sub, sources, cubin_members, path, engine_tensors)  # type: ignore[arg-type]
        except EngineError as e:
            raise EngineError(f"{e} (in the {key} of {where})") from None


def _check_launches(c, m, s, launches, params, typedefs, T, where: str) -> None:
    """One arch's launches of a step: each kernel held, argument count and kinds, device limits, and
    every output of the step written."""
    written: set[str] = set()
    for ln in launches:
        k = m.kernels.get(ln.digest)
        if k is None:
            raise c.fail(f"{where} launches kernel {ln.digest[:12]} that the engine does not hold")
        if ln.kernel != k.name:
            raise c.fail(f"{where} launches '{ln.kernel}', the kernel {ln.digest[:12]} is '{k.name}'")
        ps = params[ln.digest]
        if len(ln.args) != len(ps):
            raise c.fail(f"{where}: kernel {ln.kernel} takes {len(ps)} arguments, the launch passes {len(ln.args)}")
        geometry = ln.block[0] * ln.block[1] * ln.block[2]
        if geometry > MAX_THREADS_PER_BLOCK or ln.shared_bytes > MAX_SHARED_BYTES:
            raise c.fail(
                f"{where}: launch {ln.grid} x {ln.block} with {ln.shared_bytes} B shared exceeds device limits"
            )
        specs = validate_launch(ln.params, ln.args, T, where)  # "@tmap:I": typed tensor-map specs
        for a, (const, ctype) in zip(ln.args, ps, strict=True):
            if is_tmap_arg(a):
                # a tensor map reads the tensor it names, which must be an input of the step
                if not const or ctype != "gc_tmap":
                    raise c.fail(f"{where}: kernel {ln.kernel} takes {ctype} where the launch passes {a}")
                t = specs[tmap_index(a, where)].tensor
                if t not in s.inputs:
                    raise c.fail(f"{where}: tensor map {a} reads '{t}', which is not an input of the step")
                continue
            if a == WORKSPACE:
                if s.workspace_bytes <= 0:
                    raise c.fail(f"{where} passes the workspace but declares none")
                continue
            if a not in T:
                raise c.fail(f"{where}: kernel argument '{a}' is not a tensor of the plan")
            if const and a not in s.inputs and a not in s.outputs:
                raise c.fail(f"{where}: kernel {ln.kernel} reads '{a}', which is not an input of the step")
            if not const:
                if a not in s.outputs:
                    raise c.fail(f"{where}: kernel {ln.kernel} writes '{a}', which is not an output of the step")
                written.add(a)
            ok = _element_dtypes(ctype, typedefs[ln.digest])
            if ok is not None and T[a].dtype not in ok:
                raise c.fail(f"{where}: kernel {ln.kernel} takes {ctype}* for '{a}', which is {T[a].dtype}")
    missing = [n for n in s.outputs if n not in written]
    if missing:
        raise c.fail(f"{where}: no kernel of the step writes its output '{missing[0]}'")


__all__ = ["ITEMSIZE", "kernel_params", "plan_from_doc", "validate_kernels", "validate_plan"]


# ---- optimization profiles (format version 3) ---------------------------------------------------


class _IO:
    """An I/O spec as _check_io reads it (name, dtype, shape)."""

    def __init__(self, name: str, dtype: str, shape: list[int]):
        self.name, self.dtype, self.shape = name, dtype, shape


class _BucketView:
    """A bucket's plan as validate_plan sees a manifest: its I/O specs derived from the profile."""

    def __init__(self, m: ManifestDoc, inputs: list[_IO], outputs: list[_IO]):
        self.inputs, self.outputs = inputs, outputs
        self.target, self.kernels, self.archs = m.target, m.kernels, m.archs


def validate_profiles(
    m: ManifestDoc, plan: KernelPlan, limits: Limits, path: Path
) -> list[list[tuple[KernelPlan, MemoryPlan] | None]]:
    """The profiles' meaning: ranges around the engine's own shapes, every dynamic dim described
    once, buckets inside the ranges that cover every size a request may have, and each bucket's
    plan a valid plan whose inputs are the bucket's shapes and whose outputs are the engine's
    (sliced axes of mult * size). Returns each bucket's plan (None: the engine's own)."""
    c = _Checker(path)
    T = plan.tensors
    assert m.profiles is not None
    ranks = {n: len(T[n].shape) for n in plan.inputs}
    out_specs = {p: T[n] for p, n in zip(plan.output_names, plan.outputs, strict=True)}
    result: list[list[tuple[KernelPlan, MemoryPlan] | None]] = []
    mains = 0
    for pi, prof in enumerate(m.profiles):
        where = f"profile {pi}"
        for label, shapes in (("min", prof.min), ("opt", prof.opt), ("max", prof.max)):
            if set(shapes) != set(plan.inputs):
                raise c.fail(f"{where}: its {label} shapes name other inputs than the engine's")
            for n, s in shapes.items():
                if len(s) != ranks[n]:
                    raise c.fail(f"{where}: {label} shape of input '{n}' has rank {len(s)}, the input {ranks[n]}")
        for n in plan.inputs:
            for axis, (a, b, d) in enumerate(zip(prof.min[n], prof.opt[n], prof.max[n], strict=True)):
                if not 1 <= a <= b <= d:
                    raise c.fail(f"{where}: input '{n}' dim {axis} has min/opt/max {a}/{b}/{d}")
        if pi == 0 and any(list(prof.opt[n]) != list(T[n].shape) for n in plan.inputs):
            raise c.fail(f"{where}: its opt shapes are not the engine plan's input shapes")
        seen: set[tuple[str, int]] = set()
        names = set()
        for g in prof.dims:
            if g.name in names:
                raise c.fail(f"{where}: dim '{g.name}' is described twice")
            names.add(g.name)
            if not 1 <= g.min <= g.opt <= g.max or g.min == g.max:
                raise c.fail(f"{where}: dim '{g.name}' has min/opt/max {g.min}/{g.opt}/{g.max}")
            for n, axis in g.positions:
                if n not in ranks or axis >= ranks[n] or (n, axis) in seen:
                    raise c.fail(f"{where}: dim '{g.name}' names input '{n}' dim {axis} (no such dim, or twice)")
                seen.add((n, axis))
                if (prof.min[n][axis], prof.opt[n][axis], prof.max[n][axis]) != (g.min, g.opt, g.max):
                    raise c.fail(f"{where}: dim '{g.name}' disagrees with the range of input '{n}' dim {axis}")
            if g.outputs and not g.padded:
                raise c.fail(f"{where}: dim '{g.name}' is not padded but slices outputs")
            for o, (axis, _mult) in g.outputs.items():
                if o not in out_specs or axis >= len(out_specs[o].shape):
                    raise c.fail(f"{where}: dim '{g.name}' slices output '{o}' dim {axis}, which it does not have")
        for n in plan.inputs:
            for axis in range(ranks[n]):
                if prof.min[n][axis] != prof.max[n][axis] and (n, axis) not in seen:
                    raise c.fail(f"{where}: input '{n}' dim {axis} has a range but no dim describes it")
        groups = {g.name: g for g in prof.dims}
        plans: list[tuple[KernelPlan, MemoryPlan] | None] = []
        keys = set()
        for bi, b in enumerate(prof.buckets):
            bw = f"{where} bucket {bi}"
            if set(b.sizes) != set(groups):
                raise c.fail(f"{bw}: its sizes name other dims than the profile's")
            for k, v in b.sizes.items():
                if not groups[k].min <= v <= groups[k].max:
                    raise c.fail(f"{bw}: dim '{k}' at {v} is outside {groups[k].min}..{groups[k].max}")
            key = tuple(sorted(b.sizes.items()))
            if key in keys:
                raise c.fail(f"{bw}: a second bucket of the same sizes")
            keys.add(key)
            if b.plan is None:
                mains += 1
                if pi != 0 or any(v != groups[k].opt for k, v in b.sizes.items()) or b.memory or b.member:
                    raise c.fail(f"{bw}: only profile 0's opt bucket is the engine's own plan")
                if b.weights:
                    raise c.fail(f"{bw}: the engine's own plan holds no weights of its own")
                plans.append(None)
                continue
            if b.memory is None:
                raise c.fail(f"{bw}: a plan without a memory plan")
            bplan, bmem = plan_from_doc(b)  # type: ignore[arg-type]
            shapes = {n: list(prof.opt[n]) for n in plan.inputs}
            for g in prof.dims:
                for n, axis in g.positions:
                    shapes[n][axis] = b.sizes[g.name]
            ins = [_IO(n, T[n].dtype, shapes[n]) for n in plan.inputs]
            if list(bplan.output_names) != list(plan.output_names):
                raise c.fail(f"{bw}: its outputs are not the engine's")
            outs = []
            for p, n in zip(bplan.output_names, bplan.outputs, strict=True):
                t = bplan.tensors.get(n)
                if t is None or t.dtype != out_specs[p].dtype or len(t.shape) != len(out_specs[p].shape):
                    raise c.fail(f"{bw}: output '{p}' is not of the engine's dtype and rank")
                for g in prof.dims:
                    if p in g.outputs and t.shape[g.outputs[p][0]] != g.outputs[p][1] * b.sizes[g.name]:
                        raise c.fail(f"{bw}: output '{p}' does not hold dim '{g.name}' where the profile slices it")
                outs.append(_IO(p, t.dtype, list(t.shape)))
            view = _BucketView(m, ins, outs)
            validate_plan(view, bplan, bmem, limits, path)  # type: ignore[arg-type]
            own = set(b.weights)
            if (b.member is None) != (not own):
                raise c.fail(f"{bw}: weights of its own and a weights member go together")
            for n, t in bplan.tensors.items():
                if n in own:
                    if t.kind != WEIGHT:
                        raise c.fail(f"{bw}: '{n}' is listed as a weight but is a {t.kind} tensor")
                elif t.kind == WEIGHT:
                    mt = T.get(n)
                    if mt is None or mt.kind != WEIGHT or mt.dtype != t.dtype or list(mt.shape) != list(t.shape):
                        raise c.fail(f"{bw}: weight '{n}' is neither its own nor the engine plan's of that type")
            if own - set(bplan.tensors):
                raise c.fail(f"{bw}: lists weight '{sorted(own - set(bplan.tensors))[0]}' that its plan lacks")
            plans.append((bplan, bmem))
        _check_coverage(prof, groups, keys, c, where)
        result.append(plans)
    if mains != 1:
        raise c.fail(f"{mains} buckets say they are the engine's own plan; one is")
    return result


def _check_coverage(prof, groups, keys: set, c: _Checker, where: str) -> None:
    """Every size a request may have runs: each combination of exact dims' sizes has a bucket
    with the padded dims at their max."""
    exact = [g for g in prof.dims if not g.padded]
    combos = math.prod(g.max - g.min + 1 for g in exact)
    if combos > len(prof.buckets):
        raise c.fail(f"{where}: {combos} sizes of its exact dims, but {len(prof.buckets)} buckets")
    for combo in itertools.product(*[range(g.min, g.max + 1) for g in exact]):
        sizes = {g.name: v for g, v in zip(exact, combo, strict=True)}
        sizes.update({g.name: g.max for g in prof.dims if g.padded})
        if tuple(sorted(sizes.items())) not in keys:
            raise c.fail(f"{where}: no bucket runs dims {sizes}")
