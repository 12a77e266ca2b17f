"""JIT of an engine's kept CUDA source on a GPU it has no cubin for: NVRTC through
cuda-python's `cuda.bindings.nvrtc`, called here so that the runtime imports nothing of the
compiler. Logged as a warning: compiling at load time is slow, the user should know."""

from __future__ import annotations

import logging
import re
from pathlib import Path

from graphc.runtime.errors import EngineError

log = logging.getLogger(__name__)

# Must match what the compiler compiles with (graphc.codegen.nvrtc.BASE_OPTIONS).
OPTIONS = ("-std=c++17", "-default-device")


def _nvrtc(path: Path, arch: str, built: list[str]):
    try:
        from cuda.bindings import nvrtc
    except ImportError:
        raise EngineError(
            f"{path} has no cubin for this GPU ({arch}; it has {built}) and NVRTC is not installed to compile "
            "the kept source: install cuda-bindings and nvidia-cuda-nvrtc from PyPI, or rebuild with "
            f"`graphc compile MODEL.onnx -o {path} --arch {arch}`"
        ) from None
    return nvrtc


def compile_cubin(nvrtc, source: str, name: str, arch: str) -> bytes:
    """One kernel's source to cubin; a failure is an EngineError carrying the start of NVRTC's log."""
    if not re.fullmatch(r"sm_[0-9]{2,3}a?", arch):
        raise EngineError(f"bad GPU architecture {arch!r}")
    ok = nvrtc.nvrtcResult.NVRTC_SUCCESS
    err, prog = nvrtc.nvrtcCreateProgram(source.encode(), f"{name}.cu".encode(), 0, [], [])
    if err != ok:
        raise EngineError(f"NVRTC could not take kernel {name}: {err}")
    try:
        opts = [o.encode() for o in (*OPTIONS, f"--gpu-architecture={arch}")]
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        if err != ok:
            _, size = nvrtc.nvrtcGetProgramLogSize(prog)
            buf = b" " * size
            nvrtc.nvrtcGetProgramLog(prog, buf)
            first = buf.decode(errors="replace").strip().splitlines()[:1]
            raise EngineError(f"NVRTC could not compile kernel {name} for {arch}: {first[0] if first else err}")
        err, size = nvrtc.nvrtcGetCUBINSize(prog)
        if err != ok:
            raise EngineError(f"NVRTC gave no cubin for kernel {name}: {err}")
        cubin = b" " * size
        (err,) = nvrtc.nvrtcGetCUBIN(prog, cubin)
        if err != ok:
            raise EngineError(f"NVRTC gave no cubin for kernel {name}: {err}")
        return bytes(cubin)
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def jit_kernels(
    sources: dict[str, str],
    names: dict[str, str],
    requires: dict[str, str | None],
    arch: str,
    built: list[str],
    path: Path,
) -> dict[str, bytes]:
    """cubin for `arch` of every kernel (digest -> cubin), compiled from the engine's kept source."""
    for d in sources:
        need = requires.get(d)
        if need and need.rstrip("a") != arch:
            raise EngineError(
                f"{path}: kernel {names[d]} needs {need}, this GPU is {arch}: rebuild with "
                f"`graphc compile MODEL.onnx -o {path} --arch {arch}`"
            )
    nvrtc = _nvrtc(path, arch, built)
    log.warning("%s has no cubin for %s (it has %s): compiling its kept CUDA source with NVRTC", path, arch, built)
    out = {}
    for d, src in sources.items():
        try:
            out[d] = compile_cubin(nvrtc, src, names[d], requires.get(d) or arch)
        except EngineError as e:
            raise EngineError(
                f"{path}: {e}; rebuild with `graphc compile MODEL.onnx -o {path} --arch {arch}`"
            ) from None
    return out


__all__ = ["compile_cubin", "jit_kernels"]
