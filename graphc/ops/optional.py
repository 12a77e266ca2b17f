"""Optional ops: OptionalHasElement and OptionalGetElement (opsets 15 and 18; 18 also takes a plain
tensor or sequence, which is always present), and the Optional constructor: of its input, or empty
of the type its TypeProto attribute names, which the converter writes as graphc.Optional with the
IR's type text in its attribute elem_type. At run time an empty optional is None and a present one its
tensor or sequence (graphc.runtime.reference.optional).

passes/lower_optionals.py removes both ops wherever the input's presence is known when compiling
(a tensor or a sequence, or no input at all); an optional graph input keeps them, which the
interpreter and the CPU target run and the CUDA target names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from graphc.ir.attrs import Attrs
from graphc.ir.text import TextParseError, parse_type
from graphc.ir.types import DType, OptionalType, TensorType
from graphc.ops.registry import Category, InferContext, register_op

# ONNX's Optional names an empty optional's type in a TypeProto attribute, a kind graphc's attrs
# (and the engines' attrs table) do not have: the converter writes graphc's own op instead, with
# the type as IR type text.
OPTIONAL_DOMAIN = "graphc"


@dataclass(frozen=True, kw_only=True)
class OptionalAttrs(Attrs):
    """elem_type: the empty optional's element type as IR type text (f32[*], seq<i64[*]>); "" when
    the node has an input, whose type it takes."""

    op_type: ClassVar[str] = "Optional"
    domain: ClassVar[str] = OPTIONAL_DOMAIN
    elem_type: str = ""


def _optional_infer(ctx: InferContext) -> list[OptionalType]:
    if ctx.has_input(0):
        t = ctx.input_types[0]
        if isinstance(t, OptionalType):
            ctx.fail(f"the input is already optional ({t}): optionals of optionals are not supported")
        return [OptionalType(t)]
    if not ctx.attrs.elem_type:
        ctx.fail("an Optional without an input needs its type attribute")
    try:
        t = parse_type(ctx.attrs.elem_type)
    except TextParseError as e:
        ctx.fail(f"type {ctx.attrs.elem_type!r} is not a tensor or sequence type: {e}")
    if isinstance(t, OptionalType):
        ctx.fail(f"type {t}: optionals of optionals are not supported")
    return [OptionalType(t)]


def _has_element_infer(ctx: InferContext) -> list[TensorType]:
    return [TensorType(DType.bool, ())]


def _get_element_infer(ctx: InferContext):
    if not ctx.has_input(0):
        ctx.fail("input 0 (the optional) is missing")
    t = ctx.input_types[0]
    return [t.elem if isinstance(t, OptionalType) else t]


register_op(
    "Optional",
    domain=OPTIONAL_DOMAIN,
    category=Category.SEQUENCE,
    infer=_optional_infer,
    attrs=OptionalAttrs,
    doc="ONNX's Optional: of its input, or empty of the type elem_type names (IR type text).",
)
register_op("OptionalHasElement", category=Category.SEQUENCE, infer=_has_element_infer)
register_op("OptionalGetElement", category=Category.SEQUENCE, infer=_get_element_infer)
