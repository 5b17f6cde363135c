// cuconv sm80: the mma.sync mainloop, written against the loader contract.
//
// CTA tile BM x BN x BK, WARPS_M x WARPS_N warps, warp tile WTM x WTN = (BM / WARPS_M) x (BN / WARPS_N),
// made of MI x NI mma.sync m16n8k16 tiles: acc[MI][NI][4] fp32 per thread.
// Per BK tile and per 16-wide k step:
//   A  smem [BM][BK] (A_K_CONTIG, default) ldmatrix.x4 -> a[mi][4]      (rows m, 16 x 16)
//      smem [BK][BM] (weight gradient dy)  ldmatrix.x4.trans -> same fragments
//   B  smem [BN][BK] (B_K_CONTIG, weights) ldmatrix.x4 -> b[2 nj..][2] (rows n, 16 x 16)
//      smem [BK][BN] (matmul b[K][N])      ldmatrix.x4.trans -> same fragments
// The loaders only see (m_offset | n_offset, k_offset); the ring protocol is in pipeline_cp_async.cuh.
#pragma once
#include "sm80/pipeline_cp_async.cuh"
#include "sm80/smem_tile.cuh"

namespace cuconv {
namespace sm80 {

template <int BM, int BN, int BK, int STAGES, int WARPS_M, int WARPS_N, bool B_K_CONTIG, bool A_K_CONTIG = true>
struct MmaMainloop {
  static constexpr int kThreads = 32 * WARPS_M * WARPS_N;
  static constexpr int kWarpM = BM / WARPS_M;
  static constexpr int kWarpN = BN / WARPS_N;
  static constexpr int MI = kWarpM / 16;
  static constexpr int NI = kWarpN / 8;
  using TileA = SwizzledTile<A_K_CONTIG ? BM : BK, A_K_CONTIG ? BK : BM>;
  using TileB = SwizzledTile<B_K_CONTIG ? BN : BK, B_K_CONTIG ? BK : BN>;
  static constexpr int kStageBytes = TileA::kBytes + TileB::kBytes;
  using Ring = CpAsyncRing<STAGES, kStageBytes>;

  // Budgets: accumulator registers per thread, and the warp tile granularity of ldmatrix.x4.
  static constexpr int kAccRegs = MI * NI * 4;
  static_assert(kAccRegs <= 128, "accumulators must leave registers for fragments and addresses");
  static_assert(kWarpM % 16 == 0 && kWarpN % 16 == 0, "warp tile is a multiple of 16 x 16");
  static_assert(BK % 32 == 0, "BK is an even number of mma k16 steps (the two fragment sets alternate)");

  // One k16 step's operand fragments of this warp: a[mi] (16 x 16 of A), b[ni] (16 x 8 of B).
  struct Fragments {
    uint32_t a[MI][4];
    uint32_t b[NI][2];
  };

  __device__ __forceinline__ static void load_fragments(Fragments& f, uint32_t a_stage, uint32_t b_stage, int ks,
                                                        int warp_m0, int warp_n0, int lane) {
#pragma unroll
    for (int mi = 0; mi < MI; ++mi) {
      if (A_K_CONTIG) {
        // lanes 0-15: rows 0-15 at k 0-7; lanes 16-31: rows 0-15 at k 8-15  -> a0 a1 a2 a3
        const int row = warp_m0 + mi * 16 + (lane & 15);
        ldmatrix_x4(f.a[mi], a_stage + TileA::chunk_offset(row, ks * 2 + (lane >> 4)));
      } else {
        // smem rows are k: matrices (k 0-7, m 0-7) (k 0-7, m 8-15) (k 8-15, m 0-7) (k 8-15, m 8-15),
        // transposed on the way to registers -> the same a0 a1 a2 a3
        const int k = ks * 16 + (lane & 7) + ((lane >> 4) << 3);
        ldmatrix_x4_trans(f.a[mi], a_stage + TileA::chunk_offset(k, (warp_m0 + mi * 16) / 8 + ((lane >> 3) & 1)));
      }
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
      f.b[2 * nj][0] = r[0];
      f.b[2 * nj][1] = r[1];
      f.b[2 * nj + 1][0] = r[2];
      f.b[2 * nj + 1][1] = r[3];
    }
  }

  __device__ __forceinline__ static void mma_step(float (&acc)[MI][NI][4], const Fragments& f) {
#pragma unroll
    for (int mi = 0; mi < MI; ++mi)
#pragma unroll
      for (int ni = 0; ni < NI; ++ni) mma_16816<mma_elem_t>(acc[mi][ni], f.a[mi], f.b[ni]);
  }

  // Software pipeline. Registers: two sets of fragments, those of k16 step ks + 1 are read from shared
  // memory while the mma.sync of step ks run (the step after the last one of tile kt is step 0 of
  // tile kt + 1). Shared memory: the ring's one barrier per tile sits at the start of tile kt, where
  // every warp already holds step 0 of tile kt in registers, so the barrier wait overlaps those
  // mma.sync; past it tile kt + 1 has landed (its fragments are read at the end of tile kt without
  // another barrier) and nobody reads tile kt - 1 any more, so its stage is refilled with tile
  // kt + STAGES - 1 while tile kt is computed: the A part at step 0, the B part at step KS / 2, so
  // the copies' address arithmetic interleaves with the mma.sync. Copies past the last tile are
  // issued with every element predicated off (the loaders zero-fill k >= K and read nothing), so the
  // loop has no branch around them.
  template <class LoaderA, class LoaderB>
  __device__ __forceinline__ static void run(const LoaderA& la, const LoaderB& lb, long long m_offset,
                                             long long n_offset, int k_tiles, uint32_t smem,
                                             float (&acc)[MI][NI][4]) {
    constexpr int KS = BK / 16;
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

    // Prologue: tiles 0 .. STAGES-2, one cp.async group each. Not unrolled: an unrolled prologue
    // keeps every stage's addresses (and, for 2-byte copies, values) live at once and spills.
#pragma unroll 1
    for (int t = 0; t < STAGES - 1; ++t) {
      la.load_tile(ring.stage(t), m_offset, (long long)t * BK);
      lb.load_tile(ring.stage(t) + TileA::kBytes, n_offset, (long long)t * BK);
      Ring::commit();
    }
    Ring::template wait_tiles<STAGES - 2>();  // tile 0

    Fragments frag[2];
    load_fragments(frag[0], ring.stage(0), ring.stage(0) + TileA::kBytes, 0, warp_m0, warp_n0, lane);
#pragma unroll 1
    for (int kt = 0; kt < k_tiles; ++kt) {
      const uint32_t a_stage = ring.stage(kt);
      const uint32_t b_stage = a_stage + TileA::kBytes;
      const uint32_t refill = ring.stage(kt + STAGES - 1);  // = the stage of tile kt - 1
      const long long refill_k = (long long)(kt + STAGES - 1) * BK;
#pragma unroll
      for (int ks = 0; ks < KS; ++ks) {
        if (ks == 0) {
          // Groups so far: tiles 0 .. kt + STAGES - 2; at most STAGES - 3 pending -> tile kt + 1 has
          // landed everywhere, and every warp is past its reads of tile kt - 1.
          Ring::template wait_tiles<STAGES - 3>();
          la.load_tile(refill, m_offset, refill_k);
        }
        if (ks == KS / 2) lb.load_tile(refill + TileA::kBytes, n_offset, refill_k);
        if (ks == KS - 1) {
          Ring::commit();
          const uint32_t a_next = ring.stage(kt + 1);  // past the last tile: zeros, never used
          load_fragments(frag[(ks + 1) % 2], a_next, a_next + TileA::kBytes, 0, warp_m0, warp_n0, lane);
        } else {
          load_fragments(frag[(ks + 1) % 2], a_stage, b_stage, ks + 1, warp_m0, warp_n0, lane);
        }
        mma_step(acc, frag[ks % 2]);
      }
    }
    Ring::drain();
  }
};

}  // namespace sm80
}  // namespace cuconv
