// cuconv (HIP): buffer resources, the DRAM->LDS load instruction, and the counters that track it.
//
//   buffer_load_dword vOFFSET, s[RSRC:RSRC+3], 0 offen lds
// reads 4 bytes at base + vOFFSET for each lane and writes them to LDS at M0 + 4 * lane (no VGPR
// is written: the data goes straight to LDS). The load increments the wave's vmcnt like any vector
// memory load, and `s_waitcnt vmcnt(n)` returns once at most n of the wave's loads are outstanding
// (they complete in order), which is how the 4-wave schedule knows a half-tile has landed.
//
// Out of range: with a raw resource (stride 0) the hardware returns 0 for every offset
// >= num_records; cuconv points padding lanes at exactly num_records (the "sentinel").
//
// clang exposes no builtin for this intrinsic in every version we build with (clang-19 has none, ROCm's
// clang has __builtin_amdgcn_raw_buffer_load_lds only recently), so it is declared by its LLVM name,
// which both compilers accept.
#pragma once

#include "common/hip_min.h"

namespace cuconv {

typedef i32 i32x4 __attribute__((ext_vector_type(4)));
typedef __attribute__((address_space(3))) void* lds_ptr_t;

// word 3 of a raw buffer resource on gfx90a / gfx942: DATA_FORMAT = 32 bits, everything else 0
// (no swizzle, no index stride, offset clamping by num_records only).
constexpr u32 kBufferResourceWord3 = 0x00020000u;
// num_records is a 32-bit byte count: one resource covers at most 4 GiB - 1 bytes.
constexpr u64 kMaxResourceBytes = 0xFFFFFFFFull;

}  // namespace cuconv

#if CUCONV_HIP_DEVICE_COMPILE

// void @llvm.amdgcn.raw.buffer.load.lds(<4 x i32> rsrc, ptr addrspace(3) lds_base, i32 size,
//                                       i32 voffset, i32 soffset, i32 imm_offset, i32 aux)
__device__ void cuconv_raw_buffer_load_lds(cuconv::i32x4 rsrc, cuconv::lds_ptr_t lds_base, int size, int voffset,
                                           int soffset, int imm_offset, int aux)
    __asm("llvm.amdgcn.raw.buffer.load.lds");

namespace cuconv {

// A resource over [base, base + num_bytes): the whole tensor, not a tile of it, so every
// out-of-bounds address (halo or otherwise) is bounded by the real allocation.
CUCONV_DEV i32x4 make_buffer_resource(const void* base, u32 num_bytes) {
  const u64 addr = (u64)base;
  i32x4 r;
  r.x = (i32)(u32)addr;
  r.y = (i32)((u32)(addr >> 32) & 0xFFFFu);  // base[47:32]; stride 0 (a raw buffer)
  r.z = (i32)num_bytes;
  r.w = (i32)kBufferResourceWord3;
  // Arguments are uniform already; readfirstlane makes that explicit so the resource lives in SGPRs.
  r.x = __builtin_amdgcn_readfirstlane(r.x);
  r.y = __builtin_amdgcn_readfirstlane(r.y);
  r.z = __builtin_amdgcn_readfirstlane(r.z);
  r.w = __builtin_amdgcn_readfirstlane(r.w);
  return r;
}

// One dword per lane, global -> LDS. `lds_wave_base` must be wave-uniform (it becomes M0).
CUCONV_DEV void buffer_load_dword_lds(i32x4 rsrc, lds_ptr_t lds_wave_base, u32 voffset) {
  cuconv_raw_buffer_load_lds(rsrc, lds_wave_base, 4, (i32)voffset, 0, 0, 0);
}

// s_waitcnt vmcnt(N), leaving expcnt and lgkmcnt unconstrained (gfx9 encoding: vmcnt[3:0] in
// bits 3:0, vmcnt[5:4] in bits 15:14, expcnt 6:4 = 7, lgkmcnt 11:8 = 15).
template <int N>
CUCONV_DEV void wait_vmcnt() {
  static_assert(N >= 0 && N < 64, "vmcnt is a 6-bit counter on gfx9");
  __builtin_amdgcn_s_waitcnt((N & 0xF) | ((N >> 4) << 14) | (0x7 << 4) | (0xF << 8));
}

// s_waitcnt lgkmcnt(0): every LDS read of this wave has returned.
CUCONV_DEV void wait_lgkmcnt0() { __builtin_amdgcn_s_waitcnt(0xF | (0x3 << 14) | (0x7 << 4)); }

// A barrier with workgroup-scope release/acquire fences (what __syncthreads is): the fences make the
// compiler retire this wave's ds_reads (lgkmcnt(0)) before the s_barrier and keep later LDS accesses
// after it; they do not wait on vmcnt here (no tgsplit), so the in-flight DMA loads stay in flight.
CUCONV_DEV void workgroup_barrier() {
  __builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup");
  __builtin_amdgcn_s_barrier();
  __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup");
}

}  // namespace cuconv

#endif  // CUCONV_HIP_DEVICE_COMPILE
