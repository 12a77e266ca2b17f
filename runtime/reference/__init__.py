"""The numpy reference kernels: what the interpreter runs for every op, and what a CPU engine runs.

They import nothing of the compiler (no onnx, no graphc.ir or graphc.ops), so a deployment that
runs a CPU engine needs only graphc.runtime. Importing this package registers every family below
into the closed kernel table (`get_kernel`); graphc.ops registers type inference and traits for
the same (domain, op) names.
"""

from graphc.runtime.reference import (  # noqa: E402, F401, I001  (each module registers its kernels on import)
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
    resize,
    sampling,
    sequence,
    shape_ops,
    tfidf,
)
from graphc.runtime.reference.registry import KernelFn, get_kernel, has_kernel, kernel_names, register_kernel

__all__ = ["KernelFn", "get_kernel", "has_kernel", "kernel_names", "register_kernel"]
