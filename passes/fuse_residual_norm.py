"""Row-norm epilogues: a GEMM's fused epilogue (bias, residual) followed by the LayerNorm or
RMSNorm of its rows becomes one fused node, so one kernel writes both h and norm(h):

    h = Fused[MatMul|Gemm](x, W, ...)        # bias + residual in the epilogue
    y = LayerNormalization(h, scale, bias)   # over the last axis
    ->  (h, y) = Fused[MatMul|Gemm](x, W, ..., scale, bias){epilogue + LayerNormalization}

h stays an output (the next residual reads it in pre-LN models; in post-LN ones nothing does and
it is scratch of the GEMM's kernel). The GEMM kernel normalizes each band of rows once the band's
last column tile is stored (codegen/families/gemm.py, gemm_common.cu.j2 rownorm_finish), which
saves the normalization's launch. Only where that pays off and fits: rows of at most
ROWNORM_MAX_N columns (a row in registers), and at most MAX_ROWS rows (batch-1-like problems,
where a launch costs as much as the normalization; larger GEMMs keep the Hopper TMA GEMM, which has
no such epilogue). On sm_90 the fused step runs on the cp.async wgmma kernel with cluster split-K
(codegen/families/gemm_sm90.py rownorm_params), elsewhere on mma.sync or SIMT. Off by default
(Target.row_norm_epilogues: measured slower at batch 1 on an H200).
"""

from __future__ import annotations

import logging
import math

import numpy as np

from graphc.ir.fused import FUSED_DOMAIN, IN, OP, EpilogueOp, FusedAttrs
from graphc.ir.graph import Graph, Node
from graphc.ir.types import TensorType
from graphc.passes.rewrite import RewriteContext, Rewritten, rewrite_graph

log = logging.getLogger(__name__)

NORMS = ("LayerNormalization", "RMSNormalization")
ANCHORS = {("", "MatMul"), ("", "Gemm"), ("graphc", "MatMul")}
MAX_N = 1024  # = codegen's ROWNORM_MAX_N
MAX_ROWS = 2048


def _norm_after(graph: Graph, node: Node) -> tuple[Node, Node | None] | None:
    """The row norm that reads `node`'s output (directly or through a Reshape that keeps the last
    dim, as GPT-2's Conv1D leaves it), and that Reshape, where the pair can become one kernel."""
    if node.op != "Fused" or node.domain != FUSED_DOMAIN or len(node.outputs) != 1:
        return None
    a: FusedAttrs = node.attrs
    if (a.anchor_domain, a.anchor_op) not in ANCHORS or len(a.outputs) != 1:
        return None
    h = node.outputs[0]
    t = h.type
    if not isinstance(t, TensorType) or not t.is_static or len(t.static_shape) < 2:
        return None
    shape = t.static_shape
    n, rows = shape[-1], math.prod(shape[:-1])
    if n > MAX_N or rows > MAX_ROWS or not t.dtype.is_float:
        return None
    found = []
    for u in graph.users(h.name):
        if u.op in NORMS and u.domain == "" and u.inputs[0].name == h.name:
            found.append((u, None))
        elif u.op == "Reshape" and u.domain == "" and _keeps_last(u, n):
            found += [(w, u) for w in graph.users(u.outputs[0].name) if w.op in NORMS and w.domain == ""]
    if len(found) != 1:
        return None
    norm, view = found[0]
    rank = len(norm.outputs[0].type.static_shape) if norm.outputs[0].type.is_static else 0
    if norm.attrs.axis not in (-1, rank - 1) or any(
        graph.users(o.name) or graph.is_output(o.name) for o in norm.outputs[1:]
    ):
        return None  # another axis, or its Mean / InvStdDev are used
    params = [v for v in norm.inputs[1:] if v is not None]
    if not params or any(graph.const(v.name) is None or graph.const(v.name).size != n for v in params):
        return None  # scale (and bias) must be constants of one value per column
    if norm.outputs[0].type.dtype != t.dtype:
        return None
    return norm, view


def _keeps_last(reshape: Node, n: int) -> bool:
    t = reshape.outputs[0].type
    return isinstance(t, TensorType) and t.is_static and len(t.static_shape) >= 2 and t.static_shape[-1] == n


def fuse_residual_norm(graph: Graph) -> Graph:
    """Fused GEMM + its rows' LayerNorm/RMSNorm -> one fused node with outputs (h, norm(h))."""
    pairs = {n.name: found for n in graph.nodes if (found := _norm_after(graph, n)) is not None}
    if not pairs:
        return graph
    made = {}

    def visit(node: Node, ctx: RewriteContext):
        found = pairs.get(node.name)
        if found is not None:
            norm, view = found
            a: FusedAttrs = node.attrs
            ins = [ctx.new(v) for v in node.inputs]
            k = len(ins)
            params = [v for v in norm.inputs[1:] if v is not None]
            epilogue = (
                *a.epilogue,
                EpilogueOp(norm.op, norm.attrs, (a.outputs[0], *(IN(k + i) for i in range(len(params))))),
            )
            attrs = FusedAttrs(
                anchor_op=a.anchor_op,
                anchor_domain=a.anchor_domain,
                anchor_attrs=a.anchor_attrs,
                anchor_inputs=a.anchor_inputs,
                epilogue=epilogue,
                outputs=(a.outputs[0], OP(len(epilogue) - 1)),
            )
            fused = ctx.b.add_node(
                "Fused",
                [*ins, *(ctx.new(v) for v in params)],
                attrs,
                name=node.name,
                outputs=[node.outputs[0].name, norm.outputs[0].name if view is None else f"{node.name}/norm"],
                domain=FUSED_DOMAIN,
                keep_name=True,
            )
            y = fused.outputs[1]
            if view is not None:  # the norm read a view of h: the same view of norm(h)
                dims = ctx.b.add_constant(np.array(norm.outputs[0].type.static_shape, dtype=np.int64))
                y = ctx.b.op("Reshape", [y, dims], name=f"{node.name}/norm_view")
            made[norm.name] = y
            return Rewritten([fused.outputs[0]], [node, norm])
        if node.name in made:
            return Rewritten([made[node.name]], None)
        return None

    out = rewrite_graph(graph, visit)
    log.info("fuse_residual_norm: %d GEMM + row norm pair(s) in one kernel", len(pairs))
    return out
