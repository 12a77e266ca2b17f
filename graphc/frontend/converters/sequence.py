"""Converters of sequence ops: every one was introduced in opset 11 and has kept its form since
(SplitToSequence-24 only widened its types)."""

from __future__ import annotations

from graphc.frontend.context import ConvertContext
from graphc.frontend.registry import converter, passthrough
from graphc.ir.graph import Value

passthrough(
    "SplitToSequence",
    "SequenceAt",
    "SequenceConstruct",
    "SequenceEmpty",
    "SequenceInsert",
    "SequenceErase",
    "SequenceLength",
    "ConcatFromSequence",
    since=11,
)
# Optional ops (graphc/ops/optional.py): 15 took optionals only, 18 also plain tensors and sequences.
passthrough("OptionalHasElement", "OptionalGetElement", since=15)


@converter("Optional", since=15)
def _optional(ctx: ConvertContext) -> list[Value]:
    """ONNX's TypeProto attribute as the IR's type text (graphc's attribute elem_type)."""
    from graphc.frontend.convert import type_from_proto

    ins = [v for v in ctx.inputs if v is not None]
    attrs = {}
    tp = ctx.attr("type", None)
    if not ins:
        if tp is None:
            raise ctx.fail("an Optional without an input needs its type attribute")
        attrs["elem_type"] = str(type_from_proto(tp, f"Optional node '{ctx.name}' type"))
    return list(ctx.emit("Optional", ins, attrs, outputs=ctx.output_names, name=ctx.name, domain="graphc").outputs)
