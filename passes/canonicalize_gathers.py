"""A Gather or GatherND with constant indices that reads every element of its data once, in order,
is a Reshape: a view, no kernel.

Rules (named by their algebra):

- GATHER_ARANGE     gather(x, c, axis) -> reshape(x, out) when c, flattened, is 0, 1, ..., n - 1
  with n = x.shape[axis] (negative indices counted from the end)
- GATHER_ND_ARANGE  gather_nd(x, c) (batch_dims 0) -> reshape(x, out) when the index tuples of c,
  in row-major order, are every index of x's first k dims in row-major order

Where they come from: the exporters spell the attention mask's broadcast
``mask[:, None, None, :]`` as index arithmetic that constant folding turns into such a gather
(the TorchScript export of BERT and GPT-2: a Gather of the flattened mask by arange(seq); the
dynamo export: a GatherND by all the (0, j) pairs). Each was a kernel of its own at every run.
"""

from __future__ import annotations

import logging

import numpy as np

from graphc.ir.graph import Graph, Node
from graphc.passes.rewrite import RewriteContext, Rewritten, rewrite_graph

log = logging.getLogger(__name__)


def _static_shape(v) -> tuple[int, ...] | None:
    t = v.ttype
    return tuple(t.shape) if t.shape is not None and all(isinstance(d, int) for d in t.shape) else None


def reads_in_order(op: str, data_shape: tuple[int, ...], idx: np.ndarray, axis: int = 0) -> bool:
    """Whether Gather (op "Gather", along `axis`) or GatherND (batch_dims 0) with indices `idx` on
    data of `data_shape` lists every element of the data once, in the data's own order."""
    idx = np.asarray(idx).astype(np.int64)
    if op == "Gather":
        n = data_shape[axis]
        flat = idx.reshape(-1)
        flat = np.where(flat < 0, flat + n, flat)
        return flat.size == n and bool(np.array_equal(flat, np.arange(n)))
    if idx.ndim < 1:
        return False
    k = idx.shape[-1]
    if k < 1 or k > len(data_shape):
        return False
    dims = np.array(data_shape[:k], dtype=np.int64)
    tuples = idx.reshape(-1, k)
    tuples = np.where(tuples < 0, tuples + dims, tuples)
    want = np.indices(data_shape[:k]).reshape(k, -1).T
    return tuples.shape == want.shape and bool(np.array_equal(tuples, want))


def _gather_to_reshape(g: Graph, node: Node, ctx: RewriteContext) -> Rewritten | None:
    if node.domain or node.op not in ("Gather", "GatherND") or len(node.outputs) != 1:
        return None
    x, ids = node.inputs[0], node.inputs[1]
    idx = g.const(ids.name)
    xs, ys = _static_shape(x), _static_shape(node.outputs[0])
    if idx is None or xs is None or ys is None or not idx.size:
        return None
    if node.op == "Gather":
        axis = node.attrs.axis + len(xs) if node.attrs.axis < 0 else node.attrs.axis
        if not reads_in_order("Gather", xs, idx, axis):
            return None
    elif node.attrs.batch_dims != 0 or not reads_in_order("GatherND", xs, idx):
        return None
    b = ctx.b
    shape = b.add_constant(np.array(ys, dtype=np.int64), f"{node.name}/shape")
    y = b.op("Reshape", [ctx.mapv(x), shape], name=f"{node.name}/view")
    log.debug("%s: %s reads its data in order -> Reshape", node.name, node.op)
    return Rewritten([y], [node])


def gathers_to_views(graph: Graph) -> Graph:
    """Replace every Gather/GatherND that reads its whole data in order by a Reshape."""

    def visit(node: Node, ctx: RewriteContext) -> Rewritten | None:
        return _gather_to_reshape(graph, node, ctx)

    return rewrite_graph(graph, visit)
