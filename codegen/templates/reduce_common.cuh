// graphc: helpers of the reduction templates (reduction.cu.j2, rowwise.cu.j2). Included after
// common.cuh. A "row" is reduced by TPR lanes (a power of two, 1..1024) of one block; a block holds
// RPB = blockDim.x / TPR rows. Every thread of a block must call the row reductions (they
// synchronize the block when TPR > 32), so kernels never return early: out-of-range rows compute
// garbage and skip their stores.

template <typename T>
__device__ __forceinline__ T gc_shfl_xor(T v, int o) {
  return __shfl_xor_sync(0xffffffffu, v, o);
}

__device__ __forceinline__ float gc_exp(float x) { return expf(x); }
__device__ __forceinline__ double gc_exp(double x) { return exp(x); }
__device__ __forceinline__ float gc_log(float x) { return logf(x); }
__device__ __forceinline__ double gc_log(double x) { return log(x); }
__device__ __forceinline__ float gc_sqrt(float x) { return sqrtf(x); }
__device__ __forceinline__ double gc_sqrt(double x) { return sqrt(x); }
template <typename T>
__device__ __forceinline__ bool gc_isnan(T x) { return x != x; }
template <typename T>
__device__ __forceinline__ bool gc_isfinite(T x) { return x == x && x - x == x - x; }

// Combiners. Max/Min propagate NaN as numpy's max/min do (fmaxf would drop it).
struct GcSum {
  template <typename T> __device__ __forceinline__ T operator()(T a, T b) const { return a + b; }
};
struct GcProd {
  template <typename T> __device__ __forceinline__ T operator()(T a, T b) const { return a * b; }
};
struct GcMax {
  template <typename T> __device__ __forceinline__ T operator()(T a, T b) const { return (a > b || a != a) ? a : b; }
};
struct GcMin {
  template <typename T> __device__ __forceinline__ T operator()(T a, T b) const { return (a < b || a != a) ? a : b; }
};

// Reduce v over the TPR lanes of this thread's row; every lane of the row gets the result.
// smem holds blockDim.x / 32 values (used only when TPR > 32).
template <int TPR, typename T, typename Op>
__device__ __forceinline__ T gc_row_reduce(T v, Op op, T* smem) {
#pragma unroll
  for (int o = (TPR < 32 ? TPR : 32) / 2; o > 0; o >>= 1) v = op(v, gc_shfl_xor(v, o));
  if constexpr (TPR > 32) {
    constexpr int WPR = TPR / 32;
    const int row = threadIdx.x / TPR;
    const int warp = (threadIdx.x % TPR) / 32;
    __syncthreads();  // the previous reduction's readers are done with smem
    if ((threadIdx.x & 31) == 0) smem[row * WPR + warp] = v;
    __syncthreads();
    v = smem[row * WPR];
#pragma unroll
    for (int w = 1; w < WPR; ++w) v = op(v, smem[row * WPR + w]);
  }
  return v;
}

// ArgMax/ArgMin order: NaN wins (numpy's argmax/argmin return the first NaN), then the larger
// (IS_MAX) or smaller value, then the first (or, with LAST, the last) index.
template <bool IS_MAX, bool LAST, typename T>
__device__ __forceinline__ bool gc_arg_better(T av, long long ai, T bv, long long bi) {
  const bool an = av != av, bn = bv != bv;
  if (an != bn) return an;
  if (!an && av != bv) return IS_MAX ? av > bv : av < bv;
  return LAST ? ai > bi : ai < bi;
}

template <int TPR, bool IS_MAX, bool LAST, typename T>
__device__ __forceinline__ void gc_row_argreduce(T& v, long long& i, T* smem_v, long long* smem_i) {
#pragma unroll
  for (int o = (TPR < 32 ? TPR : 32) / 2; o > 0; o >>= 1) {
    const T ov = gc_shfl_xor(v, o);
    const long long oi = gc_shfl_xor(i, o);
    if (gc_arg_better<IS_MAX, LAST>(ov, oi, v, i)) {
      v = ov;
      i = oi;
    }
  }
  if constexpr (TPR > 32) {
    constexpr int WPR = TPR / 32;
    const int row = threadIdx.x / TPR;
    const int warp = (threadIdx.x % TPR) / 32;
    __syncthreads();
    if ((threadIdx.x & 31) == 0) {
      smem_v[row * WPR + warp] = v;
      smem_i[row * WPR + warp] = i;
    }
    __syncthreads();
    v = smem_v[row * WPR];
    i = smem_i[row * WPR];
#pragma unroll
    for (int w = 1; w < WPR; ++w) {
      if (gc_arg_better<IS_MAX, LAST>(smem_v[row * WPR + w], smem_i[row * WPR + w], v, i)) {
        v = smem_v[row * WPR + w];
        i = smem_i[row * WPR + w];
      }
    }
  }
}
