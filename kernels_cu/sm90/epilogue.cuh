// cuconv hopper: the consumer epilogue - out = act(alpha * acc + bias + beta * C), cast, store.
//
// Works straight from the wgmma accumulator layout (see wgmma_mainloop.cuh): each thread owns
// pairs of adjacent output channels; a quad transpose turns them into 16-byte row segments (K is a
// multiple of 8, so a segment never straddles the end of a row). The tile is walked in chunks of 64 channels (the last one 32 when BN
// is an odd multiple of 32), the unit of the epilogue-load ring: with a residual, chunk j waits c_full, reads C from the swizzled box
// (row r, 16-byte column chunk jj lives at chunk jj ^ (r % 8): conflict-free for the 8 rows x 4
// lanes of a warp), then releases the slot. `out` may be the residual itself: every element of C
// is read (into smem, by TMA, and then by its owning thread) before that thread writes it, and
// tiles never overlap.
#pragma once

#include "common/epilogue_math.cuh"
#include "common/fast_div.cuh"
#include "common/types.cuh"
#include "sm90/pipeline.cuh"

namespace cuconv {
namespace sm90 {

__device__ __forceinline__ uint32_t ld_shared_u32(uint32_t addr) {
  uint32_t v;
  asm volatile("ld.shared.u32 %0, [%1];" : "=r"(v) : "r"(addr) : "memory");
  return v;
}

template <typename T>
__device__ __forceinline__ float lo_to_float(uint32_t pair) {
  T h;
  h.bits = (uint16_t)(pair & 0xFFFF);
  return to_float(h);
}
template <typename T>
__device__ __forceinline__ float hi_to_float(uint32_t pair) {
  T h;
  h.bits = (uint16_t)(pair >> 16);
  return to_float(h);
}

__device__ __forceinline__ uint32_t shfl_xor(uint32_t v, int lane_mask) {
  uint32_t r;
  asm volatile("shfl.sync.bfly.b32 %0, %1, %2, 0x1f, 0xffffffff;" : "=r"(r) : "r"(v), "r"(lane_mask));
  return r;
}

// One butterfly stage of the quad transpose (below): lanes t and t ^ X swap the words of the slots
// whose bit X differs from their own lane bit. `high` = (t & X) != 0, slots q and q | X with
// (q & X) == 0: a low lane keeps v[q] and receives the partner's v[q] into v[q | X]; a high lane
// keeps v[q | X] and receives the partner's v[q | X] into v[q].
template <int X>
__device__ __forceinline__ void quad_transpose_stage(uint32_t (&v)[4], bool high) {
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    if ((q & X) != 0) continue;
    const uint32_t send = high ? v[q] : v[q | X];
    const uint32_t got = shfl_xor(send, X);
    v[q] = high ? got : v[q];
    v[q | X] = high ? v[q | X] : got;
  }
}

// A 16-byte store under a predicate, in the instruction itself: an `if` around a plain store becomes a
// branch, and the branches split the epilogue into one basic block per store, which ptxas neither
// interleaves (each row's shuffle chain then runs at its full latency) nor lets share the row's
// address arithmetic.
__device__ __forceinline__ void st_global_v4_if(bool pred, void* ptr, uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
  asm volatile(
      "{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %5, 0;\n\t@p st.global.v4.b32 [%0], {%1, %2, %3, %4};\n\t}" ::"l"(ptr),
      "r"(a), "r"(b), "r"(c), "r"(d), "r"((int)pred)
      : "memory");
}

// The bias pairs of four 8-column blocks (32 channels) starting at this lane's column `col` of the
// first: bsum[q] of column col + 8 q (zeros without a bias or past K), loaded once for both rows.
// (bsum starts zeroed, by its declaration in the caller.)
template <typename T>
__device__ __forceinline__ void load_bias_group(float (&bsum)[4][2], const T* bias, const EpilogueParams& ep, int col,
                                                int K) {
  if (ep.has_bias) {
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      if (col + 8 * q < K) {
        const uint32_t bp = *reinterpret_cast<const uint32_t*>(bias + col + 8 * q);
        bsum[q][0] = lo_to_float<T>(bp);
        bsum[q][1] = hi_to_float<T>(bp);
      }
    }
  }
}

// act(alpha * acc + bias + beta * C) of this thread's pairs in blocks jj0 .. jj0 + 3 of chunk `chunk`,
// row half i (cpair: its C words, read with a residual), packed to 2 x 16 bit and quad-transposed:
// afterwards word k of `packed` is lane k's pair of block jj0 + t (columns 2k, 2k + 1 of it), the
// 16-byte vector this lane stores.
template <typename T, int BN, bool HAS_RESIDUAL, int ACT>
__device__ __forceinline__ void pack_group(uint32_t (&packed)[4], const float (&acc)[BN / 2], int chunk, int jj0,
                                           int i, const float (&bsum)[4][2], const uint32_t (&cpair)[8],
                                           const EpilogueParams& ep, int t) {
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const int jj = jj0 + q;
    const int a = (chunk * 8 + jj) * 4 + 2 * i;
    float v0 = ep.alpha * acc[a] + bsum[q][0];
    float v1 = ep.alpha * acc[a + 1] + bsum[q][1];
    if constexpr (HAS_RESIDUAL) {
      v0 += ep.beta * lo_to_float<T>(cpair[jj]);
      v1 += ep.beta * hi_to_float<T>(cpair[jj]);
    }
    packed[q] = pack2<T>(activate(v0, ACT), activate(v1, ACT));
  }
  quad_transpose_stage<2>(packed, (t & 2) != 0);
  quad_transpose_stage<1>(packed, (t & 1) != 0);
}

// row_base: this thread's first tile row (16 * warp_in_group + lane / 4 + 64 * warpgroup), the
// row of the C chunk it reads; col_lane: 2 * (lane % 4). Where the rows go: m_row is the GEMM
// row (output pixel) of the thread's first row, its second row (8 further) is m_row + 8, and a row
// i is stored only when 8 * i < row_limit (rows past M, or past the output row of a halo tile).
//
// Stores: the four lanes of a quad hold the 16 bytes of columns 8 jj .. 8 jj + 7 of a row, two
// each. A 4 x 4 transpose inside the quad hands lane t the whole 16 bytes of column block jj0 + t,
// so each thread writes one 16-byte vector per row and group: a warp store covers 8 rows x 64
// contiguous bytes (whole sectors) instead of 8 x 16. The transpose is two butterfly stages (lane
// masks 2, then 1), four shuffles and twelve selects on two fixed lane-bit predicates. A rotation by
// (t + r) % 4 in four rounds takes about 3x the instructions: its run-time-indexed selects need
// predicates that do not fit the predicate registers and are recomputed.
//
// ACT is the activation as a compile-time constant: the caller switches on the runtime code once
// per tile (consumer_epilogue_any). Selecting it per element instead interleaves the code of all
// four activations (erf and exp inlined 2 * BN times), and the executed path then spans a body
// larger than the instruction cache: measured as instruction-fetch stalls dominating the
// memory-bound 1x1 convolutions, whose tiles have a single K block and are mostly epilogue.
template <typename T, int BN, int C_STAGES, bool HAS_RESIDUAL, int C_CHUNK_BYTES, int ACT>
__device__ __forceinline__ void consumer_epilogue(const float (&acc)[BN / 2], long long m_row, int row_limit, int n0, int K,
                                                  T* out, const T* bias, const EpilogueParams& ep,
                                                  RingState<C_STAGES>& cring, uint32_t c_base,
                                                  uint32_t c_full_bar, uint32_t c_empty_bar, int row_base,
                                                  int col_lane, bool lane_leader) {
  const int lane = threadIdx.x % 32;
  const int t = lane & 3;  // position in the quad
  static_assert(BN % 32 == 0, "the epilogue walks 64-channel chunks, the last one possibly 32 wide");
  const int cols_left = K - n0 - 8 * t;  // the block at offset o is stored when o < cols_left
  // This lane's 16-byte column of its two rows (not dereferenced for rows past row_limit).
  T* const row_out[2] = {out + m_row * K + n0 + 8 * t, out + (m_row + 8) * K + n0 + 8 * t};
#pragma unroll
  for (int chunk = 0; chunk < (BN + 63) / 64; ++chunk) {
    // 8-column blocks in this chunk: 8, or 4 for the half chunk that ends a BN = 96 / 160 tile (its
    // C box is still 64 channels wide: the extra columns are loaded and not read).
    const int blocks = (BN - 64 * chunk) >= 64 ? 8 : 4;
    uint32_t cpair[2][8];
    if constexpr (HAS_RESIDUAL) {
      mbar_wait(c_full_bar + 8 * cring.stage, cring.phase);
      const uint32_t buf = c_base + cring.stage * C_CHUNK_BYTES;
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int row = row_base + 8 * i;
#pragma unroll
        for (int jj = 0; jj < blocks; ++jj) {
          cpair[i][jj] = ld_shared_u32(buf + row * 128 + ((jj ^ (row & 7)) << 4) + col_lane * 2);
        }
      }
    }
    // Per group of four 8-column blocks (32 channels) and row: act(alpha * acc + bias + beta * C)
    // for this thread's four pairs, packed to 2 x 16 bit, then the quad transpose and one 16-byte
    // store (all lanes shuffle; only the stores are predicated off). Row by row keeps 4 packed words
    // live: the 256 x 128 halo tile (112 registers per consumer thread) spills with more. The bias
    // words of the group are loaded once for both rows.
#pragma unroll
    for (int jj0 = 0; jj0 < blocks; jj0 += 4) {
      float bsum[4][2] = {};
      load_bias_group<T>(bsum, bias, ep, n0 + chunk * 64 + jj0 * 8 + col_lane, K);
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        uint32_t packed[4];
        pack_group<T, BN, HAS_RESIDUAL, ACT>(packed, acc, chunk, jj0, i, bsum, cpair[i], ep, t);
        const int offset = chunk * 64 + jj0 * 8;  // a constant once unrolled: the store's immediate
        st_global_v4_if(8 * i < row_limit && offset < cols_left, row_out[i] + offset, packed[0], packed[1],
                        packed[2], packed[3]);
      }
    }
    if constexpr (HAS_RESIDUAL) {
      // Release the C slot once the chunk's stores are issued: they consume every value read from
      // it, so the reads have completed. A proxy fence here would compile to MEMBAR.ALL.CTA, which
      // also waits for the previous chunk's global stores.
      __syncwarp();
      if (lane_leader) mbar_arrive(c_empty_bar + 8 * cring.stage);
      cring.advance();
    }
  }
}

// The phase-scattering epilogue (SM90_PHASE_OUT): the GEMM is the stacked-phase convolution of an
// input gradient (cuconv/subpixel.py), its K = P * C columns the P output phases of C channels each
// (C a multiple of 32, so each 32-column group lies in one phase), its rows the positions
// (n, u0, u1, u2) of the stacked output z (extents O, P, Q: the convolution's own). Row u of phase ph
// is dx[n, s0 u0 + d0[ph], s1 u1 + d1[ph], s2 u2 + d2[ph], c] (d_a = phi_a - s_a shift_a(phi_a)), stored
// where each coordinate is inside dx (ph_ext0..2): dx is written in place, without z and the unstack
// pass. Bias, activation and the quad transpose are the channels-last epilogue's; there is no residual
// (the host stacks a residual and runs the unstack instead). G: the kernel's parameter struct, which
// carries dx's geometry (ph_* members), the phase table's address and the z extents' divisors.
template <typename T, int BN, int ACT, typename G>
__device__ __forceinline__ void consumer_epilogue_phases(const float (&acc)[BN / 2], long long m_row, int row_limit,
                                                         int n0, int K, T* out, const T* bias, const EpilogueParams& ep,
                                                         int col_lane, const G& g) {
  const int lane = threadIdx.x % 32;
  const int t = lane & 3;
  const int pq = g.P * g.Q, opq = g.O * pq;
  // This thread's two rows: their z positions (n, u0, u1, u2) -> where they start in dx before the
  // phase's offset, and their strided coordinates s_a u_a, which the phase's offsets move into or out of dx.
  long long row_at[2];
  int y0[2], y1[2], y2[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int m = (int)(m_row + 8 * i);  // the host keeps M below 2^31
    const int n = (int)fast_div((uint32_t)m, g.opq_div);
    int rem = m - n * opq;
    const int u0 = (int)fast_div((uint32_t)rem, g.pq_div);
    rem -= u0 * pq;
    const int u1 = (int)fast_div((uint32_t)rem, g.q_div);
    const int u2 = rem - u1 * g.Q;
    y0[i] = g.ph_s0 * u0;
    y1[i] = g.ph_s1 * u1;
    y2[i] = g.ph_s2 * u2;
    row_at[i] = ((((long long)n * g.ph_ext0 + y0[i]) * g.ph_ext1 + y1[i]) * g.ph_ext2 + y2[i]) * g.ph_channels;
    if (8 * i >= row_limit) y0[i] = -(1 << 29);  // never inside dx: the row is past the tile's end
  }
  uint32_t unused[8];
#pragma unroll
  for (int chunk = 0; chunk < (BN + 63) / 64; ++chunk) {
    const int blocks = (BN - 64 * chunk) >= 64 ? 8 : 4;
#pragma unroll
    for (int jj0 = 0; jj0 < blocks; jj0 += 4) {
      const int col0 = n0 + chunk * 64 + jj0 * 8;  // the group's first column (the same in the warp)
      const bool group_ok = col0 < K;              // K = P * C is a multiple of 32: whole groups
      // computed for every group, then selected: a division under the predicate leaves its 64-bit
      // product partly defined, and ptxas keeps one per group in local memory at 128 x 256
      const int ph_of_col = (int)fast_div((uint32_t)col0, g.ph_channels_div);
      const int ph = group_ok ? ph_of_col : 0;
      const int4 d = __ldg(g.ph_table + ph);
      const long long phase_at =
          (((long long)d.x * g.ph_ext1 + d.y) * g.ph_ext2 + d.z) * g.ph_channels + (col0 - ph * g.ph_channels) + 8 * t;
      float bsum[4][2] = {};
      load_bias_group<T>(bsum, bias, ep, col0 + col_lane, K);
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        uint32_t packed[4];
        pack_group<T, BN, false, ACT>(packed, acc, chunk, jj0, i, bsum, unused, ep, t);
        const bool inside = (unsigned)(y0[i] + d.x) < (unsigned)g.ph_ext0 &&
                            (unsigned)(y1[i] + d.y) < (unsigned)g.ph_ext1 && (unsigned)(y2[i] + d.z) < (unsigned)g.ph_ext2;
        st_global_v4_if(group_ok && inside, out + row_at[i] + phase_at, packed[0], packed[1], packed[2], packed[3]);
      }
    }
  }
}

__device__ __forceinline__ void st_global_b16_if(bool pred, void* ptr, uint16_t v) {
  asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %2, 0;\n\t@p st.global.b16 [%0], %1;\n\t}" ::"l"(ptr), "h"(v),
               "r"((int)pred)
               : "memory");
}

__device__ __forceinline__ uint16_t ld_global_b16_if(bool pred, const void* ptr) {
  uint16_t v;
  asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %2, 0;\n\tmov.b16 %0, 0;\n\t@p ld.global.b16 %0, [%1];\n\t}"
               : "=h"(v)
               : "l"(ptr), "r"((int)pred)
               : "memory");
  return v;
}

// The channels-first epilogue (SM90_NCHW_OUT): out and the residual are (N, K, O*P*Q), element
// (m, k) of the GEMM at (m / OPQ) * K * OPQ + k * OPQ + m % OPQ. The residual is read from global
// memory at the same addresses, each element by the thread that then writes it (so `out` may be the
// residual), not through the epilogue-load warp: a TMA box of C would be channel-major here, and a
// row tile may cross an image boundary.
//
// Two store patterns, chosen per warp (a uniform branch):
// - rows (consumer_epilogue_nchw_rows): a 4 x 4 transpose of each 8-column block over lane bits 2
//   and 3 hands every thread four consecutive output pixels of one channel, one 8-byte access; a warp
//   access covers 16 pixels (32 contiguous bytes, a whole sector) in each of 8 channel planes. It
//   needs the warp's 16 rows to start on a multiple of 4 pixels, OPQ a multiple of 4 (a 4-pixel group
//   never crosses an image), the row limit a multiple of 4 (or all 16 rows), and 8-byte aligned
//   pointers.
// - pairs (consumer_epilogue_nchw_pairs): the accumulator layout as it is, 16-bit accesses; for one
//   register the eight row-lanes of a column hold eight consecutive pixels, so a warp access covers
//   16 bytes (half a sector) in each of four channel planes. Used where the rows pattern does not
//   apply (OPQ not a multiple of 4, as on 7x7 images; halo tiles of rows whose width is not a multiple
//   of 4; `out` or the residual not 8-byte aligned).
// The rows pattern makes a quarter of the pairs pattern's store instructions and half its sector
// writes: memory-bound layers with wide outputs are bound by the L2's write requests in the pairs
// pattern.

// The row transpose of one 8-column block's 16-bit results (a 4 x 4 transpose over lane bits 2 and 3
// and the thread's four values). Lane 4 r + t, r = 4 a + b, enters with w[i] = its (row r + 8 i,
// columns 2 t, 2 t + 1) pair, as the accumulator layout holds them, and leaves with w[h] = (rows
// j0 + 2 h, j0 + 2 h + 1) of column 2 t + (b & 1), j0 = 8 (b >> 1) + 4 a: four consecutive pixels of
// one channel. Two butterfly stages: across lane bit 3 the whole words swap (row halves i), across
// lane bit 2 the 16-bit halves (columns e), two per shuffle. The transpose is its own inverse: the
// same call takes a residual loaded in the rows order back to the accumulator layout.
__device__ __forceinline__ void rows_transpose16(uint32_t (&w)[2], int lane) {
  const bool high3 = (lane & 8) != 0;
  const uint32_t got3 = __shfl_xor_sync(0xffffffffu, high3 ? w[0] : w[1], 8);
  w[0] = high3 ? got3 : w[0];
  w[1] = high3 ? w[1] : got3;
  const bool high2 = (lane & 4) != 0;
  // the low lane keeps the low halves (column 2 t) and sends the high ones; the high lane the reverse
  const uint32_t got2 = __shfl_xor_sync(0xffffffffu, __byte_perm(w[0], w[1], high2 ? 0x5410u : 0x7632u), 4);
  w[0] = __byte_perm(w[0], got2, high2 ? 0x3254u : 0x5410u);
  w[1] = __byte_perm(w[1], got2, high2 ? 0x3276u : 0x7610u);
}

__device__ __forceinline__ void st_global_v2_if(bool pred, void* ptr, uint32_t a, uint32_t b) {
  asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %3, 0;\n\t@p st.global.v2.b32 [%0], {%1, %2};\n\t}" ::"l"(ptr),
               "r"(a), "r"(b), "r"((int)pred)
               : "memory");
}

// Predicated loads for the rows pattern: volatile (the optimiser would otherwise sink each load to
// its block, behind the stores before it), without a memory clobber. Safe for the residual even when
// it is `out`: each element is loaded by the thread that stores it, before its store.
__device__ __forceinline__ uint2 ld_global_v2_if(bool pred, const void* ptr) {
  uint32_t a, b;
  asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %3, 0;\n\tmov.b32 %0, 0;\n\tmov.b32 %1, 0;\n\t"
      "@p ld.global.v2.b32 {%0, %1}, [%2];\n\t}"
      : "=r"(a), "=r"(b)
      : "l"(ptr), "r"((int)pred));
  return make_uint2(a, b);
}

__device__ __forceinline__ uint32_t ld_global_b32_if(bool pred, const void* ptr) {
  uint32_t a;
  asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %2, 0;\n\tmov.b32 %0, 0;\n\t@p ld.global.b32 %0, [%1];\n\t}"
      : "=r"(a)
      : "l"(ptr), "r"((int)pred));
  return a;
}

// The rows pattern: the epilogue terms are applied in the accumulator layout (the bias pair of the
// thread's two columns; the residual loaded in the rows order and transposed back), the results
// packed to 16 bits and transposed (rows_transpose16), then one 8-byte store per block and thread.
// m_base: the warp's first row; limit: the rows stored from it (a multiple of 4, or >= 16).
template <typename T, int BN, int ACT, bool RES>
__device__ __forceinline__ void consumer_epilogue_nchw_rows(const float (&acc)[BN / 2], long long m_base, int limit,
                                                            int n0, int K, long long opq, T* out, const T* bias,
                                                            const T* residual, const EpilogueParams& ep) {
  const int lane = threadIdx.x % 32;
  const int b = (lane >> 2) & 3;
  const int j0 = 8 * (b >> 1) + 4 * (lane >> 4);  // this thread's first row of the warp's 16 (rows order)
  const long long m = m_base + j0;
  // (m / OPQ) * K * OPQ + m % OPQ + (n0 + column) * OPQ, the column that of the rows order
  const long long at0 = m + (m / opq) * (long long)(K - 1) * opq + (long long)(n0 + 2 * (lane & 3) + (b & 1)) * opq;
  const bool rows_ok = j0 < limit;
  const int cols_store = K - n0 - 2 * (lane & 3) - (b & 1);  // a block at offset o is stored when o < cols_store
  const int cols_acc = K - n0 - 2 * (lane & 3);              // ... its accumulator-layout pair exists when o < cols_acc
  const T* const bias_at = bias + n0 + 2 * (lane & 3);
  // Groups of four blocks: the group's bias words and residual vectors are loaded first. ptxas keeps
  // a load after every store before it (it cannot tell that they do not overlap), so a load in each
  // block would leave one block's chain (load, math, two shuffles, store) waiting on the one before.
  static_assert(BN % 32 == 0, "whole groups of four 8-column blocks");
#pragma unroll
  for (int g0 = 0; g0 < BN / 8; g0 += 4) {
    bool ok[4];
    long long at[4];
    uint32_t bp[4];
    uint2 cv[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int blk = g0 + q;
      ok[q] = rows_ok && 8 * blk < cols_store;
      at[q] = at0 + (long long)(8 * blk) * opq;
      bp[q] = ld_global_b32_if(ep.has_bias && 8 * blk < cols_acc, bias_at + 8 * blk);
      if constexpr (RES) cv[q] = ld_global_v2_if(ok[q], residual + at[q]);
    }
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int blk = g0 + q;
      const float b0 = lo_to_float<T>(bp[q]), b1 = hi_to_float<T>(bp[q]);
      uint32_t c[2] = {0u, 0u};
      if constexpr (RES) {
        c[0] = cv[q].x;
        c[1] = cv[q].y;
        rows_transpose16(c, lane);  // back to the accumulator layout: c[i] = (row r + 8 i, columns 2 t, 2 t + 1)
      }
      uint32_t w[2];
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        float v0 = ep.alpha * acc[4 * blk + 2 * i] + b0;
        float v1 = ep.alpha * acc[4 * blk + 2 * i + 1] + b1;
        if constexpr (RES) {
          v0 += ep.beta * lo_to_float<T>(c[i]);
          v1 += ep.beta * hi_to_float<T>(c[i]);
        }
        w[i] = pack2<T>(activate(v0, ACT), activate(v1, ACT));
      }
      rows_transpose16(w, lane);
      st_global_v2_if(ok[q], out + at[q], w[0], w[1]);
    }
  }
}

// The pairs pattern: each thread stores its accumulator values where they are, two 16-bit accesses
// per register pair (rows past row_limit are not stored).
template <typename T, int BN, int ACT>
__device__ __forceinline__ void consumer_epilogue_nchw_pairs(const float (&acc)[BN / 2], long long m_row, int row_limit,
                                                             int n0, int K, long long opq, T* out, const T* bias,
                                                             const T* residual, const EpilogueParams& ep, int col_lane) {
  long long base[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const long long m = m_row + 8 * i;
    base[i] = m + (m / opq) * (long long)(K - 1) * opq;  // (m / OPQ) * K * OPQ + m % OPQ
  }
  const bool has_res = ep.has_residual != 0;
#pragma unroll
  for (int chunk = 0; chunk < (BN + 63) / 64; ++chunk) {
    const int blocks = (BN - 64 * chunk) >= 64 ? 8 : 4;
#pragma unroll
    for (int jj = 0; jj < blocks; ++jj) {
      const int col = n0 + chunk * 64 + jj * 8 + col_lane;  // K is a multiple of 8: col + 1 < K with col
      const bool col_ok = col < K;
      float b0 = 0.f, b1 = 0.f;
      if (ep.has_bias && col_ok) {
        const uint32_t bp = *reinterpret_cast<const uint32_t*>(bias + col);
        b0 = lo_to_float<T>(bp);
        b1 = hi_to_float<T>(bp);
      }
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const bool ok = col_ok && 8 * i < row_limit;
        const long long at = base[i] + (long long)col * opq;
        const int a = (chunk * 8 + jj) * 4 + 2 * i;
        float v0 = ep.alpha * acc[a] + b0;
        float v1 = ep.alpha * acc[a + 1] + b1;
        if (has_res) {
          T c0, c1;
          c0.bits = ld_global_b16_if(ok, residual + at);
          c1.bits = ld_global_b16_if(ok, residual + at + opq);
          v0 += ep.beta * to_float(c0);
          v1 += ep.beta * to_float(c1);
        }
        st_global_b16_if(ok, out + at, from_float<T>(activate(v0, ACT)).bits);
        st_global_b16_if(ok, out + at + opq, from_float<T>(activate(v1, ACT)).bits);
      }
    }
  }
}

// m_row / row_limit: this thread's first row and how many of its rows (0, 8 further) are stored, as
// in consumer_epilogue; the warp's first row is m_row - lane / 4 and its row limit lane 0's.
template <typename T, int BN, int ACT>
__device__ __forceinline__ void consumer_epilogue_nchw(const float (&acc)[BN / 2], long long m_row, int row_limit,
                                                       int n0, int K, long long opq, T* out, const T* bias,
                                                       const T* residual, const EpilogueParams& ep, int col_lane) {
  const int lane = threadIdx.x % 32;
  const long long m_base = m_row - (lane >> 2);
  const int limit = __shfl_sync(0xffffffffu, row_limit, 0);
  const unsigned long long ptrs = reinterpret_cast<unsigned long long>(out) |
                                  (ep.has_residual ? reinterpret_cast<unsigned long long>(residual) : 0ull);
  const bool rows = ((m_base | opq) & 3) == 0 && (limit >= 16 || (limit & 3) == 0) && (ptrs & 7) == 0;
  if (rows && ep.has_residual) {
    consumer_epilogue_nchw_rows<T, BN, ACT, true>(acc, m_base, limit, n0, K, opq, out, bias, residual, ep);
  } else if (rows) {
    consumer_epilogue_nchw_rows<T, BN, ACT, false>(acc, m_base, limit, n0, K, opq, out, bias, residual, ep);
  } else {
    consumer_epilogue_nchw_pairs<T, BN, ACT>(acc, m_row, row_limit, n0, K, opq, out, bias, residual, ep, col_lane);
  }
}

// The float32-output epilogue (SM90_OUT_F32: the kernel multiplies 16-bit operands, the split parts of
// float32 data, see cuconv/backends/sm90/split_precision.py, and keeps the fp32 sums). out, bias and the
// residual are float32, channels-last (M, K), any K. With K even, each thread's pair of adjacent
// columns is one 8-byte vector: for one accumulator register pair a warp covers 8 rows x 32 contiguous
// bytes (whole sectors). With K odd the rows start at odd words, so each value is a 4-byte access (the
// narrow last convolutions of decoders, K = 3). The residual is read at the same addresses by the
// thread that then writes them (so `out` may be the residual), not through the epilogue-load warp,
// whose C ring holds 16-bit chunks.
__device__ __forceinline__ void st_global_f32x2_if(bool pred, void* ptr, float a, float b) {
  asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %3, 0;\n\t@p st.global.v2.f32 [%0], {%1, %2};\n\t}" ::"l"(ptr),
               "f"(a), "f"(b), "r"((int)pred)
               : "memory");
}

__device__ __forceinline__ void st_global_f32_if(bool pred, void* ptr, float a) {
  asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %2, 0;\n\t@p st.global.f32 [%0], %1;\n\t}" ::"l"(ptr), "f"(a),
               "r"((int)pred)
               : "memory");
}

__device__ __forceinline__ float ld_global_f32_if(bool pred, const void* ptr) {
  float a;
  asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %2, 0;\n\tmov.f32 %0, 0f00000000;\n\t@p ld.global.f32 %0, [%1];\n\t}"
               : "=f"(a)
               : "l"(ptr), "r"((int)pred)
               : "memory");
  return a;
}

__device__ __forceinline__ float2 ld_global_f32x2_if(bool pred, const void* ptr) {
  float a, b;
  asm volatile(
      "{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %3, 0;\n\tmov.f32 %0, 0f00000000;\n\tmov.f32 %1, 0f00000000;\n\t"
      "@p ld.global.v2.f32 {%0, %1}, [%2];\n\t}"
      : "=f"(a), "=f"(b)
      : "l"(ptr), "r"((int)pred)
      : "memory");
  return make_float2(a, b);
}

template <int BN, int ACT>
__device__ __forceinline__ void consumer_epilogue_f32(const float (&acc)[BN / 2], long long m_row, int row_limit,
                                                      int n0, int K, float* out, const float* bias,
                                                      const float* residual, const EpilogueParams& ep, int col_lane) {
  const bool has_res = ep.has_residual != 0;
  const bool pairs = (K & 1) == 0;  // 8-byte accesses (K even: col even, so col + 1 < K with col < K)
  static_assert(BN % 16 == 0, "8-column blocks in pairs");
#pragma unroll
  for (int chunk = 0; chunk < (BN + 63) / 64; ++chunk) {
    const int blocks = (BN - 64 * chunk) >= 64 ? 8 : (BN - 64 * chunk) / 8;
#pragma unroll
    for (int jj = 0; jj < blocks; ++jj) {
      const int col = n0 + chunk * 64 + jj * 8 + col_lane;
      const bool ok0 = col < K, ok1 = col + 1 < K;
      float2 b = make_float2(0.f, 0.f);
      if (ep.has_bias) {
        b.x = ok0 ? bias[col] : 0.f;
        b.y = ok1 ? bias[col + 1] : 0.f;
      }
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const bool row_ok = 8 * i < row_limit;
        const long long at = (m_row + 8 * i) * K + col;
        const int a = (chunk * 8 + jj) * 4 + 2 * i;
        float v0 = ep.alpha * acc[a] + b.x;
        float v1 = ep.alpha * acc[a + 1] + b.y;
        if (has_res) {
          if (pairs) {
            const float2 c = ld_global_f32x2_if(row_ok && ok0, residual + at);
            v0 += ep.beta * c.x;
            v1 += ep.beta * c.y;
          } else {
            v0 += ep.beta * ld_global_f32_if(row_ok && ok0, residual + at);
            v1 += ep.beta * ld_global_f32_if(row_ok && ok1, residual + at + 1);
          }
        }
        v0 = activate(v0, ACT);
        v1 = activate(v1, ACT);
        if (pairs) {
          st_global_f32x2_if(row_ok && ok0, out + at, v0, v1);
        } else {
          st_global_f32_if(row_ok && ok0, out + at, v0);
          st_global_f32_if(row_ok && ok1, out + at + 1, v1);
        }
      }
    }
  }
}

// The narrow epilogue (SM90_NARROW_OUT: 16-column tiles of 16-bit output, the last convolutions of
// decoders with K = 1-16). Channels-last (m, k) is at m * K + k, channels-first (NCHW) at
// (m / OPQ) * K * OPQ + k * OPQ + m % OPQ. Where K is even, channels-last, and `out` (and the residual)
// 4-byte aligned, a thread's two adjacent columns are one 32-bit access; otherwise each value is one
// 16-bit access at its own address, so any K and any output address serve. The output is small next to
// the input on these layers (K values per pixel against R * S * C read), so the accesses' width does not
// bound them. Bias values are read one by one, the residual at the addresses the thread then writes (so
// `out` may be the residual).
__device__ __forceinline__ void st_global_b32_if(bool pred, void* ptr, uint32_t v) {
  asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %2, 0;\n\t@p st.global.b32 [%0], %1;\n\t}" ::"l"(ptr), "r"(v),
               "r"((int)pred)
               : "memory");
}

template <typename T, int BN, int ACT, bool NCHW>
__device__ __forceinline__ void consumer_epilogue_narrow(const float (&acc)[BN / 2], long long m_row, int row_limit,
                                                         int n0, int K, long long opq, T* out, const T* bias,
                                                         const T* residual, const EpilogueParams& ep, int col_lane) {
  const bool has_res = ep.has_residual != 0;
  const unsigned long long ptrs = reinterpret_cast<unsigned long long>(out) |
                                  (has_res ? reinterpret_cast<unsigned long long>(residual) : 0ull);
  const bool pairs = !NCHW && (K & 1) == 0 && (ptrs & 3) == 0;  // col even: col + 1 < K with col < K
  long long base[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const long long m = m_row + 8 * i;
    base[i] = NCHW ? m + (m / opq) * (long long)(K - 1) * opq : m * K;
  }
  const long long col_stride = NCHW ? opq : 1;
  static_assert(BN % 16 == 0, "8-column blocks in pairs");
#pragma unroll
  for (int chunk = 0; chunk < (BN + 63) / 64; ++chunk) {
    const int blocks = (BN - 64 * chunk) >= 64 ? 8 : (BN - 64 * chunk) / 8;
#pragma unroll
    for (int jj = 0; jj < blocks; ++jj) {
      const int col = n0 + chunk * 64 + jj * 8 + col_lane;
      const bool ok0 = col < K, ok1 = col + 1 < K;
      const float b0 = (ep.has_bias && ok0) ? to_float(bias[col]) : 0.f;
      const float b1 = (ep.has_bias && ok1) ? to_float(bias[col + 1]) : 0.f;
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const bool row_ok = 8 * i < row_limit;
        const long long at = base[i] + (long long)col * col_stride;
        const int a = (chunk * 8 + jj) * 4 + 2 * i;
        float v0 = ep.alpha * acc[a] + b0;
        float v1 = ep.alpha * acc[a + 1] + b1;
        if (pairs) {
          if (has_res) {
            const uint32_t c = ld_global_b32_if(row_ok && ok0, residual + at);
            v0 += ep.beta * lo_to_float<T>(c);
            v1 += ep.beta * hi_to_float<T>(c);
          }
          const uint32_t packed = (uint32_t)from_float<T>(activate(v0, ACT)).bits |
                                  ((uint32_t)from_float<T>(activate(v1, ACT)).bits << 16);
          st_global_b32_if(row_ok && ok0, out + at, packed);
        } else {
          if (has_res) {
            T c0, c1;
            c0.bits = ld_global_b16_if(row_ok && ok0, residual + at);
            c1.bits = ld_global_b16_if(row_ok && ok1, residual + at + col_stride);
            v0 += ep.beta * to_float(c0);
            v1 += ep.beta * to_float(c1);
          }
          st_global_b16_if(row_ok && ok0, out + at, from_float<T>(activate(v0, ACT)).bits);
          st_global_b16_if(row_ok && ok1, out + at + col_stride, from_float<T>(activate(v1, ACT)).bits);
        }
      }
    }
  }
}

template <typename A, typename B> struct same_type { static constexpr bool value = false; };
template <typename A> struct same_type<A, A> { static constexpr bool value = true; };

// The epilogue for the runtime activation code ep.activation (one switch per tile). OutT is the
// output (and bias and residual) type: T, or float for the float32-output epilogue
// (consumer_epilogue_f32, residual read from `residual` when ep.has_residual). NCHW selects the
// channels-first epilogue (consumer_epilogue_nchw: opq = O * P * Q, residual its channels-first
// residual, read when ep.has_residual); otherwise opq is unused. PHASES selects the phase-scattering
// epilogue (consumer_epilogue_phases, its table in the parameter struct g). NARROW selects the narrow
// epilogue (consumer_epilogue_narrow, channels-first where NCHW, its residual read when ep.has_residual).
template <typename T, typename OutT, int BN, int C_STAGES, bool HAS_RESIDUAL, int C_CHUNK_BYTES, bool NCHW, bool PHASES,
          bool NARROW, typename G>
__device__ __forceinline__ void consumer_epilogue_any(const float (&acc)[BN / 2], long long m_row, int row_limit,
                                                      int n0, int K, OutT* out, const OutT* bias, const EpilogueParams& ep,
                                                      RingState<C_STAGES>& cring, uint32_t c_base,
                                                      uint32_t c_full_bar, uint32_t c_empty_bar, int row_base,
                                                      int col_lane, bool lane_leader, long long opq,
                                                      const OutT* residual, const G& g) {
#define CUCONV_SM90_EPILOGUE_CASE(code)                                                                      \
  case code:                                                                                                 \
    if constexpr (same_type<OutT, float>::value) {                                                           \
      consumer_epilogue_f32<BN, code>(acc, m_row, row_limit, n0, K, out, bias, residual, ep, col_lane);       \
    } else if constexpr (NARROW) {                                                                           \
      consumer_epilogue_narrow<T, BN, code, NCHW>(acc, m_row, row_limit, n0, K, opq, out, bias, residual, ep, col_lane); \
    } else if constexpr (NCHW) {                                                                             \
      consumer_epilogue_nchw<T, BN, code>(acc, m_row, row_limit, n0, K, opq, out, bias, residual, ep, col_lane); \
    } else if constexpr (PHASES) {                                                                           \
      consumer_epilogue_phases<T, BN, code>(acc, m_row, row_limit, n0, K, out, bias, ep, col_lane, g);        \
    } else {                                                                                                 \
      consumer_epilogue<T, BN, C_STAGES, HAS_RESIDUAL, C_CHUNK_BYTES, code>(                                 \
          acc, m_row, row_limit, n0, K, out, bias, ep, cring, c_base, c_full_bar, c_empty_bar, row_base, col_lane, lane_leader); \
    }                                                                                                        \
    break;
  switch (ep.activation) {
    CUCONV_SM90_EPILOGUE_CASE(ACT_RELU)
    CUCONV_SM90_EPILOGUE_CASE(ACT_SILU)
    CUCONV_SM90_EPILOGUE_CASE(ACT_GELU)
    default:
      CUCONV_SM90_EPILOGUE_CASE(ACT_NONE)
  }
#undef CUCONV_SM90_EPILOGUE_CASE
}

}  // namespace sm90
}  // namespace cuconv
