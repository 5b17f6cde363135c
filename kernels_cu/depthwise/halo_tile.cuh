// cuconv depthwise: one input tile, halo included, from global memory into shared memory.
//
// The CTA's output tile (TP rows x TQ columns x CB output channels) reads an input tile of
//   rows = (TP - 1) * stride_h + (R - 1) * dil_h + 1,   cols = (TQ - 1) * SW + (S - 1) * DW + 1
// pixels of `cin` input channels (cin = CB / multiplier), origin (p0 * stride_h - pad_h,
// q0 * SW - pad_w) in the input plane, channel c_lo. It is stored [row][col][cin]; positions outside
// the image (the padding) and channels past C are zero, so the compute loop never tests bounds.
//
// Copy units are VIN consecutive channels (VIN * sizeof(elem) bytes: cp.async of 16, 8 or 4 bytes
// with zero-fill, or a 2-byte load + store). Consecutive threads take consecutive units of one pixel,
// then the next pixel along W: a warp reads whole 32-byte sectors of each pixel's channel run.
// Thread i copies units i, i + blockDim.x, ...: it splits its first unit into (row, col, channel unit)
// once per tile (TileWalk: three divisions) and steps those by constant amounts with carries, with no
// division per unit.
// cuconv.models.depthwise.input_tile is the NumPy model of this index math.
#pragma once
#include "common/types.cuh"
#include "common/smem.cuh"
#include "common/fast_div.cuh"
#include "sm80/ptx_sm80.cuh"

namespace cuconv {
namespace dw {

// Where one (image, depth slice) input tile starts, and how big it is.
struct TileOrigin {
  const elem_t* plane;  // x at (n, d, 0, 0, 0): the input plane of this depth slice
  int h0, w0;           // top-left input pixel of the tile (may be negative: padding)
  int c_lo;             // first input channel
  int rows, cols, cin;  // tile extent in pixels x pixels x channels
};

// This thread's first copy unit as (row, col, channel unit), and the step to its next one.
struct TileWalk {
  int row, col, cu;        // coordinates of unit threadIdx.x
  int d_row, d_col, d_cu;  // blockDim.x units as rows, columns (< cols) and channel units (< upp)
};

__device__ __forceinline__ TileWalk tile_walk(int cols, int upp, FastDivisor div_upp, FastDivisor div_cols) {
  TileWalk t;
  int pix = (int)fast_div(threadIdx.x, div_upp);
  t.cu = threadIdx.x - pix * upp;
  t.row = (int)fast_div((uint32_t)pix, div_cols);
  t.col = pix - t.row * cols;
  pix = (int)fast_div(blockDim.x, div_upp);
  t.d_cu = blockDim.x - pix * upp;
  t.d_row = (int)fast_div((uint32_t)pix, div_cols);
  t.d_col = pix - t.d_row * cols;
  return t;
}

// 2-byte copy units (plain loads) a thread keeps in flight at once.
constexpr int U16_BATCH = 8;

template <int VIN>
__device__ __forceinline__ void copy_unit(uint32_t dst, const elem_t* src, bool valid) {
  constexpr int BYTES = VIN * (int)sizeof(elem_t);
  if constexpr (BYTES >= 4) {
    sm80::cp_async_zfill<BYTES>(dst, src, valid);
  } else {  // one 16-bit element: not a cp.async size
    sm80::copy_u16_zfill(dst, src, valid);
  }
}

// Every thread of the CTA issues its share of the tile's copies; the caller commits, waits and
// synchronises. Unit offsets are 32-bit element offsets from the plane (the host declines planes of
// 2^31 elements or more); a unit is valid when its row and column fall in the image and its channels
// below C.
//
// When one tile row's units (cols x cin / VIN) fit the CTA, thread i keeps one position in the row,
// (col, channel unit) = i % row_units, and copies it in rows i / row_units, + rows_per_pass, ...: its
// column and channel checks hold for the whole tile, and each further unit is one row further on.
// Otherwise the threads walk the tile's units in order (TileWalk), stepping coordinates with carries.
// 2-byte units (one 16-bit channel) are not a cp.async size: there a thread issues U16_BATCH loads
// before their stores, so a tile costs a few memory latencies, not one per unit.
template <int VIN>
__device__ __forceinline__ void load_input_tile(elem_t* tile, const TileOrigin& o, int H, int W, int C,
                                                FastDivisor div_upp, FastDivisor div_cols) {
  constexpr int UNIT_BYTES = VIN * (int)sizeof(elem_t);
  const int upp = o.cin / VIN;
  const int row_units = o.cols * upp;
  const uint32_t base = smem_u32(tile);
  if (row_units <= (int)blockDim.x) {
    const int rows_per_pass = (int)fast_div(fast_div(blockDim.x, div_upp), div_cols);  // blockDim.x / row_units
    // threadIdx.x / row_units, as (threadIdx.x / upp) / cols
    const int r0 = (int)fast_div(fast_div(threadIdx.x, div_upp), div_cols);
    if (r0 >= rows_per_pass) return;  // the threads past the last whole row of a pass
    const int pos = threadIdx.x - r0 * row_units;
    const int col = (int)fast_div((uint32_t)pos, div_upp);
    const int cu = pos - col * upp;
    const int w = o.w0 + col, c = o.c_lo + cu * VIN;
    const bool col_ok = (unsigned)w < (unsigned)W && c < C;
    const int d_off = rows_per_pass * W * C;
    const uint32_t d_dst = (uint32_t)(rows_per_pass * row_units * UNIT_BYTES);
    int h = o.h0 + r0;
    int off = (h * W + w) * C + c;
    uint32_t dst = base + (uint32_t)((r0 * row_units + pos) * UNIT_BYTES);
    if constexpr (UNIT_BYTES < 4) {
      // 2-byte units are plain loads and stores: U16_BATCH loads in flight before their stores.
#pragma unroll 1
      for (int r = r0; r < o.rows; r += U16_BATCH * rows_per_pass) {
        uint16_t v[U16_BATCH];
#pragma unroll
        for (int j = 0; j < U16_BATCH; ++j) {
          const int hj = h + j * rows_per_pass;
          const bool valid = col_ok && (unsigned)hj < (unsigned)H && r + j * rows_per_pass < o.rows;
          v[j] = sm80::load_u16_zfill(o.plane + (valid ? off + j * d_off : 0), valid);
        }
#pragma unroll
        for (int j = 0; j < U16_BATCH; ++j)
          if (r + j * rows_per_pass < o.rows) sm80::store_u16(dst + j * d_dst, v[j]);
        h += U16_BATCH * rows_per_pass;
        off += U16_BATCH * d_off;
        dst += U16_BATCH * d_dst;
      }
    } else {
      for (int r = r0; r < o.rows; r += rows_per_pass) {
        const bool valid = col_ok && (unsigned)h < (unsigned)H;
        copy_unit<VIN>(dst, valid ? o.plane + off : o.plane, valid);
        h += rows_per_pass;
        off += d_off;
        dst += d_dst;
      }
    }
    return;
  }
  const int units = o.rows * row_units;
  const TileWalk walk = tile_walk(o.cols, upp, div_upp, div_cols);
  int row = walk.row + o.h0, col = walk.col + o.w0, cu = walk.cu;  // image coordinates
  const int col_end = o.w0 + o.cols;
  // Element offsets: one step of blockDim.x units; a channel-unit wrap moves one column on, a
  // column wrap one row down and cols back.
  const int d_off = (walk.d_row * W + walk.d_col) * C + walk.d_cu * VIN;
  const int wrap_cu = C - upp * VIN;
  const int wrap_col = (W - o.cols) * C;
  int off = (row * W + col) * C + o.c_lo + cu * VIN;
  uint32_t dst = base + threadIdx.x * UNIT_BYTES;
  const uint32_t d_dst = blockDim.x * UNIT_BYTES;
  auto step = [&]() {
    dst += d_dst;
    cu += walk.d_cu;
    col += walk.d_col;
    row += walk.d_row;
    off += d_off;
    if (cu >= upp) { cu -= upp; ++col; off += wrap_cu; }
    if (col >= col_end) { col -= o.cols; ++row; off += wrap_col; }
  };
  if constexpr (UNIT_BYTES < 4) {
    // 2-byte units: U16_BATCH loads in flight before their stores (see above).
#pragma unroll 1
    for (int u = threadIdx.x; u < units; u += U16_BATCH * blockDim.x) {
      uint16_t v[U16_BATCH];
      uint32_t at[U16_BATCH];
#pragma unroll
      for (int j = 0; j < U16_BATCH; ++j) {
        const bool valid = u + j * (int)blockDim.x < units && (unsigned)row < (unsigned)H &&
                           (unsigned)col < (unsigned)W && cu * VIN < C - o.c_lo;
        v[j] = sm80::load_u16_zfill(o.plane + (valid ? off : 0), valid);
        at[j] = dst;
        step();
      }
#pragma unroll
      for (int j = 0; j < U16_BATCH; ++j)
        if (u + j * (int)blockDim.x < units) sm80::store_u16(at[j], v[j]);
    }
  } else {
    for (int u = threadIdx.x; u < units; u += blockDim.x) {
      const bool valid = (unsigned)row < (unsigned)H && (unsigned)col < (unsigned)W && cu * VIN < C - o.c_lo;
      copy_unit<VIN>(dst, valid ? o.plane + off : o.plane, valid);
      step();
    }
  }
}

}  // namespace dw
}  // namespace cuconv
