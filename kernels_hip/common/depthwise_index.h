// cuconv (HIP): the depthwise kernel's index math, host- and device-callable.
//
// kernels_hip/depthwise/depthwise_fprop.hip computes with these functions, and
// tests/test_cdna3_depthwise_index.py compiles this header for the CPU and compares every result with
// the NumPy model of the kernel, cuconv/models/depthwise.py (same steps, same names where they exist):
//
//   block  -> (n, o, tile_p, tile_q, chunk)          dw_block         model: cta_coordinates
//   block  -> tile origin (h0, w0, c_lo) and depth d  dw_tile_origin, dw_input_depth     input_tile
//   unit   -> (row, col, channel unit) of the tile    dw_unit, DwUnitWalker               input_tile
//   unit   -> byte offset in the input plane, or the sentinel (zero)   dw_unit_voffset   input_tile
//   thread -> (cv, row, qg)                           dw_thread                            thread_outputs
//   (thread, r, s, q, v) -> the tile element it reads: dw_window_base + dw_window_col * cin
//                                                      + dw_input_channel                 thread_outputs
//   weight i -> its fp32 slot in LDS, [tap][cb]       dw_weight_slot, dw_tap_slot          direct_conv (taps)
//   (thread, j) -> output pixel and offset            dw_output_pixel, dw_output_offset    direct_conv
//
// Vocabulary. The tile is the workgroup's input tile with its halo, in_rows x in_cols pixels x cin
// channels, stored [row][col][cin] in LDS. A unit is VIN consecutive channels of one tile pixel: one
// buffer load of VIN * sizeof(elem) bytes and one ds_write. A unit outside the image (the padding) or past
// C gets voffset = the sentinel, the byte size of the input plane the buffer resource covers, so the
// hardware returns zeros (common/buffer_lds.h).
//
// Compile-time values of the kernel (QT, SW, DW, VEC, VIN) are arguments here, so the host can call the
// same functions; on the device they are constants and fold away.
#pragma once

#include "common/hip_min.h"

namespace cuconv {
namespace dw {

// The run-time geometry: the DwGeometry of kernels_cu/depthwise/depthwise_fprop.cu, member for member
// (cuconv.backends.depthwise.params.dw_geometry builds it for both kernels).
struct DwGeometry {
  i32 N, D, H, W, C, K;          // input extents; output channels K = mult * C
  i32 O, P, Q, T;                // output extents; filter depth (R, S are compile-time)
  i32 stride_d, stride_h, dil_d, dil_h;
  i32 pad_d, pad_h, pad_w;       // padding before each dim
  i32 mult;                      // channel multiplier K / C
  i32 cv, tp, tqg;               // channel vectors, output rows, column groups of QT per workgroup
  i32 tiles_p, tiles_q;          // tiles per output plane
  i32 in_rows, in_cols, cin;     // the input tile: rows x cols pixels x cin channels
  u32 div_upp_mul, div_upp_shr;  // the CUDA kernel's fast divisors: its loader's (by cin / VIN and by
  u32 div_cols_mul, div_cols_shr;  // in_cols) and its work-item decoding's (by tiles_q, tiles_p, O and
  u32 div_tq_mul, div_tq_shr;      // N); the unit walker here steps with carries, and the 1-D grid
  u32 div_tp_mul, div_tp_shr;      // divides once per workgroup, so they are unread here
  u32 div_o_mul, div_o_shr;
  u32 div_n_mul, div_n_shr;
};

// Work-items of a workgroup: cv channel vectors x tp rows x tqg column groups (the host's cfg.threads).
CUCONV_HD i32 dw_threads(const DwGeometry& g) { return g.cv * g.tp * g.tqg; }

// Output channels of a workgroup's chunk.
CUCONV_HD i32 dw_chunk_channels(const DwGeometry& g, i32 vec) { return vec * g.cv; }

// ------------------------------------------------------------------------------------- the 1-D grid
struct DwBlock {
  i32 n, o, tile_p, tile_q, chunk;
};

// Block index -> coordinates: (chunk, n, o, tile_p, tile_q) with tile_q fastest, so the workgroups that
// run together are neighbouring tiles of one plane and share their halos in L2.
CUCONV_HD DwBlock dw_block(const DwGeometry& g, u32 block) {
  DwBlock b;
  u32 rest = block;
  b.tile_q = (i32)(rest % (u32)g.tiles_q); rest /= (u32)g.tiles_q;
  b.tile_p = (i32)(rest % (u32)g.tiles_p); rest /= (u32)g.tiles_p;
  b.o = (i32)(rest % (u32)g.O); rest /= (u32)g.O;
  b.n = (i32)(rest % (u32)g.N);
  b.chunk = (i32)(rest / (u32)g.N);
  return b;
}

// ------------------------------------------------------------------------------------ the input tile
struct DwTileOrigin {
  i32 h0, w0;  // top-left input pixel of the tile (negative inside the padding)
  i32 c_lo;    // first input channel of the chunk
  i32 k0;      // first output channel of the chunk
  i32 p0, q0;  // first output row and column of the tile
};

CUCONV_HD DwTileOrigin dw_tile_origin(const DwGeometry& g, const DwBlock& b, i32 vec, i32 qt, i32 sw) {
  DwTileOrigin t;
  t.p0 = b.tile_p * g.tp;
  t.q0 = b.tile_q * g.tqg * qt;
  t.h0 = t.p0 * g.stride_h - g.pad_h;
  t.w0 = t.q0 * sw - g.pad_w;
  t.k0 = b.chunk * dw_chunk_channels(g, vec);
  t.c_lo = t.k0 / g.mult;  // the chunk holds whole multiplier groups
  return t;
}

// The input depth slice filter depth t reads for output depth o (outside [0, D): a padding slice).
CUCONV_HD i32 dw_input_depth(const DwGeometry& g, i32 o, i32 t) { return o * g.stride_d - g.pad_d + t * g.dil_d; }

CUCONV_HD i32 dw_units_per_pixel(const DwGeometry& g, i32 vin) { return g.cin / vin; }
CUCONV_HD i32 dw_tile_units(const DwGeometry& g, i32 vin) { return g.in_rows * g.in_cols * dw_units_per_pixel(g, vin); }

// Unit u of the tile: pixel (row, col), channels cu * VIN .. cu * VIN + VIN - 1 of the chunk. Its LDS
// place is byte u * VIN * sizeof(elem) of the tile: [row][col][cin] row-major.
struct DwUnit {
  i32 row, col, cu;
};

CUCONV_HD DwUnit dw_unit(const DwGeometry& g, i32 vin, i32 u) {
  const i32 upp = dw_units_per_pixel(g, vin);
  const i32 pix = u / upp;
  DwUnit r;
  r.cu = u - pix * upp;
  r.row = pix / g.in_cols;
  r.col = pix - r.row * g.in_cols;
  return r;
}

// A work-item's units u0, u0 + step, u0 + 2 * step, ... as (row, col, cu) without a division per unit:
// the step is split once into (rows, cols, units) and added with carries. Equal to dw_unit(u) for every
// u the walk visits (the host test checks it).
struct DwUnitWalker {
  DwUnit at;
  i32 step_row, step_col, step_cu;
  i32 upp, cols;

  CUCONV_HD DwUnitWalker(const DwGeometry& g, i32 vin, i32 u0, i32 step) {
    upp = dw_units_per_pixel(g, vin);
    cols = g.in_cols;
    at = dw_unit(g, vin, u0);
    const i32 step_pix = step / upp;
    step_cu = step - step_pix * upp;
    step_row = step_pix / cols;
    step_col = step_pix - step_row * cols;
  }

  CUCONV_HD void advance() {
    i32 cu = at.cu + step_cu;
    const i32 carry_cu = cu >= upp ? 1 : 0;  // step_cu < upp: one subtraction at most
    cu -= carry_cu * upp;
    i32 col = at.col + step_col + carry_cu;
    const i32 carry_col = col >= cols ? 1 : 0;  // step_col + 1 <= cols
    col -= carry_col * cols;
    at.cu = cu;
    at.col = col;
    at.row += step_row + carry_col;
  }
};

// Byte offset of unit `un` in the input plane of one (image, depth slice) -- x + ((n * D + d) * H * W * C)
// elements, the base of the buffer resource -- or `sentinel` (the plane's byte size: reads return 0)
// when the unit lies in the padding or past channel C. The plane is at most 4 GiB - 1 bytes (the host
// declines larger ones), so the offset fits in 32 bits.
CUCONV_HD u32 dw_unit_voffset(const DwGeometry& g, const DwTileOrigin& t, const DwUnit& un, i32 vin, i32 esize,
                              u32 sentinel) {
  const i32 h = t.h0 + un.row;
  const i32 w = t.w0 + un.col;
  const i32 c = t.c_lo + un.cu * vin;
  const bool inside = (u32)h < (u32)g.H && (u32)w < (u32)g.W && c < g.C;
  const u32 offset = (((u32)h * (u32)g.W + (u32)w) * (u32)g.C + (u32)c) * (u32)esize;  // wraps when outside
  return inside ? offset : sentinel;
}

// ------------------------------------------------------------------------------ threads and windows
struct DwThread {
  i32 cv;   // channel vector: output channels k0 + cv * VEC .. + VEC - 1
  i32 row;  // output row p0 + row
  i32 qg;   // column group: output columns q0 + qg * QT .. + QT - 1
};

// cv fastest: consecutive work-items read consecutive channel vectors of one pixel from LDS and store
// consecutive vectors of one output pixel.
CUCONV_HD DwThread dw_thread(const DwGeometry& g, i32 tid) {
  DwThread t;
  t.cv = tid % g.cv;
  const i32 pg = tid / g.cv;
  t.qg = pg % g.tqg;
  t.row = pg / g.tqg;
  return t;
}

// Tile element (offset in elements from the tile's start) of the first window pixel of filter row r:
// the thread's window spans WIN = (QT - 1) * SW + (S - 1) * DW + 1 consecutive tile pixels.
CUCONV_HD i32 dw_window_base(const DwGeometry& g, const DwThread& th, i32 r, i32 qt, i32 sw) {
  return ((th.row * g.stride_h + r * g.dil_h) * g.in_cols + th.qg * qt * sw) * g.cin;
}

// Window column (pixel index within the window) that output q of the thread meets at filter column s.
CUCONV_HD i32 dw_window_col(i32 q, i32 s, i32 sw, i32 dwl) { return q * sw + s * dwl; }

// Channel of the tile pixel that lane v of channel vector cv reads: output k reads input k / mult.
CUCONV_HD i32 dw_input_channel(i32 cv, i32 v, i32 vec, i32 mult) { return (cv * vec + v) / mult; }

// -------------------------------------------------------------------------------------- weights
// Weight i of the chunk's staging loop (i = kl * taps + tap: consecutive work-items read consecutive
// weights of one output channel) goes to fp32 slot tap * cb + kl of the LDS weights, [tap][cb]; the
// filter tap (t, r, s) of output channel k0 + j is slot ((t * R + r) * S + s) * cb + j.
struct DwWeightSlot {
  i32 kl;    // output channel within the chunk
  i32 tap;   // (t * R + r) * S + s
  i32 slot;  // fp32 index in LDS
};

CUCONV_HD DwWeightSlot dw_weight_slot(i32 i, i32 taps, i32 cb) {
  DwWeightSlot s;
  s.kl = i / taps;
  s.tap = i - s.kl * taps;
  s.slot = s.tap * cb + s.kl;
  return s;
}

// LDS slot of filter tap (t, r, s) of output channel k0 + 0 (add the channel within the chunk).
CUCONV_HD i32 dw_tap_slot(i32 t, i32 r, i32 s, i32 R, i32 S, i32 cb) { return ((t * R + r) * S + s) * cb; }

// Bytes of the LDS weights, rounded up to 16 so the tile after them is 16-byte aligned.
CUCONV_HD i32 dw_weight_bytes(const DwGeometry& g, i32 taps_per_slice, i32 vec) {
  return (g.T * taps_per_slice * dw_chunk_channels(g, vec) * 4 + 15) & ~15;
}

// ------------------------------------------------------------------------------------- the output
// Output pixel (p, q) and first channel k of a work-item's output j (0 <= j < QT). It is stored when
// p < P, q < Q and k < K (k < K covers the whole vector: VEC divides K).
struct DwOutputPixel {
  i32 p, q, k;
};

CUCONV_HD DwOutputPixel dw_output_pixel(const DwTileOrigin& t, const DwThread& th, i32 j, i32 vec, i32 qt) {
  DwOutputPixel o;
  o.p = t.p0 + th.row;
  o.q = t.q0 + th.qg * qt + j;
  o.k = t.k0 + th.cv * vec;
  return o;
}

// Element offset of output (n, o, p, q, k), NDHWC (a conv2d has O = 1).
CUCONV_HD i64 dw_output_offset(const DwGeometry& g, i32 n, i32 o, i32 p, i32 q, i32 k) {
  return ((((i64)n * g.O + o) * g.P + p) * g.Q + q) * g.K + k;
}

}  // namespace dw
}  // namespace cuconv
