"""The engine checks one by one: each mutation found by the campaign of issue 15 is refused with a
one-line EngineError that says what is wrong (the fuzz tests cover them at random)."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
import warnings
import zipfile

import numpy as np
import pytest

import graphc
import graphc.runtime
import models
from graphc.runtime import EngineError
from graphc.runtime.container import Limits, make_comment
from graphc.runtime.format import read_engine


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    m = models.build("bert", size="tiny")
    feeds = models.sample_inputs("bert", m)
    shapes = {k: v.shape for k, v in feeds.items()}
    d = tmp_path_factory.mktemp("checks")
    cpu = graphc.compile(m, target="cpu", shapes=shapes)
    cpu.save(d / "cpu.engine")
    graphc.compile(m, target="cuda", arch=["sm_80"], shapes=shapes).save(d / "cuda.engine")
    return d / "cpu.engine", d / "cuda.engine", feeds, cpu.run(feeds)


def rewrite(src, dst, edit=None, extra=(), reseal=True, first=()):
    """Copy an engine, editing its manifest (resealed: the digest recomputed) and adding members."""
    with zipfile.ZipFile(src) as z:
        items = [(n, z.read(n)) for n in z.namelist()]
        comment = z.comment
    if edit:
        m = json.loads(dict(items)["manifest.json"])
        edit(m)
        items = [(n, json.dumps(m).encode() if n == "manifest.json" else d) for n, d in items]
    with warnings.catch_warnings(), zipfile.ZipFile(dst, "w") as z:
        warnings.simplefilter("ignore", UserWarning)  # duplicate names are the point
        raw = dict(items)["manifest.json"]
        z.comment = make_comment(hashlib.sha256(raw).hexdigest()) if reseal else comment
        for n, d in [*first, *items, *extra]:
            with z.open(zipfile.ZipInfo(n), "w") as f:
                f.write(d)
    return dst


def refused(path, match, **kw):
    with pytest.raises(EngineError, match=match) as e:
        read_engine(path, **kw)
    assert "\n" not in str(e.value)
    return str(e.value)


def test_a_second_manifest_member_is_refused(engines, tmp_path):
    cpu, *_ = engines

    def evil(m):
        m["plan"]["outputs"] = ["input_ids"]

    # the evil copy first or last: either way the name appears twice
    with zipfile.ZipFile(rewrite(cpu, tmp_path / "evil.engine", evil)) as z:
        evil_bytes = z.read("manifest.json")
    refused(rewrite(cpu, tmp_path / "a.engine", extra=[("manifest.json", evil_bytes)]), "appears twice")
    refused(rewrite(cpu, tmp_path / "b.engine", first=[("manifest.json", evil_bytes)]), "appears twice")


def test_an_unlisted_huge_member_is_refused_before_decompression(engines, tmp_path):
    cpu, *_ = engines
    p = rewrite(cpu, tmp_path / "big.engine")
    with zipfile.ZipFile(p, "a", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr("kernels/" + "0" * 64 + ".cu", b"\0" * (64 * 2**20))
    t = time.perf_counter()
    refused(p, "compresses")
    refused(p, "over the limit", limits=Limits(2**20))
    assert time.perf_counter() - t < 1.0  # nothing was decompressed
    refused(rewrite(cpu, tmp_path / "x.engine", extra=[("notes.txt", b"hi")]), "unexpected member")
    refused(rewrite(cpu, tmp_path / "y.engine", extra=[("../../etc/passwd", b"hi")]), "unexpected member")


def test_the_manifest_digest_covers_the_manifest(engines, tmp_path):
    cpu, *_ = engines

    def edit(m):
        m["memory"]["placements"][next(iter(m["memory"]["placements"]))]["offset"] += 256

    refused(rewrite(cpu, tmp_path / "a.engine", edit, reseal=False), "manifest digest")
    with zipfile.ZipFile(rewrite(cpu, tmp_path / "b.engine"), "a") as z:
        z.comment = b""
    refused(tmp_path / "b.engine", "no manifest digest")


def _retarget(m, name):
    """Point output 0 at another tensor, its I/O spec made to agree (so only the meaning is off)."""
    t = m["plan"]["tensors"][name]
    m["plan"]["outputs"][0] = name
    m["outputs"][0].update(dtype=t["dtype"], shape=t["shape"])


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (lambda m: m["plan"].__setitem__("tensors", list(m["plan"]["tensors"].values())), "Expected `object`"),
        (lambda m: m["memory"].__setitem__("arena_bytes", "4096"), r"Expected `int`, got `str` - at `\$.memory"),
        (lambda m: next(iter(m["plan"]["tensors"].values())).__setitem__("dtype", 7), "dtypes|Expected `str`"),
        (lambda m: next(iter(m["plan"]["tensors"].values())).__setitem__("dtype", "object"), "Invalid enum value"),
        (lambda m: m["plan"]["steps"][0].__setitem__("op", None), r"steps\[0\].op"),
        (lambda m: m["plan"]["steps"][0].__setitem__("attrs", [1, 2]), r"steps\[0\].attrs"),
        (lambda m: m["plan"]["steps"][0].__setitem__("extra", 1), "unknown field"),
        (lambda m: m["memory"].__setitem__("arena_bytes", 2**40), "over the limit"),
        (lambda m: m["plan"].__setitem__("outputs", []), r"length >= 1 - at `\$.plan.outputs`"),
        # the step that made the real output is left dead, and live ranges no longer match
        (lambda m: _retarget(m, "embeddings.LayerNorm.bias"), "nothing reads|planned live"),
        (lambda m: _retarget(m, "input_ids"), "nothing reads|planned live"),
        (lambda m: _retarget(m, "embeddings/Add_1_output_0"), "nothing reads|planned live"),
        (lambda m: m["plan"]["steps"].pop(3), "index|before any step writes"),
        (lambda m: m["plan"]["steps"].reverse(), "index|before any step writes"),
    ],
)
def test_meaningless_manifests_are_refused(engines, tmp_path, edit, match):
    cpu, *_ = engines
    refused(rewrite(cpu, tmp_path / "m.engine", edit), match)


def test_overlapping_live_placements_are_refused(engines, tmp_path):
    cpu, *_ = engines

    def overlap(m):
        pl = m["memory"]["placements"]
        a, b = pl["input_ids"], pl["attention_mask"]  # both live from the start
        a["offset"] = b["offset"]

    refused(rewrite(cpu, tmp_path / "o.engine", overlap), "share arena bytes|planned live")


def test_a_changed_arena_dtype_is_refused(engines, tmp_path):
    cpu, cuda, feeds, _ = engines
    for path, name in ((cpu, "c.engine"), (cuda, "g.engine")):
        with zipfile.ZipFile(path) as z:
            m = json.loads(z.read("manifest.json"))
        target = next(n for n, t in m["plan"]["tensors"].items() if t["kind"] == "arena" and t["dtype"] == "float32")

        def edit(m, target=target):
            m["plan"]["tensors"][target]["dtype"] = "int32"

        p = rewrite(path, tmp_path / name, edit)
        if path == cuda:
            refused(p, "takes float\\* for")
        else:
            # a CPU step is a numpy reference: it is held to the declared dtype when it runs
            with pytest.raises(EngineError, match="the plan says int32"):
                graphc.runtime.load(p).run(feeds)


def test_cubins_only_at_their_paths_and_weights_in_their_dtype(engines, tmp_path):
    _, cuda, *_ = engines
    with zipfile.ZipFile(cuda) as z:
        cubin = next(n for n in z.namelist() if n.endswith(".cubin"))
    odd = cubin.replace("sm_80", "sm_75")

    def move(m):
        m["members"][odd] = m["members"].pop(cubin)

    with zipfile.ZipFile(cuda) as z:
        data = z.read(cubin)
    p = rewrite(cuda, tmp_path / "c.engine", move, extra=[(odd, data)])
    with zipfile.ZipFile(p) as z:  # drop the original entry by rebuilding without it
        items = [(i.filename, z.read(i)) for i in z.infolist() if i.filename != cubin]
        comment = z.comment
    with zipfile.ZipFile(p, "w") as z:
        z.comment = comment
        for n, d in items:
            z.writestr(n, d)
    refused(p, "not a kernel of this engine for its archs")

    def wdtype(m):
        w = next(t for t in m["plan"]["tensors"].values() if t["kind"] == "weight" and t["dtype"] == "float32")
        w["dtype"] = "int32"

    # refused by the weight's bytes, or first by a typed kernel's parameter (the fused word lookup)
    refused(rewrite(cuda, tmp_path / "w.engine", wdtype), "stored as float32|which is int32")


def test_engines_round_trip_and_validate(engines):
    cpu, cuda, feeds, expected = engines
    out = graphc.runtime.load(cpu).run(feeds)
    for k in expected:
        np.testing.assert_array_equal(out[k], expected[k])
    ef = read_engine(cuda)
    assert ef.manifest["target"] == "cuda" and ef.cubins["sm_80"]


def test_runtime_jit_compiles_kept_sources_without_the_compiler(engines):
    """The JIT on a GPU with no cubin is the runtime's own NVRTC call: it produces the same kind of
    cubin (an ELF) from the engine's kept source, and importing it imports no compiler module."""
    _, cuda, *_ = engines
    from graphc.runtime.jit import jit_kernels

    ef = read_engine(cuda)
    names = {d: k["name"] for d, k in ef.manifest["kernels"].items()}
    d = next(iter(ef.sources))
    out = jit_kernels({d: ef.sources[d]}, names, {}, "sm_86", ["sm_80"], cuda)
    assert out[d][:4] == b"\x7fELF"
    code = (
        "import sys, graphc.runtime.jit, graphc.runtime.format, graphc.runtime.validate, graphc.runtime.signing\n"
        "compiler = ('graphc.codegen', 'graphc.ir', 'graphc.ops', 'onnx', 'jinja2')\n"
        "bad = [m for m in sys.modules if m.startswith(compiler)]\n"
        "print(bad); sys.exit(1 if bad else 0)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("op", ["NoSuchOp", "dataclass", "register_op"])
def test_a_cpu_step_op_outside_the_kernel_table_is_refused_at_load(engines, tmp_path, op):
    cpu, *_ = engines

    def edit(m):
        m["plan"]["steps"][0]["op"] = op

    # (step 0 may be a fused node, domain graphc: the word lookup with its adds)
    refusal = f"cannot build its {op} kernel|op '{op}' \\(domain '[a-z]*'\\) has no CPU kernel"
    with pytest.raises(EngineError, match=refusal) as e:
        graphc.runtime.load(rewrite(cpu, tmp_path / "op.engine", edit))
    assert "\n" not in str(e.value)


def test_a_reshaped_intermediate_is_refused(engines, tmp_path):
    cpu, _, feeds, _ = engines

    def edit(m):
        t = next(t for t in m["plan"]["tensors"].values() if t["kind"] == "arena" and len(t["shape"]) == 3)
        t["shape"] = [t["shape"][0] * t["shape"][1], t["shape"][2]]  # same bytes, other shape

    with pytest.raises(EngineError, match="the plan says|not a view of all"):
        graphc.runtime.load(rewrite(cpu, tmp_path / "r.engine", edit)).run(feeds)


def test_a_gather_of_even_float32_rows_validates_when_read_back(tmp_path):
    """The gather kernel moves rows of an even number of float32s as 8-byte words (its element
    type unsigned long long); reading the engine back accepted such containers only for 8-byte
    dtypes, so a saved engine with this Gather could not be loaded."""
    from onnx import TensorProto, helper, numpy_helper

    w = np.arange(48, dtype=np.float32).reshape(8, 6)
    g = helper.make_graph(
        [helper.make_node("Gather", ["w", "i"], ["y"], axis=0)],
        "g",
        [helper.make_tensor_value_info("i", TensorProto.INT64, [3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 6])],
        [numpy_helper.from_array(w, "w")],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path / "g.engine"
    graphc.compile(m, target="cuda", arch=["sm_90"]).save(path)
    sources = read_engine(path).sources
    assert any("unsigned long long" in s or "gc_u64" in s for s in sources.values())
