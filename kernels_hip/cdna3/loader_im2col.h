// cuconv (HIP, CDNA3): the NHWC im2col DRAM->LDS loader (the conv's A operand).
//
// Same contract as loader_linear.h: fill one half-tile for (m_offset, k_offset) in GEMM
// coordinates (M = N * P * Q output pixels, K = R * S * Cg reduction), exactly one
// buffer_load_dword ... lds per lane per iteration. Three compile-time sub-paths:
//
//   SUBPATH_POINTWISE  1x1 filter, stride 1, no padding: addr = m * C + group * Cg + k. This *is*
//                      LinearLoader (row_stride = C), so the instruction stream is the matmul one.
//   SUBPATH_UNIFORM    Cg % kBlockK == 0: a half-tile never straddles two filter taps, so
//                      (r, s, c_base) come from one scalar divmod of k_offset per half-tile.
//   SUBPATH_PER_LANE   anything else with even Cg (a stem with C = 16 or 48, ...): each lane
//                      decomposes its own k = k_offset + lane_k, two fast divmods per iteration.
//
// Halo (compile-time `Halo`): lanes whose (h, w) fall in the padding get voffset = num_records,
// the resource's bound, so the hardware returns 0. Without padding the flag is off and the
// instruction stream has no compare at all. `MaskK` does the same for columns >= Kgemm when the
// host padded K up to kSchedK (the filter is zero there, but 0 * inf would still be NaN).
// The row part of every address (n, p * stride - pad, q * stride - pad) is computed once per
// workgroup; see common/index_math.h for the formulas, which mirror cuconv/models/loader.py.
#pragma once

#include "cdna3/loader_linear.h"
#include "common/buffer_lds.h"
#include "common/index_math.h"

namespace cuconv {

template <int Path, bool Halo, bool MaskK>
struct Im2colLoader {
  i32x4 rsrc;
  Im2colLaneAddresses<Path, Halo, MaskK> lane;
  u32 wave;

  CUCONV_DEV Im2colLoader(const void* x, const ConvGeometryHip& g, u32 m_offset, u32 group)
      : rsrc(make_buffer_resource(x, g.x_bytes)), lane(g, m_offset, group, (i32)wave_id(), (i32)lane_id()),
        wave(wave_id()) {}

  CUCONV_DEV void load_tile(const ConvGeometryHip& g, lds_ptr_t dst, u32 k_offset) const {
    // uniform: (r, s, c_base) once per half-tile, from k_offset alone (scalar registers).
    Im2colTap tap = {0u, 0u, 0u};
    if (Path == SUBPATH_UNIFORM) tap = lane.tile_tap(g, k_offset);
#pragma unroll
    for (i32 it = 0; it < kLoadIters; ++it) {
      buffer_load_dword_lds(rsrc, (lds_ptr_t)((__attribute__((address_space(3))) char*)dst + lds_iter_offset(it, (i32)wave)),
                            lane.voffset(g, it, k_offset, tap));
    }
  }
};

// The pointwise sub-path: the linear loader over x viewed as [M, C], columns offset by the group.
template <bool Halo, bool MaskK>
struct Im2colLoader<SUBPATH_POINTWISE, Halo, MaskK> {
  static_assert(!Halo, "the pointwise sub-path has no padding by definition");
  LinearLoader<MaskK> linear;

  CUCONV_DEV Im2colLoader(const void* x, const ConvGeometryHip& g, u32 m_offset, u32 group)
      : linear(x, pointwise_lane_addresses<MaskK>(g, m_offset, group, (i32)wave_id(), (i32)lane_id())) {}

  CUCONV_DEV void load_tile(const ConvGeometryHip&, lds_ptr_t dst, u32 k_offset) const {
    linear.load_tile(dst, k_offset);
  }
};

}  // namespace cuconv
