"""fp16/bf16 conversion: casts only at the edges, saturating constants, fp32 I/O kept."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import graphc
import models
from graphc.ir import DType, verify_graph
from graphc.passes import optimize
from graphc.passes.precision import convert_precision


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize("name", ["resnet", "bert"])
def test_zoo_in_reduced_precision_stays_close(name, precision):
    m = models.build(name, size="tiny")
    feeds = models.sample_inputs(name, m)
    g = optimize(graphc.bind_shapes(graphc.load_onnx(m), {k: v.shape for k, v in feeds.items()})).graph
    h = convert_precision(g, precision)
    verify_graph(h)
    ref = graphc.interpret(g, feeds)
    out = graphc.interpret(h, feeds)
    for k in ref:
        assert out[k].dtype == ref[k].dtype  # the model's output dtype is kept
        a, r = out[k].astype(np.float64).ravel(), ref[k].astype(np.float64).ravel()
        assert np.isfinite(a).all()
        assert a @ r / np.linalg.norm(a) / np.linalg.norm(r) > 0.999
    casts = [n for n in h.nodes if n.op == "Cast"]
    # one cast per float input and per float output, nothing in between
    n_float_in = sum(1 for v in g.inputs if v.type.dtype is DType.float32)
    assert len(casts) <= n_float_in + len(g.outputs) + sum(1 for n in g.nodes if n.op == "Cast")


def test_mask_constants_saturate_instead_of_overflowing():
    """(1 - mask) * finfo(f32).min: in fp16 the constant must become -65504, not -inf, or
    0 * -inf = NaN would poison every unmasked position."""
    x = helper.make_tensor_value_info("m", TensorProto.FLOAT, [4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])
    nodes = [helper.make_node("Sub", ["one", "m"], ["inv"]), helper.make_node("Mul", ["inv", "big"], ["y"])]
    inits = [
        numpy_helper.from_array(np.array(1.0, np.float32), "one"),
        numpy_helper.from_array(np.array(np.finfo(np.float32).min, np.float32), "big"),
    ]
    model = helper.make_model(
        helper.make_graph(nodes, "g", [x], [y], inits), opset_imports=[helper.make_opsetid("", 17)]
    )
    g = graphc.load_onnx(model)
    h = convert_precision(g, "fp16")
    out = graphc.interpret(h, {"m": np.array([1, 0, 1, 0], np.float32)})["y"]
    assert np.isfinite(out).all() and out[0] == 0 and out[1] == -65504


def test_infinite_constants_stay_infinite():
    """A -inf constant (the fill of a fused attention mask) must not saturate to -65504: the
    attention kernels find the rows with no key by their -inf, and -65504 + score is a real logit."""
    g = graphc.load_onnx(
        helper.make_model(
            helper.make_graph(
                [helper.make_node("Add", ["x", "c"], ["y"])],
                "g",
                [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
                [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])],
                [numpy_helper.from_array(np.array([-np.inf, np.inf, -1e38], np.float32), "c")],
            ),
            opset_imports=[helper.make_opsetid("", 17)],
        )
    )
    out = graphc.interpret(convert_precision(g, "fp16"), {"x": np.zeros(3, np.float32)})["y"]
    assert out[0] == -np.inf and out[1] == np.inf and out[2] == -65504


def test_fp16_bias_and_padding_mask_rows_with_no_key():
    """A constant relative-position bias beside a finfo.min padding mask fuses as
    Where(keep, bias, -inf) with wholly masked rows the mean of V; in fp16 the -inf once became
    -65504 and those rows a softmax of the scores (cosine 0.93 to ONNX Runtime)."""
    import onnxruntime as ort

    from tests.passes.test_fuse_attention_padding import _feeds, _model

    model, feeds = _model("bias:window"), _feeds()
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    engine = graphc.compile(model, target="cpu", precision="fp16", shapes={k: v.shape for k, v in feeds.items()})
    assert engine.report["ops_after"].get("Attention") == 1, engine.report["ops_after"]
    got = np.asarray(next(iter(engine.run(feeds).values())), np.float64)
    scale = float(np.abs(want).max())
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-2 * scale)  # every row, the padded ones too
