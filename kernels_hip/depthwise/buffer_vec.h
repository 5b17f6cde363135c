// cuconv (HIP) depthwise: buffer loads of 2, 4, 8 or 16 bytes into VGPRs, zero when out of range.
//
//   buffer_load_{ushort,dword,dwordx2,dwordx4} vDATA, vOFFSET, s[RSRC:RSRC+3], 0 offen
// reads base + vOFFSET with a raw resource (common/buffer_lds.h: make_buffer_resource), and returns 0
// for an offset >= num_records without touching memory. The depthwise tile copy points every padding
// unit at num_records (the "sentinel"), so zero-filling the halo costs one select of the offset.
//
// Why not buffer_load ... lds (the DMA path of cdna3_igemm): on gfx90a / gfx942 it moves at most one
// dword per lane and writes lane L to M0 + 4 * L, so a 16-byte channel unit would take four
// instructions and a tile laid out in dword slots, which the 2-byte units of an odd channel count do
// not fill. A VGPR round trip (buffer load, then ds_write_b128 / b64 / b32 / b16) keeps one load and
// one store per unit at every width.
//
// The intrinsics are declared by their LLVM names, as buffer_lds.h does: clang-19 has no builtin for them.
#pragma once

#include "common/buffer_lds.h"
#include "common/hip_min.h"
#include "depthwise/vec_io.h"

#if CUCONV_HIP_DEVICE_COMPILE

__device__ cuconv::dw::u32x4 cuconv_raw_buffer_load_v4i32(cuconv::i32x4 rsrc, int voffset, int soffset, int aux)
    __asm("llvm.amdgcn.raw.buffer.load.v4i32");
__device__ cuconv::dw::u32x2 cuconv_raw_buffer_load_v2i32(cuconv::i32x4 rsrc, int voffset, int soffset, int aux)
    __asm("llvm.amdgcn.raw.buffer.load.v2i32");
__device__ cuconv::u32 cuconv_raw_buffer_load_i32(cuconv::i32x4 rsrc, int voffset, int soffset, int aux)
    __asm("llvm.amdgcn.raw.buffer.load.i32");
__device__ short cuconv_raw_buffer_load_i16(cuconv::i32x4 rsrc, int voffset, int soffset, int aux)
    __asm("llvm.amdgcn.raw.buffer.load.i16");

namespace cuconv {
namespace dw {

// BYTES bytes at byte offset `voffset` of the resource's buffer (0 past num_records).
template <int BYTES>
CUCONV_DEV typename Word<BYTES>::type buffer_load_word(i32x4 rsrc, u32 voffset) {
  if constexpr (BYTES == 16) return cuconv_raw_buffer_load_v4i32(rsrc, (int)voffset, 0, 0);
  else if constexpr (BYTES == 8) return cuconv_raw_buffer_load_v2i32(rsrc, (int)voffset, 0, 0);
  else if constexpr (BYTES == 4) return cuconv_raw_buffer_load_i32(rsrc, (int)voffset, 0, 0);
  else return (u16)cuconv_raw_buffer_load_i16(rsrc, (int)voffset, 0, 0);
}

}  // namespace dw
}  // namespace cuconv

#endif  // CUCONV_HIP_DEVICE_COMPILE
