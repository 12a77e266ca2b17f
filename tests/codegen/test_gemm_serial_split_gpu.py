"""Serial split-K on a GPU: one kernel whose last block per tile sums the partials and runs the
epilogue. The same loaded module is launched several times with new inputs and a re-poisoned
workspace, so a tile counter that was not reset to zero (the last block's job) shows up as a wrong
or unwritten (NaN) output on the second launch. The wgmma case runs only on an sm_90 GPU.

Run on a GPU machine:  python -m pytest tests/codegen/test_gemm_serial_split_gpu.py -q
"""

from __future__ import annotations

import numpy as np
import pytest

from graphc.codegen.kernel import family_for
from tests.codegen.test_gemm_gpu import TOL, Case, _bias_gelu_residual, _default_tile, _inputs, reference
from tests.codegen.test_gemm_gpu import set_max_dynamic_shared as _set_smem

pytestmark = pytest.mark.gpu


def _cases() -> list[Case]:
    f = _bias_gelu_residual(130, 200)
    out = []
    for mode in ("fp16", "bf16", "fp32"):
        out.append(
            Case(
                f"{mode}-serial-split",
                mode,
                "MatMul",
                [(130, 3072), (3072, 200), *f["extra"]],
                n_anchor=2,
                epilogue=f["epilogue"],
                outputs=f["outputs"],
                params=dict(_default_tile(mode), SPLITS=6),
            )
        )
    out.append(
        Case(
            "fp16-wgmma-serial-split",
            "fp16",
            "MatMul",
            [(130, 3072), (3072, 200), *f["extra"]],
            n_anchor=2,
            epilogue=f["epilogue"],
            outputs=f["outputs"],
            params={"path": "wgmma", "BM": 64, "BN": 128, "BK": 64, "STAGES": 4, "SPLITS": 6},
        )
    )
    # batched (3 GEMMs sharing A, as the horizontal Q/K/V fusion makes them)
    out.append(
        Case(
            "fp16-serial-split-batched",
            "fp16",
            "MatMul",
            [(1, 128, 768), (3, 768, 768)],
            params=dict(_default_tile("fp16"), SPLITS=4),
        )
    )
    return out


CASES = _cases()


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_serial_split_k_relaunch(case: Case):
    import cupy

    from graphc.codegen.nvrtc import compile_cubin
    from graphc.runtime.cuda import device_arch

    arch = device_arch()
    ctx = case.context()
    kernels = family_for(ctx).generate(ctx)
    assert len(kernels) == 1 and kernels[0].params["SERIAL"] == 1, [k.params for k in kernels]
    (k,) = kernels
    need = k.params.get("requires_arch")
    if need is not None and need.rstrip("a") != arch:
        pytest.skip(f"needs {need}")
    mod = cupy.cuda.function.Module()
    mod.load(compile_cubin(k.source, k.name, need or arch))
    fn = mod.get_function(k.name)
    if k.shared_bytes > 48 * 1024:
        _set_smem(fn, k.shared_bytes)
    for seed in range(3):  # one module, three launches: the counters must come back to zero
        xs = _inputs(case, ctx, np.random.default_rng(seed))
        dev = {n: cupy.asarray(x) for n, x in zip(ctx.step.inputs, xs, strict=True)}
        for o in ctx.step.outputs:
            spec = ctx.tensors[o]
            dev[o] = cupy.full(spec.nbytes, 0xFF, dtype=cupy.uint8).view(xs[0].dtype).reshape(tuple(spec.shape))
        ws = cupy.full(k.workspace_bytes, 0xFF, dtype=cupy.uint8)
        fn(k.grid, k.block, tuple(ws if a == "@workspace" else dev[a] for a in k.args), shared_mem=k.shared_bytes)
        cupy.cuda.runtime.deviceSynchronize()
        out = cupy.asnumpy(dev[ctx.step.outputs[0]]).astype(np.float64)
        (ref,) = reference(case, [x.astype(np.float64) for x in xs])
        assert np.isfinite(out).all(), f"launch {seed}: {np.count_nonzero(~np.isfinite(out))} elements unwritten"
        err = np.linalg.norm(out - ref) / np.linalg.norm(ref)
        assert err < TOL[case.mode], f"launch {seed}: relative error {err:.3g}"
