"""Building a CUDA engine: a kernel per step from its family's template, NVRTC to cubin for each
target arch (in parallel, cached), and a CUDA executor where a GPU is present."""

from __future__ import annotations

import dataclasses
import hashlib
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from graphc.codegen.kernel import KernelSource, StepContext, family_for
from graphc.codegen.lower import LoweredPlan
from graphc.codegen.nvrtc import DEFAULT_ARCHS, CompileJob, check_arch, compile_all, nvrtc_version
from graphc.errors import CompileError
from graphc.runtime.host_if_cuda import is_host_if
from graphc.runtime.plan import KernelPlan, Launch

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StepKernels:
    """What code generation made of one step: its launches, in order, and the scratch bytes the
    largest of them needs (the memory planner sizes the shared workspace from these)."""

    launches: tuple[Launch, ...] = ()
    workspace_bytes: int = 0
    vendor: dict[str, Any] | None = None  # a vendor tactic's record instead of launches (gemm_tactics.py)


@dataclass
class KernelSet:
    """Every kernel of an engine: CUDA source by digest, cubin by arch and digest, and each step's
    launches (by step name)."""

    sources: dict[str, str] = field(default_factory=dict)
    names: dict[str, str] = field(default_factory=dict)  # digest -> function name
    families: dict[str, str] = field(default_factory=dict)
    cubins: dict[str, dict[str, bytes]] = field(default_factory=dict)  # arch -> digest -> cubin
    requires: dict[str, str] = field(default_factory=dict)  # digest -> the one arch it compiles for (sm_90a)
    steps: dict[str, StepKernels] = field(default_factory=dict)  # step name -> its launches, workspace
    # arch -> step name -> that arch's own launches, for the steps where they differ from `steps`
    # (the default every other arch runs): an engine for several archs carries sm_90a kernels for sm_90
    arch_steps: dict[str, dict[str, StepKernels]] = field(default_factory=dict)

    def step_kernels(self, arch: str) -> dict[str, StepKernels]:
        """Every step's launches on `arch`: its own where it has them, else the default."""
        return {**self.steps, **self.arch_steps.get(arch, {})}

    def digests_for(self, arch: str) -> set[str]:
        """The kernels that `arch` launches (the only ones it needs a cubin of)."""
        return {ln.digest for sk in self.step_kernels(arch).values() for ln in sk.launches}


_NAME_PLACEHOLDER = "__graphc_kernel__"


def content_named(src: KernelSource, base: str) -> KernelSource:
    """The same kernel named after its code instead of its step: the twelve identical layers of a
    transformer then share one source, one NVRTC compile per arch and one cubin in the engine. Every
    name a family derives for a step (its kernels', its device functions') starts with the step's
    `base` name (StepContext.kernel_name()), so that prefix is what is taken out before hashing.
    The step stays in the plan (each Launch is listed under its step)."""
    if not src.name.startswith(base):  # a family that names its kernel otherwise: only that name
        base = src.name
    body = src.source.replace(base, _NAME_PLACEHOLDER)
    new_base = f"gc_{src.family}_{hashlib.sha256(body.encode()).hexdigest()[:16]}"
    name = new_base + src.name[len(base) :]
    return dataclasses.replace(src, name=name, source=body.replace(_NAME_PLACEHOLDER, new_base))


def generate_kernels(
    plan: LoweredPlan,
    weights: dict[str, np.ndarray],
    *,
    precision: str = "fp32",
    allow_tf32: bool = False,
    choices: dict[str, dict[str, Any]] | None = None,
    hopper: bool = False,
    tactics: tuple[str, ...] = (),
    tactic_options: dict[str, Any] | None = None,
) -> KernelSet:
    """The kernels of every step from its family, and each step's launches and workspace
    (`KernelSet.steps`); the plan is not changed (complete_plan builds the one an engine runs).
    Errors name the node and op, all at once."""
    kernels = KernelSet()
    errors: list[str] = []
    for step in plan.steps:
        if step.alias or is_host_if(step):  # a data-dependent If: its branches get kernels of their own
            continue
        ctx = plan.context(
            step, weights, precision=precision, allow_tf32=allow_tf32, params=(choices or {}).get(step.name)
        )
        try:
            fam = family_for(ctx)
            if tactics and fam.name == "gemm" and ctx.params is None:
                from graphc.codegen.families.gemm_tactics import select as select_vendor

                # a vendor tactic where one is named and its rule (gemm_tactics.prefer_vendor) takes the step
                vendor = select_vendor(ctx, tactics, **(tactic_options or {}))
                if vendor is not None:
                    kernels.steps[step.name] = StepKernels(vendor=vendor.as_json())
                    continue
            sources: list[KernelSource] = []
            from graphc.codegen.families.gemm import has_rownorm

            # a row-norm epilogue (passes/fuse_residual_norm.py) is not on the TMA GEMM: on sm_90 the
            # wgmma kernel with cluster split-K takes it (gemm_sm90.select_rownorm), else mma.sync
            rownorm = fam.name == "gemm" and has_rownorm(ctx)
            hopper_gemm = hopper and fam.name == "gemm" and ctx.params is None and not rownorm
            if hopper and rownorm and ctx.params is None:
                from graphc.codegen.families.gemm_sm90 import select_rownorm

                sources = select_rownorm(ctx)
            if hopper_gemm:
                from graphc.codegen.families.gemm_sm90 import select

                sources = select(ctx)  # the TMA GEMM where the measured rules say it wins, else []
            if hopper and fam.name == "conv" and ctx.params is None:
                from graphc.codegen.families.conv_sm90 import select as select_conv

                sources = select_conv(ctx)  # a 1x1 conv as the TMA GEMM where the rules say so, else []
            if hopper and fam.name == "attention" and ctx.params is None:
                from graphc.codegen.families.attention import select_sm90

                sources = select_sm90(ctx)  # the wgmma flash attention (head dims 64, 128), else []
            if not sources and hopper_gemm and _large_gemm(ctx):
                # An engine for Hopper alone: the sm_90a wgmma GEMM for large problems (on an H200,
                # 0.67x cuBLAS at 4096^3 against 0.36x for mma.sync, 0.86x against 0.52x at
                # 2048x3072x768). Small ones stay on mma.sync: at M = 128 (BERT-base, batch 1) the
                # 128-row wgmma tiles made the model 7% slower. Where wgmma does not fit, mma.sync.
                try:
                    sources = fam.generate(ctx.with_params({"path": "wgmma"}))
                except CompileError as e:
                    log.info("%s: no wgmma GEMM (%s); mma.sync instead", step.name, e)
            if not sources and hopper and fam.name == "gemm_int8" and ctx.params is None:
                # The sm_90a int8 GEMM (wgmma s8) wherever both operands allow it (K-contiguous
                # 16-byte rows); mma.sync otherwise.
                try:
                    sources = fam.generate(ctx.with_params({"path": "wgmma"}))
                except CompileError as e:
                    log.info("%s: no int8 wgmma GEMM (%s); mma.sync instead", step.name, e)
            if not sources:
                sources = fam.generate(ctx)
        except CompileError as e:
            errors.append(str(e))
            continue
        base = ctx.kernel_name()
        launches = []
        for src in (content_named(s, base) for s in sources):
            d = src.digest
            kernels.sources[d] = src.source
            kernels.names[d] = src.name
            kernels.families[d] = src.family
            if src.params.get("requires_arch"):
                kernels.requires[d] = src.params["requires_arch"]
            launches.append(
                Launch(
                    src.name,
                    d,
                    list(src.grid),
                    list(src.block),
                    list(src.args),
                    src.shared_bytes,
                    src.family,
                    dict(src.params),
                )
            )
        workspace = max((s.workspace_bytes for s in sources), default=0)
        kernels.steps[step.name] = StepKernels(tuple(launches), workspace)
    if errors:
        shown = "\n  ".join(errors[:20]) + (f"\n  ... and {len(errors) - 20} more" if len(errors) > 20 else "")
        raise CompileError(f"{len(errors)} step(s) cannot be compiled for CUDA:\n  {shown}")
    return kernels


def complete_plan(plan: KernelPlan, kernels: KernelSet) -> KernelPlan:
    """The plan an engine runs: `plan`'s steps with their launches and workspace sizes, as a new
    KernelPlan built once (the lowered plan, and its IR nodes, stay behind with the compiler).
    A step with launches of its own for some arch (`kernels.arch_steps`) lists them in
    `Step.arch_launches`; its workspace is the largest any arch needs (one memory plan serves every
    arch: see docs/architecture.md, "One engine, a plan per arch")."""
    steps = []
    for step in plan.steps:
        made = kernels.steps.get(step.name, StepKernels())
        if not step.alias and not is_host_if(step) and step.name not in kernels.steps:
            raise CompileError(f"step '{step.name}' has no kernels")
        own = {a: byname[step.name] for a, byname in sorted(kernels.arch_steps.items()) if step.name in byname}
        if (
            not step.alias
            and not is_host_if(step)
            and made.vendor is None
            and not made.launches
            and not any(k.launches for k in own.values())
        ):  # the loader refuses such a step: say so here, naming it, rather than write that engine
            raise CompileError(f"step '{step.name}' (op {step.op}) has no kernel to launch")
        workspace = max([made.workspace_bytes, *(k.workspace_bytes for k in own.values())])
        steps.append(
            dataclasses.replace(
                step,
                launches=list(made.launches),
                arch_launches={a: list(k.launches) for a, k in own.items()},
                workspace_bytes=workspace,
                vendor=made.vendor,
            )
        )
    return KernelPlan(
        tensors=dict(plan.tensors),
        steps=steps,
        inputs=list(plan.inputs),
        outputs=list(plan.outputs),
        output_names=list(plan.output_names),
    )


# wgmma pays from this many rows (M, batches folded in) and columns on (measured on an H200).
WGMMA_MIN_M = 512
WGMMA_MIN_N = 256


def _large_gemm(ctx: StepContext) -> bool:
    if ctx.precision not in ("fp16", "bf16"):
        return False
    from graphc.codegen.families.gemm import problem_of

    try:
        prob = problem_of(ctx)
    except CompileError:
        return False
    return prob.M >= WGMMA_MIN_M and prob.N >= WGMMA_MIN_N and prob.K >= 256  # M has batches folded in


def compile_kernels(kernels: KernelSet, archs: list[str], cache_dir=None, progress=None) -> None:
    """Cubin, for every arch, of every kernel that arch launches; a kernel that requires an
    arch-specific target (sm_90a) is compiled for that target and filed under its base arch, the
    only one that launches it."""
    jobs, filed = [], []
    for arch in archs:
        used = kernels.digests_for(arch)
        for d, src in kernels.sources.items():
            if d not in used:
                continue
            need = kernels.requires.get(d)
            if need is not None and need.rstrip("a") != arch:
                raise CompileError(f"kernel {kernels.names[d]} needs {need}; the engine also targets {arch}")
            jobs.append(CompileJob(kernels.names[d], src, need or arch))
            filed.append((arch, d))
    cubins = compile_all(jobs, cache_dir=cache_dir, progress=progress)
    for (arch, d), cubin in zip(filed, cubins, strict=True):
        kernels.cubins.setdefault(arch, {})[d] = cubin


# Archs that get kernels of their own in an engine built for several: sm_90 runs the sm_90a kernels
# (TMA and wgmma GEMMs), which no other arch can load (an sm_90a cubin runs on sm_90 alone).
HOPPER_ARCHS = ("sm_90",)


def generate_for_archs(
    plan: LoweredPlan,
    weights: dict[str, np.ndarray],
    archs: list[str],
    **kwargs: Any,
) -> KernelSet:
    """The kernels of an engine for `archs`: the default launches for the archs without kernels of
    their own, and for each Hopper arch among them the steps whose sm_90a launches differ. An engine
    for Hopper alone has the sm_90a launches as its default. kwargs go to generate_kernels."""
    hopper = [a for a in archs if a in HOPPER_ARCHS]
    if hopper and len(hopper) == len(archs):
        return generate_kernels(plan, weights, hopper=True, **kwargs)
    kernels = generate_kernels(plan, weights, **kwargs)
    if not hopper:
        return kernels
    # Every step is generated again, so any family's Hopper path (GEMM today) is taken without a list
    # of families here; steps whose kernels come out the same keep the default launches.
    special = generate_kernels(plan, weights, hopper=True, **kwargs)
    for arch in hopper:
        add_arch_kernels(kernels, arch, special)
    return kernels


def add_arch_kernels(kernels: KernelSet, arch: str, special: KernelSet) -> None:
    """File `special`'s launches under `arch` for the steps where they differ from `kernels`' default,
    with their sources."""
    own: dict[str, StepKernels] = {}
    for name, sk in special.steps.items():
        if kernels.steps.get(name) == sk:
            continue
        own[name] = sk
        for ln in sk.launches:
            d = ln.digest
            kernels.sources[d] = special.sources[d]
            kernels.names[d] = special.names[d]
            kernels.families[d] = special.families[d]
            if d in special.requires:
                kernels.requires[d] = special.requires[d]
    if own:
        kernels.arch_steps[arch] = own
    log.info("%s: %d step(s) with launches of its own", arch, len(own))


def engine_archs(opts: Any) -> list[str]:
    """The archs an engine for `opts` is built for: `opts.arch`, else this machine's GPU, else the
    default list (with this machine's GPU added when absent)."""
    local = local_gpu_arch()
    archs = [check_arch(a) for a in (opts.arch or ([local] if local else list(DEFAULT_ARCHS)))]
    if local and local not in archs and not opts.arch:
        archs.append(local)
    return archs


def local_gpu_arch() -> str | None:
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() > 0:
            return "sm_" + cupy.cuda.Device(0).compute_capability
    except Exception:
        return None
    return None


def build_cuda_engine(
    optimized,
    plan: LoweredPlan,
    weights: dict[str, np.ndarray],
    opts,
    report: dict[str, Any],
    phase,
    host_ifs: Any = None,
):
    """Tune (if asked), generate every step's kernels, plan the memory of the complete plan (the
    workspace its kernels need included), compile with NVRTC and make the engine. `host_ifs`:
    graphc/host_if.py's HostIfs of data-dependent Ifs, whose branches get their kernels here."""
    from graphc.codegen.memory import memory_report, plan_memory
    from graphc.runtime.engine import Engine

    local = local_gpu_arch()
    archs = engine_archs(opts)
    # Kernels see the storage precision: an fp8 engine's tensors are fp16 outside its MatMulFp8
    # steps, which carry their own e4m3 types (passes/quantize_fp8.py).
    precision = "fp16" if opts.precision == "fp8" else opts.precision
    if opts.precision == "fp8":
        from graphc.codegen.families.gemm_fp8 import FP8_ARCHS, check_fp8_archs

        if not opts.arch and local is None:
            archs = list(FP8_ARCHS)  # not the default list: its pre-Hopper archs have no FP8 kernel
            log.info("precision fp8: an engine for %s only (its FP8 GEMM is sm_90a's)", ", ".join(archs))
        check_fp8_archs(archs)
    choices: dict[str, Any] = {}
    if opts.tune != "off":
        if local is None:
            raise CompileError("--tune needs a GPU on this machine (tuning times kernels); use --tune off")
        from graphc.codegen.tune_search import VALIDATION_SHARE, Budget, budget_seconds
        from graphc.codegen.tuner import tune_plan, validate_on_gpu

        with phase("tune"):
            # With a cache_dir of its own (tests, CI) the tuning records live beside the kernels.
            cache_path = Path(opts.cache_dir) / "tuning.sqlite" if opts.cache_dir else None
            budget = Budget(budget_seconds(opts.tune, getattr(opts, "tune_budget_s", None)))
            tuned = tune_plan(
                plan,
                weights,
                mode=opts.tune,
                precision=precision,
                allow_tf32=opts.allow_tf32,
                cache_path=cache_path,
                budget=budget.part(1 - VALIDATION_SHARE),  # the rest is the whole-graph check's
                progress=opts.progress is not None,
                cache_dir=opts.cache_dir,
            )
            # Kept only when the whole graph replays faster than untuned: a tuner that never loses.
            choices, check = validate_on_gpu(
                plan, weights, tuned.choices, precision=precision, allow_tf32=opts.allow_tf32,
                cache_dir=opts.cache_dir,
            )  # fmt: skip
            tuned.report["validation"] = check.as_json()
            tuned.report["tune_s"] = round(budget.spent(), 2)
        report["tuning"] = choices
        report["tune"] = tuned.report
    archs = list(dict.fromkeys(archs))  # each arch once, in the order given
    from graphc.codegen.families.tvm_kernels import tvm_allowed, tvm_report

    with phase("codegen"), tvm_allowed(getattr(opts, "tvm", True)):
        from graphc.codegen.families.gemm_tactics import check_tactics, tactic_options

        kernels = generate_for_archs(
            plan, weights, archs, precision=precision, allow_tf32=opts.allow_tf32, choices=choices,
            tactics=check_tactics(getattr(opts, "tactics", ())), tactic_options=tactic_options(opts),
        )  # fmt: skip
        if host_ifs is not None and host_ifs.pending:
            from graphc.host_if_cuda import finish_cuda_branches

            finish_cuda_branches(
                host_ifs, kernels, archs, precision=precision, allow_tf32=opts.allow_tf32
            )  # fills the If steps' attrs (shared with `plan`'s steps) before the plan is completed
        final = complete_plan(plan, kernels)
    with phase("memory_plan"):
        memory = plan_memory(final)
    report["memory"] = memory_report(memory)
    with phase("nvrtc"):
        compile_kernels(kernels, archs, cache_dir=opts.cache_dir)
    report["timings"] = phase.timings
    report["cuda"] = {
        "archs": archs,
        "wgmma_kernels": sum(1 for a in kernels.requires.values() if a == "sm_90a"),
        "kernels": len(kernels.sources),
        "launches": sum(len(s.launches) for s in final.steps),
        # per arch: how many kernels it launches, and how many steps run launches of their own there
        "arch_kernels": {a: len(kernels.digests_for(a)) for a in archs},
        "arch_steps": {a: len(kernels.arch_steps.get(a, {})) for a in archs},
        "families": _count(kernels.families.values()),
        "nvrtc": nvrtc_version(),
    }
    tvm_steps = tvm_report(final.steps)  # steps whose kernels apache-tvm wrote (graphc[tvm])
    if tvm_steps:
        report["tvm"] = tvm_steps
        log.info("%d step(s) with kernels by apache-tvm: %s", len(tvm_steps["steps"]), ", ".join(tvm_steps["ops"]))
    vendor = [s.name for s in final.steps if s.vendor is not None]
    if vendor or getattr(opts, "tactics", ()):
        erf = sum(1 for s in final.steps if s.vendor is not None and s.vendor.get("gelu_from_erf"))
        report["tactics"] = {"cublaslt": {"steps": len(vendor), "erf_gelu_as_tanh": erf, "names": vendor}}
        log.info("%d GEMM step(s) through cuBLASLt (--tactics cublaslt)", len(vendor))
    pdl = bool(getattr(opts, "pdl", True))  # runtime/pdl.py: the engine records the PDL-ready kernels
    build_info = {"target": "cuda", "archs": archs, "nvrtc": nvrtc_version(), "precision": opts.precision, "pdl": pdl}
    executor = None
    if local is not None:
        from graphc.runtime.cuda import CUDAExecutor

        # an engine whose every step is a vendor call (--tactics cublaslt) has no kernel to compile
        cubins = kernels.cubins.get(local, None if kernels.digests_for(local) else {})
        if cubins is None:
            raise CompileError(f"no cubin for the local GPU ({local})")
        from graphc.runtime.pdl import pdl_ready

        ready = {d for d, src in kernels.sources.items() if pdl and pdl_ready(src, kernels.names[d])}
        executor = CUDAExecutor(
            final.for_arch(local), memory, weights, cubins, kernels.names, launch_arch=local,
            pdl_ready=ready, pdl=None if pdl else False,
        )  # fmt: skip
    engine = Engine("cuda", final, memory, weights, executor, report, build_info)
    engine.kernels = kernels
    return engine


def _count(values) -> dict[str, int]:
    out: dict[str, int] = {}
    for v in values:
        out[v] = out.get(v, 0) + 1
    return dict(sorted(out.items()))
