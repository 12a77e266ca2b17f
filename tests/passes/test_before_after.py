# ruff: noqa: E501  (IR text lines are as long as the dumps write them)
"""Passes stated as the graph before and the graph after, in the IR text form, compared
structurally (graphc.ir.equality), and the two graphs' numbers through the interpreter. Among
them every rewrite that compile() used to run outside the pipeline."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

import graphc
from graphc.ir.equality import assert_structurally_equal
from graphc.ir.graph import Graph
from graphc.ir.text import parse_graph
from graphc.passes.decompose_einsum import decompose_einsum
from graphc.passes.decompose_qdq import decompose_qdq
from graphc.passes.decompose_window_ops import decompose_window_ops
from graphc.passes.fuse_epilogue import fuse_epilogues
from graphc.passes.gemm_weight_layout import k_major_gemm_weights
from graphc.passes.layout import to_channels_last
from graphc.passes.precision import convert_precision
from graphc.passes.transpose import eliminate_transposes

RNG = np.random.default_rng(0)
W_MM = RNG.standard_normal((8, 10)).astype(np.float32)
W_CONV = RNG.standard_normal((4, 2, 3, 3)).astype(np.float32)


def _check(
    fn: Callable[[Graph], Graph],
    before: str,
    after: str,
    constants: dict[str, np.ndarray] | None = None,
    *,
    after_constants: dict[str, np.ndarray] | None = None,
    rtol: float = 1e-6,
    atol: float = 1e-6,
) -> None:
    g = parse_graph(before, constants)
    out = fn(g)
    assert_structurally_equal(out, parse_graph(after, constants if after_constants is None else after_constants))
    feeds = {v.name: RNG.standard_normal(v.ttype.shape).astype(v.ttype.dtype.numpy) for v in g.inputs}
    want, got = graphc.interpret(g, feeds), graphc.interpret(out, feeds)
    for name in g.output_names:
        np.testing.assert_allclose(got[name].astype(np.float32), want[name].astype(np.float32), rtol=rtol, atol=atol)


def test_decompose_qdq_pair_becomes_arithmetic():
    _check(
        decompose_qdq,
        """
        graph g (opset 21)
          input  %x: f32[2,3]
          const  %s: f32[] = [0.5]
          const  %zp: i8[] = [3]
          %q: i8[2,3] = QuantizeLinear[q](%x, %s, %zp)
          %y: f32[2,3] = DequantizeLinear[dq](%q, %s, %zp)
          output %y: f32[2,3]
        """,
        """
        graph g (opset 21)
          input  %x: f32[2,3]
          const  %s: f32[1] = [0.5]
          const  %zp: f32[1] = [3.0]
          const  %lo: f32[] = [-128.0]
          const  %hi: f32[] = [127.0]
          const  %s2: f32[1] = [0.5]
          const  %zp2: f32[1] = [3.0]
          %d: f32[2,3] = Div[div](%x, %s)
          %r: f32[2,3] = Round[round](%d)
          %a: f32[2,3] = Add[add](%r, %zp)
          %c: f32[2,3] = Clip[clip](%a, %lo, %hi)
          %q: i8[2,3] = Cast[to_i8](%c) {to=3}
          %w: f32[2,3] = Cast[widen](%q) {to=1}
          %b: f32[2,3] = Sub[sub](%w, %zp2)
          %y: f32[2,3] = Mul[mul](%b, %s2)
          output %y: f32[2,3]
        """,
    )


def test_decompose_lppool_through_averagepool():
    _check(
        decompose_window_ops,
        """
        graph g (opset 17)
          input  %x: f32[1,4,5,5]
          %y: f32[1,4,3,3] = LpPool[p](%x) {kernel_shape=[3,3], p=2}
          output %y: f32[1,4,3,3]
        """,
        """
        graph g (opset 17)
          input  %x: f32[1,4,5,5]
          const  %root: f32[] = [0.5]
          const  %k: f32[] = [9.0]
          %sq: f32[1,4,5,5] = Mul[sq](%x, %x)
          %mean: f32[1,4,3,3] = AveragePool[mean](%sq) {count_include_pad=1, kernel_shape=[3,3]}
          %sum: f32[1,4,3,3] = Mul[sum](%mean, %k)
          %y: f32[1,4,3,3] = Pow[root](%sum, %root)
          output %y: f32[1,4,3,3]
        """,
        rtol=1e-5,
    )


def test_decompose_batched_einsum_to_matmul():
    _check(
        decompose_einsum,
        """
        graph g (opset 17)
          input  %a: f32[2,3,4]
          input  %b: f32[2,4,5]
          %y: f32[2,3,5] = Einsum[e](%a, %b) {equation='bij,bjk->bik'}
          output %y: f32[2,3,5]
        """,
        # Letters already in GEMM order: no transposes or reshapes, one Identity that simplify drops.
        """
        graph g (opset 17)
          input  %a: f32[2,3,4]
          input  %b: f32[2,4,5]
          %m: f32[2,3,5] = MatMul[mm](%a, %b)
          %y: f32[2,3,5] = Identity[id](%m)
          output %y: f32[2,3,5]
        """,
        rtol=1e-5,
    )


def test_k_major_gemm_weight():
    _check(
        k_major_gemm_weights,
        """
        graph g (opset 17)
          input  %x: f32[2,8]
          const  %w: f32[8,10] = given
          %y: f32[2,10] = MatMul[mm](%x, %w)
          output %y: f32[2,10]
        """,
        """
        graph g (opset 17)
          input  %x: f32[2,8]
          const  %wt: f32[10,8] = given
          %y: f32[2,10] = graphc.MatMul[mm](%x, %wt) {trans_b=1}
          output %y: f32[2,10]
        """,
        {"w": W_MM, "wt": np.ascontiguousarray(W_MM.T)},
        rtol=1e-5,
    )


FUSED_CONV = """
graph g (opset 17)
  input  %x: f32[1,2,8,8]
  const  %w: f32[4,2,3,3] = given
  %r: f32[1,4,8,8] = graphc.Fused[c](%x, %w) {anchor=Conv(in0..in1){pads=[1,1,1,1]}; op0=Relu(acc); out=op0}
  output %r: f32[1,4,8,8]
"""


def test_fuse_conv_relu_epilogue():
    _check(
        fuse_epilogues,
        """
        graph g (opset 17)
          input  %x: f32[1,2,8,8]
          const  %w: f32[4,2,3,3] = given
          %y: f32[1,4,8,8] = Conv[c](%x, %w) {pads=[1,1,1,1]}
          %r: f32[1,4,8,8] = Relu[r](%y)
          output %r: f32[1,4,8,8]
        """,
        FUSED_CONV,
        {"w": W_CONV},
        rtol=1e-5,
        atol=1e-5,
    )


def test_channels_last_conv():
    _check(
        to_channels_last,
        FUSED_CONV,
        # The weight is re-laid-out (K, R, S, C) at compile time; transposes only at the edges.
        """
        graph g (opset 17)
          input  %x: f32[1,2,8,8]
          const  %w: f32[4,3,3,2] = given
          %xt: f32[1,8,8,2] = Transpose[in](%x) {perm=[0,2,3,1]}
          %r: f32[1,8,8,4] = graphc.Fused[c](%xt, %w) {anchor=graphc.ConvNHWC(in0..in1){kernel_shape=[3,3], pads=[1,1,1,1]}; op0=Relu(acc); out=op0}
          %y: f32[1,4,8,8] = Transpose[out](%r) {perm=[0,3,1,2]}
          output %y: f32[1,4,8,8] as 'r'
        """,
        {"w": W_CONV},
        after_constants={"w": np.ascontiguousarray(W_CONV.transpose(0, 2, 3, 1))},
        rtol=1e-5,
        atol=1e-5,
    )


@pytest.mark.parametrize(("precision", "short", "code"), [("fp16", "f16", 10), ("bf16", "bf16", 16)])
def test_convert_precision_casts_at_the_edges(precision, short, code):
    w16 = W_CONV.astype(np.float16 if precision == "fp16" else graphc.ir.DType.bfloat16.numpy)
    _check(
        lambda g: convert_precision(g, precision),
        FUSED_CONV,
        f"""
        graph g (opset 17)
          input  %x: f32[1,2,8,8]
          const  %w: {short}[4,2,3,3] = given
          %x16: {short}[1,2,8,8] = Cast[in](%x) {{to={code}}}
          %r: {short}[1,4,8,8] = graphc.Fused[c](%x16, %w) {{anchor=Conv(in0..in1){{pads=[1,1,1,1]}}; op0=Relu(acc); out=op0}}
          %y: f32[1,4,8,8] = Cast[out](%r) {{to=1}}
          output %y: f32[1,4,8,8] as 'r'
        """,
        {"w": W_CONV},
        after_constants={"w": w16},
        rtol=2e-2,
        atol=2e-2,
    )


def test_transposes_cancel_through_elementwise():
    _check(
        eliminate_transposes,
        """
        graph g (opset 17)
          input  %x: f32[2,3,4]
          %t: f32[4,2,3] = Transpose[t0](%x) {perm=[2,0,1]}
          %r: f32[4,2,3] = Relu[r](%t)
          %u: f32[2,3,4] = Transpose[t1](%r) {perm=[1,2,0]}
          output %u: f32[2,3,4]
        """,
        """
        graph g (opset 17)
          input  %x: f32[2,3,4]
          %r: f32[2,3,4] = Relu[r](%x)
          output %r: f32[2,3,4] as 'u'
        """,
    )
