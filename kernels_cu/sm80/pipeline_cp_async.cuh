// cuconv sm80: the shared-memory ring of STAGES operand stages, filled by cp.async.
//
// Protocol (every thread is both producer and consumer; there are no mbarriers on sm_80):
//   prologue   stages 0 .. STAGES-2 are issued, one cp.async group each (empty groups past the end
//              keep the count regular).
//   iteration  wait_stage(): cp.async.wait_group(STAGES-2) -> this thread's copies of tile kt have
//              landed; __syncthreads -> everybody's have, and everybody finished computing on
//              tile kt-1, whose stage ((kt-1) % STAGES == (kt+STAGES-1) % STAGES) is therefore free
//              and is refilled with tile kt+STAGES-1 before tile kt is computed.
// Synchronous 16-bit copies (VEC = 1 loaders) store to shared memory before the same barrier, so
// they obey the same protocol.
#pragma once
#include "sm80/ptx_sm80.cuh"

namespace cuconv {
namespace sm80 {

template <int STAGES, int STAGE_BYTES>
struct CpAsyncRing {
  static_assert(STAGES >= 3, "at least three stages: one computing, one landing, one in flight");
  static_assert(STAGE_BYTES % 128 == 0, "stages stay 128-byte aligned for the swizzle");
  static constexpr int kBytes = STAGES * STAGE_BYTES;

  uint32_t base;  // shared-window address of stage 0

  __device__ __forceinline__ uint32_t stage(int tile) const { return base + (uint32_t)((tile % STAGES) * STAGE_BYTES); }
  __device__ __forceinline__ static void commit() { cp_async_commit(); }
  __device__ __forceinline__ static void wait_stage() {
    cp_async_wait<STAGES - 2>();
    __syncthreads();
  }
  __device__ __forceinline__ static void drain() {
    cp_async_wait<0>();
    __syncthreads();
  }
};

}  // namespace sm80
}  // namespace cuconv
