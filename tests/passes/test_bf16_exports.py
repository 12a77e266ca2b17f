"""Models whose weights and constants are bfloat16 (a model exported after `.to(torch.bfloat16)`):
their scales, epsilons and mask fills are ml_dtypes arrays, which numpy files under kind "V", not
"f". The fusions must see them as floats: the same fused ops as the float32 model, and outputs that
agree with ONNX Runtime's float32 run to bf16 precision."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, numpy_helper

import graphc
import models
from graphc.ir.shapes import bind_shapes
from graphc.passes import OptimizeOptions, optimize
from graphc.passes.fuse_util import is_float_data, scalar
from tests.passes.test_fuse_attention_padding import _model

FUSED = ("Attention", "LayerNormalization", "Gelu")


def _to_bf16(model: onnx.ModelProto) -> onnx.ModelProto:
    m = onnx.ModelProto.FromString(model.SerializeToString())
    for t in m.graph.initializer:
        a = numpy_helper.to_array(t)
        if a.dtype == np.float32:
            t.CopyFrom(numpy_helper.from_array(a.astype(ml_dtypes.bfloat16), t.name))
    for node in m.graph.node:
        for attr in node.attribute:
            if attr.name == "value" and attr.t.data_type == TensorProto.FLOAT:
                a = numpy_helper.to_array(attr.t)
                attr.t.CopyFrom(numpy_helper.from_array(a.astype(ml_dtypes.bfloat16), attr.t.name))
            if node.op_type == "Cast" and attr.name == "to" and attr.i == TensorProto.FLOAT:
                attr.i = TensorProto.BFLOAT16
    for vi in [*m.graph.input, *m.graph.output]:
        if vi.type.tensor_type.elem_type == TensorProto.FLOAT:
            vi.type.tensor_type.elem_type = TensorProto.BFLOAT16
    del m.graph.value_info[:]
    return m


def _counts(model: onnx.ModelProto, shapes: dict | None = None) -> dict[str, int]:
    g = graphc.load_onnx(model)
    if shapes:
        g = bind_shapes(g, shapes)
    g = optimize(g, OptimizeOptions(opt_level=2, verify=True)).graph
    return {op: g.op_counts().get(op, 0) for op in FUSED}


def test_bf16_data_is_float_data():
    assert is_float_data(np.zeros(2, ml_dtypes.bfloat16)) and is_float_data(np.zeros(2, ml_dtypes.float8_e4m3fn))
    assert not is_float_data(np.zeros(2, np.int64)) and not is_float_data(np.zeros(2, np.bool_))
    assert scalar(np.array(-3.0, ml_dtypes.bfloat16)) == -3.0


@pytest.mark.parametrize("spelling", ["eager:causal", "where_min:window", "sdpa:window", "legacy:causal"])
def test_bf16_attention_masks_fuse_as_float32_ones_do(spelling):
    model = _model(spelling)
    want = _counts(model)
    assert want["Attention"] == 1
    assert _counts(_to_bf16(model)) == want


@pytest.mark.parametrize("name", ["bert", "vit"])
def test_bf16_zoo_models_fuse_and_match_onnxruntime(name):
    model = models.build(name, size="tiny", layernorm="decomposed")
    feeds = models.sample_inputs(name, model, seed=0)
    shapes = {k: v.shape for k, v in feeds.items()}
    want = _counts(model, shapes)
    assert want["Attention"] >= 1, want
    bf = _to_bf16(model)
    assert _counts(bf, shapes) == want
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    bfeeds = {k: v.astype(ml_dtypes.bfloat16) if v.dtype == np.float32 else v for k, v in feeds.items()}
    got = np.asarray(next(iter(graphc.compile(bf, target="cpu", shapes=shapes).run(bfeeds).values())), np.float64)
    cos = float(got.ravel() @ ref.ravel() / (np.linalg.norm(got) * np.linalg.norm(ref)))
    assert cos > 0.995, cos
