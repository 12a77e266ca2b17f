"""The FP8 E4M3 TMA GEMM (gemm_sm90.fp8_gemm) without a GPU: its parameters, its tensor maps and the
SASS of its sm_90a cubin (issue 13 item 5: the fp8 wgmma, QGMMA ... E4M3.E4M3 in SASS). Its numbers
are checked on a GPU by tools/bench_fp8.py (against torch._scaled_mm and the fp16 product)."""

from __future__ import annotations

import re
import subprocess

import pytest

from graphc.codegen.families import gemm_sm90
from graphc.errors import CompileError
from graphc.ir.types import DType
from graphc.runtime.tensormap import spec_from_json
from helpers import cuobjdump_path

try:
    from graphc.codegen.nvrtc import nvrtc_version

    nvrtc_version()
    HAVE_NVRTC = True
except Exception:
    HAVE_NVRTC = False

CUOBJDUMP = cuobjdump_path()


def test_parameters_and_tensor_maps():
    k = gemm_sm90.fp8_gemm(4096, 3072, 768, DType.float16, alpha=0.125)
    assert k.args == ["@tmap:0", "@tmap:1", "out"] and k.block == (384, 1, 1)
    assert k.params["path"] == "fp8_tma" and k.params["requires_arch"] == "sm_90a"
    a, b = (spec_from_json(d, "t") for d in k.params["tmaps"])
    # raw e4m3 bytes: 1-byte maps, a box row of 128 K values (one 128-byte swizzled line)
    assert (a.dtype, a.dims, a.box) == ("uint8", (768, 4096, 1), (128, 128, 1))
    assert (b.dtype, b.dims, b.box[0]) == ("uint8", (768, 3072, 1), 128)
    assert "wgmma.mma_async.sync.aligned.m64n" in k.source and "k32.f32.e4m3.e4m3" in k.source
    assert "* 0.125f" in k.source  # the per-tensor scales, folded into alpha
    assert k.shared_bytes <= 227 * 1024
    (bf,) = [gemm_sm90.fp8_gemm(512, 256, 256, DType.bfloat16, params={"BN": 128, "PINGPONG": 1})]
    assert bf.params["PINGPONG"] == 1 and "gc_bf16" in bf.source


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((256, 256, 256, DType.float32), "float16 or bfloat16"),
        ((256, 256, 200, DType.float16), "16-byte"),
        ((256, 252, 256, DType.float16, 1.0, {"BN": 128, "OVERLAP": 1}), "N % 8"),
        ((256, 256, 256, DType.float16, 1.0, {"BN": 96}), "not valid"),
    ],
)
def test_refused(args, match):
    with pytest.raises(CompileError, match=match):
        gemm_sm90.fp8_gemm(*args)


def _opcodes(text: str) -> set[str]:
    return set(re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", text))


@pytest.mark.skipif(not HAVE_NVRTC, reason="needs NVRTC (cuda-bindings)")
@pytest.mark.skipif(CUOBJDUMP is None, reason="cuobjdump not found: pip install nvidia-cuda-cuobjdump")
def test_cubin_runs_the_fp8_wgmma(tmp_path):
    """Every schedule's cubin: the FP8 warpgroup MMA (QGMMA .F32.E4M3.E4M3), TMA loads (UTMALDG), no
    16-bit or integer MMA, and 16-byte stores of the fp16 output by the vector epilogue."""
    from graphc.codegen.nvrtc import CompileJob, compile_all

    variants = [None, {"BN": 256}, {"BN": 128, "PINGPONG": 1}, {"BN": 256, "WARP_EPI": 1}]
    kernels = [gemm_sm90.fp8_gemm(1000, 520, 272, DType.float16, alpha=0.5, params=v) for v in variants]
    cubins = compile_all([CompileJob(k.name, k.source, "sm_90a") for k in kernels], cache_dir=tmp_path / "c")
    for v, cubin in zip(variants, cubins, strict=True):
        f = tmp_path / "k.cubin"
        f.write_bytes(cubin)
        out = subprocess.run([CUOBJDUMP, "-sass", str(f)], capture_output=True, text=True, check=True).stdout
        ops = _opcodes(out)
        assert re.search(r"QGMMA\.64x\d+x32\.F32\.E4M3\.E4M3", out), v
        assert "UTMALDG" in ops and not {"HMMA", "HGMMA", "IGMMA", "IMMA"} & ops, (v, sorted(ops))
        assert "STG.E.128" in out, v
