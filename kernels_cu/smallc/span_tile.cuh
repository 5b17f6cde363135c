// cuconv few-channel kernels (smallc_mma): the input tile copied as runs of x's rows ("span copies").
//
// In NHWC / NDHWC the input pixels (w0 .. w0 + cols - 1) of one image row are one contiguous run of
// cols x C elements of x. The halo loader (depthwise/halo_tile.cuh) copies a tile pixel by pixel in
// units of whole channel groups; with C = 3 (an RGB stem) that unit is one 2-byte element, which
// cp.async cannot move, so each element goes through a register and the CTA waits for its loads. Here
// the run is copied instead as the aligned words of V elements (4, 8 or 16 bytes) that cover it, by
// cp.async with zero fill, so the copy of the next tile overlaps the tensor cores' work on this one.
//
// The caller picks V such that V divides W x C (every image row starts on a word) and such that the
// run's first element w0 x C lies SHIFT = (w0 x C) mod V elements into its word for every tile (the
// tile's width in elements, TQ x stride x C, is a multiple of V). A word then lies wholly inside the
// image row or wholly in its padding (left of column 0 or right of column W - 1): the padding words
// are zero-filled, so a word never mixes pixels of the image with padding. Tile row r is stored at
// r x ROWST elements, ROWST = WORDS x V; the run starts SHIFT elements into it.
//
// Channels-first (NCHW / NCDHW) x has C planes, in which the input pixels of one image row are a run
// of cols elements: the tile is then stored [row][c][col], C runs per tile row, each copied the same
// way from its plane (V divides W and TQ x stride).
//
// cuconv.models.smallc_mma.input_tile is the NumPy model of the stored tile.
#pragma once
#include "common/types.cuh"
#include "common/smem.cuh"
#include "sm80/ptx_sm80.cuh"

namespace cuconv {
namespace sc {

// Issue the cp.async copies of a tile of `rows` rows of PLANES runs: run c of tile row r is the WORDS
// words of V elements starting at element e0 (a multiple of V, may be negative: padding) of image row
// h0 + r of plane c (at plane + c * cstride; channels-last x is one plane whose rows are W x C
// elements, channels-first x C planes of W-element rows), WC elements per image row. It is stored at
// element r * rowst + c * runst of the tile. Rows outside 0 .. H - 1 and words outside the row are
// zero-filled. Every thread of the CTA (THREADS) takes words threadIdx.x, + THREADS, ...; the caller
// commits, waits and synchronises. Offsets within a plane are 32-bit (the host declines planes of
// 2^31 elements or more).
template <int V, int WORDS, int THREADS, int PLANES>
__device__ __forceinline__ void copy_tile_span(elem_t* tile, const elem_t* plane, int64_t cstride, int h0, int e0,
                                               int rows, int rowst, int runst, int H, int WC) {
  constexpr int BYTES = V * (int)sizeof(elem_t);
  const uint32_t base = smem_u32(tile);
  const int units = rows * PLANES * WORDS;
#pragma unroll 4
  for (int u = threadIdx.x; u < units; u += THREADS) {
    const int run = u / WORDS, wd = u - run * WORDS;  // constant divisors: multiplies, not divisions
    const int r = run / PLANES, c = run - r * PLANES;
    const int h = h0 + r, e = e0 + wd * V;
    const bool valid = (unsigned)h < (unsigned)H && (unsigned)e < (unsigned)WC;
    const elem_t* src = valid ? plane + c * cstride + (h * WC + e) : plane;
    sm80::cp_async_zfill<BYTES>(base + (uint32_t)((r * rowst + c * runst + wd * V) * (int)sizeof(elem_t)), src,
                                valid);
  }
}

}  // namespace sc
}  // namespace cuconv
