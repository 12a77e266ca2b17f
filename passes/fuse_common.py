"""Shared by fuse_epilogue and fuse_elementwise: which elementwise nodes a fused node may hold,
shape checks, and assembling a Fused node's inputs and epilogue.

A node can go into a fused epilogue when it is an ONNX elementwise op (registry category
ELEMENTWISE) that the target can render (its FusionCapabilities, passes/capabilities.py, handed in
through the target context), with one output, on dtypes the target stores, and no omitted input
in the middle (Clip(x, , max)): a fused node's input list cannot end in an omitted input, so such
a node stays on its own.

Every value an epilogue reads from outside must broadcast INTO the fused node's output shape
(each of its trailing dims 1 or the output's), so the kernel reads it by index arithmetic and
never computes on a larger shape than it stores.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from graphc.ir.attrs import Attrs
from graphc.ir.graph import Node, Value
from graphc.ir.types import Shape, TensorType
from graphc.ops.fused import OP, EpilogueOp, Ref
from graphc.ops.registry import Category, get_op
from graphc.passes.capabilities import FusionCapabilities

# Ops that never go into a fused node although they render: Dropout may carry a mask output or a
# training flag (simplify removes the inference form anyway).
EXCLUDED = frozenset({"Dropout"})


def supported_value(v: Value | None, caps: FusionCapabilities) -> bool:
    return v is None or (isinstance(v.type, TensorType) and caps.stores(v.type.dtype))


def fusable_elementwise(node: Node, caps: FusionCapabilities) -> bool:
    """An elementwise node that a fused node can hold (see the module doc)."""
    if node.domain or node.op in EXCLUDED or not caps.renders(node.op) or len(node.outputs) != 1:
        return False
    if get_op(node.op).category is not Category.ELEMENTWISE:
        return False
    if any(v is None for v in node.inputs) or not node.inputs:
        return False
    out = node.outputs[0].type
    if not isinstance(out, TensorType) or out.shape is None:
        return False
    return all(supported_value(v, caps) for v in (*node.inputs, *node.outputs))


def known_shape(shape: Shape | None) -> bool:
    """A shape whose rank and dims are all known (ints or named symbols)."""
    return shape is not None and all(d is not None for d in shape)


def same_shape(a: Value | Shape | None, b: Value | Shape | None) -> bool:
    """Both have the same fully known shape (a broadcast did not grow one of them). Takes values
    or shapes; a value that is not a tensor has no shape."""
    sa, sb = _shape_of(a), _shape_of(b)
    return known_shape(sa) and sa == sb


def _shape_of(x: Value | Shape | None) -> Shape | None:
    if isinstance(x, Value):
        return x.type.shape if isinstance(x.type, TensorType) else None
    return x


def broadcasts_into(t: object, out: Shape | None) -> bool:
    """The tensor type's shape broadcasts into `out` without growing it."""
    if not isinstance(t, TensorType) or t.shape is None or not known_shape(out):
        return False
    if len(t.shape) > len(out):
        return False
    return all(d == 1 or d == o for d, o in zip(reversed(t.shape), reversed(out), strict=False))


class EpilogueBuilder:
    """Collects a fused node's extra inputs (deduplicated, after `first` anchor inputs) and its
    epilogue ops; `refs` maps old value names to the Ref that stands for them inside."""

    def __init__(self, first: int, refs: dict[str, Ref] | None = None):
        self.first = first
        self.inputs: list[Value] = []
        self._slots: dict[str, int] = {}
        self.ops: list[EpilogueOp] = []
        self.refs: dict[str, Ref] = dict(refs or {})

    def input(self, v: Value) -> Ref:
        if v.name not in self._slots:
            self._slots[v.name] = self.first + len(self.inputs)
            self.inputs.append(v)
        return Ref("in", self._slots[v.name])

    def op(self, op: str, attrs: Attrs, args: Sequence[Ref]) -> Ref:
        self.ops.append(EpilogueOp(op, attrs, tuple(args)))
        return OP(len(self.ops) - 1)

    def add_node(self, node: Node, mapv: Callable[[Value], Value]) -> Ref:
        """Append an old-graph node: inputs made inside are referenced, the rest become inputs."""
        args = [self.refs[v.name] if v.name in self.refs else self.input(mapv(v)) for v in node.inputs]
        ref = self.op(node.op, node.attrs, args)
        self.refs[node.outputs[0].name] = ref
        return ref
