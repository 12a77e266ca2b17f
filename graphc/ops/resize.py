"""Resize (opset 19 form): nearest, N-linear and N-cubic interpolation, every coordinate
transformation mode, roi for tf_crop_and_resize, scales or sizes, axes, keep_aspect_ratio_policy
and antialias.

Where the ONNX reference implementation and ONNX Runtime disagree, graphc follows the spec's text
and ONNX Runtime: `length_resized` is the integer output length (see `source_coords`), and
pytorch_half_pixel maps a length-1 output to coordinate 0 (the reference uses -0.5).

Interpolation is separable, so the reference resizes one axis at a time: per axis it computes, for
every output coordinate, the source coordinate, a window of taps and their weights, and sums the
taps (a loop over a few taps, vectorized over the whole tensor). Coordinates and weights follow the
ONNX reference formulas (windows are edge-clamped; `exclude_outside` drops taps outside the input
and renormalizes). Output sizes from scales are floor(float32(in) * float32(scale)), the float32
product ONNX Runtime and ONNX shape inference compute.

This module holds type inference and traits; the numpy kernels are in
graphc.runtime.reference.resize.
"""

from __future__ import annotations

from graphc.ops.registry import Category, InferContext, register_op
from graphc.runtime.reference.resize import _interp_axis as _interp_axis
from graphc.runtime.reference.resize import interp_window as interp_window
from graphc.runtime.reference.resize import nearest_index as nearest_index
from graphc.runtime.reference.resize import resize_plan as resize_plan
from graphc.runtime.reference.resize import source_coords as source_coords

MODES = ("nearest", "linear", "cubic")
COORD_MODES = (
    "half_pixel",
    "half_pixel_symmetric",
    "pytorch_half_pixel",
    "align_corners",
    "asymmetric",
    "tf_crop_and_resize",
)
NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")
ASPECT_POLICIES = ("stretch", "not_larger", "not_smaller")


def _check_attrs(attrs, fail) -> None:
    for name, allowed in (
        ("mode", MODES),
        ("coordinate_transformation_mode", COORD_MODES),
        ("nearest_mode", NEAREST_MODES),
        ("keep_aspect_ratio_policy", ASPECT_POLICIES),
    ):
        v = getattr(attrs, name)
        if v not in allowed:
            fail(f"{name} {v!r} is not one of {', '.join(allowed)}")


def _resize_infer(ctx: InferContext):
    t = ctx.type(0)
    _check_attrs(ctx.attrs, ctx.fail)
    if not t.dtype.is_float and not t.dtype.is_int:
        ctx.fail(f"input dtype {t.dtype.name} is not numeric")
    if t.shape is None:
        return [t]
    if ctx.has_input(2) and not ctx.type(2).dtype.is_float:
        ctx.fail(f"scales must be float, got {ctx.type(2)}")
    scales = ctx.value(2) if ctx.has_input(2) else None
    sizes = ctx.value(3) if ctx.has_input(3) else None
    unknown = any(ctx.has_input(i) and ctx.value(i) is None for i in (2, 3))
    plan = resize_plan(t.shape, ctx.attrs, None, scales, sizes, ctx.fail, unknown=unknown)
    return [t.with_shape(plan.out_shape)]


register_op(
    "Resize",
    category=Category.DATA,
    infer=_resize_infer,
    static_inputs=(1, 2, 3),
)
