// cuconv (HIP) depthwise: one input tile, halo included, from global memory into LDS.
//
// The workgroup's output tile (TP rows x TQ columns x CB output channels) reads an input tile of
//   rows = (TP - 1) * stride_h + (R - 1) * dil_h + 1,   cols = (TQ - 1) * SW + (S - 1) * DW + 1
// pixels of cin = CB / multiplier channels, stored [row][col][cin] in LDS; padding positions and
// channels past C are zero, so the multiply-add loop never tests a bound. The index math (unit ->
// pixel, channel and source offset) is common/depthwise_index.h; cuconv.models.depthwise.input_tile is
// its NumPy model.
//
// A unit is VIN channels of one pixel: one buffer load of VIN * sizeof(T) bytes (buffer_vec.h) and one
// ds_write. Work-item `tid` copies units tid, tid + threads, ...: consecutive lanes take consecutive
// units of one pixel, then the next pixel along W, so a wave reads whole runs of each pixel's channels.
// The resource covers one input plane (image n, depth slice d); a unit in the padding gets the plane's
// byte size as its offset and reads zeros. Loads go out in batches of BATCH before their ds_writes,
// so a work-item has several loads in flight instead of one.
#pragma once

#include "common/buffer_lds.h"
#include "common/depthwise_index.h"
#include "common/hip_min.h"
#include "depthwise/buffer_vec.h"

#if CUCONV_HIP_DEVICE_COMPILE

namespace cuconv {
namespace dw {

// Every work-item copies its share of the tile; the caller synchronises the workgroup afterwards.
template <typename T, int VIN>
CUCONV_DEV void load_input_tile(T* tile, const T* plane, const DwGeometry& g, const DwTileOrigin& org, i32 tid,
                                i32 threads) {
  constexpr int BYTES = VIN * (int)sizeof(T);
  constexpr int BATCH = BYTES >= 8 ? 4 : 8;
  typedef typename Word<BYTES>::type W;
  const u32 sentinel = (u32)g.H * (u32)g.W * (u32)g.C * (u32)sizeof(T);  // the plane's bytes (<= 4 GiB - 1)
  const i32x4 rsrc = make_buffer_resource(plane, sentinel);
  const i32 units = dw_tile_units(g, VIN);
  DwUnitWalker walk(g, VIN, tid, threads);
  for (i32 u0 = tid; u0 < units; u0 += BATCH * threads) {
    W v[BATCH];
#pragma unroll
    for (int i = 0; i < BATCH; ++i) {
      const bool in_tile = u0 + i * threads < units;
      const u32 off = in_tile ? dw_unit_voffset(g, org, walk.at, VIN, (i32)sizeof(T), sentinel) : sentinel;
      v[i] = buffer_load_word<BYTES>(rsrc, off);
      walk.advance();
    }
#pragma unroll
    for (int i = 0; i < BATCH; ++i) {
      const i32 u = u0 + i * threads;
      if (u < units) *reinterpret_cast<W*>(reinterpret_cast<char*>(tile) + u * BYTES) = v[i];
    }
  }
}

}  // namespace dw
}  // namespace cuconv

#endif  // CUCONV_HIP_DEVICE_COMPILE
