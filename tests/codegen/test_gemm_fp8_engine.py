"""An fp8 CUDA engine without a GPU (issue 13 items 2 and 4): its MatMuls become gemm_fp8 steps on
the sm_90a TMA GEMM, whose cubins run the FP8 warpgroup MMA (QGMMA ... E4M3.E4M3 in SASS: Hopper's
fp8 wgmma; no 16-bit or integer MMA), the activation quantize is the saturating e4m3 conversion
(F2FP.SATFINITE.E4M3), fused into the GEMM that makes the next GEMM's input, and what the engine
cannot build is refused in one line. The numbers are checked on the CPU engine, which runs the same
arithmetic (tests/passes/test_quantize_fp8.py)."""

from __future__ import annotations

import re
import subprocess

import numpy as np
import pytest

import graphc
from graphc.errors import CompileError
from helpers import cuobjdump_path, have_nvrtc, residual_mlp_model

HAVE_NVRTC = have_nvrtc()

CUOBJDUMP = cuobjdump_path()
needs_nvrtc = pytest.mark.skipif(not HAVE_NVRTC, reason="needs NVRTC (cuda-bindings)")
RNG = np.random.default_rng(0)


def _opcodes(text: str) -> set[str]:
    return set(re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", text))


def _engine(m: int = 256, d: int = 256, h: int = 512, **kw):
    model, _ = residual_mlp_model(m, d, h, RNG)
    feeds = [{"x": RNG.standard_normal((m, d)).astype(np.float32)} for _ in range(2)]
    return graphc.compile(model, target="cuda", precision="fp8", calibration_data=feeds, **kw)


@needs_nvrtc
@pytest.mark.skipif(CUOBJDUMP is None, reason="cuobjdump not found: pip install nvidia-cuda-cuobjdump")
def test_fp8_engine_cubins_use_the_fp8_wgmma(tmp_path):
    eng = _engine(arch=["sm_90"], cache_dir=str(tmp_path / "c"))
    assert eng.build_info["precision"] == "fp8" and eng.report["cuda"]["archs"] == ["sm_90"]
    q = eng.report["quantization"]
    assert q["fp8_gemms"] == 2 and q["activation_quantize"] == {"in_producer_epilogue": 1, "own_kernel": 1}
    seen: dict[str, str] = {}
    for s in eng.plan.for_arch("sm_90").steps:
        for ln in s.launches:
            f = tmp_path / f"{ln.kernel}.cubin"
            f.write_bytes(eng.kernels.cubins["sm_90"][ln.digest])
            out = subprocess.run([CUOBJDUMP, "-sass", str(f)], capture_output=True, text=True, check=True).stdout
            ops = _opcodes(out)
            outs = [eng.plan.tensors[o].dtype for o in s.outputs]
            if ln.family == "gemm_fp8":
                assert ln.params["path"] == "fp8_tma" and ln.params["requires_arch"] == "sm_90a"
                assert re.search(r"QGMMA\.64x\d+x32\.F32\.E4M3\.E4M3", out), s.name
                assert "UTMALDG" in ops and not {"HMMA", "HGMMA", "IGMMA", "IMMA"} & ops, (s.name, sorted(ops))
                assert [eng.plan.tensors[i].dtype for i in s.inputs[:2]] == ["float8_e4m3fn"] * 2
            if outs == ["float8_e4m3fn"]:  # the quantize: its own kernel, or the first GEMM's epilogue
                assert "F2FP.SATFINITE.E4M3.F32.PACK_AB_MERGE_C" in out, s.name
            seen[s.name] = f"{ln.family}:{outs[0]}"
    # the input's quantize (with the input's fp32 -> fp16 cast) is one elementwise kernel; the first
    # GEMM writes the second one's e4m3 input itself (bias, Relu, quantize in its epilogue); the
    # second GEMM's epilogue adds the residual and stores fp16
    assert sorted(seen.values()) == sorted(
        ["elementwise:float8_e4m3fn", "gemm_fp8:float8_e4m3fn", "gemm_fp8:float16", "elementwise:float32"]
    ), seen


@needs_nvrtc
def test_without_an_arch_an_fp8_engine_is_for_sm_90_only(tmp_path):
    eng = _engine(64, 64, 128, cache_dir=str(tmp_path / "c"))  # no GPU here: not the default arch list
    assert eng.report["cuda"]["archs"] == ["sm_90"]


@pytest.mark.parametrize(
    ("archs", "match"),
    [
        (["sm_80"], "arch sm_80 has no FP8 tensor cores"),
        (["sm_90", "sm_86"], "arch sm_86 has no FP8 tensor cores"),
        (["sm_89"], "arch sm_89 has FP8 tensor cores .*sm_90a wgmma"),
    ],
)
def test_other_archs_are_refused_in_one_line(archs, match):
    with pytest.raises(CompileError, match=match) as ei:
        _engine(64, 64, 128, arch=archs)
    assert "\n" not in str(ei.value) and "--arch sm_90" in str(ei.value)


@needs_nvrtc
def test_unaligned_k_stays_fp16_on_cuda(tmp_path):
    """K = 72 (not a multiple of 16: no TMA rows): the first layer stays an fp16 GEMM, the second
    (K = 128) is fp8."""
    eng = _engine(128, 72, 128, arch=["sm_90"], cache_dir=str(tmp_path / "c"))
    assert eng.report["quantization"]["fp8_gemms"] == 1
    fams = sorted(ln.family for s in eng.plan.steps for ln in s.launches if ln.family.startswith("gemm"))
    assert fams == ["gemm", "gemm_fp8"]


def test_non_saturating_cast_to_e4m3_has_no_cuda_form():
    from onnx import TensorProto, helper

    node = helper.make_node("Cast", ["x"], ["y"], to=TensorProto.FLOAT8E4M3FN, saturate=0)
    g = helper.make_graph(
        [node],
        "c",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT8E4M3FN, [4])],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    with pytest.raises(CompileError, match="saturate=0 has no CUDA form"):
        graphc.compile(m, target="cuda", arch=["sm_90"])
