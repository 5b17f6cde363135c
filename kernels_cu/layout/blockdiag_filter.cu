// cuconv: the block-diagonal filter of a grouped convolution whose groups are narrower than 64
// channels (cuconv/backends/sm90/grouped.py; the NumPy model is cuconv.models.grouped.blockdiag_filter).
//
// With Cg input channels and Cg filters per group (Cg dividing 64), the 64 output channels of block b
// read exactly the 64 input channels of block b, each filter only its own group's Cg of them. Seen as
// a dense convolution over 64 channels per block, filter k's row of tap t is its Cg weights placed at
// the group's offset inside the block, zeros elsewhere:
//
//   dst[k][t][j] = src[k][t][j - off(k)]  for off(k) <= j < off(k) + Cg, else 0,
//   off(k) = (k % 64) - (k % Cg)
//
// One thread writes eight channels of one (k, t) row: one 16-byte store. Where Cg is a multiple of 8,
// those eight lie wholly inside or wholly outside the group's run, and vec_loads says whether the
// source may be read as 16 bytes; otherwise they are read element by element. The values are copied
// as bits (float16 or bfloat16).
#include "common/types.cuh"

struct BlockDiagArgs {
  long long rows;  // K * taps: destination rows of 64 channels
  int taps;        // filter taps (T * R * S)
  int Cg;          // channels (and filters) per group, dividing 64
  int vec_loads;   // 1: 16-byte loads (Cg a multiple of 8, the source 16-byte aligned)
};

extern "C" __global__ void __launch_bounds__(256) blockdiag_filter(const uint16_t* __restrict__ src,
                                                                   uint16_t* __restrict__ dst,
                                                                   const BlockDiagArgs a) {
  const long long total = a.rows * 8;  // eight 8-channel groups per 64-channel row
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
       i += (long long)gridDim.x * blockDim.x) {
    const long long row = i >> 3;
    const int j0 = (int)(i & 7) * 8;
    const int k = (int)(row / a.taps);
    const int off = (k & 63) - k % a.Cg;
    const uint16_t* s = src + row * a.Cg;  // this (k, t) row's Cg weights
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    if (a.vec_loads) {
      if (j0 >= off && j0 < off + a.Cg) v = __ldg(reinterpret_cast<const uint4*>(s + (j0 - off)));
    } else {
      uint16_t e[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int c = j0 + j - off;
        e[j] = (c >= 0 && c < a.Cg) ? __ldg(s + c) : (uint16_t)0;
      }
      v.x = e[0] | ((uint32_t)e[1] << 16);
      v.y = e[2] | ((uint32_t)e[3] << 16);
      v.z = e[4] | ((uint32_t)e[5] << 16);
      v.w = e[6] | ((uint32_t)e[7] << 16);
    }
    *reinterpret_cast<uint4*>(dst + row * 64 + j0) = v;
  }
}
