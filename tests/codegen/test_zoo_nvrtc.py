"""Every kernel of every zoo model, rendered for the CUDA target and compiled with NVRTC for sm_80
and sm_90 (no GPU needed; the kernel cache makes reruns cheap). One case builds for sm_90 alone
with GEMMs large enough for the wgmma (sm_90a) path."""

from __future__ import annotations

import pytest

import graphc
import models

try:
    from graphc.codegen.nvrtc import nvrtc_version

    nvrtc_version()
    HAVE_NVRTC = True
except Exception:
    HAVE_NVRTC = False

pytestmark = pytest.mark.skipif(not HAVE_NVRTC, reason="needs NVRTC (cuda-bindings)")

ARCHS = ["sm_80", "sm_90"]
SHAPES = {"bert": {"seq": 16}}
# Families each model must reach (a model silently losing its convs or GEMMs would still compile).
EXPECTED = {
    "mlp": {"gemm"},
    "resnet": {"conv", "pool"},
    "mobilenetv2": {"conv"},
    "bert": {"gemm", "attention"},
    "vit": {"gemm", "attention", "conv"},
}


def _check_engine(engine, archs: list[str]) -> None:
    ks = engine.kernels
    assert ks.sources, "no kernels"
    assert sorted(ks.cubins) == sorted(archs)
    launched = set()
    for arch in archs:
        # each arch's plan (an sm_90 plan may launch sm_90a kernels that no other arch has)
        mine = {ln.digest for s in engine.plan.for_arch(arch).steps for ln in s.launches}
        missing = mine - set(ks.cubins[arch])
        assert not missing, f"{len(missing)} kernels have no {arch} cubin"
        assert all(ks.cubins[arch].values()), f"an empty {arch} cubin"
        launched |= mine
    assert launched == set(ks.sources), "every launch has its kernel, every kernel is launched"
    for s in engine.plan.steps:
        assert s.alias or s.launches, f"step {s.name} launches nothing"


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("name", models.list_models())
def test_zoo_model_compiles_for_sm80_and_sm90(name: str, precision: str) -> None:
    model = models.build(name, size="tiny", batch=2)
    engine = graphc.compile(model, target="cuda", precision=precision, arch=ARCHS, shapes=SHAPES.get(name))
    _check_engine(engine, ARCHS)
    families = set(engine.kernels.families.values())
    assert EXPECTED[name] <= families, f"{name}: families {sorted(families)}"


def test_wgmma_gemms_of_a_hopper_only_engine_compile() -> None:
    # hidden 256 at batch 4 x seq 128: M = 512, N >= 256, K >= 256, the wgmma path's range
    sizes = {"hidden_size": 256, "intermediate_size": 512, "num_heads": 4, "num_layers": 1, "max_positions": 128}
    model = models.build("bert", size="tiny", batch=4, **sizes)
    engine = graphc.compile(model, target="cuda", precision="fp16", arch=["sm_90"], shapes={"seq": 128})
    _check_engine(engine, ["sm_90"])
    ks = engine.kernels
    wgmma = [d for d, a in ks.requires.items() if a == "sm_90a"]
    assert wgmma, "no sm_90a kernel"
    assert all("wgmma.mma_async" in ks.sources[d] for d in wgmma)
