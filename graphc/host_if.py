"""Data-dependent `If` on the CPU target: each branch becomes a planned sub-plan of its own, and the
engine chooses between them on the host at run time (issue 12 item 1).

An If left after passes/fold_control_flow.py has a condition known only at run time. For each such
node of the optimized graph, both branches are specialized to the node's actual input types
(the branch's nodes re-inferred over the concrete shapes of what they capture), optimized for the
CPU target, lowered and memory-planned like a model of their own (nested data-dependent Ifs the
same way, recursively). The If step's attrs then hold the two sub-plans as plan data (kernel plan
+ memory plan, the same JSON the engine stores for the main plan); their weights join the engine's
weights under names prefixed by the node and branch. graphc.runtime.cpu runs a branch's sub-plan
in an arena of its own, so only the branch taken costs time.

The CUDA target plans the branches the same way, optimized for CUDA (the same target context as
the main graph) and lowered; graphc/host_if_cuda.py then generates their kernels with the main
graph's (one NVRTC run for all), completes and memory-plans each branch, and the engine's
runtime (graphc.runtime.host_if_cuda) reads the condition back on the host and replays the
chosen branch's captured CUDA graph.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from graphc.errors import CompileError
from graphc.ir.builder import GraphBuilder
from graphc.ir.graph import Graph, Node
from graphc.ir.types import TensorType

log = logging.getLogger(__name__)

# The attrs of an If step: format version of the sub-plan layout below (runtime/cpu.py checks it).
HOST_IF_VERSION = 1


@dataclass
class HostIfs:
    """What lowering needs for the graph's data-dependent Ifs: each step's attrs by node name, the
    sub-plans' weights, and one line per node for the report."""

    attrs: dict[str, dict[str, Any]] = field(default_factory=dict)
    weights: dict[str, np.ndarray] = field(default_factory=dict)
    lines: list[str] = field(default_factory=list)
    # CUDA target: branches lowered but without kernels yet (graphc/host_if_cuda.py finishes them)
    pending: list[PendingBranch] = field(default_factory=list)


@dataclass
class PendingBranch:
    """A CUDA branch sub-plan before code generation: its lowered plan and constants, the Ifs
    nested in it (their own pending branches), and where its step attrs go."""

    node: str  # the If node's name
    key: str  # "then_branch" | "else_branch"
    where: str  # "If_3/then": prefix of its weights and its steps in the engine's kernel table
    plan: Any  # codegen.lower.LoweredPlan
    weights: dict[str, np.ndarray]
    inner: HostIfs
    num_captures: int
    inputs_from: list[int]


def specialize_subgraph(
    sub: Graph, node: Node, caps: list, where: str, parent: Graph, formals: list[TensorType] | None = None
) -> tuple[Graph, list[int]]:
    """The subgraph as a closed graph, typed by its formal inputs' `formals` (a Loop body's
    iteration, condition and carried values; none for an If branch) and the node's inputs bound
    to its captures, and which of its captures are its inputs (by position): a capture bound to a
    constant of the parent is a constant of the subgraph (so that shape arithmetic on it folds
    there as it would have in the parent)."""
    from graphc.passes.fold_control_flow import inline

    b = GraphBuilder(f"{where}", 0)
    bindings, inputs_from = [], []
    for p, t in zip(sub.inputs, formals or [], strict=True):
        bindings.append(b.add_input(p.name, t))
    for i, (cap, outer) in enumerate(zip(sub.captures, caps, strict=True)):
        if outer.name in parent.constants:
            bindings.append(b.add_constant(parent.constants[outer.name].data, cap.name))
            continue
        t = outer.type
        if not isinstance(t, TensorType) or not t.is_static:
            raise CompileError(
                f"{node.op} node '{node.name}': input {outer.name} is {t}; a sub-plan needs static tensors"
            )
        bindings.append(b.add_input(cap.name, t))
        inputs_from.append(i)
    outs = inline(b, sub, bindings, "")
    b.set_outputs(outs, [f"out{i}" for i in range(len(outs))])
    return b.build(), inputs_from


def _rename_weights(plan: dict[str, Any], memory: dict[str, Any], prefix: str) -> dict[str, str]:
    """Prefix every weight of a sub-plan (in place) so that names stay unique in the engine."""
    renames = {k: f"{prefix}{k}" for k, t in plan["tensors"].items() if t["kind"] == "weight"}
    if not renames:
        return renames
    _rename_weights_keys(plan, memory, renames)
    return renames


def rename_in_plan(plan: dict[str, Any], memory: dict[str, Any], renames: dict[str, str]) -> None:
    """Rename tensors of a CUDA sub-plan (JSON, in place) everywhere a name appears: tensors,
    steps, outputs, aliases, launch arguments and tensor-map specs."""
    if not renames:
        return
    _rename_weights_keys(plan, memory, renames)
    for s in plan["steps"]:
        for launches in [s.get("launches", []), *s.get("arch_launches", {}).values()]:
            for ln in launches:
                ln["args"] = [renames.get(a, a) for a in ln["args"]]
                for spec in ln.get("params", {}).get("tmaps", []) or []:
                    if isinstance(spec, dict) and spec.get("tensor") in renames:
                        spec["tensor"] = renames[spec["tensor"]]


def _rename_weights_keys(plan: dict[str, Any], memory: dict[str, Any], renames: dict[str, str]) -> None:
    plan["tensors"] = {renames.get(k, k): {**t, "name": renames.get(k, k)} for k, t in plan["tensors"].items()}
    for t in plan["tensors"].values():
        if t.get("alias_of") in renames:
            t["alias_of"] = renames[t["alias_of"]]
    for s in plan["steps"]:
        s["inputs"] = [renames.get(n, n) if n is not None else None for n in s["inputs"]]
    plan["outputs"] = [renames.get(n, n) for n in plan["outputs"]]  # a branch may return a constant
    memory["aliases"] = {renames.get(k, k): renames.get(v, v) for k, v in memory["aliases"].items()}


def check_branch_outputs(node: Node, key: str, shapes: list[tuple[str, list[int]]]) -> None:
    """The sub-plan's outputs must be what the If's outputs are planned as."""
    for i, ((_name, shape), v) in enumerate(zip(shapes, node.outputs, strict=True)):
        want = v.type
        if isinstance(want, TensorType) and list(want.static_shape) != list(shape):
            raise CompileError(
                f"If node '{node.name}': {key} output {i} has shape {list(shape)}, the node's output "
                f"{v.name} {list(want.static_shape)}; graphc plans one shape per output"
            )


def plan_host_ifs(graph: Graph, opt_level: int, target: Any = None, prefix: str = "") -> HostIfs:
    """Sub-plans for every If node of `graph` (already optimized for `target`, a
    passes.target.Target; None: the CPU target). For the CUDA target the branches are left
    lowered in `pending` (graphc/host_if_cuda.py generates their kernels)."""
    out = HostIfs()
    cuda = target is not None and getattr(target, "is_cuda", False)
    for node in graph.nodes:
        if node.op in ("Loop", "Scan") and node.domain == "":
            from graphc.host_loop import plan_host_loop

            # a loop left here: its body one sub-plan, iterated on the host (graphc/host_loop.py)
            plan_host_loop(out, node, graph, opt_level, target, prefix)
            continue
        if node.op != "If" or node.domain != "":
            continue
        then_b, else_b = node.attrs.then_branch, node.attrs.else_branch
        nt = len(then_b.captures)
        caps = list(node.inputs[1:])
        step_attrs: dict[str, Any] = {"host_if_version": HOST_IF_VERSION}
        sizes: list[int | None] = []
        refused: dict[str, str] = {}
        for key, sub, bound in (("then_branch", then_b, caps[:nt]), ("else_branch", else_b, caps[nt:])):
            where = f"{prefix}{node.name}/{key.split('_')[0]}"  # a nested If's names start with its branch's
            err = _type_error(sub, bound, graph)
            if err is not None:  # only this, inference's own verdict, refuses a branch; other errors stop the compile
                refused[key] = err
                sizes.append(None)
                continue
            sizes.append(_plan_branch(out, node, key, sub, bound, where, graph, opt_level, target, step_attrs))
        if len(refused) == 2:
            why = refused["then_branch"]
            raise CompileError(f"If node '{node.name}': neither branch type-checks on these inputs: {why}")
        for key, msg in refused.items():
            # Inference gave the If the other branch's types because this one does not type-check
            # on these input shapes (graphc/ops/control_flow.py); a run that takes it is refused, as
            # ONNX Runtime fails in it.
            n_caps = nt if key == "then_branch" else len(caps) - nt
            why = f"the {key.split('_')[0]}-branch cannot run on these input shapes: {msg}"
            step_attrs[key] = {"refused": why, "num_captures": n_caps}
            log.info("If node '%s': %s", node.name, step_attrs[key]["refused"])
        out.attrs[node.name] = step_attrs
        how = (
            "the CUDA engine reads the condition back on the host (one 1-byte device-to-host copy and a stream "
            "sync per run), then replays the chosen branch's CUDA graph (captured on its first use); the steps "
            "before and after the If are captured graphs of their own"
            if cuda
            else "the CPU engine chooses one on the host per run"
        )
        counts = ", ".join(
            f"{k} {n} steps" if n is not None else f"{k} refused at run time (it does not type-check on these shapes)"
            for k, n in zip(("then", "else"), sizes, strict=True)
        )
        line = (
            f"If node '{node.name}': condition known only at run time; each branch is its own planned sub-plan "
            f"({counts}) and {how}"
        )
        log.info("%s", line)
        out.lines.append(line)
    return out


def _type_error(sub: Graph, bound: list, graph: Graph) -> str | None:
    """Why the branch does not type-check over the static types (and known values) bound to it,
    or None. A node whose inference took the other branch's types for this reason
    (graphc/ops/control_flow.py) has one branch that cannot run on these inputs."""
    from graphc.ops.control_flow import specialize

    types = [v.type for v in bound]
    if not all(isinstance(t, TensorType) and t.is_static for t in types):
        return None
    values = [graph.constants[v.name].data if v.name in graph.constants else None for v in bound]
    return specialize(sub, types, values)[1]


def _plan_branch(
    out: HostIfs,
    node: Node,
    key: str,
    sub: Graph,
    bound: list,
    where: str,
    graph: Graph,
    opt_level: int,
    target: Any,
    step_attrs: dict[str, Any],
) -> int:
    """Plan one branch into `step_attrs[key]` (CPU) or `out.pending` (CUDA); its step count."""
    branch, inputs_from = specialize_subgraph(sub, node, bound, where, graph)

    def check(shapes: list[tuple[str, list[int]]]) -> None:
        check_branch_outputs(node, key, shapes)

    return plan_sub(out, node.name, key, branch, len(bound), inputs_from, where, opt_level, target, step_attrs, check)


def plan_sub(
    out: HostIfs,
    node: str,
    key: str,
    g: Graph,
    num_captures: int,
    inputs_from: list[int],
    where: str,
    opt_level: int,
    target: Any,
    step_attrs: dict[str, Any],
    check: Any,
) -> int:
    """Plan the closed graph `g` (an If branch, a Loop/Scan body) as a sub-plan into
    `step_attrs[key]` (CPU) or `out.pending` (CUDA: graphc/host_if_cuda.py fills `step_attrs[key]`
    once the kernels are made); `check(outputs as (name, shape))` refuses outputs that are not the
    node's. Its step count."""
    if target is not None and getattr(target, "is_cuda", False):
        lowered, weights, inner = lower_branch(g, opt_level, target, out, where)
        check([(n, lowered.tensors[n].shape) for n in lowered.outputs])
        out.pending.append(PendingBranch(node, key, where, lowered, weights, inner, num_captures, inputs_from))
        # the engine names of its weights (graphc/host_if_cuda.py renames its plan so)
        kinds = {k: getattr(lowered.tensors.get(k), "kind", "") for k in weights}
        out.weights.update({f"{where}/{k}": a for k, a in weights.items() if kinds[k] == "weight"})
        out.weights.update(inner.weights)
        step_attrs[key] = {}  # filled by graphc/host_if_cuda.py once the kernels are made
        return len(lowered.steps)
    plan, memory, weights = compile_branch(g, opt_level, out, where)
    check([(n, plan["tensors"][n]["shape"]) for n in plan["outputs"]])
    renames = _rename_weights(plan, memory, f"{where}/")
    for k, a in weights.items():
        out.weights[renames.get(k, k)] = a
    step_attrs[key] = {"plan": plan, "memory": memory, "num_captures": num_captures, "inputs_from": inputs_from}
    return len(plan["steps"])


def compile_branch(
    g: Graph, opt_level: int, outer: HostIfs, where: str
) -> tuple[dict[str, Any], dict[str, Any], dict[str, np.ndarray]]:
    """A branch graph optimized, lowered and memory-planned for the CPU target (JSON plan data)."""
    from graphc.codegen.lower import lower_to_plan
    from graphc.codegen.memory import plan_memory
    from graphc.passes.manager import OptimizeOptions, optimize
    from graphc.runtime.plan import memory_plan_to_json

    g = optimize(g, OptimizeOptions(opt_level=opt_level)).graph
    inner = plan_host_ifs(g, opt_level, prefix=f"{where}/")
    outer.lines += inner.lines
    plan = lower_to_plan(g, host_ifs=inner.attrs)
    memory = plan_memory(plan)
    weights = {name: c.data for name, c in g.constants.items()}
    weights.update(inner.weights)
    return plan.to_json(), memory_plan_to_json(memory), weights


def lower_branch(g: Graph, opt_level: int, target: Any, outer: HostIfs, where: str) -> tuple[Any, dict, HostIfs]:
    """A branch graph optimized for the CUDA `target` and lowered (kernels come later)."""
    import dataclasses

    from graphc.codegen.lower import lower_to_plan
    from graphc.passes.manager import OptimizeOptions, optimize

    if target.precision == "int8":
        # calibration samples are the main graph's inputs, which a branch does not take: it keeps fp32
        line = f"{where}: a data-dependent If's branch keeps fp32 under int8 (calibration covers the main graph)"
        log.warning("%s", line)
        outer.lines.append(line)
        target = dataclasses.replace(target, precision="fp32", calibrator=None)
    # a branch's inputs and outputs are the If's, fp32 at its edges (passes/precision.py), whatever
    # the engine's own IO precision
    target = dataclasses.replace(target, io_precision="model")
    g = optimize(g, OptimizeOptions(opt_level=opt_level, target=target)).graph
    inner = plan_host_ifs(g, opt_level, target, prefix=f"{where}/")
    outer.lines += inner.lines
    plan = lower_to_plan(g, host_ifs=inner.attrs)
    weights = {name: c.data for name, c in g.constants.items()}
    return plan, weights, inner


__all__ = [
    "HOST_IF_VERSION",
    "HostIfs",
    "PendingBranch",
    "check_branch_outputs",
    "compile_branch",
    "lower_branch",
    "plan_host_ifs",
    "rename_in_plan",
]
