"""Row-norm epilogues (passes/fuse_residual_norm.py): a GEMM with bias + residual and the
LayerNorm/RMSNorm of its rows as one fused node and one CUDA launch. Structure, exact launch
counts, the CPU executor's numbers against ONNX Runtime / numpy, and NVRTC compiles of the kernel
(the row-band normalization, with and without split-K in one launch)."""

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
from graphc.passes.manager import OptimizeOptions, optimize
from graphc.passes.target import Target
from graphc.runtime.cpu import CPUExecutor
from tests.helpers import assert_close, rand, run_ort


def _nvrtc_ok() -> bool:
    try:
        from graphc.codegen.nvrtc import nvrtc_version

        nvrtc_version()
        return True
    except Exception:
        return False


needs_nvrtc = pytest.mark.skipif(not _nvrtc_ok(), reason="NVRTC (cuda-bindings) is not installed")


def _model(
    batch: int = 2, seq: int = 16, k: int = 64, n: int = 64, *, norm: str = "LayerNormalization", pre_ln: bool = False
) -> onnx.ModelProto:
    """y = norm(x @ W + b + r) (post-LN); with pre_ln also z = (x @ W + b + r) * 2, which reads h."""
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array((rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32), "W"),
        numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), "b"),
        numpy_helper.from_array((1 + 0.1 * rng.standard_normal(n)).astype(np.float32), "g"),
        numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), "beta"),
        numpy_helper.from_array(np.float32(2.0), "two"),
    ]
    norm_in = ["h", "g", "beta"] if norm == "LayerNormalization" else ["h", "g"]
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["m"]),
        helper.make_node("Add", ["m", "b"], ["mb"]),
        helper.make_node("Add", ["mb", "r"], ["h"]),
        helper.make_node(norm, norm_in, ["y"], axis=-1, epsilon=1e-5),
    ]
    outs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, seq, n])]
    if pre_ln:
        nodes.append(helper.make_node("Mul", ["h", "two"], ["z"]))
        outs.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, [batch, seq, n]))
    g = helper.make_graph(
        nodes,
        "resnorm",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, seq, k]),
            helper.make_tensor_value_info("r", TensorProto.FLOAT, [batch, seq, n]),
        ],
        outs,
        inits,
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 23 if norm == "RMSNormalization" else 17)])
    m.ir_version = 10 if norm == "RMSNormalization" else 8
    return m


def _cuda_graph(model, precision: str = "fp32"):
    target = Target("cuda", precision, False, capabilities=CUDA, row_norm_epilogues=True)
    return optimize(bind_shapes(load_onnx(model), None), OptimizeOptions(opt_level=2, verify=True, target=target))


def _run_cpu(graph, feeds):
    plan = lower_to_plan(graph)
    weights = {name: c.data for name, c in graph.constants.items()}
    return CPUExecutor(plan, plan_memory(plan), weights, cpu_kernel).run(feeds)


def _kernels(graph, precision="fp32", arch="sm_90", choices=None):
    plan = lower_to_plan(graph)
    weights = {name: c.data for name, c in graph.constants.items()}
    ks = generate_for_archs(plan, weights, [arch], precision=precision, choices=choices)
    return complete_plan(plan, ks), ks


def _feeds(batch=2, seq=16, k=64, n=64):
    return {"x": rand((batch, seq, k), seed=1), "r": rand((batch, seq, n), seed=2)}


@pytest.mark.parametrize("pre_ln", [False, True])
def test_gemm_residual_layernorm_is_one_node_and_one_launch(pre_ln):
    model = _model(pre_ln=pre_ln)
    res = _cuda_graph(model)
    assert "fuse_residual_norm" in [r.name for r in res.records]
    g = res.graph
    (fused,) = [n for n in g.nodes if n.op == "Fused" and n.attrs.anchor_op == "MatMul"]
    assert fused.attrs.epilogue[-1].op == "LayerNormalization" and len(fused.outputs) == 2
    assert not any(n.op == "LayerNormalization" for n in g.nodes)
    feeds = _feeds()
    expected = run_ort(model, feeds)
    got = _run_cpu(g, feeds)
    for name in expected:
        assert_close(got[name], expected[name], rtol=1e-5, atol=1e-5, what=name)
    final, _ = _kernels(g)
    launches = [ln for s in final.steps for ln in s.launches_for("sm_90")]
    # one GEMM kernel stores h and normalizes it (pre-LN: z = h * 2 is one more kernel)
    assert len(launches) == (2 if pre_ln else 1), [ln.kernel for ln in launches]


def test_rmsnorm_joins_too():
    model = _model(norm="RMSNormalization")
    g = _cuda_graph(model).graph
    assert [n.attrs.epilogue[-1].op for n in g.nodes if n.op == "Fused"] == ["RMSNormalization"]
    feeds = _feeds()
    h = feeds["x"].astype(np.float64) @ numpy_helper.to_array(model.graph.initializer[0]).astype(np.float64)
    h += numpy_helper.to_array(model.graph.initializer[1]) + feeds["r"]
    ref = h / np.sqrt((h * h).mean(-1, keepdims=True) + 1e-5) * numpy_helper.to_array(model.graph.initializer[2])
    assert_close(_run_cpu(g, feeds)["y"].astype(np.float64), ref, rtol=1e-5, atol=1e-5)


def test_large_gemms_and_wide_rows_keep_their_norm_apart():
    # 4096 rows: the Hopper GEMMs stay (no row-norm epilogue there); 2048 columns: not in registers
    for kw in ({"batch": 32, "seq": 128}, {"n": 2048}):
        g = _cuda_graph(_model(**kw)).graph
        assert any(n.op == "LayerNormalization" for n in g.nodes), kw


def test_the_cpu_target_keeps_the_norm():
    import graphc

    eng = graphc.compile(_model(), target="cpu", row_norm_epilogues=True)
    assert "LayerNormalization" in {s.op for s in eng.plan.steps}


@needs_nvrtc
@pytest.mark.parametrize("precision", ["fp16", "fp32"])
@pytest.mark.parametrize("k,splits", [(64, 1), (2048, 4)])
def test_rownorm_kernel_compiles(precision, k, splits):
    from graphc.codegen.nvrtc import compile_cubin

    g = _cuda_graph(_model(batch=1, seq=128, k=k, n=768), precision).graph
    step_name = next(n.name for n in g.nodes if n.op == "Fused")
    choices = None
    if splits > 1:
        tile = (
            {"path": "mma", "BM": 64, "BN": 64, "BK": 32, "WM": 2, "WN": 2, "STAGES": 3}
            if precision == "fp16"
            else {"path": "simt", "BM": 64, "BN": 64, "BK": 8, "TM": 4, "TN": 4}
        )
        choices = {step_name: {**tile, "SPLITS": splits}}
    for arch in ("sm_80", "sm_90"):
        final, ks = _kernels(g, precision, arch=arch, choices=choices)
        (step,) = [s for s in final.steps if s.name == step_name]
        (ln,) = step.launches
        src = ks.sources[ln.digest]
        assert ln.params.get("SPLITS", 1) == splits and "_band[" in src
        assert "rsqrtf(q / N + 9.999999747378752e-06f)" in src
        # the kernel writes h and the norm: both outputs, the norm's scale and bias are its arguments
        assert set(step.outputs) <= set(ln.args) and len(ln.args) == len(set(ln.args))
        assert len(compile_cubin(src, ln.kernel, ln.params.get("requires_arch", arch))) > 1000


@needs_nvrtc
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize("rows,k,splits", [(128, 768, 4), (128, 3072, 8), (197, 3072, 4), (197, 768, 4)])
def test_sm90_rownorm_is_the_wgmma_cluster_kernel(precision, rows, k, splits):
    # batch-1 shapes of BERT/GPT-2 (128 rows) and ViT-B/16 (197): on sm_90 the row-norm GEMM is the
    # cp.async wgmma kernel with cluster split-K (gemm_sm90.rownorm_params), whose last cluster of a
    # band normalizes it; on sm_80 mma.sync. One launch on both.
    from graphc.codegen.nvrtc import compile_cubin

    g = _cuda_graph(_model(batch=1, seq=rows, k=k, n=768, pre_ln=True), precision).graph
    step_name = next(n.name for n in g.nodes if n.op == "Fused" and n.attrs.epilogue[-1].op == "LayerNormalization")
    final, ks = _kernels(g, precision, arch="sm_90")
    (step,) = [s for s in final.steps if s.name == step_name]
    (ln,) = step.launches
    assert ln.params["path"] == "wgmma" and ln.params["CLUSTER"] == 1 and ln.params["SPLITS"] == splits, ln.params
    assert ln.grid == [((rows + 63) // 64) * 12, 1, splits]
    src = ks.sources[ln.digest]
    # the cluster's verdict through rank 0's shared memory, its warps sharing the band's rows
    assert "gc_ld_dsmem_u32" in src and f"NORM_WARPS = {splits} * (THREADS / 32)" in src
    assert set(step.outputs) <= set(ln.args) and len(ln.args) == len(set(ln.args))
    assert len(compile_cubin(src, ln.kernel, "sm_90a")) > 1000
    old, _ = _kernels(g, precision, arch="sm_80")
    (step80,) = [s for s in old.steps if s.name == step_name]
    assert [ln.params["path"] for ln in step80.launches] == ["mma"]


def _conv1d_model(batch: int = 2, seq: int = 16, k: int = 64, n: int = 64) -> onnx.ModelProto:
    """GPT-2's form: Gemm on [B*S, K], Reshape to [B, S, N], + residual, LayerNorm; h read again."""
    rng = np.random.default_rng(3)
    inits = [
        numpy_helper.from_array((rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32), "W"),
        numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), "b"),
        numpy_helper.from_array((1 + 0.1 * rng.standard_normal(n)).astype(np.float32), "g"),
        numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), "beta"),
        numpy_helper.from_array(np.array([batch * seq, k], dtype=np.int64), "s2"),
        numpy_helper.from_array(np.array([batch, seq, n], dtype=np.int64), "s3"),
        numpy_helper.from_array(np.float32(2.0), "two"),
    ]
    nodes = [
        helper.make_node("Reshape", ["x", "s2"], ["x2"]),
        helper.make_node("Gemm", ["x2", "W", "b"], ["m"]),
        helper.make_node("Reshape", ["m", "s3"], ["m3"]),
        helper.make_node("Add", ["r", "m3"], ["h"]),
        helper.make_node("LayerNormalization", ["h", "g", "beta"], ["y"], axis=-1, epsilon=1e-5),
        helper.make_node("Mul", ["h", "two"], ["z"]),
    ]
    g = helper.make_graph(
        nodes,
        "conv1d",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, seq, k]),
            helper.make_tensor_value_info("r", TensorProto.FLOAT, [batch, seq, n]),
        ],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, seq, n]),
            helper.make_tensor_value_info("z", TensorProto.FLOAT, [batch, seq, n]),
        ],
        inits,
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def test_norm_of_a_view_of_the_gemm_output_joins():
    model = _conv1d_model()
    g = _cuda_graph(model).graph
    assert not any(n.op == "LayerNormalization" for n in g.nodes)
    (fused,) = [n for n in g.nodes if n.op == "Fused" and n.attrs.anchor_op == "Gemm"]
    assert fused.attrs.epilogue[-1].op == "LayerNormalization" and len(fused.outputs) == 2
    feeds = _feeds()
    expected = run_ort(model, feeds)
    got = _run_cpu(g, feeds)
    for name in expected:
        assert_close(got[name], expected[name], rtol=1e-5, atol=1e-5, what=name)
    final, _ = _kernels(g)
    assert sum(len(s.launches_for("sm_90")) for s in final.steps) == 2  # the GEMM kernel and z = h * 2
