"""Depthwise conv numerics without a GPU: the generated CUDA source, compiled as C++20 by the host
compiler with a few definitions standing in for CUDA's (one std::thread per CUDA thread, a
std::barrier for __syncthreads, static storage for __shared__), run block by block and compared
with graphc.interpret. It checks the strips' indexing (taps, strides, dilation, the W edge, short
strips, channel tails, multipliers) where no GPU is; test_conv_gpu.py checks the same on one.
Skipped without a C++20 compiler."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

import graphc
from graphc.codegen.kernel import family_for
from graphc.codegen.lower import lower_to_plan
from tests.codegen.test_conv_gpu import BF16, TOLERANCE, conv_graph

CXX = shutil.which("g++") or shutil.which("clang++")
pytestmark = [pytest.mark.skipif(CXX is None, reason="no C++ compiler"), pytest.mark.slow]

STORAGE = {
    np.dtype(np.float16): "gc_half",
    BF16: "gc_bf16",
    np.dtype(np.float32): "float",
    np.dtype(np.float64): "double",
}

# What the kernel uses of CUDA and of common.cuh, for the host. Half/bfloat16 conversions round
# to nearest even as the GPU's cvt.rn does (_Float16 in GCC 12+ and Clang 15+ on x86-64).
PRELUDE = r"""
#include <barrier>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>
typedef unsigned short gc_half;
typedef unsigned short gc_bf16;
struct gc_dim3 { unsigned x, y, z; };
thread_local gc_dim3 threadIdx, blockIdx;
static gc_dim3 blockDim, gridDim;
static std::barrier<>* gc_bar;
#define __device__
#define __forceinline__ inline
#define __global__
#define __launch_bounds__(...)
#define __restrict__
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))
#define GC_PDL_ENTRY() ((void)0)
#define asm(...) ((void)0)
inline void __syncthreads() { gc_bar->arrive_and_wait(); }
inline float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
inline float gc_h2f(gc_half h) { _Float16 f; std::memcpy(&f, &h, 2); return (float)f; }
inline gc_half gc_f2h(float x) { _Float16 f = (_Float16)x; gc_half h; std::memcpy(&h, &f, 2); return h; }
inline float gc_bf2f(gc_bf16 h) { return __uint_as_float(((unsigned)h) << 16); }
inline gc_bf16 gc_f2bf(float f) {
  unsigned u; std::memcpy(&u, &f, 4); u += 0x7fffu + ((u >> 16) & 1u); return (gc_bf16)(u >> 16);
}
"""

MAIN = r"""
int main(int argc, char** argv) {
  std::vector<void*> bufs;
  for (int i = 1; i < argc; ++i) {
    FILE* f = fopen(argv[i], "rb"); fseek(f, 0, SEEK_END); long n = ftell(f); fseek(f, 0, SEEK_SET);
    void* p = aligned_alloc(64, (n + 127) / 64 * 64); if (fread(p, 1, n, f) != (size_t)n) return 3; fclose(f);
    bufs.push_back(p);
  }
  gridDim = GRID;
  blockDim = BLOCK;
  const unsigned nt = blockDim.x * blockDim.y * blockDim.z;
  for (unsigned bz = 0; bz < gridDim.z; ++bz)
    for (unsigned by = 0; by < gridDim.y; ++by)
      for (unsigned bx = 0; bx < gridDim.x; ++bx) {
        std::barrier<> bar(nt);
        gc_bar = &bar;
        std::vector<std::thread> ts;
        for (unsigned t = 0; t < nt; ++t)
          ts.emplace_back([=] {
            threadIdx = {t % blockDim.x, (t / blockDim.x) % blockDim.y, t / (blockDim.x * blockDim.y)};
            blockIdx = {bx, by, bz};
            KERNEL(ARGS);
          });
        for (auto& th : ts) th.join();
      }
  FILE* f = fopen(argv[argc - 1], "wb"); fwrite(bufs.back(), 1, OUT_BYTES, f); fclose(f);
  return 0;
}
"""

# (n, h, w, c, k, r, s, stride, pad, dil, group), dtype, forced params, epilogue
CASES = [
    pytest.param((1, 13, 13, 16, 16, 7, 7, 1, 3, 1, 16), np.float16, {"qt": 4}, "residual", id="7x7-qt4"),
    pytest.param((2, 9, 11, 16, 16, 3, 3, 1, 1, 1, 16), np.float16, {"qt": 4}, "relu", id="3x3-w11-qt4"),
    pytest.param((2, 9, 9, 32, 32, 3, 3, 2, 1, 1, 32), np.float16, {"qt": 3}, "residual", id="s2-qt3"),
    pytest.param((1, 12, 7, 8, 8, 3, 3, 1, 2, 2, 8), np.float32, {"qt": 3}, "relu", id="dil2-w7-qt3"),
    pytest.param((2, 9, 9, 17, 17, 3, 3, 1, 1, 1, 17), np.float16, {"qt": 3, "vc": 8}, "relu", id="tail-qt3"),
    pytest.param((1, 8, 8, 8, 16, 5, 5, 1, 2, 1, 8), np.float32, {"qt": 3}, "residual", id="mult2-qt3"),
    pytest.param((1, 7, 13, 8, 8, 3, 3, 2, 1, 1, 8), np.float64, {"qt": 5}, "relu", id="f64-s2-qt5"),
    pytest.param((1, 7, 13, 16, 16, 5, 5, 2, 2, 2, 16), BF16, {"qt": 2}, "relu", id="bf16-s2-dil2-qt2"),
    pytest.param((1, 9, 9, 16, 16, 3, 3, 1, 1, 1, 16), np.float16, {"qt": 1}, "relu", id="qt1"),
]


def _emulate(tmp: Path, case, dtype, params, epilogue):
    n, h, w, c, k, r, s, st, pad, dil, grp = case
    g = conv_graph(dtype, n, h, w, c, k, r, s, stride=st, pad=pad, dil=dil, group=grp, epilogue=epilogue)
    plan = lower_to_plan(g)
    weights = {name: cst.data for name, cst in g.constants.items()}
    (step,) = [x for x in plan.steps if not x.alias]
    ctx = plan.context(step, weights, params=params)
    (src,) = family_for(ctx).generate(ctx)
    assert src.params["variant"] == "depthwise" and src.params["qt"] == params["qt"]
    rng = np.random.default_rng(1)
    feeds = {v.name: rng.standard_normal(v.type.static_shape).astype(dtype) for v in g.inputs}
    ref = graphc.interpret(g, feeds)[g.outputs[0].name]
    out = g.outputs[0].name
    arrays = [
        np.zeros(ref.shape, dtype) if a == out else feeds[a] if a in feeds else np.asarray(weights[a]).astype(dtype)
        for a in src.args
    ]
    assert src.args[-1] == out
    t = STORAGE[np.dtype(dtype)]
    args = ", ".join(f"({'' if i == len(arrays) - 1 else 'const '}{t}*)bufs[{i}]" for i in range(len(arrays)))
    main = (
        MAIN.replace("GRID", "{" + ", ".join(f"{d}u" for d in src.grid) + "}")
        .replace("BLOCK", "{" + ", ".join(f"{d}u" for d in src.block) + "}")
        .replace("KERNEL", src.name)
        .replace("ARGS", args)
        .replace("OUT_BYTES", str(arrays[-1].nbytes))
    )
    body = src.source[src.source.rindex("// ---- conv.cu.j2 ----") :]
    (tmp / "k.cpp").write_text(PRELUDE + body + main)
    subprocess.run([CXX, "-std=c++20", "-O1", "-w", "-o", str(tmp / "k"), str(tmp / "k.cpp"), "-pthread"], check=True)
    files = []
    for i, a in enumerate(arrays):
        files.append(str(tmp / f"a{i}.bin"))
        np.ascontiguousarray(a).tofile(files[-1])
    subprocess.run([str(tmp / "k"), *files], check=True, timeout=120)
    return np.fromfile(files[-1], dtype=dtype).reshape(ref.shape), ref


@pytest.mark.parametrize("case,dtype,params,epilogue", CASES)
def test_depthwise_emulated(tmp_path, case, dtype, params, epilogue):
    got, ref = _emulate(tmp_path, case, dtype, params, epilogue)
    rtol, atol = TOLERANCE[np.dtype(dtype)]
    np.testing.assert_allclose(got.astype(np.float64), ref.astype(np.float64), rtol=rtol, atol=atol)
