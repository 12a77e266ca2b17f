{% raw %}
// graphc: Hopper (sm_90a) warpgroup MMA helpers: shared-memory matrix descriptors for the 128-byte
// swizzled layouts, and the wgmma fences. The wgmma instruction itself is generated per tile width
// by the template (its accumulator list is as long as the tile).

// A wgmma shared-memory descriptor: start address, leading / stride byte offsets, 128B swizzle.
__device__ __forceinline__ unsigned long long gc_wgmma_desc(unsigned saddr, unsigned lbo, unsigned sbo) {
  unsigned long long d = 0;
  d |= (unsigned long long)((saddr & 0x3FFFF) >> 4);
  d |= (unsigned long long)((lbo >> 4) & 0x3FFF) << 16;
  d |= (unsigned long long)((sbo >> 4) & 0x3FFF) << 32;
  d |= 1ull << 62;  // SWIZZLE_128B
  return d;
}
__device__ __forceinline__ void gc_wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void gc_wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void gc_wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Make this thread's completed generic-proxy writes (cp.async results) visible to the async proxy
// (wgmma reads shared memory through it).
__device__ __forceinline__ void gc_fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
{% endraw %}
{% raw %}
// A wgmma accumulator (or register operand) as an asm operand: the compiler may not move a read of
// it above an earlier wgmma wait, nor a write below a later wgmma issue (the wait names no register).
__device__ __forceinline__ void gc_fence_operand(float& r) { asm volatile("" : "+f"(r)::"memory"); }
__device__ __forceinline__ void gc_fence_operand(unsigned& r) { asm volatile("" : "+r"(r)::"memory"); }
{% endraw %}
