"""Casts inside the kernels next to them: no kernel of its own for a dtype conversion.

The precision pass (passes/precision.py) puts a Cast at every fp32 input and output of an fp16
or bf16 engine, after fusion has run; exporters leave Casts between ops too. Each was a kernel
that reads and writes the whole tensor (GPT-2's fp32 logits at batch 32: 0.53 ms of a 3.2 ms
replay, after the LM head's GEMM). Two rules, tried in this order:

    cast(p(x))  -> Fused[p](x) {.. ; Cast(last)}    the producer's store writes the cast dtype
    u(.., cast(x), ..) -> Fused(.., x, ..) {Cast(in_k); ..}   the consumer's load casts

The producer rule takes a Cast whose input is made by a Fused node with one output (any anchor
whose kernel stores through the epilogue hook: GEMM, conv, pools, reductions and row-wise ops,
or none) or by such an anchor standing alone, when that value is read by the Cast alone and is
no graph output: the Cast becomes the epilogue's last op, so the kernel computes in its own
dtype and stores the cast one. The consumer rule takes a Cast whose every reader is a fused
elementwise node, or a fused node that reads it only in its epilogue (never as an anchor
operand: the GEMM/conv operand loads are typed by the anchor's dtype): each reader loads the
Cast's input and casts it as its first op, and the Cast goes away.

Bit for bit what the separate Cast gave: codegen/epilogue.py rounds a 16-bit value to its type
before a Cast reads it and after a Cast makes it, so fp16 -> fp32 after a GEMM stores
float(half(acc)), and fp32 -> fp16 before an elementwise op feeds it half(x), exactly as a
stored fp16 tensor would (the CPU engine's fused node runs the ops' numpy references, which round
every op anyway). Not folded: a Cast after an Attention, Gather, Transpose or another data
movement kernel (their templates move elements without an epilogue), after a node with several
outputs (LayerNormalization with its Mean output, a row-norm GEMM), or whose input someone else
also reads (the kernel would have to store both dtypes).
"""

from __future__ import annotations

import logging
from dataclasses import replace

from graphc.ir.graph import Graph, Node
from graphc.ops.fused import ACC, FUSED_DOMAIN, OP, EpilogueOp, FusedAttrs, Ref
from graphc.ops.internal import INTERNAL_DOMAIN
from graphc.ops.layout_ops import LAYOUT_DOMAIN
from graphc.passes.capabilities import REFERENCE, FusionCapabilities
from graphc.passes.fold_common import Replacement, rebuild
from graphc.passes.fuse_common import supported_value

log = logging.getLogger(__name__)

# Ops whose kernels store their result through the fused epilogue hook (codegen/epilogue.py),
# standing alone or as a Fused node's anchor: the GEMM, conv, pool and reduction families.
EPILOGUE_ANCHORS = frozenset(
    {
        ("", "Conv"),
        ("", "Gemm"),
        ("", "MatMul"),
        (INTERNAL_DOMAIN, "MatMul"),
        (LAYOUT_DOMAIN, "ConvNHWC"),
        ("", "MaxPool"),
        ("", "AveragePool"),
        (LAYOUT_DOMAIN, "MaxPoolNHWC"),
        (LAYOUT_DOMAIN, "AveragePoolNHWC"),
        (LAYOUT_DOMAIN, "GlobalMaxPoolNHWC"),
        (LAYOUT_DOMAIN, "GlobalAveragePoolNHWC"),
        *(
            ("", op)
            for op in (
                "ReduceSum",
                "ReduceMean",
                "ReduceMax",
                "ReduceMin",
                "ReduceProd",
                "ReduceL1",
                "ReduceL2",
                "ReduceSumSquare",
                "ReduceLogSum",
                "ReduceLogSumExp",
                "GlobalAveragePool",
                "GlobalMaxPool",
                "Softmax",
                "LogSoftmax",
                "Hardmax",
                "LayerNormalization",
                "RMSNormalization",
                "InstanceNormalization",
                "GroupNormalization",
                "LpNormalization",
            )
        ),
    }
)


def _kind(op: str | None, domain: str) -> str:
    return "Elementwise" if op is None else (op if not domain else f"{domain}.{op}")


def _is_cast(node: Node, caps: FusionCapabilities) -> bool:
    return (
        node.op == "Cast"
        and not node.domain
        and len(node.outputs) == 1
        and caps.renders("Cast")
        and all(supported_value(v, caps) for v in (*node.inputs, *node.outputs))
    )


def _anchor_of(node: Node) -> tuple[str | None, str] | None:
    """(anchor op, domain) of a node whose kernel stores through the epilogue hook, with one
    output; None for anything else."""
    if len(node.outputs) != 1:
        return None
    if node.op == "Fused" and node.domain == FUSED_DOMAIN:
        a: FusedAttrs = node.attrs
        if len(a.outputs) != 1:
            return None
        if a.anchor_op is not None and (a.anchor_domain, a.anchor_op) not in EPILOGUE_ANCHORS:
            return None
        return a.anchor_op, a.anchor_domain
    if (node.domain, node.op) in EPILOGUE_ANCHORS:
        return node.op, node.domain
    return None


def _producer_fold(graph: Graph, cast: Node, caps: FusionCapabilities) -> Replacement | None:
    x = cast.inputs[0]
    p = graph.producer(x.name)
    if p is None or graph.is_output(x.name) or len(graph.users(x.name)) != 1:
        return None
    anchor = _anchor_of(p)
    if anchor is None:
        return None
    out_t = cast.outputs[0].ttype
    if not caps.fuses_epilogue(_kind(*anchor), "Cast", out_t.dtype) or not supported_value(x, caps):
        return None
    if p.op == "Fused" and p.domain == FUSED_DOMAIN:
        a: FusedAttrs = p.attrs
        attrs = replace(a, epilogue=(*a.epilogue, EpilogueOp("Cast", cast.attrs, (a.outputs[0],))),
                        outputs=(OP(len(a.epilogue)),))  # fmt: skip
        inputs = list(p.inputs)
    else:
        attrs = FusedAttrs(
            anchor_op=p.op,
            anchor_domain=p.domain,
            anchor_attrs=p.attrs,
            anchor_inputs=len(p.inputs),
            epilogue=(EpilogueOp("Cast", cast.attrs, (ACC,)),),
            outputs=(OP(0),),
        )
        inputs = list(p.inputs)
        while inputs and inputs[-1] is None:  # a fused node's input list cannot end in an omitted input
            inputs.pop()
        if any(v is None for v in inputs):
            return None  # an omitted input in the middle (Conv without B is fine; this is not)
        attrs = replace(attrs, anchor_inputs=len(inputs))

    def emit(b, mapv):
        node = b.add_node(
            "Fused",
            [mapv(v) for v in inputs],
            attrs,
            name=p.name,
            keep_name=True,
            outputs=[cast.outputs[0].name],
            domain=FUSED_DOMAIN,
        )
        return list(node.outputs)

    return Replacement(cast.name, emit, (p, cast))


def _epilogue_slots(user: Node, name: str) -> list[int] | None:
    """The input slots where a fused `user` reads `name`, when it reads it only in its epilogue
    (not as an anchor operand); None when the user cannot take a cast on its load."""
    if user.op != "Fused" or user.domain != FUSED_DOMAIN:
        return None
    a: FusedAttrs = user.attrs
    slots = [i for i, v in enumerate(user.inputs) if v is not None and v.name == name]
    if not slots or any(i < a.anchor_inputs for i in slots):
        return None
    return slots


def _shifted(r: Ref, slots: set[int]) -> Ref:
    if r.kind == "op":
        return OP(r.index + 1)
    if r.kind == "in" and r.index in slots:
        return OP(0)
    return r


def _with_cast_on_load(attrs: FusedAttrs, slot: int, slots: set[int], cast: Node) -> FusedAttrs:
    """The epilogue with `Cast(in<slot>)` as op 0, every read of the old input slots reading it."""
    epi = tuple(EpilogueOp(e.op, e.attrs, tuple(_shifted(r, slots) for r in e.args)) for e in attrs.epilogue)
    outs = tuple(_shifted(r, slots) for r in attrs.outputs)
    return replace(attrs, epilogue=(EpilogueOp("Cast", cast.attrs, (Ref("in", slot),)), *epi), outputs=outs)


def _consumer_fold(graph: Graph, cast: Node, caps: FusionCapabilities) -> list[Replacement] | None:
    y, x = cast.outputs[0], cast.inputs[0]
    users = graph.users(y.name)
    if not users or graph.is_output(y.name) or not supported_value(x, caps):
        return None
    plans = []
    for u in users:
        slots = _epilogue_slots(u, y.name)
        if slots is None:
            return None
        a: FusedAttrs = u.attrs
        if not caps.fuses_epilogue(_kind(a.anchor_op, a.anchor_domain), "Cast", y.ttype.dtype):
            return None
        plans.append((u, slots))
    reps = []
    for u, slots in plans:
        attrs = _with_cast_on_load(u.attrs, slots[0], set(slots), cast)

        def emit(b, mapv, u=u, slots=slots, attrs=attrs):
            ins = [None if v is None else mapv(x if i == slots[0] else v) for i, v in enumerate(u.inputs)]
            node = b.add_node(
                "Fused", ins, attrs, name=u.name, keep_name=True, outputs=list(u.output_names), domain=FUSED_DOMAIN
            )
            return list(node.outputs)

        reps.append(Replacement(u.name, emit, (u, cast)))
    return reps


def fuse_casts(graph: Graph, caps: FusionCapabilities = REFERENCE) -> Graph:
    """Fold every Cast it can into the kernel that makes its input or the kernels that read its
    output (see the module doc); `caps` says what the target's epilogues hold. Repeats until
    nothing changes: a node rewritten once (a consumer that took a cast on its load) may then
    take the Cast after it."""
    while True:
        new = _fold_once(graph, caps)
        if new is graph:
            return graph
        graph = new


def _fold_once(graph: Graph, caps: FusionCapabilities) -> Graph:
    replacements: list[Replacement] = []
    taken: set[str] = set()  # nodes a replacement already rewrites
    for node in graph.nodes:
        if not _is_cast(node, caps) or node.name in taken:
            continue
        rep = _producer_fold(graph, node, caps)
        if rep is not None and not any(n.name in taken for n in rep.absorbed):
            replacements.append(rep)
            taken.update(n.name for n in rep.absorbed)
            continue
        reps = _consumer_fold(graph, node, caps)
        if reps is not None and not any(n.name in taken for r in reps for n in r.absorbed):
            replacements += reps
            taken.add(node.name)
            taken.update(n.name for r in reps for n in r.absorbed)
    if replacements:
        log.debug("fuse_casts: %d rewrites", len(replacements))
    return rebuild(graph, replacements)
