"""Converters of the classical-ML domain (ai.onnx.ml) onto graphc's standard ops, so they run on
every target: Binarizer (x > threshold as 1 / 0 of x's type, an integer x against the threshold's
floor) and ArrayFeatureExtractor (a Gather
of the last axis; a 1-D input gives one row [1, k], as ONNX Runtime and ONNX's reference do)."""

from __future__ import annotations

import math

import numpy as np

from graphc.frontend.context import ConvertContext
from graphc.frontend.registry import converter, passthrough
from graphc.ir.graph import Value
from graphc.ir.types import DType, TensorType

ML = "ai.onnx.ml"


def _input(ctx: ConvertContext, i: int, what: str) -> Value:
    v = ctx.required_input(i, what)
    if not isinstance(v.type, TensorType):
        raise ctx.fail(f"input {i} ({what}) must be a tensor, got {v.type}")
    return v


@converter("Binarizer", since=1, domain=ML)
def _binarizer(ctx: ConvertContext) -> list[Value]:
    x = _input(ctx, 0, "X")
    dt = x.ttype.dtype
    if dt not in (DType.float16, DType.float32, DType.float64, DType.int32, DType.int64):
        raise ctx.fail(f"X is {dt.name}; Binarizer takes float, double, int32 or int64")
    threshold = float(ctx.attr("threshold", 0.0))
    # integers: x > t exactly when x > floor(t) (a cast would truncate -0.5 to 0)
    t = ctx.constant(np.asarray(threshold if dt.is_float else math.floor(threshold), dtype=dt.numpy), "threshold")
    above = ctx.op("Greater", [x, t], name=f"{ctx.name}/Greater")
    return [ctx.op("Cast", [above], {"to": dt.value}, name=ctx.name)]


@converter("ArrayFeatureExtractor", since=1, domain=ML)
def _array_feature_extractor(ctx: ConvertContext) -> list[Value]:
    x, y = _input(ctx, 0, "X"), _input(ctx, 1, "Y")
    if y.ttype.dtype != DType.int64:
        raise ctx.fail(f"Y (the indices) is {y.ttype.dtype.name}, not int64")
    rank = None if x.ttype.shape is None else len(x.ttype.shape)
    if rank is None or rank < 1:
        raise ctx.fail(f"X {x.type} must have a known rank of at least 1")
    flat = ctx.op("Reshape", [y, ctx.constant(np.array([-1], np.int64), "flat")], name=f"{ctx.name}/indices")
    picked = ctx.op("Gather", [x, flat], {"axis": rank - 1}, name=f"{ctx.name}/Gather" if rank == 1 else ctx.name)
    if rank > 1:
        return [picked]
    return [ctx.op("Unsqueeze", [picked, ctx.constant(np.array([0], np.int64), "row")], name=ctx.name)]


passthrough("TreeEnsemble", since=5, domain=ML)  # graphc/ops/ml.py
