// cuconv sm80: the swizzled shared-memory tile every loader writes and the mainloop reads.
//
// A tile is ROWS x COLS 16-bit elements, row-major, stored as 16-byte chunks (8 elements). The
// chunk index inside a row is XOR-ed with a few row bits so that
//   * ldmatrix (8 rows x 16 bytes at one logical chunk column) hits 8 different bank groups, and
//   * a warp's 32 consecutive 16-byte cp.async writes stay conflict-free.
// Rows of 4 chunks (64 bytes, the BK = 32 operand tiles) take (row / 2) % 4 as the XOR key -- two
// rows share one 128-byte bank line; rows of >= 8 chunks take row % 8.
#pragma once
#include "common/types.cuh"

namespace cuconv {
namespace sm80 {

template <int ROWS, int COLS>
struct SwizzledTile {
  static constexpr int kRows = ROWS;
  static constexpr int kCols = COLS;
  static constexpr int kChunksPerRow = COLS / 8;
  static constexpr int kBytes = ROWS * COLS * 2;
  static_assert(COLS % 8 == 0, "a tile row is a whole number of 16-byte chunks");
  static_assert(kChunksPerRow == 4 || kChunksPerRow % 8 == 0,
                "the swizzle is defined for rows of 4 or a multiple of 8 chunks (64 B or 128*k B)");

  // Byte offset of logical (row, chunk) inside the tile.
  __device__ __forceinline__ static uint32_t chunk_offset(int row, int chunk) {
    const int key = (kChunksPerRow == 4) ? ((row >> 1) & 3) : (row & 7);
    return (uint32_t)((row * kChunksPerRow + (chunk ^ key)) * 16);
  }
  // Byte offset of logical element (row, col).
  __device__ __forceinline__ static uint32_t elem_offset(int row, int col) {
    return chunk_offset(row, col >> 3) + (uint32_t)((col & 7) * 2);
  }
};

// TileOr<T, D>::type: T, or D when T is void (a loader's default shared-memory layout).
template <class T, class D>
struct TileOr {
  using type = T;
};
template <class D>
struct TileOr<void, D> {
  using type = D;
};

}  // namespace sm80
}  // namespace cuconv
