"""Slab views: ops whose output is a contiguous run of their input's bytes, lowered to an alias
step at a byte offset (no kernel, no memory of its own).

`Gather(x, i)` with a constant scalar index i on an axis that only 1-sized dims precede reads
x[..., i, ...] = one contiguous slab of x; the horizontal GEMM fusion (passes/fuse_horizontal.py)
splits its [3, M, N] Q/K/V result this way. The slab must start at a multiple of the arena
alignment, so that kernels reading the view keep their aligned (vector) loads; otherwise it
stays a Gather kernel.
"""

from __future__ import annotations

import math

import numpy as np

from graphc.ir.graph import Graph, Node
from graphc.ir.types import TensorType
from graphc.runtime.plan import ALIGNMENT


def slab_offset(graph: Graph, node: Node) -> int | None:
    """The byte offset of `node`'s output within its first input, where the output is a slab view
    of it; else None."""
    if node.domain != "" or node.op != "Gather" or len(node.inputs) != 2 or len(node.outputs) != 1:
        return None
    data, index = node.inputs
    if data is None or index is None or index.name not in graph.constants:
        return None
    t = data.type
    if not isinstance(t, TensorType) or not t.is_static:
        return None
    idx = np.asarray(graph.constants[index.name].data)
    if idx.ndim != 0 or not np.issubdtype(idx.dtype, np.integer):
        return None
    shape = t.static_shape
    axis = node.attrs.axis % len(shape) if shape else 0
    if not shape or math.prod(shape[:axis]) != 1:
        return None
    i = int(idx)
    if i < 0:
        i += shape[axis]
    if not 0 <= i < shape[axis]:
        return None
    offset = i * math.prod(shape[axis + 1 :]) * t.dtype.itemsize
    return offset if offset % ALIGNMENT == 0 else None
