// cuconv: the deterministic end of a split reduction. out[i] = sum over s < splits of ws[s][i],
// added in split order in fp32, then converted to the data's dtype: the same bits on every run
// (each element's sum has one fixed order, whatever the scheduling of the CTAs that wrote ws).
// Grid-stride loop; any grid.
#pragma once
#include "common/types.cuh"

namespace cuconv {

__device__ __forceinline__ void split_sum(const float* __restrict__ ws, elem_t* __restrict__ out, long long count,
                                          int splits) {
  const long long step = (long long)gridDim.x * blockDim.x;
  const long long first = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if ((count & 3) == 0) {  // 16-byte loads of 4 sums (ws comes from the allocator: 256-byte aligned)
    const long long quads = count >> 2;
    for (long long i = first; i < quads; i += step) {
      float4 sum = make_float4(0.f, 0.f, 0.f, 0.f);
      for (int s = 0; s < splits; ++s) {
        const float4 v = reinterpret_cast<const float4*>(ws + s * count)[i];
        sum.x += v.x;
        sum.y += v.y;
        sum.z += v.z;
        sum.w += v.w;
      }
      out[4 * i] = from_float<elem_t>(sum.x);
      out[4 * i + 1] = from_float<elem_t>(sum.y);
      out[4 * i + 2] = from_float<elem_t>(sum.z);
      out[4 * i + 3] = from_float<elem_t>(sum.w);
    }
    return;
  }
  for (long long i = first; i < count; i += step) {
    float sum = 0.f;
    for (int s = 0; s < splits; ++s) sum += ws[s * count + i];
    out[i] = from_float<elem_t>(sum);
  }
}

}  // namespace cuconv
