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

  // `plan` comes from index_math.h (pointwise_lane_addresses / weight_lane_addresses / by hand);
  // its sentinel is the tensor's size in bytes (<= 4 GiB - 1), which is also the resource's bound.
  CUCONV_DEV LinearLoader(const void* base, const LinearLaneAddresses<MaskK>& plan)
      : rsrc(make_buffer_resource(base, plan.sentinel)), lane(plan), wave(wave_id()) {}

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
