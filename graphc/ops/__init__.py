"""Op definitions: type inference and a numpy reference for every op graphc supports.

Importing this package registers every op family below with `graphc.ops.registry`.
"""

from graphc.ops import (  # noqa: F401  (each module registers its ops on import)
    attention,
    data_movement,
    elementwise,
    fused,
    internal,
    layout_ops,
    linalg,
    losses,
    nn,
    normalization,
    quantize,
    reduction,
    sequence,
    shape_ops,
)
from graphc.ops.registry import Category, InferContext, OpDef, all_ops, get_op, has_op, register_op

__all__ = ["Category", "InferContext", "OpDef", "all_ops", "get_op", "has_op", "register_op"]
