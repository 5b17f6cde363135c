// cuconv layout: batched 2-D transpose, y[b][c][r] = x[b][r][c], at memory speed.
//
// It moves channels-first operands to the kernels' channels-last layout and back:
//   x (N, C, H*W)      -> (N, H*W, C)         rows = C,     cols = H*W
//   out (N, P*Q, K)    -> (N, K, P*Q)         rows = P*Q,   cols = K
//   w (K, C/g, R*S)    -> (K, R*S, C/g)       rows = C/g,   cols = R*S
// Strides are in elements; y has its own batch and row strides. Three kernels (the host picks):
//
// transpose_b16 (16-bit elements, rows and cols > 16): a 64 x 64 tile through shared memory. A
// thread loads the pairs (x[r][2l], x[r][2l+1]) and (x[r+1][2l], x[r+1][2l+1]) of a row pair and
// repacks them (prmt) into the output pairs (y[2l][r], y[2l][r+1]) and (y[2l+1][r], y[2l+1][r+1]).
// Shared memory holds the tile as 64 output rows of 32 words, word w of row c at
// c * 32 + (w ^ (c / 2 % 32)): the stores (a row pair, lanes on rows 2l or 2l + 1) and the loads (an
// output row, lanes on its words) each touch 32 different banks. Global accesses are 32-bit words
// (a warp: one 128-byte line) where the row starts allow (WORD_LOADS / WORD_STORES, per launch),
// else two 16-bit accesses per word (odd P*Q such as 7x7, odd C): the same lines, more instructions.
//
// transpose_b32 (32-bit elements): a 32 x 32 tile padded to 33 columns, one element per access.
//
// transpose_thin (rows or cols <= 16, any element size): no tile. A thread owns one position along
// the long axis and walks the short one: an RGB stem's x (3 rows), a K = 3 result (3 cols), a 3x3
// filter (9 cols). Each warp access covers 32 neighbours along the long axis.
//
// transpose_pair_b16 / _b32: two of these moves (tiled or thin each) in one launch, one linear grid
// split between them: a channels-first call's x and w cost one launch, not two.
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

// Thin transposes: bx * 256 + threadIdx.x is the position along the long axis, bz the batch; the
// short axis (<= 16) is walked in full by each thread.
template <typename T>
__device__ __forceinline__ void thin(const T* __restrict__ x, T* __restrict__ y, const TransposeArgs& a, int64_t bx,
                                     int64_t bz) {
  const int64_t i = bx * blockDim.x + threadIdx.x;
  const T* xb = x + bz * a.x_batch_stride;
  T* yb = y + bz * a.y_batch_stride;
  if (a.rows <= a.cols) {  // few rows: thread i owns column i
    if (i >= a.cols) return;
    for (int r = 0; r < a.rows; ++r) yb[i * a.y_row_stride + r] = xb[r * a.x_row_stride + i];
  } else {                 // few cols: thread i owns row i
    if (i >= a.rows) return;
    for (int c = 0; c < a.cols; ++c) yb[c * a.y_row_stride + i] = xb[i * a.x_row_stride + c];
  }
}

// Two moves in one launch (a channels-first call's x and w): blocks [0, first_block of move 1) are
// move 0's, the rest move 1's; each move's blocks are its tiles (or thin strips) x batch, in the order
// of the single-move grids (x fastest).
struct MoveBlocks {
  TransposeArgs a;
  int32_t first_block;     // this move's first block of the linear grid
  int32_t tiles_x, tiles_y;  // its grid's x and y extents (thin: tiles_y = 1)
  int32_t thin;            // 1: the thin walk, 0: the shared-memory tile
};
struct TransposePairArgs {
  MoveBlocks m0, m1;
};

template <typename T>
__device__ __forceinline__ void pair(const T* __restrict__ x0, T* __restrict__ y0, const T* __restrict__ x1,
                                     T* __restrict__ y1, const TransposePairArgs& p) {
  const int block = (int)blockIdx.x;
  const bool second = block >= p.m1.first_block;  // uniform over the block (its __syncthreads)
  const MoveBlocks m = second ? p.m1 : p.m0;
  const T* x = second ? x1 : x0;
  T* y = second ? y1 : y0;
  const int local = block - m.first_block;
  const int row_of_tiles = local / m.tiles_x;
  const int64_t bx = local - row_of_tiles * m.tiles_x;
  const int64_t bz = row_of_tiles / m.tiles_y;
  const int64_t by = row_of_tiles - bz * m.tiles_y;
  if (m.thin) {
    thin<T>(x, y, m.a, bx, bz);
  } else if constexpr (sizeof(T) == 2) {
    tile_b16(x, y, m.a, bx, by, bz);
  } else {
    tile_b32(x, y, m.a, bx, by, bz);
  }
}

}  // namespace layout
}  // namespace cuconv

using cuconv::layout::TransposeArgs;
using cuconv::layout::TransposePairArgs;

extern "C" __global__ void __launch_bounds__(256) transpose_b16(const uint16_t* __restrict__ x, uint16_t* __restrict__ y,
                                                                 TransposeArgs a) {
  cuconv::layout::tile_b16(x, y, a, blockIdx.x, blockIdx.y, blockIdx.z);
}

extern "C" __global__ void __launch_bounds__(256) transpose_b32(const uint32_t* __restrict__ x, uint32_t* __restrict__ y,
                                                                 TransposeArgs a) {
  cuconv::layout::tile_b32(x, y, a, blockIdx.x, blockIdx.y, blockIdx.z);
}

extern "C" __global__ void __launch_bounds__(256) transpose_thin_b16(const uint16_t* __restrict__ x,
                                                                      uint16_t* __restrict__ y, TransposeArgs a) {
  cuconv::layout::thin<uint16_t>(x, y, a, blockIdx.x, blockIdx.z);
}

extern "C" __global__ void __launch_bounds__(256) transpose_thin_b32(const uint32_t* __restrict__ x,
                                                                      uint32_t* __restrict__ y, TransposeArgs a) {
  cuconv::layout::thin<uint32_t>(x, y, a, blockIdx.x, blockIdx.z);
}

extern "C" __global__ void __launch_bounds__(256) transpose_pair_b16(const uint16_t* __restrict__ x0,
                                                                      uint16_t* __restrict__ y0,
                                                                      const uint16_t* __restrict__ x1,
                                                                      uint16_t* __restrict__ y1,
                                                                      TransposePairArgs p) {
  cuconv::layout::pair<uint16_t>(x0, y0, x1, y1, p);
}

extern "C" __global__ void __launch_bounds__(256) transpose_pair_b32(const uint32_t* __restrict__ x0,
                                                                      uint32_t* __restrict__ y0,
                                                                      const uint32_t* __restrict__ x1,
                                                                      uint32_t* __restrict__ y1,
                                                                      TransposePairArgs p) {
  cuconv::layout::pair<uint32_t>(x0, y0, x1, y1, p);
}
