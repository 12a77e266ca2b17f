"""The kernel cache: its folder, its size limit (least recently used out first), and
`graphc cache --info` / `--clear`."""

from __future__ import annotations

import os

import pytest

from graphc import cache
from graphc.cli import main


def _kernel(folder, i: int, nbytes: int, age: float):
    path = folder / f"{i:064x}.cubin"
    path.write_bytes(b"x" * nbytes)
    t = 1_000_000_000 + age
    os.utime(path, (t, t))
    return path


@pytest.fixture
def folder(tmp_path, monkeypatch):
    d = tmp_path / "kernels"
    d.mkdir()
    monkeypatch.setenv(cache.ENV_DIR, str(tmp_path))
    monkeypatch.delenv(cache.ENV_LIMIT, raising=False)
    return d


def test_location_follows_the_environment(folder):
    assert cache.cache_dir() == folder and cache.root_dir() == folder.parent


def test_default_location_is_the_platforms_cache_folder(monkeypatch, tmp_path):
    monkeypatch.delenv(cache.ENV_DIR, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache.cache_dir() == tmp_path / "xdg" / "graphc" / "kernels"


def test_limit_evicts_least_recently_used(folder):
    paths = [_kernel(folder, i, 100, age=i) for i in range(5)]  # 0 is the oldest
    assert cache.read(paths[0]) == b"x" * 100  # a hit makes it the newest
    removed, freed = cache.enforce_limit(folder, limit=300)
    assert (removed, freed) == (2, 200)
    assert [p.exists() for p in paths] == [True, False, False, True, True]


def test_limit_from_the_environment(folder, monkeypatch):
    monkeypatch.setenv(cache.ENV_LIMIT, "250")
    assert cache.size_limit() == 250
    for i in range(4):
        _kernel(folder, i, 100, age=i)
    cache.enforce_limit(folder)
    assert cache.stats(folder).bytes == 200
    monkeypatch.setenv(cache.ENV_LIMIT, "lots")
    assert cache.size_limit() == cache.DEFAULT_LIMIT


def test_clear_removes_only_kernels(folder):
    for i in range(3):
        _kernel(folder, i, 10, age=i)
    (folder / f"{7:064x}.tmp123").write_bytes(b"half")  # an unfinished write
    (folder / "notes.txt").write_text("mine")
    (folder / "tuning.sqlite").write_bytes(b"db")
    assert cache.clear(folder) == (3, 34)
    assert sorted(p.name for p in folder.iterdir()) == ["notes.txt", "tuning.sqlite"]


def test_cli_info_and_clear(folder, capsys):
    for i in range(3):
        _kernel(folder, i, 1024, age=i)
    assert main(["cache", "--info"]) == 0
    out = capsys.readouterr().out
    assert str(folder) in out and "3 kernel(s), 3.00 KiB of a 2.00 GiB limit" in out
    assert main(["cache", "--clear"]) == 0
    assert "removed 3 cached kernel(s), 3.00 KiB" in capsys.readouterr().out
    assert cache.stats().entries == 0


def test_nvrtc_uses_the_cache_and_its_limit(folder, monkeypatch):
    pytest.importorskip("cuda.bindings.nvrtc")
    from graphc.codegen import nvrtc

    src = 'extern "C" __global__ void k(float* x) { x[threadIdx.x] *= 2.0f; }'
    jobs = [nvrtc.CompileJob("k", src, "sm_80")]
    (cubin,) = nvrtc.compile_all(jobs)
    assert cache.stats().entries == 1 and cubin[:4] == b"\x7fELF"
    # over the limit: the next compile's new kernel pushes the older one out
    monkeypatch.setenv(cache.ENV_LIMIT, str(len(cubin) + 1))
    jobs2 = [nvrtc.CompileJob("k", src.replace("2.0f", "3.0f"), "sm_80")]
    nvrtc.compile_all(jobs2)
    assert cache.stats().entries == 1
