"""Converters of reductions and the softmax family.

- ReduceSum took `axes` as an input from opset 13, the other Reduce* from 18; before that `axes`
  was an attribute (absent or empty: all axes) and `noop_with_empty_axes` did not exist. The
  converter moves the attribute into a constant input.
- ReduceMax/ReduceMin 20 only added bool, ReduceLogSum/ReduceLogSumExp 28 only dropped ints:
  same semantics as 18.
- ArgMax/ArgMin: 11 allowed negative axes, 12 added `select_last_index` (default: first index,
  the older behaviour), so every version is the IR op.
- Softmax/LogSoftmax/Hardmax before 13 flattened the input to 2-D at `axis` (default 1) and
  normalized each row of the trailing block; 13 normalizes along one axis (default -1).
"""

from __future__ import annotations

import numpy as np

from graphc.frontend.context import ConvertContext
from graphc.frontend.registry import converter, passthrough
from graphc.ir.graph import Value
from graphc.ops.reduction import REDUCE_OPS

# Every Reduce* op but ReduceSum took its axes as an input from opset 18 (ReduceSum from 13).
_REDUCE_18 = tuple(sorted(REDUCE_OPS - {"ReduceSum"}))

passthrough("ReduceSum", since=13)
passthrough(*_REDUCE_18, since=18)
passthrough("ArgMax", "ArgMin", since=1)
passthrough("Softmax", "LogSoftmax", "Hardmax", since=13)


def _reduce_axes_attr(ctx: ConvertContext) -> list[Value]:
    """Reduce* with an `axes` attribute: the attribute becomes a constant int64 input."""
    axes = ctx.attr("axes")
    inputs: list[Value | None] = [ctx.input(0)]
    if axes:
        inputs.append(ctx.constant(np.array(axes, dtype=np.int64), "axes"))
    attrs = ctx.typed_attrs(drop=("axes",))
    node = ctx.emit(ctx.op_type, inputs, attrs, outputs=ctx.output_names, name=ctx.name)
    return list(node.outputs)


converter("ReduceSum", since=1)(_reduce_axes_attr)
for _op in _REDUCE_18:
    converter(_op, since=1)(_reduce_axes_attr)


def _softmax_flattened(ctx: ConvertContext) -> list[Value]:
    """Opset < 13: y = reshape(op(flatten(x, axis), axis=-1), shape(x))."""
    x = ctx.input(0)
    assert x is not None
    t = x.ttype
    if t.shape is None:
        raise ctx.fail("the input rank must be known to convert the opset < 13 (flattening) form")
    rank = len(t.shape)
    axis = int(ctx.attr("axis", 1))
    if not -rank <= axis < rank:
        raise ctx.fail(f"axis {axis} is out of range for rank {rank}")
    axis = axis + rank if axis < 0 else axis
    if axis == rank - 1:
        # Normalizing the trailing block of one dim is normalizing the last axis.
        node = ctx.emit(ctx.op_type, [x], {"axis": -1}, outputs=ctx.output_names, name=ctx.name)
        return list(node.outputs)
    flat = ctx.op("Flatten", [x], {"axis": axis})
    y2 = ctx.op(ctx.op_type, [flat], {"axis": -1})
    # Shape of a static input is known at build time, so the Reshape target resolves.
    shape = ctx.op("Shape", [x])
    node = ctx.emit("Reshape", [y2, shape], {}, outputs=ctx.output_names, name=ctx.name)
    return list(node.outputs)


for _op in ("Softmax", "LogSoftmax", "Hardmax"):
    converter(_op, since=1)(_softmax_flattened)
