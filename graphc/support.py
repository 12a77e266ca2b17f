"""What `graphc check` reports: does this model compile for a target, and if not, which ops stop it
and why (issue 12: check used to say "every op is supported" for models whose CUDA compile then
failed).

The check runs the compile itself up to the last step before NVRTC, so it cannot disagree with
it: the frontend over every node (subgraphs of If/Loop/Scan included), loading, binding the input
shapes, the target's rewrites and the optimizer at the same level as `graphc compile`, lowering,
and for the cuda target the kernel generation of every step (each family's own conditions:
constant scales, supported dtypes, layouts...). Every failure is collected, not just the first.
Ops that run on the CUDA target only under conditions that this model meets are listed as notes
with the condition, so a user knows what a change of model or shapes could break.

tests/graphc/test_support.py runs this and a real CUDA compile (NVRTC) over the zoo and hand-made
graphs and checks they agree; the phases below mirror graphc.compiler.compile.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import onnx

from graphc.errors import GraphcError, UnsupportedOpError

log = logging.getLogger(__name__)

TARGETS = ("cpu", "cuda")
_NODE_ERROR = re.compile(r"^(?P<op>[\w.]+) node '(?P<node>[^']*)': (?P<rest>.*)$", re.S)

# Ops that have CUDA kernels only in some forms: the condition, stated for a model that has them.
CUDA_CONDITIONS: dict[str, str] = {
    "Resize": "roi, scales and sizes must be constants",
    "TopK": "K must be a constant; lines longer than 4096 elements (2048 for 8-byte types) take K search rounds",
    "Einsum": "lowered to MatMul; diagonals, integer types and size-1 broadcasts have no kernel",
    "LpPool": "through AveragePool except under ceil_mode, which has no kernel",
    "QuantizeLinear": "constant scales; float8 and 4-bit types have no kernel",
    "DequantizeLinear": "constant scales; float8 and 4-bit types have no kernel",
    "Dropout": "inference only (no training_mode known only at run time)",
    "SplitToSequence": "lowered to Split where the split sizes are constants and the axis static",
    "SequenceAt": "lowered where the sequence's length and the position are static",
    "ConcatFromSequence": "lowered to Concat where the sequence's length is static",
    "SequenceConstruct": "lowered where every reader of the sequence is",
    "SequenceLength": "lowered where the sequence's length is static",
    "SequenceInsert": "lowered where the sequence's length and the position are static",
    "SequenceErase": "lowered where the sequence's length and the position are static",
    "ConvTranspose": "lowered to a convolution over a zero-inserted input (strided ones do s1*s2x the work)",
    "Pad": "pads and the constant value must be constants",
    "Slice": "starts, ends, axes and steps must be constants",
    "DeformConv": "2-D only; a direct kernel (one thread per output element, no data reuse): correct, not fast",
    "RoiAlign": "a direct kernel (one thread per output element); a batch index outside X writes 0 on CUDA (an "
    "error on the CPU target)",
    "TensorScatter": "lowered to ScatterElements where shapes are static; a linear-mode write outside the cache is "
    "not checked on CUDA (an error on the CPU target)",
}


@dataclass(frozen=True)
class Finding:
    """One op type that stops the compile (or, as a note, runs only under `reason`)."""

    op: str  # "Einsum", "com.microsoft.Attention", or "(inputs)" for shape binding
    nodes: tuple[str, ...]
    reason: str
    where: str = ""  # "" for the main graph, else the subgraph's place

    def line(self) -> str:
        shown = ", ".join(self.nodes[:5]) + (f" (+{len(self.nodes) - 5} more)" if len(self.nodes) > 5 else "")
        place = f" [{self.where}]" if self.where else ""
        count = f"{len(self.nodes)} node(s): {shown}: " if self.nodes else ""
        return f"{self.op}{place}: {count}{self.reason}"


@dataclass
class SupportReport:
    model: str
    target: str
    findings: list[Finding] = field(default_factory=list)
    notes: list[Finding] = field(default_factory=list)
    op_counts: dict[str, int] = field(default_factory=dict)
    nodes: int = 0
    opset: int = 0

    @property
    def supported(self) -> bool:
        return not self.findings

    def lines(self) -> list[str]:
        if self.findings:
            out = [f"{self.model}: does not compile for {self.target}: {len(self.findings)} problem(s):"]
            out += [f"  {f.line()}" for f in self.findings]
        else:
            out = [f"{self.model}: every op compiles for {self.target} ({self.nodes} nodes, opset {self.opset})"]
            out += [f"  {op}: {n}" for op, n in self.op_counts.items()]
        if self.notes:
            out.append(f"  conditions these ops meet here ({self.target}):")
            out += [f"    {f.line()}" for f in self.notes]
        return out


def check_model(
    model: str | onnx.ModelProto,
    *,
    target: str = "cpu",
    shapes: Mapping[str, Any] | None = None,
    precision: str = "fp32",
    opt_level: int = 2,
    tvm: bool = True,
) -> SupportReport:
    """Whether `graphc.compile(model, target=target, shapes=shapes, precision=precision, tvm=tvm)`
    would succeed, with every reason it would not. Raises only when `model` cannot be read as ONNX.
    On the cuda target, the ops whose kernels apache-tvm would write (graphc[tvm]) are notes; with
    tvm=False (--no-tvm), or without TVM installed, they are findings."""
    from graphc.frontend import find_unsupported, load_onnx, read_model

    if target not in TARGETS:
        raise ValueError(f"target must be one of {TARGETS}, got {target!r}")
    name = model if isinstance(model, str) else f"<{type(model).__name__}>"
    report = SupportReport(str(name), target)
    proto, _ = read_model(model)  # a file that is no model is the caller's error, raised
    inner = _subgraph_findings(proto)
    # find_unsupported walks subgraphs too (names as paths "#0/then_branch/0"): those are listed once,
    # by _subgraph_findings, with their place
    in_subgraphs = {f.op for f in inner}
    report.findings += [
        Finding(_qual(op, dom), tuple(names), f"no converter for opset {opset}")
        for op, dom, opset, names in find_unsupported(proto)
        if not (_qual(op, dom) in in_subgraphs and all("/" in n for n in names))
    ]
    report.findings += inner
    if report.findings:
        return report
    try:
        graph = load_onnx(model if isinstance(model, str) else proto)
    except UnsupportedOpError as e:
        for op, dom, _opset, names in e.unsupported or [("(model)", "", 0, [])]:
            report.findings.append(Finding(_qual(op, dom), tuple(names), str(e)))
        return report
    except GraphcError as e:  # a node's types or attributes graphc rejects
        m = _NODE_ERROR.match(str(e))
        report.findings.append(Finding(m["op"], (m["node"],), m["rest"]) if m else Finding("(model)", (), str(e)))
        return report
    report.nodes, report.opset, report.op_counts = len(graph.nodes), graph.opset, dict(graph.op_counts())
    from graphc.codegen.families.tvm_kernels import tvm_allowed

    with tvm_allowed(tvm):
        _check_compile(graph, report, shapes, precision, opt_level)
    if target == "cuda" and report.supported:
        present = {n.op: n.name for n in graph.nodes if n.domain == ""}
        for op, cond in CUDA_CONDITIONS.items():
            if op in present:
                report.notes.append(Finding(op, tuple(n.name for n in graph.nodes if n.op == op), cond))
    return report


def _qual(op: str, domain: str) -> str:
    return f"{domain}.{op}" if domain else op


def _subgraphs(graph: onnx.GraphProto, where: str = "") -> Iterator[tuple[onnx.NodeProto, str]]:
    """Every node inside a subgraph attribute (If branches, Loop/Scan bodies), recursively, with
    where it sits."""
    for i, node in enumerate(graph.node):
        for attr in node.attribute:
            bodies = list(attr.graphs) + ([attr.g] if attr.HasField("g") else [])
            for body in bodies:
                here = f"{where} > " if where else ""
                place = f"{here}{attr.name} of {node.op_type} '{node.name or f'#{i}'}'"
                for inner in body.node:
                    yield inner, place
                yield from _subgraphs(body, place)


def _subgraph_findings(proto: onnx.ModelProto) -> list[Finding]:
    from graphc.frontend.convert import STANDARD_DOMAINS, model_opset
    from graphc.frontend.registry import find_converter

    missing: dict[tuple[str, str, str], list[str]] = {}
    opsets: dict[str, int] = {}
    for node, where in _subgraphs(proto.graph):
        dom = "" if node.domain in STANDARD_DOMAINS else node.domain
        if dom not in opsets:
            opsets[dom] = model_opset(proto, dom)
        if find_converter(node.op_type, dom, opsets[dom]) is None:
            missing.setdefault((node.op_type, dom, where), []).append(node.name or "(unnamed)")
    return [
        Finding(_qual(op, dom), tuple(names), f"no converter for opset {opsets[dom]}", where)
        for (op, dom, where), names in sorted(missing.items())
    ]


def _check_compile(graph, report: SupportReport, shapes, precision: str, opt_level: int) -> None:
    """The phases of graphc.compiler.compile up to NVRTC; each failure becomes a finding."""
    from graphc.codegen.lower import lower_to_plan
    from graphc.ir.shapes import bind_shapes
    from graphc.ir.types import SequenceType
    from graphc.passes.manager import OptimizeOptions, optimize

    target = report.target
    try:
        g = bind_shapes(graph, shapes)
    except GraphcError as e:
        m = _NODE_ERROR.match(str(e))
        if m:  # a node whose output size depends on run-time values
            report.findings.append(Finding(m["op"], (m["node"],), m["rest"]))
        else:  # an input dim left symbolic
            hint = "" if "--shapes" in str(e) else " (give them with --shapes)"
            report.findings.append(Finding("(inputs)", (), f"{e}{hint}"))
        return
    try:
        # The pipeline as graphc.compiler.compile runs it: the same target context (CUDA's fusion
        # capabilities, precision), so every target rewrite (control flow folded, LSTM unrolled,
        # channels-last, precision, GEMM weight layout) is the compile's own.
        tctx = _target(target, precision)
        g = optimize(g, OptimizeOptions(opt_level=opt_level, target=tctx)).graph
    except GraphcError as e:
        report.findings.append(Finding("(optimizer)", (), str(e)))
        return
    # Sequences that stayed sequences (lengths or positions known only at run time).
    seq_nodes: dict[str, list[str]] = {}
    for n in g.nodes:
        if any(isinstance(o.type, SequenceType) for o in n.outputs):
            seq_nodes.setdefault(n.op, []).append(n.name)
    for op, names in seq_nodes.items():
        report.findings.append(
            Finding(
                op,
                tuple(names),
                "its sequence has a length or position known only at run time; graphc compiles tensor graphs only",
            )
        )
    if seq_nodes:
        return
    try:
        # a data-dependent If runs as two sub-plans chosen on the host, on both targets (graphc/host_if.py)
        from graphc.host_if import plan_host_ifs

        host_ifs = plan_host_ifs(g, opt_level, tctx if target == "cuda" else None)
        plan = lower_to_plan(g, host_ifs=host_ifs.attrs)
    except GraphcError as e:
        report.findings.append(Finding("(lowering)", (), str(e)))
        return
    ifs = tuple(n for n, a in host_ifs.attrs.items() if "host_if_version" in a)
    loops = tuple(n for n, a in host_ifs.attrs.items() if "host_loop_version" in a)  # graphc/host_loop.py
    if ifs:  # what runs on the host, and why: a note, as the compile report says it
        how = "the condition read back, then the chosen branch's CUDA graph" if target == "cuda" else "chosen per run"
        report.notes.append(
            Finding("If", ifs, f"condition known only at run time: each branch a planned sub-plan, {how} (on the host)")
        )
    if loops:
        report.notes.append(
            Finding("Loop/Scan", loops, "not unrolled: the body a planned sub-plan, iterated on the host")
        )
    if target == "cuda":
        _check_kernels(plan, {k: c.data for k, c in g.constants.items()}, report, precision)
        for pb in _pending(host_ifs):  # each branch's kernels, as graphc/host_if_cuda.py makes them
            what = "Loop/Scan" if pb.key == "body" else "If"
            _check_kernels(pb.plan, pb.weights, report, precision, where=f"{pb.key} of {what} '{pb.node}'")


def _target(target: str, precision: str):
    from graphc.passes.target import Target

    t = Target(target, precision)
    if target == "cuda":
        import dataclasses

        from graphc.codegen.capabilities import CUDA

        t = dataclasses.replace(t, capabilities=CUDA)
    return t


def _pending(host_ifs) -> Iterator[Any]:
    for pb in host_ifs.pending:
        yield pb
        yield from _pending(pb.inner)


def _check_kernels(plan, weights, report: SupportReport, precision: str, where: str = "") -> None:
    """Generate (render, no NVRTC) every step's kernels, as codegen.build.generate_kernels does."""
    from graphc.codegen.kernel import family_for

    failed: dict[tuple[str, str], list[str]] = {}
    by_tvm: dict[str, list[str]] = {}
    from graphc.runtime.host_if_cuda import is_host_if

    for step in plan.steps:
        if step.alias or is_host_if(step):  # an If's branches are checked as plans of their own
            continue
        ctx = plan.context(step, weights, precision=precision)
        try:
            made = family_for(ctx).generate(ctx)
            if any(k.family == "tvm" for k in made):
                by_tvm.setdefault(_qual(step.op, step.domain), []).append(step.name)
        except GraphcError as e:
            op = _qual(step.op, step.domain)
            if step.op == "Fused" and step.domain == "graphc":
                op = f"{_qual(ctx.attrs.anchor_op, ctx.attrs.anchor_domain)} (fused)"
            failed.setdefault((op, _reason(str(e), step.name)), []).append(step.name)
    for (op, reason), names in failed.items():
        report.findings.append(Finding(op, tuple(names), reason, where))
    for op, names in by_tvm.items():
        report.notes.append(
            Finding(op, tuple(names), "kernel written by apache-tvm (needs graphc[tvm]; --no-tvm refuses it)", where)
        )


def _reason(message: str, step_name: str) -> str:
    """The message without its "<kind> node '<name>': " head, so that equal reasons group."""
    marker = f"node '{step_name}': "
    i = message.find(marker)
    return message[i + len(marker) :] if i >= 0 else message


def check_lines(
    model: str, target: str, shapes: Mapping[str, Any] | None, *, tvm: bool = True
) -> tuple[list[str], bool]:
    """The CLI's view: printed lines, and whether the model compiles."""
    r = check_model(model, target=target, shapes=shapes, tvm=tvm)
    return r.lines(), r.supported


__all__: Sequence[str] = ["CUDA_CONDITIONS", "Finding", "SupportReport", "check_lines", "check_model"]
