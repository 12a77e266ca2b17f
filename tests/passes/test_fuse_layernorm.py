"""fuse_layernorm: decomposed LayerNorm / RMSNorm chains become one normalization node."""

from __future__ import annotations

import itertools

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import graphc
import models
from graphc.ir.verify import verify_graph
from graphc.passes import OptimizeOptions, optimize, pipeline
from graphc.passes.fuse_layernorm import fuse_layernorm

RNG = np.random.default_rng(0)


def _stages():
    """The default pipeline up to (not including) epilogue and elementwise fusion, which would
    fold the nodes these tests count into Fused nodes."""
    return [s for s in pipeline.stages() if s.name not in ("fuse_epilogues", "fuse_elementwise")]


class _Net:
    """A tiny onnx.helper graph writer: nodes by op, constants as initializers."""

    def __init__(self, opset: int = 18):
        self.opset = opset
        self.nodes: list = []
        self.inits: list = []
        self.n = 0

    def const(self, value, dtype=np.float32) -> str:
        self.n += 1
        name = f"c{self.n}"
        self.inits.append(numpy_helper.from_array(np.asarray(value, dtype=dtype), name))
        return name

    def op(self, op: str, *inputs: str, **attrs) -> str:
        self.n += 1
        out = f"{op.lower()}{self.n}"
        self.nodes.append(helper.make_node(op, list(inputs), [out], name=f"blk/{op}_{self.n}", **attrs))
        return out

    def reduce_mean(self, x: str, axes: list[int]) -> str:
        if self.opset >= 18:
            return self.op("ReduceMean", x, self.const(axes, np.int64))
        return self.op("ReduceMean", x, axes=axes)

    def model(self, inputs: dict[str, tuple[int, tuple]], outputs: list[str]):
        ins = [helper.make_tensor_value_info(k, t, s) for k, (t, s) in inputs.items()]
        outs = [helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None) for o in outputs]
        g = helper.make_graph(self.nodes, "t", ins, outs, self.inits)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", self.opset)])
        m.ir_version = 9
        return onnx.shape_inference.infer_shapes(m)  # the checker wants typed outputs


def _optimize(model):
    g = graphc.load_onnx(model)
    res = optimize(g, OptimizeOptions(opt_level=2, verify=True), stages=_stages())
    verify_graph(res.graph)
    return g, res.graph


def _check_same(g0, g1, feeds, rtol=1e-5, atol=1e-5):
    a = graphc.interpret(g0, feeds)
    b = graphc.interpret(g1, feeds)
    for k in a:
        np.testing.assert_allclose(b[k].astype(np.float64), a[k].astype(np.float64), rtol=rtol, atol=atol, err_msg=k)


def _sqrt(net: _Net, v: str, form: str) -> str:
    return net.op("Sqrt", v) if form == "sqrt" else net.op("Pow", v, net.const(0.5))


def _normalize(net: _Net, num: str, v: str, form: str) -> str:
    """num / sqrt(v) in the form named."""
    if form == "div":
        return net.op("Div", num, _sqrt(net, v, "sqrt"))
    if form == "div_pow":
        return net.op("Div", num, _sqrt(net, v, "pow"))
    if form == "reciprocal":
        return net.op("Mul", num, net.op("Reciprocal", _sqrt(net, v, "sqrt")))
    if form == "one_over":
        return net.op("Mul", net.op("Div", net.const(1.0), _sqrt(net, v, "sqrt")), num)
    if form == "rsqrt_pow":
        return net.op("Mul", num, net.op("Pow", v, net.const(-0.5)))
    raise ValueError(form)


def _layernorm_model(
    *,
    shape=(2, 5, 12),
    axes=(-1,),
    square="pow",
    norm="div",
    gamma=True,
    beta=True,
    opset=18,
    eps=1e-5,
    exponent=2.0,
    gamma_shape=None,
    extra_output=False,
    half=False,
):
    """half: the TorchScript float16 form, x16 -> Cast f32 -> chain -> Cast f16 -> * g16 + b16."""
    net = _Net(opset)
    k = len(axes)
    nshape = shape[len(shape) - k :]
    x = net.op("Cast", "x", to=TensorProto.FLOAT) if half else "x"
    mean = net.reduce_mean(x, list(axes))
    d = net.op("Sub", x, mean)
    sq = net.op("Pow", d, net.const(exponent)) if square == "pow" else net.op("Mul", d, d)
    var = net.reduce_mean(sq, list(axes))
    ve = net.op("Add", var, net.const(eps))
    y = _normalize(net, d, ve, norm)
    dt = np.float16 if half else np.float32
    if half:
        y = net.op("Cast", y, to=TensorProto.FLOAT16)
    if gamma:
        g = RNG.uniform(0.5, 1.5, gamma_shape or nshape)
        y = net.op("Mul", y, net.const(g, dt))
    if beta:
        y = net.op("Add", net.const(RNG.normal(0, 0.1, nshape), dt), y)
    outputs = [y, d] if extra_output else [y]
    elem = TensorProto.FLOAT16 if half else TensorProto.FLOAT
    return net.model({"x": (elem, shape)}, outputs), shape


VARIANTS = list(itertools.product(["pow", "mul"], ["div", "div_pow", "reciprocal", "one_over", "rsqrt_pow"]))


@pytest.mark.parametrize(("square", "norm"), VARIANTS)
def test_layernorm_forms(square, norm):
    model, shape = _layernorm_model(square=square, norm=norm)
    g0, g1 = _optimize(model)
    assert g1.op_counts() == {"LayerNormalization": 1}
    node = g1.nodes[0]
    assert node.attrs.axis == -1 and node.attrs.stash_type == 1
    assert node.attrs.epsilon == pytest.approx(1e-5)
    assert len(node.inputs) == 3
    _check_same(g0, g1, {"x": RNG.normal(0, 2, shape).astype(np.float32)})


@pytest.mark.parametrize(("gamma", "beta"), [(False, False), (True, False), (False, True), (True, True)])
@pytest.mark.parametrize("opset", [13, 18])
def test_layernorm_affine_tails(gamma, beta, opset):
    model, shape = _layernorm_model(gamma=gamma, beta=beta, opset=opset)
    g0, g1 = _optimize(model)
    assert g1.op_counts() == {"LayerNormalization": 1}
    assert (len(g1.nodes[0].inputs) == 3) == beta
    _check_same(g0, g1, {"x": RNG.normal(0, 2, shape).astype(np.float32)})


@pytest.mark.parametrize(("gamma", "beta"), [(False, False), (True, False), (False, True), (True, True)])
def test_layernorm_float16_between_casts(gamma, beta):
    # TorchScript below opset 17 in float16: the chain runs in float32 between two Casts.
    model, shape = _layernorm_model(half=True, gamma=gamma, beta=beta, opset=13)
    g0, g1 = _optimize(model)
    assert g1.op_counts() == {"LayerNormalization": 1}
    node = g1.nodes[0]
    assert node.inputs[0].name == "x" and node.outputs[0].ttype.dtype.name == "float16"
    assert node.attrs.stash_type == 1
    x = RNG.normal(0, 2, shape).astype(np.float16)
    _check_same(g0, g1, {"x": x}, rtol=4e-3, atol=4e-3)


def test_layernorm_cast_to_another_type_stays_outside():
    # f32 chain cast to float16 without an up-cast before: LayerNormalization keeps x's type,
    # so the Cast stays after it (as the LayerNorm kernel's store: passes/fuse_casts.py).
    net = _Net(18)
    mean = net.reduce_mean("x", [-1])
    d = net.op("Sub", "x", mean)
    var = net.reduce_mean(net.op("Mul", d, d), [-1])
    y = net.op("Div", d, net.op("Sqrt", net.op("Add", var, net.const(1e-5))))
    y = net.op("Cast", y, to=TensorProto.FLOAT16)
    g0, g1 = _optimize(net.model({"x": (TensorProto.FLOAT, (3, 8))}, [y]))
    assert g1.op_counts() == {"Fused[LayerNormalization]": 1}
    (node,) = g1.nodes
    assert node.inputs[0].ttype.dtype.name == "float32" and [e.op for e in node.attrs.epilogue] == ["Cast"]
    _check_same(g0, g1, {"x": RNG.normal(0, 2, (3, 8)).astype(np.float32)}, rtol=2e-3, atol=2e-3)


def test_layernorm_two_trailing_axes_and_broadcast_gamma():
    # Gamma [1, 6, 1] broadcasts over the normalized dims (6, 4) only: it goes into the node.
    model, shape = _layernorm_model(shape=(3, 6, 4), axes=(-2, -1), gamma_shape=(1, 6, 1), beta=True)
    g0, g1 = _optimize(model)
    assert g1.op_counts() == {"LayerNormalization": 1}
    node = g1.nodes[0]
    assert node.attrs.axis == -2
    assert g1.const(node.inputs[1].name).shape == (6, 4)
    _check_same(g0, g1, {"x": RNG.normal(0, 2, shape).astype(np.float32)})


def test_layernorm_gamma_over_other_dims_stays_outside():
    # Gamma [5, 1] varies over a non-normalized dim: the core fuses, the Mul and Add stay.
    model, shape = _layernorm_model(gamma_shape=(5, 1))
    g0, g1 = _optimize(model)
    counts = g1.op_counts()
    assert counts["LayerNormalization"] == 1 and counts["Mul"] == 1 and counts["Add"] == 1
    _check_same(g0, g1, {"x": RNG.normal(0, 2, shape).astype(np.float32)})


@pytest.mark.parametrize(
    "kwargs",
    [
        {"axes": (1,)},  # not the trailing dims
        {"axes": (-2,)},
        {"exponent": 3.0},
    ],
)
def test_layernorm_not_fused(kwargs):
    model, shape = _layernorm_model(**kwargs)
    g0, g1 = _optimize(model)
    assert "LayerNormalization" not in g1.op_counts()
    assert "RMSNormalization" not in g1.op_counts()
    _check_same(g0, g1, {"x": RNG.normal(0, 2, shape).astype(np.float32)})


def test_layernorm_interior_used_elsewhere_is_a_near_miss():
    model, shape = _layernorm_model(extra_output=True)
    g0 = graphc.load_onnx(model)
    g1 = fuse_layernorm(g0)
    assert "LayerNormalization" not in g1.op_counts()
    misses = g1.meta.get("near_misses", [])
    assert any("LayerNorm" in m and "'blk/Sub_3'" in m and "graph output" in m for m in misses), misses
    assert fuse_layernorm(g1) is g1  # nothing new: the same graph back


def test_layernorm_pass_returns_same_graph_when_nothing_matches():
    net = _Net()
    y = net.op("Relu", "x")
    g = graphc.load_onnx(net.model({"x": (TensorProto.FLOAT, (2, 3))}, [y]))
    assert fuse_layernorm(g) is g


def test_existing_layernorm_absorbs_following_affine():
    net = _Net(18)
    ln = net.op("LayerNormalization", "x", net.const(RNG.uniform(0.5, 1.5, 8)), axis=-1, epsilon=1e-6)
    y = net.op("Mul", ln, net.const(RNG.uniform(0.5, 1.5, (1, 8))))
    y = net.op("Add", y, net.const(RNG.normal(0, 1, (8,))))
    model = net.model({"x": (TensorProto.FLOAT, (3, 8))}, [y])
    g0, g1 = _optimize(model)
    assert g1.op_counts() == {"LayerNormalization": 1}
    _check_same(g0, g1, {"x": RNG.normal(0, 2, (3, 8)).astype(np.float32)})


# ---- RMSNorm -----------------------------------------------------------------------------------


def _rms_model(*, norm="reciprocal", square="pow", cast=False, gamma=True, shape=(2, 7, 16), eps=1e-6):
    net = _Net(18)
    x = "x"
    if cast:
        x = net.op("Cast", "x", to=TensorProto.FLOAT)
    sq = net.op("Pow", x, net.const(2.0)) if square == "pow" else net.op("Mul", x, x)
    var = net.reduce_mean(sq, [-1])
    ve = net.op("Add", var, net.const(eps))
    y = _normalize(net, x, ve, norm)
    dt = np.float16 if cast else np.float32
    if cast:
        y = net.op("Cast", y, to=TensorProto.FLOAT16)
    if gamma:
        y = net.op("Mul", net.const(RNG.uniform(0.5, 1.5, shape[-1]), dt), y)
    elem = TensorProto.FLOAT16 if cast else TensorProto.FLOAT
    return net.model({"x": (elem, shape)}, [y]), shape, dt


@pytest.mark.parametrize(("square", "norm"), VARIANTS)
def test_rmsnorm_forms(square, norm):
    model, shape, dt = _rms_model(square=square, norm=norm)
    g0, g1 = _optimize(model)
    assert g1.op_counts() == {"RMSNormalization": 1}
    _check_same(g0, g1, {"x": RNG.normal(0, 2, shape).astype(dt)})


@pytest.mark.parametrize("gamma", [True, False])
def test_rmsnorm_float16_between_casts(gamma):
    # LLaMA: x16 -> Cast f32 -> ... -> Cast f16 -> * gamma16: one node, x16 in, f16 out.
    model, shape, dt = _rms_model(cast=True, gamma=gamma)
    g0, g1 = _optimize(model)
    assert g1.op_counts() == {"RMSNormalization": 1}
    node = g1.nodes[0]
    assert node.inputs[0].name == "x"
    assert node.outputs[0].ttype.dtype.name == "float16"
    _check_same(g0, g1, {"x": RNG.normal(0, 2, shape).astype(dt)}, rtol=2e-3, atol=2e-3)


# ---- zoo models --------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "layers"), [("bert", 2), ("vit", 2)])
@pytest.mark.parametrize("form", ["decomposed", "fused"])
def test_zoo_layernorms(name, layers, form):
    model = models.build(name, size="tiny", layernorm=form)
    feeds = models.sample_inputs(name, model, batch=2)
    dims = {"batch": 2, "seq": feeds["input_ids"].shape[1]} if name == "bert" else {"batch": 2}
    g0 = graphc.bind_shapes(graphc.load_onnx(model), dims)
    g1 = optimize(g0, OptimizeOptions(opt_level=2, verify=True), stages=_stages()).graph
    counts = g1.op_counts()
    # bert: embeddings + 2 per layer; vit: 2 per layer + the final one.
    assert counts.get("LayerNormalization") == 2 * layers + 1
    for op in ("ReduceMean", "Sqrt", "Pow"):
        assert op not in counts, counts
    _check_same(g0, g1, feeds, rtol=1e-4, atol=1e-4)
