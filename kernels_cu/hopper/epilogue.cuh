// cuconv hopper: the consumer epilogue - out = act(alpha * acc + bias + beta * C), cast, store.
//
// Works straight from the wgmma accumulator layout (see wgmma_mainloop.cuh): each thread owns
// pairs of adjacent output channels, stored as one 4-byte word (K is a multiple of 8, so a pair
// never straddles the end of a row). The tile is walked in chunks of 64 channels, the unit of the
// epilogue-load ring: with a residual, chunk j waits c_full, reads C from the swizzled box
// (row r, 16-byte column chunk jj lives at chunk jj ^ (r % 8): conflict-free for the 8 rows x 4
// lanes of a warp), then releases the slot. `out` may be the residual itself: every element of C
// is read (into smem, by TMA, and then by its owning thread) before that thread writes it, and
// tiles never overlap.
#pragma once

#include "common/epilogue_math.cuh"
#include "common/types.cuh"
#include "hopper/pipeline.cuh"

namespace cuconv {
namespace sm90 {

__device__ __forceinline__ uint32_t ld_shared_u32(uint32_t addr) {
  uint32_t v;
  asm volatile("ld.shared.u32 %0, [%1];" : "=r"(v) : "r"(addr) : "memory");
  return v;
}

template <typename T>
__device__ __forceinline__ float lo_to_float(uint32_t pair) {
  T h;
  h.bits = (uint16_t)(pair & 0xFFFF);
  return to_float(h);
}
template <typename T>
__device__ __forceinline__ float hi_to_float(uint32_t pair) {
  T h;
  h.bits = (uint16_t)(pair >> 16);
  return to_float(h);
}

// row_base: this thread's first tile row (16 * warp_in_group + lane / 4 + 64 * warpgroup);
// col_lane: 2 * (lane % 4).
template <typename T, int BN, int C_STAGES, bool HAS_RESIDUAL, int C_CHUNK_BYTES>
__device__ __forceinline__ void consumer_epilogue(const float (&acc)[BN / 2], int m0, int n0, long long M, int K,
                                                  T* out, const T* bias, const EpilogueParams& ep,
                                                  RingState<C_STAGES>& cring, uint32_t c_base,
                                                  uint32_t c_full_bar, uint32_t c_empty_bar, int row_base,
                                                  int col_lane, bool lane_leader) {
#pragma unroll
  for (int chunk = 0; chunk < BN / 64; ++chunk) {
    uint32_t cpair[2][8];
    if constexpr (HAS_RESIDUAL) {
      mbar_wait(c_full_bar + 8 * cring.stage, cring.phase);
      const uint32_t buf = c_base + cring.stage * C_CHUNK_BYTES;
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int row = row_base + 8 * i;
#pragma unroll
        for (int jj = 0; jj < 8; ++jj) {
          cpair[i][jj] = ld_shared_u32(buf + row * 128 + ((jj ^ (row & 7)) << 4) + col_lane * 2);
        }
      }
      fence_proxy_async_smem();
      __syncwarp();
      if (lane_leader) mbar_arrive(c_empty_bar + 8 * cring.stage);
      cring.advance();
    }
#pragma unroll
    for (int jj = 0; jj < 8; ++jj) {
      const int col = n0 + chunk * 64 + jj * 8 + col_lane;
      if (col >= K) continue;
      float b0 = 0.f, b1 = 0.f;
      if (ep.has_bias) {
        const uint32_t bp = *reinterpret_cast<const uint32_t*>(bias + col);
        b0 = lo_to_float<T>(bp);
        b1 = hi_to_float<T>(bp);
      }
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const long long m = (long long)m0 + row_base + 8 * i;
        if (m >= M) continue;
        const int a = (chunk * 8 + jj) * 4 + 2 * i;
        float v0 = ep.alpha * acc[a] + b0;
        float v1 = ep.alpha * acc[a + 1] + b1;
        if constexpr (HAS_RESIDUAL) {
          v0 += ep.beta * lo_to_float<T>(cpair[i][jj]);
          v1 += ep.beta * hi_to_float<T>(cpair[i][jj]);
        }
        v0 = activate(v0, ep.activation);
        v1 = activate(v1, ep.activation);
        *reinterpret_cast<uint32_t*>(out + m * K + col) = pack2<T>(v0, v1);
      }
    }
  }
}

}  // namespace sm90
}  // namespace cuconv
