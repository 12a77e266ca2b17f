"""The compiled kernels carry the PDL entry where it belongs: in every sm_90 cubin the grid
dependency wait (SASS ACQBULK, from griddepcontrol.wait) comes before the first global memory
access and the first branch or exit, and launch_dependents (PREEXIT) is there; sm_86 cubins have
neither. NVRTC and cuobjdump only (no GPU); kernels of several families (GEMM mma.sync and the
Hopper ones, attention, row-wise, elementwise, convolution, pooling, data movement)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

import graphc
import models
from helpers import cuobjdump_path

_MEMORY = re.compile(r"^(LDG|STG|LDGSTS|ATOMG|ATOM|RED|LD|ST|UTMALDG|UTMASTG|UBLKCP|UTMAPF|CCTL)\b")
_BRANCH = re.compile(r"^(BRA|EXIT|RET|CALL|JMP|BRX|BSSY|WARPSYNC|BAR)\b")


TOOL = cuobjdump_path()
pytestmark = pytest.mark.skipif(TOOL is None, reason="cuobjdump not installed (pip install nvidia-cuda-cuobjdump)")


def sass(cubin: bytes, tmp: Path) -> list[str]:
    """The opcodes (with their predicate dropped) of a single-kernel cubin, in order."""
    f = tmp / "k.cubin"
    f.write_bytes(cubin)
    out = subprocess.run([TOOL, "-sass", str(f)], capture_output=True, text=True, check=True).stdout
    ops = []
    for line in out.splitlines():
        m = re.match(r"\s*/\*[0-9a-f]{4,}\*/\s+(.*?);", line)
        if m:
            ops.append(re.sub(r"^@!?U?P\w+\s+", "", m.group(1).strip()))
    return ops


@pytest.fixture(scope="module")
def kernels():
    out = []
    # (model, builder options, batch, archs): an engine for Hopper alone takes the sm_90a wgmma GEMM
    cases = (
        ("bert", {}, 2, ["sm_90", "sm_86"]),
        ("resnet", {}, 2, ["sm_90", "sm_86"]),
        ("mlp", {"hidden": [2048], "in_features": 2048}, 2048, ["sm_90"]),
    )
    for name, opts, batch, archs in cases:
        m = models.build(name, size="tiny", **opts)
        feeds = models.sample_inputs(name, m, batch=batch)
        shapes = {k: v.shape for k, v in feeds.items()}
        out.append(graphc.compile(m, target="cuda", precision="fp16", arch=archs, shapes=shapes).kernels)
    return out


def test_sm90_kernels_wait_before_their_first_global_access(kernels, tmp_path):
    families, checked = set(), 0
    for ks in kernels:
        for digest, cubin in ks.cubins["sm_90"].items():
            ops = sass(cubin, tmp_path)
            name = ks.names[digest]
            assert "ACQBULK" in ops, f"{name}: no griddepcontrol.wait"
            assert "PREEXIT" in ops, f"{name}: no griddepcontrol.launch_dependents"
            wait = ops.index("ACQBULK")
            first_mem = next((i for i, op in enumerate(ops) if _MEMORY.match(op)), len(ops))
            first_branch = next((i for i, op in enumerate(ops) if _BRANCH.match(op)), len(ops))
            assert wait < first_mem, f"{name}: {ops[first_mem]} before the wait"
            assert wait < first_branch, f"{name}: {ops[first_branch]} before the wait"
            families.add(ks.families[digest])
            checked += 1
    assert {"gemm", "attention", "conv", "pool", "elementwise"} <= families, families
    assert any(a == "sm_90a" for ks in kernels for a in ks.requires.values())  # a wgmma GEMM among them
    assert checked >= 20


def test_sm86_kernels_have_no_grid_dependency_control(kernels, tmp_path):
    for ks in kernels:
        for digest, cubin in ks.cubins.get("sm_86", {}).items():
            ops = sass(cubin, tmp_path)
            assert "ACQBULK" not in ops and "PREEXIT" not in ops, ks.names[digest]
