// cuconv (HIP): the index math of the DRAM->LDS loaders, host- and device-callable.
//
// The formulas mirror cuconv/models/loader.py (same names: pixel_coordinates, tap_decompose, the
// three sub-paths pointwise / uniform / per_lane) and tests/test_cdna3_index_math.py compiles this
// header for the host and compares every lane's address with loader_addresses(...).
//
// Vocabulary
//   half-tile   one K step of one operand in LDS: kTileRows rows x kBlockK 16-bit elements,
//               row-major, 64 bytes a row. The LDS ring holds two half-tiles per operand (ping and
//               pong), so one trip of the mainloop consumes 2 * kBlockK columns of K.
//   slot        one dword of a half-tile. buffer_load_dword ... lds writes lane L of a wave to
//               M0 + 4 * L, so a wave fills 256 consecutive bytes (4 rows) per instruction; which
//               GEMM element lands in a slot is our choice: the global address each lane fetches.
//   swizzle     we fetch (row, k ^ swz(row)) into slot (row, k), which spreads the mainloop's
//               8-byte ds_reads of 32 rows over all LDS banks (a row is 16 dwords; unswizzled,
//               rows r and r + 2 would hit the same banks).
//   voffset     the byte offset a lane hands to buffer_load (32 bits, the hardware's width).
//   sentinel    the resource's num_records (tensor bytes). Any voffset >= num_records reads 0, so a
//               lane whose element is padding (halo) or beyond the K extent gets voffset = sentinel.
//
// Rows past the GEMM's M (or a weight tile's rows past Kg) are "don't care": their outputs are never
// stored, and their addresses fall past num_records anyway unless 32-bit arithmetic wraps (the host
// caps the tensor size so a wrap can only touch such rows).
#pragma once

#include "common/hip_min.h"

namespace cuconv {

// ------------------------------------------------------------------------------------ tile shape
constexpr i32 kElemBytes = 2;                 // bf16 / fp16 operands
constexpr i32 kBlockM = 128;                  // GEMM rows (output pixels) per workgroup
constexpr i32 kBlockN = 128;                  // GEMM columns (output channels) per workgroup
constexpr i32 kBlockK = 32;                   // K columns per half-tile
constexpr i32 kWaves = 4;                     // the 4-wave schedule: 2 x 2 waves of 64 x 64
constexpr i32 kWaveSize = 64;                 // CDNA wavefront
constexpr i32 kThreads = kWaves * kWaveSize;  // 256 work-items
constexpr i32 kRowBytes = kBlockK * kElemBytes;               // 64
constexpr i32 kDwordsPerRow = kRowBytes / 4;                  // 16
constexpr i32 kTileRows = kBlockM;                            // A and B half-tiles are both 128 rows
constexpr i32 kHalfTileBytes = kTileRows * kRowBytes;         // 8 KiB
constexpr i32 kRowsPerIter = kThreads / kDwordsPerRow;        // 16 rows per loader iteration
constexpr i32 kLoadIters = kTileRows / kRowsPerIter;          // 8 buffer_load ... lds per lane
constexpr i32 kSchedK = 2 * kBlockK;                          // K is padded to a multiple of this

static_assert(kBlockM == kBlockN, "one loader iteration count for A and B keeps the vmcnt arithmetic simple");
static_assert(kTileRows % kRowsPerIter == 0, "a half-tile is a whole number of loader iterations");
static_assert(kDwordsPerRow == 16, "the swizzle below permutes the 8 qwords of a 64-byte row");
static_assert(kRowsPerIter % 16 == 0, "the swizzle repeats every 16 rows, so a lane's k is the same every iteration");

enum Subpath : i32 { SUBPATH_POINTWISE = 0, SUBPATH_UNIFORM = 1, SUBPATH_PER_LANE = 2 };

// ------------------------------------------------------------------------------ fast division
// n / d for 32-bit unsigned n as a multiply-high and a shift (Granlund & Montgomery): the host
// computes (multiplier, shift) once per problem (cuconv/backends/cdna3/params.py: fast_divmod_params), so
// no lane ever runs the ~20-instruction v_rcp_iflag_f32 division sequence.
struct FastDivmod {
  u32 divisor;
  u32 multiplier;  // floor(2^32 * (2^shift - divisor) / divisor) + 1
  u32 shift;       // ceil(log2(divisor))
};

CUCONV_HD u32 fast_div(const FastDivmod& d, u32 n) {
  const u64 hi = ((u64)n * d.multiplier) >> 32;
  return (u32)((hi + n) >> d.shift);  // 33-bit sum, no overflow
}

CUCONV_HD void fast_divmod(const FastDivmod& d, u32 n, u32& quotient, u32& remainder) {
  quotient = fast_div(d, n);
  remainder = n - quotient * d.divisor;
}

// -------------------------------------------------------------------------------- geometry
// Kernel parameter (by value). cuconv/backends/cdna3/params.py: hip_geometry builds the same layout.
struct ConvGeometryHip {
  i32 N, H, W, C;                      // input, NHWC
  i32 P, Q, R, S;                      // output spatial, filter spatial
  i32 Cg, G, Kg, K;                    // channels per group, groups, out channels per group, total
  i32 stride_h, stride_w, dil_h, dil_w;
  i32 pad_h, pad_w;                    // low-side padding (the high side is implied by P, Q)
  i32 M, Kgemm, Kpad;                  // GEMM rows, reduction length, Kgemm rounded up to kSchedK
  u32 x_bytes;                         // num_records of x's resource, = the halo sentinel
  u32 w_bytes;                         // num_records of the padded weights' resource
  FastDivmod div_Q, div_P, div_Cg, div_S;
};

// ------------------------------------------------------------------------------ LDS slots
// Element (row, k) held by LDS slot (iteration, wave, lane) of a half-tile; k is even: the dword
// holds elements k and k + 1.
struct TileSlot {
  i32 row;
  i32 k;
};

CUCONV_HD i32 lds_swizzle(i32 row) { return (row >> 1) & 7; }

CUCONV_HD TileSlot slot_element(i32 iter, i32 wave, i32 lane) {
  const i32 dword = (iter * kWaves + wave) * kWaveSize + lane;  // M0 + 4 * lane, in dwords
  const i32 row = dword / kDwordsPerRow;
  const i32 phys = dword % kDwordsPerRow;                        // dword within the row
  const i32 qword = (phys >> 1) ^ lds_swizzle(row);             // logical 8-byte group
  return TileSlot{row, qword * 4 + (phys & 1) * 2};
}

// Byte offset inside a half-tile of element (row, k), k even: the inverse of slot_element, used by
// the mainloop's ds_reads (k a multiple of 4 there: one 8-byte MFMA operand).
CUCONV_HD i32 lds_byte_offset(i32 row, i32 k) {
  return row * kRowBytes + (((k >> 2) ^ lds_swizzle(row)) << 3) + ((k >> 1) & 1) * 4;
}

// Byte offset of a loader iteration's first dword for one wave: what goes to M0.
CUCONV_HD i32 lds_iter_offset(i32 iter, i32 wave) { return (iter * kWaves + wave) * kWaveSize * 4; }

// ------------------------------------------------------------------------- model's decompositions
// loader.py / im2col.py: pixel_coordinates(m) -> (n, (p, q)); row-major over (N, P, Q).
CUCONV_HD void pixel_coordinates(const ConvGeometryHip& g, u32 m, u32& n, u32& p, u32& q) {
  u32 rest;
  fast_divmod(g.div_Q, m, rest, q);
  fast_divmod(g.div_P, rest, n, p);
}

// loader.py: _tap_decompose(tap) -> (r, s); row-major over (R, S).
CUCONV_HD void tap_decompose(const ConvGeometryHip& g, u32 tap, u32& r, u32& s) {
  fast_divmod(g.div_S, tap, r, s);
}

// --------------------------------------------------------------------- linear (matmul) addresses
// addr = (row_offset + row) * row_stride + col_base + k_offset + k. Weights: row_stride = Kpad;
// the pointwise conv: row_stride = C, col_base = group * Cg (loader.py: m * C + group * Cg + k).
template <bool MaskK>
struct LinearLaneAddresses {
  u32 row_stride;  // elements between consecutive rows
  u32 col_base;    // element offset of column 0
  u32 k_limit;     // with MaskK, columns >= k_limit read 0 (the K tail of a pointwise conv)
  u32 sentinel;    // num_records, in bytes
  u32 lane_row;    // the lane's row within the iteration's 16 rows
  u32 lane_k;      // the lane's (even) column, the same every iteration
  u32 row_offset;  // first GEMM row of the tile (bound once per workgroup)

  CUCONV_HD LinearLaneAddresses(u32 row_stride_, u32 col_base_, u32 k_limit_, u32 sentinel_, u32 row_offset_,
                                i32 wave, i32 lane)
      : row_stride(row_stride_), col_base(col_base_), k_limit(k_limit_), sentinel(sentinel_),
        row_offset(row_offset_) {
    const TileSlot e = slot_element(0, wave, lane);
    lane_row = (u32)e.row;
    lane_k = (u32)e.k;
  }

  // voffset of this lane on loader iteration `iter` of the half-tile at k_offset.
  CUCONV_HD u32 voffset(i32 iter, u32 k_offset) const {
    const u32 k = k_offset + lane_k;
    const u32 row = row_offset + lane_row + (u32)(iter * kRowsPerIter);
    const u32 v = (row * row_stride + col_base + k) * (u32)kElemBytes;
    if (MaskK) return k < k_limit ? v : sentinel;
    return v;
  }
};

// The two linear address plans the conv kernel uses (built here so the host tests build them the
// same way the device loaders do):
//   pointwise A:  x viewed as [M, C], columns offset by the group; K tail masked when Kgemm < Kpad
//   weights B:    [G * Kg, Kpad] (K zero-padded by the host), rows group * Kg + n_tile + row
template <bool MaskK>
CUCONV_HD LinearLaneAddresses<MaskK> pointwise_lane_addresses(const ConvGeometryHip& g, u32 m_offset, u32 group,
                                                             i32 wave, i32 lane) {
  return LinearLaneAddresses<MaskK>((u32)g.C, group * (u32)g.Cg, (u32)g.Kgemm, g.x_bytes, m_offset, wave, lane);
}

CUCONV_HD LinearLaneAddresses<false> weight_lane_addresses(const ConvGeometryHip& g, u32 n_tile, u32 group, i32 wave,
                                                           i32 lane) {
  return LinearLaneAddresses<false>((u32)g.Kpad, 0u, (u32)g.Kpad, g.w_bytes, group * (u32)g.Kg + n_tile, wave, lane);
}

// ----------------------------------------------------------------------- NHWC im2col addresses
// loader.py, uniform / per_lane:
//   (n, p, q) = pixel_coordinates(m);  (tap, c) = divmod(k, Cg);  (r, s) = tap_decompose(tap)
//   h = p * stride_h + r * dil_h - pad_h;  w = q * stride_w + s * dil_w - pad_w
//   addr = ((n * H + h) * W + w) * C + group * Cg + c          (-1 / sentinel outside the input)
// The row part (n, p * stride - pad, q * stride - pad) depends on m only, so each lane computes it
// once per workgroup for its kLoadIters rows; the column part is per half-tile: once per tile
// (uniform, a scalar divmod of k_offset) or per lane (per_lane, two divmods of k_offset + k).
struct Im2colRow {
  u32 n;   // image
  i32 h0;  // p * stride_h - pad_h (may be negative: the halo)
  i32 w0;  // q * stride_w - pad_w
};

struct Im2colTap {
  u32 r, s, c;  // filter row, filter column, channel within the group
};

CUCONV_HD Im2colRow im2col_row(const ConvGeometryHip& g, u32 m) {
  u32 n, p, q;
  pixel_coordinates(g, m, n, p, q);
  return Im2colRow{n, (i32)p * g.stride_h - g.pad_h, (i32)q * g.stride_w - g.pad_w};
}

CUCONV_HD Im2colTap im2col_tap(const ConvGeometryHip& g, u32 k) {
  u32 tap, c, r, s;
  fast_divmod(g.div_Cg, k, tap, c);
  tap_decompose(g, tap, r, s);
  return Im2colTap{r, s, c};
}

// voffset of element (row, tap + c_extra); `Halo` routes padding to the sentinel, `k_valid` the K tail.
template <bool Halo>
CUCONV_HD u32 im2col_voffset(const ConvGeometryHip& g, const Im2colRow& row, const Im2colTap& tap, u32 c_extra,
                             u32 group, bool k_valid) {
  const i32 h = row.h0 + (i32)tap.r * g.dil_h;
  const i32 w = row.w0 + (i32)tap.s * g.dil_w;
  const u32 pixel = ((u32)row.n * (u32)g.H + (u32)h) * (u32)g.W + (u32)w;  // wraps harmlessly when h/w < 0
  const u32 v = (pixel * (u32)g.C + group * (u32)g.Cg + tap.c + c_extra) * (u32)kElemBytes;
  bool inside = k_valid;
  if (Halo) inside = inside && (u32)h < (u32)g.H && (u32)w < (u32)g.W;  // one unsigned compare per bound
  return inside ? v : g.x_bytes;
}

template <int Path, bool Halo, bool MaskK>
struct Im2colLaneAddresses {
  static_assert(Path == SUBPATH_UNIFORM || Path == SUBPATH_PER_LANE,
                "the pointwise sub-path is LinearLaneAddresses (same instruction stream as the matmul loader)");
  u32 group;
  u32 lane_k;
  Im2colRow rows[kLoadIters];  // this lane's row on every iteration: computed once, reused every K step

  CUCONV_HD Im2colLaneAddresses(const ConvGeometryHip& g, u32 m_offset, u32 group_, i32 wave, i32 lane)
      : group(group_) {
    const TileSlot e = slot_element(0, wave, lane);
    lane_k = (u32)e.k;
    for (i32 it = 0; it < kLoadIters; ++it) rows[it] = im2col_row(g, m_offset + (u32)(e.row + it * kRowsPerIter));
  }

  // uniform: the tile's (r, s, c_base), computed once per half-tile (wave-uniform, k_offset only).
  CUCONV_HD Im2colTap tile_tap(const ConvGeometryHip& g, u32 k_offset) const { return im2col_tap(g, k_offset); }

  // voffset of this lane on iteration `iter`; `tap` is tile_tap(k_offset) on the uniform path.
  // The geometry is passed, not stored: it stays in the kernel-argument segment (scalar loads).
  CUCONV_HD u32 voffset(const ConvGeometryHip& g, i32 iter, u32 k_offset, const Im2colTap& tap) const {
    if (Path == SUBPATH_UNIFORM) {
      // Cg % kBlockK == 0: the whole half-tile sits in one filter tap, channels c_base .. c_base + 31.
      const bool k_valid = !MaskK || k_offset < (u32)g.Kgemm;
      return im2col_voffset<Halo>(g, rows[iter], tap, lane_k, group, k_valid);
    } else {
      const u32 k = k_offset + lane_k;
      const bool k_valid = !MaskK || k < (u32)g.Kgemm;
      return im2col_voffset<Halo>(g, rows[iter], im2col_tap(g, k), 0u, group, k_valid);
    }
  }
};

}  // namespace cuconv
