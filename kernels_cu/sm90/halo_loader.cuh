// cuconv hopper: the halo-tile loader - one activation box per (depth tap, channel block), shared
// by every (r, s) tap of a stride-1 convolution.
//
// The im2col loader (conv_fprop_sm90.cu, main_load_warp) loads a fresh BM x 64 box for every tap:
// a 3x3 filter reads each activation nine times from L2. When the H and W strides are 1, the
// inputs that tap (r, s) needs for a tile of output rows [y0, y0 + ROWS) x columns [x0, x0 + 64)
// all lie in one window of (ROWS + (R-1) dil_h) x (64 + (S-1) dil_w) input pixels, the tile plus
// its halo. This loader brings that window in once per (depth tap ft, channel block cb) with a
// tiled TMA box (zero fill past every edge = the padding) into an A ring of A_STAGES slots, and the
// filter boxes of the R x S taps into the B ring, as before (or, with B_MN, the MN-major boxes of
// sm90/mn_filter_loader.cuh):
//
//   A slot: pixel (i, j) of the window at byte ((i * halo_w) + j) * 128, 128B-swizzled rows
//   tap (r, s), consumer warpgroup g (output row y0 + g): its 64 A rows are the window pixels
//   (g + r dil_h, s dil_w + 0..63), i.e. 64 consecutive 128-byte rows starting at
//   ((g + r dil_h) * halo_w + s dil_w) * 128. wgmma's 128B-swizzle descriptor takes such a start
//   (any multiple of 128 bytes) with base offset 0: the swizzle is a function of the address
//   bits, as TMA applies it when it writes the slot (measured on the H100). TMA also writes a slot that starts
//   off a 1024-byte atom boundary by those bits (the second window slot, conv_fprop_sm90.cu).
//
// L2->SM traffic per (ft, cb) for a 256-row tile and a 3x3 filter: one 6 x 66 window (50.7 KB)
// instead of nine 256-row boxes (295 KB). The walk (ft, cb, r, s) differs from the im2col
// loader's (ft, r, s, cb): only the order of the fp32 sum changes.
//
// Channels-first x (A_CF, NCHW / NCDHW read as they are): the tensor map views x as (W, H, D, C, N) (its own
// stride order), and a window is one box of
// 64 columns x 1 x 1 x 64 channels per input row of it (BM/64 + (R-1) dil_h rows, halo_tx / 8192), each
// landing as 64 channel rows of 64 pixels (128 bytes, 128B-swizzled): the MN-major A block of wgmma
// (8192 bytes, sm90/mn_major_tile.cuh). A row of such a window cannot start one pixel further on (2
// bytes), so the window is per (ft, cb, filter column s), taken at column x0 - pad_w + s dil_w, and read by
// the R taps of that column at row starts 8192 dil_h bytes apart. A tiled load's innermost coordinate must
// be a multiple of 16 bytes (8 pixels; others fault, docs/tuning.md N-cf-unaligned), which the host
// checks for every window column -pad_w + s dil_w:
//
//   A slot: window row i, channel k, pixel j at byte (i * 64 + k) * 128 + swizzled 2 j
//   tap (r, s), consumer warpgroup g: its A block starts at (g + r dil_h) * 8192 in the window of column s
//
// Each input is read S times per (ft, cb) instead of once (im2col boxes: R x S times); the filter walk
// (ft, cb, s, r) differs from the channels-last windows' (ft, cb, r, s) in the order of the fp32 sum only.
//
// Transposed channels-first x (A_XPOSE): this warp loads the filter boxes only; the windows come from
// transpose_loader.cuh (staged rows of x transposed by the producer's idle warps into this layout).
//
// Barriers: a_full[i] / a_empty[i] for the window ring (1 + tx; 4 arrivals per consumer
// warpgroup), full[s] / empty[s] for the filter ring (1 + tx; 4 arrivals per consumer warpgroup of
// every CTA of the cluster). The load-order barrier (residual prefetch) is signalled after the
// first STAGES filter boxes. CTA pairs (CLUSTER = 2) work on adjacent halo tiles with the same
// filter columns: each loads half of every filter box and multicasts it to both, as the im2col
// loader does; the windows stay per CTA.
#pragma once

#include "sm90/mn_filter_loader.cuh"
#include "sm90/pipeline.cuh"
#include "sm90/scheduler.cuh"
#include "sm90/tma_im2col_loader.cuh"

namespace cuconv {
namespace sm90 {

template <int ROWS, int BN, int BK, int A_STAGES, int A_STAGE_BYTES, int STAGES, int B_STAGE_BYTES,
          bool HAS_RESIDUAL, int CLUSTER, bool B_MN, bool A_CF, bool A_XPOSE, typename Params, typename Scheduler>
__device__ __forceinline__ void halo_load_warp(const TmaDescriptor& tmap_x, const TmaDescriptor& tmap_w,
                                               const TmaDescriptor& tmap_zero, const Params& g, const Scheduler& sched, uint32_t a_base,
                                               uint32_t b_base, uint32_t a_full_bar, uint32_t a_empty_bar,
                                               uint32_t full_bar, uint32_t empty_bar, uint32_t load_order_bar) {
  RingState<A_STAGES> aring;
  RingState<STAGES> bring;
  int before_order = HAS_RESIDUAL ? STAGES : 0;  // filter boxes still to issue before load_order
  const int win_s = A_CF ? g.S : 1;         // windows per (ft, cb): one per filter column (A_CF)
  const int taps2 = g.R * (A_CF ? 1 : g.S);  // filter taps per window
  for (int t = sched.first(); sched.valid(t); t = sched.next(t)) {
    const HaloTile ht = halo_tile<ROWS>(sched.m_tile(t), g);
    const int n0 = sched.n_tile(t) * BN;
    const int c0 = grouped_c0(g, n0);
    const int w0 = ht.x0 - g.pad_w;
    const int h0 = ht.y0 - g.pad_h;
    const int d_base = ht.z * g.stride_d - g.pad_d;
    int b_col[BN / 64 > 0 ? BN / 64 : 1], b_row[BN / 64 > 0 ? BN / 64 : 1], b_tap[BN / 64 > 0 ? BN / 64 : 1];
    if constexpr (B_MN) mn_filter_blocks<BN / 64>(b_col, b_row, n0, g);  // the filter read MN-major
#pragma unroll 1
    for (int ft = 0; ft < g.T; ++ft) {
#pragma unroll 1
      for (int cb = 0; cb < g.c_blocks; ++cb) {
#pragma unroll 1
        for (int ws = 0; ws < win_s; ++ws) {
          if constexpr (!A_XPOSE) {  // (A_XPOSE: the transposing warps write the window, transpose_loader.cuh)
            const uint32_t a_full = a_full_bar + 8 * aring.stage;
            const int cx = x_channel<BK>(g, c0, cb);
            mbar_wait(a_empty_bar + 8 * aring.stage, aring.phase ^ 1u);
            mbar_arrive_expect_tx(a_full, g.halo_tx);
            if constexpr (A_CF) {
#pragma unroll 1
              for (int i = 0; i < (g.halo_tx >> 13); ++i)  // one box per input row of the window
                tma_load_tile_5d(a_base + aring.stage * A_STAGE_BYTES + i * 8192, tmap_x, a_full, w0 + ws * g.dil_w,
                                 h0 + i, d_base + ft * g.dil_d, cx, ht.n_img);
            } else {
              tma_load_tile_5d(a_base + aring.stage * A_STAGE_BYTES, tmap_x, a_full, cx, w0, h0,
                               d_base + ft * g.dil_d, ht.n_img);
            }
            aring.advance();
          }
#pragma unroll 1
          for (int tap2 = 0; tap2 < taps2; ++tap2) {
            const uint32_t full = full_bar + 8 * bring.stage;
            // the filter's tap: (ft, r, s) with r = tap2 and s = ws (A_CF), or (r, s) = tap2 in the window
            const int tap = A_CF ? (ft * g.R + tap2) * g.S + ws : ft * taps2 + tap2;
            // MN-major: the taps change every slot here; read before the wait, which hides the read
            if constexpr (B_MN) mn_filter_taps<BN / 64>(b_tap, b_col, b_row, g.b_taps, tap);
            mbar_wait(empty_bar + 8 * bring.stage, bring.phase ^ 1u);
            mbar_arrive_expect_tx(full, B_STAGE_BYTES);
            if constexpr (B_MN) {
              mn_filter_boxes<BN / 64, BK>(b_base + bring.stage * B_STAGE_BYTES, tmap_w, tmap_zero, full, b_col, b_tap,
                                           cb * BK);
            } else {
              tma_load_filter_box<CLUSTER, BN, BK>(b_base + bring.stage * B_STAGE_BYTES, tmap_w, full, cb * BK, tap, n0,
                                                   sched.rank);
            }
            bring.advance();
            if (before_order > 0 && --before_order == 0) mbar_arrive(load_order_bar);
          }
        }
      }
    }
    if (before_order > 0) {  // the first tile had fewer filter boxes than the ring
      mbar_arrive(load_order_bar);
      before_order = 0;
    }
  }
}

}  // namespace sm90
}  // namespace cuconv
