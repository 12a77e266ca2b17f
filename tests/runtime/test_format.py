"""Engine files: save/load round trips, and corrupt engines rejected with EngineError, never a crash."""

from __future__ import annotations

import hashlib
import json
import random
import zipfile

import numpy as np
import pytest

import graphc
import graphc.runtime
import models
from graphc.runtime import EngineError
from graphc.runtime.container import make_comment


@pytest.fixture(scope="module")
def bert_engine(tmp_path_factory):
    m = models.build("bert", size="tiny")
    feeds = models.sample_inputs("bert", m)
    eng = graphc.compile(m, target="cpu", shapes={k: v.shape for k, v in feeds.items()})
    path = tmp_path_factory.mktemp("eng") / "bert.engine"
    eng.save(path)
    return eng, feeds, path


def test_round_trip_gives_identical_outputs(bert_engine):
    eng, feeds, path = bert_engine
    loaded = graphc.runtime.load(path)
    a, b = eng.run(feeds), loaded.run(feeds)
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])
    assert [s.name for s in loaded.inputs] == [s.name for s in eng.inputs]
    assert loaded.report["memory"]["arena_bytes"] == eng.report["memory"]["arena_bytes"]


def test_run_validates_inputs(bert_engine):
    eng, feeds, _ = bert_engine
    bad = dict(feeds)
    bad["input_ids"] = feeds["input_ids"].astype(np.int32)
    with pytest.raises(graphc.runtime.EngineInputError, match="dtype"):
        eng.run(bad)
    bad["input_ids"] = feeds["input_ids"][:, :3]
    with pytest.raises(graphc.runtime.EngineInputError, match="shape"):
        eng.run(bad)
    with pytest.raises(graphc.runtime.EngineInputError, match="missing"):
        eng.run({})


def _rewrite(path, out, edit_manifest=None, drop=None, replace=None, reseal=True):
    """A copy of the engine with its manifest edited (and, with `reseal`, its manifest digest
    recomputed, as a deliberate editor would: so the plan's own checks are what is tested)."""
    with zipfile.ZipFile(path) as z:
        items = {n: z.read(n) for n in z.namelist()}
        comment = z.comment
    if edit_manifest:
        m = json.loads(items["manifest.json"])
        edit_manifest(m)
        items["manifest.json"] = json.dumps(m).encode()
    if drop:
        items.pop(drop)
    if replace:
        items.update(replace)
    with zipfile.ZipFile(out, "w") as z:
        z.comment = make_comment(hashlib.sha256(items["manifest.json"]).hexdigest()) if reseal else comment
        for n, d in items.items():
            z.writestr(n, d)
    return out


def test_edited_manifest_offsets_are_rejected(bert_engine, tmp_path):
    _, _, path = bert_engine

    def push_out(m):
        name = next(iter(m["memory"]["placements"]))
        m["memory"]["placements"][name]["offset"] = m["memory"]["arena_bytes"] + 256

    with pytest.raises(EngineError, match="outside the arena"):
        graphc.runtime.load(_rewrite(path, tmp_path / "a.engine", push_out))


def test_wrong_version_is_rejected(bert_engine, tmp_path):
    _, _, path = bert_engine

    def bump(m):
        m["format_version"] = 999

    with pytest.raises(EngineError, match="version"):
        graphc.runtime.load(_rewrite(path, tmp_path / "v.engine", bump))


def test_edited_weights_fail_their_hash(bert_engine, tmp_path):
    _, _, path = bert_engine
    with zipfile.ZipFile(path) as z:
        w = bytearray(z.read("weights.safetensors"))
    w[-5] ^= 0xFF
    with pytest.raises(EngineError, match="SHA-256"):
        graphc.runtime.load(_rewrite(path, tmp_path / "w.engine", replace={"weights.safetensors": bytes(w)}))


def test_missing_member_and_not_a_zip(bert_engine, tmp_path):
    _, _, path = bert_engine
    with pytest.raises(EngineError, match="missing"):
        graphc.runtime.load(_rewrite(path, tmp_path / "m.engine", drop="weights.safetensors"))
    p = tmp_path / "junk.engine"
    p.write_bytes(b"hello")
    with pytest.raises(EngineError, match="not a graphc engine"):
        graphc.runtime.load(p)
    with pytest.raises(EngineError, match="no such"):
        graphc.runtime.load(tmp_path / "nope.engine")


def test_fuzz_mutations_never_crash(bert_engine, tmp_path):
    """Truncations and byte flips: each either loads and gives the same outputs (the byte was in a
    part nothing reads, e.g. a zip timestamp) or raises EngineError; never anything else."""
    eng, feeds, path = bert_engine
    data = path.read_bytes()
    expected = eng.run(feeds)
    rng = random.Random(1234)
    loaded_ok = rejected = 0
    for i in range(300):
        buf = bytearray(data)
        kind = i % 3
        if kind == 0:
            buf = buf[: rng.randrange(len(buf))]
        elif kind == 1:
            for _ in range(rng.randint(1, 4)):
                buf[rng.randrange(len(buf))] ^= 1 << rng.randrange(8)
        else:
            pos = rng.randrange(len(buf))
            buf[pos : pos + 8] = bytes(rng.randrange(256) for _ in range(8))
        p = tmp_path / "f.engine"
        p.write_bytes(bytes(buf))
        try:
            e = graphc.runtime.load(p)
        except EngineError:
            rejected += 1
            continue
        out = e.run(feeds)
        for k in expected:
            np.testing.assert_array_equal(out[k], expected[k])
        loaded_ok += 1
    assert rejected > 250, (rejected, loaded_ok)


def test_loading_a_cuda_engine_imports_no_compiler(tmp_path):
    """graphc.runtime must not pull in onnx or jinja2 (checked in a fresh interpreter)."""
    import subprocess
    import sys

    code = (
        "import sys, graphc.runtime, graphc.runtime.format, graphc.runtime.cuda, graphc.runtime.engine\n"
        "bad = [m for m in ('onnx', 'jinja2', 'graphc.ir', 'graphc.ops', 'graphc.passes') if m in sys.modules]\n"
        "print(bad); sys.exit(1 if bad else 0)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_engine_io_specs_are_in_the_manifest(bert_engine):
    _, _, path = bert_engine
    with zipfile.ZipFile(path) as z:
        m = json.loads(z.read("manifest.json"))
    assert m["format"] == "graphc-engine" and m["target"] == "cpu"
    assert {i["name"] for i in m["inputs"]} == {"input_ids", "attention_mask"}
    assert all(isinstance(h, str) and len(h) == 64 for h in m["members"].values())
