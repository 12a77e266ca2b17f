"""GEMM kernels on a GPU against float64 numpy: odd shapes, every layout, batch broadcast, split-K,
fused epilogues, in fp32 (SIMT and TF32), fp16 and bf16.

Each case's kernels come from the family's generate() on a one-step plan, are compiled with NVRTC
for the local GPU (all cases at once, in parallel, cached) and launched with cupy on outputs and a
workspace poisoned with NaN, so an element no kernel writes fails the test. The error measure is
||out - ref|| / ||ref|| over the whole output.

Run on a GPU machine:  python -m pytest tests/codegen/test_gemm_gpu.py -q
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from graphc.codegen.families.gemm import MMA_TILES, SIMT_TILES, WGMMA_TILES, standalone_context
from graphc.codegen.kernel import family_for
from graphc.ir.types import DType
from graphc.ops.fused import ACC, IN, OP, EpilogueOp
from graphc.ops.registry import get_op

pytestmark = pytest.mark.gpu

# ||out - ref|| / ||ref|| limits per precision mode
TOL = {"fp32": 1e-5, "tf32": 3e-3, "bf16": 1e-2, "fp16": 2e-3}
DTYPES = {"fp32": DType.float32, "tf32": DType.float32, "fp16": DType.float16, "bf16": DType.bfloat16}


@dataclass
class Case:
    id: str
    mode: str
    op: str
    shapes: list[tuple[int, ...]]
    domain: str = ""
    attrs: dict[str, Any] = field(default_factory=dict)
    n_anchor: int | None = None
    epilogue: tuple = ()
    outputs: tuple = (ACC,)
    params: dict[str, Any] | None = None

    def context(self):
        opdef = get_op(self.op, self.domain)
        return standalone_context(
            self.op,
            self.shapes,
            DTYPES[self.mode],
            domain=self.domain,
            attrs=opdef.attrs(**self.attrs),
            n_anchor=self.n_anchor,
            epilogue=self.epilogue,
            outputs=self.outputs,
            allow_tf32=self.mode == "tf32",
            params=self.params,
        )


def _bias_gelu_residual(m: int, n: int) -> dict[str, Any]:
    # y = Gelu(acc + bias[n]) + residual[m, n]
    epi = (
        EpilogueOp("Add", get_op("Add").attrs(), (ACC, IN(2))),
        EpilogueOp("Gelu", get_op("Gelu").attrs(), (OP(0),)),
        EpilogueOp("Add", get_op("Add").attrs(), (OP(1), IN(3))),
    )
    return {"n_anchor": 2, "epilogue": epi, "outputs": (OP(2),), "extra": [(n,), (m, n)]}


def _cases() -> list[Case]:
    cases: list[Case] = []
    odd = [
        (1, 1, 1),
        (7, 33, 127),
        (33, 7, 1000),
        (127, 127, 33),
        (1000, 1000, 127),
        (1, 1000, 1000),
        (1000, 1, 1000),
        (127, 1000, 7),
        (33, 33, 4096),
        (7, 127, 4096),
        (256, 384, 512),
        (1000, 33, 1),
        (5, 7, 0),
    ]
    for mode in ("fp32", "tf32", "fp16", "bf16"):
        for m, n, k in odd:
            cases.append(Case(f"{mode}-mm-{m}x{n}x{k}", mode, "MatMul", [(m, k), (k, n)]))
        for ta in (0, 1):
            for tb in (0, 1):
                for m, n, k in ((33, 127, 1000), (128, 64, 256)):
                    sa = (k, m) if ta else (m, k)
                    sb = (n, k) if tb else (k, n)
                    cases.append(
                        Case(
                            f"{mode}-gemm-t{ta}{tb}-{m}x{n}x{k}",
                            mode,
                            "Gemm",
                            [sa, sb, (n,)],
                            attrs={"transA": ta, "transB": tb, "alpha": 0.5, "beta": 1.5},
                        )
                    )
        # Gemm with a full C and beta 1, and without C
        cases.append(Case(f"{mode}-gemm-cfull", mode, "Gemm", [(64, 48), (48, 40), (64, 40)]))
        cases.append(Case(f"{mode}-gemm-noc", mode, "Gemm", [(40, 48), (40, 48)], attrs={"transB": 1}))
        # graphc.MatMul: attention-like Q @ K^T with a scale, and P @ V
        cases.append(
            Case(
                f"{mode}-attn-qk",
                mode,
                "MatMul",
                [(2, 3, 33, 64), (2, 3, 33, 64)],
                domain="graphc",
                attrs={"trans_b": 1, "alpha": 0.125},
            )
        )
        cases.append(
            Case(f"{mode}-trans-a", mode, "MatMul", [(2, 70, 33), (2, 70, 40)], domain="graphc", attrs={"trans_a": 1})
        )
        # batch broadcast, folding, 1-D operands
        cases.append(Case(f"{mode}-bcast", mode, "MatMul", [(3, 1, 33, 64), (5, 64, 40)]))
        cases.append(Case(f"{mode}-fold", mode, "MatMul", [(2, 7, 96), (96, 72)]))
        cases.append(Case(f"{mode}-bshared-a", mode, "MatMul", [(33, 96), (4, 96, 72)]))
        cases.append(Case(f"{mode}-vec-mat", mode, "MatMul", [(127,), (127, 40)]))
        cases.append(Case(f"{mode}-mat-vec", mode, "MatMul", [(2, 40, 128), (128,)]))
        cases.append(Case(f"{mode}-dot", mode, "MatMul", [(1000,), (1000,)]))
        # fused bias + Gelu + residual, direct and through split-K
        for m, n, k, params in ((100, 72, 256, None), (64, 64, 2048, {"SPLITS": 4})):
            f = _bias_gelu_residual(m, n)
            p = None
            if params is not None:
                p = dict(_default_tile(mode), **params)
            cases.append(
                Case(
                    f"{mode}-fused-{m}x{n}x{k}{'-split' if p else ''}",
                    mode,
                    "MatMul",
                    [(m, k), (k, n), *f["extra"]],
                    n_anchor=2,
                    epilogue=f["epilogue"],
                    outputs=f["outputs"],
                    params=p,
                )
            )
        # forced split-K on a Gemm with C (the epilogue, alpha and beta C run once, after the sum)
        cases.append(
            Case(
                f"{mode}-gemm-split",
                mode,
                "Gemm",
                [(50, 3000), (3000, 70), (50, 70)],
                attrs={"alpha": 2.0, "beta": -1.0},
                params=dict(_default_tile(mode), SPLITS=5),
            )
        )
    # every tile shape of the search space once
    for i, (bm, bn, wm, wn, _) in enumerate(MMA_TILES):
        for mode in ("fp16", "tf32"):
            bk = (32, 64)[i % 2] if mode == "fp16" else (16, 32)[i % 2]
            st = (2, 3, 4)[i % 3]
            p = {"BM": bm, "BN": bn, "BK": bk, "WM": wm, "WN": wn, "STAGES": st, "SPLITS": 1}
            cases.append(Case(f"{mode}-tile-{bm}x{bn}x{bk}s{st}", mode, "MatMul", [(300, 136), (136, 264)], params=p))
    # sm_90a warpgroup MMA (run where the GPU is an sm_90): every operand layout, tile, split-K,
    # batch, and the fused epilogue
    for mode in ("fp16", "bf16"):
        for ta in (0, 1):
            for tb in (0, 1):
                m, n, k = 200, 136, 520
                cases.append(
                    Case(
                        f"{mode}-wgmma-t{ta}{tb}",
                        mode,
                        "MatMul",
                        [(k, m) if ta else (m, k), (n, k) if tb else (k, n)],
                        domain="graphc",
                        attrs={"trans_a": ta, "trans_b": tb},
                        params={"path": "wgmma", "BM": 128, "BN": 256, "BK": 64, "STAGES": 4},
                    )
                )
    for i, (bm, bn, _) in enumerate(WGMMA_TILES):
        p = {"path": "wgmma", "BM": bm, "BN": bn, "BK": 64, "STAGES": (3, 4, 5)[i % 3]}
        cases.append(Case(f"fp16-wgmma-tile-{bm}x{bn}", "fp16", "MatMul", [(300, 1096), (1096, 264)], params=p))
    f = _bias_gelu_residual(96, 200)
    cases.append(
        Case(
            "fp16-wgmma-fused-split",
            "fp16",
            "MatMul",
            [(96, 4096), (4096, 200), *f["extra"]],
            n_anchor=2,
            epilogue=f["epilogue"],
            outputs=f["outputs"],
            params={"path": "wgmma", "BM": 64, "BN": 128, "BK": 64, "STAGES": 4, "SPLITS": 6},
        )
    )
    cases.append(
        Case(
            "bf16-wgmma-batched-fused",
            "bf16",
            "MatMul",
            [(3, 130, 64), (64, 72), *_bias_gelu_residual(3 * 130, 72)["extra"][:1], (3, 130, 72)],
            n_anchor=2,
            epilogue=f["epilogue"],
            outputs=f["outputs"],
            params={"path": "wgmma", "BM": 128, "BN": 128, "BK": 64, "STAGES": 3},
        )
    )
    cases.append(
        Case(
            "fp16-wgmma-attn",
            "fp16",
            "MatMul",
            [(2, 5, 77, 64), (2, 5, 77, 64)],
            domain="graphc",
            attrs={"trans_b": 1, "alpha": 0.125},
            params={"path": "wgmma", "BM": 64, "BN": 128, "BK": 64, "STAGES": 3},
        )
    )
    for bm, bn, tm, tn, _ in SIMT_TILES:
        p = {"path": "simt", "BM": bm, "BN": bn, "BK": 8, "TM": tm, "TN": tn, "SPLITS": 1}
        cases.append(Case(f"fp32-tile-{bm}x{bn}", "fp32", "MatMul", [(300, 136), (136, 264)], params=p))
    return cases


def _default_tile(mode: str) -> dict[str, Any]:
    if mode == "fp32":
        return {"path": "simt", "BM": 64, "BN": 64, "BK": 8, "TM": 4, "TN": 4}
    return {"BM": 64, "BN": 64, "BK": 32 if mode != "tf32" else 16, "WM": 2, "WN": 2, "STAGES": 3}


CASES = _cases()


# ---- reference -----------------------------------------------------------------------------------


def _ref_anchor(case: Case, x: list[np.ndarray]) -> np.ndarray:
    a, b = x[0], x[1]
    attrs = get_op(case.op, case.domain).attrs(**case.attrs)
    if case.domain == "graphc":
        if attrs.trans_a:
            a = np.swapaxes(a, -1, -2)
        if attrs.trans_b:
            b = np.swapaxes(b, -1, -2)
        return np.matmul(a, b) * attrs.alpha
    if case.op == "Gemm":
        y = np.matmul(a.T if attrs.transA else a, b.T if attrs.transB else b) * attrs.alpha
        if len(x) > 2 and (case.n_anchor is None or case.n_anchor > 2) and attrs.beta != 0:
            y = y + attrs.beta * x[2]
        return y
    return np.matmul(a, b)


def reference(case: Case, x: list[np.ndarray]) -> list[np.ndarray]:
    """float64 throughout: the anchor, then the epilogue ops' own numpy definitions."""
    acc = _ref_anchor(case, x)
    results: list[np.ndarray] = []

    def value(r):
        return acc if r.kind == "acc" else x[r.index] if r.kind == "in" else results[r.index]

    for e in case.epilogue:
        results.append(get_op(e.op).compute([value(r) for r in e.args], e.attrs, 1)[0].astype(np.float64))
    return [np.asarray(value(r), dtype=np.float64) for r in case.outputs]


# ---- building and running ------------------------------------------------------------------------


@functools.cache
def _built() -> dict[str, Any]:
    """Every case's kernels, compiled at once for the local GPU."""
    from graphc.codegen.nvrtc import CompileJob, compile_all
    from graphc.runtime.cuda import device_arch

    arch = device_arch()
    gen = {}
    jobs = []
    for case in CASES:
        ctx = case.context()
        ks = family_for(ctx).generate(ctx)
        if any(k.params.get("requires_arch", arch) != arch for k in ks) and arch != "sm_90":
            continue  # an sm_90a kernel on another GPU
        gen[case.id] = (ctx, ks)
        jobs += [CompileJob(k.name, k.source, k.params.get("requires_arch", arch)) for k in ks]
    cubins = iter(compile_all(jobs))
    out = {}
    for cid, (ctx, ks) in gen.items():
        out[cid] = (ctx, [(k, next(cubins)) for k in ks])
    return out


def _inputs(case: Case, ctx, rng) -> list[np.ndarray]:
    dt = DTYPES[case.mode].numpy
    xs = []
    for name in ctx.step.inputs:
        shape = tuple(ctx.tensors[name].shape)
        xs.append(rng.uniform(-1.0, 1.0, size=shape).astype(dt))
    return xs


def set_max_dynamic_shared(fn, nbytes: int) -> None:
    """Let a kernel take more than 48 KB of dynamic shared memory (cupy 14's Function has no
    property for it: set the attribute through the driver)."""
    import cupy

    drv = cupy.cuda.driver
    attr = getattr(drv, "CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES", 8)
    drv.funcSetAttribute(fn.ptr, attr, nbytes)


def run_case(case: Case, seed: int = 0) -> tuple[list[np.ndarray], list[np.ndarray], list]:
    import cupy

    if case.id not in _built():
        pytest.skip("needs an sm_90 GPU (wgmma)")
    ctx, kernels = _built()[case.id]
    rng = np.random.default_rng(seed)
    xs = _inputs(case, ctx, rng)
    dev = {n: cupy.asarray(x) for n, x in zip(ctx.step.inputs, xs, strict=True)}
    for o in ctx.step.outputs:
        spec = ctx.tensors[o]
        dt = np.dtype(getattr(ml_dtypes, spec.dtype)) if spec.dtype == "bfloat16" else np.dtype(spec.dtype)
        buf = cupy.full(spec.nbytes, 0xFF, dtype=cupy.uint8)  # NaN in every float format
        dev[o] = buf.view(dt).reshape(tuple(spec.shape))
    ws_bytes = max((k.workspace_bytes for k, _ in kernels), default=0)
    ws = cupy.full(max(ws_bytes, 1), 0xFF, dtype=cupy.uint8)
    for k, cubin in kernels:
        mod = cupy.cuda.function.Module()
        mod.load(cubin)
        fn = mod.get_function(k.name)
        if k.shared_bytes > 48 * 1024:
            set_max_dynamic_shared(fn, k.shared_bytes)
        args = tuple(ws if a == "@workspace" else dev[a] for a in k.args)
        fn(k.grid, k.block, args, shared_mem=k.shared_bytes)
    cupy.cuda.runtime.deviceSynchronize()
    outs = [cupy.asnumpy(dev[o]).astype(np.float64) for o in ctx.step.outputs]
    refs = reference(case, [x.astype(np.float64) for x in xs])
    return outs, refs, kernels


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_gemm_gpu(case: Case):
    outs, refs, kernels = run_case(case)
    for out, ref in zip(outs, refs, strict=True):
        assert out.shape == ref.shape
        assert np.isfinite(out).all(), f"{np.count_nonzero(~np.isfinite(out))} elements unwritten or not finite"
        den = np.linalg.norm(ref)
        err = np.linalg.norm(out - ref) / (den if den > 0 else 1.0)
        params = [k.params for k, _ in kernels]
        assert err < TOL[case.mode], f"relative error {err:.3g} >= {TOL[case.mode]} with {params}"
