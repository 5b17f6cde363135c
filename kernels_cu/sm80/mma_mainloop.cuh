// cuconv sm80: the mma.sync mainloop, written against the loader contract.
//
// CTA tile BM x BN x BK, WARPS_M x WARPS_N warps, warp tile WTM x WTN = (BM / WARPS_M) x (BN / WARPS_N),
// made of MI x NI mma.sync m16n8k16 tiles: acc[MI][NI][4] fp32 per thread.
// Per BK tile and per 16-wide k step:
//   A  smem [BM][BK]                       ldmatrix.x4 -> a[mi][4]      (rows m, 16 x 16)
//   B  smem [BN][BK] (B_K_CONTIG, weights) ldmatrix.x4 -> b[2 nj..][2] (rows n, 16 x 16)
//      smem [BK][BN] (matmul b[K][N])      ldmatrix.x4.trans -> same fragments
// The loaders only see (m_offset | n_offset, k_offset); the ring protocol is in pipeline_cp_async.cuh.
#pragma once
#include "sm80/pipeline_cp_async.cuh"
#include "sm80/smem_tile.cuh"

namespace cuconv {
namespace sm80 {

template <int BM, int BN, int BK, int STAGES, int WARPS_M, int WARPS_N, bool B_K_CONTIG>
struct MmaMainloop {
  static constexpr int kThreads = 32 * WARPS_M * WARPS_N;
  static constexpr int kWarpM = BM / WARPS_M;
  static constexpr int kWarpN = BN / WARPS_N;
  static constexpr int MI = kWarpM / 16;
  static constexpr int NI = kWarpN / 8;
  using TileA = SwizzledTile<BM, BK>;
  using TileB = SwizzledTile<B_K_CONTIG ? BN : BK, B_K_CONTIG ? BK : BN>;
  static constexpr int kStageBytes = TileA::kBytes + TileB::kBytes;
  using Ring = CpAsyncRing<STAGES, kStageBytes>;

  // Budgets: accumulator registers per thread, and the warp tile granularity of ldmatrix.x4.
  static constexpr int kAccRegs = MI * NI * 4;
  static_assert(kAccRegs <= 128, "accumulators must leave registers for fragments and addresses");
  static_assert(kWarpM % 16 == 0 && kWarpN % 16 == 0, "warp tile is a multiple of 16 x 16");
  static_assert(BK % 16 == 0, "BK is a whole number of mma k steps");

  template <class LoaderA, class LoaderB>
  __device__ __forceinline__ static void run(const LoaderA& la, const LoaderB& lb, long long m_offset,
                                             long long n_offset, int k_tiles, uint32_t smem,
                                             float (&acc)[MI][NI][4]) {
    const Ring ring{smem};
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int warp_m0 = (warp % WARPS_M) * kWarpM;
    const int warp_n0 = (warp / WARPS_M) * kWarpN;

#pragma unroll
    for (int mi = 0; mi < MI; ++mi)
#pragma unroll
      for (int ni = 0; ni < NI; ++ni)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[mi][ni][e] = 0.f;

    // Prologue: tiles 0 .. STAGES-2 in flight. Not unrolled: an unrolled prologue keeps every
    // stage's addresses (and, for 2-byte copies, values) live at once and spills.
#pragma unroll 1
    for (int t = 0; t < STAGES - 1; ++t) {
      if (t < k_tiles) {
        la.load_tile(ring.stage(t), m_offset, (long long)t * BK);
        lb.load_tile(ring.stage(t) + TileA::kBytes, n_offset, (long long)t * BK);
      }
      Ring::commit();
    }

    for (int kt = 0; kt < k_tiles; ++kt) {
      Ring::wait_stage();  // tile kt landed everywhere; the stage of tile kt-1 is free
      const int next = kt + STAGES - 1;
      if (next < k_tiles) {
        la.load_tile(ring.stage(next), m_offset, (long long)next * BK);
        lb.load_tile(ring.stage(next) + TileA::kBytes, n_offset, (long long)next * BK);
      }
      Ring::commit();

      const uint32_t a_stage = ring.stage(kt);
      const uint32_t b_stage = a_stage + TileA::kBytes;
#pragma unroll
      for (int ks = 0; ks < BK / 16; ++ks) {
        uint32_t a[MI][4];
        uint32_t b[NI][2];
#pragma unroll
        for (int mi = 0; mi < MI; ++mi) {
          // lanes 0-15: rows 0-15 at k 0-7; lanes 16-31: rows 0-15 at k 8-15  -> a0 a1 a2 a3
          const int row = warp_m0 + mi * 16 + (lane & 15);
          ldmatrix_x4(a[mi], a_stage + TileA::chunk_offset(row, ks * 2 + (lane >> 4)));
        }
#pragma unroll
        for (int nj = 0; nj < NI / 2; ++nj) {
          uint32_t r[4];
          if (B_K_CONTIG) {
            // matrices: (n 0-7, k 0-7) (n 0-7, k 8-15) (n 8-15, k 0-7) (n 8-15, k 8-15)
            const int n = warp_n0 + nj * 16 + (lane & 7) + ((lane >> 4) << 3);
            ldmatrix_x4(r, b_stage + TileB::chunk_offset(n, ks * 2 + ((lane >> 3) & 1)));
          } else {
            // smem rows are k: matrices (k 0-7, n 0-7) (k 8-15, n 0-7) (k 0-7, n 8-15) (k 8-15, n 8-15)
            const int k = ks * 16 + (lane & 7) + (((lane >> 3) & 1) << 3);
            ldmatrix_x4_trans(r, b_stage + TileB::chunk_offset(k, (warp_n0 + nj * 16) / 8 + (lane >> 4)));
          }
          b[2 * nj][0] = r[0];
          b[2 * nj][1] = r[1];
          b[2 * nj + 1][0] = r[2];
          b[2 * nj + 1][1] = r[3];
        }
#pragma unroll
        for (int mi = 0; mi < MI; ++mi)
#pragma unroll
          for (int ni = 0; ni < NI; ++ni) mma_16816<elem_t>(acc[mi][ni], a[mi], b[ni]);
      }
    }
    Ring::drain();
  }
};

}  // namespace sm80
}  // namespace cuconv
