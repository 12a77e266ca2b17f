"""Every tiny zoo model, optimized at levels 1-3, against the unoptimized graph: through the
interpreter and through CPU engines (graphc.compile(target="cpu")); and the structure the folding
and fusion passes promise for the CNNs and transformers."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pytest

import graphc
import models
from graphc.ir.verify import verify_graph
from graphc.passes import OptimizeOptions, optimize

VARIANTS = {
    "mlp": {},
    "mlp-matmul": {"linear": "matmul"},
    "resnet": {},
    "mobilenetv2": {},
    "bert": {},
    "bert-decomposed": {"layernorm": "decomposed", "pooler": True, "token_type_input": True},
    "vit": {},
    "vit-opset13": {"opset": 13},
}
LEVELS = (1, 2, 3)


@functools.cache
def _model(variant: str):
    name = variant.split("-")[0]
    model = models.build(name, "tiny", **VARIANTS[variant])
    feeds = models.sample_inputs(name, model, seed=1)
    graph = graphc.bind_shapes(graphc.load_onnx(model), {k: v.shape for k, v in feeds.items()})
    reference = graphc.interpret(graph, feeds)
    return model, feeds, graph, reference


@functools.cache
def _optimized(variant: str, level: int):
    _, _, graph, _ = _model(variant)
    g = optimize(graph, OptimizeOptions(opt_level=level, verify=True)).graph
    verify_graph(g)
    return g


def _close(got: dict, want: dict) -> None:
    assert set(got) == set(want)
    for k, w in want.items():
        g = np.asarray(got[k])
        assert g.dtype == w.dtype and g.shape == w.shape, k
        # Folding and fusion reorder float arithmetic: agree to 1e-4 of the output's scale.
        scale = float(np.abs(w).max()) or 1.0
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-4 * scale, err_msg=k)


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_interpreter(variant: str, level: int) -> None:
    _, feeds, _, reference = _model(variant)
    _close(graphc.interpret(_optimized(variant, level), feeds), reference)


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_cpu_engine(variant: str, level: int) -> None:
    model, feeds, _, reference = _model(variant)
    engine = graphc.compile(model, target="cpu", shapes={k: v.shape for k, v in feeds.items()}, opt_level=level)
    _close(engine.run(feeds), reference)


def _fused(g, anchor: str) -> list:
    return [n for n in g.nodes if n.op == "Fused" and n.attrs.anchor_op == anchor]


def _epilogue(node) -> list[str]:
    return [e.op for e in node.attrs.epilogue]


@pytest.mark.parametrize("variant", ["resnet", "mobilenetv2"])
def test_cnn_structure(variant: str) -> None:
    _, _, graph, _ = _model(variant)
    g = _optimized(variant, 2)
    counts = g.op_counts()
    allowed = {"Fused[Conv]", "MaxPool", "GlobalAveragePool", "ReduceMean", "Fused[Gemm]", "Gemm", "Reshape"}
    assert set(counts) <= allowed, counts
    assert counts.get("GlobalAveragePool", 0) + counts.get("ReduceMean", 0) == 1
    assert counts["Fused[Conv]"] == graph.op_counts()["Conv"]
    epilogues = [_epilogue(n) for n in _fused(g, "Conv")]
    act = "Relu" if variant == "resnet" else "Clip"
    assert all(e[0] == "Add" for e in epilogues)  # the folded BN's bias
    assert sum(act in e for e in epilogues) == graph.op_counts()["Relu" if variant == "resnet" else "Clip"]
    residuals = graph.op_counts()["Add"]
    assert sum(e.count("Add") == 2 for e in epilogues) == residuals
    assert not g.meta.get("near_misses")


@pytest.mark.parametrize("variant", ["bert", "bert-decomposed", "vit"])
def test_transformer_structure(variant: str) -> None:
    g = _optimized(variant, 2)
    counts = g.op_counts()
    assert "MatMul" not in counts and "Add" not in counts and "Gelu" not in counts, counts
    epilogues = [_epilogue(n) for n in _fused(g, "MatMul")]
    assert epilogues and all(e[0] == "Add" for e in epilogues)  # bias
    assert sum(e == ["Add", "Gelu"] for e in epilogues) == 2  # the FFN's first matmul, per layer
    assert sum(e == ["Add", "Add"] for e in epilogues) == 4  # bias + residual: attention out, FFN out


EXPORTS = Path("/work/exports")


@pytest.mark.slow
@pytest.mark.skipif(not (EXPORTS / "resnet50.dynamo.onnx").exists(), reason="needs the exported ResNet-50")
def test_resnet50_export() -> None:
    """torch.onnx.export(dynamo=True) of ResNet-50 at batch 1: nothing but fused convs (bias,
    ReLU and the residual add inside), the max pool, one global pooling and one Gemm."""
    graph = graphc.bind_shapes(graphc.load_onnx(EXPORTS / "resnet50.dynamo.onnx"), {"batch": 1})
    g = _optimized_graph(graph)
    counts = g.op_counts()
    pools = counts.pop("ReduceMean", 0) + counts.pop("GlobalAveragePool", 0)
    gemms = counts.pop("Gemm", 0) + counts.pop("Fused[Gemm]", 0)
    counts.pop("Reshape", None)
    assert (pools, gemms) == (1, 1) and counts == {"Fused[Conv]": 53, "MaxPool": 1}, g.op_counts()
    epilogues = [_epilogue(n) for n in _fused(g, "Conv")]
    assert sum(e == ["Add", "Add", "Relu"] for e in epilogues) == 16  # bias, residual, ReLU
    assert sum(e == ["Add", "Relu"] for e in epilogues) == 33
    x = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
    _close(graphc.interpret(g, {"pixel_values": x}), graphc.interpret(graph, {"pixel_values": x}))


def _optimized_graph(graph):
    g = optimize(graph, OptimizeOptions(opt_level=2, verify=True)).graph
    verify_graph(g)
    return g
