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
// `unfold_channels` undoes the channel padding of a folded weight: rows of Cp elements back to rows of
// their first C (the weight gradient of the folded convolution, (K, R, 1, S * Cp), is the original's
// (K, R, S, C) once each of its K * R * S rows of Cp drops its padding; cuconv/backends/sm90/wgrad.py).
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
