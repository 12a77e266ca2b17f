"""The tuning cache: parameterized SQLite, schema versioning, keys that separate GPUs."""

from __future__ import annotations

import sqlite3

from graphc.codegen.tuner import SCHEMA_VERSION, TuningCache, TuningKey


def key(**kw) -> TuningKey:
    base = dict(family="gemm", template="t1", signature="s1", gpu="NVIDIA H200", sm="90", driver="13000")
    base.update(kw)
    return TuningKey(**base)


def test_put_get_and_keys_are_distinct(tmp_path):
    c = TuningCache(tmp_path / "t.sqlite")
    c.put(key(), {"bm": 128, "bn": 128}, 0.5, 8)
    assert c.get(key()) == ({"bm": 128, "bn": 128}, 0.5)
    assert c.get(key(gpu="NVIDIA A100")) is None
    assert c.get(key(signature="s2")) is None
    c.put(key(), {"bm": 64}, 0.4, 8)  # a newer decision replaces the old
    assert c.get(key())[0] == {"bm": 64}
    c.close()


def test_hostile_strings_are_data_not_sql(tmp_path):
    c = TuningCache(tmp_path / "t.sqlite")
    evil = key(signature="x'); DROP TABLE records; --")
    c.put(evil, {"a": 1}, 1.0, 1)
    assert c.get(evil) == ({"a": 1}, 1.0)
    c.close()


def test_schema_version_mismatch_starts_afresh(tmp_path):
    path = tmp_path / "t.sqlite"
    c = TuningCache(path)
    c.put(key(), {"a": 1}, 1.0, 1)
    c.close()
    db = sqlite3.connect(path)
    db.execute("UPDATE meta SET value = ? WHERE key = ?", (str(SCHEMA_VERSION + 1), "schema_version"))
    db.commit()
    db.close()
    c = TuningCache(path)
    assert c.get(key()) is None
    c.close()


def test_template_hash_covers_included_headers(tmp_path, monkeypatch):
    import shutil

    import graphc.codegen.kernel as kernel
    from graphc.codegen.tuner import template_hash

    gemm = ["gemm_mma.cu.j2", "gemm_simt.cu.j2", "gemm_wgmma.cu.j2", "gemm_reduce.cu.j2"]
    assert {*gemm, "gemm_common.cu.j2", "mma.cuh", "wgmma.cuh"} <= set(kernel.template_sources(gemm))
    assert "wgmma.cuh" not in kernel.template_sources(["gemm_mma.cu.j2"])
    # one header of PTX wrappers for every tensor-core family
    assert "mma.cuh" in kernel.template_sources(["conv.cu.j2"])
    assert "mma.cuh" in kernel.template_sources(["attention.cu.j2"])
    assert "reduce_common.cuh" in kernel.template_sources(["reduction.cu.j2"])
    shutil.copytree(kernel.TEMPLATE_DIR, tmp_path / "templates")
    monkeypatch.setattr(kernel, "TEMPLATE_DIR", tmp_path / "templates")
    before = template_hash("gemm")
    assert template_hash("gemm") == before
    with open(tmp_path / "templates" / "mma.cuh", "a") as f:
        f.write("// an edit to a shared header\n")
    assert template_hash("gemm") != before
