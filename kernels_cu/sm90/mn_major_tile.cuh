// cuconv hopper: wgmma's MN-major shared-memory layout with the 128-byte swizzle, for operands
// whose MN axis is the contiguous one (the weight gradient's dy and im2col(x) tiles).
//
// A tile of ROWS k-rows by COLS MN-columns (COLS a multiple of 64) is stored as COLS / 64 blocks,
// each ROWS rows of 128 bytes (64 elements): element (k, mn) of block mn / 64 sits at
//   k * 128 + ((mn % 64 / 8) ^ (k % 8)) * 16 + (mn % 8) * 2,
// i.e. the 16-byte chunk index XOR-ed with the row within its 1024-byte group of 8 rows (the
// hardware's Swizzle<3,4,3>, applied to addresses whose group starts 1024-byte aligned). In the
// descriptor of an MN-major operand the leading byte offset steps between 64-column blocks and the
// stride byte offset between 8-row groups (1024 bytes); one k16 step is 16 rows, +2048 bytes.
#pragma once
#include "common/types.cuh"

namespace cuconv {
namespace sm90 {

template <int ROWS, int COLS>
struct Sw128MnTile {
  static_assert(COLS % 64 == 0 && ROWS % 16 == 0, "64-column blocks of whole k16 steps");
  static constexpr int kBlockBytes = ROWS * 128;
  static constexpr int kBytes = ROWS * COLS * 2;
  __device__ __forceinline__ static uint32_t elem_offset(int row, int col) {
    return (uint32_t)((col >> 6) * kBlockBytes + row * 128 + ((((col >> 3) & 7) ^ (row & 7)) << 4) + (col & 7) * 2);
  }
};

// Descriptor of an MN-major, 128-byte-swizzled operand starting at `addr` (1024-byte aligned);
// `block_bytes`: the distance of its 64-column blocks.
__device__ __forceinline__ uint64_t smem_desc_mn_sw128(uint32_t addr, uint32_t block_bytes) {
  uint64_t desc = 0;
  desc |= (uint64_t)((addr & 0x3FFFF) >> 4);            // start address, 16-byte units
  desc |= (uint64_t)((block_bytes >> 4) & 0x3FFF) << 16;  // leading byte offset: next 64 MN columns
  desc |= (uint64_t)(1024 >> 4) << 32;                   // stride byte offset: next 8 k-rows
  desc |= (uint64_t)1 << 62;                             // 128-byte swizzle
  return desc;
}

}  // namespace sm90
}  // namespace cuconv
