"""Horizontal GEMM fusion (passes/fuse_horizontal.py) and the slab views it relies on
(codegen/views.py): structure, exact launch counts of the CUDA plan, and the numbers of the
fused graph run by the CPU executor (the plan with its offset views) against ONNX Runtime."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from graphc.codegen.build import complete_plan, generate_for_archs
from graphc.codegen.capabilities import CUDA
from graphc.codegen.lower import lower_to_plan
from graphc.codegen.memory import plan_memory
from graphc.cpu_kernels import cpu_kernel
from graphc.frontend import load_onnx
from graphc.ir.shapes import bind_shapes
from graphc.passes.fuse_horizontal import fuse_horizontal
from graphc.passes.manager import OptimizeOptions, optimize
from graphc.passes.target import Target
from graphc.runtime.cpu import CPUExecutor
from graphc.runtime.plan import ALIAS
from tests.helpers import assert_close, rand, run_ort


def _qkv_model(
    batch: int = 2, seq: int = 16, k: int = 64, n: int = 64, *, bias=(True, True, True), out_q: bool = False
) -> onnx.ModelProto:
    """x -> three projections (MatMul, optional bias Add) -> y = q * k + v (and q as an output)."""
    rng = np.random.default_rng(0)
    inits, nodes = [], []
    for i, tag in enumerate("qkv"):
        w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
        inits.append(numpy_helper.from_array(w, f"W{tag}"))
        nodes.append(helper.make_node("MatMul", ["x", f"W{tag}"], [f"{tag}0"]))
        if bias[i]:
            inits.append(numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), f"b{tag}"))
            nodes.append(helper.make_node("Add", [f"{tag}0", f"b{tag}"] if i % 2 else [f"b{tag}", f"{tag}0"], [tag]))
        else:
            nodes.append(helper.make_node("Identity", [f"{tag}0"], [tag]))
    nodes += [helper.make_node("Mul", ["q", "k"], ["qk"]), helper.make_node("Add", ["qk", "v"], ["y"])]
    outs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, seq, n])]
    if out_q:
        outs.append(helper.make_tensor_value_info("q", TensorProto.FLOAT, [batch, seq, n]))
    g = helper.make_graph(
        nodes, "qkv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, seq, k])], outs, inits
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def _gemms(graph) -> int:
    from graphc.ir.kinds import node_kind

    return sum("MatMul" in node_kind(n) for n in graph.nodes)


def _cuda_graph(model: onnx.ModelProto):
    target = Target("cuda", "fp32", False, capabilities=CUDA)
    return optimize(bind_shapes(load_onnx(model), None), OptimizeOptions(opt_level=2, verify=True, target=target))


def _run_cpu(graph, feeds):
    """The CUDA-optimized graph's plan (slab views included) run by the CPU executor."""
    plan = lower_to_plan(graph)
    weights = {name: c.data for name, c in graph.constants.items()}
    return CPUExecutor(plan, plan_memory(plan), weights, cpu_kernel).run(feeds), plan


def _launches(graph, arch: str = "sm_90") -> int:
    plan = lower_to_plan(graph)
    weights = {name: c.data for name, c in graph.constants.items()}
    final = complete_plan(plan, generate_for_archs(plan, weights, [arch], precision="fp32"))
    return sum(len(s.launches_for(arch)) for s in final.steps)


@pytest.mark.parametrize("out_q", [False, True])
def test_qkv_becomes_one_gemm_with_views(out_q):
    model = _qkv_model(out_q=out_q)
    res = _cuda_graph(model)
    assert "fuse_horizontal" in [r.name for r in res.records]
    g = res.graph
    gemms = [n for n in g.nodes if n.op == "Fused" and "MatMul" in n.attrs.kind_name()]
    assert len(gemms) == 1, [n.op for n in g.nodes]
    # the stacked weights [3, K, N] (the K-major pass may store them transposed)
    w = g.constants[gemms[0].inputs[1].name].data
    assert w.shape in ((3, 64, 64),) and gemms[0].outputs[0].type.static_shape == (3, 32, 64)
    feeds = {"x": rand((2, 16, 64), seed=1)}
    expected = run_ort(model, feeds)
    got, plan = _run_cpu(g, feeds)
    views = [t for t in plan.tensors.values() if t.kind == ALIAS and t.alias_offset]
    assert sorted(t.alias_offset for t in views) == [32 * 64 * 4, 2 * 32 * 64 * 4]  # Q at 0 is a plain view
    for name in expected:
        assert_close(got[name], expected[name], rtol=1e-5, atol=1e-5, what=name)
    # one GEMM (with the stacked bias in its epilogue) + one elementwise kernel for q * k + v
    assert _launches(g) == 2


def test_launches_before_and_after():
    model = _qkv_model()
    stages_off = Target("cuda", "fp32", False, capabilities=CUDA)
    g = optimize(bind_shapes(load_onnx(model), None), OptimizeOptions(opt_level=2, target=stages_off)).graph
    assert _launches(g) == 2
    # without the pass: three GEMMs, the last with bias, q * k and + v in its epilogue
    from graphc.passes import pipeline

    stages = [
        p
        for p in pipeline.stages()
        if getattr(p, "name", "") != "fuse_horizontal"  # FixedPoint stages carry their own names
    ]
    g3 = optimize(bind_shapes(load_onnx(model), None), OptimizeOptions(opt_level=2, target=stages_off), stages).graph
    assert _launches(g3) == 3


def test_unbiased_projections_fuse_too():
    model = _qkv_model(bias=(False, False, False))
    g = _cuda_graph(model).graph
    assert _gemms(g) == 1
    feeds = {"x": rand((2, 16, 64), seed=2)}
    got, _ = _run_cpu(g, feeds)
    assert_close(got["y"], run_ort(model, feeds)["y"], rtol=1e-5, atol=1e-5)


def test_mixed_biases_keep_the_biased_projections_apart():
    # k and v are biased, q is not: only one unbiased member, so nothing fuses
    g = _cuda_graph(_qkv_model(bias=(False, True, True))).graph
    assert _gemms(g) == 3


def test_unaligned_slabs_are_not_fused():
    # M * N * 4 = 3 * 5 * 4 bytes: the slabs would not start at 256-byte boundaries (copies)
    model = _qkv_model(batch=1, seq=3, k=8, n=5)
    graph = bind_shapes(load_onnx(model), None)
    assert fuse_horizontal(graph) is graph


def test_gather_of_a_leading_slab_is_a_view():
    # Gather(x, 1, axis=1) of x [1, 4, 64]: the second row, a view at 64 * 4 bytes
    g = helper.make_graph(
        [
            helper.make_node("Relu", ["x"], ["r"]),
            helper.make_node("Gather", ["r", "i"], ["row"], axis=1),
            helper.make_node("Sigmoid", ["row"], ["y"]),
        ],
        "slab",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])],
        [numpy_helper.from_array(np.array(1, dtype=np.int64), "i")],
    )
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    graph = bind_shapes(load_onnx(model), None)
    feeds = {"x": rand((1, 4, 64), seed=3)}
    got, plan = _run_cpu(graph, feeds)
    (view,) = [t for t in plan.tensors.values() if t.kind == ALIAS]
    assert view.alias_offset == 256 and view.shape == [1, 64]
    assert_close(got["y"], run_ort(model, feeds)["y"], rtol=1e-6, atol=1e-6)


def test_engine_with_slab_views_saves_and_reads_back(tmp_path):
    import graphc
    from graphc.runtime.format import read_engine

    model = _qkv_model(out_q=True)
    eng = graphc.compile(model, target="cuda", precision="fp16", arch=["sm_90"])
    offsets = {n: t.alias_offset for n, t in eng.plan.tensors.items() if t.kind == ALIAS and t.alias_offset}
    # fp16 inside an fp32 interface: the input's cast, the GEMM, q's cast (q is a slab of the GEMM's
    # output, which also feeds q * k + v), q * k + v storing fp32 itself (passes/fuse_casts.py)
    assert len(offsets) == 2 and eng.report["cuda"]["launches"] == 4
    path = tmp_path / "qkv.engine"
    eng.save(path)
    # the typed schema and the plan validator accept the views and keep their offsets
    back = read_engine(path)
    assert {n: back.plan.tensors[n].alias_offset for n in offsets} == offsets


def test_validator_rejects_a_view_past_its_root(tmp_path):
    import dataclasses

    import graphc
    from graphc.runtime.errors import EngineError
    from graphc.runtime.format import read_engine

    eng = graphc.compile(_qkv_model(), target="cuda", precision="fp16", arch=["sm_90"])
    name = max(
        (n for n, t in eng.plan.tensors.items() if t.alias_offset), key=lambda n: eng.plan.tensors[n].alias_offset
    )
    t = eng.plan.tensors[name]
    eng.plan.tensors[name] = dataclasses.replace(t, alias_offset=t.alias_offset + 256)  # one slab too far
    path = tmp_path / "bad.engine"
    eng.save(path)
    with pytest.raises(EngineError, match="is not a view inside"):
        read_engine(path)


def _c_attn_model(batch: int = 2, seq: int = 16, k: int = 64, n: int = 64, *, trans_b: int = 0) -> onnx.ModelProto:
    """GPT-2's form: Gemm(x2d, W [K, 3N], b [3N]) -> Reshape [B, S, 3N] -> Split(axis=2) -> q * k + v."""
    rng = np.random.default_rng(5)
    w = (rng.standard_normal((k, 3 * n)) / np.sqrt(k)).astype(np.float32)
    inits = [
        numpy_helper.from_array(w.T.copy() if trans_b else w, "W"),
        numpy_helper.from_array(rng.standard_normal(3 * n).astype(np.float32), "b"),
        numpy_helper.from_array(np.array([batch * seq, k], dtype=np.int64), "s2"),
        numpy_helper.from_array(np.array([batch, seq, 3 * n], dtype=np.int64), "s3"),
        numpy_helper.from_array(np.array([n, n, n], dtype=np.int64), "parts"),
    ]
    nodes = [
        helper.make_node("Reshape", ["x", "s2"], ["x2"]),
        helper.make_node("Gemm", ["x2", "W", "b"], ["g"], transB=trans_b),
        helper.make_node("Reshape", ["g", "s3"], ["g3"]),
        helper.make_node("Split", ["g3", "parts"], ["q", "k", "v"], axis=2),
        helper.make_node("Mul", ["q", "k"], ["qk"]),
        helper.make_node("Add", ["qk", "v"], ["y"]),
    ]
    g = helper.make_graph(
        nodes,
        "c_attn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, seq, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, seq, n])],
        inits,
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


@pytest.mark.parametrize("trans_b", [0, 1])
def test_split_gemm_output_becomes_batched_views(trans_b):
    model = _c_attn_model(trans_b=trans_b)
    g = _cuda_graph(model).graph
    assert not any(n.op == "Split" for n in g.nodes) and _gemms(g) == 1
    feeds = {"x": rand((2, 16, 64), seed=6)}
    got, plan = _run_cpu(g, feeds)
    assert sorted(t.alias_offset for t in plan.tensors.values() if t.kind == ALIAS and t.alias_offset) == [
        32 * 64 * 4,
        2 * 32 * 64 * 4,
    ]
    assert_close(got["y"], run_ort(model, feeds)["y"], rtol=1e-5, atol=1e-5)
    # one GEMM (bias in its epilogue) and q * k + v; the Split's three copies are gone
    assert _launches(g) == 2


def test_unequal_split_is_left_alone():
    model = _c_attn_model()
    parts = next(i for i in model.graph.initializer if i.name == "parts")
    parts.CopyFrom(numpy_helper.from_array(np.array([32, 96, 64], dtype=np.int64), "parts"))
    model.graph.output[0].type.tensor_type.shape.dim[2].dim_value = 32
    for node in model.graph.node:
        if node.op_type == "Mul":
            node.input[:] = ["q", "q"]
        if node.op_type == "Add" and node.input[0] == "qk":
            node.input[:] = ["qk", "q"]
    g = _cuda_graph(model).graph
    assert any(n.op == "Split" for n in g.nodes)


def test_biases_found_when_the_add_reads_an_equal_value_object():
    """A node's input Value need not be the object its producer holds (an equal Value of the same
    name and type, as earlier rewrites leave them): the biases are still stacked into the GEMM, not
    left as an Add on each slab (the dynamo exports of Qwen2 lost them so: 4 more kernels)."""
    import dataclasses

    from graphc.ir.graph import Value

    g = bind_shapes(load_onnx(_qkv_model()), None)
    nodes = []
    for n in g.nodes:
        if n.op == "Add":
            n = dataclasses.replace(n, inputs=tuple(None if v is None else Value(v.name, v.type) for v in n.inputs))
        nodes.append(n)
    g = g.with_nodes(nodes)
    h = fuse_horizontal(g)
    mms = [n for n in h.nodes if n.op == "MatMul"]
    adds = [n for n in h.nodes if n.op == "Add"]
    assert len(mms) == 1 and mms[0].name.endswith("_horizontal"), h.op_counts()
    assert len(adds) == 2, h.op_counts()  # the one stacked bias Add, and q * k + v's
