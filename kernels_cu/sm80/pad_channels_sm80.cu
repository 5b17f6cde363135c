// cuconv: the channel-pad pre-pass of the sm80 "pad_channels" path (stems: C = 1, 3, 5, 7).
//
// src[rows][C] -> dst[rows][CP] with channels C .. CP-1 set to zero, CP = 4 or 8 (CUCONV_PAD_CP).
// The conv then runs the per-lane im2col loader on dst with CP-element (8 / 16-byte) cp.async copies
// instead of synchronous 2-byte ones. One thread per row: C 2-byte loads (a warp reads 32*C
// contiguous elements), one CP*2-byte store (a warp writes 32*CP*2 contiguous bytes).
// Two tensors per launch (x and the weights, both [rows][C] in NHWC / KRSC), no barriers. The
// weights' rows come in groups of R*S (one filter); each group starts dst1_group_rows * CP elements
// after the previous one, so the host can give the padded filters a row pitch that is a multiple
// of 8 elements (the gap is zeroed by the host).
#include "common/types.cuh"

#ifndef CUCONV_PAD_CP
#define CUCONV_PAD_CP 4
#endif
#ifndef CUCONV_KERNEL_NAME
#define CUCONV_KERNEL_NAME pad_channels_sm80
#endif
static_assert(CUCONV_PAD_CP == 4 || CUCONV_PAD_CP == 8, "pad to 4 or 8 channels (one 8- or 16-byte store)");

__device__ __forceinline__ void pad_row(const uint16_t* __restrict__ src, uint16_t* __restrict__ dst, long long row,
                                        long long dst_row, int C) {
  uint32_t words[CUCONV_PAD_CP / 2];
#pragma unroll
  for (int i = 0; i < CUCONV_PAD_CP / 2; ++i) {
    const uint32_t lo = 2 * i < C ? (uint32_t)src[row * C + 2 * i] : 0u;
    const uint32_t hi = 2 * i + 1 < C ? (uint32_t)src[row * C + 2 * i + 1] : 0u;
    words[i] = lo | (hi << 16);
  }
  uint16_t* d = dst + dst_row * CUCONV_PAD_CP;
  if constexpr (CUCONV_PAD_CP == 4) {
    asm volatile("st.global.v2.u32 [%0], {%1, %2};\n" ::"l"(d), "r"(words[0]), "r"(words[1]) : "memory");
  } else {
    asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"l"(d), "r"(words[0]), "r"(words[1]), "r"(words[2]),
                 "r"(words[3]) : "memory");
  }
}

extern "C" __global__ void __launch_bounds__(256)
CUCONV_KERNEL_NAME(const uint16_t* __restrict__ src0, uint16_t* __restrict__ dst0, long long rows0,
                   const uint16_t* __restrict__ src1, uint16_t* __restrict__ dst1, long long rows1, int C,
                   int rows1_per_group, int dst1_group_rows) {
  const long long stride = (long long)gridDim.x * blockDim.x;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < rows0 + rows1; i += stride) {
    if (i < rows0) {
      pad_row(src0, dst0, i, i, C);
    } else {  // the second tensor's groups of rows (a filter's taps) start dst1_group_rows rows apart
      const long long j = i - rows0, grp = j / rows1_per_group;
      pad_row(src1, dst1, j, grp * dst1_group_rows + (j - grp * rows1_per_group), C);
    }
  }
}
