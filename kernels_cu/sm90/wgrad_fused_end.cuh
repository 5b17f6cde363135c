// cuconv hopper: the fused end of the weight gradient's split grid (conv_wgrad_tma_sm90.cu with mode
// kWgradFused): where every CTA of the grid is resident at once, the reduce launch's work is done by the
// grid itself. Each CTA stores its fp32 partial sums into its workspace plane, meets its tile's other
// splits at the tile's counter (wgrad_tile_barrier) and then adds its share of the tile's elements over
// all the planes into dw (reduce_wgrad_share), in the order of common/split_sum.cuh, so dw has the bits
// the reduce launch gives. Synchronisation goes through common/gpu_sync.cuh, and the rest is plain C++:
// tests/test_wgrad_fused_end_emulated.py builds this file for the CPU and runs its CTAs as threads.
#pragma once

#include "common/gpu_sync.cuh"
#include "common/split_sum.cuh"
#include "common/types.cuh"

namespace cuconv {
namespace sm90 {

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
  named_barrier_sync<NT>();
  if (threadIdx.x == 0) {
    const unsigned add = split == 0 ? 0x80000000u - (unsigned)(splits - 1) : 1u;
    const unsigned old = atomic_add_release_gpu(counter, add);
    while (!((load_acquire_gpu(counter) ^ old) & 0x80000000u))
      __nanosleep(100);  // the tile's counter polled at most every 100 ns: its arrivals are not held up
  }
  named_barrier_sync<NT>();
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
      named_barrier_sync<NT>();
      if (run == 0) {
#pragma unroll
        for (int p = 0; p < P; ++p)
          for (int r = 1; r < runs; ++r) cuconv::add_to(sum[p], part[p * NT + t + r]);
      }
      named_barrier_sync<NT>();  // part is rewritten by the next pass
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
// BM x BN: the CTA tile; `geo`: the launch's WgradGeometry (splits, Kg, K, cols); `part`: NT float4 of
// shared memory (more than one run per quad only from 16 splits on, so one unit per thread and pass then).
template <int NT, int BM, int BN, class Geometry>
__device__ __forceinline__ void reduce_wgrad_share(const float* __restrict__ ws, elem_t* __restrict__ dw,
                                                   const Geometry& geo, int group, int m0, int n0, int split,
                                                   float4* part) {
  const int splits = geo.splits;
  const int rows = min(BM, geo.Kg - m0), quads = min(BN, geo.cols - n0) / 4;
  const int units = rows * quads;
  const int u0 = (int)((long long)units * split / splits), u1 = (int)((long long)units * (split + 1) / splits);
  const int runs = cuconv::split_runs(splits), len = (splits + runs - 1) / runs;
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

}  // namespace sm90
}  // namespace cuconv
