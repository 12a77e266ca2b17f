"""Does a thread-block-cluster kernel launched with programmatic dependent launch (PDL) wait for
the grid before it? A probe on the GPU, outside graphc's kernels (docs/launches.md).

    python tools/probe_pdl_cluster.py [--replays 200] [--cluster 4] [--json OUT]

Three kernels per round, as an engine launches them: `bump` (plain) increments a generation
counter; `writer` (PDL) waits, spins for --spin-us, then writes the generation into a buffer;
`reader` (PDL, a cluster) waits, then counts the buffer words that are not the generation. A
reader that starts reading before the writer's grid completed counts stale words. The reader
is built and launched four ways:

- ``compiled``: the cluster shape in the cubin (``__cluster_dims__``), the PDL attribute alone
  (graphc's cluster kernels until now, launched plain because of this race);
- ``launched``: no ``__cluster_dims__``; the cluster shape as a launch attribute beside the PDL one
  (CUTLASS's way);
- ``no-cluster``: the same reader without a cluster, PDL (the control: PDL itself is right);
- ``compiled-plain``: the compiled cluster, launched without PDL (the control: the reader is right).

Each way runs --replays rounds as stream launches and as replays of one captured CUDA graph,
with the reader loading through plain loads and through cp.async into shared memory (graphc's
implicit-GEMM gather). Prints one line per case, stale words and rounds that saw any; exit 1
when a PDL case that should be safe ("launched", "no-cluster", the controls) saw stale words.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import sys

import numpy as np

SOURCE = r"""
#define WAIT() asm volatile("griddepcontrol.wait;" ::: "memory")
#define TRIGGER() asm volatile("griddepcontrol.launch_dependents;" ::: "memory")

extern "C" __global__ void bump(unsigned* gen) {
    WAIT(); TRIGGER();
    if (blockIdx.x == 0 && threadIdx.x == 0) gen[0] += 1u;
}

// the word every writer stores for generation g (both 16-bit halves: the scattered writer stores halves)
__device__ __forceinline__ unsigned word_of(unsigned g) { return (g & 0xffffu) * 0x10001u; }

// SCATTER 0: coalesced 32-bit stores, a warp writes whole lines; 1: 16-bit stores in transposed order
// (buf as [n / 512 rows, 1024 halves] written column by column, as a layout transpose does), so
// each line is written piecewise from many CTAs (SMs)
__device__ __forceinline__ unsigned long long now_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
    return t;
}

// times[0]: when the writer's last block finished storing; times[1]: when the reader's first block
// entered (before its wait): a reader that entered first was launched early, as PDL allows
template <int SCATTER>
__device__ __forceinline__ void write_body(const unsigned* gen, unsigned* buf, int n, long long spin,
                                           unsigned long long* times) {
    WAIT(); TRIGGER();
    long long t0 = clock64();
    while (clock64() - t0 < spin) { }
    unsigned g = gen[0];
    if (SCATTER == 0) {
        for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) buf[i] = word_of(g);
    } else {
        unsigned short* h = reinterpret_cast<unsigned short*>(buf);
        const int cols = 1024, rows = 2 * n / cols;
        for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < 2 * n; j += gridDim.x * blockDim.x)
            h[(j % rows) * cols + j / rows] = (unsigned short)(g & 0xffffu);
    }
    __syncthreads();
    if (threadIdx.x == 0) atomicMax(times, now_ns());
}
extern "C" __global__ void writer(const unsigned* gen, unsigned* buf, int n, long long spin, unsigned long long* t) {
    write_body<0>(gen, buf, n, spin, t);
}
extern "C" __global__ void writer_scatter(const unsigned* gen, unsigned* buf, int n, long long spin,
                                          unsigned long long* t) {
    write_body<1>(gen, buf, n, spin, t);
}

__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.aligned; barrier.cluster.wait.aligned;" ::: "memory");
}

// LOAD 0: ld.global (L1-cached); 1: ld.global.nc (what a const __restrict__ pointer compiles to);
// 2: cp.async.ca into shared memory; 3: cp.async.cg (L2 only, graphc's gathers). 16 bytes a thread.
template <bool CLUSTER, int LOAD>
__device__ __forceinline__ void read_body(const unsigned* __restrict__ gen, const unsigned* __restrict__ buf, int n,
                                          unsigned* stale, unsigned* buf2, long long spin) {
    const unsigned long long entered = now_ns();
    WAIT(); TRIGGER();
    if (threadIdx.x == 0) atomicMin(reinterpret_cast<unsigned long long*>(stale + 2) + 1, entered);
    if (CLUSTER) cluster_sync();
    __shared__ uint4 tile[256];
    const unsigned w = word_of(gen[0]);
    unsigned bad = 0;
    const int nblocks = gridDim.x * gridDim.y * gridDim.z;
    const int b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    for (int i = 4 * (b * blockDim.x + threadIdx.x); i < n; i += 4 * nblocks * blockDim.x) {
        uint4 v;
        if (LOAD == 0) {
            asm volatile("ld.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                         : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(buf + i) : "memory");
        } else if (LOAD == 1) {
            v = __ldg(reinterpret_cast<const uint4*>(buf + i));
        } else {
            const unsigned dst = (unsigned)__cvta_generic_to_shared(&tile[threadIdx.x]);
            if (LOAD == 2)
                asm volatile("cp.async.ca.shared.global [%0], [%1], 16;" :: "r"(dst), "l"(buf + i) : "memory");
            else
                asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(dst), "l"(buf + i) : "memory");
            asm volatile("cp.async.commit_group; cp.async.wait_group 0;" ::: "memory");
            v = tile[threadIdx.x];
        }
        bad += (v.x != w) + (v.y != w) + (v.z != w) + (v.w != w);
    }
    if (bad) atomicAdd(stale, bad);
    long long t0 = clock64();
    while (clock64() - t0 < spin) { }
    for (int i = b * blockDim.x + threadIdx.x; i < n; i += nblocks * blockDim.x) buf2[i] = w;
    if (CLUSTER) cluster_sync();
}

extern "C" __global__ void consumer(const unsigned* gen, const unsigned* buf2, int n, unsigned* stale2) {
    WAIT(); TRIGGER();
    const unsigned w = word_of(gen[0]);
    unsigned bad = 0;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) bad += (buf2[i] != w);
    if (bad) atomicAdd(stale2, bad);
}

#define ARGS const unsigned* gen, const unsigned* buf, int n, unsigned* stale, unsigned* buf2, long long spin
#define CDIMS __cluster_dims__(CLUSTER_X, CLUSTER_Y, CLUSTER_Z)
#define READERS(L) \
  extern "C" __global__ void CDIMS reader_compiled_##L(ARGS) { read_body<true, L>(gen, buf, n, stale, buf2, spin); } \
  extern "C" __global__ void reader_launched_##L(ARGS) { read_body<true, L>(gen, buf, n, stale, buf2, spin); } \
  extern "C" __global__ void reader_plain_##L(ARGS) { read_body<false, L>(gen, buf, n, stale, buf2, spin); }
READERS(0)
READERS(1)
READERS(2)
READERS(3)
"""

LOADS = ("ld.global", "ld.global.nc", "cp.async.ca", "cp.async.cg")
# case -> (kernel base name, cluster attribute at launch, PDL, a case PDL must make right)
CASES = {
    "compiled": ("reader_compiled", False, True, False),
    "launched": ("reader_launched", True, True, True),
    "no-cluster": ("reader_plain", False, True, True),
    "compiled-plain": ("reader_compiled", False, False, True),
}


def _check(result, what: str):
    err, *rest = result
    if int(err) != 0:
        raise SystemExit(f"{what} failed: {err}")
    return rest[0] if len(rest) == 1 else rest


def compile_cubin(arch: str, cluster: tuple[int, int, int]) -> bytes:
    from cuda.bindings import nvrtc

    prog = _check(nvrtc.nvrtcCreateProgram(SOURCE.encode(), b"probe.cu", 0, [], []), "nvrtcCreateProgram")
    opts = [f"--gpu-architecture={arch}".encode(), b"-std=c++17"]
    opts += [f"-DCLUSTER_{axis}={n}".encode() for axis, n in zip("XYZ", cluster, strict=True)]
    (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
    if int(err) != 0:
        size = _check(nvrtc.nvrtcGetProgramLogSize(prog), "log size")
        log = b" " * size
        nvrtc.nvrtcGetProgramLog(prog, log)
        raise SystemExit(f"NVRTC: {log.decode(errors='replace')}")
    size = _check(nvrtc.nvrtcGetCUBINSize(prog), "cubin size")
    cubin = b" " * size
    _check((nvrtc.nvrtcGetCUBIN(prog, cubin)[0], None), "cubin")
    return cubin


def reader_shapes(cluster: str, grid: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """--cluster and --reader-grid as (X, Y, Z) each; SystemExit unless the grid is a multiple of the
    cluster on every axis."""
    try:
        c, g = tuple(int(v) for v in cluster.split(",")), tuple(int(v) for v in grid.split(","))
    except ValueError:
        c = g = ()
    if len(c) != 3 or len(g) != 3 or min(c + g) < 1 or any(a % b for a, b in zip(g, c, strict=True)):
        raise SystemExit("--cluster and --reader-grid take X,Y,Z, the grid a multiple of the cluster")
    return c, g


class Probe:
    def __init__(self, args: argparse.Namespace):
        from cuda.bindings import driver as d

        self.cluster, self.grid = reader_shapes(args.cluster, args.reader_grid)
        self.d, self.args = d, args
        _check((d.cuInit(0)[0], None), "cuInit")
        dev = _check(d.cuDeviceGet(0), "cuDeviceGet")
        self.ctx = _check(d.cuDevicePrimaryCtxRetain(dev), "primary context")
        _check((d.cuCtxSetCurrent(self.ctx)[0], None), "cuCtxSetCurrent")
        major = _check(
            d.cuDeviceGetAttribute(d.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev), "cc"
        )
        minor = _check(
            d.cuDeviceGetAttribute(d.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev), "cc"
        )
        arch = f"sm_{major}{minor}"
        self.clock_khz = _check(
            d.cuDeviceGetAttribute(d.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_CLOCK_RATE, dev), "clock"
        )
        self.module = _check(d.cuModuleLoadData(compile_cubin(arch, self.cluster)), "cuModuleLoadData")
        self.stream = _check(d.cuStreamCreate(d.CUstream_flags.CU_STREAM_NON_BLOCKING.value), "cuStreamCreate")
        self.n = args.words
        self.gen = _check(d.cuMemAlloc(4), "alloc")
        self.buf = _check(d.cuMemAlloc(4 * self.n), "alloc")
        # u32 [reader's stale words, consumer's], then u64 [writer's end, reader's first entry] (ns)
        self.stale = _check(d.cuMemAlloc(24), "alloc")
        self.buf2 = _check(d.cuMemAlloc(4 * self.n), "alloc")
        _check((d.cuMemsetD32(self.gen, 0, 1)[0], None), "memset")
        _check((d.cuMemsetD32(self.buf, 0, self.n)[0], None), "memset")
        _check((d.cuMemsetD32(self.buf2, 0, self.n)[0], None), "memset")
        self.keep: list = []

    def fn(self, name: str):
        return _check(self.d.cuModuleGetFunction(self.module, name.encode()), f"function {name}")

    def launch(self, name: str, grid, block, args: list, *, pdl: bool, cluster=None, smem: int = 0) -> None:
        d = self.d
        cfg = d.CUlaunchConfig()
        cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = grid
        cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = block
        cfg.sharedMemBytes = smem
        cfg.hStream = self.stream
        attrs = []
        if pdl:
            a = d.CUlaunchAttribute()
            a.id = d.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
            a.value.programmaticStreamSerializationAllowed = 1
            attrs.append(a)
        if cluster:
            a = d.CUlaunchAttribute()
            a.id = d.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
            a.value.clusterDim.x, a.value.clusterDim.y, a.value.clusterDim.z = cluster
            attrs.append(a)
        cfg.attrs = attrs
        cfg.numAttrs = len(attrs)
        values = []
        for v, kind in args:
            values.append(kind(int(v)))
        ptrs = (ctypes.c_void_p * len(values))(*[ctypes.addressof(v) for v in values])
        self.keep.append((values, ptrs))
        fn = self.fn(name)
        if smem:
            attr = d.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
            _check((d.cuFuncSetAttribute(fn, attr, smem)[0], None), "shared memory")
        _check((d.cuLaunchKernelEx(cfg, fn, ctypes.addressof(ptrs), 0)[0], None), f"launch {name}")

    def round(self, reader: str, writer: str, cluster_attr: bool, pdl: bool) -> None:
        u64, i32, i64 = ctypes.c_uint64, ctypes.c_int32, ctypes.c_int64
        spin = int(self.args.spin_us * self.clock_khz / 1000)
        self.launch("bump", (1, 1, 1), (32, 1, 1), [(self.gen, u64)], pdl=False)
        self.launch(
            writer,
            (self.args.writer_blocks, 1, 1),
            (256, 1, 1),
            [(self.gen, u64), (self.buf, u64), (self.n, i32), (spin, i64), (int(self.stale) + 8, u64)],
            pdl=True,
        )
        reader_args = [
            (self.gen, u64),
            (self.buf, u64),
            (self.n, i32),
            (self.stale, u64),
            (self.buf2, u64),
            (spin, i64),
        ]
        cluster = self.cluster if cluster_attr else None
        self.launch(reader, self.grid, (256, 1, 1), reader_args, pdl=pdl, cluster=cluster, smem=self.args.reader_smem)
        consumer_args = [(self.gen, u64), (self.buf2, u64), (self.n, i32), (int(self.stale) + 4, u64)]
        self.launch("consumer", (264, 1, 1), (256, 1, 1), consumer_args, pdl=True)

    def stale_count(self) -> tuple[int, int, bool]:
        """(stale words the reader saw, the consumer after it saw, whether the reader entered before
        the writer had finished), then reset."""
        out = np.zeros(6, np.uint32)
        _check((self.d.cuStreamSynchronize(self.stream)[0], None), "sync")
        _check((self.d.cuMemcpyDtoH(out.ctypes.data, self.stale, 24)[0], None), "copy")
        reset = np.array([0, 0, 0, 0, 0xFFFFFFFF, 0xFFFFFFFF], np.uint32)
        _check((self.d.cuMemcpyHtoD(self.stale, reset.ctypes.data, 24)[0], None), "reset")
        times = out[2:].view(np.uint64)
        return int(out[0]), int(out[1]), bool(times[1] < times[0])

    def run_case(self, case: str, load: int, scatter: bool, graph: bool) -> dict:
        d = self.d
        base, cluster_attr, pdl, _ = CASES[case]
        reader, writer = f"{base}_{load}", "writer_scatter" if scatter else "writer"
        self.stale_count()
        rounds_bad = total = rounds_bad2 = total2 = early = 0
        if graph:
            _check(
                (d.cuStreamBeginCapture(self.stream, d.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED)[0], None),
                "capture",
            )
            self.round(reader, writer, cluster_attr, pdl)
            g = _check(d.cuStreamEndCapture(self.stream), "end capture")
            exe = _check(d.cuGraphInstantiate(g, 0), "instantiate")
        for _ in range(self.args.replays):
            if graph:
                _check((d.cuGraphLaunch(exe, self.stream)[0], None), "graph launch")
            else:
                self.round(reader, writer, cluster_attr, pdl)
            s, s2, e = self.stale_count()
            early += e
            total, total2 = total + s, total2 + s2
            rounds_bad, rounds_bad2 = rounds_bad + (s > 0), rounds_bad2 + (s2 > 0)
            self.keep.clear()
        return {
            "case": case,
            "load": LOADS[load],
            "writes": "scattered 16-bit" if scatter else "coalesced",
            "launch": "graph" if graph else "stream",
            "rounds": self.args.replays,
            "rounds_with_stale": rounds_bad,
            "stale_words": total,
            "consumer_rounds_with_stale": rounds_bad2,
            "consumer_stale_words": total2,
            "reader_entered_early": early,
        }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--replays", type=int, default=200)
    ap.add_argument("--cluster", default="1,1,4", help="the reader's cluster shape X,Y,Z")
    ap.add_argument("--reader-grid", default="8,1,16", help="the reader's grid X,Y,Z (a multiple of the cluster)")
    ap.add_argument("--reader-smem", type=int, default=0, help="dynamic shared memory a reader block takes")
    ap.add_argument("--writer-blocks", type=int, default=264)
    ap.add_argument("--words", type=int, default=1 << 20)
    ap.add_argument("--spin-us", type=float, default=20.0)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    probe = Probe(args)
    rows = []
    for case in CASES:
        for load in range(len(LOADS)):
            for scatter in (False, True):
                for graph in (False, True):
                    r = probe.run_case(case, load, scatter, graph)
                    rows.append(r)
                    print(
                        f"{r['case']:15s} {r['load']:12s} {r['writes']:16s} {r['launch']:7s} stale rounds"
                        f" {r['rounds_with_stale']:4d} / {r['rounds']}, stale words {r['stale_words']};"
                        f" the consumer after it {r['consumer_rounds_with_stale']} / {r['consumer_stale_words']};"
                        f" the reader entered early in {r['reader_entered_early']}",
                        flush=True,
                    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    bad = [r for r in rows if CASES[r["case"]][3] and (r["stale_words"] or r["consumer_stale_words"])]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
