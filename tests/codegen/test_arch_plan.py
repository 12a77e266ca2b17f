"""One engine, a plan per arch (issue 10 item 4), without a GPU: an engine built with the default
arch list carries sm_90a launches (the TMA GEMM) for sm_90 and today's kernels for the older archs,
one memory plan for all; the manifest round-trips them and is checked; the loader's choice of
launches for each GPU arch; a JIT for a newer arch compiles only the kernels it launches."""

from __future__ import annotations

import hashlib
import json
import zipfile

import pytest

import graphc
import models
from graphc.codegen.nvrtc import DEFAULT_ARCHS
from graphc.inspect import describe_engine
from graphc.runtime.container import make_comment
from graphc.runtime.cuda import choose_launches, cubin_arch_for
from graphc.runtime.errors import EngineError
from graphc.runtime.format import read_engine
from graphc.runtime.jit import jit_kernels

try:
    from graphc.codegen.nvrtc import nvrtc_version

    nvrtc_version()
    HAVE_NVRTC = True
except Exception:
    HAVE_NVRTC = False

pytestmark = pytest.mark.skipif(not HAVE_NVRTC, reason="needs NVRTC (cuda-bindings)")

# One encoder layer at batch 32 x 128 tokens: M = 4096, so gemm_sm90.selected puts every GEMM on
# the TMA kernel for sm_90, while the older archs keep mma.sync.
SIZES = {"hidden_size": 256, "intermediate_size": 1024, "num_heads": 4, "num_layers": 1, "max_positions": 128}


def _bert(archs: list[str] | None):
    model = models.build("bert", size="tiny", batch=32, vocab_size=512, **SIZES)
    return graphc.compile(model, target="cuda", precision="fp16", arch=archs, shapes={"seq": 128})


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    eng = _bert(list(DEFAULT_ARCHS))
    path = tmp_path_factory.mktemp("archplan") / "bert.engine"
    eng.save(path)
    return eng, path


def _paths(launches) -> list:
    return [ln.params.get("path") for ln in launches if ln.family == "gemm" and not ln.params.get("reduce")]


def test_default_arch_engine_has_sm90_launches(built):
    eng, _ = built
    plan, ks = eng.plan, eng.kernels
    assert eng.build_info["archs"] == list(DEFAULT_ARCHS)
    assert plan.launch_archs() == ["sm_90"]
    own = [s for s in plan.steps if s.arch_launches]
    # q/k/v (one batched GEMM: passes/fuse_horizontal.py), attention output, FFN in and out; and the
    # attention itself (the wgmma kernel, templates/attention_sm90.cu.j2)
    attn = [s for s in own if s.op == "Attention"]
    assert len(attn) == 1 and [ln.params["path"] for ln in attn[0].arch_launches["sm_90"]] == ["sm90"]
    assert [ln.params["path"] for ln in attn[0].launches] == ["flash"]
    own = [s for s in own if s.op != "Attention"]
    assert len(own) == 4, [s.name for s in own]
    for s in own:
        assert _paths(s.arch_launches["sm_90"])[0] == "tma", s.name
        assert all(ln.params.get("path") != "tma" for ln in s.launches), s.name
        assert all(ks.requires.get(ln.digest) is None for ln in s.launches), s.name
    gemms = [ln for s in plan.steps for ln in s.launches if ln.family == "gemm"]
    assert gemms and all(ln.params.get("path") == "mma" for ln in gemms)
    # every arch holds the cubins of exactly the kernels it launches; sm_90a ones only under sm_90
    for arch in DEFAULT_ARCHS:
        assert set(ks.cubins[arch]) == ks.digests_for(arch), arch
        launched = {ln.digest for s in plan.for_arch(arch).steps for ln in s.launches}
        assert launched == ks.digests_for(arch), arch
    hopper_only = {d for d, a in ks.requires.items() if a == "sm_90a"}
    assert hopper_only and hopper_only <= set(ks.cubins["sm_90"])
    assert not hopper_only & (set(ks.cubins["sm_80"]) | set(ks.cubins["sm_89"]))
    assert eng.report["cuda"]["arch_steps"] == {"sm_80": 0, "sm_86": 0, "sm_89": 0, "sm_90": 5}


def test_one_memory_plan_sized_for_every_arch(built):
    eng, _ = built
    need = max(sk.workspace_bytes for a in DEFAULT_ARCHS for sk in eng.kernels.step_kernels(a).values())
    assert need > 0  # the TMA GEMM of the FFN output (K = 1024, 64 tiles) splits K through the workspace
    assert eng.memory.workspace_bytes >= need
    for s in eng.plan.steps:
        per_arch = [eng.kernels.step_kernels(a)[s.name].workspace_bytes for a in DEFAULT_ARCHS if not s.alias]
        assert s.alias or s.workspace_bytes == max(per_arch), s.name


def test_manifest_round_trips_arch_launches(built):
    eng, path = built
    ef = read_engine(path)
    assert [s.arch_launches for s in ef.plan.steps] == [s.arch_launches for s in eng.plan.steps]
    assert [s.launches for s in ef.plan.steps] == [s.launches for s in eng.plan.steps]
    assert ef.cubins == eng.kernels.cubins
    text = describe_engine(ef, "bert.engine")
    launches_80 = sum(len(s.launches) for s in eng.plan.steps)
    assert f"sm_80: {launches_80} launches of" in text
    assert "(5 steps with launches of their own)" in text  # 4 GEMMs and the attention
    assert "sm_90 gemm:" in text  # the per-arch launch lines


@pytest.mark.parametrize(
    ("device", "expected", "tma"),
    [
        ("sm_90", "sm_90", True),
        ("sm_80", "sm_80", False),
        ("sm_86", "sm_86", False),
        ("sm_87", "sm_86", False),  # no sm_87 cubins: the newest older one of major 8
        ("sm_89", "sm_89", False),
        ("sm_100", "sm_100", False),  # no cubin of major 10: its default launches, JIT-compiled
        ("sm_120", "sm_120", False),
    ],
)
def test_loader_takes_the_launches_of_its_gpu(built, device, expected, tma):
    eng, path = built
    ef = read_engine(path)
    arch, plan = choose_launches(ef.plan, ef.cubins, device)
    assert arch == expected
    paths = [p for s in plan.steps for p in _paths(s.launches)]
    assert ("tma" in paths) == tma, paths
    assert all(not s.arch_launches for s in plan.steps)
    assert [s.launches for s in plan.steps] == [s.launches_for(expected) for s in eng.plan.steps]


def test_cubin_arch_never_crosses_a_major_version():
    assert cubin_arch_for("sm_90", ["sm_80", "sm_86", "sm_89"]) is None
    assert cubin_arch_for("sm_89", ["sm_80", "sm_86", "sm_90"]) == "sm_86"
    assert cubin_arch_for("sm_86", ["sm_89", "sm_90"]) is None  # a newer minor's cubin does not run
    assert cubin_arch_for("sm_90", ["sm_90"]) == "sm_90"


def test_jit_for_a_newer_gpu_compiles_only_its_launches(built):
    """A Blackwell GPU has no cubin in a default-arch engine: its launches are the default ones, and
    the kept sources of just those are compiled (the sm_90a kernels cannot be, and are not needed)."""
    _, path = built
    ef = read_engine(path)
    arch, plan = choose_launches(ef.plan, ef.cubins, "sm_100")
    digests = sorted({ln.digest for s in plan.steps for ln in s.launches})
    names = {d: k["name"] for d, k in ef.manifest["kernels"].items()}
    assert not any(ef.manifest["kernels"][d]["requires_arch"] for d in digests)
    needs = {d: k.get("requires_arch") for d, k in ef.manifest["kernels"].items()}
    cubins = jit_kernels({d: ef.sources[d] for d in digests}, names, needs, arch, sorted(ef.cubins), path)
    assert sorted(cubins) == digests and all(cubins.values())


def test_engine_without_hopper_has_no_arch_launches():
    eng = _bert(["sm_80", "sm_86"])
    assert eng.plan.launch_archs() == []
    assert not eng.kernels.requires
    assert sorted(eng.kernels.cubins) == ["sm_80", "sm_86"]


def test_hopper_only_engine_runs_sm90a_by_default():
    eng = _bert(["sm_90"])
    assert eng.plan.launch_archs() == []  # sm_90a is the default when it is the only arch
    assert "tma" in [p for s in eng.plan.steps for p in _paths(s.launches)]


def _rewrite(path, out, edit):
    """The engine with its manifest edited and resealed (digest recomputed): the plan checks are tested."""
    with zipfile.ZipFile(path) as z:
        items = {n: z.read(n) for n in z.namelist()}
    m = json.loads(items["manifest.json"])
    edit(m)
    items["manifest.json"] = json.dumps(m).encode()
    with zipfile.ZipFile(out, "w") as z:
        z.comment = make_comment(hashlib.sha256(items["manifest.json"]).hexdigest())
        for n, d in items.items():
            z.writestr(n, d)
    return out


def _own_step(m) -> dict:
    return next(s for s in m["plan"]["steps"] if s["arch_launches"])


def _bad_arch(m):
    s = _own_step(m)
    s["arch_launches"]["gpu9"] = s["arch_launches"].pop("sm_90")


def _unknown_kernel(m):
    _own_step(m)["arch_launches"]["sm_90"][0]["digest"] = "0" * 64


def _empty(m):
    _own_step(m)["arch_launches"]["sm_90"] = []


def _bad_geometry(m):
    _own_step(m)["arch_launches"]["sm_90"][0]["block"] = [2048, 1, 1]


def _not_a_table(m):
    _own_step(m)["arch_launches"] = [1, 2]


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (_not_a_table, "arch_launches"),
        (_bad_arch, "arch_launches"),
        (_unknown_kernel, "that the engine does not hold"),
        (_empty, "arch_launches"),
        (_bad_geometry, "exceeds device limits"),
    ],
)
def test_arch_launches_are_validated(built, tmp_path, edit, message):
    _, path = built
    bad = _rewrite(path, tmp_path / "bad.engine", edit)
    with pytest.raises(EngineError, match=message):
        read_engine(bad)
