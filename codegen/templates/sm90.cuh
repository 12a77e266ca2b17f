{% raw %}
// graphc: Hopper (sm_90a) primitives of the TMA GEMM: mbarriers, bulk tensor copies (TMA) through a
// tensor map held in global memory, register reallocation and named barriers. Every helper is one
// PTX instruction (or a try-wait loop) so that the SASS shows what the kernel does.

// A CUtensorMap: 128 opaque bytes, 64-byte aligned, encoded by the driver (cuTensorMapEncodeTiled)
// when an engine context is created; the kernel gets a pointer to it in global memory.
struct __align__(64) gc_tmap {
  unsigned long long opaque[16];
};

__device__ __forceinline__ void gc_mbar_init(unsigned bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// Make the barrier initializations visible to the async proxy (TMA) before first use.
__device__ __forceinline__ void gc_mbar_fence_init() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
__device__ __forceinline__ void gc_mbar_arrive_tx(unsigned bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void gc_mbar_arrive(unsigned bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Wait until the phase of parity `parity` has completed.
__device__ __forceinline__ void gc_mbar_wait(unsigned bar, unsigned parity) {
  unsigned done;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}

__device__ __forceinline__ void gc_tma_prefetch(const gc_tmap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(map) : "memory");
}
// One box of a 3-D tensor map (inner coordinate first) into shared memory; completion is counted
// in bytes on barrier `bar`. Out-of-bounds elements are written as zeros (and counted).
__device__ __forceinline__ void gc_tma_load3(unsigned dst, const gc_tmap* map, unsigned bar, int c0, int c1, int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], [%2];\n" ::"r"(dst),
      "l"(map), "r"(bar), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}

template <int N>
__device__ __forceinline__ void gc_setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void gc_setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
// A barrier among `count` threads (whole warps) of one warpgroup: id 0 is __syncthreads'.
__device__ __forceinline__ void gc_named_sync(int id, int count) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
{% endraw %}
