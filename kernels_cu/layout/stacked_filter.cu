// cuconv layout: the stacked-phase filter W' gathered from a convolution's weights (cuconv/subpixel.py).
//
//   W'[ph * C + c, j, k] = w[k, tap[ph * J + j], c]   (zero where tap[...] < 0)
//
// w is (K, F, C) (F the filter's taps, flattened), W' is (P * C, J, K) (J the window's taps, flattened):
// for one (phase, window tap) entry, the K x C slice of w at one filter tap, transposed. One block moves
// a 32 x 32 tile of one entry through shared memory: it reads 32 consecutive channels of each of 32
// filters (one 32-element row segment per warp) and writes 32 consecutive filters of each of 32
// channels, so both sides are coalesced. (A gather with one index per element reads w along k, one
// sector per element: six times slower on a 512 x 4 x 4 x 256 filter.)
//
// Grid: (ceil(K / 32), ceil(C / 32), P * J) blocks of 256 threads; `taps` holds P * J ints (device).
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
  __shared__ E tile[32][33];
  const int tx = threadIdx.x & 31, ty = threadIdx.x >> 5;  // 8 warps
  const int k0 = blockIdx.x * 32, c0 = blockIdx.y * 32;
  const int entry = blockIdx.z;
  const int ph = entry / a.J, j = entry - ph * a.J;
  const int f = taps[entry];
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    const int k = k0 + ty + 8 * r, c = c0 + tx;
    tile[ty + 8 * r][tx] = (f >= 0 && k < a.K && c < a.C) ? w[((long long)k * a.F + f) * a.C + c] : E{};
  }
  __syncthreads();
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    const int c = c0 + ty + 8 * r, k = k0 + tx;
    if (c < a.C && k < a.K) wt[(((long long)ph * a.C + c) * a.J + j) * a.K + k] = tile[tx][ty + 8 * r];
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
