// cuconv few-channel kernels (smallc_direct, smallc_mma): the input tile of a channels-first x.
//
// Both kernels compute from an input tile in shared memory stored [row][col][c] (all C channels of a
// pixel together), as their channels-last loader (depthwise/halo_tile.cuh) copies it. On NCHW / NCDHW
// arrays the same tile is gathered from C channel planes instead: element (row, col, c) comes from
// plane c at input pixel (h0 + row, w0 + col), zero outside the image (padding). Consecutive threads
// take consecutive columns of one row of one plane (coalesced reads); each thread issues
// CF_TILE_BATCH loads, through registers, before their stores. The caller synchronises before the
// tile is read.
#pragma once
#include "common/types.cuh"
#include "common/fast_div.cuh"
#include "common/smem.cuh"
#include "sm80/ptx_sm80.cuh"
#include "depthwise/vec_io.cuh"

namespace cuconv {
namespace sc {

constexpr int CF_TILE_BATCH = 8;

// One element's bits through the read-only path (zero, and no load, when `valid` is false), and its
// store into shared memory at a 32-bit address: 16-bit elements by sm80/ptx_sm80.cuh's helpers, 32-bit
// ones by their word-sized counterparts. The loads are not volatile: a thread's batch of them is
// issued before the first store.
__device__ __forceinline__ uint16_t load_bits_zfill(const uint16_t* src, bool valid) {
  return sm80::load_u16_zfill(src, valid);
}
__device__ __forceinline__ uint32_t load_bits_zfill(const uint32_t* src, bool valid) {
  uint32_t v = 0;
  if (valid) asm("ld.global.nc.u32 %0, [%1];\n" : "=r"(v) : "l"(src));
  return v;
}
__device__ __forceinline__ void store_bits(uint32_t dst, uint16_t v) { sm80::store_u16(dst, v); }
__device__ __forceinline__ void store_bits(uint32_t dst, uint32_t v) {
  asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(dst), "r"(v));
}

// The tile of `rows` x `cols` pixels x C channels whose top-left input pixel is (h0, w0) (negative in
// the padding) of the planes starting at `plane` (channel c at plane + c * cstride, each H x W).
// COLS > 0: the column count is that constant; COLS == 0: `cols`, divided by `div_cols`.
template <int C, int COLS>
__device__ __forceinline__ void gather_tile_channels_first(elem_t* tile, const elem_t* __restrict__ plane,
                                                           int64_t cstride, int h0, int w0, int rows, int cols,
                                                           FastDivisor div_cols, int H, int W, int nthreads) {
  typedef typename dw::Word<sizeof(elem_t)>::type bits_t;  // moved as raw bits: zero is all-zero bits
  const bits_t* src = reinterpret_cast<const bits_t*>(plane);
  const uint32_t base = smem_u32(tile);
  if constexpr (COLS > 0) cols = COLS;
  const int units = rows * C * cols;  // u = (row * C + c) * cols + col
#pragma unroll 1
  for (int u0 = threadIdx.x; u0 < units; u0 += CF_TILE_BATCH * nthreads) {
    bits_t v[CF_TILE_BATCH];
    uint32_t at[CF_TILE_BATCH];
#pragma unroll
    for (int j = 0; j < CF_TILE_BATCH; ++j) {
      const int u = u0 + j * nthreads;
      const int rc = COLS > 0 ? u / COLS : (int)fast_div((uint32_t)u, div_cols);
      const int col = u - rc * cols;
      const int c = rc % C, row = rc / C;
      const int h = h0 + row, w = w0 + col;
      const bool valid = u < units && (unsigned)h < (unsigned)H && (unsigned)w < (unsigned)W;
      v[j] = load_bits_zfill(src + (valid ? c * cstride + (int64_t)h * W + w : 0), valid);
      at[j] = base + (uint32_t)(((row * cols + col) * C + c) * (int)sizeof(elem_t));
    }
#pragma unroll
    for (int j = 0; j < CF_TILE_BATCH; ++j)
      if (u0 + j * nthreads < units) store_bits(at[j], v[j]);
  }
}

}  // namespace sc
}  // namespace cuconv
