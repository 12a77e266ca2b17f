"""The op registry, re-exported: the mechanism lives with the IR (graphc.ir.registry).

Op families import from here or from graphc.ir.registry; both give the same objects.
"""

from graphc.ir.registry import (
    Category,
    ComputeFn,
    InferContext,
    InferFn,
    OpDef,
    ValueInferFn,
    all_ops,
    broadcast_infer,
    broadcast_shapes,
    get_op,
    has_op,
    register_op,
    same_as_input,
    sequence_of,
    tensor,
)

__all__ = [
    "Category",
    "ComputeFn",
    "InferContext",
    "InferFn",
    "OpDef",
    "ValueInferFn",
    "all_ops",
    "broadcast_infer",
    "broadcast_shapes",
    "get_op",
    "has_op",
    "register_op",
    "same_as_input",
    "sequence_of",
    "tensor",
]
