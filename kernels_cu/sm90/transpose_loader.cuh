// cuconv hopper: channels-first x transposed in shared memory into the channels-last halo windows
// (SM90_A_XPOSE: NCHW / NCDHW x read as it is, for filters whose windows start off a 16-byte column).
//
// A channels-first window (halo_loader.cuh, A_CF) is a TMA box per input row whose first column must lie on
// a 16-byte boundary (docs/tuning.md N-cf-unaligned), which a 3x3 filter's columns -1 and +1 do not. Here
// TMA only stages the rows; the producer warpgroup's otherwise idle warps write the channels-last window
// (halo_loader.cuh's slot layout: pixel (i, j) at ((i * halo_w) + j) * 128, 128B-swizzled) that the halo
// consumers read unchanged:
//
//   warp 1, lane 0 (staging_load_warp): per (tile, depth tap ft, channel block cb, window row i) one tiled box
//     of st_w pixels x 64 channels (unswizzled: channel k at byte k * 2 st_w, pixel p at 2 p) from column
//     x0 - pad_w - st_shift on (a multiple of 8 pixels: st_shift = -pad_w mod 8), into a ring of
//     ST_STAGES staging slots (st_full: 1 + tx; st_empty: 2 arrivals).
//   warps 2, 3 (transpose_warps): per window, once its slot is free (a_empty), every staged row in turn:
//     ldmatrix.x4.trans reads four 8 x 8 blocks (8 channel rows of 16 bytes = 8 pixels each) and
//     stmatrix.x4 writes them back as 8 pixel rows of 16 bytes (8 channels), each row at its own address:
//     staged pixel p is window pixel j = p - st_shift, at row ((i * halo_w) + j) * 128 and chunk c / 8 XOR
//     (row address / 128 mod 8), the swizzle of TMA's writes and wgmma's reads. Pixels outside the window
//     (j < 0 or j >= halo_w) go to a 16-byte scratch. Then every thread fences its writes to the async
//     proxy (wgmma reads through it), and lane 0 of each warp arrives on a_full after the warp meets
//     (2 arrivals, no tx); st_empty likewise takes one arrival per warp (64 separate arrivals on one
//     barrier serialise).
//
// st_w / 8 is odd: the 8 channel rows of one ldmatrix block then start in 8 different 16-byte bank groups
// (stride 2 st_w bytes); the stmatrix rows are swizzled, so each block's 8 pixel rows are too. Per 64-channel
// window row the two warps move 16 st_w bytes through shared memory each way (ldmatrix, stmatrix) besides
// TMA's staging write; warp w takes the 8-pixel blocks w, w + 2, ...
#pragma once

#include "sm90/pipeline.cuh"
#include "sm90/scheduler.cuh"
#include "sm90/tma_im2col_loader.cuh"

namespace cuconv {
namespace sm90 {

// Staging slot bytes: 64 channel rows of up to SM90_XPOSE_ST_W_MAX pixels (16-bit).
constexpr int XPOSE_ST_STAGE_BYTES = 64 * SM90_XPOSE_ST_W_MAX * 2;

template <int ROWS, int BN, int BK, int ST_STAGES, typename Params, typename Scheduler>
__device__ __forceinline__ void staging_load_warp(const TmaDescriptor& tmap_x, const Params& g, const Scheduler& sched,
                                                  uint32_t st_base, uint32_t st_full_bar, uint32_t st_empty_bar) {
  RingState<ST_STAGES> sring;
  const int rows = ROWS + (g.R - 1) * g.dil_h;       // input rows of a window
  const uint32_t tx = (uint32_t)g.st_w * (BK * 2);  // bytes of one staged row
  for (int t = sched.first(); sched.valid(t); t = sched.next(t)) {
    const HaloTile ht = halo_tile<ROWS>(sched.m_tile(t), g);
    const int c0 = grouped_c0(g, sched.n_tile(t) * BN);
    const int w0 = ht.x0 - g.pad_w - g.st_shift;
    const int h0 = ht.y0 - g.pad_h;
    const int d_base = ht.z * g.stride_d - g.pad_d;
#pragma unroll 1
    for (int ft = 0; ft < g.T; ++ft) {
#pragma unroll 1
      for (int cb = 0; cb < g.c_blocks; ++cb) {
        const int cx = x_channel<BK>(g, c0, cb);
#pragma unroll 1
        for (int i = 0; i < rows; ++i) {
          const uint32_t full = st_full_bar + 8 * sring.stage;
          mbar_wait(st_empty_bar + 8 * sring.stage, sring.phase ^ 1u);
          mbar_arrive_expect_tx(full, tx);
          tma_load_tile_5d(st_base + sring.stage * XPOSE_ST_STAGE_BYTES, tmap_x, full, w0, h0 + i,
                           d_base + ft * g.dil_d, cx, ht.n_img);
          sring.advance();
        }
      }
    }
  }
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&v)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v[0]), "=r"(v[1]), "=r"(v[2]), "=r"(v[3])
               : "r"(addr)
               : "memory");
}

__device__ __forceinline__ void stmatrix_x4(uint32_t addr, const uint32_t (&v)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(v[0]),
               "r"(v[1]), "r"(v[2]), "r"(v[3])
               : "memory");
}

// Warps 2 and 3 of the producer warpgroup (xw = 0, 1; lane r): the staged rows of every window of the
// CTA's tiles, transposed into the window ring (above). The shared addresses are derived from three (the
// window ring follows the staging ring; each ring's empty barriers follow its full ones, and the scratch
// row the staging barriers): at 32 registers per producer thread (BM = 192, 256) every one counts.
template <int ROWS, int A_STAGES, int A_STAGE_BYTES, int ST_STAGES, bool PAIRED, typename Params, typename Scheduler>
__device__ __forceinline__ void transpose_warps(const Params& g, const Scheduler& sched, uint32_t st_base,
                                                uint32_t a_full_bar, uint32_t st_full_bar, int xw, int lane) {
  constexpr uint32_t A_RING_OFFSET = ST_STAGES * XPOSE_ST_STAGE_BYTES;  // a_base - st_base
  // Both rings' (slot, phase) follow from running counts (win: windows, k: staged rows), one register each.
  static_assert((ST_STAGES & (ST_STAGES - 1)) == 0 && (A_STAGES & (A_STAGES - 1)) == 0, "rings of 2^n slots");
  uint32_t k = 0;
  int windows = 0;  // windows of the CTA's tiles
  for (int t = sched.first(); sched.valid(t); t = sched.next(t)) windows += g.T * g.c_blocks;
  // this lane's ldmatrix row: channel (half * 32 + lane); its stmatrix row: pixel lane % 8 of the block,
  // channel chunk half * 4 + lane / 8
  const uint32_t ld_lane = st_base + (uint32_t)lane * (2u * g.st_w);
  const int px_lane = (lane & 7) - g.st_shift;
  const uint32_t chunk_lane = (uint32_t)(lane >> 3);
#pragma unroll 1
  for (int win = 0; win < windows; ++win) {
    const uint32_t a_stage = (uint32_t)win % A_STAGES, a_phase = ((uint32_t)win / A_STAGES) & 1u;
    mbar_wait(a_full_bar + 8 * (A_STAGES + a_stage), a_phase ^ 1u);  // a_empty
    const uint32_t slot = st_base + A_RING_OFFSET + a_stage * A_STAGE_BYTES;
#pragma unroll 1
    for (int i = 0; i < ROWS + (g.R - 1) * g.dil_h; ++i, ++k) {
      const uint32_t s_stage = k % ST_STAGES;
      mbar_wait(st_full_bar + 8 * s_stage, (k / ST_STAGES) & 1u);
      const uint32_t src = ld_lane + s_stage * XPOSE_ST_STAGE_BYTES;
      const uint32_t row0 = slot + (uint32_t)(i * g.halo_w) * 128u;
#pragma unroll 1
      for (int pb = xw; pb < (g.st_w >> 3); pb += 2) {
        const int j = pb * 8 + px_lane;  // window pixel of this lane's stmatrix row
        const uint32_t row = row0 + (uint32_t)j * 128u;
        const uint32_t swz = (row >> 7) & 7u;
        const bool inside = (unsigned)j < (unsigned)g.halo_w;
        const uint32_t scratch = st_full_bar + 16 * ST_STAGES;
        if constexpr (PAIRED) {  // both halves' loads in flight before the stores
          uint32_t v[4], u[4];
          ldmatrix_x4_trans(v, src + (uint32_t)pb * 16u);
          ldmatrix_x4_trans(u, src + 64u * g.st_w + (uint32_t)pb * 16u);
          stmatrix_x4(inside ? row + ((chunk_lane ^ swz) << 4) : scratch, v);  // outside: the scratch row
          stmatrix_x4(inside ? row + (((4u + chunk_lane) ^ swz) << 4) : scratch, u);
        } else {
#pragma unroll 1  // (unrolled, ptxas keeps both halves' bases live: a spill at 32 registers)
          for (uint32_t half = 0; half < 8; half += 4) {  // channel chunks half .. half + 3
            uint32_t v[4];
            ldmatrix_x4_trans(v, src + half * 16u * g.st_w + (uint32_t)pb * 16u);
            stmatrix_x4(inside ? row + (((half + chunk_lane) ^ swz) << 4) : scratch, v);
          }
        }
      }
      __syncwarp();  // the warp's reads of the slot are done (its stores consumed them): one arrival per warp
      if (lane == 0) mbar_arrive(st_full_bar + 8 * (ST_STAGES + s_stage));  // st_empty
    }
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // each thread's writes, visible to wgmma
    __syncwarp();
    if (lane == 0) mbar_arrive(a_full_bar + 8 * a_stage);  // one arrival per warp
  }
}

}  // namespace sm90
}  // namespace cuconv
