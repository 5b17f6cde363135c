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
#include "layout/transpose_tile.cuh"

namespace cuconv {
namespace layout {

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
