"""fuse_gelu: the erf and tanh forms of GELU, in every association order, become one Gelu node."""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import graphc
import models
from graphc.ir.verify import verify_graph
from graphc.passes import OptimizeOptions, optimize, pipeline
from graphc.passes.fuse_gelu import fuse_gelu

RNG = np.random.default_rng(1)


def _stages():
    """The default pipeline up to (not including) epilogue and elementwise fusion, which would
    fold the nodes these tests count into Fused nodes."""
    return [s for s in pipeline.stages() if s.name not in ("fuse_epilogues", "fuse_elementwise")]


SQRT2 = math.sqrt(2.0)
SQRT_2_PI = math.sqrt(2.0 / math.pi)


class _Net:
    def __init__(self, dtype=np.float32):
        self.dtype = dtype
        self.nodes: list = []
        self.inits: list = []
        self.n = 0

    def c(self, value) -> str:
        self.n += 1
        name = f"c{self.n}"
        self.inits.append(numpy_helper.from_array(np.asarray(value, dtype=self.dtype), name))
        return name

    def op(self, op: str, *inputs: str, **attrs) -> str:
        self.n += 1
        out = f"{op.lower()}{self.n}"
        self.nodes.append(helper.make_node(op, list(inputs), [out], name=f"act/{op}_{self.n}", **attrs))
        return out

    def model(self, shape, outputs: list[str]):
        elem = helper.np_dtype_to_tensor_dtype(np.dtype(self.dtype))
        ins = [helper.make_tensor_value_info("x", elem, shape)]
        outs = [helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None) for o in outputs]
        g = helper.make_graph(self.nodes, "t", ins, outs, self.inits)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
        m.ir_version = 9
        return onnx.shape_inference.infer_shapes(m)


def _half(net: _Net, v: str, form: str, const_first: bool) -> str:
    if form == "div2":
        return net.op("Div", v, net.c(2.0))
    return net.op("Mul", net.c(0.5), v) if const_first else net.op("Mul", v, net.c(0.5))


def _combine(net: _Net, p: str, order: str, half: str, const_first: bool) -> str:
    """x * 0.5 * p in the association order named."""
    if order == "xh_p":
        return net.op("Mul", _half(net, "x", half, const_first), p)
    if order == "x_hp":
        return net.op("Mul", "x", _half(net, p, half, const_first))
    return _half(net, net.op("Mul", p, "x") if const_first else net.op("Mul", "x", p), half, const_first)


def _erf_gelu(net: _Net, *, arg="div", order="xh_p", half="mul", const_first=False, sqrt2=SQRT2) -> str:
    t = net.op("Div", "x", net.c(sqrt2)) if arg == "div" else net.op("Mul", "x", net.c(1.0 / sqrt2))
    e = net.op("Erf", t)
    p = net.op("Add", net.c(1.0), e) if const_first else net.op("Add", e, net.c(1.0))
    return _combine(net, p, order, half, const_first)


def _tanh_gelu(net: _Net, *, cube="pow", order="xh_p", half="mul", const_first=False, k=0.044715) -> str:
    if cube == "pow":
        x3 = net.op("Pow", "x", net.c(3.0))
    elif cube == "mul3":
        x3 = net.op("Mul", "x", net.op("Mul", "x", "x"))
    else:
        x3 = net.op("Mul", net.op("Pow", "x", net.c(2.0)), "x")
    inner = net.op("Add", "x", net.op("Mul", net.c(k), x3))
    t = net.op("Tanh", net.op("Mul", inner, net.c(SQRT_2_PI)))
    p = net.op("Add", t, net.c(1.0))
    return _combine(net, p, order, half, const_first)


def _run(model, shape, dtype=np.float32):
    g0 = graphc.load_onnx(model)
    g1 = optimize(g0, OptimizeOptions(opt_level=2, verify=True), stages=_stages()).graph
    verify_graph(g1)
    x = RNG.normal(0, 2, shape).astype(dtype)
    a, b = graphc.interpret(g0, {"x": x}), graphc.interpret(g1, {"x": x})
    return g1, a, b


ORDERS = ["xh_p", "x_hp", "xp_h"]


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("arg", ["div", "mul"])
@pytest.mark.parametrize(("half", "const_first"), [("mul", False), ("mul", True), ("div2", False)])
def test_erf_gelu_forms(order, arg, half, const_first):
    net = _Net()
    y = _erf_gelu(net, arg=arg, order=order, half=half, const_first=const_first)
    g1, a, b = _run(net.model((3, 17), [y]), (3, 17))
    assert g1.op_counts() == {"Gelu": 1}
    assert g1.nodes[0].attrs.approximate == "none"
    for k in a:
        np.testing.assert_allclose(b[k], a[k], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("cube", ["pow", "mul3", "sq_mul"])
@pytest.mark.parametrize("const_first", [False, True])
def test_tanh_gelu_forms(order, cube, const_first):
    net = _Net()
    y = _tanh_gelu(net, cube=cube, order=order, const_first=const_first)
    g1, a, b = _run(net.model((2, 3, 11), [y]), (2, 3, 11))
    assert g1.op_counts() == {"Gelu": 1}
    assert g1.nodes[0].attrs.approximate == "tanh"
    for k in a:
        np.testing.assert_allclose(b[k], a[k], rtol=1e-5, atol=1e-6)


def test_sum_as_add():
    # ONNX's own Gelu function body writes 1 + erf(...) as a two-input Sum.
    net = _Net()
    e = net.op("Erf", net.op("Div", "x", net.c(SQRT2)))
    y = net.op("Mul", net.op("Mul", "x", net.c(0.5)), net.op("Sum", net.c(1.0), e))
    g1, a, b = _run(net.model((3, 5), [y]), (3, 5))
    assert g1.op_counts() == {"Gelu": 1}
    np.testing.assert_allclose(b[y], a[y], rtol=1e-5, atol=1e-6)


def test_float16_constants_within_their_rounding():
    # sqrt(2) in float16 is 1.4140625 (1.1e-4 off): still GELU at float16 precision.
    net = _Net(np.float16)
    y = _erf_gelu(net)
    g1, a, b = _run(net.model((4, 9), [y]), (4, 9), np.float16)
    assert g1.op_counts() == {"Gelu": 1}
    np.testing.assert_allclose(b[y].astype(np.float32), a[y].astype(np.float32), rtol=4e-3, atol=4e-3)


@pytest.mark.parametrize(
    "build",
    [
        lambda net: _erf_gelu(net, sqrt2=1.5),  # not sqrt(2)
        lambda net: _erf_gelu(net, sqrt2=1.4141),  # 8e-5 off: within 1e-4, fused
        lambda net: _tanh_gelu(net, k=0.05),  # wrong cubic coefficient
    ],
    ids=["sqrt2_wrong", "sqrt2_close", "cubic_wrong"],
)
def test_constants_are_checked(build, request):
    net = _Net()
    y = build(net)
    g1, a, b = _run(net.model((5,), [y]), (5,))
    fused = g1.op_counts().get("Gelu", 0) == 1
    assert fused == (request.node.callspec.id == "sqrt2_close")
    if not fused:
        np.testing.assert_allclose(b[y], a[y], rtol=1e-6)


def test_interior_used_elsewhere_is_a_near_miss():
    net = _Net()
    y = _erf_gelu(net)
    erf_out = next(n.output[0] for n in net.nodes if n.op_type == "Erf")
    g0 = graphc.load_onnx(net.model((4, 6), [y, erf_out]))
    g1 = fuse_gelu(g0)
    assert "Gelu" not in g1.op_counts()
    misses = g1.meta["near_misses"]
    assert any("GELU" in m and "graph output" in m for m in misses), misses
    assert fuse_gelu(g1) is g1


def test_pass_returns_same_graph_when_nothing_matches():
    net = _Net()
    y = net.op("Erf", "x")
    g = graphc.load_onnx(net.model((4,), [y]))
    assert fuse_gelu(g) is g


@pytest.mark.parametrize("name", ["bert", "vit"])
def test_zoo_gelu(name):
    model = models.build(name, size="tiny")
    feeds = models.sample_inputs(name, model, batch=2)
    dims = {"batch": 2, "seq": feeds["input_ids"].shape[1]} if name == "bert" else {"batch": 2}
    g0 = graphc.bind_shapes(graphc.load_onnx(model), dims)
    g1 = optimize(g0, OptimizeOptions(opt_level=2, verify=True), stages=_stages()).graph
    counts = g1.op_counts()
    assert counts.get("Gelu") == 2 and "Erf" not in counts
    a, b = graphc.interpret(g0, feeds), graphc.interpret(g1, feeds)
    for k in a:
        np.testing.assert_allclose(b[k], a[k], rtol=1e-4, atol=1e-4)
