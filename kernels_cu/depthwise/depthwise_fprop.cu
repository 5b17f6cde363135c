// cuconv: depthwise (channel-wise) convolution forward, 2-D and 3-D, channels-last, as a direct
// memory-bound kernel (the `depthwise_direct` kernel; host: cuconv/backends/depthwise/).
//
// Problem: groups == C, K = mult * C; output channel k reads input channel k / mult only, so a
// layer is R*S (*T) multiply-adds per output element and moves little more than its input and
// output once. It is bound by memory, and by the multiply-adds only for 7x7 filters; the arithmetic
// is fp32 for every dtype (fp16/bf16 values are widened on the way out of shared memory).
//
// CTA: one output tile of TP rows x TQ = TQG * QT columns x CB = VEC * CV output channels, of one
// (image, output depth slice). Grid: one dimension, (chunk, n, o, tile row, tile column) with the
// tile column fastest, so that the CTAs running together share their halos in L2.
//   1. The filter taps of the CTA's CB channels go to shared memory as fp32, [tap][CB].
//   2. Per filter depth t (one pass for conv2d): the input tile with its halo is copied to shared
//      memory (halo_tile.cuh: cp.async, zero-filled padding), so each input byte is read from
//      global memory once per CTA, (tile + halo) / tile times overall.
//   3. Thread (cv, row, column group) owns QT consecutive output pixels of one row x VEC channels:
//      per filter row it takes the row's S weight vectors into registers, then streams the
//      WIN = (QT - 1) * SW + (S - 1) * DW + 1 input vectors of its window, each widened to fp32 once
//      and multiplied into every one of its outputs it reaches (up to min(S, QT)). Registers:
//      QT * VEC accumulators + S * VEC weights + one vector, so 3-4 CTAs of 256 threads fit an SM.
//   4. Epilogue act(alpha * acc + bias + beta * residual) (common/epilogue_math.cuh) from registers,
//      VEC-wide stores: consecutive threads write consecutive channel vectors of one pixel.
//
// Compile-time (host: cuconv.backends.depthwise.variants): dtype, S, SW (stride along W), DW
// (dilation along W), R, VEC (channels per thread: 4), VIN (channels per input copy), QT, MULT1,
// MIN_BLOCKS (the __launch_bounds__ occupancy: 3, or 2 where 80 registers would spill)
// (multiplier 1: vector reads of the input window). Everything else is run-time (DwGeometry).
#include "common/types.cuh"
#include "common/epilogue_math.cuh"
#include "common/fast_div.cuh"
#include "depthwise/vec_io.cuh"
#include "depthwise/halo_tile.cuh"

#ifndef DW_R
#define DW_R 3
#endif
#ifndef DW_S
#define DW_S 3
#endif
#ifndef DW_SW
#define DW_SW 1
#endif
#ifndef DW_DW
#define DW_DW 1
#endif
#ifndef DW_VEC
#define DW_VEC 8
#endif
#ifndef DW_VIN
#define DW_VIN DW_VEC
#endif
#ifndef DW_QT
#define DW_QT 4
#endif
#ifndef DW_MULT1
#define DW_MULT1 1
#endif
#ifndef DW_MIN_BLOCKS
#define DW_MIN_BLOCKS 3  // CTAs of 256 threads per SM the registers must allow (3: <= 80 registers)
#endif
#ifndef CUCONV_KERNEL_NAME
#define CUCONV_KERNEL_NAME depthwise_fprop
#endif

namespace cuconv {
namespace dw {

constexpr int R = DW_R, S = DW_S, SW = DW_SW, DWL = DW_DW, VEC = DW_VEC, QT = DW_QT;
constexpr int WIN = (QT - 1) * SW + (S - 1) * DWL + 1;  // input columns one thread reads per filter row
constexpr int MAX_THREADS = 256;                       // CV channel vectors x pixel groups

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
};

// VEC floats of fp32 weights at p (16-byte aligned when VEC >= 4).
__device__ __forceinline__ void load_weights(const float* p, float (&f)[VEC]) {
  if constexpr (VEC % 4 == 0) {
#pragma unroll
    for (int i = 0; i < VEC / 4; ++i) {
      const float4 v = reinterpret_cast<const float4*>(p)[i];
      f[4 * i] = v.x; f[4 * i + 1] = v.y; f[4 * i + 2] = v.z; f[4 * i + 3] = v.w;
    }
  } else {
#pragma unroll
    for (int i = 0; i < VEC; ++i) f[i] = p[i];
  }
}

// The VEC input values thread `cv` multiplies at one tile position (`px`: that pixel's channels).
__device__ __forceinline__ void load_inputs(const elem_t* px, int cv, int mult, float (&f)[VEC]) {
#if DW_MULT1
  load_vec<elem_t, VEC>(px + cv * VEC, f);
#else
#pragma unroll
  for (int v = 0; v < VEC; ++v) f[v] = to_float(px[(cv * VEC + v) / mult]);  // output k reads input k / mult
#endif
}

// acc += this thread's share of one input slice (filter depth t), read from the tile in shared memory.
// Per filter row: the S weight vectors into registers, then the WIN input vectors of the window one
// at a time, each widened once and multiplied into every output it reaches (q * SW + s * DW == j).
__device__ __forceinline__ void accumulate_slice(float (&acc)[QT][VEC], const elem_t* sx, const float* sw,
                                                 const DwGeometry& g, int t, int cv, int row, int qg) {
  const int cb = VEC * g.cv;
  const float* wt = sw + t * R * S * cb + cv * VEC;
#pragma unroll(R <= 5 ? R : 1)  // a 7-row filter's rows one at a time: their loads would not fit the registers
  for (int r = 0; r < R; ++r) {
    const elem_t* src = sx + ((row * g.stride_h + r * g.dil_h) * g.in_cols + qg * QT * SW) * g.cin;
    float wr[S][VEC];
#pragma unroll
    for (int s = 0; s < S; ++s) load_weights(wt + (r * S + s) * cb, wr[s]);
#pragma unroll
    for (int j = 0; j < WIN; ++j) {
      float xv[VEC];
      load_inputs(src + j * g.cin, cv, g.mult, xv);
#pragma unroll
      for (int s = 0; s < S; ++s) {
        const int q = (j - s * DWL) / SW;  // compile-time after unrolling
        if (j >= s * DWL && (j - s * DWL) % SW == 0 && q < QT) {
#pragma unroll
          for (int v = 0; v < VEC; ++v) acc[q][v] = fmaf(xv[v], wr[s][v], acc[q][v]);
        }
      }
    }
  }
}

}  // namespace dw
}  // namespace cuconv

using namespace cuconv;
using namespace cuconv::dw;

extern "C" __global__ void __launch_bounds__(MAX_THREADS, DW_MIN_BLOCKS)
CUCONV_KERNEL_NAME(const elem_t* __restrict__ x, const elem_t* __restrict__ w, const elem_t* bias,
                   const elem_t* residual, elem_t* out, DwGeometry g, EpilogueParams ep) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int cb = VEC * g.cv;
  const int taps = g.T * R * S;
  float* sw = reinterpret_cast<float*>(smem);
  elem_t* sx = reinterpret_cast<elem_t*>(smem + ((taps * cb * 4 + 15) & ~15));

  int b = blockIdx.x;
  const int tile_q = b % g.tiles_q; b /= g.tiles_q;
  const int tile_p = b % g.tiles_p; b /= g.tiles_p;
  const int o = b % g.O; b /= g.O;
  const int n = b % g.N;
  const int k0 = (b / g.N) * cb;
  const int p0 = tile_p * g.tp, q0 = tile_q * g.tqg * QT;

  // 1. Filter taps of channels k0 .. k0 + cb - 1 -> sw[tap][k - k0] (zero past K).
  for (int i = threadIdx.x; i < taps * cb; i += blockDim.x) {
    const int kl = i / taps, tap = i - kl * taps;
    const int k = k0 + kl;
    sw[tap * cb + kl] = k < g.K ? to_float(w[(int64_t)k * taps + tap]) : 0.f;
  }

  const int cv = threadIdx.x % g.cv;
  const int pg = threadIdx.x / g.cv;
  const int qg = pg % g.tqg, row = pg / g.tqg;
  float acc[QT][VEC];
#pragma unroll
  for (int q = 0; q < QT; ++q)
#pragma unroll
    for (int v = 0; v < VEC; ++v) acc[q][v] = 0.f;

  TileOrigin org;
  org.h0 = p0 * g.stride_h - g.pad_h;
  org.w0 = q0 * SW - g.pad_w;
  org.c_lo = k0 / g.mult;
  org.rows = g.in_rows;
  org.cols = g.in_cols;
  org.cin = g.cin;
  const int64_t slice = (int64_t)g.H * g.W * g.C;  // elements of one input depth slice
  const elem_t* image = x + (int64_t)n * g.D * slice;
  const int d0 = o * g.stride_d - g.pad_d;
#pragma unroll 1
  for (int t = 0; t < g.T; ++t) {
    const int d = d0 + t * g.dil_d;
    if ((unsigned)d >= (unsigned)g.D) continue;  // a padding slice: the same for the whole CTA
    org.plane = image + d * slice;
    __syncthreads();  // the previous slice is consumed
    // 2. The input tile with its halo.
    load_input_tile<DW_VIN>(sx, org, g.H, g.W, g.C, g.div_upp, g.div_cols);
    sm80::cp_async_commit();
    sm80::cp_async_wait<0>();
    __syncthreads();  // the tile (and, the first time, sw) is visible to every thread
    // 3. The multiply-adds.
    accumulate_slice(acc, sx, sw, g, t, cv, row, qg);
  }

  // 4. Epilogue.
  const int p = p0 + row;
  const int k = k0 + cv * VEC;
  if (p >= g.P || k >= g.K) return;
  float bv[VEC];
  if (ep.has_bias) load_vec<elem_t, VEC>(bias + k, bv);
  const int64_t row_base = (((int64_t)n * g.O + o) * g.P + p) * g.Q;
#pragma unroll
  for (int q = 0; q < QT; ++q) {
    const int qq = q0 + qg * QT + q;
    if (qq >= g.Q) break;
    const int64_t off = (row_base + qq) * g.K + k;
    float rv[VEC];
    if (ep.has_residual) load_vec<elem_t, VEC>(residual + off, rv);
    float y[VEC];
#pragma unroll
    for (int v = 0; v < VEC; ++v)
      y[v] = apply_epilogue(acc[q][v], ep.has_bias ? bv[v] : 0.f, ep.has_residual ? rv[v] : 0.f, ep);
    store_vec<elem_t, VEC>(out + off, y);
  }
}
