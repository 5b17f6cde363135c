// cuconv layout: batched 2-D transpose, y[b][c][r] = x[b][r][c], at memory speed.
//
// It moves channels-first operands to the kernels' channels-last layout and back:
//   x (N, C, H*W)      -> (N, H*W, C)         rows = C,     cols = H*W
//   out (N, P*Q, K)    -> (N, K, P*Q)         rows = P*Q,   cols = K
//   w (K, C/g, R*S)    -> (K, R*S, C/g)       rows = C/g,   cols = R*S
// Each CTA moves one tile through shared memory, so both the reads (along a row of x) and the writes
// (along a row of y) are whole 128-byte lines.
//
// transpose_b16x2 (16-bit elements, even rows and cols, 4-byte aligned rows): a 64 x 64 tile moved
// as 32-bit words. A thread loads the words (x[r][2l], x[r][2l+1]) and (x[r+1][2l], x[r+1][2l+1])
// of a row pair and repacks them (prmt) into the output words (y[2l][r], y[2l][r+1]) and
// (y[2l+1][r], y[2l+1][r+1]). Shared memory holds the tile as 64 output rows of 32 words, word w of
// row c at c * 32 + (w ^ (c / 2 % 32)): the stores (one row pair, lanes on rows 2l or 2l + 1) and
// the loads (one output row, lanes on its words) each touch 32 different banks.
//
// transpose_elem<T> (any shape, 16- or 32-bit elements): a 32 x 32 tile of single elements, padded
// to 33 columns, for the shapes the word kernel cannot take (odd C as in an RGB stem, odd P*Q) and
// for float32.
//
// Strides are in elements; y is written with its own batch and row strides. Grid: (col tiles, row
// tiles, batch).
#include "common/types.cuh"

namespace cuconv {
namespace layout {

struct TransposeArgs {
  int64_t rows, cols, batch;
  int64_t x_batch_stride, x_row_stride;  // x[b][r][c] at b * x_batch_stride + r * x_row_stride + c
  int64_t y_batch_stride, y_row_stride;  // y[b][c][r] at b * y_batch_stride + c * y_row_stride + r
};

constexpr int kWordTile = 64;  // 16-bit elements per tile side (transpose_b16x2)
constexpr int kElemTile = 32;  // elements per tile side (transpose_elem)

}  // namespace layout
}  // namespace cuconv

using cuconv::layout::TransposeArgs;

extern "C" __global__ void __launch_bounds__(256) transpose_b16x2(const uint32_t* __restrict__ x,
                                                                   uint32_t* __restrict__ y, TransposeArgs a) {
  __shared__ uint32_t tile[cuconv::layout::kWordTile * 32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t r0 = (int64_t)blockIdx.y * 64, c0 = (int64_t)blockIdx.x * 64;
  const int64_t b = blockIdx.z;
  // x as words: row r starts at word (b * x_batch_stride + r * x_row_stride) / 2.
  const uint32_t* xb = x + (b * a.x_batch_stride) / 2;
  const bool col_ok = c0 + 2 * lane < a.cols;
  uint32_t lo[4], hi[4];  // words of rows r and r + 1 of each row pair
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t r = r0 + 2 * (warp + 8 * i);
    const bool ok = col_ok && r < a.rows;  // rows is even: r + 1 is in range with r
    lo[i] = ok ? __ldg(xb + (r * a.x_row_stride + c0) / 2 + lane) : 0u;
    hi[i] = ok ? __ldg(xb + ((r + 1) * a.x_row_stride + c0) / 2 + lane) : 0u;
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int w = warp + 8 * i;  // the output word index: rows 2w, 2w + 1 of x
    tile[(2 * lane) * 32 + (w ^ lane)] = __byte_perm(lo[i], hi[i], 0x5410);
    tile[(2 * lane + 1) * 32 + (w ^ lane)] = __byte_perm(lo[i], hi[i], 0x7632);
  }
  __syncthreads();
  uint32_t* yb = y + (b * a.y_batch_stride) / 2;
  const bool row_ok = r0 + 2 * lane < a.rows;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const int c = warp + 8 * j;
    if (row_ok && c0 + c < a.cols) {
      yb[((c0 + c) * a.y_row_stride + r0) / 2 + lane] = tile[c * 32 + (lane ^ ((c >> 1) & 31))];
    }
  }
}

template <typename T>
__device__ __forceinline__ void transpose_elem(const T* __restrict__ x, T* __restrict__ y, const TransposeArgs& a) {
  __shared__ T tile[cuconv::layout::kElemTile][cuconv::layout::kElemTile + 1];
  const int tx = threadIdx.x & 31, ty = threadIdx.x >> 5;  // 8 warps
  const int64_t r0 = (int64_t)blockIdx.y * 32, c0 = (int64_t)blockIdx.x * 32;
  const int64_t b = blockIdx.z;
  const T* xb = x + b * a.x_batch_stride;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t r = r0 + ty + 8 * i;
    if (r < a.rows && c0 + tx < a.cols) tile[ty + 8 * i][tx] = xb[r * a.x_row_stride + c0 + tx];
  }
  __syncthreads();
  T* yb = y + b * a.y_batch_stride;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t c = c0 + ty + 8 * i;
    if (c < a.cols && r0 + tx < a.rows) yb[c * a.y_row_stride + r0 + tx] = tile[tx][ty + 8 * i];
  }
}

extern "C" __global__ void __launch_bounds__(256) transpose_b16(const uint16_t* __restrict__ x,
                                                                 uint16_t* __restrict__ y, TransposeArgs a) {
  transpose_elem<uint16_t>(x, y, a);
}

extern "C" __global__ void __launch_bounds__(256) transpose_b32(const uint32_t* __restrict__ x,
                                                                 uint32_t* __restrict__ y, TransposeArgs a) {
  transpose_elem<uint32_t>(x, y, a);
}
