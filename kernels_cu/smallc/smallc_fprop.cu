// cuconv: dense convolution with few input channels (stems: C = 1-8, C*R*S*T <= 64 multiply-adds per
// output), 2-D and 3-D, channels-last or (SC_NCHW) channels-first, as a direct kernel with fp32 multiply-adds (the
// `smallc_direct` kernel; host: cuconv.backends.smallc).
//
// A stem (C = 3 -> 32, 3x3 stride 2) is a GEMM whose reduction is 27 long: a tensor-core tile pads it
// to 32 or 64 and still spends most of its time moving the output. Here every output element costs
// C*R*S (*T) fp32 multiply-adds from registers, and the layer runs near the time to read its input
// and write its output.
//
// CTA: an output tile of TP rows x TQ = TQG * PX columns x CB = KV * KG output channels of one
// (image, output depth slice). Grid: one dimension, (chunk, n, o, tile row, tile column), tile column
// fastest.
//   1. The chunk's filter taps go to shared memory as fp32, [tap][c][CB] (tap = (t, r, s)).
//   2. Per filter depth t whose input slice lies in the image: the input tile with its halo, all C
//      channels, is copied to shared memory (depthwise/halo_tile.cuh: cp.async, zero-filled padding).
//   3. Thread (channel group, row, column group) owns PX consecutive output pixels of one row x KV
//      output channels. Per filter row r and input channel c it takes the S weight vectors (S x KV
//      fp32) into registers, then streams the WIN = (PX - 1) * SW + (S - 1) * DW + 1 input values of
//      its window, each widened once and multiplied into every output it reaches: S x PX x KV
//      multiply-adds per WIN + S * KV / 4 shared-memory reads. Consecutive threads take consecutive
//      channel groups of the same pixels: they read one input value (a broadcast) and neighbouring
//      weights, and store neighbouring channels.
//   4. Epilogue act(alpha * acc + bias + beta * residual) (depthwise/direct_epilogue.cuh), the activation
//      chosen once per thread, KV-wide stores.
// With SC_NCHW every operand is channels-first: x (N, C, D, H, W), w (K, C, T, R, S), out and the
// residual (N, K, O, P, Q). The input tile is gathered from the C channel planes into the same
// [row][col][c] order (cf_tile.cuh), the filter taps are read in KCRS order, and the epilogue stores
// each channel's PX pixels as one vector: the caller moves no operand.
//
// Compile-time (host: cuconv.backends.smallc.variants): dtype, C, R, S, SW (stride along W), DW
// (dilation along W), KV, PX, VIN (channels per input copy), MAX_THREADS and MIN_BLOCKS (the
// __launch_bounds__), NCHW (the operands' layout). Everything else is run-time (ScGeometry).
#include "common/types.cuh"
#include "common/epilogue_math.cuh"
#include "common/fast_div.cuh"
#include "depthwise/vec_io.cuh"
#include "depthwise/halo_tile.cuh"
#include "depthwise/direct_epilogue.cuh"
#include "smallc/cf_tile.cuh"

#ifndef SC_C
#define SC_C 3
#endif
#ifndef SC_R
#define SC_R 3
#endif
#ifndef SC_S
#define SC_S 3
#endif
#ifndef SC_SW
#define SC_SW 1
#endif
#ifndef SC_DW
#define SC_DW 1
#endif
#ifndef SC_KV
#define SC_KV 8
#endif
#ifndef SC_PX
#define SC_PX 8
#endif
#ifndef SC_VIN
#define SC_VIN 1
#endif
#ifndef SC_MAX_THREADS
#define SC_MAX_THREADS 256
#endif
#ifndef SC_MIN_BLOCKS
#define SC_MIN_BLOCKS 2
#endif
#ifndef SC_NCHW
#define SC_NCHW 0
#endif
#ifndef CUCONV_KERNEL_NAME
#define CUCONV_KERNEL_NAME smallc_fprop
#endif

namespace cuconv {
namespace sc {

using dw::load_input_tile;
using dw::load_weights;
using dw::store_outputs;
using dw::store_outputs_channels_first;
using dw::load_vec;
using dw::store_vec;
using dw::TileOrigin;

constexpr int C = SC_C, R = SC_R, S = SC_S, SW = SC_SW, DWL = SC_DW, KV = SC_KV, PX = SC_PX;
constexpr int WIN = (PX - 1) * SW + (S - 1) * DWL + 1;  // input columns one thread reads per (r, c)
constexpr int MAX_THREADS = SC_MAX_THREADS;
constexpr bool CHANNELS_FIRST = SC_NCHW != 0;  // every operand channels-first (NCHW / NCDHW)

// The run-time geometry (cuconv.backends.smallc.params.sc_geometry builds it; same field order).
struct ScGeometry {
  int N, D, H, W, K;             // input extents (C is compile-time); output channels
  int O, P, Q, T;                // output extents; filter depth (R, S are compile-time)
  int stride_d, stride_h, dil_d, dil_h;
  int pad_d, pad_h, pad_w;       // padding before each dim
  int kg, tp, tqg;               // channel groups of KV, output rows, column groups of PX per CTA
  int tiles_p, tiles_q;          // tiles per output plane
  int in_rows, in_cols;          // the input tile: rows x cols pixels x C channels
  FastDivisor div_upp, div_cols; // the loader's divisions: by C / VIN (copy units per pixel), by in_cols
};

// acc += this thread's share of one input slice (filter depth t), from the tile in shared memory.
__device__ __forceinline__ void accumulate_slice(float (&acc)[PX][KV], const elem_t* sx, const float* sw,
                                                 const ScGeometry& g, int t, int kgi, int row, int qg) {
  const int cb = KV * g.kg;
#pragma unroll(R <= 3 ? R : 1)
  for (int r = 0; r < R; ++r) {
    const elem_t* src = sx + ((row * g.stride_h + r * g.dil_h) * g.in_cols + qg * PX * SW) * C;
#pragma unroll
    for (int c = 0; c < C; ++c) {
      float wr[S][KV];
#pragma unroll
      for (int s = 0; s < S; ++s) load_weights(sw + (((t * R + r) * S + s) * C + c) * cb + kgi * KV, wr[s]);
#pragma unroll
      for (int j = 0; j < WIN; ++j) {
        const float xv = to_float(src[j * C + c]);
#pragma unroll
        for (int s = 0; s < S; ++s) {
          const int q = (j - s * DWL) / SW;  // compile-time after unrolling
          if (j >= s * DWL && (j - s * DWL) % SW == 0 && q < PX) {
#pragma unroll
            for (int v = 0; v < KV; ++v) acc[q][v] = fmaf(xv, wr[s][v], acc[q][v]);
          }
        }
      }
    }
  }
}

}  // namespace sc
}  // namespace cuconv

using namespace cuconv;
using namespace cuconv::sc;

extern "C" __global__ void __launch_bounds__(MAX_THREADS, SC_MIN_BLOCKS)
CUCONV_KERNEL_NAME(const elem_t* __restrict__ x, const elem_t* __restrict__ w, const elem_t* bias,
                   const elem_t* residual, elem_t* out, ScGeometry g, EpilogueParams ep) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int cb = KV * g.kg;
  const int taps = g.T * R * S;
  float* sw = reinterpret_cast<float*>(smem);
  elem_t* sx = reinterpret_cast<elem_t*>(smem + ((taps * C * cb * 4 + 15) & ~15));

  int b = blockIdx.x;
  const int tile_q = b % g.tiles_q; b /= g.tiles_q;
  const int tile_p = b % g.tiles_p; b /= g.tiles_p;
  const int o = b % g.O; b /= g.O;
  const int n = b % g.N;
  const int k0 = (b / g.N) * cb;
  const int p0 = tile_p * g.tp, q0 = tile_q * g.tqg * PX;

  // 1. Filter taps of channels k0 .. k0 + cb - 1 (w: [K][taps][C], channels-first [K][C][taps]; one
  //    contiguous run) -> sw[tap][c][k - k0] (zero past K), loads issued in batches before their stores.
  {
    constexpr int BATCH = 8;
    const int per_k = taps * C;
    const int n_all = per_k * cb;
    const int in_range = min(cb, g.K - k0) * per_k;
    const elem_t* src = w + (int64_t)k0 * per_k;
#pragma unroll 1
    for (int i0 = threadIdx.x; i0 < n_all; i0 += BATCH * blockDim.x) {
      float v[BATCH];
#pragma unroll
      for (int j = 0; j < BATCH; ++j) {
        const int i = i0 + j * blockDim.x;
        v[j] = i < in_range ? to_float(src[i]) : 0.f;
      }
#pragma unroll
      for (int j = 0; j < BATCH; ++j) {
        const int i = i0 + j * blockDim.x;
        if (i < n_all) {
          const int kl = i / per_k, e = i - kl * per_k;  // e: (tap, c) channels-last, (c, tap) first
          sw[(CHANNELS_FIRST ? (e % taps) * C + e / taps : e) * cb + kl] = v[j];
        }
      }
    }
  }

  const int kgi = threadIdx.x % g.kg;
  const int pg = threadIdx.x / g.kg;
  const int qg = pg % g.tqg, row = pg / g.tqg;
  float acc[PX][KV];
#pragma unroll
  for (int q = 0; q < PX; ++q)
#pragma unroll
    for (int v = 0; v < KV; ++v) acc[q][v] = 0.f;

  TileOrigin org;
  org.h0 = p0 * g.stride_h - g.pad_h;
  org.w0 = q0 * SW - g.pad_w;
  org.c_lo = 0;
  org.rows = g.in_rows;
  org.cols = g.in_cols;
  org.cin = C;
  const int64_t slice = (int64_t)g.H * g.W * (CHANNELS_FIRST ? 1 : C);  // one input depth slice (of a plane)
  const elem_t* image = x + (int64_t)n * g.D * g.H * g.W * C;
  const int d0 = o * g.stride_d - g.pad_d;
#pragma unroll 1
  for (int t = 0; t < g.T; ++t) {
    const int d = d0 + t * g.dil_d;
    if ((unsigned)d >= (unsigned)g.D) continue;  // a padding slice: the same for the whole CTA
    org.plane = image + d * slice;
    __syncthreads();  // the previous slice is consumed
    // 2. The input tile with its halo.
    if constexpr (CHANNELS_FIRST)
      gather_tile_channels_first<C, 0>(sx, org.plane, (int64_t)g.D * g.H * g.W, org.h0, org.w0, g.in_rows,
                                       g.in_cols, g.div_cols, g.H, g.W, blockDim.x);
    else
      load_input_tile<SC_VIN>(sx, org, g.H, g.W, C, g.div_upp, g.div_cols);
    sm80::cp_async_commit();
    sm80::cp_async_wait<0>();
    __syncthreads();  // the tile (and, the first time, sw) is visible to every thread
    // 3. The multiply-adds.
    accumulate_slice(acc, sx, sw, g, t, kgi, row, qg);
  }

  // 4. Epilogue.
  const int p = p0 + row;
  const int k = k0 + kgi * KV;
  if (p >= g.P || k >= g.K) return;
  const int q_first = q0 + qg * PX;
  if constexpr (CHANNELS_FIRST) {
    const int64_t opq = (int64_t)g.O * g.P * g.Q;
    const int64_t plane0 = ((int64_t)n * g.K + k) * opq + ((int64_t)o * g.P + p) * g.Q + q_first;
    switch (ep.activation) {
      case ACT_RELU: store_outputs_channels_first<ACT_RELU>(acc, bias, residual, out, g, ep, plane0, opq, q_first, k); return;
      case ACT_SILU: store_outputs_channels_first<ACT_SILU>(acc, bias, residual, out, g, ep, plane0, opq, q_first, k); return;
      case ACT_GELU: store_outputs_channels_first<ACT_GELU>(acc, bias, residual, out, g, ep, plane0, opq, q_first, k); return;
      default: store_outputs_channels_first<ACT_NONE>(acc, bias, residual, out, g, ep, plane0, opq, q_first, k); return;
    }
  } else {
    const int64_t row_base = (((int64_t)n * g.O + o) * g.P + p) * g.Q;
    switch (ep.activation) {
      case ACT_RELU: store_outputs<ACT_RELU>(acc, bias, residual, out, g, ep, row_base, q_first, k); break;
      case ACT_SILU: store_outputs<ACT_SILU>(acc, bias, residual, out, g, ep, row_base, q_first, k); break;
      case ACT_GELU: store_outputs<ACT_GELU>(acc, bias, residual, out, g, ep, row_base, q_first, k); break;
      default: store_outputs<ACT_NONE>(acc, bias, residual, out, g, ep, row_base, q_first, k); break;
    }
  }
}
