// cuconv layout: the filter of an input gradient, wt[g Cg + c][t][k] = w[g Kg + k][src(t)][c].
//
// The input gradient of a convolution is a forward convolution with the filter's taps reversed and
// its K and C axes exchanged within each group (cuconv/grad.py). One output phase of a strided
// convolution uses a subset of the taps: per spatial dim i (up to 3, outermost first) its T_i taps
// are source taps start_i - t_i * step_i, so the T = T_0 T_1 T_2 taps of wt read
//   src(t) = ((start_0 - t_0 step_0) F_1 + start_1 - t_1 step_1) F_2 + start_2 - t_2 step_2
// of the F = F_0 F_1 F_2 taps of w (unused dims: T_i = F_i = 1, start_i = 0).
// Per (group, tap) it is a Kg x Cg -> Cg x Kg transpose: 32 x 32 tiles through shared memory
// (padded to 33 columns), reads along c and writes along k each a warp's consecutive elements.
// Elements are moved as raw bits: flip_filter_b16 / _b32 / _b64 serve every dtype.
#include "common/types.cuh"

namespace cuconv {
namespace layout {

struct FlipArgs {
  int32_t Kg, Cg, groups;
  int32_t T0, T1, T2;        // taps of wt per dim
  int32_t F1, F2, F;         // w's taps: inner dims and total
  int32_t start0, start1, start2, step0, step1, step2;
};

template <typename T>
__device__ __forceinline__ void flip_tile(const T* __restrict__ w, T* __restrict__ wt, const FlipArgs& a) {
  __shared__ T tile[32][33];
  const int taps = a.T0 * a.T1 * a.T2;
  const int t = blockIdx.z % taps, g = blockIdx.z / taps;
  const int t2 = t % a.T2, t1 = (t / a.T2) % a.T1, t0 = t / (a.T2 * a.T1);
  const int src = ((a.start0 - t0 * a.step0) * a.F1 + a.start1 - t1 * a.step1) * a.F2 + a.start2 - t2 * a.step2;
  const int c0 = blockIdx.x * 32, k0 = blockIdx.y * 32;
  const int tx = threadIdx.x & 31, ty = threadIdx.x >> 5;
#pragma unroll
  for (int j = 0; j < 32; j += 8) {
    const int k = k0 + ty + j, c = c0 + tx;
    if (k < a.Kg && c < a.Cg) tile[ty + j][tx] = w[(((long long)g * a.Kg + k) * a.F + src) * a.Cg + c];
  }
  __syncthreads();
#pragma unroll
  for (int j = 0; j < 32; j += 8) {
    const int c = c0 + ty + j, k = k0 + tx;
    if (c < a.Cg && k < a.Kg) wt[(((long long)g * a.Cg + c) * taps + t) * a.Kg + k] = tile[tx][ty + j];
  }
}

}  // namespace layout
}  // namespace cuconv

// grid (ceil(Cg / 32), ceil(Kg / 32), groups * T), 256 threads (8 rows of 32)
extern "C" __global__ void __launch_bounds__(256) flip_filter_b16(const uint16_t* w, uint16_t* wt,
                                                                  cuconv::layout::FlipArgs a) {
  cuconv::layout::flip_tile(w, wt, a);
}
extern "C" __global__ void __launch_bounds__(256) flip_filter_b32(const uint32_t* w, uint32_t* wt,
                                                                  cuconv::layout::FlipArgs a) {
  cuconv::layout::flip_tile(w, wt, a);
}
extern "C" __global__ void __launch_bounds__(256) flip_filter_b64(const unsigned long long* w, unsigned long long* wt,
                                                                  cuconv::layout::FlipArgs a) {
  cuconv::layout::flip_tile(w, wt, a);
}
