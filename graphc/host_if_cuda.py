"""Kernels for the branch sub-plans of data-dependent Ifs on the CUDA target (issue 12 item 1).

graphc/host_if.py leaves each branch optimized for CUDA and lowered (`HostIfs.pending`). Here,
inside the main engine's build (codegen/build.py calls `finish_cuda_branches` once the main plan's
kernels are made, before NVRTC), every branch gets its kernels from the same families with the
same archs and options, its completed plan and its memory plan; its kernels join the engine's
kernel table (under steps named "<If>/<then|else>/<step>"), so one NVRTC run compiles them all and
the engine file holds them like any other. The If step's attrs then hold the branches as plan data;
graphc.runtime.host_if_cuda runs them.
"""

from __future__ import annotations

import logging
from typing import Any

from graphc.host_if import HostIfs, rename_in_plan

log = logging.getLogger(__name__)


def finish_cuda_branches(host_ifs: HostIfs, kernels: Any, archs: list[str], **gen_kwargs: Any) -> None:
    """Generate, complete and memory-plan every pending branch (nested ones first: their step
    attrs are part of the branch that holds them), filling the If steps' attrs in place and adding
    the branches' kernels to `kernels` (a codegen.build.KernelSet)."""
    from graphc.codegen.build import complete_plan, generate_for_archs
    from graphc.codegen.memory import plan_memory
    from graphc.runtime.plan import memory_plan_to_json

    for pb in host_ifs.pending:
        finish_cuda_branches(pb.inner, kernels, archs, **gen_kwargs)
        own = generate_for_archs(pb.plan, pb.weights, archs, **gen_kwargs)
        final = complete_plan(pb.plan, own)
        memory = plan_memory(final)
        plan_json, memory_json = final.to_json(), memory_plan_to_json(memory)
        renames = {k: f"{pb.where}/{k}" for k, t in plan_json["tensors"].items() if t["kind"] == "weight"}
        rename_in_plan(plan_json, memory_json, renames)
        _merge(kernels, own, f"{pb.where}/")
        host_ifs.attrs[pb.node][pb.key] = {
            "plan": plan_json,
            "memory": memory_json,
            "num_captures": pb.num_captures,
            "inputs_from": list(pb.inputs_from),
        }
        log.info(
            "%s: %d steps, %d launches, arena %d bytes",
            pb.where,
            len(final.steps),
            sum(len(s.launches) for s in final.steps),
            memory.arena_bytes,
        )


def _merge(kernels: Any, own: Any, prefix: str) -> None:
    """Add a branch's kernels to the engine's table (sources by digest; steps under `prefix`)."""
    kernels.sources.update(own.sources)
    kernels.names.update(own.names)
    kernels.families.update(own.families)
    kernels.requires.update(own.requires)
    for name, sk in own.steps.items():
        kernels.steps[f"{prefix}{name}"] = sk
    for arch, byname in own.arch_steps.items():
        dest = kernels.arch_steps.setdefault(arch, {})
        for name, sk in byname.items():
            dest[f"{prefix}{name}"] = sk


__all__ = ["finish_cuda_branches"]
