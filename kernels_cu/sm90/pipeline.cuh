// cuconv hopper: the shared-memory ring and its mbarriers (written once, used by every role).
//
// An mbarrier completes a *phase* when its pending arrival count reaches zero and (for TMA
// barriers) every expected transaction byte has landed. Waiters name the parity of the phase they
// wait for; a fresh barrier is in phase 0, and waiting for parity 1 on it returns at once ("the
// phase before the first one has completed"), which is how a producer walks through the empty
// barriers of a fresh ring without special-casing the first lap.
//
//   RingState: (stage, phase) of one side of a ring of STAGES slots; advance() flips the phase
//   each time the stage index wraps. Producers wait `empty[stage]` with parity phase ^ 1,
//   consumers wait `full[stage]` with parity phase. skip(n) passes over n slots at once.
#pragma once

#include "common/smem.cuh"
#include "common/types.cuh"

namespace cuconv {
namespace sm90 {

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(arrivals) : "memory");
}

// Make the initialised barriers visible to the async proxy (TMA) and to the other threads
// (the caller follows with __syncthreads()).
__device__ __forceinline__ void mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}

// An arrival under a predicate in the instruction itself (no branch: one around a plain arrive,
// placed while wgmmas are in flight, makes ptxas serialize them - C7519).
__device__ __forceinline__ void mbar_arrive_if(bool pred, uint32_t bar) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %1, 0;\n@p mbarrier.arrive.shared::cta.b64 _, [%0];\n}\n" ::"r"(bar),
      "r"((int)pred)
      : "memory");
}

// One arrival plus `bytes` expected transaction bytes (the TMA copies complete them).
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}

__device__ __forceinline__ bool mbar_try_wait(uint32_t bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n.reg .pred p;\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(done)
      : "r"(bar), "r"(parity)
      : "memory");
  return done != 0;
}

__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  while (!mbar_try_wait(bar, parity)) {
  }
}

// ---- thread-block clusters (SM90_CLUSTER > 1: the CTAs of a cluster share the filter tile by TMA
// multicast, so a ring slot of one CTA is filled by both, and released by the consumers of both).

__device__ __forceinline__ uint32_t cluster_ctarank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}

// Every thread of every CTA of the cluster arrives, then waits for all the others: barriers
// initialised before it are visible cluster-wide after it, and no CTA leaves the kernel while a
// peer may still signal its barriers.
__device__ __forceinline__ void cluster_sync_all() {
  asm volatile("barrier.cluster.arrive.release;\n" ::: "memory");
  asm volatile("barrier.cluster.wait.acquire;\n" ::: "memory");
}

// One arrival on the mbarrier at the same shared offset in CTA `cta_rank` of the cluster. Default
// (.release.cta) semantics, as for a local arrival: a cluster-scope release would make the warp
// wait for its earlier global stores (the previous tile's epilogue) on every slot it releases -
// measured at 40% of the consumers' time in memory-barrier stalls.
__device__ __forceinline__ void mbar_arrive_cluster(uint32_t bar, uint32_t cta_rank) {
  asm volatile(
      "{\n.reg .b32 remote;\n"
      "mapa.shared::cluster.u32 remote, %0, %1;\n"
      "mbarrier.arrive.shared::cluster.b64 _, [remote];\n}\n"
      ::"r"(bar), "r"(cta_rank)
      : "memory");
}

// A consumer warp releases a ring slot to the producers of every CTA of the cluster; called by all
// lanes of the warp. CLUSTER == 1: lane 0 arrives locally; otherwise lane r arrives on CTA r, so
// the arrivals of one warp go out in one instruction.
template <int CLUSTER>
__device__ __forceinline__ void mbar_release_slot(uint32_t bar, int lane) {
  if constexpr (CLUSTER == 1) {
    if (lane == 0) mbar_arrive(bar);
  } else {
    if (lane < CLUSTER) mbar_arrive_cluster(bar, (uint32_t)lane);
  }
}

template <int STAGES>
struct RingState {
  int stage = 0;
  uint32_t phase = 0;
  __device__ __forceinline__ void advance() {
    if (++stage == STAGES) {
      stage = 0;
      phase ^= 1u;
    }
  }
  // Pass over n slots that another consumer reads (ping-pong warpgroups take turns on the ring).
  __device__ __forceinline__ void skip(int n) {
    const int to = stage + n;
    phase ^= (uint32_t)(to / STAGES) & 1u;
    stage = to % STAGES;
  }
};

}  // namespace sm90
}  // namespace cuconv
