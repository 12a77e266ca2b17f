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

This module holds the numpy kernels (what the interpreter and a CPU engine run); type
inference and traits are in graphc.ops.layout_ops.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from graphc.runtime.attrs import AttrRecord, make_record
from graphc.runtime.reference.registry import get_kernel, register_kernel

LAYOUT_DOMAIN = "graphc"

TO_NHWC = (0, 2, 3, 1)  # Transpose perm NCHW -> NHWC
TO_NCHW = (0, 3, 1, 2)  # Transpose perm NHWC -> NCHW


def onnx_equivalent(op: str) -> str:
    """The ONNX op an NHWC op stands for ("ConvNHWC" -> "Conv")."""
    return op[: -len("NHWC")]


def to_onnx_attrs(op: str, attrs: Any) -> AttrRecord:
    """The ONNX (NCHW) attrs of an NHWC op's attrs: the same fields, the ONNX op's defaults for
    the rest (auto_pad NOTSET), from the runtime's attrs table."""
    return make_record(onnx_equivalent(op), dict(attrs.items()))


def _conv_compute(ins, attrs, n):
    x = np.transpose(ins[0], TO_NCHW)
    w = np.transpose(ins[1], TO_NCHW)
    args = [x, w, *ins[2:3]]
    y = get_kernel("Conv")(args, to_onnx_attrs("ConvNHWC", attrs), 1)[0]
    return [np.ascontiguousarray(np.transpose(y, TO_NHWC))]


def _pool_compute(op: str):
    def compute(ins, attrs, n):
        x = np.transpose(ins[0], TO_NCHW)
        onnx_attrs = to_onnx_attrs(op, attrs) if op in ("MaxPoolNHWC", "AveragePoolNHWC") else None
        y = get_kernel(onnx_equivalent(op))([x], onnx_attrs, 1)[0]
        return [np.ascontiguousarray(np.transpose(y, TO_NHWC))]

    return compute


register_kernel("ConvNHWC", _conv_compute, domain=LAYOUT_DOMAIN)
for _op in ("MaxPoolNHWC", "AveragePoolNHWC", "GlobalAveragePoolNHWC", "GlobalMaxPoolNHWC"):
    register_kernel(_op, _pool_compute(_op), domain=LAYOUT_DOMAIN)
