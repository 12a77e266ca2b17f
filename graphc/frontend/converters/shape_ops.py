"""Converters of shape ops. Squeeze/Unsqueeze took `axes` as an attribute before opset 13."""

from __future__ import annotations

import numpy as np

from graphc.frontend.context import ConvertContext
from graphc.frontend.registry import converter, passthrough

passthrough("Shape", "Size", "Range", "ConstantOfShape", "Flatten", since=1)
passthrough("Expand", since=8)
passthrough("Reshape", since=5)
passthrough("Squeeze", "Unsqueeze", since=13)
passthrough("Identity", since=1)


def _axes_attr_to_input(ctx: ConvertContext):
    axes = ctx.attr("axes")
    inputs = list(ctx.inputs[:1])
    if axes is not None:
        inputs.append(ctx.constant(np.array(axes, dtype=np.int64), "axes"))
    node = ctx.emit(ctx.op_type, inputs, {}, outputs=ctx.output_names, name=ctx.name)
    return node.outputs


converter("Squeeze", since=1)(_axes_attr_to_input)
converter("Unsqueeze", since=1)(_axes_attr_to_input)
