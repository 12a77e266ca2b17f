"""TensorScatter (opset 24's KV-cache write) as ScatterElements, for the CUDA target (whose data
kernels scatter elements but have no TensorScatter):

    present = scatter_elements(past, idx, update, axis)
    idx[b, .., s, ..] = write_indices[b] + s            (mode linear)
                      = (write_indices[b] + s) mod L    (mode circular, L the cache's length)

idx has the update's shape: the positions of each batch row's update rows, broadcast over the
other axes. Exact (elements are moved, not computed). Where shapes are not static the node stays
(and has no CUDA kernel; `graphc check --target cuda` says so). On CUDA a linear-mode position
outside the cache is not checked: ScatterElements' kernel skips a position past the end and counts
a negative one from the end; the CPU target and the interpreter raise an error there instead
(graphc/support.py notes it).
"""

from __future__ import annotations

import logging

import numpy as np

from graphc.ir.graph import Graph, Node
from graphc.passes.fuse_util import is_onnx, static_dims
from graphc.passes.rewrite import RewriteContext, Rewritten, rewrite_graph

log = logging.getLogger(__name__)


def _decompose(g: Graph, node: Node, ctx: RewriteContext) -> Rewritten | None:
    if not is_onnx(node, "TensorScatter"):
        return None
    past, upd = node.inputs[0], node.inputs[1]
    write = node.inputs[2] if len(node.inputs) > 2 else None
    ps, us = static_dims(past), static_dims(upd)
    if ps is None or us is None:
        return None
    rank = len(ps)
    axis = node.attrs.axis + rank if node.attrs.axis < 0 else node.attrs.axis
    b, name = ctx.b, node.name
    rows = np.arange(us[axis], dtype=np.int64).reshape([us[axis] if d == axis else 1 for d in range(rank)])
    pos = b.add_constant(rows, f"{name}/rows")
    if write is not None:
        col = b.add_constant(np.array([ps[0]] + [1] * (rank - 1), np.int64), f"{name}/batch_column")
        w = b.op("Reshape", [ctx.mapv(write), col], name=f"{name}/write_column")
        pos = b.op("Add", [w, pos], name=f"{name}/positions")
    if node.attrs.mode == "circular":
        pos = b.op("Mod", [pos, b.add_constant(np.array(ps[axis], np.int64), f"{name}/length")], name=f"{name}/wrap")
    idx = b.op("Expand", [pos, b.add_constant(np.array(us, np.int64), f"{name}/shape")], name=f"{name}/indices")
    out = b.op("ScatterElements", [ctx.mapv(past), idx, ctx.mapv(upd)], {"axis": axis}, name=name)
    log.debug("%s: TensorScatter -> ScatterElements along axis %d", name, axis)
    return Rewritten([out], [node])


def decompose_tensor_scatter(graph: Graph) -> Graph:
    """Every TensorScatter with static shapes as above."""
    return rewrite_graph(graph, lambda node, ctx: _decompose(graph, node, ctx))
