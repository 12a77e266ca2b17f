"""Cluster split-K GEMMs without a GPU: the kernels of the GPU test cases (and the heuristic's
choices for the batch-1 linear layers) compile with NVRTC for sm_90 and sm_90a, one launch with no
workspace and a cluster of the K slices; parameter checks; the cost model charges each split-K
form what it does; an sm_90 engine plan puts small-M GEMMs on cluster split-K and an engine for
the default arch list keeps it to its sm_90 launches."""

from __future__ import annotations

import re

import pytest

import graphc
import models
from graphc.codegen.families import gemm_sm90
from graphc.codegen.families.gemm import (
    cluster_candidates,
    cluster_heuristic,
    estimate_seconds,
    problem_of,
    public,
    standalone_context,
    valid,
)
from graphc.codegen.kernel import family_for
from graphc.ir.types import DType
from tests.codegen.test_gemm_cluster_gpu import CASES

try:
    from graphc.codegen.nvrtc import compile_cubin, nvrtc_version

    nvrtc_version()
    HAVE_NVRTC = True
except Exception:
    HAVE_NVRTC = False

needs_nvrtc = pytest.mark.skipif(not HAVE_NVRTC, reason="needs NVRTC (cuda-bindings)")
LINEAR = [(m, n, k) for m in (128, 197) for n, k in ((768, 768), (2304, 768), (3072, 768), (768, 3072))]


def _prob(m: int, n: int, k: int, dtype=DType.float16):
    return problem_of(standalone_context("MatMul", [(m, k), (k, n)], dtype))


@needs_nvrtc
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_cluster_kernel_compiles(case):
    ctx = case.context()
    (k,) = family_for(ctx).generate(ctx)
    s = k.params["SPLITS"]
    wgmma = k.params["path"] == "wgmma"
    assert k.params["CLUSTER"] == 1 and "SERIAL" not in k.params
    assert k.params["requires_arch"] == ("sm_90a" if wgmma else "sm_90")
    assert k.workspace_bytes == 0 and "@workspace" not in k.args
    assert f"__cluster_dims__(1, 1, {s}) __launch_bounds__" in k.source and "_arrived" not in k.source
    assert k.grid[2] % s == 0 and k.grid[2] == s * problem_of(ctx).batch
    for arch in ("sm_90a",) if wgmma else ("sm_90", "sm_90a"):
        assert compile_cubin(k.source, k.name, arch)[:4] == b"\x7fELF"


def test_cluster_params_checked():
    prob = _prob(128, 768, 768)
    base = {"path": "mma", "BM": 64, "BN": 64, "BK": 32, "WM": 2, "WN": 2, "STAGES": 4}
    assert valid(prob, {**base, "SPLITS": 8, "CLUSTER": 1})
    assert not valid(prob, {**base, "SPLITS": 12, "CLUSTER": 1})  # more than the portable cluster of 8
    assert valid(prob, {"path": "wgmma", "BM": 64, "BN": 64, "BK": 64, "STAGES": 4, "SPLITS": 4, "CLUSTER": 1})
    assert not valid(prob, {"path": "wgmma", "BM": 64, "BN": 64, "BK": 64, "STAGES": 4, "SPLITS": 9, "CLUSTER": 1})
    fp32 = problem_of(standalone_context("MatMul", [(128, 768), (768, 768)], DType.float32))
    assert not valid(fp32, {"path": "simt", "BM": 64, "BN": 64, "BK": 8, "TM": 4, "TN": 4, "SPLITS": 4, "CLUSTER": 1})
    # the whole fp32 tile is staged in shared memory for the peers
    ctx = standalone_context(
        "MatMul", [(128, 768), (768, 768)], DType.float16, params={**base, "SPLITS": 4, "CLUSTER": 1}
    )
    (k,) = family_for(ctx).generate(ctx)
    assert k.shared_bytes >= 64 * (64 + 8) * 4


def test_cost_model_charges_each_split_form():
    """At the same tile and split count: the serial form (the last CTA sums every partial alone)
    costs more than the two-launch form, which costs more than the cluster form (measured order on
    an H200: docs/results/gemm_small_m_h200_2026-12-01.md)."""
    prob = _prob(128, 768, 768)
    base = {"path": "mma", "BM": 64, "BN": 64, "BK": 32, "WM": 2, "WN": 2, "STAGES": 4, "SPLITS": 6}
    serial = estimate_seconds(prob, {**base, "SERIAL": 1})
    two = estimate_seconds(prob, {**base, "SERIAL": 0})
    cluster = estimate_seconds(prob, {**base, "CLUSTER": 1})
    assert serial > two > cluster


@needs_nvrtc
@pytest.mark.parametrize("shape", LINEAR + [(128, 50257, 768)], ids=lambda s: "x".join(map(str, s)))
def test_cluster_heuristic_compiles(shape):
    prob = _prob(*shape)
    p = public(cluster_heuristic(prob))
    assert p in [public(q) for q in cluster_candidates(prob)]
    ctx = standalone_context("MatMul", [(shape[0], shape[2]), (shape[2], shape[1])], DType.float16, params=p)
    for k in family_for(ctx).generate(ctx):
        assert compile_cubin(k.source, k.name, k.params.get("requires_arch", "sm_90"))[:4] == b"\x7fELF"


def _bert_b1(archs):
    model = models.build(
        "bert",
        size="tiny",
        batch=1,
        vocab_size=512,
        hidden_size=256,
        intermediate_size=1024,
        num_heads=4,
        num_layers=1,
        max_positions=128,
    )
    return graphc.compile(model, target="cuda", precision="fp16", arch=archs, shapes={"seq": 128})


@needs_nvrtc
def test_engine_plans_take_cluster_split_k_on_sm90_only():
    eng = _bert_b1(["sm_80", "sm_90"])
    plan = eng.plan
    own = [s for s in plan.steps if s.arch_launches]
    clustered = [
        s.name for s in own for ln in s.arch_launches["sm_90"] if ln.family == "gemm" and ln.params.get("CLUSTER")
    ]
    assert clustered, [s.name for s in own]
    # the default launches (sm_80 here) never carry a cluster kernel: it needs sm_90
    assert not any(ln.params.get("CLUSTER") for s in plan.steps for ln in s.launches)
    for s in own:
        for ln in s.arch_launches["sm_90"]:
            if ln.params.get("CLUSTER"):
                src = eng.kernels.sources[ln.digest]
                assert re.search(r"__cluster_dims__\(1, 1, (\d)\)", src).group(1) == str(ln.params["SPLITS"])
                assert ln.grid[2] % ln.params["SPLITS"] == 0


def test_sm90_small_m_rules():
    """The measured rules of gemm_sm90.small_m_params on the batch-1 linear layers and lm_head."""
    from graphc.ops.registry import get_op

    want = {  # (kernel, K slices across a cluster) as measured fastest on the H200
        (128, 768, 768): ("wgmma", 4),
        (197, 768, 768): ("wgmma", 4),
        (128, 2304, 768): ("wgmma", 3),
        (128, 3072, 768): ("wgmma", 2),
        (197, 2304, 768): ("wgmma", 2),
        (197, 3072, 768): ("wgmma", 2),
        (128, 768, 3072): ("tma", 8),
        (197, 768, 3072): ("tma", 8),
    }
    for (m, n, k), (kind, splits) in want.items():
        prob = _prob(m, n, k)
        assert gemm_sm90.small_m(prob)
        got, p = gemm_sm90.small_m_params(prob)
        assert (got if got == "tma" else p["path"], p["SPLITS"]) == (kind, splits), ((m, n, k), got, p)
        if got != "tma":
            assert p["CLUSTER"] == 1 and (p["BM"], p["BN"]) == (64, 64)
    # rows that are not 16-byte aligned (no wgmma, no TMA): mma.sync with cluster split-K
    got, p = gemm_sm90.small_m_params(_prob(128, 770, 768))
    assert got == "gemm" and p["path"] == "mma" and p["CLUSTER"] == 1
    # lm_head: B [N, K] takes TMA; B [K, N] with an odd N (no 16-byte rows) the 128 x 64 mma.sync tile
    kmaj = standalone_context(
        "MatMul",
        [(128, 768), (50257, 768)],
        DType.float16,
        domain="graphc",
        attrs=get_op("MatMul", "graphc").attrs(trans_b=1),
    )
    assert gemm_sm90.small_m_params(problem_of(kmaj))[0] == "tma"
    kind, p = gemm_sm90.small_m_params(_prob(128, 50257, 768))
    assert kind == "gemm" and (p["BM"], p["BN"], p["SPLITS"]) == (128, 64, 1)
    assert not gemm_sm90.small_m(_prob(4096, 768, 768))
    assert not gemm_sm90.small_m(_prob(128, 128, 64))  # below the measured range: the default path
    assert not gemm_sm90.small_m(problem_of(standalone_context("MatMul", [(128, 64), (64, 64)], DType.float32)))


def test_deep_k_cluster_switch(monkeypatch):
    """DEEP_K_CLUSTER puts K >= 3072 batch-1 GEMMs on the wgmma kernel with 8 K slices as one cluster
    (the row-norm epilogue's deep tile) instead of the TMA GEMM and its reduce launch; off by default."""
    prob = _prob(128, 768, 3072)
    assert gemm_sm90.small_m_params(prob)[0] == "tma"
    monkeypatch.setattr(gemm_sm90, "DEEP_K_CLUSTER", True)
    kind, p = gemm_sm90.small_m_params(prob)
    assert kind == "gemm" and p["path"] == "wgmma" and (p["SPLITS"], p["CLUSTER"]) == (8, 1)
    assert gemm_sm90.rownorm_params(prob) == p
    # 197 x 3072: 4 x 48 tiles x 8 slices exceed two waves of CTAs, so the TMA rule stays
    assert gemm_sm90.small_m_params(_prob(197, 3072, 3072))[0] == "tma"
    # K = 768 problems keep the small-M cluster rule
    assert gemm_sm90.small_m_params(_prob(128, 768, 768))[1]["SPLITS"] == 4
