// cuconv layout: the stacked-phase filter W' gathered from a convolution's weights (cuconv/subpixel.py).
//
//   W'[ph * C + c, j, k] = w[k, tap[ph * J + j], c]   (zero where tap[...] < 0)
//
// w is (K, F, C) (F the filter's taps, flattened), W' is (P * C, J, K) (J the window's taps, flattened):
// for one (phase, window tap) entry, the K x C slice of w at one filter tap, transposed. One block moves
// a 64 x 64 tile of one entry through shared memory: it reads 64 consecutive channels of each of 64
// filters and writes 64 consecutive filters of each of 64 channels (32-element row segments per warp
// access), so both sides are coalesced, with sixteen loads in flight per thread. (A gather with one
// index per element reads w along k, one sector per element: six times slower on a 512 x 4 x 4 x 256
// filter.)
//
// Grid: (ceil(K / 64), ceil(C / 64), P * J) blocks of 256 threads; `taps` holds P * J ints (device).
// stacked_filter_b2 / _b4 / _b8 move 2-, 4- or 8-byte elements as bits.
#include "common/types.cuh"

namespace cuconv {
namespace layout {

struct StackedFilterArgs {
  int32_t K, C, F, J;  // filters, channels, filter taps, window taps
};

template <typename E>
__device__ __forceinline__ void stacked_filter(const E* __restrict__ w, const int32_t* __restrict__ taps,
                                               E* __restrict__ wt, const StackedFilterArgs& a) {
  __shared__ E tile[64][65];
  const int tx = threadIdx.x & 31, ty = threadIdx.x >> 5;  // 8 warps
  const int k0 = blockIdx.x * 64, c0 = blockIdx.y * 64;
  const int entry = blockIdx.z;
  const int ph = entry / a.J, j = entry - ph * a.J;
  const int f = taps[entry];
  if (f >= 0) {
    // Each warp reads rows (filters) ty, ty + 8, ..., 64 channels of each as two 32-element halves: all
    // sixteen loads of a thread are issued before the first is used.
    E v[16];
#pragma unroll
    for (int r = 0; r < 16; ++r) {
      const int k = k0 + ty + 8 * (r >> 1), c = c0 + tx + 32 * (r & 1);
      v[r] = (k < a.K && c < a.C) ? w[((long long)k * a.F + f) * a.C + c] : E{};
    }
#pragma unroll
    for (int r = 0; r < 16; ++r) tile[ty + 8 * (r >> 1)][tx + 32 * (r & 1)] = v[r];
    __syncthreads();
  }
  // Each warp writes rows (channels) ty, ty + 8, ..., 64 filters of each; a tap no phase has writes zeros.
#pragma unroll
  for (int r = 0; r < 16; ++r) {
    const int c = c0 + ty + 8 * (r >> 1), k = k0 + tx + 32 * (r & 1);
    if (c < a.C && k < a.K) {
      wt[(((long long)ph * a.C + c) * a.J + j) * a.K + k] =
          f >= 0 ? tile[tx + 32 * (r & 1)][ty + 8 * (r >> 1)] : E{};
    }
  }
}

}  // namespace layout
}  // namespace cuconv

#define CUCONV_STACKED_FILTER(name, E)                                                                          \
  extern "C" __global__ void __launch_bounds__(256) name(const E* w, const int32_t* taps, E* wt,              \
                                                         const cuconv::layout::StackedFilterArgs a) {        \
    cuconv::layout::stacked_filter(w, taps, wt, a);                                                          \
  }
CUCONV_STACKED_FILTER(stacked_filter_b2, uint16_t)
CUCONV_STACKED_FILTER(stacked_filter_b4, uint32_t)
CUCONV_STACKED_FILTER(stacked_filter_b8, unsigned long long)
