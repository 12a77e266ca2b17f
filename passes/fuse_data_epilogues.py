"""Data movement kernels that compute on what they move: a Transpose, Gather or Concat with an
epilogue, one kernel instead of two (codegen/families/data.py renders it).

Rules (named by their algebra):

- CAST_THROUGH_MOVE   move(cast(x), ..) -> Fused[move](x, ..) {Cast(acc)}: a Cast commutes with a
  Transpose and with the data side of a Gather (cast(0) = 0 for a Gather's out-of-range index),
  so the move reads x and stores the cast. ResNet-50's and ViT's input: the fp16 engine's Cast
  of the fp32 image, then the NCHW -> NHWC transpose before the first conv.
- MOVE_THEN_ELEMENTWISE  f(move(x, ..), y, ..) -> Fused[move](x, .., y, ..) {f(acc, ..)}: the one
  fused elementwise kernel that reads a move's result (and nothing larger: its output has the
  move's shape) runs in the move's store, also through Reshapes between them (its other inputs
  then of its full shape, read through views). GPT-2's and BERT's embedding lookups plus the
  position (and token-type) embeddings; ViT's [cls; patches] concat plus the position embeddings;
  Swin's residual add after the window reverse's roll. The same for a GEMM, conv, pool or
  reduction kernel (passes/fuse_casts.py's anchors) and the elementwise kernel after it, which
  epilogue fusion could not join because transposes stood between them until the channels-last
  layout pass cancelled them (ConvNeXt's residual add after the layer-scaled pwconv2 GEMM).

Runs after the precision pass and Cast folding (passes/fuse_casts.py), whose Casts and fused
elementwise kernels it takes. The move's result must have no other reader and be no graph
output (it is never stored).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from graphc.ir.graph import Graph, Node
from graphc.ops.fused import ACC, FUSED_DOMAIN, OP, EpilogueOp, FusedAttrs, Ref
from graphc.passes.capabilities import REFERENCE, FusionCapabilities
from graphc.passes.fold_common import Replacement, rebuild
from graphc.passes.fuse_casts import EPILOGUE_ANCHORS
from graphc.passes.fuse_common import supported_value

MOVES = frozenset({"Transpose", "Gather", "Concat"})
CAST_MOVES = frozenset({"Transpose", "Gather"})  # a Cast of input 0 commutes with these


def _plain_move(graph: Graph, node: Node, ops: frozenset[str]) -> bool:
    if node.domain or node.op not in ops or len(node.outputs) != 1:
        return False
    # A Gather of one constant index picks a slab, which lowering makes a view (no kernel,
    # codegen/views.py): an epilogue would turn it into a kernel.
    idx = graph.const(node.inputs[1].name) if node.op == "Gather" and len(node.inputs) > 1 else None
    return idx is None or idx.ndim != 0


def _fused(node: Node | None) -> FusedAttrs | None:
    return node.attrs if node is not None and node.op == "Fused" and node.domain == FUSED_DOMAIN else None


def _sole_reader(graph: Graph, name: str) -> Node | None:
    users = graph.users(name)
    return users[0] if len(users) == 1 and not graph.is_output(name) else None


def _cast_of(graph: Graph, node: Node | None) -> tuple[Node, object] | None:
    """(node, Cast attrs) when `node` is a Cast, or a fused elementwise node that is one Cast of
    its only input."""
    if node is None or len(node.outputs) != 1:
        return None
    if node.op == "Cast" and not node.domain:
        return node, node.attrs
    a = _fused(node)
    if a is None or a.anchor_op is not None or len(node.inputs) != 1 or len(a.epilogue) != 1:
        return None
    (e,) = a.epilogue
    if e.op != "Cast" or e.args != (Ref("in", 0),) or a.outputs != (OP(0),):
        return None
    return node, e.attrs


def _cast_through_move(graph: Graph, move: Node, caps: FusionCapabilities) -> Replacement | None:
    if not _plain_move(graph, move, CAST_MOVES):
        return None
    found = _cast_of(graph, graph.producer(move.inputs[0].name))
    if found is None:
        return None
    cast, cast_attrs = found
    x = cast.inputs[0]
    if _sole_reader(graph, cast.outputs[0].name) is not move or any(v is None for v in move.inputs):
        return None
    if any(v.name == cast.outputs[0].name for v in move.inputs[1:]):
        return None
    if not supported_value(x, caps) or not caps.fuses_epilogue(move.op, "Cast", move.outputs[0].ttype.dtype):
        return None
    attrs = FusedAttrs(
        anchor_op=move.op,
        anchor_attrs=move.attrs,
        anchor_inputs=len(move.inputs),
        epilogue=(EpilogueOp("Cast", cast_attrs, (ACC,)),),
        outputs=(OP(0),),
    )

    def emit(b, mapv):
        ins = [mapv(x), *(mapv(v) for v in move.inputs[1:])]
        node = b.add_node(
            "Fused", ins, attrs, name=move.name, keep_name=True, outputs=[move.outputs[0].name], domain=FUSED_DOMAIN
        )
        return list(node.outputs)

    return Replacement(move.name, emit, (cast, move))


def _move_then_elementwise(graph: Graph, move: Node, caps: FusionCapabilities) -> Replacement | None:
    """`move` is a plain move or anchor, or a Fused node of one with one output."""
    a = _fused(move)
    if a is None:
        plain_anchor = (move.domain, move.op) in EPILOGUE_ANCHORS and len(move.outputs) == 1
        if not (_plain_move(graph, move, MOVES) or plain_anchor) or any(v is None for v in move.inputs):
            return None
        anchor = FusedAttrs(
            anchor_op=move.op,
            anchor_domain=move.domain,
            anchor_attrs=move.attrs,
            anchor_inputs=len(move.inputs),
            outputs=(ACC,),
        )
    elif len(a.outputs) == 1 and (
        (a.anchor_op in MOVES and not a.anchor_domain) or (a.anchor_domain, a.anchor_op) in EPILOGUE_ANCHORS
    ):
        anchor = a
    else:
        return None
    x = move.outputs[0]
    # Through views (Reshapes read by nothing else): the same elements in the same order, so the
    # epilogue runs at the move's own index; the reader's other inputs must then be of its full
    # shape (read through a view in the move's shape), and the result is viewed back.
    views: list[Node] = []
    cur = _sole_reader(graph, x.name)
    while cur is not None and cur.op == "Reshape" and not cur.domain and len(cur.outputs) == 1:
        views.append(cur)
        cur = _sole_reader(graph, cur.outputs[0].name)
    u, seen = cur, (views[-1].outputs[0] if views else x)
    ua = _fused(u)
    if ua is None or ua.anchor_op is not None or len(u.outputs) != 1 or len(ua.outputs) != 1:
        return None
    u_shape = tuple(u.outputs[0].ttype.shape)
    if u_shape != tuple(seen.ttype.shape):
        return None
    if views and any(v.name != seen.name and tuple(v.ttype.shape) != u_shape for v in u.inputs):
        return None
    if views and not all(isinstance(d, int) for d in (*x.ttype.shape, *u_shape)):
        return None  # the views back and forth need constant shapes (a symbolic dim has none)
    if not all(caps.fuses_epilogue(anchor.anchor_op, e.op, u.outputs[0].ttype.dtype) for e in ua.epilogue):
        return None
    n_in, n_ops = len(move.inputs), len(anchor.epilogue)
    slots: dict[int, Ref] = {}
    extra = []
    for i, v in enumerate(u.inputs):
        if v.name == seen.name:
            slots[i] = anchor.outputs[0]
        else:
            slots[i] = Ref("in", n_in + len(extra))
            extra.append(v)

    def remap(r: Ref) -> Ref:
        if r.kind == "in":
            return slots[r.index]
        return OP(r.index + n_ops) if r.kind == "op" else r

    epi = tuple(EpilogueOp(e.op, e.attrs, tuple(remap(r) for r in e.args)) for e in ua.epilogue)
    attrs = replace(anchor, epilogue=(*anchor.epilogue, *epi), outputs=tuple(remap(r) for r in ua.outputs))
    x_shape = tuple(x.ttype.shape)

    def emit(b, mapv):
        def in_move_shape(v):
            nv = mapv(v)
            if not views:
                return nv
            dims = b.add_constant(np.array(x_shape, dtype=np.int64), f"{move.name}/{v.name}/shape")
            return b.op("Reshape", [nv, dims], name=f"{move.name}/{v.name}/view")

        ins = [mapv(v) for v in move.inputs] + [in_move_shape(v) for v in extra]
        out_name = u.outputs[0].name
        node = b.add_node(
            "Fused",
            ins,
            attrs,
            name=move.name,
            keep_name=True,
            outputs=[f"{out_name}/fused" if views else out_name],
            domain=FUSED_DOMAIN,
        )
        out = node.outputs[0]
        if views:
            dims = b.add_constant(np.array(u_shape, dtype=np.int64), f"{out_name}/shape")
            out = b.add_node("Reshape", [out, dims], name=f"{move.name}/view", outputs=[out_name]).outputs[0]
        return [out]

    return Replacement(u.name, emit, (move, *views, u))


def _once(graph: Graph, caps: FusionCapabilities, rule) -> Graph:
    reps: list[Replacement] = []
    taken: set[str] = set()
    for node in graph.nodes:
        r = rule(graph, node, caps)
        if r is not None and not any(n.name in taken for n in r.absorbed):
            reps.append(r)
            taken.update(n.name for n in r.absorbed)
    return rebuild(graph, reps)


def fuse_data_epilogues(graph: Graph, caps: FusionCapabilities = REFERENCE) -> Graph:
    """CAST_THROUGH_MOVE, then MOVE_THEN_ELEMENTWISE, everywhere they apply."""
    return _once(_once(graph, caps, _cast_through_move), caps, _move_then_elementwise)
