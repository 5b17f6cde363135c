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

// How a CTA of the split grid ends (the kernels' `mode` argument):
//   kWgradPartials  its fp32 sums into its workspace plane, for the <name>_reduce launch that follows;
//   kWgradDirect    one split: its sums rounded into dw (no workspace, no reduce);
//   kWgradFused     its sums into its plane, then, once every split of its tile has stored its own
//                   (wgrad_tile_barrier), its share of the tile's elements reduced into dw
//                   (reduce_wgrad_share): the reduce launch's work inside the grid, for a grid whose CTAs
//                   are all resident at once (the host checks the occupancy).
enum WgradEnd : int { kWgradPartials = 0, kWgradDirect = 1, kWgradFused = 2 };

// The CTA's NT storing threads wait here until every split of their tile has stored its partial sums:
// one arrival per CTA on the tile's counter, sense-reversing as a grid barrier is (split 0 adds
// 2^31 - (splits - 1), the others 1, so the top bit flips with the last arrival and the low bits are
// back to zero for the next launch: no reset, whatever problem used the counter last). Each thread's
// stores are fenced at GPU scope before the arrival; the reads after it go to L2 (ld.cg).
template <int NT>
__device__ __forceinline__ void wgrad_tile_barrier(unsigned* counter, int split, int splits) {
  __threadfence();
  asm volatile("bar.sync 1, %0;" ::"n"(NT) : "memory");
  if (threadIdx.x == 0) {
    const unsigned add = split == 0 ? 0x80000000u - (unsigned)(splits - 1) : 1u;
    unsigned old, now;
    asm volatile("atom.add.release.gpu.global.u32 %0, [%1], %2;" : "=r"(old) : "l"(counter), "r"(add) : "memory");
    while (true) {
      asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(now) : "l"(counter) : "memory");
      if ((now ^ old) & 0x80000000u) break;
      __nanosleep(100);  // the tile's counter polled at most every 100 ns: its arrivals are not held up
    }
  }
  asm volatile("bar.sync 1, %0;" ::"n"(NT) : "memory");
}

// One thread's passes over a split's share of its tile (units [u0, u1), quads of 4 sums): per pass, P =
// 8 / LEN units of its own (one for LEN 8 and 16), each the run of planes [s0, s1) of the quad (at most
// LEN of them), all P x LEN loads issued before the adds, which follow plane order; with `runs` > 1 the
// run sums of a unit meet in `part` and the first run's thread adds them in run order. 8 to 16 loads in
// flight per thread whatever the split count (a share is about BM * BN / 4 quad loads over NT threads),
// where a thread walking one unit's planes would wait for each few.
template <int NT, int LEN>
__device__ __forceinline__ void reduce_wgrad_runs(const float4* __restrict__ base, long long plane, int pitch4,
                                                  int quads, int u0, int u1, int s0, int s1, int runs,
                                                  elem_t* __restrict__ out, int pitch, float4* part) {
  constexpr int P = LEN >= 8 ? 1 : 8 / LEN;
  const int t = threadIdx.x, run = t % runs, per_pass = NT / runs;
  const bool packed = (reinterpret_cast<unsigned long long>(out) & 7) == 0 && pitch % 4 == 0;
  for (int b = u0; b < u1; b += P * per_pass) {  // the same passes for every thread: the barriers below
    int off[P];
    float4 sum[P];
#pragma unroll
    for (int p = 0; p < P; ++p) {
      const int u = b + p * per_pass + t / runs;
      const int row = u / quads, q = u - row * quads;
      off[p] = u < u1 ? row * pitch4 + q : -1;
      sum[p] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
    for (int c = s0; c < s1; c += LEN) {  // once, but for a run of more than 16 planes
      float4 v[P][LEN];
#pragma unroll
      for (int p = 0; p < P; ++p) {
#pragma unroll
        for (int i = 0; i < LEN; ++i)
          if (off[p] >= 0 && c + i < s1) v[p][i] = __ldcg(base + off[p] + (c + i) * plane);
      }
#pragma unroll
      for (int p = 0; p < P; ++p) {
#pragma unroll
        for (int i = 0; i < LEN; ++i)
          if (off[p] >= 0 && c + i < s1) cuconv::add_to(sum[p], v[p][i]);
      }
    }
    if (runs > 1) {
#pragma unroll
      for (int p = 0; p < P; ++p) part[p * NT + t] = sum[p];
      asm volatile("bar.sync 1, %0;" ::"n"(NT) : "memory");
      if (run == 0) {
#pragma unroll
        for (int p = 0; p < P; ++p)
          for (int r = 1; r < runs; ++r) cuconv::add_to(sum[p], part[p * NT + t + r]);
      }
      asm volatile("bar.sync 1, %0;" ::"n"(NT) : "memory");  // part is rewritten by the next pass
    }
    if (run != 0) continue;
#pragma unroll
    for (int p = 0; p < P; ++p) {
      if (off[p] < 0) continue;
      const int row = off[p] / pitch4, q = off[p] - row * pitch4;
      elem_t* dst = out + (long long)row * pitch + 4 * q;
      const elem_t e[4] = {from_float<elem_t>(sum[p].x), from_float<elem_t>(sum[p].y), from_float<elem_t>(sum[p].z),
                           from_float<elem_t>(sum[p].w)};
      if (packed) {
        *reinterpret_cast<uint2*>(dst) = make_uint2((uint32_t)e[0].bits | ((uint32_t)e[1].bits << 16),
                                                    (uint32_t)e[2].bits | ((uint32_t)e[3].bits << 16));
      } else {
#pragma unroll
        for (int i = 0; i < 4; ++i) dst[i] = e[i];
      }
    }
  }
}

// Split `split`'s share of its tile's sums (rows m0.., columns n0.. of group `group`; quads of 4 columns,
// cols a multiple of 4): the tile's quads cut into `splits` equal runs, each quad added over the
// workspace planes in split_sum's order (common/split_sum.cuh: split_runs(splits) runs of consecutive
// planes, each in plane order, then the runs in order), so dw has the bits the reduce launch gives.
// `part`: NT float4 of shared memory.
template <int NT>
__device__ __forceinline__ void reduce_wgrad_share(const float* __restrict__ ws, elem_t* __restrict__ dw,
                                                   const cuconv::sm80::WgradGeometry& geo, int group, int m0,
                                                   int n0, int split, float4* part) {
  const int splits = geo.splits;
  const int rows = min(kBM, geo.Kg - m0), quads = min(kBN, geo.cols - n0) / 4;
  const int units = rows * quads;
  const int u0 = (int)((long long)units * split / splits), u1 = (int)((long long)units * (split + 1) / splits);
  const int runs = cuconv::split_runs(splits), len = (splits + runs - 1) / runs;  // len <= 16
  const int run = threadIdx.x % runs;
  const int s0 = min(splits, run * len), s1 = min(splits, s0 + len);
  const long long row0 = (long long)group * geo.Kg + m0;
  const float4* base = reinterpret_cast<const float4*>(ws + row0 * geo.cols + n0);
  const long long plane = (long long)geo.K * geo.cols / 4;  // float4 per workspace plane
  elem_t* out = dw + row0 * geo.cols + n0;
  const int pitch4 = geo.cols / 4;
  if (len <= 1)
    reduce_wgrad_runs<NT, 1>(base, plane, pitch4, quads, u0, u1, s0, s1, runs, out, geo.cols, part);
  else if (len <= 2)
    reduce_wgrad_runs<NT, 2>(base, plane, pitch4, quads, u0, u1, s0, s1, runs, out, geo.cols, part);
  else if (len <= 4)
    reduce_wgrad_runs<NT, 4>(base, plane, pitch4, quads, u0, u1, s0, s1, runs, out, geo.cols, part);
  else if (len <= 8)
    reduce_wgrad_runs<NT, 8>(base, plane, pitch4, quads, u0, u1, s0, s1, runs, out, geo.cols, part);
  else
    reduce_wgrad_runs<NT, 16>(base, plane, pitch4, quads, u0, u1, s0, s1, runs, out, geo.cols, part);
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
