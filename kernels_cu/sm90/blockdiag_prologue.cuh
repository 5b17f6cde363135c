// cuconv hopper: the block-diagonal filter of narrow groups, written by the grid at the start of the
// convolution that reads it (sm90_grouped; cuconv/backends/sm90/grouped.py, NumPy model
// cuconv.models.grouped.blockdiag_filter).
//
// With Cg input channels and Cg filters per group (Cg dividing 64), the 64 output channels of block b
// read exactly the 64 input channels of block b, each filter only its own group's Cg of them. Seen as a
// dense convolution over 64 channels per block, filter k's row of tap t is its Cg weights placed at the
// group's offset inside the block, zeros elsewhere:
//
//   dst[k][t][j] = src[k][t][j - off(k)]  for off(k) <= j < off(k) + Cg, else 0,
//   off(k) = (k % 64) - (k % Cg)
//
// Every thread of every CTA writes eight channels of one (k, t) row at a time (one 16-byte store), in
// rounds of SM90_BD_BATCH rows whose loads are all issued before the first store: the loop is bound by the
// latency of those loads, so a small grid (a batch-1 layer runs on a few CTAs) needs them in flight
// together. Where Cg is a multiple of 8 the eight lie wholly inside or outside the group's run and are
// read as 16 bytes; otherwise in pairs. The CTA then meets (the kernel's start-up __syncthreads or
// cluster barrier), and the grid meets at a barrier that only the producer warpgroup waits on (the
// consumers read the filter from shared memory, after the TMA loads the producer issues): thread 0
// publishes the CTA's stores (gpu-scope fence, one atomic add on a 64-bit counter) and waits, with
// acquire loads, until every CTA of this launch has arrived. The counter only grows: launch L's arrivals
// take it from L * gridDim.x to (L + 1) * gridDim.x, so an arrival's target is the next multiple of
// gridDim.x and no reset is needed (one counter per launch record: one grid size, one stream). Every CTA
// of the persistent grid is resident at once (the split tail relies on the same). A proxy fence then
// orders the filter's generic stores before the TMA (async proxy) loads of it.
#pragma once

#include "common/types.cuh"

#define SM90_BD_BATCH 4  // units each thread loads before it stores them (the host reads it: sm90/grouped.py)
#define SM90_BD_TILE_N 64  // filters per tile of the variants that write the filter (the host reads it: sm90/kernel.py)

namespace cuconv {
namespace sm90 {

// The 16 bytes of block-diagonal unit i: row i / 8 (filter k = row / taps), channels 8 (i % 8) .. + 7.
template <typename Params>
__device__ __forceinline__ uint4 blockdiag_unit(const Params& g, int i) {
  const int row = i >> 3, j0 = (i & 7) * 8;
  const int k = row / g.bd_taps;
  const int c0 = j0 - ((k & 63) - k % g.bd_cg);  // the first of the eight channels within the group's run
  uint4 v = make_uint4(0u, 0u, 0u, 0u);
  if (g.bd_cg % 8 == 0) {
    if (c0 >= 0 && c0 < g.bd_cg) v = __ldg(reinterpret_cast<const uint4*>(g.bd_src + row * g.bd_cg + c0));
  } else {
    uint32_t e[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int a = c0 + 2 * j, b = a + 1;
      const uint32_t lo = (a >= 0 && a < g.bd_cg) ? __ldg(g.bd_src + row * g.bd_cg + a) : 0u;
      const uint32_t hi = (b >= 0 && b < g.bd_cg) ? __ldg(g.bd_src + row * g.bd_cg + b) : 0u;
      e[j] = lo | (hi << 16);
    }
    v = make_uint4(e[0], e[1], e[2], e[3]);
  }
  return v;
}

// Run by all NT threads of the CTA before its start-up barrier.
template <int NT, typename Params>
__device__ __forceinline__ void write_blockdiag_filter(const Params& g) {
  const int total = g.bd_rows * 8;  // eight 8-channel units per 64-channel row (the host keeps it below 2^31)
  const int step = gridDim.x * NT;
  for (int i0 = blockIdx.x * NT + threadIdx.x; i0 < total; i0 += SM90_BD_BATCH * step) {
    uint4 v[SM90_BD_BATCH];
#pragma unroll
    for (int u = 0; u < SM90_BD_BATCH; ++u) {
      const int i = i0 + u * step;
      v[u] = i < total ? blockdiag_unit(g, i) : make_uint4(0u, 0u, 0u, 0u);
    }
#pragma unroll
    for (int u = 0; u < SM90_BD_BATCH; ++u) {
      const int i = i0 + u * step;
      if (i < total) *reinterpret_cast<uint4*>(g.bd_dst + (size_t)i * 8) = v[u];  // row * 64 + j0
    }
  }
}

// Run by the 128 threads of the producer warpgroup, after the CTA's start-up barrier: publish the CTA's
// stores, wait for every CTA's, and order them before the TMA loads.
template <typename Params>
__device__ __forceinline__ void await_blockdiag_filter(const Params& g) {
  if (threadIdx.x == 0) {
    __threadfence();
    const unsigned long long n = gridDim.x;
    const unsigned long long target = (atomicAdd(g.bd_sync, 1ull) / n + 1) * n;
    unsigned long long seen;
    do {
      asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(seen) : "l"(g.bd_sync) : "memory");
    } while (seen < target);
  }
  asm volatile("bar.sync 1, 128;" ::: "memory");
  asm volatile("fence.proxy.async;" ::: "memory");
}

}  // namespace sm90
}  // namespace cuconv
