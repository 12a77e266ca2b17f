"""Conv family without a GPU: every variant renders and compiles with NVRTC for sm_80 and sm_90,
carries its epilogue in the store hook, and launches with the geometry its parameters imply."""

from __future__ import annotations

import numpy as np
import pytest

from graphc.codegen.families import conv as conv_family
from graphc.codegen.kernel import family_for
from graphc.codegen.lower import lower_to_plan
from graphc.codegen.nvrtc import compile_cubin
from graphc.ir.attrs import onnx_attrs_class
from graphc.ir.builder import GraphBuilder
from graphc.ir.graph import Graph
from graphc.ir.types import DType, TensorType
from graphc.ops.fused import ACC, IN, OP, EpilogueOp, FusedAttrs
from graphc.ops.layout_ops import ConvNHWCAttrs
from graphc.ops.registry import InferContext, get_op

ARCHS = ("sm_80", "sm_90")


def conv_graph(dtype, x_shape, w_shape, *, nhwc=True, stride=1, pad=0, dil=1, group=1, epilogue="relu") -> Graph:
    dt = DType.from_numpy(dtype)
    b = GraphBuilder("t")
    x = b.add_input("x", TensorType(dt, x_shape))
    w = b.add_constant(np.zeros(w_shape, dtype), "w")
    k = w_shape[0]
    nd = len(x_shape) - 2
    if nhwc:
        attrs = ConvNHWCAttrs(
            kernel_shape=w_shape[1:3], strides=(stride,) * 2, pads=(pad,) * 4, dilations=(dil,) * 2, group=group
        )
        op, dom = "ConvNHWC", "graphc"
    else:
        attrs = onnx_attrs_class("Conv")(
            kernel_shape=w_shape[2:], strides=(stride,) * nd, pads=(pad,) * 2 * nd, dilations=(dil,) * nd, group=group
        )
        op, dom = "Conv", ""
    ins = [x, w, b.add_constant(np.ones((k,), dtype), "bias")]
    if epilogue is None:
        y = b.add_node(op, ins, attrs, domain=dom).outputs[0]
    else:
        probe = InferContext(op, "probe", attrs, [v.type for v in ins], [None] * 3, 1)
        res = b.add_input("res", get_op(op, dom).infer(probe)[0])
        epi = (
            EpilogueOp("Add", onnx_attrs_class("Add")(), (ACC, IN(3))),
            EpilogueOp("Relu", onnx_attrs_class("Relu")(), (OP(0),)),
        )
        fa = FusedAttrs(
            anchor_op=op, anchor_domain=dom, anchor_attrs=attrs, anchor_inputs=3, epilogue=epi, outputs=(OP(1),)
        )
        y = b.add_node("Fused", [*ins, res], fa, domain="graphc").outputs[0]
    b.set_outputs([y])
    return b.build()


def generate(graph: Graph, **kw):
    plan = lower_to_plan(graph)
    weights = {k: c.data for k, c in graph.constants.items()}
    (step,) = [s for s in plan.steps if not s.alias]
    ctx = plan.context(step, weights, **kw)
    fam = family_for(ctx)
    assert fam.name == "conv"
    return fam, ctx, fam.generate(ctx)


CASES = [
    # (id, dtype, x_shape, w_shape, kwargs, expected variant)
    ("tc-f16-vec", np.float16, (2, 9, 9, 16), (24, 3, 3, 16), {"pad": 1}, "tc"),
    ("tc-bf16-stem", "bfloat16", (1, 19, 19, 3), (24, 7, 7, 3), {"stride": 2, "pad": 3}, "tc"),
    ("tc-f16-groups", np.float16, (2, 8, 8, 32), (64, 3, 3, 16), {"group": 2, "pad": 1}, "tc"),
    ("simt-f32", np.float32, (2, 9, 9, 17), (24, 3, 3, 17), {"pad": 1, "dil": 2}, "simt"),
    ("simt-f16-narrow-groups", np.float16, (1, 6, 6, 16), (8, 1, 1, 4), {"group": 4}, "simt"),
    ("depthwise-f16", np.float16, (2, 9, 9, 32), (32, 3, 3, 1), {"group": 32, "stride": 2, "pad": 1}, "depthwise"),
    ("depthwise-f32-mult", np.float32, (1, 8, 8, 8), (16, 5, 5, 1), {"group": 8, "pad": 2}, "depthwise"),
    ("nchw-f32-2d", np.float32, (2, 6, 9, 8), (4, 6, 3, 3), {"nhwc": False, "group": 1, "pad": 1}, "nchw"),
    ("nchw-f64-1d", np.float64, (2, 6, 13), (4, 3, 5), {"nhwc": False, "group": 2}, "nchw"),
]


def _dtype(d):
    from graphc.ir.types import DType

    return DType.bfloat16.numpy if d == "bfloat16" else d


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_conv_renders_and_compiles(case):
    _, dtype, xs, ws, kw, expected = case
    g = conv_graph(_dtype(dtype), xs, ws, **kw)
    _, ctx, srcs = generate(g)
    (src,) = srcs
    assert src.params["variant"] == expected
    # the fused epilogue (residual add + relu) is the store hook, called with acc
    body = src.source.split('extern "C"')[1]
    # (depthwise with channel vectors: the same epilogue as {name}_epv, storing into registers)
    p = src.params
    vec = p["variant"] == "depthwise" and p["vc"] > 1 and not p["tail"]
    hook = f"{src.name}_epv(" if vec else f"{src.name}_epi("
    assert hook in body and "in3[idx]" in src.source and " < 0" in src.source
    assert src.args[:3] == ["x", "w", "bias"] and src.args[-1] == g.outputs[0].name
    for arch in ARCHS:
        assert compile_cubin(src.source, src.name, arch)


def test_tf32_when_allowed():
    g = conv_graph(np.float32, (2, 9, 9, 16), (24, 3, 3, 16), pad=1, epilogue=None)
    _, _, (plain,) = generate(g)
    _, _, (tf32,) = generate(g, allow_tf32=True)
    assert plain.params["variant"] == "simt"
    assert tf32.params["variant"] == "tc" and "tf32" in tf32.source
    for arch in ARCHS:
        compile_cubin(tf32.source, tf32.name, arch)


def test_search_space_and_forced_params():
    g = conv_graph(np.float16, (32, 14, 14, 64), (64, 3, 3, 64), pad=1, epilogue=None)
    fam, ctx, (default,) = generate(g)
    space = fam.search_space(ctx)
    assert len(space) >= 8 and all(conv_family._smem_bytes(p, 2) <= conv_family.MAX_SMEM for p in space)
    p = {"bm": 64, "bn": 128, "wm": 32, "wn": 64, "bkc": 8, "stages": 3, "splits": 1}
    assert p in space
    _, _, (forced,) = generate(g, params=p)
    assert forced.block == (128, 1, 1)
    assert forced.grid == (-(-32 * 14 * 14 // 64), 1, 1)
    assert forced.shared_bytes == 3 * (64 + 128) * 8 * 16
    for arch in ARCHS:
        compile_cubin(forced.source, forced.name, arch)


@pytest.mark.parametrize(
    "m,k,expect_bm",
    [(32 * 56 * 56, 64, 128), (7 * 7, 512, 64)],
)
def test_heuristic_prefers_small_tiles_for_small_problems(m, k, expect_bm):
    geo = conv_family.ConvGeometry("nhwc", m, k, k, 1, (1, 1), (1, 1), (3, 3), (1, 1), (1, 1), (1, 1), DType.float16)
    p = conv_family.heuristic_params(geo)
    assert p["bm"] == expect_bm


def test_split_k_for_small_deep_convs_in_one_launch():
    """ResNet-50's last 3x3 stage at batch 1: 8 output tiles for 132 SMs, 72 k-tiles: split-K in
    one launch; the last block of each tile sums the partials (in split order) and runs the bias
    and the epilogue."""
    g = conv_graph(np.float16, (1, 7, 7, 512), (512, 3, 3, 512), pad=1)
    _, _, (src,) = generate(g)
    splits = src.params["splits"]
    assert splits > 1 and src.params["serial"] == 1 and src.grid[2] == splits
    assert src.args[:2] == ["x", "w"] and src.args[-1] == "@workspace" and len(src.args) > 3
    assert src.workspace_bytes == splits * 49 * 512 * 4
    tiles = src.grid[0] * src.grid[1]
    assert f"__device__ unsigned int {src.name}_arrived[{tiles}];" in src.source
    body = src.source[src.source.index('extern "C"') :]
    assert "atomicAdd(&" in body and f"{src.name}_epi(v, o" in body and "gc_ws[((long long)split * M" in body
    for arch in ARCHS:
        compile_cubin(src.source, src.name, arch)


def test_split_k_for_small_deep_convs():
    """The same with params serial = 0: two launches sharing the workspace, the epilogue in the
    second."""
    g = conv_graph(np.float16, (1, 7, 7, 512), (512, 3, 3, 512), pad=1)
    _, _, (serial,) = generate(g)
    _, _, srcs = generate(
        g, params={**{k: serial.params[k] for k in ("bm", "bn", "wm", "wn", "bkc", "stages", "splits")}, "serial": 0}
    )
    assert len(srcs) == 2
    partial, reduce = srcs
    splits = partial.params["splits"]
    assert splits > 1 and partial.grid[2] == splits
    assert partial.args == ["x", "w", "@workspace"] and reduce.args[0] == "@workspace"
    assert partial.workspace_bytes == splits * 49 * 512 * 4
    assert f"{partial.name}_epi(v, idx" in reduce.source and "in3[idx]" in reduce.source
    for src in srcs:
        for arch in ARCHS:
            compile_cubin(src.source, src.name, arch)


def test_plain_conv_without_epilogue_stores_acc():
    g = conv_graph(np.float16, (1, 5, 5, 8), (8, 3, 3, 8), pad=1, epilogue=None)
    _, _, (src,) = generate(g)
    assert "out0[idx] = gc_f2h(acc);" in src.source


def test_unsupported_dtype_is_named():
    from graphc.errors import CompileError

    g = conv_graph(np.float64, (1, 5, 5, 8), (8, 3, 3, 8), pad=1, epilogue=None)
    _, _, (src,) = generate(g)  # float64 NHWC: the SIMT kernel in double
    assert src.params["variant"] == "simt" and "double" in src.source
    with pytest.raises(CompileError, match="4-D convolution"):
        generate(conv_graph(np.float32, (1, 2, 3, 3, 3, 3), (2, 2, 1, 1, 1, 1), nhwc=False, epilogue=None))
