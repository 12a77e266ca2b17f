"""Op definitions: type inference and a numpy reference for every op graphc supports.

Importing this package registers every op family below into the IR's registry
(graphc.ir.registry, re-exported as graphc.ops.registry). The IR never imports this package: the
frontend, the compiler and the interpreter load it (`load()`, or any import of graphc.ops).
"""

from graphc.ops import (  # noqa: F401  (each module registers its ops on import)
    attention,
    control_flow,
    data_movement,
    deform_conv,
    elementwise,
    fused,
    internal,
    layout_ops,
    linalg,
    losses,
    ml,
    nn,
    normalization,
    optional,
    quantize,
    recurrent,
    reduction,
    sampling,
    sequence,
    shape_ops,
    tfidf,
)
from graphc.ops.registry import Category, InferContext, OpDef, all_ops, get_op, has_op, register_op

__all__ = ["Category", "InferContext", "OpDef", "all_ops", "get_op", "has_op", "load", "register_op"]


def load() -> None:
    """Make sure every op family is registered. Importing this package already did it; callers
    that only hold IR objects call this to say where the op library comes from."""
