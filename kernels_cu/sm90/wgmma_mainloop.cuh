// cuconv hopper: the MMA loop - wgmma (sm_90a) over the shared-memory ring, fp32 accumulators in
// registers.
//
// One consumer warpgroup owns 64 rows of the BM x BN output tile and issues m64nBNk16 wgmmas:
// per ring slot (BK = 64 = 4 x k16) four of them, A = its 64 rows of the im2col box, B = the BN x 64
// filter box, both K-major with the 128-byte swizzle. Accumulator layout of m64nNk16 (thread t of
// the warpgroup, warp w = t / 32, lane l):
//
//     acc[j*4 + 2*i + e]  <->  row 16*w + l/4 + 8*i,  column 8*j + 2*(l%4) + e     (i, e in {0, 1})
//
// The mainloop never knows how the slot was filled (TMA im2col here): it only waits `full`, and
// releases the slot on `empty` once the wgmmas reading it have retired (wait_group 1 keeps one
// slot's wgmmas in flight while the next slot's are issued).
#pragma once

#include "common/types.cuh"
#include "sm90/mn_major_tile.cuh"
#include "sm90/pipeline.cuh"

// SM90_TF32 = 1: the operands are float32 data that the rest of the kernel moves as pairs of 16-bit
// elements (a 128-byte row is 32 floats); each k16 step of 32 bytes is then one m64nNk8 tf32 wgmma
// (8 floats), with the same descriptors. tf32 wgmma has no transposed (MN-major) form and ignores
// the 13 low mantissa bits of each operand (one TF32 product per term).
#ifndef SM90_TF32
#define SM90_TF32 0
#endif
#if SM90_TF32
#define CUCONV_WGMMA_AB_TYPE "tf32"
#define CUCONV_WGMMA_K "k8"
#define CUCONV_WGMMA_IMM "p, 1, 1"
#elif CUCONV_DTYPE == 0
#define CUCONV_WGMMA_AB_TYPE "f16"
#elif CUCONV_DTYPE == 1
#define CUCONV_WGMMA_AB_TYPE "bf16"
#else
#error "the sm90 wgmma mainloop serves float16, bfloat16 and (SM90_TF32) float32 as tf32 only"
#endif
// SM90_B_MN = 1: the B slots hold the filter MN-major (read by TMA straight from a weight whose
// output channels are the contiguous axis, sm90/mn_major_tile.cuh's layout): imm-trans-b = 1, and a
// k16 step advances B by 16 rows (2048 bytes) instead of 32 bytes.
#ifndef SM90_B_MN
#define SM90_B_MN 0
#endif
// SM90_A_CF = 1: the A slots hold channels-first windows of x (sm90/halo_loader.cuh): per output row 64
// channel rows of 64 pixels, wgmma's MN-major layout (sm90/mn_major_tile.cuh): imm-trans-a = 1, and a k16
// step advances A by 16 channel rows (2048 bytes) instead of 32 bytes.
#ifndef SM90_A_CF
#define SM90_A_CF 0
#endif
#if SM90_A_CF && (SM90_B_MN || SM90_TF32 || SM90_XSPLIT)
#error "SM90_A_CF: 16-bit operands, the filter K-major"
#endif
#ifndef CUCONV_WGMMA_K
#define CUCONV_WGMMA_K "k16"
#if SM90_B_MN
#define CUCONV_WGMMA_IMM "p, 1, 1, 0, 1"
#elif SM90_A_CF
#define CUCONV_WGMMA_IMM "p, 1, 1, 1, 0"
#else
#define CUCONV_WGMMA_IMM "p, 1, 1, 0, 0"
#endif
#endif
#if SM90_B_MN && (SM90_TF32 || SM90_XSPLIT)
#error "SM90_B_MN: 16-bit operands with the A tile from shared memory"
#endif
// SM90_XSPLIT = 1: the A slots hold float32 data (as SM90_TF32 moves it) that the consumers split
// into bf16 hi / lo parts in registers, three register-A bf16 wgmmas per k16 step
// (wgmma_split_a.cuh); the B slots hold the filter's split parts.
#ifndef SM90_XSPLIT
#define SM90_XSPLIT 0
#endif
#if SM90_XSPLIT && (SM90_TF32 || CUCONV_DTYPE != 1)
#error "SM90_XSPLIT multiplies bf16 parts (CUCONV_DTYPE 1), not tf32"
#endif

namespace cuconv {
namespace sm90 {

// Shared-memory matrix descriptor for a K-major tile whose rows are 128 bytes (64 16-bit
// elements) stored with the 128-byte swizzle: 8-row core groups are 1024 bytes apart (stride byte
// offset), the leading byte offset is unused for swizzled K-major tiles, base offset 0 because
// every tile starts on a 1024-byte boundary. Stepping k16 inside the 128-byte row = +32 bytes on
// the start address (the hardware applies the swizzle to the final address).
__device__ __forceinline__ uint64_t smem_desc_sw128(uint32_t smem_byte_addr) {
  uint64_t desc = 0;
  desc |= (uint64_t)((smem_byte_addr & 0x3FFFF) >> 4);  // start address, 16-byte units
  desc |= (uint64_t)1 << 16;                              // leading byte offset (unused): 16 B
  desc |= (uint64_t)(1024 >> 4) << 32;                    // stride byte offset: 1024 B
  desc |= (uint64_t)1 << 62;                              // layout: 128-byte swizzle
  return desc;
}

// The descriptor of a 128B-swizzled operand: K-major rows of 128 bytes, or MN-major 64-column blocks of 128-byte
// k-rows (the block stride irrelevant for the 64 rows of an A block or the 64-column boxes of B).
__device__ __forceinline__ uint64_t operand_desc(uint32_t smem_byte_addr, bool mn_major) {
  return mn_major ? smem_desc_mn_sw128(smem_byte_addr, 64 * 128) : smem_desc_sw128(smem_byte_addr);
}

// An A block (64 rows: K-major pixel rows of 128 bytes, or with SM90_A_CF 64 channel rows of 64 pixels,
// MN-major) and a B slot (BN x 64 K-major, or with SM90_B_MN 64-row blocks of 64 columns): their descriptors
// and their advance per k16 step in the descriptors' 16-byte units.
constexpr int A_K16_STEP = SM90_A_CF ? 2048 / 16 : 2;
constexpr int B_K16_STEP = SM90_B_MN ? 2048 / 16 : 2;
__device__ __forceinline__ uint64_t a_block_desc(uint32_t smem_byte_addr) { return operand_desc(smem_byte_addr, SM90_A_CF); }
__device__ __forceinline__ uint64_t b_slot_desc(uint32_t smem_byte_addr) { return operand_desc(smem_byte_addr, SM90_B_MN); }

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}

// Keep the compiler from moving accumulator reads/writes across wgmma issue/wait points.
template <int R>
__device__ __forceinline__ void fence_accumulators(float (&d)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// wgmma.mma_async m64nNk16 with fp32 accumulators, one wrapper per N this kernel compiles
// (CUCONV_DEFINE_WGMMA below). Inline asm wants every accumulator as its own "+f" operand and the
// operand list spelled out in the instruction string, so both are assembled from blocks of eight:
// CUCONV_WGMMA_REGS_b is the text "%8b, ..., %8b+7" and CUCONV_WGMMA_ACC8(i) the operands
// d[i .. i+7]. For N columns a thread holds N/2 accumulators (operands %0 .. %N/2-1), followed by
// the two descriptors and the scale-d flag.
#define CUCONV_WGMMA_REGS_0 "%0, %1, %2, %3, %4, %5, %6, %7"
#define CUCONV_WGMMA_REGS_1 "%8, %9, %10, %11, %12, %13, %14, %15"
#define CUCONV_WGMMA_REGS_2 "%16, %17, %18, %19, %20, %21, %22, %23"
#define CUCONV_WGMMA_REGS_3 "%24, %25, %26, %27, %28, %29, %30, %31"
#define CUCONV_WGMMA_REGS_4 "%32, %33, %34, %35, %36, %37, %38, %39"
#define CUCONV_WGMMA_REGS_5 "%40, %41, %42, %43, %44, %45, %46, %47"
#define CUCONV_WGMMA_REGS_6 "%48, %49, %50, %51, %52, %53, %54, %55"
#define CUCONV_WGMMA_REGS_7 "%56, %57, %58, %59, %60, %61, %62, %63"
#define CUCONV_WGMMA_REGS_8 "%64, %65, %66, %67, %68, %69, %70, %71"
#define CUCONV_WGMMA_REGS_9 "%72, %73, %74, %75, %76, %77, %78, %79"
#define CUCONV_WGMMA_REGS_10 "%80, %81, %82, %83, %84, %85, %86, %87"
#define CUCONV_WGMMA_REGS_11 "%88, %89, %90, %91, %92, %93, %94, %95"
#define CUCONV_WGMMA_REGS_12 "%96, %97, %98, %99, %100, %101, %102, %103"
#define CUCONV_WGMMA_REGS_13 "%104, %105, %106, %107, %108, %109, %110, %111"
#define CUCONV_WGMMA_REGS_14 "%112, %113, %114, %115, %116, %117, %118, %119"
#define CUCONV_WGMMA_REGS_15 "%120, %121, %122, %123, %124, %125, %126, %127"
#define CUCONV_WGMMA_ACC8(i)                                                                            \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), \
      "+f"(d[i + 7])
#define CUCONV_WGMMA_REGS_64 CUCONV_WGMMA_REGS_0 ", " CUCONV_WGMMA_REGS_1 ", " CUCONV_WGMMA_REGS_2 ", " CUCONV_WGMMA_REGS_3
#define CUCONV_WGMMA_ACC_32 CUCONV_WGMMA_ACC8(0), CUCONV_WGMMA_ACC8(8), CUCONV_WGMMA_ACC8(16), CUCONV_WGMMA_ACC8(24)
#define CUCONV_WGMMA_REGS_96 CUCONV_WGMMA_REGS_64 ", " CUCONV_WGMMA_REGS_4 ", " CUCONV_WGMMA_REGS_5
#define CUCONV_WGMMA_ACC_48 CUCONV_WGMMA_ACC_32, CUCONV_WGMMA_ACC8(32), CUCONV_WGMMA_ACC8(40)
#define CUCONV_WGMMA_REGS_128 CUCONV_WGMMA_REGS_96 ", " CUCONV_WGMMA_REGS_6 ", " CUCONV_WGMMA_REGS_7
#define CUCONV_WGMMA_ACC_64 CUCONV_WGMMA_ACC_48, CUCONV_WGMMA_ACC8(48), CUCONV_WGMMA_ACC8(56)
#define CUCONV_WGMMA_REGS_160 CUCONV_WGMMA_REGS_128 ", " CUCONV_WGMMA_REGS_8 ", " CUCONV_WGMMA_REGS_9
#define CUCONV_WGMMA_ACC_80 CUCONV_WGMMA_ACC_64, CUCONV_WGMMA_ACC8(64), CUCONV_WGMMA_ACC8(72)
#define CUCONV_WGMMA_REGS_192 CUCONV_WGMMA_REGS_160 ", " CUCONV_WGMMA_REGS_10 ", " CUCONV_WGMMA_REGS_11
#define CUCONV_WGMMA_ACC_96 CUCONV_WGMMA_ACC_80, CUCONV_WGMMA_ACC8(80), CUCONV_WGMMA_ACC8(88)
#define CUCONV_WGMMA_REGS_256 CUCONV_WGMMA_REGS_192 ", " CUCONV_WGMMA_REGS_12 ", " CUCONV_WGMMA_REGS_13 ", " \
  CUCONV_WGMMA_REGS_14 ", " CUCONV_WGMMA_REGS_15
#define CUCONV_WGMMA_ACC_128 CUCONV_WGMMA_ACC_96, CUCONV_WGMMA_ACC8(96), CUCONV_WGMMA_ACC8(104), \
  CUCONV_WGMMA_ACC8(112), CUCONV_WGMMA_ACC8(120)

// D[64 x N] = A[64 x 16] * B[16 x N] + (scale_d ? D : 0) over 32 bytes of the reduction (16 16-bit
// elements, or 8 floats as tf32: CUCONV_WGMMA_K); both operands K-major in shared memory.
// DESC_A, DESC_B, SCALE: the operand numbers N/2, N/2 + 1, N/2 + 2 as text.
#define CUCONV_DEFINE_WGMMA(N, REGS, ACC, DESC_A, DESC_B, SCALE)                                        \
  __device__ __forceinline__ void wgmma_m64n##N##k16(float(&d)[N / 2], uint64_t desc_a, uint64_t desc_b, \
                                                     uint32_t scale_d) {                                 \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " SCALE ", 0;\n"                                     \
                 "wgmma.mma_async.sync.aligned.m64n" #N CUCONV_WGMMA_K ".f32." CUCONV_WGMMA_AB_TYPE       \
                 "." CUCONV_WGMMA_AB_TYPE " {" REGS "}, " DESC_A ", " DESC_B ", " CUCONV_WGMMA_IMM ";\n}\n" \
                 : ACC                                                                                   \
                 : "l"(desc_a), "l"(desc_b), "r"(scale_d));                                              \
  }

// The same with both operands MN-major (transposed: imm-trans-a = imm-trans-b = 1), as the weight
// gradient stages them (sm90/mn_major_tile.cuh): wgmma_mn_m64nNk16.
#define CUCONV_DEFINE_WGMMA_MN(N, REGS, ACC, DESC_A, DESC_B, SCALE)                                      \
  __device__ __forceinline__ void wgmma_mn_m64n##N##k16(float(&d)[N / 2], uint64_t desc_a, uint64_t desc_b, \
                                                        uint32_t scale_d) {                                \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " SCALE ", 0;\n"                                       \
                 "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." CUCONV_WGMMA_AB_TYPE                    \
                 "." CUCONV_WGMMA_AB_TYPE " {" REGS "}, " DESC_A ", " DESC_B ", p, 1, 1, 1, 1;\n}\n"        \
                 : ACC                                                                                     \
                 : "l"(desc_a), "l"(desc_b), "r"(scale_d));                                                \
  }

#if !SM90_TF32
CUCONV_DEFINE_WGMMA_MN(128, CUCONV_WGMMA_REGS_128, CUCONV_WGMMA_ACC_64, "%64", "%65", "%66")
CUCONV_DEFINE_WGMMA_MN(192, CUCONV_WGMMA_REGS_192, CUCONV_WGMMA_ACC_96, "%96", "%97", "%98")
CUCONV_DEFINE_WGMMA_MN(256, CUCONV_WGMMA_REGS_256, CUCONV_WGMMA_ACC_128, "%128", "%129", "%130")
#endif

CUCONV_DEFINE_WGMMA(16, CUCONV_WGMMA_REGS_0, CUCONV_WGMMA_ACC8(0), "%8", "%9", "%10")
CUCONV_DEFINE_WGMMA(64, CUCONV_WGMMA_REGS_64, CUCONV_WGMMA_ACC_32, "%32", "%33", "%34")
CUCONV_DEFINE_WGMMA(96, CUCONV_WGMMA_REGS_96, CUCONV_WGMMA_ACC_48, "%48", "%49", "%50")
CUCONV_DEFINE_WGMMA(128, CUCONV_WGMMA_REGS_128, CUCONV_WGMMA_ACC_64, "%64", "%65", "%66")
CUCONV_DEFINE_WGMMA(160, CUCONV_WGMMA_REGS_160, CUCONV_WGMMA_ACC_80, "%80", "%81", "%82")
CUCONV_DEFINE_WGMMA(192, CUCONV_WGMMA_REGS_192, CUCONV_WGMMA_ACC_96, "%96", "%97", "%98")
CUCONV_DEFINE_WGMMA(256, CUCONV_WGMMA_REGS_256, CUCONV_WGMMA_ACC_128, "%128", "%129", "%130")

template <int BN>
__device__ __forceinline__ void wgmma_m64k16(float (&d)[BN / 2], uint64_t desc_a, uint64_t desc_b,
                                             uint32_t scale_d) {
  if constexpr (BN == 16) {
    wgmma_m64n16k16(d, desc_a, desc_b, scale_d);
  } else if constexpr (BN == 64) {
    wgmma_m64n64k16(d, desc_a, desc_b, scale_d);
  } else if constexpr (BN == 96) {
    wgmma_m64n96k16(d, desc_a, desc_b, scale_d);
  } else if constexpr (BN == 128) {
    wgmma_m64n128k16(d, desc_a, desc_b, scale_d);
  } else if constexpr (BN == 160) {
    wgmma_m64n160k16(d, desc_a, desc_b, scale_d);
  } else if constexpr (BN == 192) {
    wgmma_m64n192k16(d, desc_a, desc_b, scale_d);
  } else {
    static_assert(BN == 256, "BN must be 16, 64, 96, 128, 160, 192 or 256");
    wgmma_m64n256k16(d, desc_a, desc_b, scale_d);
  }
}

// The wgmmas of one ring slot: STEPS k16 steps (+32 bytes, +2 in the descriptors' 16-byte units,
// per step; A_K16_STEP) for each of MB 64-row blocks (A descriptors da[b]) against one B box (desc_b); per step
// the MB wgmmas go out back to back (independent accumulators), and the whole slot is one
// straight-line group: fence, wgmmas, commit, then wait_group 1 (the previous slot's group has
// retired, so the caller may release that slot while this one runs). No branch may sit between the
// wgmmas of a group: ptxas then makes each wgmma a group of its own (a `warpgroup.arrive` before
// each, the scoreboard set by every one, an empty wgmma closing the last), and wait_group 1 waits
// for the whole slot, so a warpgroup's tensor work drains at every slot (seen in the SASS: it cost
// the cooperative kernels nothing measurable, the other warpgroup filling the gap, but ping-pong
// warpgroups 20-33%; docs/tuning.md T-wgmma-group). `accumulate` 0 on a tile's first slot: its first
// step overwrites the accumulators (no zeroing pass).
template <int BN, int MB, int STEPS>
__device__ __forceinline__ void issue_group(float (&acc)[MB][BN / 2], const uint64_t (&da)[MB], uint64_t desc_b,
                                            uint32_t accumulate) {
#pragma unroll
  for (int b = 0; b < MB; ++b) fence_accumulators(acc[b]);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < STEPS; ++kk) {
#pragma unroll
    for (int b = 0; b < MB; ++b) wgmma_m64k16<BN>(acc[b], da[b] + A_K16_STEP * kk, desc_b + B_K16_STEP * kk, (accumulate | kk) ? 1u : 0u);
  }
  wgmma_commit();
  wgmma_wait<1>();
#pragma unroll
  for (int b = 0; b < MB; ++b) fence_accumulators(acc[b]);
}

// One ring slot of `steps` (1..4) k16 steps: the branch picks a whole group (issue_group).
template <int BN, int MB>
__device__ __forceinline__ void issue_slot(float (&acc)[MB][BN / 2], const uint64_t (&da)[MB], uint64_t desc_b,
                                           int steps, uint32_t accumulate) {
  if (steps == 4) {
    issue_group<BN, MB, 4>(acc, da, desc_b, accumulate);
  } else if (steps == 3) {
    issue_group<BN, MB, 3>(acc, da, desc_b, accumulate);
  } else if (steps == 2) {
    issue_group<BN, MB, 2>(acc, da, desc_b, accumulate);
  } else {
    issue_group<BN, MB, 1>(acc, da, desc_b, accumulate);
  }
}

}  // namespace sm90
}  // namespace cuconv

#include "sm90/wgmma_split_a.cuh"

namespace cuconv {
namespace sm90 {

// A slot's wgmmas at A rows `rows[b]` (shared addresses): through descriptors, or split in registers
// (SM90_XSPLIT).
template <int BN, int MB>
__device__ __forceinline__ void issue_slot_at(float (&acc)[MB][BN / 2], const uint32_t (&rows)[MB], uint64_t desc_b,
                                              int steps, uint32_t accumulate) {
#if SM90_XSPLIT
  issue_split_slot<BN, MB>(acc, rows, desc_b, steps, accumulate);
#else
  uint64_t da[MB];
#pragma unroll
  for (int b = 0; b < MB; ++b) da[b] = a_block_desc(rows[b]);
  issue_slot<BN, MB>(acc, da, desc_b, steps, accumulate);
#endif
}

// One output tile's reduction (or a split tile's half, see scheduler.cuh): k_iters ring slots, each
// BK = 64 deep, walked as taps x c_blocks channel blocks, the first slot holding channel block
// first_cb. The last channel block of each tap holds only last_k16 (1..4) k16 steps of real
// channels when C is not a multiple of 64 (TMA zero-filled the rest): only those wgmmas are issued,
// e.g. C = 96 runs 4 + 2 instead of 4 + 4 steps per tap (a quarter less MMA work).
//   a_rows_addr(stage) = shared address of this warpgroup's 64 rows of the A box in that slot
//   b_addr(stage)      = shared address of the BN x 64 B box in that slot
// The accumulator is overwritten (scale_d = 0 on the first k16 step), so no zeroing pass.
// CLUSTER > 1: a slot is released to the producers of every CTA of the cluster (each filled half of
// its filter tile by multicast).
// Promotion (PROMOTE > 0: the float32-output variant, whose operands are split parts of float32
// data). The tensor cores add each group of products into the fp32 accumulator with its own
// alignment and truncation, an error proportional to the accumulator's magnitude and, being
// one-sided, growing with the number of steps: about 2e-5 of the result after 4,608 * 3 terms. So the
// wgmmas accumulate PROMOTE slots at a time into `acc` from zero, and each such partial sum is added
// to `total` with ordinary fp32 adds (round to nearest): the one-sided error then grows only within a
// partial sum. Each promotion waits for the wgmmas in flight (the tensor cores idle for that wait and
// the adds), and `total` doubles the accumulator registers (the tile policy keeps BN <= 128).
template <int PROMOTE, int MB, int N>
struct Promotion {
  float total[PROMOTE ? MB : 1][PROMOTE ? N : 1];
  int until;
  __device__ __forceinline__ Promotion() : until(PROMOTE) {
    if constexpr (PROMOTE > 0) {
#pragma unroll
      for (int b = 0; b < MB; ++b)
#pragma unroll
        for (int i = 0; i < N; ++i) total[b][i] = 0.f;
    }
  }
  // Before a slot's wgmmas: fold the partial sum into total when PROMOTE slots have gone into it;
  // returns the slot's accumulate flag (0: start a new partial sum).
  __device__ __forceinline__ uint32_t before_slot(float (&acc)[MB][N], uint32_t accumulate) {
    if constexpr (PROMOTE > 0) {
      if (accumulate && --until == 0) {
        until = PROMOTE;
        fold(acc);
        return 0u;
      }
    }
    return accumulate;
  }
  // After the last slot (its wgmmas retired): acc = total + acc.
  __device__ __forceinline__ void finish(float (&acc)[MB][N]) {
    if constexpr (PROMOTE > 0) {
#pragma unroll
      for (int b = 0; b < MB; ++b)
#pragma unroll
        for (int i = 0; i < N; ++i) acc[b][i] += total[b][i];
    }
  }
  __device__ __forceinline__ void fold(float (&acc)[MB][N]) {
    if constexpr (PROMOTE > 0) {
      wgmma_wait<0>();
#pragma unroll
      for (int b = 0; b < MB; ++b) {
        fence_accumulators(acc[b]);
#pragma unroll
        for (int i = 0; i < N; ++i) total[b][i] += acc[b][i];
      }
    }
  }
};

template <int BN, int STAGES, int BK, int A_STAGE_BYTES, int B_STAGE_BYTES, int CLUSTER,
          int PROMOTE = 0>
__device__ __forceinline__ void consumer_mainloop(float (&acc)[BN / 2], RingState<STAGES>& ring, int k_iters,
                                                  int first_cb, int c_blocks, int last_k16, uint32_t a_base,
                                                  uint32_t b_base, uint32_t full_bar, uint32_t empty_bar) {
  static_assert(BK == 64, "one 128-byte swizzled row per tile row: BK must be 64 16-bit elements");
  const int lane = threadIdx.x % 32;
  int prev_stage = -1;
  int cb = first_cb;  // channel block of slot k (kept as a counter)
  auto& acc1 = reinterpret_cast<float(&)[1][BN / 2]>(acc);
  Promotion<PROMOTE, 1, BN / 2> promo;
  for (int k = 0; k < k_iters; ++k) {
    mbar_wait(full_bar + 8 * ring.stage, ring.phase);
    const uint32_t rows[1] = {a_base + ring.stage * A_STAGE_BYTES};
    const uint64_t db = b_slot_desc(b_base + ring.stage * B_STAGE_BYTES);
    const int steps = (cb == c_blocks - 1) ? last_k16 : BK / 16;
    cb = (cb + 1 == c_blocks) ? 0 : cb + 1;
    const uint32_t accumulate = promo.before_slot(acc1, k > 0 ? 1u : 0u);
    issue_slot_at<BN, 1>(acc1, rows, db, steps, accumulate);  // the previous slot's wgmmas have retired: it may be refilled
    if (prev_stage >= 0) mbar_release_slot<CLUSTER>(empty_bar + 8 * prev_stage, lane);
    prev_stage = ring.stage;
    ring.advance();
  }
  wgmma_wait<0>();
  fence_accumulators(acc);
  promo.finish(acc1);
  if (prev_stage >= 0) mbar_release_slot<CLUSTER>(empty_bar + 8 * prev_stage, lane);
}

// The same reduction fed by the halo-tile loader (halo_loader.cuh): per (depth tap ft, channel
// block cb) one window slot of the A ring, read by the R x S taps at shifted row starts, each tap
// with its own filter slot of the B ring. A window slot is released once the wgmmas of its last tap
// have retired (after the next tap's wait_group 1, or at the end). With CTA pairs a filter slot is
// released to both CTAs (each filled half of it), a window slot only locally.
// Channels-first windows (SM90_A_CF): a window holds whole 64-pixel rows per channel, so it cannot be
// shifted by a filter column; the loader brings one per (ft, cb, filter column s), read by the R taps
// of that column at row starts 64 x 128 bytes apart (the host gives halo_w = 64).
//   a_rows_off = this warpgroup's first window row in bytes (g * halo_w * 128)
//   MB         = output rows (64-row blocks) this warpgroup accumulates: 1 when the tile's rows are
//                shared out one per consumer warpgroup, BM / 64 when one warpgroup owns the whole
//                tile (ping-pong, conv_fprop_sm90.cu); block b reads the window from row b further down.
//   issued_bar = with TURNS (ping-pong), an mbarrier this warpgroup's warps arrive on once the tile's
//                last slot is full and its wgmmas are issued (the other warpgroup's turn), before
//                they retire: the tensor pipe then has the next tile's wgmmas queued behind them.
template <int BN, int MB, int A_STAGES, int A_STAGE_BYTES, int STAGES, int B_STAGE_BYTES, int CLUSTER, bool TURNS,
          typename Params, int PROMOTE = 0>
__device__ __forceinline__ void consumer_mainloop_halo(float (&acc)[MB][BN / 2], RingState<A_STAGES>& aring,
                                                       RingState<STAGES>& bring, const Params& g,
                                                       uint32_t a_rows_off, uint32_t a_base, uint32_t b_base,
                                                       uint32_t a_full_bar, uint32_t a_empty_bar, uint32_t full_bar,
                                                       uint32_t empty_bar, uint32_t issued_bar = 0) {
  const int lane = threadIdx.x % 32;
  const uint32_t out_row_bytes = 128u * g.halo_w;        // the next output row's window row
  const uint32_t row_bytes = 128u * g.dil_h * g.halo_w;  // one filter row r further down the window
  const uint32_t col_bytes = 128u * g.dil_w;             // one filter column s further right
  const int s_in = SM90_A_CF ? 1 : g.S;   // filter columns one window serves
  const int win_s = SM90_A_CF ? g.S : 1;  // windows per (ft, cb)
  const int taps2 = g.R * s_in;
  int prev_b = -1;
  int pending_a = -1;  // a window slot whose last tap's wgmmas are still in flight
  uint32_t accumulate = 0;  // 0 on the first tap: overwrite the accumulators
  Promotion<PROMOTE, MB, BN / 2> promo;
#pragma unroll 1
  for (int ft = 0; ft < g.T; ++ft) {
#pragma unroll 1
    for (int cb = 0; cb < g.c_blocks; ++cb) {
#pragma unroll 1
      for (int ws = 0; ws < win_s; ++ws) {
        mbar_wait(a_full_bar + 8 * aring.stage, aring.phase);
        const uint32_t window = a_base + aring.stage * A_STAGE_BYTES + a_rows_off;
        const int steps = (cb == g.c_blocks - 1) ? g.last_k16 : 4;
        uint32_t tap_off = 0;  // window offset of tap (r, s): r * row_bytes + s * col_bytes
        int s = 0;
#pragma unroll 1
        for (int tap2 = 0; tap2 < taps2; ++tap2) {
          mbar_wait(full_bar + 8 * bring.stage, bring.phase);
          const uint64_t db = b_slot_desc(b_base + bring.stage * B_STAGE_BYTES);
          uint32_t rows[MB];  // block b reads the window from output row b on
#pragma unroll
          for (int b = 0; b < MB; ++b) rows[b] = window + tap_off + b * out_row_bytes;
          issue_slot_at<BN, MB>(acc, rows, db, steps, promo.before_slot(acc, accumulate));  // the previous tap's wgmmas have retired
          accumulate = 1;
          if (prev_b >= 0) mbar_release_slot<CLUSTER>(empty_bar + 8 * prev_b, lane);
          if (pending_a >= 0) {
            mbar_release_slot<1>(a_empty_bar + 8 * pending_a, lane);
            pending_a = -1;
          }
          prev_b = bring.stage;
          bring.advance();
          tap_off += col_bytes;
          if (++s == s_in) {  // next filter row
            s = 0;
            tap_off += row_bytes - s_in * col_bytes;
          }
        }
        pending_a = aring.stage;  // its last tap is in flight
        aring.advance();
      }
    }
  }
  if constexpr (TURNS) mbar_arrive_if(lane == 0, issued_bar);
  wgmma_wait<0>();
#pragma unroll
  for (int b = 0; b < MB; ++b) fence_accumulators(acc[b]);
  promo.finish(acc);
  if (prev_b >= 0) mbar_release_slot<CLUSTER>(empty_bar + 8 * prev_b, lane);
  if (pending_a >= 0) mbar_release_slot<1>(a_empty_bar + 8 * pending_a, lane);
}

}  // namespace sm90
}  // namespace cuconv
