// cuconv hopper: float32 A operands split into bfloat16 parts in registers (SM90_XSPLIT), for the
// float32 path (cuconv/backends/sm90/split_precision.py).
//
// The ring slot holds float32 x as the tf32 variant stores it: per tile row, 128 bytes = 32 floats of
// one channel block, 128-byte swizzle. The B slot holds the filter split ahead of the call, per 16
// channels [hi x 16 | lo x 16] bfloat16 (64 bytes, the bytes of those 16 floats), so B's descriptors
// are the tf32 variant's too. Per k16 step (16 floats of the reduction, 64 bytes of A and of B) each
// consumer thread loads its A fragment of m64nNk16 (rows 16 w + l/4 and +8; warp w of the warpgroup,
// lane l) with two ldmatrix (load_split_a: the 16 channels in an interleaved order), splits every value v
// into hi = bf16(v) and lo = bf16(v - hi) (hi = 0 and lo = v where hi is not finite, as
// kernels_cu/precision/split_bf16.cu does), and issues three register-A wgmmas:
//
//     acc += hi_x hi_w    (A = hi, B = the step's first 32 bytes)
//     acc += lo_x hi_w    (A = lo, B = the same)
//     acc += hi_x lo_w    (A = hi, B = the step's last 32 bytes)
//
// The split happens once per slot and thread, in registers, with no pass over x in global memory.
// The products and their accuracy are split_bf16.cu's (hi_x hi_w + lo_x hi_w + hi_x lo_w).
//
// wgmma_mainloop.cuh includes this file after its wgmma primitives (fences, waits, the operand-list
// macros), which it uses, and before the mainloops, which call issue_split_slot (SM90_XSPLIT).
#pragma once

#include "common/types.cuh"
#include "sm80/ptx_sm80.cuh"

namespace cuconv {
namespace sm90 {

// wgmma.mma_async m64nNk16 bf16 with A from four registers (the m16n8k16 fragment of each warp's 16
// rows) and B from shared memory (K-major, no transpose). Operands: the N/2 accumulators, then
// a[0..3], desc_b, scale_d (A0 .. SCALE give their numbers as text).
#define CUCONV_DEFINE_WGMMA_RS(N, REGS, ACC, A0, A1, A2, A3, DESC_B, SCALE)                                     \
  __device__ __forceinline__ void wgmma_rs_m64n##N##k16(float(&d)[N / 2], const uint32_t(&a)[4],               \
                                                        uint64_t desc_b, uint32_t scale_d) {                   \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " SCALE ", 0;\n"                                             \
                 "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32.bf16.bf16 {" REGS "}, {" A0 ", " A1 ", " A2 \
                 ", " A3 "}, " DESC_B ", p, 1, 1, 0;\n}\n"                                                      \
                 : ACC                                                                                         \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d));                     \
  }

CUCONV_DEFINE_WGMMA_RS(16, CUCONV_WGMMA_REGS_0, CUCONV_WGMMA_ACC8(0), "%8", "%9", "%10", "%11", "%12", "%13")
CUCONV_DEFINE_WGMMA_RS(64, CUCONV_WGMMA_REGS_64, CUCONV_WGMMA_ACC_32, "%32", "%33", "%34", "%35", "%36", "%37")
CUCONV_DEFINE_WGMMA_RS(96, CUCONV_WGMMA_REGS_96, CUCONV_WGMMA_ACC_48, "%48", "%49", "%50", "%51", "%52", "%53")
CUCONV_DEFINE_WGMMA_RS(128, CUCONV_WGMMA_REGS_128, CUCONV_WGMMA_ACC_64, "%64", "%65", "%66", "%67", "%68", "%69")

template <int BN>
__device__ __forceinline__ void wgmma_rs_m64k16(float (&d)[BN / 2], const uint32_t (&a)[4], uint64_t desc_b,
                                                uint32_t scale_d) {
  if constexpr (BN == 16) {
    wgmma_rs_m64n16k16(d, a, desc_b, scale_d);
  } else if constexpr (BN == 64) {
    wgmma_rs_m64n64k16(d, a, desc_b, scale_d);
  } else if constexpr (BN == 96) {
    wgmma_rs_m64n96k16(d, a, desc_b, scale_d);
  } else {
    static_assert(BN == 128, "the split-A variant's BN: 16, 64, 96 or 128 (the float32-output tiles)");
    wgmma_rs_m64n128k16(d, a, desc_b, scale_d);
  }
}

// Two adjacent floats (v.x the lower reduction index) -> packed bf16 pairs hi and lo (lower index in
// the low half, as the fragment wants).
// A non-finite hi (an infinity or NaN, or a finite v that rounds to one) becomes hi = 0, lo = v, as
// split_bf16.cu does: lo meets only the filter's hi.
__device__ __forceinline__ void split_pair(float2 v, uint32_t& hi, uint32_t& lo) {
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(hi) : "f"(v.y), "f"(v.x));
  const float h0 = __uint_as_float(hi << 16), h1 = __uint_as_float(hi & 0xffff0000u);
  const bool f0 = fabsf(h0) < __int_as_float(0x7f800000), f1 = fabsf(h1) < __int_as_float(0x7f800000);
  const float d0 = f0 ? v.x - h0 : v.x;  // v - hi is exact in fp32
  const float d1 = f1 ? v.y - h1 : v.y;
  hi &= (f0 ? 0x0000ffffu : 0u) | (f1 ? 0xffff0000u : 0u);
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(lo) : "f"(d1), "f"(d0));
}

// This thread's hi / lo A fragments of k16 step j of a slot whose 64 rows (128 bytes each, 128-byte
// swizzle applied to address bits: 16-byte unit u of a row at address a sits at unit u ^ ((a >> 7) & 7))
// start at shared address `rows` (a multiple of 128). Two ldmatrix.x4 read the step's four 16-byte
// units of the warp's 16 rows as eight 8 x 8 b16 matrices (8 rows of one unit each: conflict-free
// under the swizzle), each thread receiving float t = lane % 4 of every unit of rows g = lane / 4 and
// g + 8. Thread t thus holds floats t, 4 + t, 8 + t, 12 + t of the step, which it packs as the
// fragment's reduction indices 2t, 2t + 1, 2t + 8, 2t + 9: the filter's split puts its channels in
// that order (split_bf16.cu, `interleave`), so both operands walk the same permutation of the 16.
__device__ __forceinline__ void load_split_a(uint32_t rows, int j, uint32_t (&hi)[4], uint32_t (&lo)[4]) {
  const int t = threadIdx.x % 128;
  const int l = t % 32;
  const int m = l / 8;  // the matrix this lane addresses: rows + 8 (m odd), unit + 1 (m >= 2)
  const uint32_t row = rows + (uint32_t)(16 * (t / 32) + 8 * (m % 2) + l % 8) * 128u;
  const uint32_t x = (row >> 7) & 7u;
  uint32_t u01[4], u23[4];  // units 4j, 4j+1 / 4j+2, 4j+3: {g: u, g+8: u, g: u+1, g+8: u+1}
  sm80::ldmatrix_x4(u01, row + ((((uint32_t)(4 * j + m / 2)) ^ x) << 4));
  sm80::ldmatrix_x4(u23, row + ((((uint32_t)(4 * j + 2 + m / 2)) ^ x) << 4));
  split_pair(make_float2(__uint_as_float(u01[0]), __uint_as_float(u01[2])), hi[0], lo[0]);  // g: t, 4 + t
  split_pair(make_float2(__uint_as_float(u01[1]), __uint_as_float(u01[3])), hi[1], lo[1]);  // g + 8
  split_pair(make_float2(__uint_as_float(u23[0]), __uint_as_float(u23[2])), hi[2], lo[2]);  // g: 8 + t, 12 + t
  split_pair(make_float2(__uint_as_float(u23[1]), __uint_as_float(u23[3])), hi[3], lo[3]);  // g + 8
}

// One slot's group (see issue_group): KSTEPS k16 steps of 16 floats for each of MB 64-row blocks
// (A rows at rows[b]) against one B box (desc_b); every fragment is loaded and split before the
// group's fence. The group ends with wait_group 0, not 1: a wgmma reads its A registers while in
// flight, and writing them before the group that reads them has retired is undefined (PTX ISA,
// wgmma.wait_group), while the compiler reuses the same registers for the next slot's fragments.
// The tensor pipe is active about two thirds of the time in this variant against 93% in the split
// pass's (docs/tuning.md#T-f32-xsplit): the plan takes it for memory-bound layers only.
template <int BN, int MB, int KSTEPS>
__device__ __forceinline__ void issue_split_group(float (&acc)[MB][BN / 2], const uint32_t (&rows)[MB],
                                                  uint64_t desc_b, uint32_t accumulate) {
  uint32_t hi[MB][KSTEPS][4], lo[MB][KSTEPS][4];
#pragma unroll
  for (int b = 0; b < MB; ++b)
#pragma unroll
    for (int kk = 0; kk < KSTEPS; ++kk) load_split_a(rows[b], kk, hi[b][kk], lo[b][kk]);
#pragma unroll
  for (int b = 0; b < MB; ++b) fence_accumulators(acc[b]);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < KSTEPS; ++kk) {
#pragma unroll
    for (int b = 0; b < MB; ++b) {
      const uint64_t db = desc_b + 4 * kk;  // +64 bytes per step: [hi x 16 | lo x 16] of B
      wgmma_rs_m64k16<BN>(acc[b], hi[b][kk], db, (accumulate | kk) ? 1u : 0u);
      wgmma_rs_m64k16<BN>(acc[b], lo[b][kk], db, 1u);
      wgmma_rs_m64k16<BN>(acc[b], hi[b][kk], db + 2, 1u);
    }
  }
  wgmma_commit();
  wgmma_wait<0>();
#pragma unroll
  for (int b = 0; b < MB; ++b) fence_accumulators(acc[b]);
}

// One ring slot holding `chunks` (1..4) 32-byte chunks of real channels: (chunks + 1) / 2 k16 steps
// (the split path's channel counts are multiples of 16, so chunks is even).
template <int BN, int MB>
__device__ __forceinline__ void issue_split_slot(float (&acc)[MB][BN / 2], const uint32_t (&rows)[MB],
                                                 uint64_t desc_b, int chunks, uint32_t accumulate) {
  if (chunks > 2) {
    issue_split_group<BN, MB, 2>(acc, rows, desc_b, accumulate);
  } else {
    issue_split_group<BN, MB, 1>(acc, rows, desc_b, accumulate);
  }
}

}  // namespace sm90
}  // namespace cuconv
