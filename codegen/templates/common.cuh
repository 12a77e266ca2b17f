// graphc: definitions every generated kernel includes. Self-contained on purpose: no CUDA system
// headers, so NVRTC from pip compiles every template with no toolkit installed. Half and bfloat16
// are stored as 16-bit integers and converted with PTX instructions.
#pragma once

typedef unsigned short gc_half;
typedef unsigned short gc_bf16;
typedef long long gc_i64;
typedef unsigned long long gc_u64;

__device__ __forceinline__ float gc_h2f(gc_half h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
}
__device__ __forceinline__ gc_half gc_f2h(float f) {
  gc_half h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
}
__device__ __forceinline__ float gc_bf2f(gc_bf16 h) { return __uint_as_float(((unsigned)h) << 16); }
__device__ __forceinline__ gc_bf16 gc_f2bf(float f) {
#if __CUDA_ARCH__ >= 800
  gc_bf16 h;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
#else
  unsigned u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (gc_bf16)((u >> 16) | 0x40u);  // NaN stays NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
  return (gc_bf16)(u >> 16);
#endif
}

// FP8 E4M3 (float8e4m3fn: bias 7, no infinities, 0x7f/0xff NaN, largest finite 448), stored as a
// byte. To e4m3: round to nearest even, saturating to +-448 (inf too; NaN stays NaN), as ONNX's
// saturating Cast and QuantizeLinear to float8e4m3fn. sm_89+ only (the fp8 engines are sm_90's:
// codegen/families/gemm_fp8.py); an older arch never calls it, and ptxas would refuse it there.
__device__ __forceinline__ unsigned char gc_f2e4m3(float f) {
  unsigned short r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(0.f), "f"(f));  // f in the low byte
  return (unsigned char)(r & 0xffu);
}
__device__ __forceinline__ float gc_e4m32f(unsigned char v) {
  const unsigned e = (v >> 3) & 15u, m = v & 7u;
  float a;
  if ((v & 0x7fu) == 0x7fu) a = __uint_as_float(0x7fc00000u);
  else if (e == 0) a = (float)m * 0.001953125f;  // m * 2^-9
  else a = __uint_as_float(((e + 120u) << 23) | (m << 20));
  return (v & 0x80u) ? -a : a;
}

// Pack two fp32 into a half2 / bf162 register (low half = a).
__device__ __forceinline__ unsigned gc_pack_h2(float a, float b) {
  unsigned r;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(b), "f"(a));
  return r;
}
__device__ __forceinline__ unsigned gc_pack_bf2(float a, float b) {
  unsigned r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(b), "f"(a));
  return r;
}

// Elementwise math used by rendered epilogues.
__device__ __forceinline__ float gc_sigmoid(float x) { return 1.f / (1.f + __expf(-x)); }
__device__ __forceinline__ float gc_gelu(float x) { return 0.5f * x * (1.f + erff(x * 0.7071067811865476f)); }
__device__ __forceinline__ float gc_gelu_tanh(float x) {
  return 0.5f * x * (1.f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
}
__device__ __forceinline__ float gc_softplus(float x) { return x > 20.f ? x : log1pf(__expf(x)); }
__device__ __forceinline__ double gc_sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }

// Warp and block reductions (fp32).
__device__ __forceinline__ float gc_warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float gc_warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Min/Max that propagate NaN, as ONNX Min and Max do (fminf/fmaxf would drop it).
__device__ __forceinline__ float gc_min_nan(float a, float b) { return (a != a || b != b) ? __int_as_float(0x7fc00000) : fminf(a, b); }
__device__ __forceinline__ float gc_max_nan(float a, float b) { return (a != a || b != b) ? __int_as_float(0x7fc00000) : fmaxf(a, b); }
__device__ __forceinline__ double gc_min_nan(double a, double b) { return (a != a || b != b) ? a + b : fmin(a, b); }
__device__ __forceinline__ double gc_max_nan(double a, double b) { return (a != a || b != b) ? a + b : fmax(a, b); }

// Programmatic dependent launch (sm_90+). codegen/kernel.py puts GC_PDL_ENTRY() first in every
// kernel's body, so that no thread touches global memory before it: griddepcontrol.wait returns
// once the grids this one depends on have completed and their writes are visible (reads of their
// outputs are safe, and so are writes to arena bytes they still read: the plan reuses regions).
// launch_dependents, right after, lets the next kernel of the stream be scheduled while this one
// runs; the next one waits in its own GC_PDL_ENTRY() for this one to complete, so ordering is
// transitive along the stream whatever a kernel does later (early returns, persistent loops,
// clusters, the module-global split-K counters, reset before the grid completes). Without a
// programmatic launch (plain launches, other GPUs) both instructions are no-ops; before sm_90 the
// macro is empty.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define GC_PDL_ENTRY() asm volatile("griddepcontrol.wait;\n\tgriddepcontrol.launch_dependents;" ::: "memory")
#else
#define GC_PDL_ENTRY() ((void)0)
#endif
