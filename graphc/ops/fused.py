"""The Fused op (graphc domain): registration of the IR's fused node (graphc.ir.fused).

Its inference (here) and numpy kernel (graphc.runtime.reference.fused) run the anchor's and the
epilogue ops' own definitions, so a fused node means exactly what the nodes it replaced meant.
"""

from __future__ import annotations

from graphc.ir.fused import ACC, FUSED_DOMAIN, IN, OP, EpilogueOp, FusedAttrs, Ref
from graphc.ir.registry import Category, InferContext, get_op, register_op
from graphc.runtime.reference.fused import resolve

__all__ = ["ACC", "FUSED_DOMAIN", "IN", "OP", "EpilogueOp", "FusedAttrs", "Ref"]


def _fused_infer(ctx: InferContext):
    a: FusedAttrs = ctx.attrs
    acc_t = None
    if a.anchor_op is not None:
        anchor = get_op(a.anchor_op, a.anchor_domain)
        sub = InferContext(
            op=a.anchor_op,
            node_name=ctx.node_name,
            attrs=a.anchor_attrs,
            input_types=ctx.input_types[: a.anchor_inputs],
            input_values=ctx.input_values[: a.anchor_inputs],
            num_outputs=1,
        )
        acc_t = anchor.infer(sub)[0]
    types: list = []
    for e in a.epilogue:
        opdef = get_op(e.op)
        arg_types = [resolve(r, acc_t, ctx.input_types, types) for r in e.args]
        sub = InferContext(
            op=e.op,
            node_name=ctx.node_name,
            attrs=e.attrs,
            input_types=arg_types,
            input_values=[None] * len(arg_types),
            num_outputs=1,
        )
        types.append(opdef.infer(sub)[0])
    return [resolve(r, acc_t, ctx.input_types, types) for r in a.outputs]


register_op(
    "Fused",
    domain=FUSED_DOMAIN,
    attrs=FusedAttrs,
    category=Category.FUSED,
    infer=_fused_infer,
    doc="An anchor op (or none) with an epilogue DAG of elementwise ops.",
)
