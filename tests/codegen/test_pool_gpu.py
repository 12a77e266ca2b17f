"""Pool family on a GPU: MaxPool (with Indices), AveragePool (NCHW 1-3-D, NHWC) and the NHWC global
pools against the numpy reference, in float32, float16 and bfloat16. Skipped without a GPU."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import graphc
from graphc.ir.builder import GraphBuilder
from graphc.ir.graph import Graph
from graphc.ir.types import DType, TensorType

pytestmark = pytest.mark.gpu

BF16 = np.dtype(ml_dtypes.bfloat16)
TOLERANCE = {
    np.dtype(np.float32): (1e-6, 1e-6),
    np.dtype(np.float16): (2e-3, 2e-3),
    BF16: (1e-2, 1e-2),
    np.dtype(np.float64): (1e-12, 1e-12),
    np.dtype(np.int8): (0, 0),
}
FLOATS = [np.float32, np.float16, BF16]


def pool_graph(op: str, dtype, shape, *, layout="nchw", outputs=1, **attrs) -> Graph:
    b = GraphBuilder("t")
    x = b.add_input("x", TensorType(DType.from_numpy(dtype), tuple(shape)))
    dom = ""
    if layout == "nhwc":
        op, dom = op + "NHWC", "graphc"
    node = b.add_node(op, [x], attrs, domain=dom, outputs=outputs)
    b.set_outputs(list(node.outputs))
    return b.build()


def check(graph: Graph, dtype, seed=0):
    from graphc.codegen.build import compile_kernels, complete_plan, generate_kernels, local_gpu_arch
    from graphc.codegen.lower import lower_to_plan
    from graphc.codegen.memory import plan_memory
    from graphc.runtime.cuda import CUDAExecutor

    rng = np.random.default_rng(seed)
    shape = graph.inputs[0].type.static_shape
    if np.dtype(dtype).kind in "iu":
        x = rng.integers(-128, 128, shape).astype(dtype)
    else:
        x = rng.standard_normal(shape).astype(dtype)
    feeds = {"x": x}
    lowered = lower_to_plan(graph)
    kernels = generate_kernels(lowered, {})
    plan = complete_plan(lowered, kernels)
    memory = plan_memory(plan)
    arch = local_gpu_arch()
    compile_kernels(kernels, [arch])
    got = CUDAExecutor(plan, memory, {}, kernels.cubins[arch], kernels.names).run(feeds, to_numpy=True)
    ref = graphc.interpret(graph, feeds)
    rtol, atol = TOLERANCE[np.dtype(dtype)]
    for k, r in ref.items():
        assert got[k].dtype == r.dtype and got[k].shape == r.shape
        if r.dtype == np.int64:
            np.testing.assert_array_equal(got[k], r)
        else:
            np.testing.assert_allclose(got[k].astype(np.float64), r.astype(np.float64), rtol=rtol, atol=atol)


WINDOWS = [
    pytest.param((2, 5, 9, 9), dict(kernel_shape=(3, 3), strides=(2, 2), pads=(1, 1, 1, 1)), id="3x3s2p1"),
    pytest.param((1, 3, 10, 7), dict(kernel_shape=(3, 2), strides=(2, 2), ceil_mode=1), id="ceil"),
    pytest.param((2, 4, 11, 11), dict(kernel_shape=(3, 3), dilations=(2, 2), pads=(2, 1, 0, 2)), id="dil2-asym"),
    pytest.param((1, 3, 8, 9), dict(kernel_shape=(2, 2), auto_pad="SAME_UPPER"), id="same-upper"),
    # A kernel past the input under ceil_mode: one window over the clipped input (issue 12).
    pytest.param((2, 3, 13, 13), dict(kernel_shape=(14, 14), strides=(2, 2), ceil_mode=1), id="ceil-kernel-past-input"),
    pytest.param(
        (1, 3, 5, 6), dict(kernel_shape=(8, 7), strides=(4, 2), pads=(1, 0, 0, 0), ceil_mode=1), id="ceil-past-pads"
    ),
]


@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shape,attrs", WINDOWS)
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_maxpool(layout, shape, attrs, dtype):
    if layout == "nhwc":
        if "auto_pad" in attrs:
            pytest.skip("the layout pass resolves auto_pad before making NHWC pools")
        shape = (shape[0], shape[2], shape[3], shape[1])
    check(pool_graph("MaxPool", dtype, shape, layout=layout, **attrs), dtype)


@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("include_pad", [0, 1])
@pytest.mark.parametrize("shape,attrs", WINDOWS)
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_averagepool(layout, shape, attrs, include_pad, dtype):
    if layout == "nhwc":
        if "auto_pad" in attrs:
            pytest.skip("the layout pass resolves auto_pad before making NHWC pools")
        shape = (shape[0], shape[2], shape[3], shape[1])
    g = pool_graph("AveragePool", dtype, shape, layout=layout, count_include_pad=include_pad, **attrs)
    check(g, dtype)


@pytest.mark.parametrize("storage_order", [0, 1])
def test_maxpool_indices(storage_order):
    g = pool_graph(
        "MaxPool",
        np.float32,
        (2, 3, 7, 9),
        outputs=2,
        kernel_shape=(3, 3),
        pads=(1, 1, 1, 1),
        strides=(2, 2),
        storage_order=storage_order,
    )
    check(g, np.float32)


@pytest.mark.parametrize(
    "op,dtype,shape,attrs",
    [
        ("MaxPool", np.float64, (2, 3, 12), dict(kernel_shape=(4,), strides=(3,), pads=(1, 2))),
        ("AveragePool", np.float32, (1, 2, 5, 6, 7), dict(kernel_shape=(2, 3, 2), pads=(1, 1, 0, 0, 1, 1))),
        ("MaxPool", np.int8, (2, 3, 6, 6), dict(kernel_shape=(2, 2), strides=(2, 2))),
    ],
    ids=["1d-f64", "3d-avg", "int8"],
)
def test_pool_nchw_ranks_and_types(op, dtype, shape, attrs):
    check(pool_graph(op, dtype, shape, **attrs), dtype)


@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool"])
@pytest.mark.parametrize("shape", [(2, 7, 7, 40), (1, 1, 1, 3), (3, 13, 5, 70)])
def test_global_pool_nhwc(op, shape, dtype):
    check(pool_graph(op, dtype, shape, layout="nhwc"), dtype)
