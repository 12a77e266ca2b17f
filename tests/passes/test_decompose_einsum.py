"""decompose_einsum: the MatMul form equals Einsum's reference over batched matmuls, attention
forms, outer products, reductions, transposes, ellipses, implicit outputs and three operands;
declined forms stay Einsum; the CUDA target compiles an einsum attention block (no GPU needed)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import graphc
from graphc.ir.shapes import bind_shapes
from graphc.passes.decompose_einsum import decompose_einsum, parse_equation

RNG = np.random.default_rng(0)


def _graph(equation: str, shapes: list[tuple[int, ...]], dtype=np.float32):
    names = [f"x{i}" for i in range(len(shapes))]
    node = helper.make_node("Einsum", names, ["y"], equation=equation)
    et = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    g = helper.make_graph(
        [node],
        "e",
        [helper.make_tensor_value_info(n, et, s) for n, s in zip(names, shapes, strict=True)],
        [helper.make_tensor_value_info("y", TensorProto.UNDEFINED, None)],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 10
    m = onnx.shape_inference.infer_shapes(m)
    return m, bind_shapes(graphc.load_onnx(m), None)


CASES = [
    ("ij,jk->ik", [(3, 4), (4, 5)]),
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    ("bhqd,bhkd->bhqk", [(2, 3, 5, 8), (2, 3, 7, 8)]),
    ("bhqk,bhkd->bhqd", [(2, 3, 5, 7), (2, 3, 7, 8)]),
    ("bqhd,bkhd->bhqk", [(2, 5, 3, 8), (2, 7, 3, 8)]),
    ("i,j->ij", [(3,), (4,)]),
    ("ij->ji", [(3, 4)]),
    ("ij->i", [(3, 4)]),
    ("ij->", [(3, 4)]),
    ("bij,jk", [(2, 3, 4), (4, 5)]),  # implicit output: bik
    ("...ij,...jk->...ik", [(2, 3, 3, 4), (2, 3, 4, 5)]),
    ("abc,cd,de->abe", [(2, 3, 4), (4, 5), (5, 6)]),
    ("ijk,jl->il", [(3, 4, 5), (4, 6)]),  # k summed out of the first operand alone
    ("nchw,kc->nkhw", [(2, 6, 4, 3), (5, 6)]),  # a 1x1 convolution
]


@pytest.mark.parametrize(("equation", "shapes"), CASES)
def test_matmul_form_equals_reference(equation, shapes):
    _, g = _graph(equation, shapes)
    fired: list[str] = []
    d = decompose_einsum(g, fired=fired)
    assert len(fired) == 1 and "Einsum" not in {n.op for n in d.nodes}
    feeds = {f"x{i}": RNG.standard_normal(s).astype(np.float32) for i, s in enumerate(shapes)}
    ref, got = graphc.interpret(g, feeds)["y"], graphc.interpret(d, feeds)["y"]
    assert got.shape == ref.shape
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5 * max(1.0, float(np.abs(ref).max())))


@pytest.mark.parametrize(
    ("equation", "shapes", "dtype"),
    [
        ("ii->i", [(3, 3)], np.float32),  # a diagonal
        ("ij,jk->ik", [(3, 4), (4, 5)], np.int64),  # no integer GEMM kernels
        ("bij,bjk->bik", [(1, 3, 4), (2, 4, 5)], np.float32),  # size-1 broadcast of a letter
    ],
)
def test_declined_forms_stay_einsum(equation, shapes, dtype):
    _, g = _graph(equation, shapes, dtype)
    assert decompose_einsum(g) is g


def test_parse_equation():
    assert parse_equation("ij,jk->ik", [2, 2]) == (["ij", "jk"], "ik")
    assert parse_equation("ba,ab", [2, 2]) == (["ba", "ab"], "")
    terms, out = parse_equation("...ij,...jk->...ik", [4, 3])
    # the ellipses' letters align from the right: the second operand's one is the first's last
    assert terms[0][2:] == "ij" and terms[1][1:] == "jk" and terms[0][1] == terms[1][0]
    assert out == terms[0][:2] + "ik"
    assert parse_equation("ij,jk->ik", [2]) is None  # operand count


def test_matches_onnxruntime():
    from helpers import run_ort

    m, g = _graph("bhqd,bhkd->bhqk", [(2, 3, 5, 8), (2, 3, 7, 8)])
    feeds = {
        "x0": RNG.standard_normal((2, 3, 5, 8)).astype(np.float32),
        "x1": RNG.standard_normal((2, 3, 7, 8)).astype(np.float32),
    }
    expected = run_ort(m, feeds)["y"]
    np.testing.assert_allclose(graphc.interpret(decompose_einsum(g), feeds)["y"], expected, rtol=1e-5, atol=1e-5)


def test_cuda_target_compiles_einsum_attention():
    """softmax(einsum(q, k) / 8) then einsum with v: two GEMMs, no Einsum left."""
    b, h, s, d = 2, 4, 16, 8
    nodes = [
        helper.make_node("Einsum", ["q", "k"], ["s"], equation="bhqd,bhkd->bhqk"),
        helper.make_node("Div", ["s", "scale"], ["t"]),
        helper.make_node("Softmax", ["t"], ["p"], axis=-1),
        helper.make_node("Einsum", ["p", "v"], ["y"], equation="bhqk,bhkd->bhqd"),
    ]
    vi = [helper.make_tensor_value_info(n, TensorProto.FLOAT, (b, h, s, d)) for n in ("q", "k", "v")]
    g = helper.make_graph(
        nodes,
        "attn",
        vi,
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, (b, h, s, d))],
        [helper.make_tensor("scale", TensorProto.FLOAT, [], [8.0**0.5])],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 10
    eng = graphc.compile(m, target="cuda", precision="fp16", arch=["sm_90"])
    assert all(s.op != "Einsum" for s in eng.plan.steps)
    feeds = {n: RNG.standard_normal((b, h, s, d)).astype(np.float32) for n in ("q", "k", "v")}
    ref = graphc.interpret(graphc.load_onnx(m), feeds)["y"]
    cpu = graphc.compile(m, target="cpu").run(feeds)["y"]
    np.testing.assert_allclose(cpu, ref, rtol=1e-5, atol=1e-5)
