// cuconv sm80: compile-time configuration shared by the entry files, from -D defines.
//
//   CUCONV_DTYPE          0 float16, 1 bfloat16 (float32 is not served: mma.sync here is 16-bit)
//   CUCONV_BM/BN/BK       CTA tile (GEMM M x N x K)
//   CUCONV_STAGES         cp.async ring depth (>= 3)
//   CUCONV_WARPS_M/N      warp grid; the warp tile is (BM / WARPS_M) x (BN / WARPS_N)
//   CUCONV_MIN_BLOCKS     __launch_bounds__ occupancy hint (CTAs per SM)
//   CUCONV_VEC_A/B        elements per copy of the A / B loader (8, 4, 2: cp.async 16/8/4 B; 1: u16)
//   CUCONV_KERNEL_NAME    the extern "C" name, chosen by the host so that it encodes the variant
//   CUCONV_TF32           1 (conv2d_fprop_sm80.cu, with CUCONV_DTYPE 1): float32 data moved as pairs of
//                         16-bit elements, multiplied as tf32 (ptx_sm80.cuh), float32 bias, residual and
//                         output (epilogue.cuh: out_t)
#pragma once

// Budget: the dynamic shared memory of one CTA on the smallest sm_80+ part served (sm_86/89: 99 KiB
// opt-in per block). The host reads this line (cuconv/launch.py header_constants).
#define SM80_SMEM_BUDGET (99 * 1024)

#ifndef CUCONV_DTYPE
#define CUCONV_DTYPE 1
#endif
#if CUCONV_DTYPE == 2
#error "the sm80 kernels are fp16/bf16 only; float32 problems go to the generic path"
#endif
#include "common/types.cuh"  // after CUCONV_DTYPE: it defines elem_t
#ifndef CUCONV_TF32
#define CUCONV_TF32 0
#endif
#if CUCONV_TF32 && CUCONV_DTYPE != 1
#error "CUCONV_TF32 moves float32 operands as 16-bit pairs: CUCONV_DTYPE must be 1"
#endif

#ifndef CUCONV_BM
#define CUCONV_BM 128
#endif
#ifndef CUCONV_BN
#define CUCONV_BN 128
#endif
#ifndef CUCONV_BK
#define CUCONV_BK 32
#endif
#ifndef CUCONV_STAGES
#define CUCONV_STAGES 4
#endif
#ifndef CUCONV_WARPS_M
#define CUCONV_WARPS_M 2
#endif
#ifndef CUCONV_WARPS_N
#define CUCONV_WARPS_N 4
#endif
#ifndef CUCONV_MIN_BLOCKS
#define CUCONV_MIN_BLOCKS 1
#endif
#ifndef CUCONV_VEC_A
#define CUCONV_VEC_A 8
#endif
#ifndef CUCONV_VEC_B
#define CUCONV_VEC_B 8
#endif

namespace cuconv {
namespace sm80 {
constexpr int kBM = CUCONV_BM, kBN = CUCONV_BN, kBK = CUCONV_BK, kStages = CUCONV_STAGES;
constexpr int kWarpsM = CUCONV_WARPS_M, kWarpsN = CUCONV_WARPS_N;
constexpr int kThreads = 32 * kWarpsM * kWarpsN;
constexpr int kVecA = CUCONV_VEC_A, kVecB = CUCONV_VEC_B;
constexpr int kSmemBudgetBytes = SM80_SMEM_BUDGET;
static_assert(kBK == 32, "the 64-byte row swizzle and loaders are tuned for BK = 32");
static_assert(kThreads == 128 || kThreads == 256, "4 or 8 warps");
}  // namespace sm80
}  // namespace cuconv
