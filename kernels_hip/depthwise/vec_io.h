// cuconv (HIP) depthwise: VEC consecutive elements <-> VEC floats, with the widest access VEC allows.
//
// The kernel works on channel vectors: VEC channels of one pixel, contiguous in NHWC, so one vector is
// one 16-, 8-, 4- or 2-byte access of LDS (ds_read_b128 / b64 / b32 / u16) or of global memory
// (global_load / global_store_dwordx4 ...). `load_vec` widens to fp32, the arithmetic type for every
// dtype; `store_vec` narrows with round-to-nearest-even. Pointers must be aligned to the vector's size:
// the host's VEC divides the channel counts and the host copies a misaligned operand.
// A port of kernels_cu/depthwise/vec_io.cuh; the element types are common/types.h's (plus float).
#pragma once

#include "common/hip_min.h"
#include "common/types.h"

#if CUCONV_HIP_DEVICE_COMPILE

namespace cuconv {

// float32 is the third element type of this kernel (types.h has the 16-bit ones).
CUCONV_DEV float to_float(float v) { return v; }

namespace dw {

typedef u32 u32x2 __attribute__((ext_vector_type(2)));
typedef u32 u32x4 __attribute__((ext_vector_type(4)));

// A vector of BYTES bytes as one machine word of that size.
template <int BYTES> struct Word;
template <> struct Word<16> { typedef u32x4 type; };
template <> struct Word<8> { typedef u32x2 type; };
template <> struct Word<4> { typedef u32 type; };
template <> struct Word<2> { typedef u16 type; };

// Two 16-bit values packed in one dword -> two floats (low half first), and back.
CUCONV_DEV void unpack2(u32 u, float& a, float& b, bf16_t) {
  a = __builtin_bit_cast(float, u << 16);
  b = __builtin_bit_cast(float, u & 0xFFFF0000u);
}
CUCONV_DEV void unpack2(u32 u, float& a, float& b, half_t) {
  a = (float)__builtin_bit_cast(_Float16, (u16)(u & 0xFFFFu));
  b = (float)__builtin_bit_cast(_Float16, (u16)(u >> 16));
}

template <typename T> CUCONV_DEV u32 pack2(float a, float b) {
  return (u32)from_float<T>(a).bits | ((u32)from_float<T>(b).bits << 16);
}

// The VEC elements at p -> f (fp32). T: half_t, bf16_t (VEC in {1, 2, 4, 8}) or float (VEC in {1, 2, 4}).
template <typename T, int VEC>
CUCONV_DEV void load_vec(const T* p, float (&f)[VEC]) {
  if constexpr (VEC == 1) {
    f[0] = to_float(*p);
  } else {
    typedef typename Word<VEC * (int)sizeof(T)>::type W;
    const W w = *reinterpret_cast<const W*>(p);
    const u32* u = reinterpret_cast<const u32*>(&w);
    if constexpr (sizeof(T) == 4) {
#pragma unroll
      for (int i = 0; i < VEC; ++i) f[i] = __builtin_bit_cast(float, u[i]);
    } else {
#pragma unroll
      for (int i = 0; i < VEC / 2; ++i) unpack2(u[i], f[2 * i], f[2 * i + 1], T());
    }
  }
}

template <typename T, int VEC>
CUCONV_DEV void store_vec(T* p, const float (&f)[VEC]) {
  if constexpr (VEC == 1) {
    if constexpr (sizeof(T) == 4) *p = f[0];
    else *p = from_float<T>(f[0]);
  } else {
    typedef typename Word<VEC * (int)sizeof(T)>::type W;
    W w;
    u32* u = reinterpret_cast<u32*>(&w);
    if constexpr (sizeof(T) == 4) {
#pragma unroll
      for (int i = 0; i < VEC; ++i) u[i] = __builtin_bit_cast(u32, f[i]);
    } else {
#pragma unroll
      for (int i = 0; i < VEC / 2; ++i) u[i] = pack2<T>(f[2 * i], f[2 * i + 1]);
    }
    *reinterpret_cast<W*>(p) = w;
  }
}

}  // namespace dw
}  // namespace cuconv

#endif  // CUCONV_HIP_DEVICE_COMPILE
