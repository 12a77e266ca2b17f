"""fuse_casts: a Cast goes into the epilogue of the kernel that makes its input, or into the load of
the kernels that read it, bit for bit what the separate Cast kernel gave.

Each case builds a small ONNX model, runs the whole fp16 pipeline for the CPU target (whose fused
nodes run the ops' numpy references) with and without the pass, and compares the outputs exactly;
the CUDA target's graph is checked for the fused form, and its kernels are rendered and (where
NVRTC is installed) compiled for sm_80 and sm_90, so a template that cannot store the cast dtype
fails here.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import graphc
from graphc.codegen.capabilities import CUDA
from graphc.codegen.epilogue import exact_cast
from graphc.ir.types import DType
from graphc.passes.manager import OptimizeOptions, Pass, optimize
from graphc.passes.pipeline import stages
from graphc.passes.target import Target

RNG = np.random.default_rng(11)
F = TensorProto.FLOAT


def _nvrtc_ok() -> bool:
    try:
        from graphc.codegen.nvrtc import nvrtc_version

        nvrtc_version()
        return True
    except Exception:
        return False


needs_nvrtc = pytest.mark.skipif(not _nvrtc_ok(), reason="NVRTC (cuda-bindings) is not installed")


def _model(nodes, inputs, outputs, inits=()) -> onnx.ModelProto:
    g = helper.make_graph(
        nodes,
        "t",
        [helper.make_tensor_value_info(n, dt, s) for n, dt, s in inputs],
        [helper.make_tensor_value_info(n, dt, s) for n, dt, s in outputs],
        [numpy_helper.from_array(a, n) for n, a in inits],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _without_fuse_casts() -> list:
    return [s for s in stages() if not (isinstance(s, Pass) and s.name == "fuse_casts")]


def _optimized(model: onnx.ModelProto, target: Target, *, fold: bool = True):
    g = graphc.bind_shapes(graphc.load_onnx(model), {})
    opts = OptimizeOptions(opt_level=2, verify=True, target=target)
    return optimize(g, opts, None if fold else _without_fuse_casts()).graph


CPU16 = Target("cpu", "fp16")
CUDA16 = Target("cuda", "fp16", capabilities=CUDA)


def _feeds(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    out = {}
    for i in model.graph.input:
        shape = [d.dim_value for d in i.type.tensor_type.shape.dim]
        if i.type.tensor_type.elem_type == TensorProto.INT64:
            out[i.name] = RNG.integers(0, 2, shape).astype(np.int64)
        else:
            out[i.name] = (RNG.standard_normal(shape) * 3).astype(np.float32)
    return out


def _casts(graph) -> int:
    return sum(1 for n in graph.nodes if n.op == "Cast")


def _fused_with_cast(graph) -> list:
    return [n for n in graph.nodes if n.op == "Fused" and any(e.op == "Cast" for e in n.attrs.epilogue)]


def _check_exact(model: onnx.ModelProto, target: Target = CPU16) -> tuple:
    """The optimized graphs with and without the pass, after checking that they compute the same
    bits."""
    g0 = _optimized(model, target, fold=False)
    g1 = _optimized(model, target)
    feeds = _feeds(model)
    a, b = graphc.interpret(g0, feeds), graphc.interpret(g1, feeds)
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
        bits_a, bits_b = (np.ascontiguousarray(r[k]).view(np.uint8) for r in (a, b))
        np.testing.assert_array_equal(bits_a, bits_b, err_msg=k)
    return g0, g1


def _linear(n: int = 40) -> onnx.ModelProto:
    """y = x @ W + b, fp32 in and out: an fp16 engine casts x in and y out."""
    w = RNG.standard_normal((64, n)).astype(np.float32) / 8
    bias = RNG.standard_normal(n).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["y"])]
    return _model(nodes, [("x", F, [4, 64])], [("y", F, [4, n])], [("w", w), ("b", bias)])


def test_output_cast_goes_into_the_gemm_epilogue():
    g0, g1 = _check_exact(_linear())
    assert _casts(g0) == 2 and _casts(g1) == 1  # the input cast feeds the GEMM's operand: it stays
    (fused,) = _fused_with_cast(g1)
    assert fused.attrs.anchor_op == "MatMul" and [e.op for e in fused.attrs.epilogue] == ["Add", "Cast"]
    assert fused.outputs[0].ttype.dtype is DType.float32
    c = _optimized(_linear(), CUDA16)
    assert _casts(c) == 1 and len(_fused_with_cast(c)) == 1


def test_plain_anchor_becomes_fused_with_a_cast():
    # A bare MatMul (no bias) and a bare LayerNormalization: each becomes Fused[anchor]{Cast(acc)}.
    # y is a graph output and read by the LayerNorm: the GEMM stores fp16 y (for the LayerNorm)
    # and fp32 y (the output) from one epilogue.
    w = RNG.standard_normal((64, 32)).astype(np.float32)
    sc, bi = np.ones(32, np.float32), np.zeros(32, np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["y"]),
        helper.make_node("LayerNormalization", ["y", "s", "b"], ["z"], axis=-1),
    ]
    m = _model(nodes, [("x", F, [4, 64])], [("y", F, [4, 32]), ("z", F, [4, 32])], [("w", w), ("s", sc), ("b", bi)])
    g0, g1 = _check_exact(m)
    fused = {n.attrs.anchor_op: n for n in _fused_with_cast(g1)}
    assert sorted(fused) == ["LayerNormalization", "MatMul"], [n.op for n in g1.nodes]
    gemm = fused["MatMul"]
    assert [v.ttype.dtype for v in gemm.outputs] == [DType.float16, DType.float32]
    assert g1.users(gemm.outputs[0].name)[0] is fused["LayerNormalization"]
    assert _casts(g1) == _casts(g0) - 2


def test_input_cast_goes_into_the_elementwise_load():
    # relu(x) * 2 + x on an fp32 input: the fp16 engine's input Cast joins the elementwise kernel.
    two = np.array(2.0, np.float32)
    nodes = [
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node("Mul", ["r", "two"], ["m"]),
        helper.make_node("Add", ["m", "x"], ["y"]),
    ]
    m = _model(nodes, [("x", F, [3, 50])], [("y", F, [3, 50])], [("two", two)])
    g0, g1 = _check_exact(m)
    assert _casts(g0) >= 1 and _casts(g1) == 0
    (fused,) = [n for n in g1.nodes if n.op == "Fused"]
    ops = [e.op for e in fused.attrs.epilogue]
    assert ops[0] == "Cast" and ops[-1] == "Cast", ops  # cast on the load and on the store
    assert fused.inputs[0].ttype.dtype is DType.float32 and fused.outputs[0].ttype.dtype is DType.float32
    assert len([n for n in _optimized(m, CUDA16).nodes if n.op != "Reshape"]) == 1


def test_softmax_output_cast():
    nodes = [helper.make_node("Softmax", ["x"], ["y"], axis=-1)]
    m = _model(nodes, [("x", F, [6, 33])], [("y", F, [6, 33])])
    g0, g1 = _check_exact(m)
    assert [n.attrs.anchor_op for n in _fused_with_cast(g1)] == ["Softmax"]


def test_no_fold_where_the_value_is_read_twice_after_a_conv():
    # y = conv(x, w) is an output (fp32) and read by a Relu: the conv's fp16 result has two readers
    # and the conv templates store one output, so the Cast of y stays a kernel.
    w = RNG.standard_normal((4, 3, 3, 3)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["y"], ["z"])]
    m = _model(nodes, [("x", F, [1, 3, 8, 8])], [("y", F, [1, 4, 8, 8]), ("z", F, [1, 4, 8, 8])], [("w", w)])
    g0, g1 = _check_exact(m)
    conv = next(n for n in g1.nodes if n.op == "Conv" or (n.op == "Fused" and n.attrs.anchor_op == "Conv"))
    assert [v.ttype.dtype for v in conv.outputs] == [DType.float16]
    assert any(n.op == "Cast" and n.inputs[0].name == conv.outputs[0].name for n in g1.nodes)


def test_no_fold_into_a_gemm_operand_or_a_data_kernel():
    # The input Cast feeds a MatMul's A operand (the GEMM loads its operands in the anchor's
    # dtype) and a Transpose (a data kernel, no epilogue): it stays.
    w = RNG.standard_normal((64, 32)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("Transpose", ["x"], ["t"], perm=[1, 0])]
    m = _model(nodes, [("x", F, [4, 64])], [("y", F, [4, 32]), ("t", F, [64, 4])], [("w", w)])
    g0, g1 = _check_exact(m)
    cast_in = [n for n in g1.nodes if n.op == "Cast" and n.inputs[0].name == "x"]
    assert len(cast_in) == 1


def test_exact_cast_rounds_16_bit_values():
    args, expr = exact_cast(["acc"], [DType.float16], DType.float32, _cast_attrs(DType.float32))
    assert args == ["gc_h2f(gc_f2h(acc))"] and "gc_f2h" in expr
    args, expr = exact_cast(["x"], [DType.float32], DType.float16, _cast_attrs(DType.float16))
    assert args == ["x"] and expr.startswith("gc_h2f(gc_f2h(")
    args, expr = exact_cast(["x"], [DType.int64], DType.float32, _cast_attrs(DType.float32))
    assert "gc_" not in expr


def _cast_attrs(to: DType):
    from graphc.ops.registry import get_op

    return get_op("Cast").attrs(to=to.value)


@needs_nvrtc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_cuda_kernels_with_cast_epilogues_compile(arch):
    # The GEMM (fp32 store from an fp16 GEMM), the row-wise and the elementwise templates with a
    # different output dtype, through NVRTC.
    w = RNG.standard_normal((64, 48)).astype(np.float32)
    sc, bi = np.ones(48, np.float32), np.zeros(48, np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["m"]),
        helper.make_node("Relu", ["m"], ["y"]),
        helper.make_node("LayerNormalization", ["m", "s", "b"], ["z"], axis=-1),
        helper.make_node("Mul", ["x", "x"], ["q"]),
        # u is an output and read by the LayerNorm: the GEMM stores fp16 and fp32, the LayerNorm
        # (whose result is also an output) fp16 and fp32 too
        helper.make_node("MatMul", ["x", "w"], ["u"]),
        helper.make_node("LayerNormalization", ["u", "s", "b"], ["v"], axis=-1),
        helper.make_node("Relu", ["v"], ["r"]),
    ]
    outs = [("y", F, [32, 48]), ("z", F, [32, 48]), ("q", F, [32, 64]), ("u", F, [32, 48]), ("v", F, [32, 48])]
    m = _model(nodes, [("x", F, [32, 64])], [*outs, ("r", F, [32, 48])],
               [("w", w), ("s", sc), ("b", bi)])  # fmt: skip
    engine = graphc.compile(m, target="cuda", precision="fp16", arch=[arch])
    kinds = [s.kind for s in engine.plan.steps]
    assert kinds.count("Cast") == 1, kinds  # the input's: it feeds the GEMM's A operand
    two = [s for s in engine.plan.steps if len({engine.plan.tensors[o].dtype for o in s.outputs}) == 2]
    assert sorted(s.kind for s in two) == ["Fused[LayerNormalization]", "Fused[MatMul]"], kinds
    assert engine.kernels.digests_for(arch)


@needs_nvrtc
@pytest.mark.parametrize("path", ["mma", "wgmma", "tma", "split"])
def test_every_gemm_path_stores_the_cast_dtype(path):
    # fp16 GEMM, epilogue Add(bias) then Cast to fp32 (the LM head's logits): the mma.sync, sm_90a
    # wgmma and Hopper TMA kernels (and a two-launch split-K's reduce kernel) store fp32 through
    # the epilogue hook, with the rounding of exact_cast.
    from graphc.codegen.families import gemm, gemm_sm90
    from graphc.codegen.nvrtc import compile_cubin
    from graphc.ops.fused import ACC, IN, OP, EpilogueOp
    from graphc.ops.registry import get_op

    m = 4096 if path == "tma" else 256
    epi = (
        EpilogueOp("Add", get_op("Add").attrs(), (ACC, IN(2))),
        EpilogueOp("Cast", _cast_attrs(DType.float32), (OP(0),)),
    )
    params = {"wgmma": {"path": "wgmma"}, "split": {"SPLITS": 2, "SERIAL": 0}}.get(path)
    ctx = gemm.standalone_context("MatMul", [(m, 512), (512, 256), (256,)], DType.float16, n_anchor=2, epilogue=epi,
                                  outputs=(OP(1),), params=params)  # fmt: skip
    assert ctx.output_type().dtype is DType.float32
    ctx = ctx.__class__(**{**ctx.__dict__, "precision": "fp16"})
    kernels = gemm_sm90.select(ctx) if path == "tma" else gemm._generate(ctx)
    assert kernels, path
    if path == "split":
        assert len(kernels) == 2
    for k in kernels:
        assert "gc_h2f(gc_f2h(" in k.source and "float* __restrict__ out0" in k.source
        arch = "sm_90a" if path in ("wgmma", "tma") or k.params.get("requires_arch") else "sm_80"
        assert compile_cubin(k.source, k.name, arch)
