// cuconv hopper: the epilogue-load warp - prefetches the residual C through its own small ring.
//
// Only compiled in when the residual is read (HAS_RESIDUAL, i.e. a residual with beta != 0).
// It first waits on the load-order barrier: the main-load warp arrives there once its prologue
// (the first STAGES operand loads) is issued, so C traffic never delays the first MMAs. Then, for
// every tile of the CTA (the same sequence the other roles walk), it loads C in chunks of
// BM rows x 64 channels (one 128-byte swizzled box each) into a ring of C_STAGES slots:
//
//   wait c_empty[slot] (consumers read the previous chunk there)  ->  expect_tx c_full[slot]
//   ->  TMA tile load of C[m0 : m0 + BM, n0 + 64 j : +64]          (rows >= M, cols >= K: zeros)
//
// Halo tiles (HALO): C is read as (N*O*P, Q, K) through a box of BM/64 output rows x 64 columns x
// 64 channels, which lands in the same tile-row order (row 64 g + j = pixel (y0 + g, x0 + j)).
#pragma once

#include "sm90/pipeline.cuh"
#include "sm90/scheduler.cuh"
#include "sm90/tma_im2col_loader.cuh"

namespace cuconv {
namespace sm90 {

template <int BM, int BN, int C_STAGES, int C_CHUNK_BYTES, bool HALO, typename Params, typename Scheduler>
__device__ __forceinline__ void epilogue_load_warp(const TmaDescriptor& tmap_c, const Params& g, const Scheduler& sched,
                                                   uint32_t c_base, uint32_t c_full_bar, uint32_t c_empty_bar,
                                                   uint32_t load_order_bar) {
  mbar_wait(load_order_bar, 0);
  RingState<C_STAGES> ring;
  for (int t = sched.first(); sched.valid(t); t = sched.next(t)) {
    if (!sched.stores(t)) continue;  // the PARTIAL half of a split tile has no epilogue
    const int n0 = sched.n_tile(t) * BN;
    int c1 = sched.m_tile(t) * BM, c2 = 0;  // box coordinates after the channel: (m0) or (x0, plane row)
    if constexpr (HALO) {
      const HaloTile ht = halo_tile<BM / 64>(sched.m_tile(t), g);
      c1 = ht.x0;
      c2 = ht.plane_row0;
    }
#pragma unroll 1
    for (int chunk = 0; chunk < (BN + 63) / 64; ++chunk) {  // a 32-wide last chunk still loads 64
      mbar_wait(c_empty_bar + 8 * ring.stage, ring.phase ^ 1u);
      mbar_arrive_expect_tx(c_full_bar + 8 * ring.stage, C_CHUNK_BYTES);
      if constexpr (HALO) {
        tma_load_tile_3d(c_base + ring.stage * C_CHUNK_BYTES, tmap_c, c_full_bar + 8 * ring.stage, n0 + 64 * chunk,
                         c1, c2);
      } else {
        tma_load_tile_2d(c_base + ring.stage * C_CHUNK_BYTES, tmap_c, c_full_bar + 8 * ring.stage, n0 + 64 * chunk,
                         c1);
      }
      ring.advance();
    }
  }
}

}  // namespace sm90
}  // namespace cuconv
