// cuconv: conv2d weight gradient for Hopper (sm_90a), an implicit GEMM over the output pixels with
// wgmma; split across CTAs, reduced in a fixed order (as conv2d_wgrad_sm80.cu, whose loaders it uses).
//
//   dw[g Kg + k][j] = sum over pixels l of dy[l][g Kg + k] * im2col(x)[l][j]
//
// Both operands have the pixels (the reduction) as their outer axis, so they are staged MN-major
// (sm90/mn_major_tile.cuh) and multiplied by wgmma with both operands transposed.
//   loaders    every thread: cp.async of dy ([BK pixels][BM filters], LinearLoader) and of im2col(x)
//              ([BK pixels][BN columns], Im2colTLoader) into a STAGES-deep ring, STAGES - 2 tiles ahead
//   mainloop   warpgroup w owns filters [64 w, 64 w + 64) of the CTA's BM: BK / 16 wgmma m64nBNk16
//              per tile, one group in flight (wait_group 1) while the next tile's copies are issued
//   epilogue   the fp32 partial sums of this CTA's pixels -> ws[split][g Kg + k][j] (wgrad_common.cuh)
// Ring protocol per tile kt: wait for this thread's copies of tile kt, fence them to the async proxy,
// __syncthreads (every copy of tile kt landed; every warpgroup has retired the wgmmas of tile kt - 2,
// whose slot the copies of tile kt + STAGES - 2 then refill), issue those copies, issue tile kt's
// wgmmas, wait until only they are in flight.
// Grid: x = n tiles, y = m tiles, z = groups * splits (split fastest). BM / 64 warpgroups.
#ifndef CUCONV_KERNEL_NAME
#define CUCONV_KERNEL_NAME conv2d_wgrad_sm90
#endif
#include "sm80/loader_linear.cuh"
#include "sm80/ptx_sm80.cuh"
#include "sm90/wgrad_common.cuh"

constexpr int kThreads = 128 * (kBM / 64);
static_assert(kStages >= 3, "copies run STAGES - 2 tiles ahead");
using LoaderA = cs::LinearLoader<kBM, kBK, 8, false, kThreads, false, TileA>;
using LoaderB = cs::Im2colTLoader<kBN, kBK, 8, kThreads, TileB>;

extern "C" __global__ void __launch_bounds__(kThreads, 1)
CUCONV_KERNEL_NAME(const elem_t* __restrict__ x, const elem_t* __restrict__ dy, float* __restrict__ ws,
                   cs::WgradGeometry geo) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const uint32_t smem = (cuconv::smem_u32(smem_raw) + 1023u) & ~1023u;  // the host adds 1024 bytes of slack
  const int split = blockIdx.z % geo.splits;
  const int group = blockIdx.z / geo.splits;
  const long long m_offset = (long long)blockIdx.y * kBM;
  const long long n_offset = (long long)blockIdx.x * kBN;
  const int l_begin = split * geo.split_len;
  const int l_end = min(geo.L, l_begin + geo.split_len);
  const LoaderA la{dy + (long long)l_begin * geo.K + group * geo.Kg, geo.Kg, l_end - l_begin, geo.K};
  const LoaderB lb(x, geo, group, n_offset, l_begin, l_end);
  const int k_tiles = (l_end - l_begin + kBK - 1) / kBK;
  const int wg = threadIdx.x / 128;

  float acc[kBN / 2];
#pragma unroll
  for (int i = 0; i < kBN / 2; ++i) acc[i] = 0.f;

  auto stage = [&](int t) { return smem + (uint32_t)((t % kStages) * kStageBytes); };
#pragma unroll 1
  for (int t = 0; t < kStages - 2; ++t) {
    la.load_tile(stage(t), m_offset, (long long)t * kBK);
    lb.load_tile(stage(t) + TileA::kBytes, n_offset, (long long)t * kBK);
    cs::cp_async_commit();
  }
#pragma unroll 1
  for (int kt = 0; kt < k_tiles; ++kt) {
    cs::cp_async_wait<kStages - 3>();  // this thread's copies of tile kt have landed
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    __syncthreads();
    {  // refill the slot of tile kt - 2 (past the last tile: zero-fills, never read)
      const int t = kt + kStages - 2;
      la.load_tile(stage(t), m_offset, (long long)t * kBK);
      lb.load_tile(stage(t) + TileA::kBytes, n_offset, (long long)t * kBK);
      cs::cp_async_commit();
    }
    const uint32_t a = stage(kt) + wg * TileA::kBlockBytes, b = stage(kt) + TileA::kBytes;
    c9::wgrad_slot_mma(acc, a, b);
  }
  c9::wgmma_wait<0>();
  c9::fence_accumulators(acc);
  cs::cp_async_wait<0>();

  c9::store_wgrad_partials(acc, ws, geo, split, group, m_offset, n_offset, wg);
}

CUCONV_WGRAD_REDUCE_ENTRY
