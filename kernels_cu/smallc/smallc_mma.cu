// cuconv: dense convolution with few input channels and a long window (a 7x7 RGB stem: 147 terms per
// output), 2-D and 3-D, channels-last, fp16 / bf16, on tensor cores (mma.sync m16n8k16) with the
// im2col built from a halo tile in shared memory (the `smallc_mma` kernel; host:
// cuconv.backends.smallc.mma).
//
// The implicit GEMM kernels cannot read a pixel of 3 channels as a 16-byte row; the fp32 direct kernel
// (smallc_fprop.cu) spends C*R*S multiply-adds per output, too many for a 7x7 window. Here the
// reduction kk = (r, s, c) of the filter's (R, S, C) order is read straight from the input tile:
//   A[m][kk] = tile[base(m) + off(kk)],  base(m) = (row(m) * stride_h * IN_COLS + col(m) * SW) * C,
//                                        off(kk) = (r * dil_h * IN_COLS + s * DW) * C + c,
// so one table of KP offsets (shared memory) and four pixel bases per thread (registers) address every
// A element, and no im2col is ever written.
//
// CTA: an output tile of TP rows x TQ columns (BM = TP * TQ = 128 pixels) x BN output channels of one
// (image, output depth slice), 4 warps of 32 pixels (two m16 fragments) x BN channels (BN / 8 n8
// fragments). Grid: one dimension, (chunk of BN channels, n, o, tile row, tile column), fastest last.
//   1. The chunk's filter goes to shared memory as elem_t [t][BN][KPS] (reduction contiguous, zero past
//      C*R*S and past K; KPS = KP + 8 makes the B fragment reads conflict-free), and the offset table.
//   2. Per filter depth t whose input slice lies in the image: the input tile with its halo, all C
//      channels (depthwise/halo_tile.cuh: cp.async or 2-byte copies, zero-filled padding).
//   3. Per k16 step: B fragments of the BN channels (32-bit reads), then per m16 fragment eight 16-bit
//      reads of A and BN / 8 mma.sync. The padding terms (kk >= C*R*S) read offset 0, the pixel's own
//      first window element, against zero weights: they add exactly zero to finite data.
//   4. Epilogue act(alpha * acc + bias + beta * residual) (depthwise/direct_epilogue.cuh) straight from
//      the fragments: each thread owns pairs of neighbouring channels of two pixels per n8 fragment
//      (EV = 2 channels per access when K is even, else 1).
//
// Compile-time (host: cuconv.backends.smallc.mma_variants): dtype, C, R, S, SW (stride along W), DW
// (dilation along W), TP, TQ, BN, EV and VIN (channels per input copy). Everything else is run-time
// (MmaGeometry).
#include "common/types.cuh"
#include "common/epilogue_math.cuh"
#include "common/fast_div.cuh"
#include "sm80/ptx_sm80.cuh"
#include "depthwise/vec_io.cuh"
#include "depthwise/halo_tile.cuh"
#include "depthwise/direct_epilogue.cuh"

#ifndef SC_C
#define SC_C 3
#endif
#ifndef SC_R
#define SC_R 7
#endif
#ifndef SC_S
#define SC_S 7
#endif
#ifndef SC_SW
#define SC_SW 2
#endif
#ifndef SC_DW
#define SC_DW 1
#endif
#ifndef SC_VIN
#define SC_VIN 1
#endif
#ifndef MM_TP
#define MM_TP 8
#endif
#ifndef MM_TQ
#define MM_TQ 16
#endif
#ifndef MM_BN
#define MM_BN 64
#endif
#ifndef MM_EV
#define MM_EV 2
#endif
#ifndef MM_MIN_BLOCKS
#define MM_MIN_BLOCKS 4
#endif
#ifndef CUCONV_KERNEL_NAME
#define CUCONV_KERNEL_NAME smallc_mma
#endif

namespace cuconv {
namespace scm {

using dw::load_input_tile;
using dw::store_outputs;
using dw::TileOrigin;

constexpr int C = SC_C, R = SC_R, S = SC_S, SW = SC_SW, DWL = SC_DW;
constexpr int TP = MM_TP, TQ = MM_TQ, BM = TP * TQ, BN = MM_BN, EV = MM_EV;
constexpr int KRED = R * S * C;             // reduction terms of one filter depth slice
constexpr int KP = (KRED + 15) / 16 * 16;   // padded to whole k16 steps
constexpr int KPS = KP + 8;                 // row stride of the filter in shared memory (elements)
constexpr int KSTEPS = KP / 16;
constexpr int NFRAG = BN / 8;
constexpr int IN_COLS = (TQ - 1) * SW + (S - 1) * DWL + 1;  // input tile columns
constexpr int THREADS = 128;                // 4 warps x 32 pixels
static_assert(BM == 32 * (THREADS / 32), "the CTA tile is 4 warps of 32 pixels");
static_assert(BN % 8 == 0 && BN <= 64, "BN: whole n8 fragments, at most 64 channels");
static_assert(EV == 1 || EV == 2, "EV: one or two channels per epilogue access");

// The run-time geometry (cuconv.backends.smallc.params.mma_geometry builds it; same field order).
struct MmaGeometry {
  int N, D, H, W, K;              // input extents (C is compile-time); output channels
  int O, P, Q, T;                 // output extents; filter depth (R, S are compile-time)
  int stride_d, stride_h, dil_d, dil_h;
  int pad_d, pad_h, pad_w;        // padding before each dim
  int tiles_p, tiles_q;           // tiles per output plane
  int in_rows;                    // input tile rows (columns: IN_COLS)
  FastDivisor div_upp, div_cols;  // the loader's divisions: by C / VIN (copy units per pixel), by IN_COLS
};

__device__ __forceinline__ uint32_t pack_bits(uint16_t lo, uint16_t hi) {
  return (uint32_t)lo | ((uint32_t)hi << 16);
}

// The epilogue of this thread's fragments: per m16 fragment f and n8 fragment j, channels
// k0 + 8j + 2(lane % 4) + {0, 1} of tile pixels m and m + 8 (m = 32 warp + 16 f + lane / 4).
template <int ACT>
__device__ __forceinline__ void store_tile(const float (&acc)[2][NFRAG][4], const elem_t* bias,
                                           const elem_t* residual, elem_t* out, const MmaGeometry& g,
                                           const EpilogueParams& ep, int n, int o, int p0, int q0, int k0) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int f = 0; f < 2; ++f) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int m = warp * 32 + f * 16 + h * 8 + (lane >> 2);
      const int p = p0 + m / TQ, q = q0 + m % TQ;
      if (p >= g.P || q >= g.Q) continue;
      const int64_t row_base = (((int64_t)n * g.O + o) * g.P + p) * g.Q;
#pragma unroll
      for (int j = 0; j < NFRAG; ++j) {
        const int k = k0 + j * 8 + (lane & 3) * 2;
#pragma unroll
        for (int e = 0; e < 2; e += EV) {
          if (k + e >= g.K) break;
          float v[1][EV];
          v[0][0] = acc[f][j][2 * h + e];
          if constexpr (EV == 2) v[0][1] = acc[f][j][2 * h + 1];
          store_outputs<ACT, 1, EV>(v, bias, residual, out, g, ep, row_base, q, k + e);
        }
      }
    }
  }
}

}  // namespace scm
}  // namespace cuconv

using namespace cuconv;
using namespace cuconv::scm;

extern "C" __global__ void __launch_bounds__(THREADS, MM_MIN_BLOCKS)
CUCONV_KERNEL_NAME(const elem_t* __restrict__ x, const elem_t* __restrict__ w, const elem_t* bias,
                   const elem_t* residual, elem_t* out, MmaGeometry g, EpilogueParams ep) {
  extern __shared__ __align__(16) unsigned char smem[];
  uint16_t* sw = reinterpret_cast<uint16_t*>(smem);                                  // [T][BN][KPS]
  const int sw_bytes = (g.T * BN * KPS * 2 + 15) & ~15;
  int* offtab = reinterpret_cast<int*>(smem + sw_bytes);                             // [KP]
  elem_t* sx = reinterpret_cast<elem_t*>(smem + sw_bytes + KP * 4);                  // [in_rows][IN_COLS][C]
  const uint16_t* sxu = reinterpret_cast<const uint16_t*>(sx);

  int b = blockIdx.x;
  const int tile_q = b % g.tiles_q; b /= g.tiles_q;
  const int tile_p = b % g.tiles_p; b /= g.tiles_p;
  const int o = b % g.O; b /= g.O;
  const int n = b % g.N;
  const int k0 = (b / g.N) * BN;
  const int p0 = tile_p * TP, q0 = tile_q * TQ;

  // 1. The filter of channels k0 .. k0 + BN - 1 (w: [K][T][R][S][C]) -> sw[t][k - k0][kk], zero past
  //    KRED and K; and the offset of each reduction term in the input tile.
  {
    const uint16_t* wu = reinterpret_cast<const uint16_t*>(w);
    const int total = g.T * BN * KP;
#pragma unroll 4
    for (int i = threadIdx.x; i < total; i += THREADS) {
      const int kk = i % KP, rest = i / KP;
      const int nn = rest % BN, t = rest / BN;
      const int k = k0 + nn;
      uint16_t v = 0;
      if (kk < KRED && k < g.K) v = wu[((int64_t)k * g.T + t) * KRED + kk];
      sw[(t * BN + nn) * KPS + kk] = v;
    }
    for (int kk = threadIdx.x; kk < KP; kk += THREADS) {
      int off = 0;
      if (kk < KRED) {
        const int c = kk % C, s = (kk / C) % S, r = kk / (C * S);
        off = (r * g.dil_h * IN_COLS + s * DWL) * C + c;
      }
      offtab[kk] = off;
    }
  }

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int c0 = (lane & 3) * 2;
  int base[2][2];  // [m16 fragment][rows lane/4, lane/4 + 8]: the pixel's window origin in the tile
#pragma unroll
  for (int f = 0; f < 2; ++f)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int m = warp * 32 + f * 16 + h * 8 + (lane >> 2);
      base[f][h] = ((m / TQ) * g.stride_h * IN_COLS + (m % TQ) * SW) * C;
    }
  float acc[2][NFRAG][4];
#pragma unroll
  for (int f = 0; f < 2; ++f)
#pragma unroll
    for (int j = 0; j < NFRAG; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[f][j][e] = 0.f;

  TileOrigin org;
  org.h0 = p0 * g.stride_h - g.pad_h;
  org.w0 = q0 * SW - g.pad_w;
  org.c_lo = 0;
  org.rows = g.in_rows;
  org.cols = IN_COLS;
  org.cin = C;
  const int64_t slice = (int64_t)g.H * g.W * C;  // elements of one input depth slice
  const elem_t* image = x + (int64_t)n * g.D * slice;
  const int d0 = o * g.stride_d - g.pad_d;
#pragma unroll 1
  for (int t = 0; t < g.T; ++t) {
    const int d = d0 + t * g.dil_d;
    if ((unsigned)d >= (unsigned)g.D) continue;  // a padding slice: the same for the whole CTA
    org.plane = image + d * slice;
    __syncthreads();  // the previous slice is consumed
    // 2. The input tile with its halo.
    load_input_tile<SC_VIN>(sx, org, g.H, g.W, C, g.div_upp, g.div_cols);
    sm80::cp_async_commit();
    sm80::cp_async_wait<0>();
    __syncthreads();  // the tile (and, the first time, the filter and the offsets) is visible
    // 3. The k16 steps.
    const uint16_t* swt = sw + t * BN * KPS + (lane >> 2) * KPS + c0;
#pragma unroll 2  // a whole unroll keeps every step's loads in flight: spills at 128 registers
    for (int ks = 0; ks < KSTEPS; ++ks) {
      const int2 oa = *reinterpret_cast<const int2*>(offtab + ks * 16 + c0);
      const int2 ob = *reinterpret_cast<const int2*>(offtab + ks * 16 + c0 + 8);
      uint32_t bf[NFRAG][2];
#pragma unroll
      for (int j = 0; j < NFRAG; ++j) {
        const uint16_t* row = swt + j * 8 * KPS + ks * 16;
        bf[j][0] = *reinterpret_cast<const uint32_t*>(row);
        bf[j][1] = *reinterpret_cast<const uint32_t*>(row + 8);
      }
#pragma unroll
      for (int f = 0; f < 2; ++f) {
        uint32_t a[4];
        a[0] = pack_bits(sxu[base[f][0] + oa.x], sxu[base[f][0] + oa.y]);
        a[1] = pack_bits(sxu[base[f][1] + oa.x], sxu[base[f][1] + oa.y]);
        a[2] = pack_bits(sxu[base[f][0] + ob.x], sxu[base[f][0] + ob.y]);
        a[3] = pack_bits(sxu[base[f][1] + ob.x], sxu[base[f][1] + ob.y]);
#pragma unroll
        for (int j = 0; j < NFRAG; ++j) sm80::mma_16816<elem_t>(acc[f][j], a, bf[j]);
      }
    }
  }

  // 4. Epilogue.
  switch (ep.activation) {
    case ACT_RELU: store_tile<ACT_RELU>(acc, bias, residual, out, g, ep, n, o, p0, q0, k0); break;
    case ACT_SILU: store_tile<ACT_SILU>(acc, bias, residual, out, g, ep, n, o, p0, q0, k0); break;
    case ACT_GELU: store_tile<ACT_GELU>(acc, bias, residual, out, g, ep, n, o, p0, q0, k0); break;
    default: store_tile<ACT_NONE>(acc, bias, residual, out, g, ep, n, o, p0, q0, k0); break;
  }
}
