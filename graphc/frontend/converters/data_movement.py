"""Converters of data movement ops.

`since` versions follow the ONNX operator changelog; a version whose form differs from the newest
(an attribute that later became an input, other defaults) has a converter that emits the newest
form:

- Concat-1: `axis` defaulted to 1 (required from 4 on).
- Split-1/2/11: `split` was an attribute (Split-1 also took it as an input); from 13 it is an
  input, and 18 added `num_outputs` (a node without either splits evenly in both forms).
- Slice-1: starts/ends/axes were attributes; from 10 they are inputs, with steps.
- TopK-1: `k` was an attribute; from 10 it is an input (11 added largest/sorted, defaults = 10).
- Pad-1/2: `paddings`/`pads` and `value` were attributes; from 11 they are inputs (18 added
  axes, 19 the wrap mode).
- Scatter-9/11: deprecated spelling of ScatterElements.
- Resize-10: scales only, asymmetric coordinates, nearest rounding down when upsampling and up
  when downsampling (ONNX Runtime's reading of the underspecified op); Upsample-7/9 likewise.
- Resize-11: roi and scales were required inputs (empty when unused), which the IR op treats
  as omitted; its tf_half_pixel_for_nn mode was removed in 13 and is not supported.
Other versions differ only in allowed types or negative axes, so they pass through.
"""

from __future__ import annotations

import numpy as np

from graphc.frontend.context import ConvertContext
from graphc.frontend.registry import converter, passthrough

passthrough("Transpose", "Gather", "DepthToSpace", "SpaceToDepth", since=1)
passthrough("Concat", since=4)
passthrough("Tile", since=6)
passthrough("NonZero", "OneHot", "Compress", "EyeLike", since=9)
passthrough("Slice", "TopK", "ReverseSequence", since=10)
passthrough("GatherElements", "GatherND", "ScatterElements", "ScatterND", since=11)
passthrough("CumSum", "Unique", "Pad", since=11)
passthrough("Split", "Resize", since=13)
passthrough("Trilu", since=14)
passthrough("CenterCropPad", since=18)
passthrough("CumProd", since=26)
passthrough("TensorScatter", since=24)


def _same_node(ctx: ConvertContext, inputs, attrs, op: str | None = None):
    op = op or ctx.op_type
    return ctx.emit(op, inputs, attrs, outputs=ctx.output_names, name=ctx.name).outputs


def _i64(ctx: ConvertContext, values, hint: str):
    return ctx.constant(np.array(values, dtype=np.int64), hint)


@converter("Concat", since=1)
def _concat_v1(ctx: ConvertContext):
    return _same_node(ctx, ctx.inputs, {"axis": ctx.attr("axis", 1)})


@converter("Split", since=1)
def _split_v1(ctx: ConvertContext):
    split = ctx.attr("split")
    inputs = list(ctx.inputs[:1])
    if split is not None:
        inputs.append(_i64(ctx, split, "split"))
    elif ctx.input(1) is not None:  # Split-1 only: split as a second input
        inputs.append(ctx.input(1))
    return _same_node(ctx, inputs, {"axis": ctx.attr("axis", 0)})


@converter("Slice", since=1)
def _slice_v1(ctx: ConvertContext):
    starts, ends, axes = ctx.attr("starts"), ctx.attr("ends"), ctx.attr("axes")
    if starts is None or ends is None:
        raise ctx.fail("starts and ends are required")
    inputs = [ctx.input(0), _i64(ctx, starts, "starts"), _i64(ctx, ends, "ends")]
    if axes is not None:
        inputs.append(_i64(ctx, axes, "axes"))
    return _same_node(ctx, inputs, {})


@converter("TopK", since=1)
def _topk_v1(ctx: ConvertContext):
    k = ctx.attr("k")
    if k is None:
        raise ctx.fail("attribute k is required")
    return _same_node(ctx, [ctx.input(0), _i64(ctx, [k], "k")], {"axis": ctx.attr("axis", -1)})


def _pad_attrs_to_inputs(ctx: ConvertContext):
    pads = ctx.attr("pads", ctx.attr("paddings"))
    if pads is None:
        raise ctx.fail("attribute pads is required")
    x = ctx.input(0)
    dtype = x.ttype.dtype.numpy
    inputs = [x, _i64(ctx, pads, "pads")]
    mode = ctx.attr("mode", "constant")
    if mode == "constant":
        inputs.append(ctx.constant(np.array(ctx.attr("value", 0.0)).astype(dtype), "value"))
    return _same_node(ctx, inputs, {"mode": mode})


converter("Pad", since=1)(_pad_attrs_to_inputs)


@converter("Scatter", since=9)
def _scatter(ctx: ConvertContext):
    return _same_node(ctx, ctx.inputs, {"axis": ctx.attr("axis", 0)}, op="ScatterElements")


# ---- Resize / Upsample -------------------------------------------------------------------------


def _legacy_resize(ctx: ConvertContext, scales_value, scales_input, *, upsample: bool = False):
    """Resize-10 / Upsample: asymmetric coordinates; nearest picks floor(x) on upsampled axes and
    ceil(x) on downsampled ones. Axes of both kinds take two Resize nodes (nearest is separable).
    Upsample's scales are >= 1 by its spec, so it needs no constant scales."""
    mode = ctx.attr("mode", "nearest")
    if mode == "bilinear":  # Upsample-1 spelling
        mode = "linear"
    if mode not in ("nearest", "linear"):
        raise ctx.fail(f"mode {mode!r} is not supported")
    base = {"mode": mode, "coordinate_transformation_mode": "asymmetric"}
    x = ctx.input(0)
    if mode == "linear":
        return _same_node(ctx, [x, None, scales_input], base, op="Resize")
    if scales_value is None and upsample:
        return _same_node(ctx, [x, None, scales_input], {**base, "nearest_mode": "floor"}, "Resize")
    if scales_value is None:
        raise ctx.fail("nearest mode needs constant scales (its rounding depends on them)")
    scales = np.asarray(scales_value, dtype=np.float32).reshape(-1)
    up = np.where(scales < 1, 1, scales).astype(np.float32)
    down = np.where(scales > 1, 1, scales).astype(np.float32)
    if np.all(down == 1) or np.all(up == 1):
        nearest = "floor" if np.all(down == 1) else "ceil"
        return _same_node(ctx, [x, None, scales_input], {**base, "nearest_mode": nearest}, "Resize")
    mid = ctx.op("Resize", [x, None, ctx.constant(up, "scales_up")], {**base, "nearest_mode": "floor"})
    attrs = {**base, "nearest_mode": "ceil"}
    return _same_node(ctx, [mid, None, ctx.constant(down, "scales_down")], attrs, "Resize")


@converter("Resize", since=10)
def _resize_v10(ctx: ConvertContext):
    return _legacy_resize(ctx, ctx.known(1), ctx.input(1))


@converter("Upsample", since=7)
def _upsample(ctx: ConvertContext):
    scales = ctx.attr("scales")
    if scales is not None:  # Upsample-7: an attribute
        value = np.array(scales, dtype=np.float32)
        return _legacy_resize(ctx, value, ctx.constant(value, "scales"), upsample=True)
    return _legacy_resize(ctx, ctx.known(1), ctx.input(1), upsample=True)


@converter("Resize", since=11)
def _resize_v11(ctx: ConvertContext):
    if ctx.attr("coordinate_transformation_mode") == "tf_half_pixel_for_nn":
        raise ctx.fail("coordinate_transformation_mode 'tf_half_pixel_for_nn' is not supported")
    return _same_node(ctx, ctx.inputs, ctx.typed_attrs())
