// cuconv layout: the stacked-phase filter W' gathered from a convolution's weights (cuconv/subpixel.py).
//
//   W'[ph * C + c, j, k] = w[k, tap[ph * J + j], c]   (zero where tap[...] < 0)
//
// w is (K, F, C) (F the filter's taps, flattened), W' is (P * C, J, K) (J the window's taps, flattened):
// for one (phase, window tap) entry, the K x C slice of w at one filter tap, transposed. Each entry is a
// 2-D transpose with its own source and destination: rows k (stride F * C in w), columns c, written as
// rows c (stride J * K in W') of columns k. One block moves one 64 x 64 tile of one entry:
//
// stacked_filter_b2: transpose.cu's 16-bit tile (transpose_tile.cuh, tile_b16: row pairs packed into
// 32-bit words, a conflict-free shared-memory layout), with 32-bit global accesses where the entry's row
// starts are 4-byte aligned.
// stacked_filter_b4 / _b8: 4- and 8-byte elements (float32, float64) through a padded 64 x 65 tile, one
// element per access.
//
// An entry with no tap writes zeros. (A gather with one index per element reads w along k, one sector
// per element: three to five times slower on the filters of the grad suite.)
//
// Grid: (ceil(C / 64), ceil(K / 64), P * J) blocks of 256 threads; `taps` holds P * J ints (device).
#include "common/types.cuh"
#include "layout/transpose_tile.cuh"

namespace cuconv {
namespace layout {

struct StackedFilterArgs {
  int32_t K, C, F, J;  // filters, channels, filter taps, window taps
};

// Entry blockIdx.z's source and destination, and its tap (negative: no tap).
struct Entry {
  long long src, dst;  // element offsets of w[0, f, 0] and W'[ph * C, j, 0]
  int tap;
};

__device__ __forceinline__ Entry entry_of(const int32_t* __restrict__ taps, const StackedFilterArgs& a) {
  const int e = blockIdx.z;
  const int ph = e / a.J, j = e - ph * a.J;
  const int f = taps[e];
  return Entry{(long long)(f < 0 ? 0 : f) * a.C, ((long long)ph * a.C * a.J + j) * a.K, f};
}

// Zeros into the 64 x 64 tile (rows c, columns k) of an entry with no tap.
template <typename E>
__device__ __forceinline__ void zero_tile(E* __restrict__ y, const StackedFilterArgs& a, int k0, int c0) {
  const int tx = threadIdx.x & 63, ty = threadIdx.x >> 6;  // 4 rows of 64
  for (int r = ty; r < 64; r += 4) {
    const int c = c0 + r, k = k0 + tx;
    if (c < a.C && k < a.K) y[(long long)c * a.J * a.K + k] = E{};
  }
}

template <typename E>
__device__ __forceinline__ void stacked_filter_wide(const E* __restrict__ w, const int32_t* __restrict__ taps,
                                                    E* __restrict__ wt, const StackedFilterArgs& a) {
  __shared__ E tile[64][65];
  const Entry en = entry_of(taps, a);
  const int c0 = blockIdx.x * 64, k0 = blockIdx.y * 64;
  E* y = wt + en.dst;
  if (en.tap < 0) {
    zero_tile(y, a, k0, c0);
    return;
  }
  const E* x = w + en.src;
  const int tx = threadIdx.x & 63, ty = threadIdx.x >> 6;  // 4 rows of 64
  for (int r = ty; r < 64; r += 4) {
    const int k = k0 + r, c = c0 + tx;
    tile[r][tx] = (k < a.K && c < a.C) ? x[(long long)k * a.F * a.C + c] : E{};
  }
  __syncthreads();
  for (int r = ty; r < 64; r += 4) {
    const int c = c0 + r, k = k0 + tx;
    if (c < a.C && k < a.K) y[(long long)c * a.J * a.K + k] = tile[tx][r];
  }
}

__device__ __forceinline__ void stacked_filter_b16(const uint16_t* __restrict__ w, const int32_t* __restrict__ taps,
                                                   uint16_t* __restrict__ wt, const StackedFilterArgs& a) {
  const Entry en = entry_of(taps, a);
  uint16_t* y = wt + en.dst;
  if (en.tap < 0) {
    zero_tile(y, a, blockIdx.y * 64, blockIdx.x * 64);
    return;
  }
  const uint16_t* x = w + en.src;
  TransposeArgs t;
  t.rows = a.K;
  t.cols = a.C;
  t.x_batch_stride = t.y_batch_stride = 0;
  t.x_row_stride = (int64_t)a.F * a.C;
  t.y_row_stride = (int64_t)a.J * a.K;
  // 32-bit accesses where every row of the entry starts on a 4-byte boundary (w comes from the caller)
  // and holds whole pairs (a word past the end of a row is the next row's first element)
  t.word_loads = ((reinterpret_cast<uint64_t>(x) & 3) == 0 && (t.x_row_stride & 1) == 0 && (a.C & 1) == 0) ? 1 : 0;
  t.word_stores = ((reinterpret_cast<uint64_t>(y) & 3) == 0 && (t.y_row_stride & 1) == 0 && (a.K & 1) == 0) ? 1 : 0;
  tile_b16(x, y, t, blockIdx.x, blockIdx.y, 0);
}

}  // namespace layout
}  // namespace cuconv

extern "C" __global__ void __launch_bounds__(256) stacked_filter_b2(const uint16_t* w, const int32_t* taps, uint16_t* wt,
                                                                   const cuconv::layout::StackedFilterArgs a) {
  cuconv::layout::stacked_filter_b16(w, taps, wt, a);
}
extern "C" __global__ void __launch_bounds__(256) stacked_filter_b4(const uint32_t* w, const int32_t* taps, uint32_t* wt,
                                                                   const cuconv::layout::StackedFilterArgs a) {
  cuconv::layout::stacked_filter_wide(w, taps, wt, a);
}
extern "C" __global__ void __launch_bounds__(256) stacked_filter_b8(const unsigned long long* w, const int32_t* taps,
                                                                   unsigned long long* wt,
                                                                   const cuconv::layout::StackedFilterArgs a) {
  cuconv::layout::stacked_filter_wide(w, taps, wt, a);
}
