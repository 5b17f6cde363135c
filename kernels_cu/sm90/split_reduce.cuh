// cuconv hopper: hand-over of a split tile's partial sums from its PARTIAL parts to its FINISH part
// (scheduler.cuh).
//
// A PARTIAL unit's consumers write their fp32 accumulators to its workspace slot and raise one flag
// per consumer warp; the FINISH unit's consumer warp with the same index waits for each slot's flag in
// turn after its own mainloop, adds the slot's sums to its accumulators, puts the flag back to 0 (the
// workspace is clean for the next launch without a memset) and, after the last slot, runs the epilogue.
//
// Both halves use the same accumulator layout, so thread i of the finishing CTA reads exactly what
// thread i of the partial CTA wrote: the workspace is laid out per thread, not per output element,
//
//   partials[((slot * ACC / 4 + v) * CONSUMER_THREADS + i)] = float4(acc[4v .. 4v + 3]) of thread i,
//
// which makes every warp access 512 contiguous bytes. The workspace lives in L2 (ld/st .cg); it is
// owned by the host per (device, stream), so concurrent launches never share one.
//
// Ordering: each lane fences (gpu scope) after its stores, the warp synchronises, lane 0 sets the
// flag with a release store; the finishing warp's lanes spin on an acquire load of it. The two
// parts are on different CTAs of one round of the grid, all resident at once, so the wait ends.
#pragma once

#include "common/types.cuh"

namespace cuconv {
namespace sm90 {

__device__ __forceinline__ uint32_t thread_index_volatile() {
  uint32_t t;
  asm volatile("mov.u32 %0, %%tid.x;" : "=r"(t));
  return t;
}

__device__ __forceinline__ int ld_acquire_gpu(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void st_release_gpu(int* p, int v) {
  asm volatile("st.release.gpu.global.s32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// thread: this thread's index among the consumer threads (0 .. CONSUMER_THREADS - 1);
// flag: flags[slot * (CONSUMER_THREADS / 32) + thread / 32].
template <int ACC, int CONSUMER_THREADS>
__device__ __forceinline__ void store_partial(const float (&acc)[ACC], float4* partials, int* flag, int slot,
                                              int thread) {
  static_assert(ACC % 4 == 0, "float4 groups of accumulators");
  float4* dst = partials + (long long)slot * (ACC / 4) * CONSUMER_THREADS + thread;
#pragma unroll
  for (int v = 0; v < ACC / 4; ++v) {
    __stcg(dst + v * CONSUMER_THREADS, make_float4(acc[4 * v], acc[4 * v + 1], acc[4 * v + 2], acc[4 * v + 3]));
  }
  __threadfence();
  __syncwarp();
  if (threadIdx.x % 32 == 0) st_release_gpu(flag, 1);
  __syncwarp();
}

template <int ACC, int CONSUMER_THREADS>
__device__ __forceinline__ void add_partial(float (&acc)[ACC], const float4* partials, int* flag, int slot,
                                            int thread) {
  // Every lane spins on its own acquire load and the warp leaves the loop together (a vote). A
  // loop exit that ptxas cannot prove warp-uniform, ahead of the accumulator updates below, makes
  // it serialise every wgmma of the kernel (ptxas C7519; measured 1.3-1.4x slower everywhere).
  while (!__all_sync(0xffffffffu, ld_acquire_gpu(flag) != 0)) {
  }
  const float4* src = partials + (long long)slot * (ACC / 4) * CONSUMER_THREADS + thread;
  // Four float4 loads in flight at a time: hoisting all ACC / 4 of them (the compiler's choice
  // otherwise) needs ACC more registers than the accumulators leave (spills at BN = 256).
#pragma unroll
  for (int v0 = 0; v0 < ACC / 4; v0 += 4) {
    float4 p[4];
#pragma unroll
    for (int v = 0; v < 4 && v0 + v < ACC / 4; ++v) p[v] = __ldcg(src + (v0 + v) * CONSUMER_THREADS);
#pragma unroll
    for (int v = 0; v < 4 && v0 + v < ACC / 4; ++v) {
      acc[4 * (v0 + v)] += p[v].x;
      acc[4 * (v0 + v) + 1] += p[v].y;
      acc[4 * (v0 + v) + 2] += p[v].z;
      acc[4 * (v0 + v) + 3] += p[v].w;
    }
    asm volatile("" ::: "memory");  // keeps the next group's loads below this point
  }
  __syncwarp();  // every lane has seen the flag set before it goes back to 0
  if (threadIdx.x % 32 == 0) *flag = 0;
  __syncwarp();
}

}  // namespace sm90
}  // namespace cuconv
