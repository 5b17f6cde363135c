// cuconv sm80: the linear 2-D tile loader (matmul operands, conv weights, pointwise activations).
//
// Loader contract (shared with Im2colLoader): `load_tile(stage, mn_offset, k_offset)` stages the
// operand tile whose origin in GEMM coordinates is (mn_offset, k_offset) into one pipeline stage,
// zero-filling everything outside the operand; the mainloop never knows which loader feeds it.
//
// The source is a row-major matrix with leading dimension `ld` (elements):
//   K_CONTIG = true   element(mn, k) = base[mn * ld + k]   smem tile [MN_TILE][K_TILE]
//   K_CONTIG = false  element(mn, k) = base[k * ld + mn]   smem tile [K_TILE][MN_TILE]  (ldmatrix.trans)
// Each thread moves VEC contiguous elements per copy (cp.async of 2*VEC bytes; VEC = 1 is a
// synchronous 16-bit copy). The host picks VEC so that ld, the column offset and the contiguous
// extent are multiples of VEC and the base is 2*VEC-byte aligned: a chunk is then entirely inside
// or entirely outside the matrix, and lanes predicated off read nothing (src clamped to base).
#pragma once
#include "sm80/ptx_sm80.cuh"
#include "sm80/smem_tile.cuh"

namespace cuconv {
namespace sm80 {

template <int MN_TILE, int K_TILE, int VEC, bool K_CONTIG, int NTHREADS>
struct LinearLoader {
  static constexpr int kTileRows = K_CONTIG ? MN_TILE : K_TILE;
  static constexpr int kTileCols = K_CONTIG ? K_TILE : MN_TILE;
  using Tile = SwizzledTile<kTileRows, kTileCols>;
  static constexpr int kChunksPerRow = kTileCols / VEC;
  static constexpr int kChunks = kTileRows * kChunksPerRow;
  static constexpr int kPasses = (kChunks + NTHREADS - 1) / NTHREADS;
  static_assert(kTileCols % VEC == 0, "VEC must divide the contiguous tile extent");
  // Budget: fully unrolled passes keep their addresses live across the K loop; past 8 (2-byte
  // copies on small CTAs) unroll by 4 so the addresses do not spill.
  static constexpr int kUnroll = kPasses <= 8 ? kPasses : 4;

  const elem_t* base;   // element (0, 0) of the operand (group / column offset already applied)
  long long mn_limit;   // valid rows along M (or N)
  long long k_limit;    // valid columns along K
  long long ld;         // leading dimension of the source, in elements

  __device__ __forceinline__ void load_tile(uint32_t stage, long long mn_offset, long long k_offset) const {
    const int tid = threadIdx.x;
#pragma unroll kUnroll
    for (int pass = 0; pass < kPasses; ++pass) {
      const int idx = tid + pass * NTHREADS;
      if (kChunks % NTHREADS != 0 && idx >= kChunks) break;
      const int row = idx / kChunksPerRow;          // smem tile row
      const int col = (idx % kChunksPerRow) * VEC;  // smem tile column (first of VEC)
      const long long mn = mn_offset + (K_CONTIG ? row : col);
      const long long k = k_offset + (K_CONTIG ? col : row);
      const bool valid = mn < mn_limit && k < k_limit;
      const elem_t* src = valid ? base + (K_CONTIG ? mn * ld + k : k * ld + mn) : base;
      copy_vec_zfill<VEC>(stage + Tile::elem_offset(row, col), src, valid);
    }
  }
};

}  // namespace sm80
}  // namespace cuconv
