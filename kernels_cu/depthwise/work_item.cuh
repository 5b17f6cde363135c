// cuconv depthwise: the run-time geometry of a depthwise launch and the work item a CTA takes, shared by
// the direct kernel (depthwise_fprop.cu) and the tensor-core kernel (depthwise_mma.cu).
//
// A work item is one output tile of g.tp rows x g.tqg * QT columns x one channel chunk of one (image,
// output depth slice). Items are numbered (chunk, n, o, tile row, tile column) with the tile column
// fastest, so consecutive items of a CTA's run share the chunk's filter taps and neighbour each other.
#pragma once
#include "common/types.cuh"
#include "common/fast_div.cuh"

namespace cuconv {
namespace dw {

// The run-time geometry (cuconv.backends.depthwise.params.dw_geometry builds it; same field order).
struct DwGeometry {
  int N, D, H, W, C, K;          // input extents; output channels K = mult * C
  int O, P, Q, T;                // output extents; filter depth (R, S are compile-time)
  int stride_d, stride_h, dil_d, dil_h;
  int pad_d, pad_h, pad_w;       // padding before each dim
  int mult;                      // channel multiplier K / C
  int cv, tp, tqg;               // channel vectors, output rows, column groups of QT per CTA
  int tiles_p, tiles_q;          // tiles per output plane
  int in_rows, in_cols, cin;     // the input tile: rows x cols pixels x cin channels
  FastDivisor div_upp, div_cols; // the loader's divisions: by cin / VIN (copy units per pixel), by in_cols
  FastDivisor div_tq, div_tp, div_o, div_n;  // the work item's: by tiles_q, tiles_p, O, N
};

// One work item's place: channel chunk, image, output depth slice and the tile's first output pixel.
struct Item {
  int chunk, n, o, p0, q0;
};

template <int QT>
__device__ __forceinline__ Item decode_item(const DwGeometry& g, int item) {
  Item it;
  uint32_t b = (uint32_t)item, q;
  q = fast_div(b, g.div_tq); const int tile_q = (int)(b - q * g.tiles_q); b = q;
  q = fast_div(b, g.div_tp); const int tile_p = (int)(b - q * g.tiles_p); b = q;
  q = fast_div(b, g.div_o); it.o = (int)(b - q * g.O); b = q;
  q = fast_div(b, g.div_n); it.n = (int)(b - q * g.N);
  it.chunk = (int)q;
  it.p0 = tile_p * g.tp;
  it.q0 = tile_q * g.tqg * QT;
  return it;
}

}  // namespace dw
}  // namespace cuconv
