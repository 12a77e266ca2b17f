"""Op families the passes ask about, derived from the op registry's traits instead of lists typed
into each pass (a list typed in goes stale when an op is added)."""

from __future__ import annotations

import functools

from graphc.ir.attrs import attr_fields
from graphc.ir.graph import Node
from graphc.ops.registry import Category, all_ops


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
