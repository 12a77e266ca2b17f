"""Channels-last (NHWC) ops of graphc's own (domain "graphc"), made by passes/layout.py for the
CUDA target; no ONNX file contains them.

- graphc.ConvNHWC(X, W, B?): 2-D convolution of X (N, H, W, C) with W (K, R, S, C/group) and an
  optional bias B (K,), giving Y (N, P, Q, K). Pads are explicit (auto_pad is resolved when the
  node is made), in ONNX order (top, left, bottom, right).
- graphc.MaxPoolNHWC / graphc.AveragePoolNHWC (X): 2-D pools of X (N, H, W, C), attributes as
  ONNX MaxPool / AveragePool (explicit pads, no Indices output).
- graphc.GlobalAveragePoolNHWC / graphc.GlobalMaxPoolNHWC (X): (N, H, W, C) -> (N, 1, 1, C).

Their inference and numpy references are the ONNX ops' own, through a transpose to NCHW and back,
so an NHWC op means exactly what the NCHW op it replaced meant.

This module holds the attrs classes, type inference and traits; the numpy kernels are in
graphc.runtime.reference.layout_ops.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from graphc.ir.attrs import Attrs, onnx_attrs_class
from graphc.ir.types import TensorType
from graphc.ops.registry import Category, InferContext, get_op, register_op
from graphc.runtime.reference.layout_ops import LAYOUT_DOMAIN as LAYOUT_DOMAIN
from graphc.runtime.reference.layout_ops import TO_NCHW as TO_NCHW
from graphc.runtime.reference.layout_ops import TO_NHWC as TO_NHWC
from graphc.runtime.reference.layout_ops import onnx_equivalent as onnx_equivalent


@dataclass(frozen=True, kw_only=True)
class ConvNHWCAttrs(Attrs):
    op_type: ClassVar[str] = "ConvNHWC"
    domain: ClassVar[str] = LAYOUT_DOMAIN
    kernel_shape: tuple = (1, 1)
    strides: tuple = (1, 1)
    pads: tuple = (0, 0, 0, 0)
    dilations: tuple = (1, 1)
    group: int = 1


@dataclass(frozen=True, kw_only=True)
class MaxPoolNHWCAttrs(Attrs):
    op_type: ClassVar[str] = "MaxPoolNHWC"
    domain: ClassVar[str] = LAYOUT_DOMAIN
    kernel_shape: tuple = (1, 1)
    strides: tuple = (1, 1)
    pads: tuple = (0, 0, 0, 0)
    dilations: tuple = (1, 1)
    ceil_mode: int = 0


@dataclass(frozen=True, kw_only=True)
class AveragePoolNHWCAttrs(Attrs):
    op_type: ClassVar[str] = "AveragePoolNHWC"
    domain: ClassVar[str] = LAYOUT_DOMAIN
    kernel_shape: tuple = (1, 1)
    strides: tuple = (1, 1)
    pads: tuple = (0, 0, 0, 0)
    dilations: tuple = (1, 1)
    ceil_mode: int = 0
    count_include_pad: int = 0


@dataclass(frozen=True, kw_only=True)
class GlobalPoolNHWCAttrs(Attrs):
    op_type: ClassVar[str] = "GlobalAveragePoolNHWC"
    domain: ClassVar[str] = LAYOUT_DOMAIN


@dataclass(frozen=True, kw_only=True)
class GlobalMaxPoolNHWCAttrs(Attrs):
    op_type: ClassVar[str] = "GlobalMaxPoolNHWC"
    domain: ClassVar[str] = LAYOUT_DOMAIN


def to_onnx_attrs(op: str, attrs: Attrs) -> Attrs:
    """The ONNX (NCHW) attrs of an NHWC op's attrs: the same fields, auto_pad NOTSET."""
    cls = onnx_attrs_class(onnx_equivalent(op))
    fields = {k: v for k, v in attrs.items()}
    return cls(**fields)


def _nchw(shape):
    return None if shape is None else (shape[0], shape[3], shape[1], shape[2])


def _nhwc(shape):
    return None if shape is None else (shape[0], shape[2], shape[3], shape[1])


def _check_rank4(ctx: InferContext, i: int) -> TensorType:
    t = ctx.type(i)
    if t.shape is not None and len(t.shape) != 4:
        ctx.fail(f"input {i} must have rank 4 (N, H, W, C), got {t}")
    return t


def _sub(ctx: InferContext, op: str, attrs: Attrs, types: list) -> InferContext:
    return InferContext(
        op=op,
        node_name=ctx.node_name,
        attrs=attrs,
        input_types=types,
        input_values=[None] * len(types),
        num_outputs=1,
    )


def _conv_infer(ctx: InferContext):
    x = _check_rank4(ctx, 0)
    w = _check_rank4(ctx, 1)
    a = ctx.attrs
    if len(a.kernel_shape) != 2 or len(a.strides) != 2 or len(a.dilations) != 2 or len(a.pads) != 4:
        ctx.fail("kernel_shape, strides, dilations take 2 values and pads 4")
    types = [x.with_shape(_nchw(x.shape)), w.with_shape(_nchw(w.shape))]
    if ctx.has_input(2):
        types.append(ctx.type(2))
    sub = _sub(ctx, "Conv", to_onnx_attrs("ConvNHWC", a), types)
    y = get_op("Conv").infer(sub)[0]
    return [y.with_shape(_nhwc(y.shape))]


def _pool_infer(op: str):
    def infer(ctx: InferContext):
        x = _check_rank4(ctx, 0)
        if op in ("MaxPoolNHWC", "AveragePoolNHWC") and len(ctx.attrs.kernel_shape) != 2:
            ctx.fail("kernel_shape takes 2 values")
        attrs = to_onnx_attrs(op, ctx.attrs) if op in ("MaxPoolNHWC", "AveragePoolNHWC") else None
        sub = _sub(ctx, onnx_equivalent(op), attrs, [x.with_shape(_nchw(x.shape))])
        y = get_op(onnx_equivalent(op)).infer(sub)[0]
        return [y.with_shape(_nhwc(y.shape))]

    return infer


register_op(
    "ConvNHWC",
    domain=LAYOUT_DOMAIN,
    attrs=ConvNHWCAttrs,
    category=Category.CONV,
    infer=_conv_infer,
    doc="2-D convolution, channels last: X (N,H,W,C), W (K,R,S,C/group), B (K,) -> (N,P,Q,K).",
)
for _op, _attrs in (
    ("MaxPoolNHWC", MaxPoolNHWCAttrs),
    ("AveragePoolNHWC", AveragePoolNHWCAttrs),
    ("GlobalAveragePoolNHWC", GlobalPoolNHWCAttrs),
    ("GlobalMaxPoolNHWC", GlobalMaxPoolNHWCAttrs),
):
    register_op(
        _op,
        domain=LAYOUT_DOMAIN,
        attrs=_attrs,
        category=Category.POOL,
        infer=_pool_infer(_op),
        doc=f"{onnx_equivalent(_op)} over a channels-last (N,H,W,C) input.",
    )
