"""Engine files with optimization profiles (format version 3): what is written, that old
(version 2, fixed-shape) engines still load, and edited profiles refused with one line."""

from __future__ import annotations

import hashlib
import json
import zipfile

import numpy as np
import pytest

import graphc
import graphc.runtime
import models
from graphc.runtime import EngineError
from graphc.runtime.container import make_comment
from graphc.runtime.format import FORMAT_VERSION, STATIC_FORMAT_VERSION, read_engine


@pytest.fixture(scope="module")
def dyn_path(tmp_path_factory):
    model = models.build("bert", size="tiny")
    names = ("input_ids", "attention_mask")
    eng = graphc.compile(
        model,
        target="cpu",
        min_shapes={n: [1, 4] for n in names},
        opt_shapes={n: [2, 4] for n in names},
        max_shapes={n: [4, 5] for n in names},
    )
    path = tmp_path_factory.mktemp("dyn") / "bert.engine"
    eng.save(path)
    return path


def _manifest(path) -> dict:
    with zipfile.ZipFile(path) as z:
        return json.loads(z.read("manifest.json"))


def _rewrite(path, out, edit):
    with zipfile.ZipFile(path) as z:
        items = {n: z.read(n) for n in z.namelist()}
    m = json.loads(items["manifest.json"])
    edit(m, items)
    items["manifest.json"] = json.dumps(m).encode()
    with zipfile.ZipFile(out, "w") as z:
        z.comment = make_comment(hashlib.sha256(items["manifest.json"]).hexdigest())
        for n, d in items.items():
            z.writestr(n, d)
    return out


def test_versions_written(dyn_path, tmp_path):
    m = _manifest(dyn_path)
    assert m["format_version"] == FORMAT_VERSION == 3
    (p,) = m["profiles"]
    assert [b.get("plan") is None for b in p["buckets"]].count(True) == 1  # the engine's own plan once
    assert len(p["buckets"]) == 8  # batch 1, 2, 3, 4 x seq 4, 5
    model = models.build("mlp", size="tiny")
    static = graphc.compile(model, target="cpu", shapes={"batch": 2})
    static.save(tmp_path / "s.engine")
    s = _manifest(tmp_path / "s.engine")
    assert s["format_version"] == STATIC_FORMAT_VERSION == 2 and "profiles" not in s


def test_a_version_2_engine_still_loads_and_runs(tmp_path):
    model = models.build("mlp", size="tiny")
    name = model.graph.input[0].name
    eng = graphc.compile(model, target="cpu", shapes={"batch": 2})
    eng.save(tmp_path / "s.engine")
    loaded = graphc.runtime.load(tmp_path / "s.engine")
    assert loaded.profiles == [] and loaded.dynamic is None
    x = np.random.default_rng(0).standard_normal(loaded.inputs[0].shape).astype(np.float32)
    np.testing.assert_array_equal(loaded.run({name: x})["logits"], eng.run({name: x})["logits"])
    with pytest.raises(graphc.runtime.EngineInputError, match="the engine was built for"):
        loaded.run({name: np.zeros((3, x.shape[1]), np.float32)})


def test_the_profile_is_read_back(dyn_path):
    ef = read_engine(dyn_path)
    (p,) = ef.profiles
    assert {g.name: g.padded for g in p.dims} == {"batch": True, "seq": False}
    assert p.min["input_ids"] == [1, 4] and p.max["attention_mask"] == [4, 5]
    own = [b for b in p.buckets if b.own_weights]
    assert own and all(b.member.startswith("profiles/") for b in own)


def _edit(fn):
    return lambda m, items: fn(m)


def _swap_sizes(m, items):
    # two buckets' sizes swapped: each plan now says it runs shapes its inputs are not
    a, b = [b for b in m["profiles"][0]["buckets"] if b.get("plan")][:2]
    a["sizes"], b["sizes"] = b["sizes"], a["sizes"]


CASES = {
    "v2 with profiles": (_edit(lambda m: m.update(format_version=2)), "version 2 with optimization profiles"),
    "v3 without": (_edit(lambda m: m.pop("profiles")), "version 3 without optimization profiles"),
    "max below opt": (
        _edit(lambda m: m["profiles"][0]["max"].update(input_ids=[1, 5])),
        "input 'input_ids' dim 0 has min/opt/max 1/2/1",
    ),
    "dim range disagrees": (
        _edit(lambda m: m["profiles"][0]["dims"][0].update(max=3)),
        "dim 'batch' disagrees with the range of input 'input_ids' dim 0",
    ),
    "undescribed range": (
        _edit(lambda m: m["profiles"][0].update(dims=m["profiles"][0]["dims"][1:])),
        "has a range but no dim describes it",
    ),
    "bucket outside": (
        _edit(lambda m: m["profiles"][0]["buckets"][-1]["sizes"].update(batch=9)),
        "dim 'batch' at 9 is outside 1..4",
    ),
    "missing bucket": (
        _edit(
            lambda m: m["profiles"][0].update(
                buckets=[b for b in m["profiles"][0]["buckets"] if b["sizes"]["seq"] != 5]
            )
        ),
        "no bucket runs dims",
    ),
    "two main plans": (
        _edit(
            lambda m: [b.update(plan=None, memory=None, weights=[], member=None) for b in m["profiles"][0]["buckets"]]
        ),
        "only profile 0's opt bucket is the engine's own plan",
    ),
    "slices a missing output": (
        _edit(lambda m: m["profiles"][0]["dims"][0].update(outputs={"nope": [0, 1]})),
        "slices output 'nope'",
    ),
    "bucket sizes swapped": (_swap_sizes, "the manifest's input specs do not match the plan's input tensors"),
    "unknown field": (_edit(lambda m: m["profiles"][0].update(extra=1)), "does not fit the engine schema"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_edited_profiles_are_refused(dyn_path, tmp_path, case):
    edit, message = CASES[case]
    with pytest.raises(EngineError) as e:
        graphc.runtime.load(_rewrite(dyn_path, tmp_path / "x.engine", edit))
    assert message in str(e.value) and "\n" not in str(e.value)


def test_a_bucket_weight_member_must_be_listed_and_hashed(dyn_path, tmp_path):
    def swap(m, items):
        b = next(b for b in m["profiles"][0]["buckets"] if b.get("member"))
        items[b["member"]] = items[b["member"]][:-1] + bytes([items[b["member"]][-1] ^ 1])

    with pytest.raises(EngineError, match="does not match its SHA-256"):
        graphc.runtime.load(_rewrite(dyn_path, tmp_path / "w.engine", swap))
