"""Constant: becomes a graph constant."""

from __future__ import annotations

import numpy as np

from graphc.frontend.context import ConvertContext
from graphc.frontend.registry import converter


@converter("Constant", since=1)
def constant(ctx: ConvertContext):
    if len(ctx.attrs) != 1:
        raise ctx.fail(f"expected exactly one value attribute, got {sorted(ctx.attrs)}")
    ((key, val),) = ctx.attrs.items()
    if key == "value":
        data = np.asarray(val)
    elif key == "value_float":
        data = np.array(val, dtype=np.float32)
    elif key == "value_floats":
        data = np.array(val, dtype=np.float32).reshape(-1)
    elif key == "value_int":
        data = np.array(val, dtype=np.int64)
    elif key == "value_ints":
        data = np.array(val, dtype=np.int64).reshape(-1)
    elif key == "value_string":
        data = np.array(val, dtype=object)
    elif key == "value_strings":
        data = np.array(val, dtype=object).reshape(-1)
    else:
        raise ctx.fail(f"value attribute '{key}' is not supported")
    name = ctx.node.output[0]
    return [ctx.builder.add_constant(data, name)]
