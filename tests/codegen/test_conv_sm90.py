"""1x1 convolutions on the Hopper TMA GEMM (codegen/families/conv_sm90.py) without a GPU: which
convs an sm_90 engine routes to it, the GEMM problem and fused epilogue it builds (the conv's bias
first), the per-arch launches of a multi-arch engine, and the SASS of its cubins."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

import graphc

sys.path.insert(0, str(Path(__file__).parent))
from conv_sm90_models import conv1x1_model  # noqa: E402
from test_sass_sm90 import CUOBJDUMP, needs_cuobjdump, sass  # noqa: E402


def _conv_launches(eng, arch: str = "sm_90"):
    return [(s.name, ln) for s in eng.plan.steps for ln in s.launches_for(arch) if ln.family == "conv"]


def _compile(model, arch, tmp_path, precision="fp16"):
    return graphc.compile(model, target="cuda", precision=precision, arch=arch, cache_dir=str(tmp_path / "cache"))


def test_1x1_conv_runs_on_the_tma_gemm(tmp_path):
    model, _ = conv1x1_model(2, 64, 56, 256)  # M = 2 * 56 * 56 = 6272
    eng = _compile(model, ["sm_90"], tmp_path)
    (c3, l3), (c1, l1) = _conv_launches(eng)
    assert l3.params["variant"] == "igemm"  # the 3x3 conv in front: the wgmma implicit GEMM
    p = l1.params
    assert (p["variant"], p["path"], p["M"], p["N"], p["K"], p["a"], p["b"]) == (
        "tma_gemm",
        "tma",
        6272,
        256,
        64,
        "k",
        "k",
    )
    assert p["VEC_EPI"] == 1 and p["requires_arch"] == "sm_90a"
    # the tensor maps read the NHWC activation and the [Cout, 1, 1, Cin] weight in place
    step = next(s for s in eng.plan.steps if s.name == c1)
    ta, tb = p["tmaps"]
    assert (ta["tensor"], ta["dims"]) == (step.inputs[0], [64, 6272, 1])
    assert (tb["tensor"], tb["dims"]) == (step.inputs[1], [64, 256, 1])
    # bias, residual and the output are the kernel's other arguments
    assert l1.args[:2] == ["@tmap:0", "@tmap:1"] and len(l1.args) == 5


@pytest.mark.parametrize(
    ("shape", "kw", "why"),
    [
        ((1, 128, 14, 512), {}, "M = 196 < 512 and Cin = 128 < 256"),
        ((2, 64, 56, 256), {"stride": 2}, "strided"),
        ((2, 32, 56, 256), {}, "Cin = 32 < 64"),
    ],
)
def test_other_convs_stay(tmp_path, shape, kw, why):
    model, _ = conv1x1_model(*shape, **kw)
    eng = _compile(model, ["sm_90"], tmp_path)
    variants = [ln.params["variant"] for _, ln in _conv_launches(eng)]
    assert "tma_gemm" not in variants, why


@pytest.mark.parametrize("shape", [(1, 64, 56, 256), (1, 128, 28, 512), (1, 512, 7, 128)])
def test_batch1_convs_taken(tmp_path, shape):
    model, _ = conv1x1_model(*shape)  # M = 3136; M = 784; M = 49 with Cin = 512
    eng = _compile(model, ["sm_90"], tmp_path)
    launches = [ln.params for _, ln in _conv_launches(eng)]
    if shape[2] == 7:  # K split on the TMA GEMM: the implicit GEMM as one cluster instead (SPLIT_1X1_ON_IGEMM)
        assert launches and all((p["variant"], p["CLUSTER"]) == ("igemm", 1) for p in launches), launches
    else:
        assert [p.get("path") for p in launches].count("tma") == 1  # (+ split-K's reduce)


def test_fp32_engine_keeps_the_conv_kernel(tmp_path):
    model, _ = conv1x1_model(2, 64, 56, 256)
    eng = _compile(model, ["sm_90"], tmp_path, precision="fp32")
    assert all(ln.params["variant"] != "tma_gemm" for _, ln in _conv_launches(eng))


def _fused_conv_ctx(bias: bool):
    """A Fused ConvNHWC step, 1x1 64 -> 256 over [2, 56, 56], with residual + ReLU (and a bias)."""
    import numpy as np

    from graphc.codegen.lower import lower_to_plan
    from graphc.ir.attrs import onnx_attrs_class
    from graphc.ir.builder import GraphBuilder
    from graphc.ir.types import DType, TensorType
    from graphc.ops.fused import ACC, IN, OP, EpilogueOp, FusedAttrs
    from graphc.ops.layout_ops import ConvNHWCAttrs

    b = GraphBuilder("t")
    x = b.add_input("x", TensorType(DType.float16, (2, 56, 56, 64)))
    r = b.add_input("r", TensorType(DType.float16, (2, 56, 56, 256)))
    ins = [x, b.add_constant(np.zeros((256, 1, 1, 64), np.float16), "w")]
    if bias:
        ins.append(b.add_constant(np.zeros((256,), np.float16), "b"))
    ins.append(r)
    ri = len(ins) - 1
    fa = FusedAttrs(
        anchor_op="ConvNHWC",
        anchor_domain="graphc",
        anchor_attrs=ConvNHWCAttrs(kernel_shape=(1, 1)),
        anchor_inputs=len(ins) - 1,
        epilogue=(
            EpilogueOp("Add", onnx_attrs_class("Add")(), (ACC, IN(ri))),
            EpilogueOp("Relu", onnx_attrs_class("Relu")(), (OP(0),)),
        ),
        outputs=(OP(1),),
    )
    y = b.add_node("Fused", ins, fa, domain="graphc").outputs[0]
    b.set_outputs([y])
    graph = b.build()
    plan = lower_to_plan(graph)
    weights = {name: c.data for name, c in graph.constants.items()}
    return plan.context(plan.steps[0], weights, precision="fp16")


def test_epilogue_has_the_bias_first():
    from graphc.codegen.families import conv_sm90
    from graphc.ops.fused import ACC, IN, OP

    prob = conv_sm90.gemm_problem(_fused_conv_ctx(bias=True))
    assert not isinstance(prob, str), prob
    assert (prob.M, prob.N, prob.K) == (6272, 256, 64)
    assert [(e.op, e.args) for e in prob.epilogue] == [
        ("Add", (ACC, IN(2))),
        ("Add", (OP(0), IN(3))),
        ("Relu", (OP(1),)),
    ]
    assert prob.outputs == (OP(2),)
    prob = conv_sm90.gemm_problem(_fused_conv_ctx(bias=False))
    assert [(e.op, e.args) for e in prob.epilogue] == [("Add", (ACC, IN(2))), ("Relu", (OP(0),))]
    assert prob.outputs == (OP(1),)


def test_multi_arch_engine_has_sm90_launches_of_its_own(tmp_path):
    model, _ = conv1x1_model(2, 64, 56, 256)
    eng = _compile(model, ["sm_80", "sm_90"], tmp_path)
    default = {n: ln.params["variant"] for n, ln in _conv_launches(eng, "sm_80")}
    hopper = {n: ln.params["variant"] for n, ln in _conv_launches(eng, "sm_90")}
    assert "tma_gemm" not in default.values()
    assert list(hopper.values()).count("tma_gemm") == 1


@needs_cuobjdump
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_conv_cubin_sass(tmp_path, precision):
    model, _ = conv1x1_model(2, 64, 56, 256)
    eng = _compile(model, ["sm_90"], tmp_path, precision=precision)
    (name, ln) = next((n, ln) for n, ln in _conv_launches(eng) if ln.params["variant"] == "tma_gemm")
    assert CUOBJDUMP
    text = sass(eng.kernels.cubins["sm_90"][ln.digest], tmp_path, ln.kernel)
    for op in ("HGMMA", "UTMALDG", "STG.E.128"):
        assert op in text, f"{name}: no {op}"
    assert not re.search(r"\b(LDL|STL)\b", text), "register spills"
