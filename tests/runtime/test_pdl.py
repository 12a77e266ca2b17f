"""Programmatic dependent launch without a GPU: the kernel entries codegen writes, which kernels
are PDL-ready, what the engine records and the loader checks, and the launch path (cupy faked by
tools/fake_cupy.py, cuda.bindings.driver by a recorder): programmatic launches exactly for the
PDL-ready kernels after the first launch, on sm_90+ cubins, unless switched off."""

from __future__ import annotations

import ctypes
import sys
import types
from pathlib import Path

import numpy as np
import pytest

import graphc
import models
from graphc.runtime import EngineError
from graphc.runtime.format import pdl_kernels, read_engine
from graphc.runtime.pdl import (
    ENTRY,
    add_pdl_entries,
    arch_has_pdl,
    has_cluster_shape,
    kernel_entries,
    pdl_ready,
    programmatic_launches,
    waits_first,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import fake_cupy as F  # noqa: E402
from test_engine_checks import refused, rewrite  # noqa: E402

from tests.codegen.test_conv_serial_split_gpu import _model as deep_conv_model  # noqa: E402

# the definition as common.cuh writes it
DEFINE = next(
    line + "\n"
    for line in (Path(__file__).resolve().parents[2] / "codegen/templates/common.cuh").read_text().splitlines()
    if line.startswith("#define GC_PDL_ENTRY() asm")
)

SOURCE = """
__device__ float helper(const float* p) { return p[0]; }
extern "C" __global__ void decl_only(float* y);
extern "C" __global__ void __launch_bounds__(256) k_one(const float* __restrict__ x, float* y) {
  if (threadIdx.x > 3) return;
  y[0] = helper(x);
}
extern "C" __global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(384, 1) k_two(float* y)
{
  y[1] = 1.f;
}
"""


def test_entries_are_found_past_launch_bounds_and_cluster_dims():
    got = [(e.name, SOURCE[e.body - 1]) for e in kernel_entries(SOURCE)]
    assert got == [("k_one", "{"), ("k_two", "{")]  # the declaration has no body


def test_every_kernel_body_starts_with_the_entry_once():
    out = add_pdl_entries(SOURCE)
    assert out.count(ENTRY) == 2
    assert add_pdl_entries(out) == out  # idempotent
    assert out.count("\n") == SOURCE.count("\n")  # NVRTC's line numbers stay the template's
    for e in kernel_entries(out):
        assert out[e.body :].lstrip().startswith(ENTRY)
    # the early return of k_one comes after the wait
    assert out.index(ENTRY) < out.index("return;")


def test_ready_needs_the_define_and_the_named_kernels_entry():
    out = add_pdl_entries(SOURCE)
    assert not pdl_ready(out, "k_one")  # no definition of the macro in the source
    full = DEFINE + out
    assert pdl_ready(full, "k_one") and waits_first(full, "k_two")
    # k_two is a cluster kernel: it waits first, but is never launched programmatically
    assert has_cluster_shape(full, "k_two") and not pdl_ready(full, "k_two")
    assert not has_cluster_shape(full, "k_one")
    assert not pdl_ready(full, "decl_only") and not pdl_ready(full, "missing")
    assert not pdl_ready(DEFINE + SOURCE, "k_one")  # no entry
    # a macro that does not start with the wait is not the one common.cuh defines
    other = full.replace('asm volatile("griddepcontrol.wait;', 'asm volatile("griddepcontrol.launch_dependents;')
    assert not pdl_ready(other, "k_one")


def test_a_cluster_shape_on_a_declaration_keeps_the_kernel_plain():
    # as conv_sm90_igemm.cu.j2 writes it: the shape on a declaration, the definition without it
    src = DEFINE + add_pdl_entries(
        'extern "C" __global__ void __cluster_dims__(1, 8, 1) __launch_bounds__(256, 1) k_c(float* y);\n'
        'extern "C" __global__ void __launch_bounds__(256, 1) k_c(float* y) {\n  y[0] = 1.f;\n}\n'
        'extern "C" __global__ void k_c2(float* y) {\n  y[0] = 2.f;\n}\n'
    )
    assert waits_first(src, "k_c") and has_cluster_shape(src, "k_c") and not pdl_ready(src, "k_c")
    assert pdl_ready(src, "k_c2") and not has_cluster_shape(src, "k_c2")  # a name that k_c's is a prefix of


def test_arch_gate_and_sequence_choice():
    assert [arch_has_pdl(a) for a in ("sm_80", "sm_86", "sm_89", "sm_90", "sm_90a", "sm_100", None)] == [
        False, False, False, True, True, True, False,
    ]  # fmt: skip
    assert programmatic_launches(["a", "b", "a", "c"], {"a", "c"}) == [False, False, True, True]
    assert programmatic_launches([], {"a"}) == []
    # a CTA limit: only between launches that both fit it
    ctas = [10, 500, 10, 10, 10]
    assert programmatic_launches(["a"] * 5, {"a"}, ctas, 132) == [False, False, False, True, True]
    assert programmatic_launches(["a"] * 5, {"a"}, ctas, None) == [False, True, True, True, True]


def test_cta_limit_from_the_environment(monkeypatch):
    from graphc.runtime.pdl import env_max_ctas

    monkeypatch.delenv("GRAPHC_PDL_MAX_CTAS", raising=False)
    assert env_max_ctas() == "default"
    monkeypatch.setenv("GRAPHC_PDL_MAX_CTAS", "0")
    assert env_max_ctas() is None
    monkeypatch.setenv("GRAPHC_PDL_MAX_CTAS", "264")
    assert env_max_ctas() == 264
    monkeypatch.setenv("GRAPHC_PDL_MAX_CTAS", "many")
    with pytest.raises(EngineError, match="GRAPHC_PDL_MAX_CTAS='many'"):
        env_max_ctas()


# ---- the engine: every rendered kernel is PDL-ready, recorded, checked at load ----------------


@pytest.fixture(scope="module")
def bert():
    m = models.build("bert", size="tiny")
    feeds = models.sample_inputs("bert", m)
    return m, {k: v.shape for k, v in feeds.items()}


def test_rendered_kernels_are_ready_and_recorded(bert, tmp_path):
    m, shapes = bert
    eng = graphc.compile(m, target="cuda", arch=["sm_90"], shapes=shapes)
    ks = eng.kernels
    assert ks.sources and all(pdl_ready(s, ks.names[d]) for d, s in ks.sources.items())
    assert eng.build_info["pdl"] is True
    eng.save(tmp_path / "on.engine")
    ef = read_engine(tmp_path / "on.engine")
    assert pdl_kernels(ef.manifest) == set(ks.sources)
    off = graphc.compile(m, target="cuda", arch=["sm_90"], shapes=shapes, pdl=False)
    off.save(tmp_path / "off.engine")
    ef = read_engine(tmp_path / "off.engine")
    assert pdl_kernels(ef.manifest) == set() and all("pdl" not in k for k in ef.manifest["kernels"].values())


def test_an_engine_claiming_pdl_for_a_kernel_without_the_wait_is_refused(bert, tmp_path, monkeypatch):
    import graphc.codegen.kernel as kernel

    m, shapes = bert
    monkeypatch.setattr(kernel, "add_pdl_entries", lambda s: s)  # sources as an older graphc wrote them
    old = graphc.compile(m, target="cuda", arch=["sm_80"], shapes=shapes)
    old.save(tmp_path / "old.engine")
    ef = read_engine(tmp_path / "old.engine")  # no record: loads, nothing programmatic
    assert pdl_kernels(ef.manifest) == set()
    digest = next(iter(ef.manifest["kernels"]))

    def claim(man):
        man["kernels"][digest]["pdl"] = True

    refused(rewrite(tmp_path / "old.engine", tmp_path / "claim.engine", claim), "recorded as PDL-ready")


def test_cluster_kernels_are_not_recorded_and_older_records_still_load(tmp_path):
    # ResNet-50's deep 3x3 conv at batch 1 with its residual: on sm_90 a cluster split-K conv
    eng = graphc.compile(deep_conv_model(), target="cuda", precision="fp16", arch=["sm_90"])
    ks = eng.kernels
    cluster = {d for d, s in ks.sources.items() if has_cluster_shape(s, ks.names[d])}
    assert len(cluster) == 1, [ln.params for s in eng.plan.steps for ln in s.launches]
    eng.save(tmp_path / "e.engine")
    ef = read_engine(tmp_path / "e.engine")
    assert pdl_kernels(ef.manifest) == set(ks.sources) - cluster and pdl_kernels(ef.manifest)

    def claim(man):  # as a graphc from before this rule recorded it
        for d in cluster:
            man["kernels"][d]["pdl"] = True

    older = read_engine(rewrite(tmp_path / "e.engine", tmp_path / "older.engine", claim))
    assert pdl_kernels(older.manifest) == set(ks.sources)  # loads; the runtime still launches it plain


def test_engines_without_the_field_still_load(tmp_path, bert):
    m, shapes = bert
    graphc.compile(m, target="cuda", arch=["sm_90"], shapes=shapes).save(tmp_path / "e.engine")

    def drop(man):
        for k in man["kernels"].values():
            k.pop("pdl", None)

    ef = read_engine(rewrite(tmp_path / "e.engine", tmp_path / "older.engine", drop))
    assert pdl_kernels(ef.manifest) == set()


# ---- the launch path, cupy and the driver faked ---------------------------------------------


class FakeDriver:
    """cuda.bindings.driver's launch API, recording each cuLaunchKernelEx."""

    def __init__(self):
        self.calls = []
        self.CUresult = types.SimpleNamespace(CUDA_SUCCESS=0)
        self.CUlaunchAttributeID = types.SimpleNamespace(CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION=6)

    def CUlaunchConfig(self):
        return types.SimpleNamespace()

    def CUlaunchAttribute(self):
        return types.SimpleNamespace(value=types.SimpleNamespace())

    def CUstream(self, ptr):
        return ("stream", ptr)

    def CUfunction(self, ptr):
        return ("function", ptr)

    def cuCtxGetCurrent(self):
        return (0, "ctx")

    def cuCtxSetCurrent(self, ctx):
        self.bound = ctx
        return (0,)

    def cuLaunchKernelEx(self, cfg, fn, params, extra):
        # read the argument values through the pointer array, as the driver does
        n = self.nargs
        ptrs = (ctypes.c_uint64 * n).from_address(params)
        vals = [int(ctypes.c_uint64.from_address(int(p)).value) for p in ptrs]
        self.calls.append((fn[1], cfg, vals))
        return (0,)


class FakeFunction:
    def __init__(self, ptr, log):
        self.ptr, self.log = ptr, log

    def __call__(self, grid, block, args, shared_mem=0, stream=None):
        self.log.append((self.ptr, grid, [int(a.data.ptr) for a in args]))


def _context(monkeypatch, digests, ready, driver, max_ctas=None):
    from graphc.runtime import cuda
    from graphc.runtime.plan import ARENA, KernelPlan, Launch, MemoryPlan, Step, TensorPlacement, TensorSpec

    monkeypatch.setattr(cuda, "import_cupy", lambda: F.cupy)
    monkeypatch.setattr(cuda, "_cuda_driver", lambda: driver)
    F.MOVE[0] = True
    tensors = {n: TensorSpec(n, "float32", [4], 16, ARENA) for n in ("t0", "t1", "t2", "t3")}
    steps = []
    for i, d in enumerate(digests):
        launch = Launch(f"k{d}", d * 64, [2 + i, 1, 1], [128, 1, 1], [f"t{i}", f"t{i + 1}"], 64 * i)
        steps.append(Step(i, f"s{i}", "Relu", "Relu", "", {}, [f"t{i}"], [f"t{i + 1}"], launches=[launch]))
    plan = KernelPlan(tensors, steps, ["t0"], [f"t{len(digests)}"], ["y"])
    memory = MemoryPlan(64 * 4, 0, {n: TensorPlacement(n, 64 * i, 16, -1, 9) for i, n in enumerate(tensors)}, {})
    log: list = []
    functions = {d * 64: FakeFunction(1000 + ord(d), log) for d in set(digests)}
    weights = types.SimpleNamespace(arrays={})
    ctx = cuda.CUDAContext(plan, memory, weights, functions, 0, frozenset(r * 64 for r in ready), max_ctas)
    if driver is not None:
        driver.nargs = 2
    return ctx, log


def test_programmatic_launches_exactly_for_ready_kernels_after_the_first(monkeypatch):
    driver = FakeDriver()
    ctx, plain = _context(monkeypatch, ["a", "b", "a"], {"a"}, driver)
    assert [p is not None for p in ctx.programmatic] == [False, False, True]
    ctx.launch_all()
    # plain: the first a, and b (not ready); programmatic: the second a, with its geometry and arguments
    assert [c[0] for c in plain] == [1000 + ord("a"), 1000 + ord("b")]
    assert len(driver.calls) == 1
    fn, cfg, vals = driver.calls[0]
    assert fn == 1000 + ord("a")
    assert (cfg.gridDimX, cfg.blockDimX, cfg.sharedMemBytes, cfg.numAttrs) == (4, 128, 128, 1)
    assert cfg.attrs[0].id == 6 and cfg.attrs[0].value.programmaticStreamSerializationAllowed == 1
    assert vals == [int(ctx.views["t2"].data.ptr), int(ctx.views["t3"].data.ptr)]
    # through run(): the driver's context is bound first, then the same launches again
    ctx.run({"t0": F.array(np.ones(4, np.float32))}, use_graph=False, sync=False)
    assert driver.bound == "ctx" and len(driver.calls) == 2 and len(plain) == 4


def test_cta_limit_keeps_large_grids_plain(monkeypatch):
    driver = FakeDriver()
    ctx, _plain = _context(monkeypatch, ["a", "b", "a"], {"a", "b"}, driver, max_ctas=3)
    # grids of 2, 3 and 4 CTAs: the second launch (3 after 2) fits, the third (4) does not
    assert [p is not None for p in ctx.programmatic] == [False, True, False]


def test_no_programmatic_launch_without_ready_kernels_or_driver(monkeypatch, caplog):
    driver = FakeDriver()
    ctx, plain = _context(monkeypatch, ["a", "b", "a"], set(), driver)
    ctx.launch_all()
    assert len(plain) == 3 and not driver.calls
    ctx, plain = _context(monkeypatch, ["a", "b", "a"], {"a", "b"}, None)  # cuda.bindings missing
    assert "cuda.bindings is not installed" in caplog.text
    ctx.launch_all()
    assert len(plain) == 3


@pytest.mark.parametrize(
    "arch, switch, env, short, expect",
    [
        ("sm_90", None, None, True, True),
        ("sm_90a", None, None, True, True),
        ("sm_100", None, None, True, True),
        ("sm_86", None, None, True, False),
        ("sm_86", True, "1", True, False),  # no griddepcontrol before sm_90, whatever is asked
        ("sm_90", None, None, False, False),  # long kernels: off by default
        ("sm_90", None, "1", False, True),  # ... unless asked for
        ("sm_90", True, None, False, True),
        ("sm_90", False, None, True, False),
        ("sm_90", None, "0", True, False),
        ("sm_90", True, "0", True, True),  # the explicit switch wins over the environment
    ],
)
def test_executor_switch(monkeypatch, arch, switch, env, short, expect):
    from graphc.runtime.cuda import CUDAExecutor

    if env is None:
        monkeypatch.delenv("GRAPHC_PDL", raising=False)
    else:
        monkeypatch.setenv("GRAPHC_PDL", env)
    got = CUDAExecutor._pdl_kernels({"d1", "d2"}, switch, arch, lambda: short)
    assert got == (frozenset({"d1", "d2"}) if expect else frozenset())


def test_default_is_on_for_engines_of_short_kernels(monkeypatch):
    from graphc.runtime import cuda
    from graphc.runtime.plan import Launch, Step

    monkeypatch.setattr(cuda, "_sm_count", lambda cupy, device: 100)

    def executor(grids, persistent=False):
        ex = object.__new__(cuda.CUDAExecutor)
        steps = [
            Step(i, f"s{i}", "Relu", "Relu", "", {}, [], [], launches=[
                Launch("k", "d" * 64, [g, 1, 1], [128, 1, 1], [], params={"persistent": persistent})
            ])
            for i, g in enumerate(grids)
        ]  # fmt: skip
        ex.plan, ex.device = types.SimpleNamespace(steps=steps), 0
        return ex

    assert executor([50, 150, 400])._short_kernels(None)  # mean 200 = 2 waves
    assert not executor([50, 150, 401])._short_kernels(None)
    assert executor([5000, 5000], persistent=True)._short_kernels(None)  # one CTA per SM each


def test_manifest_kernels_field_is_a_bool(tmp_path, bert):
    m, shapes = bert
    graphc.compile(m, target="cuda", arch=["sm_90"], shapes=shapes).save(tmp_path / "e.engine")

    def bad(man):
        k = next(iter(man["kernels"].values()))
        k["pdl"] = "yes"

    with pytest.raises(EngineError):
        read_engine(rewrite(tmp_path / "e.engine", tmp_path / "bad.engine", bad))


def _cluster_source(name: str) -> str:
    return DEFINE + add_pdl_entries(
        f'extern "C" __global__ void __cluster_dims__(1, 1, 4) __launch_bounds__(128) {name}(float* y);\n'
        f'extern "C" __global__ void __launch_bounds__(128) {name}(float* y) {{\n  y[0] = 1.f;\n}}\n'
    )


def test_gemm_clusters_launch_programmatically_on_request_conv_clusters_stay_plain(monkeypatch):
    # measured on the H200 (runtime/pdl.py CLUSTER_PDL_PREFIXES): the wgmma cluster split-K GEMM is
    # right under PDL, the split-K convolution cluster is not; GEMM clusters are opt-in for now
    gemm, conv = "gc_gemm_0123456789abcdef", "gc_conv_0123456789abcdef"
    monkeypatch.delenv("GRAPHC_PDL_CLUSTERS", raising=False)
    assert not pdl_ready(_cluster_source(gemm), gemm)  # the default: every cluster kernel plain
    monkeypatch.setenv("GRAPHC_PDL_CLUSTERS", "1")
    assert has_cluster_shape(_cluster_source(gemm), gemm) and pdl_ready(_cluster_source(gemm), gemm)
    assert has_cluster_shape(_cluster_source(conv), conv) and not pdl_ready(_cluster_source(conv), conv)
    # a GEMM cluster kernel that does not wait first is never ready
    bare = DEFINE + _cluster_source(gemm).replace(ENTRY, "")
    assert not pdl_ready(bare, gemm)
    monkeypatch.setenv("GRAPHC_PDL_CLUSTERS", "0")
    assert not pdl_ready(_cluster_source(gemm), gemm)
    assert pdl_ready(DEFINE + add_pdl_entries(SOURCE), "k_one")  # kernels without a cluster unaffected


def test_pdl_clusters_sets_and_restores_the_switch(monkeypatch):
    from graphc.runtime.pdl import env_pdl_clusters, pdl_clusters

    monkeypatch.delenv("GRAPHC_PDL_CLUSTERS", raising=False)
    with pdl_clusters(True):
        assert env_pdl_clusters()
    assert "GRAPHC_PDL_CLUSTERS" not in __import__("os").environ
    monkeypatch.setenv("GRAPHC_PDL_CLUSTERS", "1")
    with pdl_clusters(False):
        assert not env_pdl_clusters()
    assert env_pdl_clusters()
