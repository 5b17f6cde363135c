// cuconv depthwise: VEC consecutive elements <-> VEC floats, with the widest access that VEC allows.
//
// The direct kernel works on channel vectors: VEC channels of one pixel, contiguous in NHWC, so one
// vector is one 16-, 8-, 4- or 2-byte access of shared or global memory. `load_vec` widens to fp32
// (the kernel's arithmetic type for every dtype: it is memory-bound), `store_vec` narrows with
// round-to-nearest. Pointers must be aligned to the vector's size (the host's choice of VEC checks it).
#pragma once
#include "common/types.cuh"

namespace cuconv {
namespace dw {

// Two 16-bit values packed in one word -> two floats (low half first).
__device__ __forceinline__ void unpack2(uint32_t u, float& a, float& b, bf16_t) {
  a = __uint_as_float(u << 16);
  b = __uint_as_float(u & 0xffff0000u);
}
__device__ __forceinline__ void unpack2(uint32_t u, float& a, float& b, half_t) {
  half_t lo, hi;
  lo.bits = (uint16_t)(u & 0xffffu);
  hi.bits = (uint16_t)(u >> 16);
  a = to_float(lo);
  b = to_float(hi);
}

// A vector of VEC elements of type T as one machine word of the matching size.
template <int BYTES> struct Word;
template <> struct Word<16> { typedef uint4 type; };
template <> struct Word<8> { typedef uint2 type; };
template <> struct Word<4> { typedef uint32_t type; };
template <> struct Word<2> { typedef uint16_t type; };

template <typename T, int VEC>
__device__ __forceinline__ void load_vec(const T* p, float (&f)[VEC]) {
  if constexpr (sizeof(T) == 4) {  // fp32: VEC in {1, 2, 4, 8}
    if constexpr (VEC % 4 == 0) {
#pragma unroll
      for (int i = 0; i < VEC / 4; ++i) {
        const float4 v = reinterpret_cast<const float4*>(p)[i];
        f[4 * i] = v.x; f[4 * i + 1] = v.y; f[4 * i + 2] = v.z; f[4 * i + 3] = v.w;
      }
    } else if constexpr (VEC == 2) {
      const float2 v = *reinterpret_cast<const float2*>(p);
      f[0] = v.x; f[1] = v.y;
    } else {
      f[0] = *reinterpret_cast<const float*>(p);
    }
  } else if constexpr (VEC == 1) {
    f[0] = to_float(*p);
  } else {  // 16-bit, VEC in {2, 4, 8}: whole words
    typedef typename Word<VEC * 2>::type W;
    const W w = *reinterpret_cast<const W*>(p);
    const uint32_t* u = reinterpret_cast<const uint32_t*>(&w);
#pragma unroll
    for (int i = 0; i < VEC / 2; ++i) unpack2(u[i], f[2 * i], f[2 * i + 1], T());
  }
}

template <typename T, int VEC>
__device__ __forceinline__ void store_vec(T* p, const float (&f)[VEC]) {
  if constexpr (sizeof(T) == 4) {
    if constexpr (VEC % 4 == 0) {
#pragma unroll
      for (int i = 0; i < VEC / 4; ++i)
        reinterpret_cast<float4*>(p)[i] = make_float4(f[4 * i], f[4 * i + 1], f[4 * i + 2], f[4 * i + 3]);
    } else if constexpr (VEC == 2) *reinterpret_cast<float2*>(p) = make_float2(f[0], f[1]);
    else *reinterpret_cast<float*>(p) = f[0];
  } else if constexpr (VEC == 1) {
    *p = from_float<T>(f[0]);
  } else {
    typedef typename Word<VEC * 2>::type W;
    W w;
    uint32_t* u = reinterpret_cast<uint32_t*>(&w);
#pragma unroll
    for (int i = 0; i < VEC / 2; ++i) u[i] = pack2<T>(f[2 * i], f[2 * i + 1]);
    *reinterpret_cast<W*>(p) = w;
  }
}

}  // namespace dw
}  // namespace cuconv
