// cuconv sm80: the shared-memory ring of STAGES operand stages, filled by cp.async.
//
// Protocol (every thread is both producer and consumer; there are no mbarriers on sm_80):
//   prologue   tiles 0 .. STAGES-2 are issued, one cp.async group each; wait_tiles<STAGES-2>() ->
//              tile 0 has landed everywhere.
//   tile kt    wait_tiles<STAGES-3>() first: tile kt+1 has landed everywhere and every warp is past
//              its reads of tile kt-1 (it holds step 0 of tile kt in registers already); the stage
//              of tile kt-1 is then refilled with tile kt+STAGES-1 while tile kt is computed, one
//              group per tile. See MmaMainloop::run. Tiles past the end are issued with every copy
//              predicated off (zero-fill, no read), which keeps the group count regular.
//   wait_tiles<N>: cp.async.wait_group N (at most N of this thread's groups still in flight), then
//              __syncthreads (everybody's copies have landed, everybody is past its last read).
// Synchronous 16-bit copies (VEC = 1 loaders) store to shared memory before the same barrier, so
// they obey the same protocol.
#pragma once
#include "sm80/ptx_sm80.cuh"

namespace cuconv {
namespace sm80 {

template <int STAGES, int STAGE_BYTES>
struct CpAsyncRing {
  static_assert(STAGES >= 3, "at least three stages: one computed, one being refilled, one landed");
  static_assert(STAGE_BYTES % 128 == 0, "stages stay 128-byte aligned for the swizzle");
  static constexpr int kBytes = STAGES * STAGE_BYTES;

  uint32_t base;  // shared-window address of stage 0

  __device__ __forceinline__ uint32_t stage(int tile) const { return base + (uint32_t)((tile % STAGES) * STAGE_BYTES); }
  __device__ __forceinline__ static void commit() { cp_async_commit(); }
  template <int PENDING>
  __device__ __forceinline__ static void wait_tiles() {
    cp_async_wait<PENDING>();
    __syncthreads();
  }
  __device__ __forceinline__ static void drain() {
    cp_async_wait<0>();
    __syncthreads();
  }
};

}  // namespace sm80
}  // namespace cuconv
