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
// or entirely outside the matrix, and lanes predicated off read nothing (cp.async copies keep their
// computed address with a zero source size; 2-byte copies read from `base` instead). The host also
// guarantees ld * 256 < 2^31 (the in-tile offset row * ld + col of the cp.async copies is
// 32-bit).
#pragma once
#include "sm80/ptx_sm80.cuh"
#include "sm80/smem_tile.cuh"

namespace cuconv {
namespace sm80 {

// L1: the copies also allocate in L1 (cp_async_zfill), for a small operand every CTA re-reads.
// TILE: the shared-memory layout (its elem_offset(row, col)); default the mainloop's SwizzledTile
// (the Hopper weight gradient stages wgmma's MN-major layout, sm90/mn_major_tile.cuh).
template <int MN_TILE, int K_TILE, int VEC, bool K_CONTIG, int NTHREADS, bool L1 = false, class TILE = void>
struct LinearLoader {
  static constexpr int kTileRows = K_CONTIG ? MN_TILE : K_TILE;
  static constexpr int kTileCols = K_CONTIG ? K_TILE : MN_TILE;
  using Tile = typename TileOr<TILE, SwizzledTile<kTileRows, kTileCols>>::type;
  static constexpr int kChunksPerRow = kTileCols / VEC;
  static constexpr int kChunks = kTileRows * kChunksPerRow;
  static constexpr int kPasses = (kChunks + NTHREADS - 1) / NTHREADS;
  static_assert(kTileCols % VEC == 0, "VEC must divide the contiguous tile extent");
  // Budget: fully unrolled passes keep their addresses live across the K loop; past 8 (2-byte
  // copies on small CTAs) unroll by 4 so the addresses do not spill.
  static constexpr int kUnroll = kPasses <= 8 ? kPasses : 4;
  static constexpr int kBatch = kPasses % 4 == 0 ? 4 : kPasses;  // 2-byte copies in flight per thread

  const elem_t* base;   // element (0, 0) of the operand (group / column offset already applied)
  long long mn_limit;   // valid rows along M (or N)
  long long k_limit;    // valid columns along K
  long long ld;         // leading dimension of the source, in elements

  // Rows (or columns) of the operand from a tile origin on, as an int: negative past the end,
  // capped where it exceeds any tile.
  __device__ __forceinline__ static int clamp_extent(long long left) {
    return left < 0 ? -1 : (left > (1 << 30) ? (1 << 30) : (int)left);
  }

  // Source address and predicate of pass `pass` for this thread; row/col are smem tile coordinates.
  __device__ __forceinline__ const elem_t* source(int pass, long long mn_offset, long long k_offset, int& row,
                                                  int& col, bool& valid) const {
    const int idx = threadIdx.x + pass * NTHREADS;
    row = idx / kChunksPerRow;
    col = (idx % kChunksPerRow) * VEC;
    const long long mn = mn_offset + (K_CONTIG ? row : col);
    const long long k = k_offset + (K_CONTIG ? col : row);
    valid = (kChunks % NTHREADS == 0 || idx < kChunks) && mn < mn_limit && k < k_limit;
    return valid ? base + (K_CONTIG ? mn * ld + k : k * ld + mn) : base;
  }

  __device__ __forceinline__ void load_tile(uint32_t stage, long long mn_offset, long long k_offset) const {
    if constexpr (VEC == 1) {
      // synchronous 2-byte copies: loads first, then stores, kBatch at a time (one memory latency
      // per batch instead of per element, without keeping every pass's address live)
#pragma unroll 1
      for (int p0 = 0; p0 < kPasses; p0 += kBatch) {
        uint16_t v[kBatch];
#pragma unroll
        for (int j = 0; j < kBatch; ++j) {
          int row, col;
          bool valid;
          const elem_t* src = source(p0 + j, mn_offset, k_offset, row, col, valid);
          v[j] = load_u16_zfill(src, valid);
        }
#pragma unroll
        for (int j = 0; j < kBatch; ++j) {
          const int idx = threadIdx.x + (p0 + j) * NTHREADS;
          if (kChunks % NTHREADS != 0 && idx >= kChunks) break;
          store_u16(stage + Tile::elem_offset(idx / kChunksPerRow, idx % kChunksPerRow), v[j]);
        }
      }
    } else {
      // 64-bit arithmetic once per tile (its origin and how many rows / columns of it exist), 32-bit
      // per copy: the host guarantees ld * max(tile rows) < 2^31, so row * ld + col fits an int.
      const elem_t* tile = base + (K_CONTIG ? mn_offset * ld + k_offset : k_offset * ld + mn_offset);
      const int mn_left = clamp_extent(mn_limit - mn_offset);
      const int k_left = clamp_extent(k_limit - k_offset);
      const int ld32 = (int)ld;
#pragma unroll kUnroll
      for (int pass = 0; pass < kPasses; ++pass) {
        const int idx = threadIdx.x + pass * NTHREADS;
        if (kChunks % NTHREADS != 0 && idx >= kChunks) break;
        const int row = idx / kChunksPerRow;
        const int col = (idx % kChunksPerRow) * VEC;
        const bool valid = (K_CONTIG ? row : col) < mn_left && (K_CONTIG ? col : row) < k_left;
        // Off-tensor chunks keep their computed address: a zero-size cp.async reads nothing, and a
        // select against `base` would reload the parameter (LDC) on every copy.
        copy_vec_zfill<VEC, L1>(stage + Tile::elem_offset(row, col), tile + (row * ld32 + col), valid);
      }
    }
  }
};

}  // namespace sm80
}  // namespace cuconv
