// cuconv: element types shared by every CUDA kernel.
//
// Kernels are compiled by NVRTC with no CUDA headers on the include path, so the 16-bit types are
// plain 16-bit storage with PTX conversions (sm_80+). fp32 is the accumulation type of every kernel
// but the generic path, which also accumulates in fp64 (kernels_cu/generic/im2col_gemm.cu).
//
// A kernel selects its element type with -DCUCONV_DTYPE=0/1/2/3 (float16 / bfloat16 / float32 /
// float64, the codes of cuconv.launch.DTYPE_CODES), which makes `elem_t` the storage type and
// `to_float` / `from_float` its conversions (float64 has none: a kernel that takes it converts itself).
#pragma once

typedef unsigned char uint8_t;
typedef unsigned short uint16_t;
typedef unsigned int uint32_t;
typedef unsigned long long uint64_t;
typedef int int32_t;
typedef long long int64_t;

// CUCONV_CAT(a, b): a and b pasted after expansion (entry names built from CUCONV_KERNEL_NAME).
#define CUCONV_CAT_(a, b) a##b
#define CUCONV_CAT(a, b) CUCONV_CAT_(a, b)

namespace cuconv {

struct half_t { uint16_t bits; };
struct bf16_t { uint16_t bits; };

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(half_t v) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v.bits));
  return f;
}
__device__ __forceinline__ float to_float(bf16_t v) { return __uint_as_float(((uint32_t)v.bits) << 16); }

template <typename T> __device__ __forceinline__ T from_float(float f);
template <> __device__ __forceinline__ float from_float<float>(float f) { return f; }
template <> __device__ __forceinline__ half_t from_float<half_t>(float f) {
  half_t h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h.bits) : "f"(f));
  return h;
}
template <> __device__ __forceinline__ bf16_t from_float<bf16_t>(float f) {
  bf16_t h;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h.bits) : "f"(f));
  return h;
}

// Two floats -> one 32-bit register holding two 16-bit values (low = a), the operand form of
// mma/wgmma and of 4-byte stores.
template <typename T> __device__ __forceinline__ uint32_t pack2(float a, float b);
template <> __device__ __forceinline__ uint32_t pack2<half_t>(float a, float b) {
  uint32_t r;
  asm("cvt.rn.f16x2.f32 %0, %2, %1;" : "=r"(r) : "f"(a), "f"(b));
  return r;
}
template <> __device__ __forceinline__ uint32_t pack2<bf16_t>(float a, float b) {
  uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %2, %1;" : "=r"(r) : "f"(a), "f"(b));
  return r;
}

}  // namespace cuconv

#ifdef CUCONV_DTYPE
#if CUCONV_DTYPE == 0
typedef cuconv::half_t elem_t;
#elif CUCONV_DTYPE == 1
typedef cuconv::bf16_t elem_t;
#elif CUCONV_DTYPE == 2
typedef float elem_t;
#elif CUCONV_DTYPE == 3
typedef double elem_t;
#else
#error "CUCONV_DTYPE must be 0 (float16), 1 (bfloat16), 2 (float32) or 3 (float64)"
#endif
#endif
