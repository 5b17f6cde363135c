// cuconv: depthwise (channel-wise) convolution forward, 2-D and 3-D, channels-last, as a direct
// memory-bound kernel (the `depthwise_direct` kernel; host: cuconv/backends/depthwise/).
//
// Problem: groups == C, K = mult * C; output channel k reads input channel k / mult only, so a
// layer is R*S (*T) multiply-adds per output element and moves little more than its input and
// output once. It is bound by memory, and by the multiply-adds only for 7x7 filters; the arithmetic
// is fp32 for every dtype (fp16/bf16 values are widened on the way out of shared memory).
//
// Work item: one output tile of TP rows x TQ = TQG * QT columns x CB = VEC * CV output channels, of
// one (image, output depth slice). Items are numbered (chunk, n, o, tile row, tile column) with the
// tile column fastest. The grid is persistent: the host launches as many CTAs as fit the GPU at once
// (or one per item when there are fewer), and CTA b takes the b-th of gridDim.x equal runs of
// consecutive items. So a CTA loads the filter taps of one channel chunk (two where its run crosses
// a chunk boundary), the next item's tile is the neighbour of this one (its halo is in L2), and the
// input tile of the next item streams in while this one computes.
//   1. The filter taps of the chunk's CB channels go to shared memory as fp32, [tap][CB] (again only
//      when a CTA's next item is in another chunk).
//   2. Input slices (one per filter depth t whose input depth lies in the image; one per item for
//      conv2d) are copied into two shared-memory buffers in turn (halo_tile.cuh: cp.async, zero-filled
//      padding): while the CTA computes from one, the next slice, of this item or of the CTA's next
//      item, lands in the other. Each input byte is read from global memory once per item,
//      (tile + halo) / tile times overall.
//   3. Thread (cv, row, column group) owns QT consecutive output pixels of one row x VEC channels:
//      per filter row it takes the row's S weight vectors into registers, then streams the
//      WIN = (QT - 1) * SW + (S - 1) * DW + 1 input vectors of its window, each widened to fp32 once
//      and multiplied into every one of its outputs it reaches (up to min(S, QT)). Registers:
//      QT * VEC accumulators + S * VEC weights + one vector, so 3-4 CTAs of 256 threads fit an SM.
//   4. Epilogue act(alpha * acc + bias + beta * residual) (direct_epilogue.cuh) from registers,
//      with the activation chosen once per item (not per element), VEC-wide stores: consecutive
//      threads write consecutive channel vectors of one pixel.
//
// Compile-time (host: cuconv.backends.depthwise.variants): dtype, S, SW (stride along W), DW
// (dilation along W), R, VEC (channels per thread: 4, or 2 for 16-bit filters 7+ wide), VIN
// (channels per input copy), QT, MULT1 (multiplier 1: vector reads of the input window), MIN_BLOCKS
// (the __launch_bounds__ occupancy: 3, or 2 where 80 registers would spill), CB (output channels
// per chunk) and CIN (the tile's channels per pixel), so that the multiply-adds' shared-memory loads
// take immediate offsets. Everything else is run-time (DwGeometry).
#include "common/types.cuh"
#include "common/epilogue_math.cuh"
#include "common/fast_div.cuh"
#include "depthwise/vec_io.cuh"
#include "depthwise/halo_tile.cuh"
#include "depthwise/direct_epilogue.cuh"
#include "depthwise/work_item.cuh"

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
#ifndef DW_CB
#define DW_CB 64  // output channels per chunk (VEC x the chunk's channel vectors)
#endif
#ifndef DW_CIN
#define DW_CIN DW_CB  // input channels per tile pixel (DW_CB / multiplier)
#endif
#ifndef CUCONV_KERNEL_NAME
#define CUCONV_KERNEL_NAME depthwise_fprop
#endif

namespace cuconv {
namespace dw {

constexpr int R = DW_R, S = DW_S, SW = DW_SW, DWL = DW_DW, VEC = DW_VEC, QT = DW_QT;
constexpr int CB = DW_CB, CIN = DW_CIN;  // the chunk's output channels, the tile's channels per pixel
constexpr int WIN = (QT - 1) * SW + (S - 1) * DWL + 1;  // input columns one thread reads per filter row
constexpr int MAX_THREADS = 256;                       // CV channel vectors x pixel groups

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
  const float* wt = sw + t * R * S * CB + cv * VEC;
  const elem_t* src0 = sx + (row * g.stride_h * g.in_cols + qg * QT * SW) * CIN;
  const int row_step = g.dil_h * g.in_cols * CIN;  // elements from one filter row's input row to the next
#pragma unroll(R <= 5 ? R : 1)  // a 7-row filter's rows one at a time: their loads would not fit the registers
  for (int r = 0; r < R; ++r) {
    const elem_t* src = src0 + r * row_step;
    float wr[S][VEC];
#pragma unroll
    for (int s = 0; s < S; ++s) load_weights(wt + (r * S + s) * CB, wr[s]);
#pragma unroll
    for (int j = 0; j < WIN; ++j) {
      float xv[VEC];
      load_inputs(src + j * CIN, cv, g.mult, xv);
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

// The chunk's filter taps, channels k0 .. k0 + cb - 1 of w [K][taps] (one contiguous run), into
// sw[tap][k - k0] as fp32 (zero past K). Each thread issues TAP_BATCH loads before it stores any, so a
// chunk costs a few memory latencies, not one per element.
constexpr int TAP_BATCH = 8;

__device__ __forceinline__ void load_taps(float* sw, const elem_t* w, const DwGeometry& g, int k0, int cb, int taps) {
  const int n = taps * cb;
  const int in_range = min(cb, g.K - k0) * taps;
  const elem_t* src = w + (int64_t)k0 * taps;
#pragma unroll 1
  for (int i0 = threadIdx.x; i0 < n; i0 += TAP_BATCH * blockDim.x) {
    float v[TAP_BATCH];
#pragma unroll
    for (int j = 0; j < TAP_BATCH; ++j) {
      const int i = i0 + j * blockDim.x;
      v[j] = i < in_range ? to_float(src[i]) : 0.f;
    }
#pragma unroll
    for (int j = 0; j < TAP_BATCH; ++j) {
      const int i = i0 + j * blockDim.x;
      if (i < n) {
        const int kl = g.T == 1 ? i / (R * S) : i / taps;  // conv2d: a compile-time divisor
        sw[(i - kl * taps) * cb + kl] = v[j];
      }
    }
  }
}

// The first filter depth t >= from whose input depth lies in the image for output depth slice o, or
// T when none does (conv2d: t = 0, then T).
__device__ __forceinline__ int next_slice(const DwGeometry& g, int o, int from) {
  const int d0 = o * g.stride_d - g.pad_d;
  for (int t = from; t < g.T; ++t)
    if ((unsigned)(d0 + t * g.dil_d) < (unsigned)g.D) return t;
  return g.T;
}

// The slice the CTA computes after (item, t): the item's next one, else the first slice of its next
// item that has one. `item` >= end (the end of the CTA's run): none.
struct Stage {
  int item, t;
};

__device__ __forceinline__ Stage next_stage(const DwGeometry& g, int item, int t, int end) {
  if (g.T == 1 && g.D == 1 && g.pad_d == 0) return {t < 0 ? item : item + 1, 0};  // conv2d
  t = next_slice(g, decode_item<QT>(g, item).o, t + 1);
  while (t == g.T) {
    if (++item >= end) break;
    t = next_slice(g, decode_item<QT>(g, item).o, 0);
  }
  return {item, t};
}

// Issue (without waiting) the copies of stage `st`'s input slice into `buf`.
__device__ __forceinline__ void load_stage(elem_t* buf, const elem_t* x, const DwGeometry& g, const Stage& st) {
  const Item it = decode_item<QT>(g, st.item);
  TileOrigin org;
  org.h0 = it.p0 * g.stride_h - g.pad_h;
  org.w0 = it.q0 * SW - g.pad_w;
  org.c_lo = it.chunk * g.cin;  // the chunk's cb = mult * cin outputs read cin input channels
  org.rows = g.in_rows;
  org.cols = g.in_cols;
  org.cin = g.cin;
  const int64_t slice = (int64_t)g.H * g.W * g.C;  // elements of one input depth slice
  const int d = it.o * g.stride_d - g.pad_d + st.t * g.dil_d;
  org.plane = x + ((int64_t)it.n * g.D + d) * slice;
  load_input_tile<DW_VIN>(buf, org, g.H, g.W, g.C, g.div_upp, g.div_cols);
}

}  // namespace dw
}  // namespace cuconv

using namespace cuconv;
using namespace cuconv::dw;

extern "C" __global__ void __launch_bounds__(MAX_THREADS, DW_MIN_BLOCKS)
CUCONV_KERNEL_NAME(const elem_t* __restrict__ x, const elem_t* __restrict__ w, const elem_t* bias,
                   const elem_t* residual, elem_t* out, DwGeometry g, EpilogueParams ep) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int taps = g.T * R * S;
  float* sw = reinterpret_cast<float*>(smem);
  const int taps_bytes = (taps * CB * 4 + 15) & ~15;
  const int tile_bytes = (g.in_rows * g.in_cols * CIN * (int)sizeof(elem_t) + 15) & ~15;
  elem_t* const sx0 = reinterpret_cast<elem_t*>(smem + taps_bytes);  // buffer b: sx0 + b * tile_elems
  const int tile_elems = tile_bytes / (int)sizeof(elem_t);
  const int64_t total = (int64_t)((g.K + CB - 1) / CB) * g.N * g.O * g.tiles_p * g.tiles_q;
  const int begin = (int)(total * blockIdx.x / gridDim.x), end = (int)(total * (blockIdx.x + 1) / gridDim.x);

  constexpr int ncv = CB / VEC;  // channel vectors per chunk
  const int cv = threadIdx.x % ncv;
  const int pg = threadIdx.x / ncv;
  const int qg = pg % g.tqg, row = pg / g.tqg;

  // The CTA's first slice in flight before the loop; then each slice starts the next one's copies.
  const Stage first = next_stage(g, begin, -1, end);
  if (first.item < end) load_stage(sx0, x, g, first);
  sm80::cp_async_commit();
  int buf = 0;
  int taps_chunk = -1;  // the chunk whose taps are in sw

#pragma unroll 1
  for (int item = begin; item < end; ++item) {
    const Item head = decode_item<QT>(g, item);
    // 1. Filter taps of channels k0 .. k0 + CB - 1 -> sw[tap][k - k0] (zero past K).
    if (head.chunk != taps_chunk) {
      __syncthreads();  // every thread is done with the previous chunk's taps
      load_taps(sw, w, g, head.chunk * CB, CB, taps);
      taps_chunk = head.chunk;
    }
    float acc[QT][VEC];
#pragma unroll
    for (int q = 0; q < QT; ++q)
#pragma unroll
      for (int v = 0; v < VEC; ++v) acc[q][v] = 0.f;

#pragma unroll 1
    for (int t = next_slice(g, head.o, 0); t < g.T; t = next_slice(g, head.o, t + 1)) {
      // This stage's slice is the one in flight in buffer `buf`.
      const Stage next = next_stage(g, item, t, end);
      sm80::cp_async_wait<0>();
      __syncthreads();  // the slice (and new taps) visible to all; buffer buf ^ 1 no longer read
      // 2. The next slice's copies, into the other buffer, while this one computes.
      if (next.item < end) load_stage(sx0 + (buf ^ 1) * tile_elems, x, g, next);
      sm80::cp_async_commit();
      // 3. The multiply-adds.
      accumulate_slice(acc, sx0 + buf * tile_elems, sw, g, t, cv, row, qg);
      buf ^= 1;
    }

    // 4. Epilogue (the item decoded again: its coordinates need not live through the slices' loop).
    const Item it = decode_item<QT>(g, item);
    const int p = it.p0 + row;
    const int k = it.chunk * CB + cv * VEC;
    if (p >= g.P || k >= g.K) continue;
    const int64_t row_base = (((int64_t)it.n * g.O + it.o) * g.P + p) * g.Q;
    const int q_first = it.q0 + qg * QT;
    switch (ep.activation) {
      case ACT_RELU: store_outputs<ACT_RELU>(acc, bias, residual, out, g, ep, row_base, q_first, k); break;
      case ACT_SILU: store_outputs<ACT_SILU>(acc, bias, residual, out, g, ep, row_base, q_first, k); break;
      case ACT_GELU: store_outputs<ACT_GELU>(acc, bias, residual, out, g, ep, row_base, q_first, k); break;
      default: store_outputs<ACT_NONE>(acc, bias, residual, out, g, ep, row_base, q_first, k); break;
    }
  }
}
