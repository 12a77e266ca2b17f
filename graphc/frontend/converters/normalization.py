"""Converters of normalization ops.

- BatchNormalization 14 added `training_mode` (15 only widened types): the IR op. Before 14 the
  mode was told by the outputs (Y alone: inference; mean, var, saved_mean, saved_var: training,
  with outputs the later versions dropped) and before 7 by `is_test` (default 0, training).
  Inference forms convert; training forms are refused with a clear message. `spatial=0`
  (opset < 9: statistics per feature, of shape X.shape[1:]) is BatchNormalization on X
  flattened to 2-D, which is what the converter emits.
- InstanceNormalization 1 only adds the legacy `consumed_inputs`; 6 and 22 (types) are the IR op.
- GroupNormalization 18 took scale and bias per group; 21 per channel: the converter repeats
  each group's value over its channels.
- LayerNormalization 17, RMSNormalization 23, LpNormalization 1 and 22 (22 only adds types and
  spells out that a zero norm gives zeros), MeanVarianceNormalization 9 and 13 (types): the IR op.
"""

from __future__ import annotations

import numpy as np

from graphc.frontend.context import ConvertContext
from graphc.frontend.registry import converter, passthrough
from graphc.ir.graph import Value
from graphc.ops.normalization import HAS_RMS_NORMALIZATION

passthrough("BatchNormalization", since=14)
passthrough("InstanceNormalization", since=6)
passthrough("GroupNormalization", since=21)
passthrough("LayerNormalization", since=17)
passthrough("LpNormalization", since=1)
passthrough("MeanVarianceNormalization", since=9)
if HAS_RMS_NORMALIZATION:
    passthrough("RMSNormalization", since=23)


@converter("BatchNormalization", since=1)
def _batch_norm_old(ctx: ConvertContext) -> list[Value]:
    extra = [n for n in ctx.node.output[1:] if n]
    if extra:
        raise ctx.fail(
            f"training-mode outputs {extra} of opset < 14 (running and saved statistics) are not "
            "supported; export the model for inference (only output Y)"
        )
    if ctx.opset < 7 and not ctx.attr("is_test", 0):
        raise ctx.fail("is_test=0 (training mode) is not supported; export the model with is_test=1")
    # Older versions' defaults of these two equal the IR's (from the newest schema).
    attrs = {k: v for k, v in ctx.attrs.items() if k in ("epsilon", "momentum")}
    x = ctx.input(0)
    assert x is not None
    if ctx.attr("spatial", 1):
        node = ctx.emit("BatchNormalization", ctx.inputs, attrs, outputs=ctx.output_names[:1], name=ctx.name)
        return [node.outputs[0]]
    # spatial=0: per-feature statistics of shape X.shape[1:] = per-channel statistics of X
    # flattened to (N, C*D1*...*Dn).
    flat_shape = ctx.constant(np.array([-1], dtype=np.int64), "flat")
    params = [ctx.op("Reshape", [v, flat_shape]) for v in ctx.inputs[1:5]]
    x2 = ctx.op("Flatten", [x], {"axis": 1})
    y2 = ctx.op("BatchNormalization", [x2, *params], attrs)
    node = ctx.emit("Reshape", [y2, ctx.op("Shape", [x])], {}, outputs=ctx.output_names[:1], name=ctx.name)
    return [node.outputs[0]]


@converter("InstanceNormalization", since=1)
def _instance_norm_v1(ctx: ConvertContext) -> list[Value]:
    node = ctx.emit(
        "InstanceNormalization",
        ctx.inputs,
        ctx.typed_attrs(drop=("consumed_inputs",)),
        outputs=ctx.output_names,
        name=ctx.name,
    )
    return list(node.outputs)


@converter("GroupNormalization", since=18)
def _group_norm_18(ctx: ConvertContext) -> list[Value]:
    """Opset 18: scale and bias of shape (num_groups,) -> per channel (C,)."""
    x = ctx.input(0)
    assert x is not None
    groups = int(ctx.attr("num_groups"))
    shape = x.ttype.shape
    c = shape[1] if shape is not None and len(shape) > 1 else None
    if not isinstance(c, int):
        raise ctx.fail("the channel count (dim 1 of X) must be known to convert the opset 18 form")
    if groups <= 0 or c % groups:
        raise ctx.fail(f"{c} channels do not divide into num_groups={groups}")
    per_group = c // groups
    params = []
    for i, hint in ((1, "scale"), (2, "bias")):
        v = ctx.input(i)
        assert v is not None
        known = ctx.known(i)
        if known is not None:
            params.append(ctx.constant(np.repeat(np.asarray(known).reshape(-1), per_group), hint))
            continue
        col = ctx.op("Reshape", [v, ctx.constant(np.array([groups, 1], dtype=np.int64), f"{hint}_col")])
        wide = ctx.op("Expand", [col, ctx.constant(np.array([groups, per_group], dtype=np.int64), "wide")])
        params.append(ctx.op("Reshape", [wide, ctx.constant(np.array([c], dtype=np.int64), "channels")]))
    attrs = {k: v for k, v in ctx.attrs.items() if k in ("num_groups", "epsilon")}
    node = ctx.emit("GroupNormalization", [x, *params], attrs, outputs=ctx.output_names, name=ctx.name)
    return list(node.outputs)
