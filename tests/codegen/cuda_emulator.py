"""Runs simple CUDA kernels on the CPU, for tests on a machine without a GPU: the kernel's own CUDA
source, compiled by the host C++ compiler with a few shims (threadIdx/blockIdx as globals, the CUDA
qualifiers empty), called once per thread of its grid, one thread after another.

Only kernels whose threads do not talk to each other can run this way: no __shared__, no
__syncthreads, no warp shuffles, no atomics (`emulable` says so). The TVM kernels graphc launches
for scatters, MaxUnpool and the losses are such kernels (each thread owns what it writes), and they
are the ones TVM has no CPU build of; this runs the exact text the engine ships.
"""

from __future__ import annotations

import ctypes
import hashlib
import re
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

_UNSUPPORTED = ("__shared__", "__syncthreads", "__shfl", "atomic", "__activemask", "asm(", 'asm volatile("mma')
_SHIM = """\
#include <cmath>
#include <cstdint>
#include <cstdlib>
struct gc_emu_dim3 { int x, y, z; };
static gc_emu_dim3 threadIdx, blockIdx, blockDim, gridDim;
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(x)
#define __restrict__ __restrict
#define GC_PDL_ENTRY() ((void)0)
template <class T> static inline T max(T a, T b) { return a > b ? a : b; }
template <class T> static inline T min(T a, T b) { return a < b ? a : b; }
using std::exp; using std::log; using std::sqrt; using std::floor; using std::nearbyint; using std::fabs;
using std::sin; using std::cos;
"""
_PARAM = re.compile(r"^(?P<type>.*?\*)\s*(?:__restrict__\s*)?[A-Za-z_][A-Za-z0-9_]*$")
_CACHE = Path(tempfile.gettempdir()) / "graphc_cuda_emulator"


def emulable(source: str) -> bool:
    return not any(u in source for u in _UNSUPPORTED)


def _strip(source: str) -> str:
    """The kernel's own text without what the shim replaces: graphc's typedefs (the host has its
    own <cstdint>), the PDL macro block."""
    out, skip = [], False
    for line in source.splitlines():
        if line.startswith("typedef") and line.rstrip().endswith(("int8_t;", "int16_t;", "int32_t;", "int64_t;")):
            continue
        if line.startswith("#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900"):
            skip = True
        if skip:
            if line.startswith("#endif"):
                skip = False
            continue
        out.append(line)
    return "\n".join(out)


def _library(source: str, name: str) -> ctypes.CDLL:
    sig = re.search(rf"\b{re.escape(name)}\(([^)]*)\)\s*\{{", source)
    assert sig is not None, f"no definition of {name}"
    params = [p.strip() for p in sig.group(1).split(",")]
    casts = []
    for i, p in enumerate(params):
        m = _PARAM.match(p)
        assert m is not None, f"parameter {p!r} of {name} is not a pointer"
        casts.append(f"({m['type']})a[{i}]")
    driver = f"""
extern "C" void gc_emu_launch(void** a, int gx, int gy, int gz, int bx, int by, int bz) {{
  gridDim = {{gx, gy, gz}}; blockDim = {{bx, by, bz}};
  for (int z = 0; z < gz; ++z) for (int y = 0; y < gy; ++y) for (int x = 0; x < gx; ++x)
    for (int tz = 0; tz < bz; ++tz) for (int ty = 0; ty < by; ++ty) for (int tx = 0; tx < bx; ++tx) {{
      blockIdx = {{x, y, z}}; threadIdx = {{tx, ty, tz}};
      {name}({", ".join(casts)});
    }}
}}
"""
    text = _SHIM + _strip(source) + driver
    key = hashlib.sha256(text.encode()).hexdigest()[:20]
    _CACHE.mkdir(parents=True, exist_ok=True)
    lib = _CACHE / f"{key}.so"
    if not lib.exists():
        src = _CACHE / f"{key}.cpp"
        src.write_text(text)
        tmp = lib.with_suffix(".tmp.so")
        r = subprocess.run(
            ["g++", "-std=c++17", "-O1", "-shared", "-fPIC", "-w", "-o", str(tmp), str(src)],
            capture_output=True,
            text=True,
        )
        assert r.returncode == 0, f"host compile of {name} failed:\n{r.stderr[:3000]}"
        tmp.replace(lib)
    return ctypes.CDLL(str(lib))


def run_launches(
    launches: Sequence[tuple[str, str, Sequence[int], Sequence[int], Sequence[str]]], tensors: Mapping[str, np.ndarray]
) -> None:
    """Each (source, kernel name, grid, block, argument names) in order, on `tensors` (written in
    place; every argument must be a C-contiguous array there)."""
    for source, name, grid, block, args in launches:
        assert emulable(source), f"{name} has threads that cooperate; it cannot run one thread at a time"
        fn = _library(source, name).gc_emu_launch
        arrays = [tensors[a] for a in args]
        assert all(a.flags.c_contiguous for a in arrays)
        ptrs = (ctypes.c_void_p * len(arrays))(*[a.ctypes.data for a in arrays])
        fn(ptrs, *[ctypes.c_int(int(v)) for v in (*grid, *block)])


def run_template_kernel(
    src, template: str, prelude: str, inputs: Mapping[str, np.ndarray], out: str, out_shape, dtype
) -> np.ndarray:
    """One rendered kernel (a KernelSource) of `template`: its text after the template's marker
    (common.cuh swapped for the host's `prelude`) run on `inputs`, into a new output `out` that
    starts as all-ones bytes (NaN for floats: an element the kernel skips shows)."""
    body = src.source.split(f"// ---- {template} ----", 1)[1]
    y = np.empty(out_shape, dtype)
    y.reshape(-1).view(np.uint8)[...] = 0xFF
    tensors = {k: np.ascontiguousarray(v) for k, v in inputs.items()} | {out: y}
    run_launches([(prelude + body, src.name, src.grid, src.block, src.args)], tensors)
    return y
