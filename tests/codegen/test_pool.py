"""Pool family without a GPU: each variant renders and compiles for sm_80 and sm_90, with its
geometry and epilogue in the source."""

from __future__ import annotations

import numpy as np
import pytest

from graphc.codegen.kernel import family_for
from graphc.codegen.lower import lower_to_plan
from graphc.codegen.nvrtc import compile_cubin
from graphc.ir.attrs import onnx_attrs_class
from graphc.ir.builder import GraphBuilder
from graphc.ir.graph import Graph
from graphc.ir.types import DType, TensorType
from graphc.ops.fused import ACC, OP, EpilogueOp, FusedAttrs

ARCHS = ("sm_80", "sm_90")


def pool_graph(op: str, dtype, shape, *, nhwc=False, outputs=1, **attrs) -> Graph:
    b = GraphBuilder("t")
    x = b.add_input("x", TensorType(DType.from_numpy(dtype), tuple(shape)))
    dom = ""
    if nhwc:
        op, dom = op + "NHWC", "graphc"
    node = b.add_node(op, [x], attrs, domain=dom, outputs=outputs)
    b.set_outputs(list(node.outputs))
    return b.build()


def generate(graph: Graph):
    plan = lower_to_plan(graph)
    (step,) = plan.steps
    ctx = plan.context(step, {})
    fam = family_for(ctx)
    assert fam.name == "pool"
    (src,) = fam.generate(ctx)
    return src


CASES = [
    ("max-nchw-f16", "MaxPool", np.float16, (2, 5, 9, 9), False, 1, dict(kernel_shape=(3, 3), strides=(2, 2))),
    (
        "max-indices-order1",
        "MaxPool",
        np.float32,
        (2, 3, 7, 9),
        False,
        2,
        dict(kernel_shape=(3, 3), pads=(1, 1, 1, 1), storage_order=1),
    ),
    ("max-int8-1d", "MaxPool", np.int8, (2, 3, 12), False, 1, dict(kernel_shape=(4,), strides=(3,))),
    (
        "avg-3d-ceil",
        "AveragePool",
        np.float64,
        (1, 2, 5, 6, 7),
        False,
        1,
        dict(kernel_shape=(2, 3, 2), ceil_mode=1, count_include_pad=1, pads=(1, 1, 0, 0, 1, 1)),
    ),
    ("max-nhwc-bf16", "MaxPool", "bfloat16", (2, 9, 9, 5), True, 1, dict(kernel_shape=(3, 3), pads=(1, 1, 1, 1))),
    ("avg-nhwc-f16", "AveragePool", np.float16, (2, 9, 9, 5), True, 1, dict(kernel_shape=(3, 3), strides=(2, 2))),
    ("gap-nhwc-f16", "GlobalAveragePool", np.float16, (2, 7, 7, 40), True, 1, {}),
    ("gmp-nhwc-f32", "GlobalMaxPool", np.float32, (2, 7, 7, 40), True, 1, {}),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_pool_renders_and_compiles(case):
    _, op, dtype, shape, nhwc, outputs, attrs = case
    dtype = DType.bfloat16.numpy if dtype == "bfloat16" else dtype
    g = pool_graph(op, dtype, shape, nhwc=nhwc, outputs=outputs, **attrs)
    src = generate(g)
    assert src.args[0] == "x" and src.args[1:] == [v.name for v in g.outputs]
    assert f"{src.name}_epi(acc" in src.source
    if outputs == 2:
        assert "gc_idx[idx]" in src.source
    for arch in ARCHS:
        assert compile_cubin(src.source, src.name, arch)


def test_global_pool_geometry():
    src = generate(pool_graph("GlobalAveragePool", np.float16, (3, 5, 6, 70), nhwc=True))
    assert src.grid == (3, 3, 1) and src.block == (32, 8, 1)
    assert "HW = 30" in src.source


def test_avgpool_counts_follow_count_include_pad():
    shape = (1, 1, 6, 6)
    kw = dict(kernel_shape=(3, 3), pads=(1, 1, 1, 1))
    excl = generate(pool_graph("AveragePool", np.float32, shape, **kw)).source
    incl = generate(pool_graph("AveragePool", np.float32, shape, count_include_pad=1, **kw)).source
    assert "p >= 0 && p < 6" in excl
    assert "p >= -1 && p < 7" in incl


def test_avgpool_kernel_past_the_input_under_ceil_mode():
    # One 14x14 window over a 13x13 input (issue 12): taps clipped to the input, counted within
    # the explicit pads (none here), so both count_include_pad forms divide by 169.
    for cip in (0, 1):
        g = pool_graph(
            "AveragePool",
            np.float32,
            (2, 3, 13, 13),
            kernel_shape=(14, 14),
            strides=(2, 2),
            ceil_mode=1,
            count_include_pad=cip,
        )
        src = generate(g)
        assert "OH = 1, OW = 1" in src.source and "p >= 0 && p < 13" in src.source
        assert compile_cubin(src.source, src.name, "sm_80")


def test_fused_pool_anchor_carries_epilogue():
    b = GraphBuilder("t")
    x = b.add_input("x", TensorType(DType.float16, (1, 6, 6, 8)))
    attrs = onnx_attrs_class("Relu")()
    from graphc.ops.layout_ops import MaxPoolNHWCAttrs

    fa = FusedAttrs(
        anchor_op="MaxPoolNHWC",
        anchor_domain="graphc",
        anchor_attrs=MaxPoolNHWCAttrs(kernel_shape=(2, 2), strides=(2, 2)),
        anchor_inputs=1,
        epilogue=(EpilogueOp("Relu", attrs, (ACC,)),),
        outputs=(OP(0),),
    )
    y = b.add_node("Fused", [x], fa, domain="graphc").outputs[0]
    b.set_outputs([y])
    src = generate(b.build())
    assert " < 0" in src.source
    compile_cubin(src.source, src.name, "sm_90")
