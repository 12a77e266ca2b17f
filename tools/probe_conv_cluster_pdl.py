"""Why is the split-K convolution cluster wrong under programmatic dependent launch (PDL)? The
experiments of 2026-12-04 on the H200 (docs/launches.md), one variant per run, for whoever takes
the question up again.

    python tools/probe_conv_cluster_pdl.py VARIANT [--runs 18]

The engine is tests/codegen/test_conv_serial_split_gpu.py's model (ResNet-50's deep 3x3 conv at
batch 1 with bias, residual and ReLU: an NCHW -> NHWC layout kernel, the conv as one cluster of 8
K slices, the transpose back, a cast), built for the local GPU, saved, loaded with PDL on and run
--runs times on new inputs against ONNX Runtime. Prints how many runs were wrong (relative error
above 3e-3; right runs sit at 2.9e-4). Variants:

- ``plain``: cluster kernels launched plain (graphc's rule): right.
- ``pdl``: the conv cluster too launched programmatically: wrong on 13-17 of 18 (2026-12-02/04).
- ``pdl-conv-only``: as ``pdl``, the launch after the conv plain: wrong (so the edge into the
  cluster, not out of it).
- ``noattr``: the conv through cuLaunchKernelEx without the PDL attribute: right (the launch path
  is not it).
- ``sleep``: ``pdl`` with two 50 us __nanosleep after the conv's griddepcontrol.wait: still wrong
  (so not a read before the layout kernel completed).
- ``ldcg``: ``pdl`` with the residual loaded through L2 only (ld.global.cg, not ld.global.nc): wrong.
- ``fence``: ``pdl`` with fence.proxy.async.global after the wait: wrong.
- ``rank``: ``pdl`` with %cluster_ctarank / %cluster_nctarank read at the entry and a printf on a
  mismatch: right, and nothing printed (the code change alone hides the fault).

The variants that change the kernel patch its CUDA source before NVRTC (a fresh kernel cache), so
the engine records the unpatched source: they are experiments, not engines to keep.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ENTRY = "{ GC_PDL_ENTRY();"
RESIDUAL_LOAD = "reinterpret_cast<const uint4*>(in3 + base)[j]"
PATCHES = {
    "sleep": (ENTRY, ENTRY + " __nanosleep(50000u); __nanosleep(50000u);"),
    "ldcg": (RESIDUAL_LOAD, "__ldcg(reinterpret_cast<const uint4*>(in3 + base) + j)"),
    "fence": (ENTRY, ENTRY + ' asm volatile("fence.proxy.async.global;" ::: "memory");'),
    "rank": (
        ENTRY,
        ENTRY + ' { unsigned r, n; asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));'
        ' asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(n));'
        " if (threadIdx.x == 0 && (r != blockIdx.y % 8 || n != 8))"
        ' printf("rank %u of %u in block %d %d\\n", r, n, (int)blockIdx.x, (int)blockIdx.y); }',
    ),
}
VARIANTS = ("plain", "pdl", "pdl-conv-only", "noattr", *PATCHES)


def _patch_conv_sources(old: str, new: str) -> None:
    """Compile the conv kernel with `old` replaced by `new` in its source (a fresh kernel cache)."""
    import graphc.codegen.build as build
    from graphc.codegen.nvrtc import CompileJob

    compile_all = build.compile_all

    def patched(jobs, cache_dir=None, workers=None, progress=None):
        out, hits = [], 0
        for job in jobs:
            src = job.source
            # the sm_90 cluster kernel (the engine's older-arch conv kernels are other templates)
            if job.name.startswith("gc_conv_") and "__cluster_dims__" in src and old in src:
                src, hits = src.replace(old, new), hits + 1
            out.append(CompileJob(job.name, src, job.arch, job.options))
        if not hits:
            raise SystemExit("no cluster conv kernel with the text to patch")
        return compile_all(out, tempfile.mkdtemp(), workers, progress)

    build.compile_all = patched


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("variant", choices=VARIANTS)
    ap.add_argument("--runs", type=int, default=18)
    args = ap.parse_args(argv)
    os.environ["GRAPHC_PDL"] = "1"

    import graphc
    import graphc.runtime.cuda as rcuda
    import graphc.runtime.pdl as pdl
    from tests.codegen.test_conv_serial_split_gpu import _model
    from tests.helpers import rand, run_ort

    v = args.variant
    if v != "plain":
        pdl.has_cluster_shape = lambda source, name: False  # every cluster kernel PDL-ready
    if v in PATCHES:
        _patch_conv_sources(*PATCHES[v])
    choose = rcuda.programmatic_launches

    def programmatic(digests, ready, ctas=None, max_ctas=None):
        out = choose(digests, ready, ctas, max_ctas)
        if v == "pdl-conv-only" and len(out) > 2:
            out[2] = False  # layout, conv, transpose back, cast
        print("programmatic launches:", out, file=sys.stderr)
        return out

    rcuda.programmatic_launches = programmatic
    if v == "noattr":
        init = rcuda.ProgrammaticLaunch.__init__

        def without_attribute(self, driver, fn, grid, block, a, smem, stream, name):
            init(self, driver, fn, grid, block, a, smem, stream, name)
            if name == "Conv_0":
                self.cfg.attrs, self.cfg.numAttrs = [], 0

        rcuda.ProgrammaticLaunch.__init__ = without_attribute

    model = _model()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "deep.engine"
        graphc.compile(model, target="cuda", precision="fp16").save(path)
        engine = graphc.runtime.load(path, pdl=True)
        errs = []
        for seed in range(args.runs):
            feeds = {"x": rand((1, 512, 7, 7), seed=seed, low=-1.0, high=1.0)}
            ref = run_ort(model, feeds)["y"]
            got = engine.run(feeds, to_numpy=True)["y"].astype(np.float64)
            errs.append(float(np.linalg.norm(got - ref) / np.linalg.norm(ref)))
    wrong = sum(e > 3e-3 for e in errs)
    print(f"{v}: {wrong} of {args.runs} runs wrong; relative errors {' '.join(f'{e:.1e}' for e in errs)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
