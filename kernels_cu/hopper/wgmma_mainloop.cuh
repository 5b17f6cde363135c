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
#include "hopper/pipeline.cuh"

#if CUCONV_DTYPE == 0
#define CUCONV_WGMMA_AB_TYPE "f16"
#elif CUCONV_DTYPE == 1
#define CUCONV_WGMMA_AB_TYPE "bf16"
#else
#error "the sm90 wgmma mainloop serves float16 and bfloat16 only"
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

// m64n64k16: D[64 x 64] = A[64 x 16] * B[16 x 64] + (scale_d ? D : 0); both operands K-major in smem.
__device__ __forceinline__ void wgmma_m64n64k16(float (&d)[32], uint64_t desc_a, uint64_t desc_b,
                                                 uint32_t scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32." CUCONV_WGMMA_AB_TYPE "." CUCONV_WGMMA_AB_TYPE " "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}

// m64n128k16: D[64 x 128] = A[64 x 16] * B[16 x 128] + (scale_d ? D : 0); both operands K-major in smem.
__device__ __forceinline__ void wgmma_m64n128k16(float (&d)[64], uint64_t desc_a, uint64_t desc_b,
                                                 uint32_t scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32." CUCONV_WGMMA_AB_TYPE "." CUCONV_WGMMA_AB_TYPE " "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}

// m64n256k16: D[64 x 256] = A[64 x 16] * B[16 x 256] + (scale_d ? D : 0); both operands K-major in smem.
__device__ __forceinline__ void wgmma_m64n256k16(float (&d)[128], uint64_t desc_a, uint64_t desc_b,
                                                 uint32_t scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32." CUCONV_WGMMA_AB_TYPE "." CUCONV_WGMMA_AB_TYPE " "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, %128, %129, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
        "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
        "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
        "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
        "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
        "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
        "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
        "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
        "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}

template <int BN>
__device__ __forceinline__ void wgmma_m64k16(float (&d)[BN / 2], uint64_t desc_a, uint64_t desc_b,
                                             uint32_t scale_d) {
  if constexpr (BN == 64) {
    wgmma_m64n64k16(d, desc_a, desc_b, scale_d);
  } else if constexpr (BN == 128) {
    wgmma_m64n128k16(d, desc_a, desc_b, scale_d);
  } else {
    static_assert(BN == 256, "BN must be 64, 128 or 256");
    wgmma_m64n256k16(d, desc_a, desc_b, scale_d);
  }
}

// One output tile's reduction: k_iters ring slots, each BK = 64 deep.
//   a_rows_addr(stage) = shared address of this warpgroup's 64 rows of the A box in that slot
//   b_addr(stage)      = shared address of the BN x 64 B box in that slot
// The accumulator is overwritten (scale_d = 0 on the first k16 step), so no zeroing pass.
// CLUSTER > 1: a slot is released to the producers of every CTA of the cluster (each filled half of
// its filter tile by multicast).
template <int BN, int STAGES, int BK, int A_STAGE_BYTES, int B_STAGE_BYTES, int CLUSTER>
__device__ __forceinline__ void consumer_mainloop(float (&acc)[BN / 2], RingState<STAGES>& ring, int k_iters,
                                                  uint32_t a_base, uint32_t b_base, uint32_t full_bar,
                                                  uint32_t empty_bar) {
  static_assert(BK == 64, "one 128-byte swizzled row per tile row: BK must be 64 16-bit elements");
  const int lane = threadIdx.x % 32;
  int prev_stage = -1;
  for (int k = 0; k < k_iters; ++k) {
    mbar_wait(full_bar + 8 * ring.stage, ring.phase);
    const uint64_t da = smem_desc_sw128(a_base + ring.stage * A_STAGE_BYTES);
    const uint64_t db = smem_desc_sw128(b_base + ring.stage * B_STAGE_BYTES);
    fence_accumulators(acc);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk) {
      // +32 bytes per k16 step = +2 in the descriptor's 16-byte address units.
      wgmma_m64k16<BN>(acc, da + 2 * kk, db + 2 * kk, (k > 0 || kk > 0) ? 1u : 0u);
    }
    wgmma_commit();
    wgmma_wait<1>();  // the previous slot's wgmmas have retired: it may be refilled
    fence_accumulators(acc);
    if (prev_stage >= 0) mbar_release_slot<CLUSTER>(empty_bar + 8 * prev_stage, lane);
    prev_stage = ring.stage;
    ring.advance();
  }
  wgmma_wait<0>();
  fence_accumulators(acc);
  if (prev_stage >= 0) mbar_release_slot<CLUSTER>(empty_bar + 8 * prev_stage, lane);
}

}  // namespace sm90
}  // namespace cuconv
