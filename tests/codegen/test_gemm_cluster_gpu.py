"""Cluster split-K GEMMs on an sm_90 GPU against float64 numpy: the K slices of a tile are the CTAs
of one thread-block cluster and sum their partials through distributed shared memory.

Each case is compiled for the local GPU, loaded once and launched three times with new inputs on
outputs poisoned with NaN (a tile share no CTA stores, or state left behind by a launch, shows up);
the tails (M = 197, N not a multiple of the tile or of 4), fused epilogues (bias + GELU + residual,
Gemm's alpha and beta C), batched B and a K-contiguous B are covered. An sm_90 engine with such
GEMMs is then built, saved, loaded and run through CUDA-graph capture and two replays in two
contexts.

Run on a GPU machine:  python -m pytest tests/codegen/test_gemm_cluster_gpu.py -q
"""

from __future__ import annotations

import numpy as np
import pytest

from graphc.codegen.kernel import family_for
from helpers import residual_mlp_model  # noqa: E402
from tests.codegen.test_gemm_gpu import TOL, Case, _bias_gelu_residual, _inputs, reference
from tests.codegen.test_gemm_gpu import set_max_dynamic_shared as _set_smem

pytestmark = pytest.mark.gpu


def _tile(bm: int, bn: int, wm: int, wn: int, s: int, **kw) -> dict:
    return {
        "path": "mma",
        "BM": bm,
        "BN": bn,
        "BK": 32,
        "WM": wm,
        "WN": wn,
        "STAGES": 4,
        "SPLITS": s,
        "CLUSTER": 1,
        **kw,
    }


def _wgmma(bm: int, bn: int, s: int) -> dict:
    return {"path": "wgmma", "BM": bm, "BN": bn, "BK": 64, "STAGES": 4, "SPLITS": s, "CLUSTER": 1}


def _cases() -> list[Case]:
    out = [
        Case("fp16-128x768x768-64x32-s8", "fp16", "MatMul", [(128, 768), (768, 768)], params=_tile(64, 32, 2, 2, 8)),
        Case(
            "fp16-128x2304x768-128x64-s6", "fp16", "MatMul", [(128, 768), (768, 2304)], params=_tile(128, 64, 2, 2, 6)
        ),
    ]
    f = _bias_gelu_residual(197, 770)
    for mode, tile in (("fp16", _tile(64, 64, 2, 2, 4)), ("bf16", _tile(32, 64, 1, 2, 3))):
        out.append(
            Case(
                f"{mode}-197x770x768-bias-gelu-residual",
                mode,
                "MatMul",
                [(197, 768), (768, 770), *f["extra"]],
                n_anchor=2,
                epilogue=f["epilogue"],
                outputs=f["outputs"],
                params=tile,
            )
        )
    f = _bias_gelu_residual(197, 3072)
    out.append(
        Case(
            "fp16-197x3072x768-bias-gelu-residual-128x128-s8",
            "fp16",
            "MatMul",
            [(197, 768), (768, 3072), *f["extra"]],
            n_anchor=2,
            epilogue=f["epilogue"],
            outputs=f["outputs"],
            params=_tile(128, 128, 2, 2, 8, STAGES=3),
        )
    )
    out += [
        Case(
            "fp16-gemm-alpha-beta-c",
            "fp16",
            "Gemm",
            [(197, 768), (768, 300), (300,)],
            attrs={"alpha": 0.5, "beta": 2.0},
            params=_tile(64, 64, 2, 2, 6),
        ),
        Case(
            "fp16-batched-qkv",
            "fp16",
            "MatMul",
            [(1, 128, 768), (3, 768, 768)],
            params=_tile(64, 64, 2, 2, 3),
        ),
        Case(
            "fp16-b-kcontig-n1001",
            "fp16",
            "MatMul",
            [(128, 768), (1001, 768)],
            domain="graphc",
            attrs={"trans_b": 1},
            params=_tile(64, 128, 2, 2, 2),
        ),
        Case("bf16-128x768x3072-s8", "bf16", "MatMul", [(128, 3072), (3072, 768)], params=_tile(64, 64, 2, 2, 8)),
        Case("fp16-wgmma-128x768x768-s4", "fp16", "MatMul", [(128, 768), (768, 768)], params=_wgmma(64, 64, 4)),
        Case("fp16-wgmma-batched-qkv-s3", "fp16", "MatMul", [(1, 128, 768), (3, 768, 768)], params=_wgmma(64, 128, 3)),
    ]
    g = _bias_gelu_residual(197, 776)
    out.append(
        Case(
            "bf16-wgmma-197x776x768-bias-gelu-residual-s2",
            "bf16",
            "MatMul",
            [(197, 768), (768, 776), *g["extra"]],
            n_anchor=2,
            epilogue=g["epilogue"],
            outputs=g["outputs"],
            params=_wgmma(64, 64, 2),
        )
    )
    return out


CASES = _cases()


@pytest.fixture(scope="module")
def arch() -> str:
    from graphc.runtime.cuda import device_arch

    a = device_arch()
    if a != "sm_90":
        pytest.skip("needs an sm_90 GPU (thread-block clusters, compiled for sm_90)")
    return a


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_cluster_split_k(case: Case, arch: str):
    import cupy

    from graphc.codegen.nvrtc import compile_cubin

    ctx = case.context()
    kernels = family_for(ctx).generate(ctx)
    assert len(kernels) == 1, [k.params for k in kernels]
    (k,) = kernels
    assert k.params["CLUSTER"] == 1 and k.workspace_bytes == 0 and "@workspace" not in k.args, k.params
    mod = cupy.cuda.function.Module()
    mod.load(compile_cubin(k.source, k.name, k.params["requires_arch"]))
    fn = mod.get_function(k.name)
    if k.shared_bytes > 48 * 1024:
        _set_smem(fn, k.shared_bytes)
    for seed in range(3):  # one module, three launches
        xs = _inputs(case, ctx, np.random.default_rng(seed))
        dev = {n: cupy.asarray(x) for n, x in zip(ctx.step.inputs, xs, strict=True)}
        for o in ctx.step.outputs:
            spec = ctx.tensors[o]
            dev[o] = cupy.full(spec.nbytes, 0xFF, dtype=cupy.uint8).view(xs[0].dtype).reshape(tuple(spec.shape))
        fn(k.grid, k.block, tuple(dev[a] for a in k.args), shared_mem=k.shared_bytes)
        cupy.cuda.runtime.deviceSynchronize()
        out = cupy.asnumpy(dev[ctx.step.outputs[0]]).astype(np.float64)
        (ref,) = reference(case, [x.astype(np.float64) for x in xs])
        assert np.isfinite(out).all(), f"launch {seed}: {np.count_nonzero(~np.isfinite(out))} elements unwritten"
        err = np.linalg.norm(out - ref) / np.linalg.norm(ref)
        assert err < TOL[case.mode], f"launch {seed}: relative error {err:.3g} with {k.params}"


def test_engine_runs_cluster_gemms(tmp_path, arch: str, monkeypatch):
    """A batch-1 transformer MLP (128 tokens, 768 -> 2304 -> 768) with bias + ReLU and a residual as
    an sm_90 engine: both GEMMs take the wgmma kernel with cluster split-K (the sm_90 small-M rules),
    and the engine is saved, loaded and run through CUDA-graph capture and replays in the default and
    a second context, against numpy. With GRAPHC_PDL_CLUSTERS=1 the cluster GEMMs are PDL-ready
    (runtime/pdl.py) and the engine is loaded with PDL on, so each launches programmatically after
    the kernel that writes its A operand (a split-K convolution cluster went wrong that way on most
    replays of new inputs)."""

    import graphc
    from graphc.runtime.pdl import pdl_ready

    monkeypatch.setenv("GRAPHC_PDL_CLUSTERS", "1")  # read when the engine is built, saved and loaded
    rng = np.random.default_rng(3)
    m, d, h = 128, 768, 2304
    model, weights = residual_mlp_model(m, d, h, rng)
    w1, b1, w2 = weights["w1"], weights["b1"], weights["w2"]
    eng = graphc.compile(model, target="cuda", precision="fp16", arch=["sm_90"])
    gemms = [ln for s in eng.plan.steps for ln in s.launches if ln.family == "gemm"]
    assert len(gemms) == 2 and all(ln.params.get("CLUSTER") == 1 for ln in gemms), [ln.params for ln in gemms]
    ks = eng.kernels
    assert all(pdl_ready(ks.sources[ln.digest], ks.names[ln.digest]) for ln in gemms)
    path = tmp_path / "mlp.engine"
    eng.save(path)
    loaded = graphc.runtime.load(path, pdl=True)
    for run in (loaded.run, loaded.create_context().run):
        for rep in range(8):  # capture, then replays (new inputs each time: a stale read shows)
            x = np.random.default_rng(rep).standard_normal((m, d)).astype(np.float32)
            ref = np.maximum(x @ w1 + b1, 0) @ w2 + x
            got = np.asarray(run({"x": x}, to_numpy=True)["y"], np.float64)
            err = np.linalg.norm(got - ref) / np.linalg.norm(ref)
            assert err < 5e-3, (rep, err)
