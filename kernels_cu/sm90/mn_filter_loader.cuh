// cuconv hopper: the filter read MN-major straight from an input gradient's forward weight (SM90_B_MN).
//
// The weight is viewed as (rows = the reduction's channels, taps, b_cols output-channel columns), the
// output channels contiguous. A B slot of BN columns is BN / 64 boxes of 64 columns x BK rows of one
// tap (wgmma's MN-major layout, sm90/mn_major_tile.cuh). GEMM column n lies in phase n / b_cols of
// the input gradient at view column n % b_cols, and which tap of the view window tap j of phase ph
// reads is b_taps[ph * T*R*S + j] (-1: the phase has no tap there, a 64 x 64 block of zeros is loaded
// instead). Both loaders (im2col boxes in conv_fprop_sm90.cu, halo windows in halo_loader.cuh) use
// these three steps: the blocks' columns once per tile, their taps once per window tap (issued before
// the wait for a free slot, so the read's latency overlaps it), the boxes per slot. The im2col loader
// also skips a window tap where no block of the tile reads a filter tap (a stacked-phase convolution's
// tile of one phase: a 3x3 filter of stride 2 has 9 live window taps of 16), and its consumers count the
// slots that come (mn_filter_live_steps); the halo windows are shared by all taps and multiply the zeros.
#pragma once

#include "sm90/tma_im2col_loader.cuh"

namespace cuconv {
namespace sm90 {

// Per 64-column block of the tile starting at column n0: its view column (-1 past the GEMM's K
// columns: zeros) and its phase's row of b_taps.
template <int BLOCKS, typename Params>
__device__ __forceinline__ void mn_filter_blocks(int (&b_col)[BLOCKS], int (&b_row)[BLOCKS], int n0, const Params& g) {
#pragma unroll
  for (int nb = 0; nb < BLOCKS; ++nb) {
    const int col = n0 + 64 * nb;
    const int ph = col < g.K ? col / g.b_cols : 0;
    b_col[nb] = col < g.K ? col - ph * g.b_cols : -1;
    b_row[nb] = ph * g.T * g.R * g.S;
  }
}

// The view's tap of each block at window tap `tap` (-1: zeros).
template <int BLOCKS>
__device__ __forceinline__ void mn_filter_taps(int (&b_tap)[BLOCKS], const int (&b_col)[BLOCKS],
                                               const int (&b_row)[BLOCKS], const int* b_taps, int tap) {
#pragma unroll
  for (int nb = 0; nb < BLOCKS; ++nb) b_tap[nb] = b_col[nb] < 0 ? -1 : __ldg(b_taps + b_row[nb] + tap);
}

// Whether some block reads a filter tap at this window tap: where none does (b_tap all -1) the slots of the
// window tap would multiply zeros only, and the im2col loader and its consumers skip them.
template <int BLOCKS>
__device__ __forceinline__ bool mn_filter_tap_live(const int (&b_tap)[BLOCKS]) {
  bool live = false;
#pragma unroll
  for (int nb = 0; nb < BLOCKS; ++nb) live |= b_tap[nb] >= 0;
  return live;
}

// The slots the im2col loader issues for reduction steps [k_begin, k_end) of the tile at column n0 (step k:
// channel block k % c_blocks of window tap k / c_blocks; the steps of dead window taps are skipped), and
// the channel block of the first of them (`first_cb`).
struct MnLiveSteps {
  int count, first_cb;
};
template <int BLOCKS, typename Params>
__device__ __forceinline__ MnLiveSteps mn_filter_live_steps(const Params& g, int n0, int k_begin, int k_end) {
  int b_col[BLOCKS], b_row[BLOCKS], b_tap[BLOCKS];
  mn_filter_blocks<BLOCKS>(b_col, b_row, n0, g);
  MnLiveSteps out{0, -1};
#pragma unroll 1
  for (int tap = k_begin / g.c_blocks; tap * g.c_blocks < k_end; ++tap) {
    mn_filter_taps<BLOCKS>(b_tap, b_col, b_row, g.b_taps, tap);
    if (!mn_filter_tap_live<BLOCKS>(b_tap)) continue;
    const int lo = max(k_begin, tap * g.c_blocks), hi = min(k_end, (tap + 1) * g.c_blocks);
    if (out.first_cb < 0) out.first_cb = lo - tap * g.c_blocks;
    out.count += hi - lo;
  }
  if (out.first_cb < 0) out.first_cb = 0;
  return out;
}

// The slot's boxes: per block 64 columns x BK rows from row k0 of its tap, or the block of zeros
// (tmap_zero: a box wholly outside the weight, which TMA fills with zeros itself, arrives later).
template <int BLOCKS, int BK>
__device__ __forceinline__ void mn_filter_boxes(uint32_t dst, const TmaDescriptor& tmap_w,
                                                const TmaDescriptor& tmap_zero, uint32_t bar,
                                                const int (&b_col)[BLOCKS], const int (&b_tap)[BLOCKS], int k0) {
#pragma unroll
  for (int nb = 0; nb < BLOCKS; ++nb) {
    if (b_tap[nb] < 0) {
      tma_load_tile_3d(dst + nb * BK * 128, tmap_zero, bar, 0, 0, 0);
    } else {
      tma_load_tile_3d(dst + nb * BK * 128, tmap_w, bar, b_col[nb], b_tap[nb], k0);
    }
  }
}

}  // namespace sm90
}  // namespace cuconv
