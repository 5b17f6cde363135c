// cuconv (HIP, CDNA3): the linear 2-D DRAM->LDS loader (weights, matmul operands, pointwise conv).
//
// Contract (shared with loader_im2col.h): a loader fills one half-tile (kTileRows x kBlockK, see
// common/index_math.h) for GEMM coordinates (m_offset, k_offset). A workgroup's m_offset never
// changes along its K loop, so it is bound when the loader is built; load_tile takes k_offset.
// Each lane issues exactly kLoadIters buffer_load_dword ... lds per half-tile, one per iteration,
// and nothing else that touches vmcnt, so the schedule can count outstanding loads exactly.
//
//   addr(row, k) = (m_offset + row) * row_stride + col_base + k_offset + k      (elements)
#pragma once

#include "common/buffer_lds.h"
#include "common/index_math.h"

namespace cuconv {

template <bool MaskK>
struct LinearLoader {
  i32x4 rsrc;                          // the whole tensor: base, num_records = its bytes
  LinearLaneAddresses<MaskK> lane;     // this lane's address plan (host-tested)
  u32 wave;

  // row_stride / col_base / k_limit in elements; num_bytes is the tensor's size (<= 4 GiB - 1).
  CUCONV_DEV LinearLoader(const void* base, u32 num_bytes, u32 row_stride, u32 col_base, u32 k_limit, u32 m_offset)
      : rsrc(make_buffer_resource(base, num_bytes)),
        lane(row_stride, col_base, k_limit, num_bytes, m_offset, (i32)wave_id(), (i32)lane_id()),
        wave(wave_id()) {}

  // Fill the half-tile at `dst` (LDS) with columns [k_offset, k_offset + kBlockK).
  CUCONV_DEV void load_tile(lds_ptr_t dst, u32 k_offset) const {
#pragma unroll
    for (i32 it = 0; it < kLoadIters; ++it) {
      // M0 = dst + this wave's 256-byte slice of iteration `it`; the lane adds 4 * lane itself.
      buffer_load_dword_lds(rsrc, (lds_ptr_t)((__attribute__((address_space(3))) char*)dst + lds_iter_offset(it, (i32)wave)),
                            lane.voffset(it, k_offset));
    }
  }
};

}  // namespace cuconv
