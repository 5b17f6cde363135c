// cuconv: the pad pre-pass of the sm80 "pad_channels" path (stems: C = 1, 3, 5, 7).
//
// Copies two tensors of 2-byte rows of C elements (x in NHWC, w in KRSC) into scratch tensors of rows
// of CP = 4 or 8 elements (CUCONV_PAD_CP), channels C .. CP-1 zero. Each tensor is viewed as
// [outer][inner] rows; the copy has [outer][inner_dst] rows and destination row j of a block takes
// source row j - lo when that is in 0 .. inner_src-1, else zeros. That one rule serves:
//   * x with its W axis padded (outer = N*H, inner = W -> Wp, lo = left padding), which lets the host
//     fold u adjacent W pixels into one pixel of u*CP channels for W-stride-u convs (sm80.pad_plan);
//   * w with its filter rows padded (outer = K*R, inner = S -> S', or outer = K, inner = R*S -> a row
//     pitch that is a multiple of 8 elements) so the weights move in 16-byte copies.
// One thread per destination row: up to C 2-byte loads (a warp reads 32*C contiguous elements), one
// CP*2-byte store (a warp writes 32*CP*2 contiguous bytes). No barriers.
#include "common/fast_div.cuh"
#include "common/types.cuh"

#ifndef CUCONV_PAD_CP
#define CUCONV_PAD_CP 4
#endif
#ifndef CUCONV_KERNEL_NAME
#define CUCONV_KERNEL_NAME pad_channels_sm80
#endif
static_assert(CUCONV_PAD_CP == 4 || CUCONV_PAD_CP == 8, "pad to 4 or 8 channels (one 8- or 16-byte store)");

struct PadBlock {             // one tensor of the pre-pass
  const uint16_t* src;
  uint16_t* dst;
  long long outer;            // blocks of rows
  int inner_src, inner_dst;   // rows per block in src / dst
  int lo;                     // dst row j of a block copies src row j - lo
  cuconv::FastDivisor div_inner_dst;
};

__device__ __forceinline__ void pad_row(const PadBlock& t, long long i, int C) {
  // i / inner_dst: multiply-shift below 2^31 rows (a 64-bit division is a ~70-instruction call)
  const long long o = i < 0x7fffffffLL ? (long long)cuconv::fast_div((uint32_t)i, t.div_inner_dst) : i / t.inner_dst;
  const int j = (int)(i - o * t.inner_dst) - t.lo;
  const bool in = (unsigned)j < (unsigned)t.inner_src;
  const uint16_t* src = t.src + (o * t.inner_src + j) * C;
  uint32_t words[CUCONV_PAD_CP / 2];
#pragma unroll
  for (int k = 0; k < CUCONV_PAD_CP / 2; ++k) {
    const uint32_t lo = in && 2 * k < C ? (uint32_t)src[2 * k] : 0u;
    const uint32_t hi = in && 2 * k + 1 < C ? (uint32_t)src[2 * k + 1] : 0u;
    words[k] = lo | (hi << 16);
  }
  uint16_t* d = t.dst + i * CUCONV_PAD_CP;
  if constexpr (CUCONV_PAD_CP == 4) {
    asm volatile("st.global.v2.u32 [%0], {%1, %2};\n" ::"l"(d), "r"(words[0]), "r"(words[1]) : "memory");
  } else {
    asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"l"(d), "r"(words[0]), "r"(words[1]), "r"(words[2]),
                 "r"(words[3]) : "memory");
  }
}

extern "C" __global__ void __launch_bounds__(256)
CUCONV_KERNEL_NAME(PadBlock t0, PadBlock t1, int C) {
  const long long rows0 = t0.outer * t0.inner_dst, rows = rows0 + t1.outer * t1.inner_dst;
  const long long stride = (long long)gridDim.x * blockDim.x;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < rows; i += stride) {
    if (i < rows0)
      pad_row(t0, i, C);
    else
      pad_row(t1, i - rows0, C);
  }
}
