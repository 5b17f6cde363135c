// cuconv hopper: how tiles reach shared memory - TMA (cp.async.bulk.tensor) loads.
//
// The descriptors (CUtensorMap, 128 opaque bytes) are encoded on the host by cuconv/tensormap.py
// and passed as `const __grid_constant__ TmaDescriptor` kernel parameters; the copy engine reads
// them through their generic address.
//
//   activations x  (N, H, W, C)   im2col mode (3-D: (N, D, H, W, C), 5-D boxes, offsets {s, r, t}): one box = PIXELS (=BM) output pixels x CHANNELS (=BK)
//                                 channels of tap (r, s); coordinates {c, w, h, n} name the tile's
//                                 first output pixel's window origin (p*stride - pad_lo, ...), the
//                                 offsets {s*dil_w, r*dil_h} pick the tap. Out-of-window / out of
//                                 tensor elements (padding, c >= C, pixels past the last image)
//                                 arrive as zeros.
//   weights w      (K, (T*)R*S, C) tiled mode, box {BK channels, 1 tap, BN filters}: c >= C and
//                                 k >= K arrive as zeros.
//   residual C     (M, K)         tiled mode, box {64 channels, BM pixels} (epilogue-load warp).
//
// Halo tiles (SM90_HALO, see halo_loader.cuh) read x and C through tiled boxes instead:
//   activations x  (N, D, H, W, C) tiled mode (a 2-D problem has D = 1), box {64 channels,
//                                 64 + (S-1) dil_w columns, BM/64 + (R-1) dil_h rows, 1, 1}: the
//                                 output rows' input window with its halo; out-of-tensor
//                                 coordinates (negative ones included: padding) arrive as zeros.
//   residual C     (N*O*P, Q, K)  tiled mode, box {64 channels, 64 columns, BM/64 output rows}.
//
// All three use the 128-byte swizzle: each box row is 128 bytes, and 16-byte chunk j of row r is
// stored at chunk j ^ (r % 8) - the layout wgmma's 128B-swizzle descriptors read, and the one the
// epilogue un-swizzles when it reads C.
#pragma once

#include "common/types.cuh"

namespace cuconv {
namespace sm90 {

struct alignas(64) TmaDescriptor {
  uint64_t opaque[16];
};

__device__ __forceinline__ uint64_t tma_desc_addr(const TmaDescriptor& d) {
  return reinterpret_cast<uint64_t>(&d);
}

__device__ __forceinline__ void tma_prefetch_descriptor(const TmaDescriptor& d) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(tma_desc_addr(d)) : "memory");
}

// im2col box of the NHWC activations for tap (offset_h, offset_w) = (r*dil_h, s*dil_w).
__device__ __forceinline__ void tma_load_im2col_4d(uint32_t dst, const TmaDescriptor& d, uint32_t bar,
                                                   int32_t c, int32_t w, int32_t h, int32_t n,
                                                   uint16_t offset_w, uint16_t offset_h) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.im2col.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5, %6}], [%2], {%7, %8};"
      :
      : "r"(dst), "l"(tma_desc_addr(d)), "r"(bar), "r"(c), "r"(w), "r"(h), "r"(n), "h"(offset_w),
        "h"(offset_h)
      : "memory");
}

// The same for NDHWC activations: coordinates {c, w, h, d, n}, offsets {s*dil_w, r*dil_h, t*dil_d}
// (the rank-5 form limits each offset to 5 bits, which cuconv/tensormap.py checks).
__device__ __forceinline__ void tma_load_im2col_5d(uint32_t dst, const TmaDescriptor& desc, uint32_t bar,
                                                   int32_t c, int32_t w, int32_t h, int32_t d, int32_t n,
                                                   uint16_t offset_w, uint16_t offset_h, uint16_t offset_d) {
  asm volatile(
      "cp.async.bulk.tensor.5d.shared::cluster.global.im2col.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5, %6, %7}], [%2], {%8, %9, %10};"
      :
      : "r"(dst), "l"(tma_desc_addr(desc)), "r"(bar), "r"(c), "r"(w), "r"(h), "r"(d), "r"(n), "h"(offset_w),
        "h"(offset_h), "h"(offset_d)
      : "memory");
}

__device__ __forceinline__ void tma_load_tile_3d(uint32_t dst, const TmaDescriptor& d, uint32_t bar,
                                                 int32_t c0, int32_t c1, int32_t c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5}], [%2];"
      :
      : "r"(dst), "l"(tma_desc_addr(d)), "r"(bar), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}

// The same box delivered to the same shared offset (and the same-offset mbarrier) of every CTA
// in `cta_mask` of the cluster: each CTA of a pair loads half of the shared filter tile this way.
__device__ __forceinline__ void tma_load_tile_3d_multicast(uint32_t dst, const TmaDescriptor& d, uint32_t bar,
                                                           int32_t c0, int32_t c1, int32_t c2, uint16_t cta_mask) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster"
      " [%0], [%1, {%3, %4, %5}], [%2], %6;"
      :
      : "r"(dst), "l"(tma_desc_addr(d)), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "h"(cta_mask)
      : "memory");
}

// A tiled box of a rank-5 tensor (the halo tiles' activations): coordinates innermost first.
__device__ __forceinline__ void tma_load_tile_5d(uint32_t dst, const TmaDescriptor& d, uint32_t bar, int32_t c0,
                                                 int32_t c1, int32_t c2, int32_t c3, int32_t c4) {
  asm volatile(
      "cp.async.bulk.tensor.5d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5, %6, %7}], [%2];"
      :
      : "r"(dst), "l"(tma_desc_addr(d)), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4)
      : "memory");
}

// The filter box of one ring slot, BN filters x BK channels of tap `tap` from filter n0 on. With a
// cluster each CTA (rank) loads its BN / CLUSTER filter rows and multicasts them into the same
// slot of every CTA of the cluster, whose full barrier expects the whole box.
template <int CLUSTER, int BN, int BK>
__device__ __forceinline__ void tma_load_filter_box(uint32_t dst, const TmaDescriptor& tmap_w, uint32_t bar, int c,
                                                    int tap, int n0, int rank) {
  if constexpr (CLUSTER == 1) {
    tma_load_tile_3d(dst, tmap_w, bar, c, tap, n0);
  } else {
    constexpr int SHARE_ROWS = BN / CLUSTER;
    tma_load_tile_3d_multicast(dst + rank * SHARE_ROWS * BK * 2, tmap_w, bar, c, tap, n0 + rank * SHARE_ROWS,
                               (uint16_t)((1u << CLUSTER) - 1u));
  }
}

__device__ __forceinline__ void tma_load_tile_2d(uint32_t dst, const TmaDescriptor& d, uint32_t bar,
                                                 int32_t c0, int32_t c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4}], [%2];"
      :
      : "r"(dst), "l"(tma_desc_addr(d)), "r"(bar), "r"(c0), "r"(c1)
      : "memory");
}

}  // namespace sm90
}  // namespace cuconv
