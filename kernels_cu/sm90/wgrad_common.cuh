// cuconv hopper: what the two forms of the weight-gradient kernel share (conv_wgrad_sm90.cu, whose
// threads copy with cp.async, and conv_wgrad_tma_sm90.cu, fed by TMA from a producer warp):
//
//   tiles      CUCONV_BM filters x CUCONV_BN columns per CTA, CUCONV_BK pixels per ring slot, both
//              operands MN-major with the 128-byte swizzle (mn_major_tile.cuh), A (dy) then B (im2col(x))
//              in each slot;
//   multiply   a warpgroup's wgmmas of one slot: BK / 16 m64nBNk16 with both operands transposed;
//   epilogue   a warpgroup's fp32 partial sums of its 64 filter rows x BN columns into the split's
//              workspace slice, ws[split][g Kg + k][j] (element layout): rows past the group's filters
//              and columns past the group's R*S*Cg are not stored;
//   reduce     the entry <name>_reduce adds the splits in a fixed order (common/split_sum.cuh); the TMA
//              form's balanced parts (WgradParts) have their own, <name>_reduce_parts.
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
static_assert(kBM % 64 == 0 && (kBN == 128 || kBN == 256) && kBK % 16 == 0, "tile shape");
using TileA = c9::Sw128MnTile<kBK, kBM>;
using TileB = c9::Sw128MnTile<kBK, kBN>;
constexpr int kStageBytes = TileA::kBytes + TileB::kBytes;  // a multiple of 1024: every block stays aligned

namespace cuconv {
namespace sm90 {

// The wgmmas of one ring slot for the warpgroup whose A block (64 filters) starts at `a`; `b`: the
// slot's B tile. The caller fences, commits and waits.
template <int BN = kBN>
__device__ __forceinline__ void wgrad_slot_mma(float (&acc)[BN / 2], uint32_t a, uint32_t b) {
#pragma unroll
  for (int kk = 0; kk < kBK / 16; ++kk) {
    const uint64_t da = smem_desc_mn_sw128(a + kk * 2048, TileA::kBlockBytes);
    const uint64_t db = smem_desc_mn_sw128(b + kk * 2048, TileB::kBlockBytes);
    if constexpr (BN == 128) wgmma_mn_m64n128k16(acc, da, db, 1u);
    else wgmma_mn_m64n256k16(acc, da, db, 1u);
  }
}

__device__ __forceinline__ void store_wgrad_partials(const float (&acc)[kBN / 2], float* ws,
                                                     const cuconv::sm80::WgradGeometry& geo, int split, int group,
                                                     long long m_offset, long long n_offset, int wg) {
  const int lane = threadIdx.x & 31, warp = (threadIdx.x >> 5) & 3;
  const int row0 = (int)m_offset + wg * 64 + 16 * warp + lane / 4;
  const int col0 = (int)n_offset + 2 * (lane % 4);
  float* base = ws + ((long long)split * geo.K + (long long)group * geo.Kg) * geo.cols;
  const bool pairs = (geo.cols & 1) == 0;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int row = row0 + 8 * i;
    if (row >= geo.Kg) continue;
#pragma unroll
    for (int j = 0; j < kBN / 8; ++j) {
      const int col = col0 + 8 * j;
      float* dst = base + (long long)row * geo.cols + col;
      const float v0 = acc[j * 4 + 2 * i], v1 = acc[j * 4 + 2 * i + 1];
      if (pairs && col + 1 < geo.cols) {
        *reinterpret_cast<float2*>(dst) = make_float2(v0, v1);
      } else {
        if (col < geo.cols) dst[0] = v0;
        if (col + 1 < geo.cols) dst[1] = v1;
      }
    }
  }
}

// Balanced parts (the TMA form; host: cuconv.backends.sm90.wgrad.balanced_parts). The reduction of every
// output tile is k_tiles steps of BK pixels: U = tiles * k_tiles units, the output tiles numbered
// (group, m tile, n tile) with the n tile fastest. CTA b of gridDim.x = ctas takes units
// [b U / ctas, (b + 1) U / ctas), so every CTA multiplies the same count (within one step) whatever the
// tile count. Its run within one output tile is a part, stored to workspace plane `slot`: its place among
// that tile's parts. The reduce (_reduce_parts) adds a tile's planes in slot order, so the sum's order is
// fixed by the problem and the CTA count alone. ctas == 0: the split grid (one part per CTA).
struct WgradParts {
  long long units;
  int k_tiles, ctas;
};

// The CTA whose run holds unit u (the largest b with b U / ctas <= u).
__device__ __forceinline__ int parts_cta_of(long long u, const WgradParts& s) {
  return (int)(((u + 1) * s.ctas - 1) / s.units);
}

struct WgradPart {
  int group, m_tile, n_tile;
  int kt0, kt1;  // reduction steps [kt0, kt1) of BK pixels
  int slot;      // workspace plane
};

// The parts of this CTA in order: the producer and the consumers each walk the same sequence. (The fields
// it needs are copied: a reference to a kernel parameter would move the parameter to local memory.)
class WgradPartWalk {
 public:
  __device__ __forceinline__ WgradPartWalk(const cuconv::sm80::WgradGeometry& geo, const WgradParts& s)
      : s_(s), L_(geo.L), split_len_(geo.split_len), splits_(geo.splits), m_tiles_(geo.m_tiles),
        n_tiles_(geo.n_tiles) {
    if (s.ctas > 0) {
      u_ = (long long)blockIdx.x * s.units / s.ctas;
      end_ = (long long)(blockIdx.x + 1) * s.units / s.ctas;
    } else {
      u_ = 0;
      end_ = 1;
    }
  }

  __device__ __forceinline__ bool next(WgradPart& p) {
    if (u_ >= end_) return false;
    if (s_.ctas == 0) {  // the split grid: output tile (y, x), split z % splits of group z / splits
      const int split = blockIdx.z % splits_;
      const int l_begin = split * split_len_, l_end = min(L_, l_begin + split_len_);
      p.group = blockIdx.z / splits_;
      p.m_tile = blockIdx.y;
      p.n_tile = blockIdx.x;
      p.kt0 = l_begin / kBK;  // the host's split length is a multiple of BK
      p.kt1 = p.kt0 + (l_end - l_begin + kBK - 1) / kBK;
      p.slot = split;
      u_ = end_;
      return true;
    }
    const long long tile = u_ / s_.k_tiles, first = tile * s_.k_tiles;
    p.kt0 = (int)(u_ - first);
    p.kt1 = (int)min((long long)s_.k_tiles, end_ - first);
    p.slot = (int)blockIdx.x - parts_cta_of(first, s_);
    const int t = (int)tile;
    p.n_tile = t % n_tiles_;
    p.m_tile = (t / n_tiles_) % m_tiles_;
    p.group = t / (n_tiles_ * m_tiles_);
    u_ = first + p.kt1;
    return true;
  }

 private:
  WgradParts s_;
  int L_, split_len_, splits_, m_tiles_, n_tiles_;
  long long u_, end_;
};

// dw = each output tile's parts added in slot order. Grid (ceil(cols / 1024), K): a CTA takes 1024
// columns of one row g Kg + k of dw, thread t the columns t, t + 256, t + 512, t + 768 (coalesced);
// tile_parts[t]: the parts of output tile t.
__device__ __forceinline__ void wgrad_parts_sum(const float* __restrict__ ws, elem_t* __restrict__ dw,
                                                const cuconv::sm80::WgradGeometry& geo,
                                                const int* __restrict__ tile_parts) {
  const int row = blockIdx.y;
  const int group = row / geo.Kg, k = row - group * geo.Kg;
  const long long plane = (long long)geo.K * geo.cols;
  const int* parts_of_row = tile_parts + (group * geo.m_tiles + k / kBM) * geo.n_tiles;
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const int col = blockIdx.x * 1024 + e * 256 + (int)threadIdx.x;
    if (col >= geo.cols) break;
    const int n = parts_of_row[col / kBN];
    const long long i = (long long)row * geo.cols + col;
    float sum = 0.f;
    for (int s = 0; s < n; ++s) sum += ws[s * plane + i];
    dw[i] = from_float<elem_t>(sum);
  }
}

}  // namespace sm90
}  // namespace cuconv

// dw = the parts of ws added in slot order (balanced parts): the <name>_reduce_parts entry of the TMA form.
#define CUCONV_WGRAD_REDUCE_PARTS_ENTRY                                                                            \
  extern "C" __global__ void __launch_bounds__(256) CUCONV_CAT(CUCONV_KERNEL_NAME, _reduce_parts)(                 \
      const float* __restrict__ ws, elem_t* __restrict__ dw, cuconv::sm80::WgradGeometry geo,                      \
      const int* __restrict__ tile_parts) {                                                                        \
    cuconv::sm90::wgrad_parts_sum(ws, dw, geo, tile_parts);                                                        \
  }

// dw = the splits of ws added in a fixed order (common/split_sum.cuh): the <name>_reduce entry of a form.
#define CUCONV_WGRAD_REDUCE_ENTRY                                                                                  \
  extern "C" __global__ void __launch_bounds__(256) CUCONV_CAT(CUCONV_KERNEL_NAME, _reduce)(                       \
      const float* __restrict__ ws, elem_t* __restrict__ dw, long long count, int splits) {                        \
    cuconv::split_sum(ws, dw, count, splits);                                                                      \
  }
