// cuconv layout: the shared-memory tiles of the batched 2-D transpose (transpose.cu describes them):
// tile_b16 (64 x 64 16-bit elements, 32-bit global accesses where the row starts allow) and tile_b32
// (32 x 32 32-bit elements). transpose.cu's kernels and stacked_filter.cu (the stacked-phase filter, one
// transpose per phase and window tap) run them.
#pragma once
#include "common/types.cuh"

namespace cuconv {
namespace layout {

struct TransposeArgs {
  int64_t rows, cols;
  int64_t x_batch_stride, x_row_stride;  // x[b][r][c] at b * x_batch_stride + r * x_row_stride + c
  int64_t y_batch_stride, y_row_stride;  // y[b][c][r] at b * y_batch_stride + c * y_row_stride + r
  int32_t word_loads, word_stores;       // transpose_b16: 32-bit global accesses allowed
};

__device__ __forceinline__ uint32_t load_pair(const uint16_t* p, bool first, bool second, bool word) {
  if (word) return first ? __ldg(reinterpret_cast<const uint32_t*>(p)) : 0u;
  const uint32_t lo = first ? __ldg(p) : 0u, hi = second ? __ldg(p + 1) : 0u;
  return lo | (hi << 16);
}

__device__ __forceinline__ void store_pair(uint16_t* p, uint32_t v, bool first, bool second, bool word) {
  if (word) {
    if (first) *reinterpret_cast<uint32_t*>(p) = v;
    return;
  }
  if (first) p[0] = (uint16_t)(v & 0xFFFF);
  if (second) p[1] = (uint16_t)(v >> 16);
}


// The 64 x 64 tile (bx, by) of batch bz (blockIdx's role in transpose_b16).
__device__ __forceinline__ void tile_b16(const uint16_t* __restrict__ x, uint16_t* __restrict__ y,
                                         const TransposeArgs& a, int64_t bx, int64_t by, int64_t bz) {
  __shared__ uint32_t tile[64 * 32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t r0 = by * 64, c0 = bx * 64;
  const uint16_t* xb = x + bz * a.x_batch_stride;
  const int64_t c = c0 + 2 * lane;  // this lane's column pair (c, c + 1)
  const bool word_loads = a.word_loads != 0;
  uint32_t lo[4], hi[4];  // the pairs of rows r and r + 1 of each row pair
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t r = r0 + 2 * (warp + 8 * i);
    const bool c_in = c < a.cols, c1_in = c + 1 < a.cols;
    lo[i] = load_pair(xb + r * a.x_row_stride + c, r < a.rows && c_in, r < a.rows && c1_in, word_loads);
    hi[i] = load_pair(xb + (r + 1) * a.x_row_stride + c, r + 1 < a.rows && c_in, r + 1 < a.rows && c1_in, word_loads);
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int w = warp + 8 * i;  // the output pair index: rows 2w, 2w + 1 of x
    tile[(2 * lane) * 32 + (w ^ lane)] = __byte_perm(lo[i], hi[i], 0x5410);
    tile[(2 * lane + 1) * 32 + (w ^ lane)] = __byte_perm(lo[i], hi[i], 0x7632);
  }
  __syncthreads();
  uint16_t* yb = y + bz * a.y_batch_stride;
  const int64_t r = r0 + 2 * lane;  // this lane's output pair (r, r + 1)
  const bool word_stores = a.word_stores != 0;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const int cc = warp + 8 * j;
    const bool c_in = c0 + cc < a.cols;
    store_pair(yb + (c0 + cc) * a.y_row_stride + r, tile[cc * 32 + (lane ^ ((cc >> 1) & 31))], c_in && r < a.rows,
               c_in && r + 1 < a.rows, word_stores);
  }
}

// The 32 x 32 tile (bx, by) of batch bz (blockIdx's role in transpose_b32).
__device__ __forceinline__ void tile_b32(const uint32_t* __restrict__ x, uint32_t* __restrict__ y,
                                         const TransposeArgs& a, int64_t bx, int64_t by, int64_t bz) {
  __shared__ uint32_t tile[32][33];
  const int tx = threadIdx.x & 31, ty = threadIdx.x >> 5;  // 8 warps
  const int64_t r0 = by * 32, c0 = bx * 32;
  const uint32_t* xb = x + bz * a.x_batch_stride;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t r = r0 + ty + 8 * i;
    if (r < a.rows && c0 + tx < a.cols) tile[ty + 8 * i][tx] = __ldg(xb + r * a.x_row_stride + c0 + tx);
  }
  __syncthreads();
  uint32_t* yb = y + bz * a.y_batch_stride;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t c = c0 + ty + 8 * i;
    if (c < a.cols && r0 + tx < a.rows) yb[c * a.y_row_stride + r0 + tx] = tile[tx][ty + 8 * i];
  }
}

}  // namespace layout
}  // namespace cuconv
