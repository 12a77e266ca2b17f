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
// One 16-byte global store of four 32-bit words (the address 16-byte aligned). Written as PTX: the
// compiler splits a uint4 assignment built from packed halves into four 4-byte stores. No "memory"
// clobber: with one, no load could move above a store, and an epilogue's next 8 columns would wait
// for the last ones' store (each thread stores elements that no other thread and no later load of
// this kernel reads).
__device__ __forceinline__ void gc_st_global_v4(void* p, unsigned a, unsigned b, unsigned c, unsigned d) {
  asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"l"(p), "r"(a), "r"(b), "r"(c), "r"(d));
}
__device__ __forceinline__ void gc_st_global_v2(void* p, unsigned a, unsigned b) {
  asm volatile("st.global.v2.b32 [%0], {%1, %2};\n" ::"l"(p), "r"(a), "r"(b));
}
__device__ __forceinline__ void gc_st_global_v1(void* p, unsigned a) {
  asm volatile("st.global.b32 [%0], %1;\n" ::"l"(p), "r"(a));
}
// GELU (erf form) for the GEMM epilogue: erf by Abramowitz & Stegun 7.1.26 (|error| <= 1.5e-7),
// with the approximate reciprocal and 2^x of the SFU: about 15 instructions against about 40 for
// erff, whose two FSEL-selected polynomials dominated an FFN GEMM's epilogue. 1 + erf(z) of a
// negative z is the series term itself (no cancellation). Largest error against the exact GELU:
// 3.3e-7 absolute, 1.7e-4 relative where |GELU(x)| > 1e-3, below half an fp16 ulp; the sm_90 GEMM
// runs only fp16/bf16 problems.
__device__ __forceinline__ float gc_gelu_fast(float x) {
  // t = 1 / (1 + p |z|) with z = x / sqrt(2); e = exp(-z^2) = 2^(x * x * (-log2(e) / 2))
  float t, e;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(t) : "f"(fmaf(0.3275911f * 0.7071067811865476f, fabsf(x), 1.f)));
  const float p = ((((1.061405429f * t - 1.453152027f) * t + 1.421413741f) * t - 0.284496736f) * t + 0.254829592f) * t;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"((x * -0.7213475204444817f) * x));
  const float s = (0.5f * x) * (p * e);  // x/2 * (1 - erf(|z|))
  return x < 0.f ? s : x - s;            // x/2 * (1 + erf(z))
}
// GELU (tanh form, GPT-2's) for the GEMM epilogue: 0.5 x (1 + tanh(u)) = x sigmoid(2u) =
// x / (1 + e^(-2u)) with u = sqrt(2 / pi) (x + 0.044715 x^3), through ex2.approx and rcp.approx:
// two MUFU operations and no branch, where tanhf is a polynomial and a branch besides; the
// sigmoid form has no cancellation where tanh(u) is near -1 (x < -2), which 1 + tanh.approx(u)
// would have. Relative error about 1e-6 (ex2.approx 2^-22, rcp.approx 1 ulp, e^(-2u)'s error
// relative 2|u| times u's); the limits are exact: x for large x, -0 for very negative x.
__device__ __forceinline__ float gc_gelu_tanh_fast(float x) {
  const float u = 0.7978845608028654f * fmaf(0.044715f * x, x * x, x);
  float e, r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(u * -2.8853900817779268f));  // e^(-2u) = 2^(-2u log2(e))
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(1.f + e));
  return x * r;
}
// Thread-block clusters (sm_90): a barrier of every thread of every CTA of the cluster, with
// release/acquire semantics for shared-memory writes (the cluster's distributed shared memory);
// the shared::cluster address of a 32-bit shared::cta address in the CTA of rank `rank`; a 16-byte
// load from distributed shared memory (the address 16-byte aligned).
__device__ __forceinline__ void gc_cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
__device__ __forceinline__ unsigned gc_dsmem_addr(unsigned addr, unsigned rank) {
  unsigned r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(addr), "r"(rank));
  return r;
}
__device__ __forceinline__ unsigned gc_ld_dsmem_u32(unsigned addr) {
  unsigned v;
  asm volatile("ld.shared::cluster.u32 %0, [%1];\n" : "=r"(v) : "r"(addr) : "memory");
  return v;
}
__device__ __forceinline__ float4 gc_ld_dsmem_f4(unsigned addr) {
  float4 v;
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];\n"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(addr)
               : "memory");
  return v;
}
{% endraw %}
