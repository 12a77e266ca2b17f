"""The tvm family (graphc[tvm]): every op on its list compiles for CUDA here (NVRTC cubin for sm_80
and sm_90), the engine records TVM's source and launch geometry as TVM lowered them, the te compute
matches graphc's numpy reference on TVM's CPU build, and without TVM (or with tvm=False) the op is
refused with one line naming the node. GPU numerics: test_tvm_kernels_gpu.py and
tools/tvm_gpu_check.py."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pytest

import graphc
from graphc.errors import CompileError

sys.path.insert(0, str(Path(__file__).parent))
from rd_helpers import plan_of  # noqa: E402
from tvm_cases import CASES  # noqa: E402

tvm = pytest.importorskip("tvm", reason="graphc[tvm] (apache-tvm) is not installed")

from graphc import tvm_source  # noqa: E402
from graphc.codegen.capabilities import CUDA, CudaCapabilities  # noqa: E402
from graphc.codegen.families import tvm_kernels  # noqa: E402
from graphc.codegen.kernel import family_for  # noqa: E402

ARCHS = ["sm_80", "sm_90"]
# computes with thread bindings of their own (topi.gpu / ir_builder) have no CPU build
GPU_ONLY = ("scatter", "max_unpool", "nll", "sce", "det")
# the slowest forms (TVM simplifies big index expressions for a minute): compiled once, in CI too
SLOW: set[str] = set()


def _tvm_steps(engine) -> list:
    return [s for s in engine.plan.steps if s.launches and all(ln.family == "tvm" for ln in s.launches)]


@pytest.mark.parametrize("case", [c for c in CASES if c not in SLOW])
def test_compiles_for_cuda_with_tvm_kernels(case, tmp_path):
    model, _ = CASES[case]()
    engine = graphc.compile(model, target="cuda", arch=ARCHS, opt_level=0, cache_dir=str(tmp_path))
    steps = _tvm_steps(engine)
    assert len(steps) == 1, f"{case}: no step took TVM's kernels ({engine.report['cuda']['families']})"
    kernels = engine.kernels
    for ln in steps[0].launches:
        # what the engine records is TVM's kernel: its name, source, and a cubin for each arch
        src = kernels.sources[ln.digest]
        assert src.startswith("// CUDA source written by apache-tvm")
        assert f" {ln.kernel}(" in src and "cuda/std" not in src
        assert ln.params["source"] == "apache-tvm" and ln.params["op"] == steps[0].op
        for arch in ARCHS:
            assert kernels.cubins[arch][ln.digest][:4] == b"\x7fELF"
        block = ln.block[0] * ln.block[1] * ln.block[2]
        assert 1 <= block <= 1024 and min(ln.grid) >= 1
        bounds = re.search(rf"__launch_bounds__\((\d+)\) {ln.kernel}\(", src)
        assert bounds is None or block <= int(bounds.group(1))
    assert engine.report["tvm"]["steps"] == [steps[0].name]
    # and the engine file passes the loader's checks (argument constness and types among them)
    from graphc.runtime.format import read_engine

    engine.save(tmp_path / "e.engine")
    read_engine(tmp_path / "e.engine")


def test_launch_geometry_is_tvms():
    """The grid and block of each launch are those of TVM's lowered host call, and the arguments
    are the step's tensors in the kernel's parameter order (ScatterND: copy, then scatter)."""
    model, _ = CASES["scatter_nd_max_k2"]()
    plan, weights = plan_of(model)
    (step,) = [s for s in plan.steps if s.op == "ScatterND"]
    ctx = plan.context(step, weights)
    srcs = family_for(ctx).generate(ctx)
    assert [s.family for s in srcs] == ["tvm", "tvm"]
    copy, scatter = srcs
    total, inner = 4 * 3 * 5, 5  # data [4, 3, 5], k = 2: slices of 5
    assert copy.block == (256, 1, 1) and copy.grid == (-(-total // 256), 1, 1)
    assert scatter.block == (256, 1, 1) and scatter.grid == (-(-inner // 256), 1, 1)
    data, idx, upd = step.inputs
    assert copy.args == [data, step.outputs[0]]
    assert scatter.args == [idx, upd, step.outputs[0]]
    # the kernel's parameters, in order, take those tensors' element types, the inputs const
    params = re.search(rf"{scatter.name}\(([^)]*)\)", scatter.source).group(1)
    assert [p.split("*")[0].strip() for p in params.split(",")] == ["const int64_t", "const float", "float"]


def _tvm_step(case: str):
    """A case's graph, feeds, reference outputs, lowered plan and weights, its one TVM step and that step's context."""
    model, feeds = CASES[case]()
    graph = graphc.load_onnx(model)
    ref = graphc.interpret(graph, feeds)
    plan, weights = plan_of(model)
    (step,) = [s for s in plan.steps if s.op in tvm_kernels.TVM_OPS]
    return graph, feeds, ref, plan, weights, step, plan.context(step, weights)


@pytest.mark.parametrize("case", [c for c in CASES if not c.startswith(GPU_ONLY) and c not in SLOW])
def test_compute_matches_reference_on_tvm_cpu(case):
    """TVM's CPU build of the very te compute the CUDA kernel comes from, against the reference."""
    graph, feeds, ref, plan, weights, step, ctx = _tvm_step(case)
    ins, outs, compute = tvm_kernels.compute_of(ctx)
    arrays = [feeds[t.name] if t.name in feeds else weights[t.name] for t in ins]
    (got,) = tvm_source.run_on_cpu(arrays, compute)
    want = ref[graph.outputs[0].name]
    scale = max(1.0, float(np.abs(want).max()))
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5 * scale, err_msg=case)


def test_no_tvm_refuses_with_one_line(tmp_path):
    model, _ = CASES["dft_real"]()
    with pytest.raises(CompileError) as e:
        graphc.compile(model, target="cuda", arch=ARCHS, opt_level=0, tvm=False, cache_dir=str(tmp_path))
    line = [ln for ln in str(e.value).splitlines() if "DFT" in ln]
    assert line and "node 'DFT_0'" in line[0] and "--no-tvm" in line[0]


def test_without_tvm_installed_the_op_is_unsupported_with_a_hint(monkeypatch, tmp_path):
    monkeypatch.setattr(tvm_source, "available", lambda: False)
    model, _ = CASES["scatter_elements_max_axis1"]()
    with pytest.raises(CompileError) as e:
        graphc.compile(model, target="cuda", arch=ARCHS, opt_level=0, cache_dir=str(tmp_path))
    msg = str(e.value)
    # the template's own reason, then the way to get the kernel
    assert "reduction 'max'" in msg and "pip install apache-tvm==0.27.0.post1" in msg and "ScatterElements" in msg


def test_check_names_the_ops_tvm_writes(tmp_path):
    from graphc.support import check_model

    model, _ = CASES["dft_real"]()
    path = tmp_path / "dft.onnx"
    path.write_bytes(model.SerializeToString())
    r = check_model(str(path), target="cuda")
    assert r.supported
    assert any(f.op == "DFT" and "apache-tvm" in f.reason for f in r.notes), r.lines()
    r = check_model(str(path), target="cuda", tvm=False)
    assert not r.supported and any(f.op == "DFT" and "--no-tvm" in f.reason for f in r.findings), r.lines()


@pytest.mark.parametrize("case", [c for c in CASES if c not in SLOW])
def test_cuda_source_matches_reference_one_thread_at_a_time(case):
    """The exact CUDA text the engine ships, compiled for the host (cuda_emulator.py) and run one
    thread at a time, against the reference: for every kernel whose threads do not cooperate (the
    scatters, MaxUnpool and the losses among them, which have no TVM CPU build). Outputs start with
    every bit set (NaN for floats), so a kernel that writes too little fails."""
    from cuda_emulator import emulable, run_launches

    graph, feeds, ref, plan, weights, step, ctx = _tvm_step(case)
    srcs = family_for(ctx).generate(ctx)
    if not all(emulable(s.source) for s in srcs):
        pytest.skip("threads cooperate (shared memory / shuffles): checked by the TVM CPU build instead")
    tensors = {}
    for name, spec in plan.tensors.items():
        if name in feeds:
            tensors[name] = np.ascontiguousarray(feeds[name])
        elif name in weights:
            tensors[name] = np.ascontiguousarray(weights[name])
        else:
            arr = np.empty(spec.shape, np.dtype(spec.dtype))
            arr.reshape(-1).view(np.uint8)[...] = 0xFF  # NaN for floats, all bits set for integers
            tensors[name] = arr
    run_launches([(s.source, s.name, s.grid, s.block, s.args) for s in srcs], tensors)
    for v, out in zip(graph.outputs, step.outputs, strict=False):
        want = np.asarray(ref[v.name])
        got = tensors[out]
        scale = max(1.0, float(np.abs(want).max())) if want.size else 1.0
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5 * scale, err_msg=f"{case}: {v.name}")


def _model_of(op: str):
    """The model of the first case of `op` (the cases are built with onnx.helper)."""
    for case in CASES:
        model, _ = CASES[case]()
        if case not in SLOW and any(n.op_type == op for n in model.graph.node):
            return model
    raise AssertionError(f"no case computes {op}")


def _only_tvm_step(engine):
    (step,) = _tvm_steps(engine)
    return step, [engine.plan.tensors[n].dtype for n in [*step.inputs, *step.outputs] if n is not None]


@pytest.mark.parametrize("op", sorted(CUDA.fp32_ops))
def test_each_fp32_op_needs_its_float32_boundary(op, monkeypatch, tmp_path):
    """The list (tvm_kernels.FP32_OPS, which the CUDA capabilities hand the precision pass) holds
    what TVM cannot compute in float16: with it an fp16 compile gives the op's step float32
    tensors; without it the same compile is refused. An op TVM learns to compute in float16
    fails here as a stale entry."""
    model = _model_of(op)
    step, dtypes = _only_tvm_step(
        graphc.compile(model, target="cuda", arch=ARCHS, precision="fp16", cache_dir=str(tmp_path))
    )
    assert step.op == op and "float16" not in dtypes, dtypes
    monkeypatch.setattr(CudaCapabilities, "fp32_ops", property(lambda self: frozenset()))
    with pytest.raises(CompileError, match="float16"):
        graphc.compile(model, target="cuda", arch=ARCHS, precision="fp16", cache_dir=str(tmp_path))


@pytest.mark.parametrize("op", sorted(tvm_kernels.BIT_COPY_OPS))
def test_tvm_ops_left_off_the_list_compile_in_float16(op, tmp_path):
    """The TVM ops not on the list need no float32 boundary: bit copies move 16-bit floats as
    uint16, so their fp16 steps keep float16 tensors (an op wrongly left off would be refused)."""
    assert op not in CUDA.fp32_ops
    engine = graphc.compile(_model_of(op), target="cuda", arch=ARCHS, precision="fp16", cache_dir=str(tmp_path))
    step, dtypes = _only_tvm_step(engine)
    assert step.op == op and "float16" in dtypes, dtypes


@pytest.mark.parametrize("case", ["dft_onesided", "mvn_default_axes", "sce_mean"])
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_reduced_precision_keeps_tvm_ops_in_fp32(case, precision, tmp_path):
    """Under fp16/bf16 the op keeps float32 tensors (Casts around it), so TVM's float32 kernel serves it."""
    model, _ = CASES[case]()
    engine = graphc.compile(model, target="cuda", arch=ARCHS, precision=precision, cache_dir=str(tmp_path))
    (step,) = _tvm_steps(engine)
    specs = engine.plan.tensors
    assert all(specs[n].dtype in ("float32", "int64") for n in [*step.inputs, *step.outputs] if n is not None)
