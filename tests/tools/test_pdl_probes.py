"""The PDL probes of 2026-12-04 stay runnable (no GPU here): tools/probe_pdl_cluster.py's kernels
compile with NVRTC for every cluster shape it takes, and the texts tools/probe_conv_cluster_pdl.py
patches are in the split-K convolution cluster kernel graphc builds today (a template change that
drops one would make the probe exit before it measures anything)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))

import probe_conv_cluster_pdl as conv_probe  # noqa: E402
import probe_pdl_cluster as probe  # noqa: E402

pytest.importorskip("cuda.bindings.nvrtc")


@pytest.mark.parametrize("cluster", [(1, 1, 4), (1, 8, 1), (2, 1, 1)])
def test_probe_kernels_compile(cluster):
    cubin = probe.compile_cubin("sm_90", cluster)
    assert cubin[:4] == b"\x7fELF"


def test_probe_takes_reader_grids_that_are_whole_clusters():
    assert probe.reader_shapes("1,8,1", "8,8,1") == ((1, 8, 1), (8, 8, 1))
    for cluster, grid in (("1,8,1", "8,4,1"), ("1,1", "8,1,1"), ("1,0,1", "8,8,1"), ("a,b,c", "1,1,1")):
        with pytest.raises(SystemExit, match="multiple of the cluster"):
            probe.reader_shapes(cluster, grid)


def test_conv_probe_patches_match_the_cluster_kernel():
    import graphc
    from tests.codegen.test_conv_serial_split_gpu import _model

    eng = graphc.compile(_model(), target="cuda", precision="fp16", arch=["sm_90"])
    convs = [ln for s in eng.plan.steps for ln in s.launches_for("sm_90") if ln.family == "conv"]
    assert len(convs) == 1 and convs[0].params.get("CLUSTER") == 1, [ln.params for ln in convs]
    src = eng.kernels.sources[convs[0].digest]
    assert "__cluster_dims__" in src
    for variant, (old, _new) in conv_probe.PATCHES.items():
        assert old in src, variant
    assert set(conv_probe.VARIANTS) >= {"plain", "pdl", *conv_probe.PATCHES}
