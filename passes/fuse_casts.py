"""Casts inside the kernels next to them: no kernel of its own for a dtype conversion.

The precision pass (passes/precision.py) puts a Cast at every fp32 input and output of an fp16
or bf16 engine, after fusion has run; exporters leave Casts between ops too. Each was a kernel
that reads and writes the whole tensor (GPT-2's fp32 logits at batch 32: 0.53 ms of a 3.2 ms
replay, after the LM head's GEMM). Two rules, tried in this order:

    cast(p(x))  -> Fused[p](x) {.. ; Cast(last)}    the producer's store writes the cast dtype
    u(.., cast(x), ..) -> Fused(.., x, ..) {Cast(in_k); ..}   the consumer's load casts

The producer rule takes a Cast whose input is made by a Fused node with one output (any anchor
whose kernel stores through the epilogue hook: GEMM, conv, pools, reductions and row-wise ops,
or none) or by such an anchor standing alone: the Cast becomes the epilogue's last op, so the
kernel computes in its own dtype and stores the cast one. Where that value is also read
elsewhere (or is a graph output: BERT's last hidden state, cast to fp32 and read by the pooler),
the kernel stores both, if its family stores several outputs (GEMM, reduction and row-wise,
elementwise). The consumer rule takes a Cast whose every reader is a fused elementwise node, or
a fused node that reads it only in its epilogue (never as an anchor operand: the GEMM/conv
operand loads are typed by the anchor's dtype): each reader loads the Cast's input and casts it
as its first op, and the Cast goes away.

Bit for bit what the separate Cast gave: codegen/epilogue.py rounds a 16-bit value to its type
before a Cast reads it and after a Cast makes it, so fp16 -> fp32 after a GEMM stores
float(half(acc)), and fp32 -> fp16 before an elementwise op feeds it half(x), exactly as a
stored fp16 tensor would (the CPU engine's fused node runs the ops' numpy references, which round
every op anyway). Not folded: a Cast after an Attention, Gather, Transpose or another data
movement kernel (their templates move elements without an epilogue), after a node with several
outputs (LayerNormalization with its Mean output, a row-norm GEMM), or after a conv or pool
whose value someone else also reads (their templates store one output).
"""

from __future__ import annotations

import logging
from dataclasses import replace

from graphc.ir.graph import Graph, Node
from graphc.ops.fused import ACC, FUSED_DOMAIN, OP, EpilogueOp, FusedAttrs, Ref
from graphc.ops.internal import INTERNAL_DOMAIN
from graphc.ops.layout_ops import LAYOUT_DOMAIN
from graphc.ops.reduction import REDUCE_OPS
from graphc.passes.capabilities import REFERENCE, FusionCapabilities
from graphc.passes.fold_common import Replacement, rebuild
from graphc.passes.fuse_common import supported_value

log = logging.getLogger(__name__)

# Ops whose kernels store their result through the fused epilogue hook (codegen/epilogue.py),
# standing alone or as a Fused node's anchor: the GEMM, conv, pool and reduction families.
# The reduction family's ops (codegen/families/reduction.py: Reduce*, the global pools, the
# row-wise Softmax and normalizations).
REDUCTION_OPS = (
    *sorted(REDUCE_OPS),
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
GEMMS = frozenset({("", "Gemm"), ("", "MatMul"), (INTERNAL_DOMAIN, "MatMul")})
EPILOGUE_ANCHORS = frozenset(
    GEMMS
    | {("", "Conv"), (LAYOUT_DOMAIN, "ConvNHWC"), ("", "MaxPool"), ("", "AveragePool")}
    | {(LAYOUT_DOMAIN, f"{op}NHWC") for op in ("MaxPool", "AveragePool", "GlobalMaxPool", "GlobalAveragePool")}
    | {("", op) for op in REDUCTION_OPS}
)
# Anchors whose kernels store several outputs of different dtypes through the epilogue hook: the
# GEMM and reduction families (and the elementwise one); the conv and pool templates store one.
MULTI_OUTPUT_ANCHORS = GEMMS | {("", op) for op in REDUCTION_OPS}


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
    if p is None:
        return None
    anchor = _anchor_of(p)
    if anchor is None:
        return None
    # Read by the Cast alone: the kernel stores the cast dtype only. Read elsewhere too (or a
    # graph output): the kernel stores both, where its family stores several outputs.
    alone = not graph.is_output(x.name) and len(graph.users(x.name)) == 1
    if not alone and anchor[0] is not None and (anchor[1], anchor[0]) not in MULTI_OUTPUT_ANCHORS:
        return None
    out_t = cast.outputs[0].ttype
    if not caps.fuses_epilogue(_kind(*anchor), "Cast", out_t.dtype) or not supported_value(x, caps):
        return None
    if p.op == "Fused" and p.domain == FUSED_DOMAIN:
        a: FusedAttrs = p.attrs
        j = len(a.epilogue)
        attrs = replace(a, epilogue=(*a.epilogue, EpilogueOp("Cast", cast.attrs, (a.outputs[0],))),
                        outputs=(OP(j),) if alone else (a.outputs[0], OP(j)))  # fmt: skip
        inputs = list(p.inputs)
    else:
        inputs = list(p.inputs)
        while inputs and inputs[-1] is None:  # a fused node's input list cannot end in an omitted input
            inputs.pop()
        if any(v is None for v in inputs):
            return None  # an omitted input in the middle
        attrs = FusedAttrs(
            anchor_op=p.op,
            anchor_domain=p.domain,
            anchor_attrs=p.attrs,
            anchor_inputs=len(inputs),
            epilogue=(EpilogueOp("Cast", cast.attrs, (ACC,)),),
            outputs=(OP(0),) if alone else (ACC, OP(0)),
        )
    names = [cast.outputs[0].name] if alone else [x.name, cast.outputs[0].name]

    def emit(b, mapv):
        # At the producer's place: everything it reads is made before it, and the readers of
        # both its value and the Cast's come after.
        node = b.add_node(
            "Fused", [mapv(v) for v in inputs], attrs, name=p.name, keep_name=True, outputs=names, domain=FUSED_DOMAIN
        )
        return [node.outputs[-1]] if alone else [node.outputs[0]]

    return Replacement(p.name, emit, (p, cast))


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
