// cuconv hopper: the weight gradient's epilogue - a warpgroup's fp32 partial sums of its 64 filter
// rows x BN columns into the split's workspace slice, ws[split][g Kg + k][j] (element layout; the
// reduce entry adds the splits in split order, common/split_sum.cuh).
//
// Accumulator layout (wgmma_mainloop.cuh): acc[j*4 + 2*i + e] <-> row 16*warp + lane/4 + 8*i, column
// 8*j + 2*(lane%4) + e of the warpgroup's 64 rows. Rows past the group's filters and columns past
// the group's R*S*Cg columns are not stored.
#pragma once

#include "common/types.cuh"
#include "sm80/loader_im2col_t.cuh"

namespace cuconv {
namespace sm90 {

template <int BN>
__device__ __forceinline__ void store_wgrad_partials(const float (&acc)[BN / 2], float* ws,
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
    for (int j = 0; j < BN / 8; ++j) {
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

}  // namespace sm90
}  // namespace cuconv
