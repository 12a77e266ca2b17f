"""CUDA C to cubin with NVRTC (cuda-python's `cuda.bindings.nvrtc`); no GPU needed.

Compiled kernels are cached on disk by content: the key is the SHA-256 of the source, the target
arch, the options and the NVRTC version, so the same kernel is never compiled twice. Many kernels
compile in parallel in worker processes.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from graphc import cache as kernel_cache
from graphc.errors import CompileError

log = logging.getLogger(__name__)

DEFAULT_ARCHS = ("sm_80", "sm_86", "sm_89", "sm_90")
BASE_OPTIONS = ("-std=c++17", "-default-device")


def _nvrtc():
    try:
        from cuda.bindings import nvrtc
    except ImportError as e:
        raise CompileError(
            "NVRTC is not installed: the cuda target needs cuda-bindings and nvidia-cuda-nvrtc "
            "(pip install cuda-bindings nvidia-cuda-nvrtc, or in a clone of graphc: pip install -e '.[nvrtc]')"
        ) from e
    return nvrtc


def nvrtc_version() -> str:
    nvrtc = _nvrtc()
    err, major, minor = nvrtc.nvrtcVersion()
    _check(nvrtc, err, "nvrtcVersion")
    return f"{major}.{minor}"


def _check(nvrtc, err, what: str) -> None:
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise CompileError(f"NVRTC {what} failed: {err}")


def check_arch(arch: str) -> str:
    a = arch.strip().lower()
    if a.startswith("compute_"):
        a = "sm_" + a[len("compute_") :]
    if not a.startswith("sm_") or not a[3:].rstrip("a").isdigit():
        raise CompileError(f"bad GPU architecture {arch!r}: use sm_80, sm_86, sm_89, sm_90 ...")
    if int(a[3:].rstrip("a")) < 70:
        raise CompileError(f"architecture {arch} is too old: graphc needs sm_70 or newer")
    return a


def compile_cubin(source: str, name: str, arch: str, options: Sequence[str] = ()) -> bytes:
    """Compile one translation unit to cubin for `arch`; a compile error carries the NVRTC log."""
    nvrtc = _nvrtc()
    arch = check_arch(arch)
    err, prog = nvrtc.nvrtcCreateProgram(source.encode(), f"{name}.cu".encode(), 0, [], [])
    _check(nvrtc, err, "nvrtcCreateProgram")
    try:
        opts = [o.encode() for o in (*BASE_OPTIONS, f"--gpu-architecture={arch}", *options)]
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            _, size = nvrtc.nvrtcGetProgramLogSize(prog)
            buf = b" " * size
            nvrtc.nvrtcGetProgramLog(prog, buf)
            text = buf.decode(errors="replace").strip()
            raise CompileError(f"NVRTC could not compile kernel {name} for {arch}:\n{text[:4000]}")
        err, size = nvrtc.nvrtcGetCUBINSize(prog)
        _check(nvrtc, err, "nvrtcGetCUBINSize")
        cubin = b" " * size
        (err,) = nvrtc.nvrtcGetCUBIN(prog, cubin)
        _check(nvrtc, err, "nvrtcGetCUBIN")
        return bytes(cubin)
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def default_cache_dir() -> Path:
    return kernel_cache.cache_dir()  # graphc.cache: location, size limit, clearing


@dataclass
class CompileJob:
    name: str
    source: str
    arch: str
    options: tuple[str, ...] = ()

    def key(self, version: str) -> str:
        h = hashlib.sha256()
        for part in (self.source, self.arch, "\0".join(self.options), version):
            h.update(part.encode())
            h.update(b"\0")
        return h.hexdigest()


def _run_job(job: CompileJob) -> bytes:
    return compile_cubin(job.source, job.name, job.arch, job.options)


def compile_all(
    jobs: Sequence[CompileJob], cache_dir: str | Path | None = None, workers: int | None = None, progress=None
) -> list[bytes]:
    """Compile every job (cached), in parallel where there are several to do."""
    version = nvrtc_version()
    cache = Path(cache_dir) if cache_dir else default_cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    results: list[bytes | None] = [None] * len(jobs)
    todo: list[int] = []
    for i, job in enumerate(jobs):
        results[i] = kernel_cache.read(cache / f"{job.key(version)}.cubin")
        if results[i] is None:
            todo.append(i)
    if todo:
        log.info("compiling %d kernels with NVRTC %s (%d cached)", len(todo), version, len(jobs) - len(todo))
        n = workers or min(len(todo), os.cpu_count() or 1)
        if n <= 1 or len(todo) < 3:
            outs = [_run_job(jobs[i]) for i in todo]
            if progress:
                progress(len(todo))
        else:
            with ProcessPoolExecutor(max_workers=n) as pool:
                outs = []
                for out in pool.map(_run_job, [jobs[i] for i in todo]):
                    outs.append(out)
                    if progress:
                        progress(1)
        for i, cubin in zip(todo, outs, strict=True):
            results[i] = cubin
            path = cache / f"{jobs[i].key(version)}.cubin"
            tmp = path.with_suffix(f".tmp{os.getpid()}")
            tmp.write_bytes(cubin)
            os.replace(tmp, path)  # atomic: a concurrent reader never sees half a file
        kernel_cache.enforce_limit(cache)
    return results  # type: ignore[return-value]
