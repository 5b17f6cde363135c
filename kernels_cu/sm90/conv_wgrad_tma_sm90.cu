// cuconv: conv2d weight gradient for Hopper (sm_90a) with TMA loads and a producer warp: the GEMM of
// conv_wgrad_sm90.cu (dw[g Kg + k][j] = sum over pixels l of dy[l][g Kg + k] * im2col(x)[l][j]), its
// tiles brought in by the copy engine instead of by the threads that multiply.
//
//   producer   one warp after the consumers (lane 0 issues): per tile of BK pixels, BM / 64 tiled
//              boxes of dy ({64 filters, BK pixels}, tensor (L, K)) and BN / 64 im2col boxes of x
//              ({BK output pixels, 64 channels} of one filter tap: column block j0 of the group is tap
//              j0 / Cg, channels j0 % Cg ..+64, so Cg is a multiple of 64), into a STAGES-deep ring of
//              full / empty mbarriers (pipeline.cuh). Each box row is 128 bytes with the 128-byte
//              swizzle: exactly the MN-major layout of mn_major_tile.cuh, block after block.
//   consumers  warpgroup w owns filters [64 w, 64 w + 64) of the CTA's BM: BK / 16 wgmma m64nBNk16 per
//              tile with both operands transposed; a slot is released when the wgmmas of the next
//              tile are issued and those of this one have retired (wait_group 1).
//   epilogue   by `mode` (WgradEnd, wgrad_fused_end.cuh): the fp32 partial sums -> ws[split][g Kg + k][j],
//              which the reduce entry then adds in a fixed order (kWgradPartials); with one split, the
//              sums rounded into dw (kWgradDirect: no workspace, no reduce); or the partial sums stored,
//              the tile's splits met at its counter (counters[tile]) and each split's share of the tile
//              added into dw by the consumers, in the reduce entry's order (kWgradFused: a one-wave grid,
//              no reduce launch).
// A split covers whole tiles of BK pixels (the host's split length is a multiple of BK); the last
// split's boxes run past the last pixel, where both tensors read as zeros (dy past its rows, x past
// its last image), so no partial tile needs a mask. Columns past the group's R*S*Cg are not loaded
// (their slots hold stale values, and their sums are not stored).
// Grid: x = n tiles, y = m tiles, z = groups * splits (split fastest). 128 * BM / 64 + 32 threads.
#ifndef CUCONV_KERNEL_NAME
#define CUCONV_KERNEL_NAME conv2d_wgrad_tma_sm90
#endif
#include "common/fast_div.cuh"
#include "sm90/pipeline.cuh"
#include "sm90/tma_im2col_loader.cuh"
#include "sm90/wgrad_common.cuh"
#include "sm90/wgrad_fused_end.cuh"

constexpr int kConsumers = kBM / 64;
constexpr int kThreads = 128 * kConsumers + 32;
static_assert(kStages >= 2, "a slot in use and one filling");

namespace {

// The producer (one lane): per ring slot, dy's tiled boxes and x's im2col boxes of the split's columns.
__device__ __forceinline__ void produce(const c9::TmaDescriptor& tmap_x, const c9::TmaDescriptor& tmap_dy,
                                        const cs::WgradGeometry& geo, const c9::WgradSplit& sp, uint32_t smem,
                                        uint32_t full0, uint32_t empty0) {
  c9::tma_prefetch_descriptor(tmap_x);
  c9::tma_prefetch_descriptor(tmap_dy);
  c9::RingState<kStages> ring;
  const int m_offset = sp.m_tile * kBM, n_offset = sp.n_tile * kBN;
  // The im2col boxes of the tile's column blocks: channel and tap offsets, fixed for the CTA.
  int c_of[kBN / 64];
  uint16_t off_w[kBN / 64], off_h[kBN / 64];
  uint32_t bytes = TileA::kBytes;
#pragma unroll
  for (int b = 0; b < kBN / 64; ++b) {
    const int j0 = n_offset + 64 * b;
    const int tap = (int)cuconv::fast_div((uint32_t)j0, geo.div_cg);
    const int r = (int)cuconv::fast_div((uint32_t)tap, geo.div_s);
    c_of[b] = j0 < geo.cols ? sp.group * geo.Cg + (j0 - tap * geo.Cg) : -1;
    off_w[b] = (uint16_t)((tap - r * geo.S) * geo.dil_w);
    off_h[b] = (uint16_t)(r * geo.dil_h);
    if (j0 < geo.cols) bytes += TileB::kBlockBytes;
  }
  for (int kt = sp.kt0; kt < sp.kt1; ++kt) {
    const uint32_t full = full0 + 8 * ring.stage;
    c9::mbar_wait(empty0 + 8 * ring.stage, ring.phase ^ 1u);
    c9::mbar_arrive_expect_tx(full, bytes);
    const int l0 = kt * kBK;
    const uint32_t a = smem + (uint32_t)(ring.stage * kStageBytes), bb = a + TileA::kBytes;
#pragma unroll
    for (int b = 0; b < kBM / 64; ++b)
      c9::tma_load_tile_2d(a + b * TileA::kBlockBytes, tmap_dy, full, sp.group * geo.Kg + m_offset + 64 * b, l0);
    const int n = (int)cuconv::fast_div((uint32_t)l0, geo.div_pq);
    const int pq = l0 - n * geo.P * geo.Q;
    const int p = (int)cuconv::fast_div((uint32_t)pq, geo.div_q);
    const int q = pq - p * geo.Q;
    const int w0 = q * geo.stride_w - geo.pad_w, h0 = p * geo.stride_h - geo.pad_h;
#pragma unroll
    for (int b = 0; b < kBN / 64; ++b) {
      if (c_of[b] >= 0)
        c9::tma_load_im2col_4d(bb + b * TileB::kBlockBytes, tmap_x, full, c_of[b], w0, h0, n, off_w[b], off_h[b]);
    }
    ring.advance();
  }
}

// A consumer warpgroup (`wg`): its 64 filters of the split, a slot released once the wgmmas of the next one
// are issued and its own have retired, then the CTA's end by `mode` (the ring's shared memory, free by then,
// holds the fused reduce's run sums).
__device__ __forceinline__ void consume(float* __restrict__ ws, elem_t* __restrict__ dw, unsigned* counters,
                                        const cs::WgradGeometry& geo, const c9::WgradSplit& sp, uint32_t smem,
                                        unsigned char* smem_ptr, uint32_t full0, uint32_t empty0, int wg, int lane,
                                        int mode) {
  c9::RingState<kStages> ring;
  float acc[kBN / 2];
#pragma unroll
  for (int i = 0; i < kBN / 2; ++i) acc[i] = 0.f;
  int held = -1;  // the slot whose wgmmas may still be in flight
#pragma unroll 1
  for (int kt = sp.kt0; kt < sp.kt1; ++kt) {
    c9::mbar_wait(full0 + 8 * ring.stage, ring.phase);
    const uint32_t a = smem + (uint32_t)(ring.stage * kStageBytes) + wg * TileA::kBlockBytes;
    const uint32_t b = smem + (uint32_t)(ring.stage * kStageBytes) + TileA::kBytes;
    c9::wgrad_slot_mma(acc, a, b);
    if (held >= 0) c9::mbar_release_slot<1>(empty0 + 8 * held, lane);
    held = ring.stage;
    ring.advance();
  }
  c9::wgmma_wait<0>();
  c9::fence_accumulators(acc);
  const int m0 = sp.m_tile * kBM, n0 = sp.n_tile * kBN;
  if (mode == c9::kWgradDirect) {
    c9::store_wgrad_tile<elem_t>(acc, dw, geo, 0, sp.group, m0, n0, wg);
    return;
  }
  c9::store_wgrad_partials(acc, ws, geo, sp.index, sp.group, m0, n0, wg);
  if (mode == c9::kWgradFused) {
    const int tile = (sp.group * geo.m_tiles + sp.m_tile) * geo.n_tiles + sp.n_tile;
    c9::wgrad_tile_barrier<128 * kConsumers>(counters + tile, sp.index, geo.splits);
    c9::reduce_wgrad_share<128 * kConsumers, kBM, kBN>(ws, dw, geo, sp.group, m0, n0, sp.index,
                                                       reinterpret_cast<float4*>(smem_ptr));
  }
}

}  // namespace

extern "C" __global__ void __launch_bounds__(kThreads, 1)
CUCONV_KERNEL_NAME(const __grid_constant__ c9::TmaDescriptor tmap_x, const __grid_constant__ c9::TmaDescriptor tmap_dy,
                   float* __restrict__ ws, elem_t* __restrict__ dw, unsigned* counters, cs::WgradGeometry geo,
                   int mode) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  __shared__ __align__(8) uint64_t bars[2 * kStages];  // full[s], then empty[s]
  const uint32_t smem = (cuconv::smem_u32(smem_raw) + 1023u) & ~1023u;  // the host adds 1024 bytes of slack
  const uint32_t full0 = cuconv::smem_u32(bars), empty0 = full0 + 8 * kStages;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      c9::mbar_init(full0 + 8 * s, 1);                 // the producer's arrive.expect_tx
      c9::mbar_init(empty0 + 8 * s, 4 * kConsumers);   // one arrival per consumer warp
    }
    c9::mbar_init_fence();
  }
  __syncthreads();

  const c9::WgradSplit sp = c9::wgrad_split_of_cta(geo);
  if (warp == 4 * kConsumers) {
    if (lane == 0) produce(tmap_x, tmap_dy, geo, sp, smem, full0, empty0);
  } else {
    consume(ws, dw, counters, geo, sp, smem, smem_raw + (smem - cuconv::smem_u32(smem_raw)), full0, empty0, warp / 4,
            lane, mode);
  }
}

CUCONV_WGRAD_REDUCE_ENTRY
