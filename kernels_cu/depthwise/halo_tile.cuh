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

template <int VIN>
__device__ __forceinline__ void copy_unit(uint32_t dst, const elem_t* src, bool valid) {
  constexpr int BYTES = VIN * (int)sizeof(elem_t);
  if constexpr (BYTES >= 4) {
    sm80::cp_async_zfill<BYTES>(dst, src, valid);
  } else {  // one 16-bit element: not a cp.async size
    sm80::copy_u16_zfill(dst, src, valid);
  }
}

// Every thread of the CTA copies its share of the tile; the caller commits, waits and synchronises.
template <int VIN>
__device__ __forceinline__ void load_input_tile(elem_t* tile, const TileOrigin& o, int H, int W, int C,
                                                FastDivisor div_upp, FastDivisor div_cols) {
  const int units_per_pixel = o.cin / VIN;
  const int units = o.rows * o.cols * units_per_pixel;
  const uint32_t base = smem_u32(tile);
  for (int u = threadIdx.x; u < units; u += blockDim.x) {
    const int pix = (int)fast_div((uint32_t)u, div_upp);
    const int cu = u - pix * units_per_pixel;
    const int row = (int)fast_div((uint32_t)pix, div_cols);
    const int col = pix - row * o.cols;
    const int h = o.h0 + row, w = o.w0 + col, c = o.c_lo + cu * VIN;
    const bool valid = (unsigned)h < (unsigned)H && (unsigned)w < (unsigned)W && c < C;
    const elem_t* src = valid ? o.plane + ((int64_t)h * W + w) * C + c : o.plane;
    copy_unit<VIN>(base + (uint32_t)(u * VIN * (int)sizeof(elem_t)), src, valid);
  }
}

}  // namespace dw
}  // namespace cuconv
