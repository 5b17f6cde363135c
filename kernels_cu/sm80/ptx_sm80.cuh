// cuconv sm80: the handful of PTX instructions the sm_80+ kernels are built from.
//
// NVRTC compiles these kernels with no CUDA headers, so every non-trivial instruction is inline
// PTX: cp.async (with zero-fill), ldmatrix (plain and .trans), mma.sync m16n8k16 (fp16 / bf16 in,
// fp32 accumulate) and the 16-bit scalar moves used where cp.async cannot go (sources not aligned
// to 4 bytes). Shared addresses come from common/smem.cuh.
#pragma once
#include "common/smem.cuh"
#include "common/types.cuh"

namespace cuconv {
namespace sm80 {

// cp.async of BYTES (4, 8 or 16) with zero-fill: when `valid` is false the source size is 0, so the
// hardware writes BYTES zeros and reads nothing from `src` (which may then point anywhere: both
// loaders pass the chunk's computed address, past the end of the operand or in the halo).
// L1 = true keeps 16-byte copies in L1 too (.ca): for a small operand that every CTA of an SM reads
// again (a short conv's whole filter), so that those reads stop at L1 instead of all going to L2.
template <int BYTES, bool L1 = false>
__device__ __forceinline__ void cp_async_zfill(uint32_t dst, const void* src, bool valid) {
  static_assert(BYTES == 4 || BYTES == 8 || BYTES == 16, "cp.async moves 4, 8 or 16 bytes");
  const int src_bytes = valid ? BYTES : 0;
  if constexpr (BYTES == 16 && L1) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
  } else if constexpr (BYTES == 16) {
    // .cg: bypass L1, the tile is used once from shared memory.
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(dst), "l"(src), "n"(BYTES),
                 "r"(src_bytes));
  }
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

template <int PENDING>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(PENDING)); }

// The 2-byte fallback is split in two halves so a loader can issue all of its loads before the
// first store (one memory latency per tile, not one per element): load_u16_zfill reads one 16-bit
// element through the read-only path (zero, and no load, when `valid` is false); store_u16 puts it
// in shared memory. The load is deliberately not `volatile`, so the compiler may batch it.
__device__ __forceinline__ uint16_t load_u16_zfill(const void* src, bool valid) {
  uint16_t v = 0;
  if (valid) asm("ld.global.nc.u16 %0, [%1];\n" : "=h"(v) : "l"(src));
  return v;
}
__device__ __forceinline__ void store_u16(uint32_t dst, uint16_t v) {
  asm volatile("st.shared.u16 [%0], %1;\n" ::"r"(dst), "h"(v));
}
__device__ __forceinline__ void copy_u16_zfill(uint32_t dst, const void* src, bool valid) {
  store_u16(dst, load_u16_zfill(src, valid));
}

// Elements per copy -> the copy instruction. VEC = 1 is the synchronous fallback.
template <int VEC, bool L1 = false>
__device__ __forceinline__ void copy_vec_zfill(uint32_t dst, const void* src, bool valid) {
  static_assert(VEC == 1 || VEC == 2 || VEC == 4 || VEC == 8, "VEC is 1, 2, 4 or 8 16-bit elements");
  if constexpr (VEC == 1) copy_u16_zfill(dst, src, valid);
  else cp_async_zfill<VEC * 2, L1>(dst, src, valid);
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

// Two 8x8 blocks: lanes 0-15 give the row addresses (the others are ignored).
__device__ __forceinline__ void ldmatrix_x2(uint32_t (&r)[2], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(addr));
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

// D = A * B + D, m16n8k16, row.col, fp32 accumulate. ELEM picks f16 or bf16 inputs.
template <typename ELEM>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]);

template <>
__device__ __forceinline__ void mma_16816<half_t>(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

template <>
__device__ __forceinline__ void mma_16816<bf16_t>(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// float32 data moved as pairs of 16-bit elements (CUCONV_TF32): the fragments ldmatrix gives for 16
// 16-bit elements of k are, register for register, those of mma.m16n8k8.tf32 for the 8 floats they
// hold (A: a0 = (row g, k t), a1 = (g + 8, t), a2 = (g, t + 4), a3 = (g + 8, t + 4); B: b0 = (k t, col
// g), b1 = (t + 4, g); g = lane / 4, t = lane % 4), so one k16 step of the 16-bit view is one tf32
// mma. The tensor cores use each operand's top 19 bits (one TF32 product per term).
struct tf32_t {};

template <>
__device__ __forceinline__ void mma_16816<tf32_t>(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

#ifndef CUCONV_TF32
#define CUCONV_TF32 0
#endif
#if CUCONV_TF32
typedef tf32_t mma_elem_t;  // the mma's input type (the loaders move the 16-bit view: elem_t)
#else
typedef elem_t mma_elem_t;
#endif

}  // namespace sm80
}  // namespace cuconv
