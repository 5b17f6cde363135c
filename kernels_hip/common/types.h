// cuconv (HIP): element types and their conversions, selected by -DCUCONV_DTYPE.
//
// CUCONV_DTYPE = 0 (float16), 1 (bfloat16) or 2 (float32), the codes of cuconv.launch.DTYPE_CODES;
// a kernel without a float32 path (the MFMA kernel) refuses code 2 itself; code 3 (float64) has no
// HIP kernel and is refused here. 16-bit storage is a plain 16-bit integer, so the same source builds
// without hip_fp16.h / hip_bf16.h.
#pragma once

#include "common/hip_min.h"

namespace cuconv {

typedef unsigned short u16;
typedef short i16x4 __attribute__((ext_vector_type(4)));      // MFMA bf16 operand (4 x bf16)
typedef _Float16 f16x4 __attribute__((ext_vector_type(4)));   // MFMA fp16 operand (4 x fp16)
typedef float f32x16 __attribute__((ext_vector_type(16)));    // 32x32 MFMA accumulator, per lane

struct half_t { u16 bits; };
struct bf16_t { u16 bits; };

#if CUCONV_HIP_DEVICE_COMPILE
CUCONV_DEV float to_float(half_t v) { return (float)__builtin_bit_cast(_Float16, v.bits); }
CUCONV_DEV float to_float(bf16_t v) { return __builtin_bit_cast(float, ((u32)v.bits) << 16); }

template <typename T> CUCONV_DEV T from_float(float f);
template <> CUCONV_DEV half_t from_float<half_t>(float f) {
  return half_t{__builtin_bit_cast(u16, (_Float16)f)};  // v_cvt_f16_f32, round to nearest even
}
template <> CUCONV_DEV bf16_t from_float<bf16_t>(float f) {
  // Round to nearest even; NaN stays a (quiet) NaN instead of rounding into infinity.
  const u32 u = __builtin_bit_cast(u32, f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return bf16_t{(u16)((u >> 16) | 0x40u)};
  return bf16_t{(u16)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16)};
}
#endif

}  // namespace cuconv

#if defined(CUCONV_DTYPE)
#if CUCONV_DTYPE == 0
typedef cuconv::half_t elem_t;
#elif CUCONV_DTYPE == 1
typedef cuconv::bf16_t elem_t;
#elif CUCONV_DTYPE == 2
typedef float elem_t;
#else
#error "kernels_hip: CUCONV_DTYPE must be 0 (float16), 1 (bfloat16) or 2 (float32); 3 (float64) has no HIP kernel"
#endif
#endif
