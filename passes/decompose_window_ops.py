"""LRN and LpPool through AveragePool, for the CUDA target (whose pool kernels average but neither
normalize across channels nor raise to p).

    LRN:    y = x / (bias + alpha * avg_c(x^2))^beta, where avg_c averages x^2 over the channel
            window [c - floor((size-1)/2), c + ceil((size-1)/2)] with zeros outside: an AveragePool
            (count_include_pad) of kernel (size, 1) over x^2 seen as [N, 1, C, prod(spatial)].
    LpPool: y = (k * AveragePool(|x|^p, count_include_pad))^(1/p), k the kernel's element count.

Both are exact up to float rounding (a mean times k for a sum). LpPool with ceil_mode stays an
LpPool node (an overhanging window's average would not count k elements); so does anything with
dynamic shapes. Old CNNs (AlexNet, GoogLeNet, CaffeNet of the ONNX model zoo) use LRN.
"""

from __future__ import annotations

import math

import numpy as np

from graphc.ir.builder import GraphBuilder
from graphc.ir.graph import Graph, Node, Value
from graphc.ir.types import DType
from graphc.passes.rewrite import Match, Op, Rule, Var, apply_rules, static_shape

RULE_LRN = "lrn(x) -> x / (bias + alpha * avgpool_c(x^2))^beta"
RULE_LP = "lp_pool(x) -> (k * avgpool(|x|^p))^(1/p)"
FLOATS = frozenset({DType.float32, DType.float16, DType.bfloat16, DType.float64})


def _scalar(b: GraphBuilder, value: float, dtype: DType, name: str) -> Value:
    return b.add_constant(np.array(value, dtype=dtype.numpy), name)


def _lrn(m: Match, b: GraphBuilder) -> Value | None:
    root: Node = m.root
    x = m.value("x")
    shape = static_shape(root.inputs[0])
    dt = x.ttype.dtype
    if shape is None or dt not in FLOATS:
        return None
    a, name = root.attrs, root.name
    size = int(a.size)
    before = (size - 1) // 2
    n, c = shape[:2]
    rows = math.prod(shape[2:])
    sq = b.op("Mul", [x, x], name=f"{name}/square")
    flat = b.add_constant(np.array([n, 1, c, rows], np.int64), f"{name}/channels_as_rows")
    sq = b.op("Reshape", [sq, flat], name=f"{name}/as_image")
    pool_attrs = {"kernel_shape": [size, 1], "pads": [before, 0, size - 1 - before, 0], "count_include_pad": 1}
    mean = b.op("AveragePool", [sq], pool_attrs, name=f"{name}/window_mean")
    back = b.add_constant(np.array(shape, np.int64), f"{name}/shape")
    mean = b.op("Reshape", [mean, back], name=f"{name}/back")
    scaled = b.op("Mul", [mean, _scalar(b, a.alpha, dt, f"{name}/alpha")], name=f"{name}/scaled")
    base = b.op("Add", [scaled, _scalar(b, a.bias, dt, f"{name}/bias")], name=f"{name}/base")
    den = b.op("Pow", [base, _scalar(b, a.beta, dt, f"{name}/beta")], name=f"{name}/denominator")
    return b.op("Div", [x, den], name=name)


def _lp_pool(m: Match, b: GraphBuilder) -> Value | None:
    root: Node = m.root
    x = m.value("x")
    dt = x.ttype.dtype
    a, name = root.attrs, root.name
    if static_shape(root.inputs[0]) is None or dt not in FLOATS or a.ceil_mode:
        return None
    p = float(a.p)
    if p == 2.0:
        powered = b.op("Mul", [x, x], name=f"{name}/square")
    else:
        ax = b.op("Abs", [x], name=f"{name}/abs")
        powered = b.op("Pow", [ax, _scalar(b, p, dt, f"{name}/p")], name=f"{name}/power")
    pool_attrs = {
        "auto_pad": a.auto_pad,
        "kernel_shape": list(a.kernel_shape),
        "count_include_pad": 1,
        **({"pads": list(a.pads)} if a.pads else {}),
        **({"strides": list(a.strides)} if a.strides else {}),
        **({"dilations": list(a.dilations)} if a.dilations else {}),
    }
    mean = b.op("AveragePool", [powered], pool_attrs, name=f"{name}/window_mean")
    k = math.prod(int(v) for v in a.kernel_shape)
    total = b.op("Mul", [mean, _scalar(b, k, dt, f"{name}/window_size")], name=f"{name}/window_sum")
    if p == 1.0:
        return b.op("Identity", [total], name=name)
    return b.op("Pow", [total, _scalar(b, 1.0 / p, dt, f"{name}/root")], name=name)


RULES = [
    Rule(RULE_LRN, Op("LRN", Var("x")), _lrn),
    Rule(RULE_LP, Op("LpPool", Var("x")), _lp_pool),
]


def decompose_window_ops(graph: Graph, *, fired: list[str] | None = None) -> Graph:
    """LRN and LpPool nodes as above, where their shapes are static."""
    return apply_rules(graph, RULES, fired=fired)
