"""INT8 engines: Conv, MatMul and Gemm with constant weights in integer arithmetic.

Each quantized op becomes the ONNX integer ops (their CPU references are exact: int8 products
summed in float64 through BLAS, exact below 2**53, then taken modulo 2**32 as int32 accumulators
wrap: runtime/reference/nn.py int32_sums) with the bias folded
into the int32 accumulator and a dequantize epilogue:

    QuantizeLinear(x, s_x, 0) -> int8                  (round half to even, saturating)
    ConvInteger / MatMulInteger(x_q, w_q) -> int32     (w_q: int8 constants, per output channel)
    Add(acc, round(b / (s_x * s_w))) -> int32          (the bias, in the accumulator's units)
    DequantizeLinear(acc, s_x * s_w, axis=channel) -> float32

Two passes share that form:

- `quantize_qdq_int8` (first in the pipeline, before constant folding turns the weights'
  DequantizeLinear into floats): a Conv/MatMul/Gemm whose activation comes from DequantizeLinear
  (per-tensor scale and zero point) and whose weight is DequantizeLinear of a constant integer
  tensor (per-tensor or per output channel) takes the model's own integers and scales, zero
  points included (ConvInteger/MatMulInteger take them as inputs).
- `quantize_int8` (after folding and attention fusion, before epilogue fusion, so the weights are
  final and attention's activation x activation MatMuls are gone): the remaining float
  Conv/MatMul/Gemm with constant weights, weights symmetric per output channel ([-127, 127]),
  activations symmetric per tensor with the amax the target's calibrator reports for the tensor
  (graphc/calibrate.py). A MatMul whose only user adds a constant bias along N takes that Add
  into its accumulator too.

The dequantized output is float32, so what follows (Relu, residual Add, Softmax, LayerNorm) stays
float; the next quantized op quantizes its own input again.

On the CUDA target the Quantize/DequantizeLinear nodes of both passes become the
elementwise arithmetic of passes/decompose_qdq.py (Div/Round/Clip/Cast, Cast/Mul: the same float32
operations as the ops' references; `quantize_int8` does it itself, a QDQ model's pass leaves it to
the pipeline's CUDA forms), which epilogue fusion then takes into the integer op's kernel
(codegen/families/gemm_int8.py): bias in int32, dequantize, activation, residual, and, where the
float result feeds only the next layer's quantize, the requantize to int8, so int8 activations
flow between those layers.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from graphc.ir.builder import GraphBuilder
from graphc.ir.graph import Graph, Node, Value
from graphc.ir.types import DType, TensorType
from graphc.passes.rewrite import RewriteContext, Rewritten, rewrite_graph
from graphc.passes.target import Target

log = logging.getLogger(__name__)

QMAX = 127
CONV_FIELDS = ("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")
INT8_TYPES = (DType.int8, DType.uint8)


@dataclass(frozen=True)
class IntegerForm:
    """One op in integer form: the quantized activation and weight with their zero points, the
    int32 bias (or None), the dequantize scale and the output channel axis."""

    x_q: Value  # int8/uint8, in the new graph
    x_zp: np.ndarray | None
    w_q: np.ndarray  # Conv: [Co, Ci/g, k...]; MatMul/Gemm: [K, N]
    w_zp: np.ndarray | None
    bias: np.ndarray | None  # int32, broadcasting against the accumulator
    scale: np.ndarray  # float32 [channels]
    axis: int


def emit(b: GraphBuilder, node: Node, form: IntegerForm, out_rank: int) -> Value:
    """The integer op, the bias add and the dequantize, named after `node`."""
    name = node.name
    zps: list[Value | None] = [
        None if form.x_zp is None else b.add_constant(form.x_zp, f"{name}/x_zero_point"),
        None if form.w_zp is None else b.add_constant(form.w_zp, f"{name}/w_zero_point"),
    ]
    while zps and zps[-1] is None:
        zps.pop()
    w = b.add_constant(np.ascontiguousarray(form.w_q), f"{name}/w_int8")
    if node.op == "Conv":
        attrs = {k: getattr(node.attrs, k) for k in CONV_FIELDS}
        acc = b.op("ConvInteger", [form.x_q, w, *zps], attrs, name=f"{name}/int")
    else:
        acc = b.op("MatMulInteger", [form.x_q, w, *zps], name=f"{name}/int")
    if form.bias is not None:
        acc = b.op("Add", [acc, b.add_constant(form.bias, f"{name}/bias_int32")], name=f"{name}/bias")
    axis = form.axis if form.axis >= 0 else out_rank + form.axis
    scale = b.add_constant(np.ascontiguousarray(form.scale.astype(np.float32)), f"{name}/out_scale")
    return b.op("DequantizeLinear", [acc, scale], {"axis": axis}, name=f"{name}/dequantize")


def emit_pointwise(
    b: GraphBuilder, node: Node, form: IntegerForm, x_shape: tuple[int, ...], out_shape: tuple[int, ...]
) -> Value:
    """A MatMul/Gemm x [..., K] @ w [K, N] for the CUDA target, as a 1x1 ConvInteger of the rows:
    x viewed as [M, K, 1, 1] (M = the leading dims) with the weight stored [N, K, 1, 1], so both
    operands of the int8 GEMM are K-contiguous (its tensor-core path reads only that layout; a
    [K, N] weight would take byte loads that transpose it) and the output [M, N, 1, 1] is the rows
    of the result. The same integers as MatMulInteger; the views are free (alias steps)."""
    name = node.name
    k, n = form.w_q.shape
    m = int(np.prod(x_shape[:-1]))
    view = b.add_constant(np.array([m, k, 1, 1], np.int64), f"{name}/rows_shape")
    rows = b.op("Reshape", [form.x_q, view], name=f"{name}/rows")
    w = b.add_constant(np.ascontiguousarray(form.w_q.T.reshape(n, k, 1, 1)), f"{name}/w_int8")
    attrs = {"kernel_shape": [1, 1], "strides": [1, 1], "pads": [0, 0, 0, 0], "dilations": [1, 1], "group": 1}
    acc = b.op("ConvInteger", [rows, w], attrs, name=f"{name}/int")
    if form.bias is not None:
        bias = np.broadcast_to(form.bias.reshape(-1), (n,)).reshape(n, 1, 1)
        acc = b.op("Add", [acc, b.add_constant(np.ascontiguousarray(bias), f"{name}/bias_int32")], name=f"{name}/bias")
    scale = b.add_constant(np.ascontiguousarray(form.scale.astype(np.float32)), f"{name}/out_scale")
    y = b.op("DequantizeLinear", [acc, scale], {"axis": 1}, name=f"{name}/dequantize")
    shape = b.add_constant(np.array(out_shape, np.int64), f"{name}/out_shape")
    return b.op("Reshape", [y, shape], name=f"{name}/view")


def bias_int32(bias: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """round(bias / scale) in int32 (saturating), the bias in accumulator units."""
    q = np.rint(np.asarray(bias, np.float64) / np.asarray(scale, np.float64))
    return np.clip(q, np.iinfo(np.int32).min, np.iinfo(np.int32).max).astype(np.int32)


def quantize_weight(w: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric per-channel int8 along `axis`: (w_q, scale per channel)."""
    w = np.asarray(w, np.float32)
    other = tuple(i for i in range(w.ndim) if i != axis % w.ndim)
    amax = np.max(np.abs(w), axis=other) if other else np.abs(w)
    scale = np.where(amax > 0, amax / QMAX, 1.0).astype(np.float32)
    shape = [1] * w.ndim
    shape[axis] = -1
    q = np.clip(np.rint(w / scale.reshape(shape)), -QMAX, QMAX).astype(np.int8)
    return q, scale


def _float32(v: Value | None) -> bool:
    return v is not None and isinstance(v.type, TensorType) and v.ttype.dtype is DType.float32


# ---- calibrated ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Candidate:
    node: Node
    x: Value
    w: np.ndarray  # Conv: as is; MatMul/Gemm: [K, N]
    bias: np.ndarray | None  # float, broadcasting against the output (Gemm: beta * C)
    alpha: float
    absorbed: tuple[Node, ...]  # the nodes the integer form replaces (MatMul + its bias Add)


def layer_names(graph: Graph) -> list[str]:
    """The names of the Conv/MatMul/Gemm nodes `quantize_int8` would quantize (in graph order):
    the layers an accuracy search may keep float (Target.keep_float takes these names)."""
    found, _ = candidates(graph)
    return [c.node.name for c in found.values()]


def candidates(graph: Graph) -> tuple[dict[str, Candidate], set[str]]:
    """By the name of the node whose output the integer form replaces; and the MatMuls whose bias
    Add stands in for them. The fp8 pass (passes/quantize_fp8.py) takes the same candidates."""
    users = graph.consumers
    found: dict[str, Candidate] = {}
    folded: set[str] = set()
    for node in graph.nodes:
        if node.domain not in ("", "ai.onnx") or not node.inputs or not _float32(node.outputs[0]):
            continue
        x = node.inputs[0]
        if not _float32(x) or graph.const(x.name) is not None:
            continue
        w = graph.const(node.inputs[1].name) if len(node.inputs) > 1 and node.inputs[1] is not None else None
        if w is None or w.dtype != np.float32:
            continue
        b_in = node.inputs[2] if len(node.inputs) > 2 else None
        bias = None if b_in is None else graph.const(b_in.name)
        if b_in is not None and bias is None:
            continue
        if node.op == "Conv" and w.ndim >= 3:
            b = None if bias is None else bias.reshape(-1, *([1] * (w.ndim - 2)))
            found[node.name] = Candidate(node, x, w, b, 1.0, (node,))
        elif node.op == "Gemm" and w.ndim == 2 and node.attrs.transA == 0:
            wk = w.T if node.attrs.transB else w
            b = None if bias is None else np.float32(node.attrs.beta) * bias
            found[node.name] = Candidate(node, x, wk, b, float(node.attrs.alpha), (node,))
        elif node.op == "MatMul" and w.ndim == 2 and x.ttype.rank >= 2:
            us = users.get(node.outputs[0].name, [])
            add = us[0] if len(us) == 1 and not graph.is_output(node.outputs[0].name) else None
            c = _bias_of(graph, add, node.outputs[0], w.shape[1]) if add is not None else None
            if add is not None and c is not None:
                found[add.name] = Candidate(node, x, w, c, 1.0, (node, add))
                folded.add(node.name)
            else:
                found[node.name] = Candidate(node, x, w, None, 1.0, (node,))
    return found, folded


def _bias_of(graph: Graph, add: Node, y: Value, n: int) -> np.ndarray | None:
    """The constant of `Add(y, c)` when it is a bias along the last axis (shape [..1, n])."""
    if add.op != "Add" or add.domain not in ("", "ai.onnx") or not _float32(add.outputs[0]):
        return None
    a0 = add.inputs[0]  # values compare by name (a node's input need not be its producer's object)
    other = add.inputs[1] if a0 is not None and a0.name == y.name else a0
    c = None if other is None else graph.const(other.name)
    if c is None or c.dtype != np.float32 or c.ndim > y.ttype.rank or c.ndim == 0:
        return None
    if c.shape[-1] != n or any(d != 1 for d in c.shape[:-1]):
        return None
    return c


def quantize_int8(graph: Graph, target: Target) -> Graph:
    """The float Conv/MatMul/Gemm with constant weights, with calibrated activation scales."""
    if target.calibrator is None:
        return graph
    out = _quantize_calibrated(graph, target)
    return _cuda_arithmetic(out) if target.is_cuda and out is not graph else out


def _cuda_arithmetic(graph: Graph) -> Graph:
    """The CUDA target has no Quantize/DequantizeLinear kernel: their arithmetic, which fuses."""
    from graphc.passes.decompose_qdq import decompose_qdq

    return decompose_qdq(graph)


def calibrated_candidates(
    graph: Graph, target: Target, ops: frozenset[str] = frozenset({"Conv", "MatMul", "Gemm"}), tag: str = "int8"
) -> tuple[dict[str, Candidate], set[str], dict[str, float]]:
    """The candidates of `ops` less the target's keep_float ones, the MatMuls whose bias Add
    stands in for them, and the calibrated amax of every candidate's input (`tag` names the
    precision in the log)."""
    found, folded = candidates(graph)
    for k, c in list(found.items()):
        if c.node.op not in ops:
            del found[k]
            folded.discard(c.node.name)
    if not found:
        return found, folded, {}
    # Every candidate's input is calibrated, kept-float ones too: the calibrator then sees the same
    # question whatever the keep set (graphc/accuracy.py tries several), and answers from memory.
    assert target.calibrator is not None
    names = sorted({c.x.name for c in found.values()})
    amax = {k: float(v) for k, v in target.calibrator(graph, names).items()}
    kept = {k: c for k, c in found.items() if c.node.name in target.keep_float}
    for k, c in kept.items():
        log.info("%s: %s '%s' stays float (keep_float)", tag, c.node.op, c.node.name)
        del found[k]
        folded.discard(c.node.name)
    return found, folded, amax


def _quantize_calibrated(graph: Graph, target: Target) -> Graph:
    found, folded, amax = calibrated_candidates(graph, target)
    if not found:
        return graph
    quant_x: dict[str, Value] = {}  # one QuantizeLinear per activation (Q, K and V share theirs)

    def visit(node: Node, ctx: RewriteContext) -> Rewritten | None:
        if node.name in folded:
            return None  # its bias Add takes it in
        cand = found.get(node.name)
        if cand is None:
            return None
        a = float(amax.get(cand.x.name, 0.0))
        if not a > 0:
            log.info("int8: %s '%s' stays float: its input '%s' is 0 on every sample", node.op, node.name, cand.x.name)
            return None
        s_x = np.float32(a / QMAX)
        b = ctx.b
        x_q = quant_x.get(cand.x.name)
        if x_q is None:
            x_q = b.op(
                "QuantizeLinear",
                [
                    ctx.new(cand.x),
                    b.add_constant(s_x, f"{cand.x.name}/scale"),
                    b.add_constant(np.int8(0), f"{cand.x.name}/zero_point"),
                ],
                name=f"{cand.x.name}/quantize",
            )
            quant_x[cand.x.name] = x_q
        conv = cand.node.op == "Conv"
        w_q, s_w = quantize_weight(cand.w, 0 if conv else 1)
        scale = (np.float64(s_x) * s_w.astype(np.float64) * cand.alpha).astype(np.float32)
        bias = None
        if cand.bias is not None:
            per = scale.reshape(-1, *([1] * (cand.w.ndim - 2))) if conv else scale
            bias = bias_int32(cand.bias, per)
        form = IntegerForm(x_q, None, w_q, None, bias, scale, 1 if conv else -1)
        if target.is_cuda and not conv and (bias is None or bias.size in (1, w_q.shape[1])):
            out_shape = node.outputs[0].ttype.static_shape
            return Rewritten([emit_pointwise(b, cand.node, form, cand.x.ttype.static_shape, out_shape)], cand.absorbed)
        return Rewritten([emit(b, cand.node, form, node.outputs[0].ttype.rank)], cand.absorbed)

    return rewrite_graph(graph, visit)


# ---- QDQ ---------------------------------------------------------------------------------------


def _dq(graph: Graph, v: Value | None) -> Node | None:
    p = None if v is None else graph.producer(v.name)
    if p is None or p.op != "DequantizeLinear" or p.domain not in ("", "ai.onnx") or p.attrs.block_size:
        return None
    return p


def _dq_params(graph: Graph, dq: Node) -> tuple[np.ndarray, np.ndarray | None] | None:
    """(scale, zero point or None) of a DequantizeLinear with constant ones."""
    s = graph.const(dq.inputs[1].name)
    zp_in = dq.inputs[2] if len(dq.inputs) > 2 else None
    zp = None if zp_in is None else graph.const(zp_in.name)
    if s is None or s.dtype != np.float32 or (zp_in is not None and zp is None):
        return None
    return s, zp


def _per_channel(param: np.ndarray, dq: Node, rank: int, axis: int, n: int) -> np.ndarray | None:
    """A per-tensor or per-`axis` parameter as a vector of n; None when it is laid out otherwise."""
    if param.size == 1:
        return np.full(n, param.reshape(-1)[0], dtype=param.dtype)
    if param.ndim == 1 and param.size == n and dq.attrs.axis % rank == axis:
        return param
    return None


def _qdq_form(graph: Graph, node: Node, ctx: RewriteContext) -> IntegerForm | None:
    if node.domain not in ("", "ai.onnx") or node.op not in ("Conv", "MatMul", "Gemm") or len(node.inputs) < 2:
        return None
    if not _float32(node.outputs[0]):
        return None
    dq_x, dq_w = _dq(graph, node.inputs[0]), _dq(graph, node.inputs[1])
    if dq_x is None or dq_w is None:
        return None
    px, pw = _dq_params(graph, dq_x), _dq_params(graph, dq_w)
    x_q, w_int = dq_x.inputs[0], graph.const(dq_w.inputs[0].name)
    if px is None or pw is None or w_int is None or px[0].size != 1 or (px[1] is not None and px[1].size != 1):
        return None
    if x_q.ttype.dtype not in INT8_TYPES or DType.from_numpy(w_int.dtype) not in INT8_TYPES:
        return None
    s_x = np.float32(px[0].reshape(-1)[0])
    x_zp = None if px[1] is None or not px[1].any() else px[1].reshape(())
    if node.op == "Conv":
        if w_int.ndim < 3:
            return None
        w, axis, n = w_int, 0, w_int.shape[0]
    elif node.op == "Gemm":
        if node.attrs.transA or w_int.ndim != 2 or node.attrs.alpha != 1.0:
            return None
        axis = 0 if node.attrs.transB else 1
        w, n = (w_int.T if node.attrs.transB else w_int), w_int.shape[axis]
    else:
        if w_int.ndim != 2 or node.inputs[0].ttype.rank < 2:
            return None
        w, axis, n = w_int, 1, w_int.shape[1]
    s_w = _per_channel(pw[0], dq_w, w_int.ndim, axis, n)
    w_zp = None if pw[1] is None else _per_channel(pw[1], dq_w, w_int.ndim, axis, n)
    if s_w is None or (pw[1] is not None and w_zp is None):
        return None
    if w_zp is not None and not w_zp.any():
        w_zp = None
    scale = (np.float64(s_x) * s_w.astype(np.float64)).astype(np.float32)
    bias = None
    b_in = node.inputs[2] if len(node.inputs) > 2 else None
    if b_in is not None:
        b = _float_const(graph, b_in)
        if b is None:
            return None
        if node.op == "Conv":
            b, per = b.reshape(-1, *([1] * (w.ndim - 2))), scale.reshape(-1, *([1] * (w.ndim - 2)))
        else:
            b, per = np.float32(node.attrs.beta) * b, scale
        bias = bias_int32(b, per)
    return IntegerForm(ctx.new(x_q), x_zp, w, w_zp, bias, scale, 1 if node.op == "Conv" else -1)


def _float_const(graph: Graph, v: Value) -> np.ndarray | None:
    """A float constant, or DequantizeLinear of constants (a QDQ model's int32 bias) evaluated."""
    c = graph.const(v.name)
    if c is not None:
        return c.astype(np.float32) if c.dtype == np.float32 else None
    dq = _dq(graph, v)
    q = None if dq is None else graph.const(dq.inputs[0].name)
    p = None if dq is None else _dq_params(graph, dq)
    if q is None or p is None:
        return None
    n = q.shape[0] if q.ndim == 1 else 1
    s = _per_channel(p[0], dq, max(q.ndim, 1), 0, n) if q.ndim <= 1 else None
    if s is None:
        return None
    zp = np.zeros(1) if p[1] is None else p[1].astype(np.float64)
    return ((q.astype(np.float64) - zp) * s.astype(np.float64)).astype(np.float32)


def quantize_qdq_int8(graph: Graph, target: Target | None = None) -> Graph:
    """Conv/MatMul/Gemm between a QDQ model's DequantizeLinear nodes, on the model's integers.

    On the CUDA target only what its int8 kernels take (codegen/families/gemm_int8.py): int8
    activations and weights without zero points (PyTorch's symmetric QDQ); any other op (ONNX
    Runtime's uint8 activations with a zero point) keeps its Q/DQ nodes, which the CUDA target
    runs as their float arithmetic (logged, per node)."""
    cuda = target is not None and target.is_cuda

    def visit(node: Node, ctx: RewriteContext) -> Rewritten | None:
        form = _qdq_form(graph, node, ctx)
        if form is None:
            return None
        if cuda:
            kind = form.x_q.ttype.dtype is DType.int8 and form.w_q.dtype == np.int8
            if form.x_zp is not None or form.w_zp is not None or not kind:
                log.info(
                    "int8: %s '%s' stays float on cuda (Q/DQ arithmetic): its int8 kernels take int8 operands "
                    "without zero points",
                    node.op,
                    node.name,
                )
                return None
            if node.op != "Conv" and (form.bias is None or form.bias.size in (1, form.w_q.shape[1])):
                x_shape = node.inputs[0].ttype.static_shape
                out = emit_pointwise(ctx.b, node, form, x_shape, node.outputs[0].ttype.static_shape)
                return Rewritten([out], [node])
        return Rewritten([emit(ctx.b, node, form, node.outputs[0].ttype.rank)], [node])

    return rewrite_graph(graph, visit)


def integer_ops(graph: Graph) -> dict[str, int]:
    """How many ConvInteger/MatMulInteger nodes a graph holds, fused ones (the CUDA target's, with
    their epilogues) included: the report's int8 summary."""
    counts: dict[str, int] = {}
    for n in graph.nodes:
        op = n.attrs.anchor_op if n.op == "Fused" and n.domain == "graphc" else n.op
        if op in ("ConvInteger", "MatMulInteger") and (n.op == "Fused" or not n.domain):
            counts[op] = counts.get(op, 0) + 1
    return dict(sorted(counts.items()))


__all__: Sequence[str] = (
    "quantize_int8",
    "layer_names",
    "quantize_qdq_int8",
    "integer_ops",
    "quantize_weight",
    "bias_int32",
    "candidates",
    "calibrated_candidates",
    "Candidate",
)
