// cuconv: a filter's width folded into the channels, for 16-bit inputs with few channels
// (cuconv/backends/sm90/fold.py; the NumPy model is cuconv/models/fold.py).
//
// A convolution over C channels with an R x S filter equals one over S * Cp channels with an R x 1
// filter, on an input whose pixel (n, h, q) holds, for each tap s < S, the Cp channels of source pixel
// (n, h, q * stride - pad + s * dil), zeros where that column is outside [0, src_w) and past C
// (Cp = C rounded up to a multiple of 8, so every destination pixel is whole 16-byte rows):
//
//   dst[row][s * Cp + c] = src[nh * src_w + q * stride - pad + s * dil][c],   row = nh * dst_w + q
//
// The weights fold the same way (src_w = taps = S, dst_w = 1, stride 0, dilation 1, no padding: row
// k * R + r gathers its S taps). One thread writes eight channels of one tap of one destination row:
// one 16-byte store, from one 16-byte load where vec_loads says C is a multiple of 8 and the source is
// 16-byte aligned, else element by element. The values are copied as bits (float16 or bfloat16).
//
// `fold_width_dense` packs the taps' channels without padding each tap: destination element j < S * C
// of a row is channel j % C of tap j / C, and the row is padded once, to Cf = S * C rounded up to a
// multiple of 8 (an RGB 7x7 stem: 24 channels where the padded fold has 56):
//
//   dst[row][j] = src[nh * src_w + q * stride - pad + (j / C) * dil][j % C]   (j < S * C; zeros past it)
//
// One thread writes eight consecutive elements of one row (one 16-byte store) from 2-byte loads.
//
// `unfold_channels` drops a row padding: rows of Cp elements back to rows of their first C. The weight
// gradient of the densely folded convolution, (K, R, 1, Cf), is the original's (K, R, S, C) once each of
// its K * R rows drops its last Cf - S * C (cuconv/backends/sm90/wgrad.py).
#include "common/types.cuh"

struct FoldArgs {
  long long rows;            // destination rows (pixels)
  long long src_row_stride;  // elements between consecutive source pixels
  int C;                     // source channels
  int Cp;                    // channels per tap in the destination: C rounded up to a multiple of 8
  int taps;                  // filter columns folded into each destination row
  int stride, dil, pad;      // source column of tap s: q * stride - pad + s * dil
  int src_w, dst_w;          // columns per source / destination image row
  int vec_loads;             // 1: 16-byte loads of eight channels
};

extern "C" __global__ void __launch_bounds__(256) fold_width(const uint16_t* __restrict__ src,
                                                             uint16_t* __restrict__ dst, const FoldArgs a) {
  const int groups = a.Cp / 8;  // eight-channel groups per tap
  const long long total = a.rows * a.taps * groups;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
       i += (long long)gridDim.x * blockDim.x) {
    const long long slot = i / groups;  // (destination row, tap): the destination's 8-channel run slot * Cp
    const int c0 = (int)(i - slot * groups) * 8;
    const long long row = slot / a.taps;
    const int tap = (int)(slot - row * a.taps);
    const long long nh = row / a.dst_w;
    const int col = (int)(row - nh * a.dst_w) * a.stride - a.pad + tap * a.dil;
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    if (col >= 0 && col < a.src_w) {
      const uint16_t* s = src + (nh * a.src_w + col) * a.src_row_stride + c0;
      if (a.vec_loads) {
        v = __ldg(reinterpret_cast<const uint4*>(s));
      } else {
        uint16_t e[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) e[j] = c0 + j < a.C ? __ldg(s + j) : (uint16_t)0;
        v = make_uint4((uint32_t)e[0] | ((uint32_t)e[1] << 16), (uint32_t)e[2] | ((uint32_t)e[3] << 16),
                       (uint32_t)e[4] | ((uint32_t)e[5] << 16), (uint32_t)e[6] | ((uint32_t)e[7] << 16));
      }
    }
    *reinterpret_cast<uint4*>(dst + slot * a.Cp + c0) = v;
  }
}

struct DenseFoldArgs {
  long long rows;            // destination rows (pixels)
  long long src_row_stride;  // elements between consecutive source pixels
  int C;                     // source channels
  int Cf;                    // destination channels: taps * C rounded up to a multiple of 8
  int taps;                  // filter columns folded into each destination row
  int stride, dil, pad;      // source column of tap s: q * stride - pad + s * dil
  int src_w, dst_w;          // columns per source / destination image row
};

// Element run i of the dense fold (i / groups: the destination row, i % groups: its eight-element run);
// Index is uint32_t where every run index fits (a runtime division of 64-bit values costs a call).
template <typename Index>
__device__ __forceinline__ void dense_fold_run(const uint16_t* __restrict__ src, uint16_t* __restrict__ dst,
                                               const DenseFoldArgs& a, Index i, Index groups) {
  const Index row = i / groups;
  const int j0 = (int)(i - row * groups) * 8;
  const Index nh = row / (Index)a.dst_w;
  const int col0 = (int)(row - nh * (Index)a.dst_w) * a.stride - a.pad;
  const uint16_t* plane = src + (long long)nh * a.src_w * a.src_row_stride;
  int tap = j0 / a.C, c = j0 - tap * a.C;
  uint32_t w[4];
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    const int col = col0 + tap * a.dil;
    const uint32_t e = tap < a.taps && col >= 0 && col < a.src_w ? __ldg(plane + (long long)col * a.src_row_stride + c) : 0u;
    w[k / 2] = k % 2 ? w[k / 2] | (e << 16) : e;
    if (++c == a.C) {
      c = 0;
      ++tap;
    }
  }
  *reinterpret_cast<uint4*>(dst + (long long)row * a.Cf + j0) = make_uint4(w[0], w[1], w[2], w[3]);
}

extern "C" __global__ void __launch_bounds__(256) fold_width_dense(const uint16_t* __restrict__ src,
                                                                   uint16_t* __restrict__ dst, const DenseFoldArgs a) {
  const int groups = a.Cf / 8;  // eight-element runs per destination row
  const long long total = a.rows * groups;
  const long long first = (long long)blockIdx.x * blockDim.x + threadIdx.x, step = (long long)gridDim.x * blockDim.x;
  if (total + step < 0xffffffffLL) {
    for (uint32_t i = (uint32_t)first; i < (uint32_t)total; i += (uint32_t)step)
      dense_fold_run<uint32_t>(src, dst, a, i, (uint32_t)groups);
  } else {
    for (long long i = first; i < total; i += step) dense_fold_run<long long>(src, dst, a, i, (long long)groups);
  }
}

struct UnfoldArgs {
  long long rows;  // rows of the destination (and of the source)
  int C;           // elements per destination row
  int Cp;          // elements per source row (C and its padding)
};

extern "C" __global__ void __launch_bounds__(256) unfold_channels(const uint16_t* __restrict__ src,
                                                                  uint16_t* __restrict__ dst, const UnfoldArgs a) {
  const long long total = a.rows * a.C;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
       i += (long long)gridDim.x * blockDim.x) {
    const long long row = i / a.C;
    dst[i] = src[row * a.Cp + (i - row * a.C)];
  }
}
