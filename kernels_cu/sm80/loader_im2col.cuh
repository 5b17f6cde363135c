// cuconv sm80: the software im2col loader (conv activations, NHWC), same contract as LinearLoader.
//
// GEMM view of one group g:  A[m][k],  m = (n, p, q) over N*P*Q output pixels,
//                                       k = (r, s, c) over R*S*Cg, channel fastest.
//   h = p * stride_h + r * dil_h - pad_h,  w = q * stride_w + s * dil_w - pad_w
//   A[m][k] = x[((n * H + h) * W + w) * C + g * Cg + c]   (0 when (h, w) is in the halo)
//
// The rows of a CTA's tile never change along the K loop, so `setup_rows(m_offset)` decomposes
// each tile row m -> (n, p, q) once into a RowInfo {n * H * W * C, p * stride_h - pad_h,
// q * stride_w - pad_w}; rows >= M get h0 = -2^30 (always out of bounds). With copies of 2+
// elements every thread stages the same few rows in every tile and keeps theirs in registers
// (as the element offset of the window origin plus h0 / w0 for the halo test); the 2-byte path
// shares one table of M_TILE rows in shared memory.
// `load_tile` then only adds the filter tap of its column. Compile-time sub-paths:
//
//   SUBPATH_UNIFORM   Cg % K_TILE == 0: a K tile lies inside one filter tap, so (r, s, c_base) is
//                     computed once per tile from k_offset; per lane only the row lookup.
//   SUBPATH_PER_LANE  any Cg (e.g. 3): each lane decomposes its own k = k_offset + col into
//                     (r, s, c) and predicates k < R*S*Cg. With VEC > 1 the host guarantees
//                     Cg % VEC == 0 so a chunk never straddles two taps.
//   (pointwise 1x1 / stride 1 / pad 0 is not here: it is LinearLoader over x viewed as [M][C].)
//
// Lanes whose element is in the halo (or past M / K) issue a zero-filling copy that reads nothing:
// cp.async copies keep their computed address (possibly outside x) with a zero source size, 2-byte
// copies skip the load.
#pragma once
#include "common/fast_div.cuh"
#include "sm80/ptx_sm80.cuh"
#include "sm80/smem_tile.cuh"

namespace cuconv {
namespace sm80 {

enum Subpath : int { SUBPATH_POINTWISE = 0, SUBPATH_UNIFORM = 1, SUBPATH_PER_LANE = 2 };

// Conv geometry the loader needs (the host fills it, see cuconv/backends/sm80.py).
struct Im2colGeometry {
  long long M;          // N * P * Q
  int H, W, C;          // input
  int P, Q;             // output
  int R, S, Cg;         // filter, channels per group
  int k_gemm;           // R * S * Cg
  int stride_h, stride_w, dil_h, dil_w, pad_h, pad_w;
  FastDivisor div_q, div_p, div_cg, div_s;  // / Q, / P, / Cg, / S as multiply-shift (for values < 2^31)
};

struct RowInfo {
  long long pixel_base;  // n * H * W * C
  int h0;                // p * stride_h - pad_h   (-2^30 for rows >= M)
  int w0;                // q * stride_w - pad_w
};

template <int M_TILE, int K_TILE, int VEC, int SUBPATH, int NTHREADS>
struct Im2colLoader {
  using Tile = SwizzledTile<M_TILE, K_TILE>;
  static constexpr int kChunksPerRow = K_TILE / VEC;
  static constexpr int kRowsPerPass = NTHREADS / kChunksPerRow;
  static constexpr int kPasses = M_TILE / kRowsPerPass;
  static constexpr bool kRowsInRegisters = VEC > 1;
  static constexpr int kRowInfoBytes = kRowsInRegisters ? 0 : M_TILE * (int)sizeof(RowInfo);
  static constexpr int kBatch = kPasses % 4 == 0 ? 4 : kPasses;  // 2-byte copies in flight per thread
  static_assert(SUBPATH == SUBPATH_UNIFORM || SUBPATH == SUBPATH_PER_LANE, "pointwise uses LinearLoader");
  static_assert(NTHREADS % kChunksPerRow == 0, "a thread keeps one K column for all of its rows");
  static_assert(M_TILE % kRowsPerPass == 0, "the passes cover the tile rows exactly");

  const elem_t* x;       // the whole NHWC tensor
  Im2colGeometry g;
  int c_group;           // g * Cg: first channel of this CTA's group
  const RowInfo* rows;   // M_TILE entries in shared memory, filled by setup_rows (2-byte copies)
  // This thread's rows (copies of 2+ elements), filled by setup_rows.
  long long reg_origin[kRowsInRegisters ? kPasses : 1];
  int reg_h0[kRowsInRegisters ? kPasses : 1];
  int reg_w0[kRowsInRegisters ? kPasses : 1];

  // Tile row m -> its RowInfo (rows >= M: never in bounds).
  __device__ __forceinline__ RowInfo decompose(long long m) const {
    RowInfo ri;
    if (m < g.M) {
      long long n;
      int p, q;
      if (g.M <= 0x7fffffffLL) {  // multiply-shift divisions; 64-bit ones are a call
        const int nq = (int)fast_div((uint32_t)m, g.div_q);
        q = (int)m - nq * g.Q;
        n = (int)fast_div((uint32_t)nq, g.div_p);
        p = nq - (int)n * g.P;
      } else {
        const long long nq = m / g.Q;
        q = (int)(m - nq * g.Q);
        n = nq / g.P;
        p = (int)(nq - n * g.P);
      }
      ri.pixel_base = n * (long long)g.H * g.W * g.C;
      ri.h0 = p * g.stride_h - g.pad_h;
      ri.w0 = q * g.stride_w - g.pad_w;
    } else {
      ri.pixel_base = 0;
      ri.h0 = -(1 << 30);
      ri.w0 = 0;
    }
    return ri;
  }

  // Once per CTA (all threads; a __syncthreads must follow before load_tile). With copies of 2+
  // elements a thread stages the same kPasses rows in every tile, so it keeps their window origins
  // in registers (origin = element offset of pixel (h0, w0), possibly outside the image); 2-byte
  // copies have too many rows per thread for that and share a table in shared memory.
  __device__ __forceinline__ void setup_rows(RowInfo* rows_smem, long long m_offset) {
    if constexpr (kRowsInRegisters) {
      const int row0 = threadIdx.x / kChunksPerRow;
#pragma unroll
      for (int pass = 0; pass < kPasses; ++pass) {
        const RowInfo ri = decompose(m_offset + row0 + pass * kRowsPerPass);
        reg_h0[pass] = ri.h0;
        reg_w0[pass] = ri.w0;
        reg_origin[pass] = ri.pixel_base + ((long long)ri.h0 * g.W + ri.w0) * g.C;
      }
    } else {
      for (int i = threadIdx.x; i < M_TILE; i += NTHREADS) rows_smem[i] = decompose(m_offset + i);
      rows = rows_smem;
    }
  }

  // m_offset is the one given to setup_rows (the per-row decomposition is cached there).
  __device__ __forceinline__ void load_tile(uint32_t stage, long long /*m_offset*/, long long k_offset) const {
    const int tid = threadIdx.x;
    const int col = (tid % kChunksPerRow) * VEC;  // this thread's K column, the same in every pass
    const int row0 = tid / kChunksPerRow;
    int r, s, c;
    bool k_valid;
    if (SUBPATH == SUBPATH_UNIFORM) {  // k_offset < k_gemm + a few tiles < 2^31: multiply-shift applies
      const int tap = (int)fast_div((uint32_t)k_offset, g.div_cg);  // once per tile
      c = (int)k_offset - tap * g.Cg + col;
      r = (int)fast_div((uint32_t)tap, g.div_s);
      s = tap - r * g.S;
      k_valid = k_offset < g.k_gemm;                    // k_gemm is a multiple of K_TILE here
    } else {
      // per lane (plain divisions: the multiply-shift ones keep 4 more registers live in the loop,
      // which spills the 128x16 variant at 128 registers)
      const int k = (int)k_offset + col;
      const int tap = k / g.Cg;
      c = k - tap * g.Cg;
      r = tap / g.S;
      s = tap - r * g.S;
      k_valid = k < g.k_gemm;
    }
    const int dh = r * g.dil_h, dw = s * g.dil_w;
    const elem_t* xc = x + c_group + c;
    if constexpr (VEC == 1) {
      // synchronous 2-byte copies: loads first, then stores, kBatch at a time (one memory latency
      // per batch instead of per element, without keeping every pass's address live)
#pragma unroll 1
      for (int p0 = 0; p0 < kPasses; p0 += kBatch) {
        uint16_t v[kBatch];
#pragma unroll
        for (int j = 0; j < kBatch; ++j) {
          const RowInfo ri = rows[row0 + (p0 + j) * kRowsPerPass];
          const int h = ri.h0 + dh, w = ri.w0 + dw;
          const bool valid = k_valid && (unsigned)h < (unsigned)g.H && (unsigned)w < (unsigned)g.W;
          v[j] = load_u16_zfill(valid ? xc + ri.pixel_base + ((long long)h * g.W + w) * g.C : x, valid);
        }
#pragma unroll
        for (int j = 0; j < kBatch; ++j)
          store_u16(stage + Tile::elem_offset(row0 + (p0 + j) * kRowsPerPass, col), v[j]);
      }
    } else {
      // Per copy: the row's origin plus this thread's tap offset; halo lanes keep the computed
      // address (a zero-size cp.async reads nothing).
      const long long tap_offset = (long long)(dh * g.W + dw) * g.C;
#pragma unroll
      for (int pass = 0; pass < kPasses; ++pass) {
        const int h = reg_h0[pass] + dh, w = reg_w0[pass] + dw;
        const bool valid = k_valid && (unsigned)h < (unsigned)g.H && (unsigned)w < (unsigned)g.W;
        copy_vec_zfill<VEC>(stage + Tile::elem_offset(row0 + pass * kRowsPerPass, col),
                            xc + reg_origin[pass] + tap_offset, valid);
      }
    }
  }
};

}  // namespace sm80
}  // namespace cuconv
