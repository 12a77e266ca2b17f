"""Fuse the elementwise ops after a conv or matmul into its epilogue: one Fused[anchor] node.

    relu(conv(x, w, b) + shortcut)        -> Fused[Conv](x, w, b', shortcut)
                                              {op0 = Add(acc, in2); op1 = Add(op0, in3); op2 = Relu(op1)}
    gelu(matmul(x, W) + bias) (+ residual) -> Fused[MatMul](x, W, bias, residual) {...}
    silu(conv(x, w)) = y * sigmoid(y)     -> a DAG: Sigmoid(acc), Mul(acc, op0)

Anchors are Conv, Gemm, MatMul (batched too) and graphc.MatMul. A conv's constant bias (reshaped
to (C, 1, ..., 1)) and a Gemm's C (when beta = 1) move into the epilogue as its first Add, so the
anchor kernels never handle a bias and every conv or Gemm with one becomes a fused node.

The epilogue grows from the anchor's output through its consumers, in graph order, taking every
elementwise op (fuse_common.fusable_elementwise) whose output has the anchor output's shape and
whose other inputs broadcast into it. It also looks through a Reshape (GPT-2's Conv1D is a Gemm
on (seq, hidden) viewed back as (1, seq, hidden) before its bias, GELU and residual): a view has
the same elements in the same order, so ops after it run at the anchor's own index as long as
their other inputs vary only along the trailing dims the view keeps (such an input is read
through a view of itself without its extra leading unit dims); the fused result is then viewed
as the last op's shape. Then the longest prefix (in graph order) whose values are
all read inside it, but for the last one, is kept: an intermediate that someone else also reads
ends the epilogue there (no work is duplicated, and the fused node has one output), and a near
miss names who reads it. The fused node takes the anchor's name and the last value's name, and
sits where the last absorbed node was: every outside value it reads is made before that, and
everything reading its result comes after.
"""

from __future__ import annotations

import heapq
import math

import numpy as np

from graphc.ir.graph import Graph, Node, Value
from graphc.ir.types import Shape, TensorType
from graphc.ops.fused import ACC, FUSED_DOMAIN, FusedAttrs, Ref
from graphc.ops.internal import INTERNAL_DOMAIN
from graphc.ops.registry import get_op
from graphc.passes.capabilities import REFERENCE, FusionCapabilities
from graphc.passes.fold_common import Replacement, rebuild
from graphc.passes.fuse_common import (
    EpilogueBuilder,
    broadcasts_into,
    fusable_elementwise,
    known_shape,
    same_shape,
    supported_value,
)

# ConvInteger/MatMulInteger (int8 engines, passes/quantize_int8.py): an int32 accumulator whose bias,
# dequantize and requantize ride in the epilogue where the target's int8 kernels take them
# (caps.fuses_epilogue; the CPU reference keeps them as steps of their own).
ANCHORS = frozenset(
    {
        ("", "Conv"),
        ("", "Gemm"),
        ("", "MatMul"),
        (INTERNAL_DOMAIN, "MatMul"),
        ("", "ConvInteger"),
        ("", "MatMulInteger"),
        # fp8 engines' E4M3 GEMM (passes/quantize_fp8.py): dequantized by its alpha, so the epilogue
        # is a float one (bias, activation, residual, the next layer's quantize)
        (INTERNAL_DOMAIN, "MatMulFp8"),
    }
)
# Epilogues longer than this are cut (a DAG that long is a fusion of its own, not an epilogue).
MAX_EPILOGUE_OPS = 24


def _kind(node: Node) -> str:
    return node.op if not node.domain else f"{node.domain}.{node.op}"


def _is_anchor(node: Node, caps: FusionCapabilities) -> bool:
    if (node.domain, node.op) not in ANCHORS or len(node.outputs) != 1:
        return False
    out = node.outputs[0].type
    return (
        isinstance(out, TensorType)
        and out.shape is not None
        and all(supported_value(v, caps) for v in (*node.inputs, *node.outputs))
    )


def _is_view(node: Node) -> bool:
    """A Reshape: the same elements in the same (row-major) order under another shape."""
    return node.op == "Reshape" and not node.domain and known_shape(node.outputs[0].ttype.shape)


def _common_suffix(a: Shape, b: Shape) -> int:
    k = 0
    while k < min(len(a), len(b)) and a[len(a) - 1 - k] == b[len(b) - 1 - k]:
        k += 1
    return k


def _strip_unit_tail(shape: Shape) -> Shape:
    dims = list(shape)
    while len(dims) > 1 and dims[-1] == 1:
        dims.pop()
    return tuple(dims)


def _numel(shape: Shape) -> int | None:
    """The element count of a shape of ints; None with a named or unknown dim (math.prod of a
    str would repeat it, or fail on two of them)."""
    return math.prod(shape) if shape is not None and all(isinstance(d, int) for d in shape) else None


def _frame_input(t: object, frame: Shape, shape: Shape) -> tuple[int, ...] | None:
    """How an outside input read by an op on a reshaped view (`frame`) of the anchor output
    (`shape`) is read in the anchor's own index space: its shape there (leading unit dims dropped
    where the frame has more dims), or None when it varies along dims the reshape does not keep."""
    if not broadcasts_into(t, frame):
        return None
    if tuple(t.shape) == tuple(frame) and known_shape(frame):
        # All of the frame (a residual of the view's shape): the same elements in the same order
        # as the anchor output, so it is read through a view in the anchor's shape
        return tuple(shape)
    u = len(shape) - len(_strip_unit_tail(shape))
    n = _numel(shape)
    if u and tuple(frame) != tuple(shape) and n is not None and _numel(frame) == n:
        # An anchor whose output ends in unit dims (an int8 GEMM written as a 1x1 ConvInteger,
        # [M, N, 1, 1], viewed as [..., N]): a frame-sized input is read at the same index, and
        # anything else as against the shape without those dims, then with them.
        if tuple(t.shape) == tuple(frame):
            return tuple(shape)
        dims = _frame_input(t, frame, shape[: len(shape) - u])
        return None if dims is None else (dims + (1,) * u if dims else dims)
    k = _common_suffix(frame, shape)
    dims = tuple(t.shape)
    if any(d != 1 for d in dims[: max(0, len(dims) - k)]):
        return None
    return dims if len(dims) <= len(shape) else dims[len(dims) - k :] if k else ()


def _takes(node: Node, frames: dict[str, Shape], shape: Shape, anchor: str, caps: FusionCapabilities) -> bool:
    """Whether an epilogue over the anchor output (`shape`) can take `node`: an elementwise op
    whose inputs made inside share one frame (the anchor shape, or a reshaped view of it) that
    its output keeps, and whose other inputs broadcast into that frame; or a view of a value made
    inside."""
    if _is_view(node):
        return node.inputs[0].name in frames
    if not fusable_elementwise(node, caps) or not caps.fuses_epilogue(anchor, node.op, node.outputs[0].ttype.dtype):
        return False
    inner = {frames[v.name] for v in node.inputs if v.name in frames}
    if len(inner) != 1:
        return False
    frame = inner.pop()
    if not same_shape(node.outputs[0].type.shape, frame):
        return False
    return all(v.name in frames or _frame_input(v.type, frame, shape) is not None for v in node.inputs)


def _valid(graph: Graph, acc: Value, prefix: list[Node]) -> bool:
    """Every value made inside is read only inside, but the last, which is read outside (or is a
    graph output)."""
    inside = {n.name for n in prefix}
    values = [acc] + [n.outputs[0] for n in prefix]
    for i, v in enumerate(values):
        users = graph.users(v.name)
        outside = graph.is_output(v.name) or any(u.name not in inside for u in users)
        if i == len(values) - 1:
            if not outside:
                return False  # a dead end: dead code elimination's business
        elif outside or not users:
            return False
    return True


def _grow(
    graph: Graph, anchor: Node, index: dict[str, int], claimed: set[str], caps: FusionCapabilities
) -> tuple[list[Node], tuple[list[Node], Node] | None]:
    """The epilogue of `anchor`, and (kept, next) when a node after it was left out."""
    acc = anchor.outputs[0]
    shape = acc.type.shape
    if not known_shape(shape):
        return [], None
    frames: dict[str, Shape] = {acc.name: shape}  # values made inside -> their shapes
    heap: list[tuple[int, str]] = []
    nodes: dict[str, Node] = {}

    def push(v: Value) -> None:
        for u in graph.users(v.name):
            if u.name not in nodes:
                nodes[u.name] = u
                heapq.heappush(heap, (index[u.name], u.name))

    push(acc)
    cands: list[Node] = []
    while heap and len(cands) < MAX_EPILOGUE_OPS:
        _, name = heapq.heappop(heap)
        u = nodes[name]
        if name in claimed or not _takes(u, frames, shape, _kind(anchor), caps):
            continue
        cands.append(u)
        frames[u.outputs[0].name] = u.outputs[0].ttype.shape
        push(u.outputs[0])
    k = len(cands)
    # The epilogue ends in an op (a trailing view stays outside, as an alias of the result).
    while k > 0 and (_is_view(cands[k - 1]) or not _valid(graph, acc, cands[:k])):
        k -= 1
    return cands[:k], ((cands[:k], cands[k]) if k < len(cands) else None)


def _near_miss(graph: Graph, anchor: Node, kept: list[Node], next_node: Node) -> str | None:
    """Why `next_node` did not join: a value made inside is read by someone outside."""
    inside = {n.name for n in kept} | {next_node.name}
    acc = anchor.outputs[0]
    for v in [acc] + [n.outputs[0] for n in kept]:
        what = "its output" if v is acc else f"'{v.name}'"
        if graph.is_output(v.name):
            why = f"{what} is also a graph output"
        else:
            others = [u.name for u in graph.users(v.name) if u.name not in inside]
            if not others:
                continue
            why = f"{what} is also used by '{others[0]}'"
        return f"{_kind(anchor)} '{anchor.name}' not fused with '{next_node.name}': {why}"
    return None


def _bias(graph: Graph, anchor: Node) -> tuple[int, np.ndarray | Value] | None:
    """(input index, what to add) for a bias that moves into the epilogue: a conv's constant B
    (as an array shaped (C, 1, ..., 1)) or a Gemm's C with beta = 1 (the value itself)."""
    b = anchor.input(2)
    if b is None or anchor.domain:
        return None
    out_shape = anchor.outputs[0].type.shape
    if anchor.op == "Conv":
        data = graph.const(b.name)
        if data is None or data.ndim != 1:
            return None
        return 2, data.reshape((-1,) + (1,) * (len(out_shape) - 2))
    if anchor.op == "Gemm" and anchor.attrs.beta == 1.0 and broadcasts_into(b.type, out_shape):
        return 2, b
    return None


def _replacement(anchor: Node, region: list[Node], bias) -> Replacement:
    last = region[-1] if region else anchor
    out_name = last.outputs[0].name
    shape = anchor.outputs[0].ttype.shape

    def emit(b, mapv):
        ins = [None if v is None else mapv(v) for v in anchor.inputs]
        if bias is not None:
            ins = ins[: bias[0]]
        eb = EpilogueBuilder(len(ins))
        ref: Ref = ACC
        if bias is not None:
            i, what = bias
            what = b.add_constant(what, f"{anchor.name}/bias") if isinstance(what, np.ndarray) else mapv(what)
            ref = eb.op("Add", get_op("Add").attrs(), [ACC, eb.input(what)])
        eb.refs[anchor.outputs[0].name] = ref
        reshaped: dict[tuple[str, tuple], Value] = {}

        def outside(v: Value, frame: Shape) -> Value:
            """An outside input as the anchor's index space reads it (see _frame_input)."""
            new = mapv(v)
            dims = _frame_input(v.type, frame, shape)
            if dims == tuple(v.ttype.shape):
                return new
            key = (new.name, dims)
            if key not in reshaped:
                data = b.constants[new.name].data if new.name in b.constants else None
                if data is not None:
                    reshaped[key] = b.add_constant(data.reshape(dims), f"{new.name}/reshaped")
                else:
                    dims_v = b.add_constant(np.array(dims, dtype=np.int64), f"{new.name}/shape")
                    reshaped[key] = b.op("Reshape", [new, dims_v], name=f"{anchor.name}/{new.name}/view")
            return reshaped[key]

        for n in region:
            if _is_view(n):
                eb.refs[n.outputs[0].name] = eb.refs[n.inputs[0].name]
                continue
            frame = next(v.ttype.shape for v in n.inputs if v.name in eb.refs)
            ref = eb.add_node(n, lambda v, frame=frame: outside(v, frame))
        attrs = FusedAttrs(
            anchor_op=anchor.op,
            anchor_domain=anchor.domain,
            anchor_attrs=anchor.attrs,
            anchor_inputs=len(ins),
            epilogue=tuple(eb.ops),
            outputs=(ref,),
        )
        viewed = last.outputs[0].ttype.shape != shape
        node = b.add_node(
            "Fused",
            [*ins, *eb.inputs],
            attrs,
            name=anchor.name,
            keep_name=True,
            outputs=[f"{out_name}/fused" if viewed else out_name],
            domain=FUSED_DOMAIN,
        )
        out = node.outputs[0]
        if viewed:
            # The epilogue ran in the anchor's shape; the result is viewed as the last op's.
            dims = b.add_constant(np.array(last.outputs[0].ttype.shape, dtype=np.int64), f"{out_name}/shape")
            out = b.add_node("Reshape", [out, dims], name=f"{anchor.name}/view", outputs=[out_name]).outputs[0]
        return [out]

    return Replacement(last.name, emit, (anchor, *region))


def fuse_epilogues(graph: Graph, caps: FusionCapabilities = REFERENCE) -> Graph:
    """Fuse each anchor's elementwise consumers into its epilogue; `caps` says which ops and dtypes
    the target's kernels take in an epilogue (the reference executor's by default)."""
    index = {n.name: i for i, n in enumerate(graph.nodes)}
    claimed: set[str] = set()
    replacements: list[Replacement] = []
    misses: list[str] = []
    left_out: list[tuple[Node, list[Node], Node]] = []
    for node in graph.nodes:
        if not _is_anchor(node, caps):
            continue
        region, miss = _grow(graph, node, index, claimed, caps)
        if miss is not None:
            left_out.append((node, *miss))
        bias = _bias(graph, node)
        if not region and bias is None:
            continue
        claimed.update(n.name for n in region)
        replacements.append(_replacement(node, region, bias))
    for anchor, kept, next_node in left_out:
        # A node that another anchor's epilogue took (a residual Add between two convs) is no miss.
        if next_node.name not in claimed:
            msg = _near_miss(graph, anchor, kept, next_node)
            if msg is not None:
                misses.append(msg)
    return rebuild(graph, replacements, near_misses=misses)
