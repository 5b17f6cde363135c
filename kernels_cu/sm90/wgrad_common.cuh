// cuconv hopper: what the two forms of the weight-gradient kernel share (conv_wgrad_sm90.cu, whose
// threads copy with cp.async, and conv_wgrad_tma_sm90.cu, fed by TMA from a producer warp):
//
//   tiles      CUCONV_BM filters x CUCONV_BN columns per CTA, CUCONV_BK pixels per ring slot, both
//              operands MN-major with the 128-byte swizzle (mn_major_tile.cuh), A (dy) then B (im2col(x))
//              in each slot;
//   multiply   a warpgroup's wgmmas of one slot: BK / 16 m64nBNk16 with both operands transposed;
//   epilogue   a warpgroup's fp32 partial sums of its 64 filter rows x BN columns into the split's
//              workspace slice, ws[split][g Kg + k][j] (element layout), or (the TMA form with one
//              split) its sums rounded straight into dw: rows past the group's filters
//              and columns past the group's R*S*Cg are not stored;
//   reduce     the entry <name>_reduce adds the splits in a fixed order (common/split_sum.cuh).
//
// Accumulator layout (wgmma_mainloop.cuh): acc[j*4 + 2*i + e] <-> row 16*warp + lane/4 + 8*i, column
// 8*j + 2*(lane%4) + e of the warpgroup's 64 rows.
#pragma once

#include "common/split_sum.cuh"
#include "common/types.cuh"
#include "sm80/loader_im2col_t.cuh"
#include "sm90/mn_major_tile.cuh"
#include "sm90/wgmma_mainloop.cuh"

#ifndef CUCONV_BM
#define CUCONV_BM 128
#endif
#ifndef CUCONV_BN
#define CUCONV_BN 128
#endif
#ifndef CUCONV_BK
#define CUCONV_BK 64
#endif
#ifndef CUCONV_STAGES
#define CUCONV_STAGES 4
#endif

namespace cs = cuconv::sm80;
namespace c9 = cuconv::sm90;

constexpr int kBM = CUCONV_BM, kBN = CUCONV_BN, kBK = CUCONV_BK, kStages = CUCONV_STAGES;
static_assert(kBM % 64 == 0 && (kBN == 128 || kBN == 192 || kBN == 256) && kBK % 16 == 0, "tile shape");
using TileA = c9::Sw128MnTile<kBK, kBM>;
using TileB = c9::Sw128MnTile<kBK, kBN>;
constexpr int kStageBytes = TileA::kBytes + TileB::kBytes;  // a multiple of 1024: every block stays aligned

namespace cuconv {
namespace sm90 {

// The wgmmas of one ring slot for the warpgroup whose A block (64 filters) starts at `a`; `b`: the
// slot's B tile. Issued between accumulator fences and committed as one group; returns once the previous
// slot's group has retired (this one may still be in flight), so that slot may be refilled. The caller
// waits for the last group (wgmma_wait<0>) before reading the sums.
template <int BN = kBN>
__device__ __forceinline__ void wgrad_slot_mma(float (&acc)[BN / 2], uint32_t a, uint32_t b) {
  wgmma_fence();
  fence_accumulators(acc);
#pragma unroll
  for (int kk = 0; kk < kBK / 16; ++kk) {
    const uint64_t da = smem_desc_mn_sw128(a + kk * 2048, TileA::kBlockBytes);
    const uint64_t db = smem_desc_mn_sw128(b + kk * 2048, TileB::kBlockBytes);
    if constexpr (BN == 128) wgmma_mn_m64n128k16(acc, da, db, 1u);
    else if constexpr (BN == 192) wgmma_mn_m64n192k16(acc, da, db, 1u);
    else wgmma_mn_m64n256k16(acc, da, db, 1u);
  }
  wgmma_commit();
  wgmma_wait<1>();
  fence_accumulators(acc);
}

// Two adjacent sums at `dst`: fp32 partial sums as one float2, or rounded to the element type as one
// 32-bit word (where `aligned`), else one by one.
__device__ __forceinline__ void store_wgrad_pair(float* dst, float v0, float v1, bool aligned) {
  if (aligned) {
    *reinterpret_cast<float2*>(dst) = make_float2(v0, v1);
  } else {
    dst[0] = v0;
    dst[1] = v1;
  }
}

template <typename T>
__device__ __forceinline__ void store_wgrad_pair(T* dst, float v0, float v1, bool aligned) {
  static_assert(sizeof(T) == 2, "16-bit elements");
  const T lo = from_float<T>(v0), hi = from_float<T>(v1);
  if (aligned) {
    *reinterpret_cast<uint32_t*>(dst) = (uint32_t)lo.bits | ((uint32_t)hi.bits << 16);
  } else {
    dst[0] = lo;
    dst[1] = hi;
  }
}

// A warpgroup's sums of its 64 filter rows x BN columns into plane `plane` of `out` (planes of K x cols
// elements): T = float for the workspace's partial sums, elem_t for dw itself (plane 0).
template <typename T>
__device__ __forceinline__ void store_wgrad_tile(const float (&acc)[kBN / 2], T* out,
                                                 const cuconv::sm80::WgradGeometry& geo, int plane, int group,
                                                 long long m_offset, long long n_offset, int wg) {
  const int lane = threadIdx.x & 31, warp = (threadIdx.x >> 5) & 3;
  const int row0 = (int)m_offset + wg * 64 + 16 * warp + lane / 4;
  const int col0 = (int)n_offset + 2 * (lane % 4);
  T* base = out + ((long long)plane * geo.K + (long long)group * geo.Kg) * geo.cols;
  // pairs start on even elements: whole words where cols is even and the plane starts on one
  const bool pairs = (geo.cols & 1) == 0 && (reinterpret_cast<unsigned long long>(base) % (2 * sizeof(T))) == 0;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int row = row0 + 8 * i;
    if (row >= geo.Kg) continue;
#pragma unroll
    for (int j = 0; j < kBN / 8; ++j) {
      const int col = col0 + 8 * j;
      T* dst = base + (long long)row * geo.cols + col;
      const float v0 = acc[j * 4 + 2 * i], v1 = acc[j * 4 + 2 * i + 1];
      if (col + 1 < geo.cols) {
        store_wgrad_pair(dst, v0, v1, pairs);
      } else if (col < geo.cols) {
        dst[0] = from_float<T>(v0);
      }
    }
  }
}

__device__ __forceinline__ void store_wgrad_partials(const float (&acc)[kBN / 2], float* ws,
                                                     const cuconv::sm80::WgradGeometry& geo, int split, int group,
                                                     long long m_offset, long long n_offset, int wg) {
  store_wgrad_tile<float>(acc, ws, geo, split, group, m_offset, n_offset, wg);
}

// The split of one CTA of the split grid (blockIdx: x = n tile, y = m tile, z = group * splits + split):
// reduction steps [kt0, kt1) of BK pixels; `index`, its place among the tile's splits, is its workspace plane.
struct WgradSplit {
  int group, m_tile, n_tile;
  int kt0, kt1;
  int index;
};

__device__ __forceinline__ WgradSplit wgrad_split_of_cta(const cuconv::sm80::WgradGeometry& geo) {
  WgradSplit sp;
  const int split = blockIdx.z % geo.splits;
  const int l_begin = split * geo.split_len, l_end = min(geo.L, l_begin + geo.split_len);
  sp.group = blockIdx.z / geo.splits;
  sp.m_tile = blockIdx.y;
  sp.n_tile = blockIdx.x;
  sp.kt0 = l_begin / kBK;  // the host's split length is a multiple of BK
  sp.kt1 = sp.kt0 + (l_end - l_begin + kBK - 1) / kBK;
  sp.index = split;
  return sp;
}

}  // namespace sm90
}  // namespace cuconv

// dw = the splits of ws added in a fixed order (common/split_sum.cuh): the <name>_reduce entry of a form.
#define CUCONV_WGRAD_REDUCE_ENTRY                                                                                  \
  extern "C" __global__ void __launch_bounds__(256) CUCONV_CAT(CUCONV_KERNEL_NAME, _reduce)(                       \
      const float* __restrict__ ws, elem_t* __restrict__ dw, long long count, int splits) {                        \
    cuconv::split_sum(ws, dw, count, splits);                                                                      \
  }
