"""TensorScatter (opset 24's KV-cache write): the interpreter and the CPU engine against ONNX's own
reference, and the CUDA target's ScatterElements form (passes/decompose_tensor_scatter.py) exactly
equal to it; NVRTC compiles that form where it is installed. Bad input gets a one-line error."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

import graphc
from graphc.errors import GraphcError
from graphc.passes import OptimizeOptions, optimize
from graphc.passes.target import Target
from tests.helpers import OnnxNet, have_nvrtc

B, H, L, D = 3, 2, 10, 4  # batch, heads, cache length, head dim


def _model(seq: int, mode: str, axis: int, with_write: bool, layout: str = "bhsd") -> onnx.ModelProto:
    net = OnnxNet()
    cache = [B, H, L, D] if layout == "bhsd" else [B, L, H, D]
    upd = list(cache)
    upd[axis % 4] = seq
    past = net.input("past", TensorProto.FLOAT, cache)
    u = net.input("update", TensorProto.FLOAT, upd)
    ins = [past, u]
    if with_write:
        ins.append(net.input("write", TensorProto.INT64, [B]))
    y = net.op("TensorScatter", *ins, mode=mode, axis=axis)
    return net.make([helper.make_tensor_value_info(y, TensorProto.FLOAT, cache)], opset=24, ir_version=10)


def _feeds(model: onnx.ModelProto, write) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(2)
    feeds = {}
    for i in model.graph.input:
        shape = [d.dim_value for d in i.type.tensor_type.shape.dim]
        feeds[i.name] = rng.standard_normal(shape).astype(np.float32) if i.name != "write" else np.array(write)
    return feeds


def _cuda_graph(model: onnx.ModelProto):
    return optimize(graphc.load_onnx(model), OptimizeOptions(opt_level=2, target=Target(name="cuda", precision="fp32")))


CASES = [
    (3, "linear", -2, True, "bhsd", [0, 2, 7]),  # decode writes after each row's last token
    (1, "linear", -2, True, "bhsd", [9, 0, 4]),
    (4, "circular", -2, True, "bhsd", [8, 9, 3]),  # wraps past the end
    (10, "linear", -2, False, "bhsd", None),  # prefill: the whole cache, no write_indices
    (2, "circular", 1, True, "bshd", [9, 1, 5]),  # the sequence axis second: [batch, seq, heads, dim]
]


@pytest.mark.parametrize(("seq", "mode", "axis", "with_write", "layout", "write"), CASES)
def test_against_onnx_reference(seq, mode, axis, with_write, layout, write):
    model = _model(seq, mode, axis, with_write, layout)
    feeds = _feeds(model, write)
    (want,) = ReferenceEvaluator(model).run(None, feeds)
    got = graphc.interpret(graphc.load_onnx(model), feeds)
    np.testing.assert_array_equal(next(iter(got.values())), want)
    cpu = graphc.compile(model, target="cpu")
    np.testing.assert_array_equal(np.asarray(next(iter(cpu.run(feeds).values()))), want)
    g = _cuda_graph(model).graph  # the CUDA form: ScatterElements, the same elements
    ops = g.op_counts()
    assert "TensorScatter" not in ops and ops.get("ScatterElements") == 1, ops
    np.testing.assert_array_equal(next(iter(graphc.interpret(g, feeds).values())), want)


@pytest.mark.skipif(not have_nvrtc(), reason="NVRTC (cuda-bindings) is not installed")
def test_cuda_form_compiles():
    model = _model(3, "circular", -2, True)
    engine = graphc.compile(model, target="cuda", precision="fp16", arch=["sm_80", "sm_90"])
    assert engine.plan.steps


def test_a_linear_write_past_the_cache_is_an_error():
    model = _model(3, "linear", -2, True)
    with pytest.raises(GraphcError, match=r"write_indices\[1\] = 8 with 3 update rows leaves the cache's 10"):
        graphc.interpret(graphc.load_onnx(model), _feeds(model, [0, 8, 1]))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"axis": 0}, "batch axis"),
        ({"mode": "ring"}, "not linear or circular"),
        ({"seq": 11}, "exceed the cache's 10"),
    ],
)
def test_bad_nodes_are_refused_in_one_line(change, message):
    seq = change.get("seq", 2)
    net = OnnxNet()
    past = net.input("past", TensorProto.FLOAT, [B, H, L, D])
    u = net.input("update", TensorProto.FLOAT, [B, H, seq, D] if "axis" not in change else [seq, H, L, D])
    y = net.op("TensorScatter", past, u, mode=change.get("mode", "linear"), axis=change.get("axis", -2))
    model = net.make([helper.make_tensor_value_info(y, TensorProto.FLOAT, [B, H, L, D])], opset=24, ir_version=10)
    with pytest.raises(GraphcError, match=message) as e:
        graphc.load_onnx(model)
    assert "\n" not in str(e.value)
