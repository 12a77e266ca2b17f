"""Sequence ops: SplitToSequence, SequenceAt, SequenceConstruct, SequenceEmpty, SequenceInsert,
SequenceErase, SequenceLength, ConcatFromSequence.

At run time a sequence is a Python list of numpy arrays. Its type (SequenceType) holds one element
type that describes every element: a dim is an int only where all elements agree on it, and the
length is known where it follows from the graph (SequenceConstruct, inserts and erases on a known
length, splits of a static axis).

This module holds type inference and traits; the numpy kernels are in
graphc.runtime.reference.sequence.
"""

from __future__ import annotations

import numpy as np

from graphc.ir.types import Dim, DType, SequenceType, TensorType
from graphc.ops.registry import Category, InferContext, register_op
from graphc.runtime.reference.sequence import _split_lengths


def _seq(ctx: InferContext, i: int) -> SequenceType:
    if not ctx.has_input(i):
        ctx.fail(f"input {i} is missing")
    t = ctx.input_types[i]
    if not isinstance(t, SequenceType):
        ctx.fail(f"input {i} must be a sequence, got {t}")
    return t


def merge_elem(ctx: InferContext, a: TensorType, b: TensorType) -> TensorType:
    """One element type describing elements of types a and b (dims kept where they agree)."""
    if a.dtype != b.dtype:
        ctx.fail(f"sequence elements have different dtypes {a.dtype.name} and {b.dtype.name}")
    if a.shape is None or b.shape is None or len(a.shape) != len(b.shape):
        return a.with_shape(None)
    return a.with_shape(tuple(x if x == y else None for x, y in zip(a.shape, b.shape, strict=True)))


def _elem_of_all(ctx: InferContext, types: list[TensorType]) -> TensorType:
    elem = types[0]
    for t in types[1:]:
        elem = merge_elem(ctx, elem, t)
    return elem


def _position(ctx: InferContext, i: int) -> int | None:
    if not ctx.has_input(i):
        return None
    t = ctx.type(i)
    if t.dtype not in (DType.int32, DType.int64):
        ctx.fail(f"position must be int32 or int64, got {t}")
    if t.shape is not None and len(t.shape) > 1:
        ctx.fail(f"position must be a scalar, got {t}")
    v = ctx.int_list(i)
    return None if v is None else v[0]


def _check_position(ctx: InferContext, pos: int | None, length: int | None, inclusive: bool) -> None:
    if pos is None or length is None:
        return
    hi = length if inclusive else length - 1
    if not -length <= pos <= hi:
        ctx.fail(f"position {pos} is out of range for a sequence of length {length}")


# ---- SequenceEmpty, SequenceConstruct ----------------------------------------------------------


def _empty_dtype(attrs) -> DType:
    return DType.float32 if attrs.dtype is None else DType.from_onnx(attrs.dtype)


def _empty_infer(ctx: InferContext):
    try:
        dtype = _empty_dtype(ctx.attrs)
    except ValueError as e:
        ctx.fail(str(e))
    return [SequenceType(TensorType(dtype, None), 0)]


register_op(
    "SequenceEmpty",
    category=Category.SEQUENCE,
    infer=_empty_infer,
)


def _construct_infer(ctx: InferContext):
    types = [ctx.type(i) for i in range(len(ctx.input_types))]
    if not types:
        ctx.fail("needs at least one input")
    return [SequenceType(_elem_of_all(ctx, types), len(types))]


register_op(
    "SequenceConstruct",
    category=Category.SEQUENCE,
    infer=_construct_infer,
)

# ---- SequenceAt, SequenceLength ----------------------------------------------------------------


def _at_infer(ctx: InferContext):
    s = _seq(ctx, 0)
    _check_position(ctx, _position(ctx, 1), s.length, inclusive=False)
    return [s.elem]


register_op("SequenceAt", category=Category.SEQUENCE, infer=_at_infer)


def _length_infer(ctx: InferContext):
    _seq(ctx, 0)
    return [TensorType(DType.int64, ())]


def _length_value(ctx: InferContext):
    s = _seq(ctx, 0)
    return [None if s.length is None else np.array(s.length, dtype=np.int64)]


register_op(
    "SequenceLength",
    category=Category.SEQUENCE,
    infer=_length_infer,
    value_infer=_length_value,
)

# ---- SequenceInsert, SequenceErase -------------------------------------------------------------


def _insert_infer(ctx: InferContext):
    s, t = _seq(ctx, 0), ctx.type(1)
    _check_position(ctx, _position(ctx, 2), s.length, inclusive=True)
    # An empty sequence's element type describes no element: the new tensor's type is exact.
    elem = t if s.length == 0 and s.elem.dtype == t.dtype else merge_elem(ctx, s.elem, t)
    return [SequenceType(elem, None if s.length is None else s.length + 1)]


register_op("SequenceInsert", category=Category.SEQUENCE, infer=_insert_infer)


def _erase_infer(ctx: InferContext):
    s = _seq(ctx, 0)
    if s.length == 0:
        ctx.fail("cannot erase from an empty sequence")
    _check_position(ctx, _position(ctx, 1), s.length, inclusive=False)
    return [SequenceType(s.elem, None if s.length is None else s.length - 1)]


register_op("SequenceErase", category=Category.SEQUENCE, infer=_erase_infer)


def _split_to_seq_infer(ctx: InferContext):
    t = ctx.type(0)
    if t.shape is None:
        return [SequenceType(t, None)]
    rank = len(t.shape)
    axis = ctx.axis(ctx.attrs.axis, rank)
    dim = t.shape[axis]
    has_split = ctx.has_input(1)
    split = ctx.value(1) if has_split else None
    if has_split and split is None:
        st = ctx.type(1)
        n = st.shape[0] if st.shape is not None and len(st.shape) == 1 else None
        shape = t.shape[:axis] + (None,) + t.shape[axis + 1 :]
        return [SequenceType(t.with_shape(shape), n if isinstance(n, int) else None)]
    try:
        lengths = _split_lengths(dim, split)
    except ValueError as e:
        ctx.fail(str(e))
    if lengths is not None and isinstance(dim, int) and sum(lengths) != dim:
        ctx.fail(f"split {lengths} does not sum to the axis size {dim}")
    if not has_split:
        # Parts of length 1; keepdims=0 drops the axis.
        shape = t.shape[:axis] + ((1,) if ctx.attrs.keepdims else ()) + t.shape[axis + 1 :]
        return [SequenceType(t.with_shape(shape), None if lengths is None else len(lengths))]
    if lengths is None:
        part: Dim = None
        n = None
    else:
        part = lengths[0] if len(set(lengths)) == 1 else None
        n = len(lengths)
    return [SequenceType(t.with_shape(t.shape[:axis] + (part,) + t.shape[axis + 1 :]), n)]


register_op(
    "SplitToSequence",
    category=Category.SEQUENCE,
    infer=_split_to_seq_infer,
    static_inputs=(1,),
)


def _concat_from_seq_infer(ctx: InferContext):
    s = _seq(ctx, 0)
    elem = s.elem
    if elem.shape is None:
        return [elem]
    rank = len(elem.shape)
    if ctx.attrs.new_axis:
        axis = ctx.axis(ctx.attrs.axis, rank + 1)
        return [elem.with_shape(elem.shape[:axis] + (s.length,) + elem.shape[axis:])]
    if rank == 0:
        ctx.fail("cannot concatenate scalars without new_axis")
    axis = ctx.axis(ctx.attrs.axis, rank)
    d = elem.shape[axis]
    total = d * s.length if isinstance(d, int) and s.length is not None else None
    return [elem.with_shape(elem.shape[:axis] + (total,) + elem.shape[axis + 1 :])]


register_op(
    "ConcatFromSequence",
    category=Category.SEQUENCE,
    infer=_concat_from_seq_infer,
)
