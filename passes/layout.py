"""Channels-last layout for the CUDA target: 2-D convolutions and pools run in NHWC.

The choice. Inside a CUDA engine every 2-D Conv (plain or the anchor of a Fused[Conv]) becomes
graphc.ConvNHWC, and the 2-D pools next to them become graphc.{Max,Average}PoolNHWC and
graphc.Global{Average,Max}PoolNHWC. Why NHWC: the implicit-GEMM convolution reduces over
(R, S, C); with C innermost, the reduction dimension is contiguous in memory for the activations
(16-byte loads of 8 channels when C % 8 == 0) and, with weights laid out (K, R, S, C/group), for
the weights too, which is the layout tensor cores want (both GEMM operands K-major). NCHW would
make each GEMM row a strided gather. Weights are re-laid-out once at compile time: a Transpose of
the constant weight, which constant folding evaluates. The graph's inputs and outputs keep their
NCHW layout (the model's contract), so layout changes happen only at the edges.

How. Each converted op is wrapped as Transpose(0,2,3,1) -> op_NHWC -> Transpose(0,3,1,2); a
Fused[Conv]'s extra epilogue inputs get the same Transpose (per-channel constants of shape
(1,C,1,1) or (C,1,1) fold to (1,1,1,C)). Then cleanup and transpose elimination
(passes/transpose.py) cancel the pairs between consecutive NHWC ops: Transpose(0,3,1,2) followed
by Transpose(0,2,3,1) merges to nothing, and transposes move through elementwise ops (Relu, the
residual Add) and reductions to meet each other. This pass also moves them through
Fused[Elementwise] nodes, which transpose elimination does not look into, and through elementwise
joins of two NHWC branches (see push_through_pointwise). What remains are the
transposes at the graph's edges (and around ops that have no NHWC form).

An inference BatchNormalization next to a converted convolution (left where BatchNorm folding
did not run, e.g. at opt_level 1) becomes x * s + t with per-channel constants, which transposes
move through.

Pools are converted only where they touch the NHWC region: when a path through elementwise ops
leads from or to a convolution being converted (a lone pool on an NCHW graph would only gain two
transposes).

In the pipeline (passes/pipeline.py) for target="cuda", after fusion (fusion must have made its
Fused[Conv] nodes first: epilogue fusion anchors on the ONNX Conv, not on graphc.ConvNHWC).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np

from graphc.ir.builder import GraphBuilder
from graphc.ir.graph import Graph, Node, Value
from graphc.ir.types import DType, TensorType
from graphc.ops.fused import FUSED_DOMAIN, FusedAttrs
from graphc.ops.layout_ops import (
    LAYOUT_DOMAIN,
    TO_NCHW,
    TO_NHWC,
    AveragePoolNHWCAttrs,
    ConvNHWCAttrs,
    MaxPoolNHWCAttrs,
)
from graphc.ops.nn import window_geometry
from graphc.ops.registry import Category, get_op, has_op
from graphc.passes.op_traits import is_pointwise
from graphc.passes.rewrite import RewriteContext, Rewritten, rewrite_graph

log = logging.getLogger(__name__)

# Dtypes the NHWC kernels take; anything else keeps its NCHW op (and the NCHW kernel).
_DTYPES = frozenset({DType.float32, DType.float16, DType.bfloat16})
_POOLS = frozenset({"MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool"})
MAX_ROUNDS = 16
_WALK_LIMIT = 32  # nodes visited when looking for a neighboring convolution


def to_channels_last(graph: Graph) -> Graph:
    """Rewrite 2-D convolutions and their neighboring pools to NHWC ops, then cancel the
    transposes between them. Returns `graph` itself when there is nothing to convert."""
    g = _convert(graph)
    if g is graph:
        return graph
    return cancel_transposes(g)


def cancel_transposes(graph: Graph) -> Graph:
    """Cleanup, transpose elimination and the pointwise push, to a fixed point."""
    from graphc.passes.pipeline import cleanup
    from graphc.passes.transpose import eliminate_transposes

    passes: list[Callable[[Graph], Graph]] = [p.fn for p in cleanup().passes]
    passes += [eliminate_transposes, push_through_pointwise]
    g = graph
    for _ in range(MAX_ROUNDS):
        before = g
        for fn in passes:
            g = fn(g)
        if g is before:
            break
    else:
        log.warning("to_channels_last: no fixed point after %d rounds", MAX_ROUNDS)
    return g


# ---- which nodes convert -----------------------------------------------------------------------


def _tensor_type(v: Value | None) -> TensorType | None:
    if v is None or not isinstance(v.type, TensorType) or not v.type.is_static:
        return None
    return v.type


def _is_2d(v: Value | None) -> bool:
    t = _tensor_type(v)
    return t is not None and len(t.shape) == 4 and t.dtype in _DTYPES


def _conv_parts(node: Node) -> tuple[object, int] | None:
    """(ONNX Conv attrs, anchor input count) of a Conv or Fused[Conv] node, else None."""
    if node.domain == "" and node.op == "Conv":
        return node.attrs, len(node.inputs)
    if node.domain == FUSED_DOMAIN and node.op == "Fused":
        a: FusedAttrs = node.attrs
        if a.anchor_op == "Conv" and a.anchor_domain == "":
            return a.anchor_attrs, a.anchor_inputs
    return None


def _convertible_conv(graph: Graph, node: Node) -> bool:
    parts = _conv_parts(node)
    if parts is None:
        return False
    x, w = node.input(0), node.input(1)
    if not (_is_2d(x) and _is_2d(w)) or graph.const(w.name) is None:
        return False
    return all(_tensor_type(o) is not None and len(o.type.shape) == 4 for o in node.outputs)


def _pool_op(node: Node) -> str | None:
    if node.domain != "" or node.op not in _POOLS or not _is_2d(node.input(0)):
        return None
    if len(node.outputs) != 1:  # MaxPool's Indices are NCHW flat indices: keep the ONNX op
        return None
    if node.op == "MaxPool" and node.input(0).type.dtype not in _DTYPES:
        return None
    return node.op


def _inference_bn(graph: Graph, node: Node) -> bool:
    """An inference-mode 4-D BatchNormalization with constant statistics and affine params."""
    if node.domain != "" or node.op != "BatchNormalization" or len(node.outputs) != 1:
        return False
    if node.attrs.training_mode or not _is_2d(node.input(0)):
        return False
    return all(v is not None and graph.const(v.name) is not None for v in node.inputs[1:5])


def _passes_layout(graph: Graph, node: Node) -> bool:
    """Elementwise nodes (plain or fused) that a transpose moves through."""
    if _inference_bn(graph, node):
        return True
    if node.domain == "" and has_op(node.op) and get_op(node.op).category is Category.ELEMENTWISE:
        return True
    if node.domain == "" and node.op == "Transpose":
        return True
    return node.domain == FUSED_DOMAIN and node.op == "Fused" and node.attrs.anchor_op is None


def _near_conv(graph: Graph, node: Node, convs: set[str]) -> bool:
    """Whether a path through elementwise nodes links `node` with a node of the NHWC region."""
    seen: set[str] = set()
    todo: list[Node] = [node]
    while todo and len(seen) < _WALK_LIMIT:
        n = todo.pop()
        if n.name in seen:
            continue
        seen.add(n.name)
        nxt: list[Node] = []
        for v in n.inputs:
            p = None if v is None else graph.producer(v.name)
            if p is not None:
                nxt.append(p)
        for o in n.outputs:
            nxt.extend(graph.users(o.name))
        for m in nxt:
            if m.name in convs:
                return True
            if _passes_layout(graph, m) and m.name not in seen:
                todo.append(m)
    return False


# ---- the rewrite -------------------------------------------------------------------------------


def _convert(graph: Graph) -> Graph:
    convs = {n.name for n in graph.nodes if _convertible_conv(graph, n)}
    if not convs:
        return graph
    # Pools and BatchNorms next to the NHWC region join it; a pool that joins extends the region
    # for its neighbors (conv -> maxpool -> avgpool), so repeat until nothing more joins.
    region = set(convs)
    while True:
        joined = {
            n.name
            for n in graph.nodes
            if n.name not in region and (_pool_op(n) or _inference_bn(graph, n)) and _near_conv(graph, n, region)
        }
        if not joined:
            break
        region |= joined
    pools = {n.name for n in graph.nodes if n.name in region and _pool_op(n)}
    bns = {n.name for n in graph.nodes if n.name in region and _inference_bn(graph, n)}

    def visit(node: Node, ctx: RewriteContext) -> Rewritten | None:
        outs = None
        if node.name in convs:
            outs = _rewrite_conv(graph, node, ctx.b, ctx.new)
        elif node.name in pools:
            outs = _rewrite_pool(node, ctx.b, ctx.new)
        elif node.name in bns:
            outs = _bn_to_affine(graph, node, ctx.b, ctx.new)
        return None if outs is None else Rewritten(outs, (node,))

    # No dead code elimination here: the transposes' cleanup (cancel_transposes) does it.
    return rewrite_graph(graph, visit, dce=False)


def _to_nhwc(b: GraphBuilder, v: Value, name: str) -> Value:
    return b.op("Transpose", [v], {"perm": list(TO_NHWC)}, name=f"{name}/to_nhwc")


def _to_nchw(b: GraphBuilder, v: Value, name: str) -> Value:
    return b.op("Transpose", [v], {"perm": list(TO_NCHW)}, name=f"{name}/to_nchw")


def _epilogue_input(b: GraphBuilder, v: Value, name: str) -> Value | None:
    """An epilogue input broadcast against the NCHW output, re-laid-out for the NHWC output:
    aligned to rank 4 and transposed (constants fold; a per-channel (C,1,1) becomes (1,1,1,C))."""
    t = _tensor_type(v)
    if t is None or len(t.shape) > 4:
        return None
    if t.numel == 1:
        return v  # a scalar broadcasts the same in any layout
    if len(t.shape) < 4:
        aligned = (1,) * (4 - len(t.shape)) + tuple(t.shape)
        shape = b.add_constant(np.array(aligned, dtype=np.int64), f"{name}/rank4")
        v = b.op("Reshape", [v, shape], name=f"{name}/rank4")
    return _to_nhwc(b, v, name)


def _conv_attrs(graph: Graph, node: Node, onnx_attrs, x: TensorType, w: TensorType) -> ConvNHWCAttrs | None:
    kernel = tuple(int(k) for k in w.shape[2:])

    def fail(msg: str):
        raise ValueError(msg)

    try:
        geom = window_geometry(onnx_attrs, x.shape[2:], kernel, fail)
    except ValueError:
        return None
    if None in geom.pads_begin or None in geom.pads_end:
        return None
    return ConvNHWCAttrs(
        kernel_shape=kernel,
        strides=tuple(geom.strides),
        pads=(*geom.pads_begin, *geom.pads_end),
        dilations=tuple(geom.dilations),
        group=int(onnx_attrs.group),
    )


def _zero_pad_of(graph: Graph, v: Value, user: Node) -> tuple[Value, tuple[int, ...]] | None:
    """(x, spatial pads begin+end) where v = Pad(x) pads only the spatial axes of a 4-D x with
    zeros, and `user` is v's only reader: the pads can go into the convolution."""
    p = graph.producer(v.name)
    if p is None or p.domain != "" or p.op != "Pad" or p.attrs.mode != "constant":
        return None
    if graph.users(v.name) != [user] or graph.is_output(v.name):
        return None
    pads = None if p.input(1) is None else graph.const(p.input(1).name)
    if pads is None or pads.size != 8 or (p.input(3) is not None):
        return None
    value = None if p.input(2) is None else graph.const(p.input(2).name)
    if p.input(2) is not None and (value is None or value.size != 1 or float(value.reshape(-1)[0]) != 0.0):
        return None
    pads = [int(i) for i in pads]
    if pads[0] or pads[1] or pads[4] or pads[5] or min(pads) < 0:
        return None
    return p.inputs[0], (pads[2], pads[3], pads[6], pads[7])


def _rewrite_conv(graph: Graph, node: Node, b: GraphBuilder, new) -> list[Value] | None:
    onnx_attrs, n_anchor = _conv_parts(node)  # type: ignore[misc]
    x, w = node.input(0), node.input(1)
    attrs = _conv_attrs(graph, node, onnx_attrs, x.type, w.type)
    if attrs is None:
        return None
    folded = _zero_pad_of(graph, x, node)
    if folded is not None and _is_2d(folded[0]):
        # conv(pad(x, zeros)) -> conv(x) with the pads added to the convolution's own
        x = folded[0]
        attrs = attrs.replace(pads=tuple(a + e for a, e in zip(attrs.pads, folded[1], strict=True)))
    xt = _to_nhwc(b, new(x), node.name)
    wt = b.op("Transpose", [new(w)], {"perm": list(TO_NHWC)}, name=f"{node.name}/weight_krsc")
    ins: list[Value | None] = [xt, wt, *(new(v) for v in node.inputs[2:n_anchor])]
    if node.op == "Conv":
        y = b.add_node("ConvNHWC", ins, attrs, name=node.name, domain=LAYOUT_DOMAIN, keep_name=True)
        return [_to_nchw(b, y.outputs[0], node.name)]
    fa: FusedAttrs = node.attrs
    out_t = node.outputs[0].type
    for o in node.outputs:
        if o.type.shape != out_t.shape:
            return None  # an output that is not the conv's full result: the layout would differ
    for i in range(n_anchor, len(node.inputs)):
        v = node.inputs[i]
        if v is None:
            ins.append(None)
            continue
        nv = _epilogue_input(b, new(v), f"{node.name}/in{i}")
        if nv is None:
            return None
        ins.append(nv)
    na = FusedAttrs(
        anchor_op="ConvNHWC",
        anchor_domain=LAYOUT_DOMAIN,
        anchor_attrs=attrs,
        anchor_inputs=n_anchor,
        epilogue=fa.epilogue,
        outputs=fa.outputs,
    )
    y = b.add_node(
        "Fused",
        ins,
        na,
        name=node.name,
        domain=FUSED_DOMAIN,
        outputs=[f"{o}/nhwc" for o in node.output_names],
        keep_name=True,
    )
    return [_to_nchw(b, o, f"{node.name}/out{k}") for k, o in enumerate(y.outputs)]


def _bn_to_affine(graph: Graph, node: Node, b: GraphBuilder, new) -> list[Value]:
    """batchnorm(x) -> x * s + t, s = scale / sqrt(var + eps), t = bias - mean * s, per channel
    (computed here in float64: the statistics may have another dtype than x)."""
    scale, bias, mean, var = (graph.const(v.name).astype(np.float64) for v in node.inputs[1:5])
    s = scale / np.sqrt(var + float(node.attrs.epsilon))
    t = bias - mean * s
    dt = node.input(0).type.dtype.numpy
    shape = (-1, 1, 1)
    sv = b.add_constant(s.reshape(shape).astype(dt), f"{node.name}/scale")
    tv = b.add_constant(t.reshape(shape).astype(dt), f"{node.name}/shift")
    y = b.op("Mul", [new(node.input(0)), sv], name=f"{node.name}/mul")
    return [b.op("Add", [y, tv], name=node.name)]


def _rewrite_pool(node: Node, b: GraphBuilder, new) -> list[Value] | None:
    x = node.input(0)
    xt = _to_nhwc(b, new(x), node.name)
    a = node.attrs
    if node.op in ("GlobalAveragePool", "GlobalMaxPool"):
        y = b.add_node(f"{node.op}NHWC", [xt], {}, name=node.name, domain=LAYOUT_DOMAIN, keep_name=True)
        return [_to_nchw(b, y.outputs[0], node.name)]

    def fail(msg: str):
        raise ValueError(msg)

    try:
        geom = window_geometry(a, x.type.shape[2:], a.kernel_shape, fail, ceil_mode=bool(a.ceil_mode))
    except ValueError:
        return None
    common = {
        "kernel_shape": tuple(geom.kernel),
        "strides": tuple(geom.strides),
        "pads": (*geom.pads_begin, *geom.pads_end),
        "dilations": tuple(geom.dilations),
        "ceil_mode": int(a.ceil_mode),
    }
    if node.op == "MaxPool":
        attrs = MaxPoolNHWCAttrs(**common)
    else:
        attrs = AveragePoolNHWCAttrs(**common, count_include_pad=int(a.count_include_pad))
    y = b.add_node(f"{node.op}NHWC", [xt], attrs, name=node.name, domain=LAYOUT_DOMAIN, keep_name=True)
    return [_to_nchw(b, y.outputs[0], node.name)]


# ---- transposes through Fused[Elementwise] -----------------------------------------------------


def _transposed_from_nhwc(graph: Graph, v: Value | None) -> Value | None:
    """x where v = Transpose(x, (0,3,1,2)), else None."""
    if v is None:
        return None
    p = graph.producer(v.name)
    if p is None or p.domain != "" or p.op != "Transpose" or p.attrs.perm is None:
        return None
    return p.inputs[0] if tuple(p.attrs.perm) == TO_NCHW else None


def push_through_pointwise(graph: Graph) -> Graph:
    """f(transpose(x, p), c) -> transpose(f(x, c'), p) for p = (0,3,1,2) and a pointwise f
    (a Fused[Elementwise] node or an ONNX elementwise op): it moves into NHWC where that retires
    at least as many transposes as it adds (one per output). Transpose elimination does this too
    for plain ops, but only where its lookahead sees a gain; a join of two NHWC branches (the
    residual Add) is a gain it cannot see from either branch alone."""

    def visit(node: Node, ctx: RewriteContext) -> Rewritten | None:
        outs = _push_fused(graph, node, ctx.b, ctx.new)
        # The moved transposes are layout, not fusion: no provenance entry for them.
        return None if outs is None else Rewritten(outs, None)

    return rewrite_graph(graph, visit)


def _pointwise(node: Node) -> bool:
    """A Fused[Elementwise] node or a pointwise ONNX elementwise op."""
    if node.domain == FUSED_DOMAIN and node.op == "Fused":
        return node.attrs.anchor_op is None
    return is_pointwise(node.op, node.domain)


def _push_fused(graph: Graph, node: Node, b: GraphBuilder, new) -> list[Value] | None:
    if not _pointwise(node):
        return None
    out_shape = node.outputs[0].type.shape if _tensor_type(node.outputs[0]) else None
    if out_shape is None or len(out_shape) != 4:
        return None
    if any(_tensor_type(o) is None or o.type.shape != out_shape for o in node.outputs):
        return None
    retired = 0
    sources = {}
    for i, v in enumerate(node.inputs):
        x = _transposed_from_nhwc(graph, v)
        if x is not None and v.type.shape == out_shape:
            sources[i] = x
            if len(graph.users(v.name)) == 1 and not graph.is_output(v.name):
                retired += 1
    if not sources or retired < len(node.outputs):
        return None
    ins: list[Value | None] = []
    for i, v in enumerate(node.inputs):
        if v is None:
            ins.append(None)
        elif i in sources:
            ins.append(new(sources[i]))
        else:
            t = _tensor_type(v)
            if t is None or len(t.shape) > 4:
                return None
            aligned = (1,) * (4 - len(t.shape)) + tuple(t.shape)
            kept = [k for k in TO_NHWC if aligned[k] != 1]
            if kept != sorted(kept) and graph.const(v.name) is None:
                return None  # it would need a run-time transpose of its own: no gain
            nv = _epilogue_input(b, new(v), f"{node.name}/in{i}")
            if nv is None:
                return None
            ins.append(nv)
    y = b.add_node(
        node.op,
        ins,
        node.attrs,
        name=node.name,
        domain=node.domain,
        outputs=[f"{o}/nhwc" for o in node.output_names],
        keep_name=True,
    )
    return [_to_nchw(b, o, f"{node.name}/out{k}") for k, o in enumerate(y.outputs)]
