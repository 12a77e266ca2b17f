"""Op families the passes ask about, derived from the op registry's traits instead of lists typed
into each pass (a list typed in goes stale when an op is added)."""

from __future__ import annotations

import functools

from graphc.ir.attrs import attr_fields
from graphc.ir.graph import Node
from graphc.ops.registry import Category, all_ops, get_op, has_op


@functools.cache
def axes_reductions() -> frozenset[str]:
    """The ONNX reductions over an `axes` input (ReduceSum, ReduceMean, ReduceMax, ...): ops of
    category REDUCTION with the reduce family's `keepdims` and `noop_with_empty_axes` attributes
    (ArgMax, Softmax and the losses are REDUCTION too, but reduce one `axis` or none)."""
    return frozenset(
        o.op_type
        for o in all_ops()
        if o.domain == ""
        and o.category is Category.REDUCTION
        and {"keepdims", "noop_with_empty_axes"} <= set(attr_fields(o.attrs))
    )


def is_axes_reduction(node: Node) -> bool:
    return node.domain == "" and node.op in axes_reductions()


# Ops of category ELEMENTWISE that are not pure functions of their inputs' elements at one index:
# Dropout (a random mask in training form), BitCast (reinterprets bits; its element count can
# change with the element size), CastLike (its second input contributes a type, not elements).
# The registry has no finer trait for this, so the list lives here, once.
NOT_POINTWISE = frozenset({"Dropout", "BitCast", "CastLike"})


def is_pointwise(op: str, domain: str = "") -> bool:
    """An ONNX elementwise op that maps elements at one index to elements at the same index."""
    return domain == "" and op not in NOT_POINTWISE and has_op(op) and get_op(op).category is Category.ELEMENTWISE
