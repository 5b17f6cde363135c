// cuconv: the deterministic end of a split reduction. out[i] = sum over s < splits of ws[s][i] in fp32,
// converted to the data's dtype, in an order fixed by `splits` alone: the same bits on every run
// (whatever the scheduling of the CTAs that wrote ws).
//
// The order: the splits fall into G runs of L = ceil(splits / G) consecutive splits; each run is added
// in split order, then the runs' sums in run order (G = 1: plain split order). G grows with the split
// count (split_runs) so that a long sum is walked by G threads at once: a thread's loads of one run
// follow each other at memory latency (ptxas keeps two in flight), and the weight gradient of a
// few-channel stem splits its pixels 131 ways over few output elements. A CTA of 256 threads takes
// 256 / G elements (or float4 quads of them) at a time, the G run sums meeting in shared memory.
// Grid-stride loop; any grid; blockDim.x == 256.
#pragma once
#include "common/types.cuh"

namespace cuconv {

constexpr int SPLIT_SUM_THREADS = 256;

// Runs per element: 1 up to 15 splits, then a power of two up to 16 with runs of at least 8 splits.
__device__ __forceinline__ int split_runs(int splits) {
  int g = 1;
  while (g < 16 && splits >= 16 * g) g *= 2;
  return g;
}

__device__ __forceinline__ void add_to(float& sum, const float& v) { sum += v; }
__device__ __forceinline__ void add_to(float4& sum, const float4& v) {
  sum.x += v.x;
  sum.y += v.y;
  sum.z += v.z;
  sum.w += v.w;
}

__device__ __forceinline__ void store_sum(elem_t* out, long long i, float v) { out[i] = from_float<elem_t>(v); }
__device__ __forceinline__ void store_sum(elem_t* out, long long i, const float4& v) {
  out[4 * i] = from_float<elem_t>(v.x);
  out[4 * i + 1] = from_float<elem_t>(v.y);
  out[4 * i + 2] = from_float<elem_t>(v.z);
  out[4 * i + 3] = from_float<elem_t>(v.w);
}

// T: float, or float4 over quads of elements (units = count / 4).
template <typename T>
__device__ __forceinline__ T run_sum(const T* __restrict__ ws, long long units, long long i, int s0, int s1) {
  T sum = T();  // zero: value-initialised
  for (int s = s0; s < s1; ++s) add_to(sum, ws[s * units + i]);
  return sum;
}

template <typename T>
__device__ __forceinline__ void split_sum_units(const T* __restrict__ ws, elem_t* __restrict__ out, long long units,
                                                int splits) {
  const int g = split_runs(splits);
  if (g == 1) {  // one thread per element
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < units; i += (long long)gridDim.x * blockDim.x)
      store_sum(out, i, run_sum(ws, units, i, 0, splits));
    return;
  }
  __shared__ T partial[SPLIT_SUM_THREADS];
  const int run = threadIdx.x % g, per_cta = SPLIT_SUM_THREADS / g;
  const int len = (splits + g - 1) / g;
  const int s0 = min(splits, run * len), s1 = min(splits, s0 + len);
  for (long long base = (long long)blockIdx.x * per_cta; base < units; base += (long long)gridDim.x * per_cta) {
    const long long i = base + threadIdx.x / g;
    partial[threadIdx.x] = i < units ? run_sum(ws, units, i, s0, s1) : T();
    __syncthreads();
    if (run == 0 && i < units) {
      T total = partial[threadIdx.x];
      for (int r = 1; r < g; ++r) add_to(total, partial[threadIdx.x + r]);
      store_sum(out, i, total);
    }
    __syncthreads();  // partial is rewritten by the next pass
  }
}

__device__ __forceinline__ void split_sum(const float* __restrict__ ws, elem_t* __restrict__ out, long long count,
                                          int splits) {
  if ((count & 3) == 0)  // 16-byte loads of 4 sums (ws comes from the allocator: 256-byte aligned)
    split_sum_units(reinterpret_cast<const float4*>(ws), out, count >> 2, splits);
  else
    split_sum_units(ws, out, count, splits);
}

}  // namespace cuconv
