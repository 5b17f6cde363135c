// cuconv sm80: accumulator -> out, with act(alpha * acc + bias + beta * residual).
//
// mma.sync m16n8k16 accumulator layout, per thread: acc[e] with e = 2 * half + j at
//   row = 16 mi + lane / 4 + 8 half,  col = 8 ni + 2 (lane % 4) + j.
// Each element is read (residual) and written (out) by the same thread, so `residual` may be
// `out` itself. Column pairs are stored as one 32-bit word when `pair_ok` (the host checked that
// ldo, col_base and the pointers are even / 4-byte aligned).
#pragma once
#include "common/epilogue_math.cuh"
#include "common/types.cuh"

namespace cuconv {
namespace sm80 {

struct OutputView {
  elem_t* out;               // out[row * ldo + col_base + col]
  const elem_t* residual;    // same indexing; may alias out
  const elem_t* bias;        // bias[col_base + col]
  long long rows;            // valid rows (M)
  int cols;                  // valid columns of this CTA's group (Kg or N)
  long long ldo;
  int col_base;              // g * Kg for a grouped conv, 0 otherwise
  int pair_ok;
};

template <int MI, int NI, int WARPS_M, int WARP_M, int WARP_N>
__device__ __forceinline__ void store_accumulators(const float (&acc)[MI][NI][4], const OutputView& o,
                                                   const EpilogueParams& ep, long long m_offset, long long n_offset) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const long long row0 = m_offset + (warp % WARPS_M) * WARP_M + (lane >> 2);
  const long long col0 = n_offset + (warp / WARPS_M) * WARP_N + 2 * (lane & 3);
#pragma unroll
  for (int mi = 0; mi < MI; ++mi) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const long long row = row0 + mi * 16 + half * 8;
      if (row >= o.rows) continue;
#pragma unroll
      for (int ni = 0; ni < NI; ++ni) {
        const long long col = col0 + ni * 8;
        if (col >= o.cols) continue;
        const long long idx = row * o.ldo + o.col_base + col;
        const bool two = col + 1 < o.cols;
        float v[2];
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          if (j == 1 && !two) break;
          const float b = ep.has_bias ? to_float(o.bias[o.col_base + col + j]) : 0.f;
          const float r = ep.has_residual ? to_float(o.residual[idx + j]) : 0.f;
          v[j] = apply_epilogue(acc[mi][ni][2 * half + j], b, r, ep);
        }
        if (two && o.pair_ok) {
          *reinterpret_cast<uint32_t*>(o.out + idx) = pack2<elem_t>(v[0], v[1]);
        } else {
          o.out[idx] = from_float<elem_t>(v[0]);
          if (two) o.out[idx + 1] = from_float<elem_t>(v[1]);
        }
      }
    }
  }
}

}  // namespace sm80
}  // namespace cuconv
