// cuconv sm80: the transposed im2col loader (weight gradient, NHWC), same contract as LinearLoader.
//
// The weight gradient of group g is a GEMM whose reduction runs over the output pixels:
//   dw[k][j] = sum over l of dy[l][g Kg + k] * B[l][j],   l = (n, p, q) over N*P*Q,
//                                                         j = (r, s, c) over R*S*Cg, channel fastest,
//   B[l][j] = x[((n * H + h) * W + w) * C + g * Cg + c],  h = p * stride_h + r * dil_h - pad_h,
//                                                         w = q * stride_w + s * dil_w - pad_w
// (0 in the halo). This loader stages B tiles [K_TILE pixels][N_TILE columns] (columns contiguous,
// read by the mainloop with ldmatrix.trans). A CTA's columns never change along the reduction, and
// every thread keeps one column chunk for all its rows, so each thread decomposes its column
// j -> (r, s, c) once (the constructor) and per copy only its pixel l -> (n, p, q) (two multiply-shift
// divisions). The host guarantees Cg % VEC == 0, so a chunk never straddles two taps, and
// N*P*Q < 2^31.
//
// The reduction of one CTA is the pixel range [l_begin, l_end) (a split of N*P*Q across CTAs);
// load_tile's k_offset counts from l_begin.
#pragma once
#include "common/fast_div.cuh"
#include "sm80/ptx_sm80.cuh"
#include "sm80/smem_tile.cuh"

namespace cuconv {
namespace sm80 {

// Weight-gradient geometry (the host fills it: cuconv/backends/sm80/wgrad.py).
struct WgradGeometry {
  int L;                 // N * P * Q: the reduction
  int H, W, C, P, Q;     // input, output
  int S, Cg, Kg, K;      // filter width, channels per group, filters per group, dy's channels (row pitch)
  int cols;              // R * S * Cg: columns of one group's dw
  int stride_h, stride_w, dil_h, dil_w, pad_h, pad_w;
  int split_len;         // pixels per split (a multiple of the K tile)
  int splits, m_tiles, n_tiles;
  FastDivisor div_q, div_pq, div_cg, div_s;
};

template <int N_TILE, int K_TILE, int VEC, int NTHREADS, class TILE = void>
struct Im2colTLoader {
  using Tile = typename TileOr<TILE, SwizzledTile<K_TILE, N_TILE>>::type;
  static constexpr int kChunksPerRow = N_TILE / VEC;
  static constexpr int kRowsPerPass = NTHREADS / kChunksPerRow;
  static constexpr int kPasses = K_TILE / kRowsPerPass;
  static_assert(NTHREADS % kChunksPerRow == 0, "a thread keeps one column chunk for all of its rows");
  static_assert(K_TILE % kRowsPerPass == 0, "the passes cover the tile rows exactly");

  const elem_t* xc;      // x + g * Cg + c of this thread's column
  WgradGeometry g;
  int l_begin, l_end;    // this CTA's pixels
  int dh, dw;            // this thread's tap offset: r * dil_h - pad_h, s * dil_w - pad_w
  bool col_valid;

  __device__ __forceinline__ Im2colTLoader(const elem_t* x, const WgradGeometry& geo, int group, long long n_offset,
                                           int begin, int end)
      : g(geo), l_begin(begin), l_end(end) {
    const int j = (int)n_offset + (threadIdx.x % kChunksPerRow) * VEC;
    col_valid = j < g.cols;
    const int jj = col_valid ? j : 0;
    const int tap = (int)fast_div((uint32_t)jj, g.div_cg);
    const int c = jj - tap * g.Cg;
    const int r = (int)fast_div((uint32_t)tap, g.div_s);
    const int s = tap - r * g.S;
    dh = r * g.dil_h - g.pad_h;
    dw = s * g.dil_w - g.pad_w;
    xc = x + group * g.Cg + c;
  }

  __device__ __forceinline__ void load_tile(uint32_t stage, long long /*n_offset*/, long long k_offset) const {
    const int col = (threadIdx.x % kChunksPerRow) * VEC;
    const int row0 = threadIdx.x / kChunksPerRow;
#pragma unroll
    for (int pass = 0; pass < kPasses; ++pass) {
      const int row = row0 + pass * kRowsPerPass;
      const int l = l_begin + (int)k_offset + row;
      const int npq = (int)fast_div((uint32_t)l, g.div_pq);
      const int pq = l - npq * g.P * g.Q;
      const int p = (int)fast_div((uint32_t)pq, g.div_q);
      const int h = p * g.stride_h + dh;
      const int w = (pq - p * g.Q) * g.stride_w + dw;
      const bool valid = col_valid && l < l_end && (unsigned)h < (unsigned)g.H && (unsigned)w < (unsigned)g.W;
      // Off-tensor chunks keep their computed address: a zero-size copy reads nothing.
      copy_vec_zfill<VEC>(stage + Tile::elem_offset(row, col),
                          xc + (((long long)npq * g.H + h) * g.W + w) * g.C, valid);
    }
  }
};

}  // namespace sm80
}  // namespace cuconv
