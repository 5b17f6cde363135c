// cuconv (HIP): depthwise (channel-wise) convolution forward, 2-D and 3-D, channels-last, on AMD CDNA3
// (gfx942) and CDNA2 (gfx90a): the `cdna3_depthwise` kernel (host: cuconv/backends/cdna3/depthwise.py),
// the counterpart of kernels_cu/depthwise/depthwise_fprop.cu with the same tiling and parameter struct.
//
// Problem: groups == C, K = mult * C; output channel k reads input channel k / mult only, so a layer
// does R*S (*T) multiply-adds per output element and is bound by memory. The arithmetic is fp32 for
// every dtype (fp16 / bf16 values are widened on the way out of LDS).
//
// Workgroup: one output tile of TP rows x TQ = TQG * QT columns x CB = VEC * CV output channels, of one
// (image, output depth slice); cv * tp * tqg work-items (at most 256 = 4 waves of 64; the mapping
// holds for any count, a last wave may be partial). Grid: one dimension, (chunk, n, o, tile row, tile
// column) with the tile column fastest, so workgroups running together share their halos in L2.
//   1. The filter taps of the workgroup's CB channels go to LDS as fp32, [tap][CB].
//   2. Per filter depth t (one pass for conv2d): the input tile with its halo goes to LDS (halo_tile.h:
//      buffer loads, the padding read as zeros through the resource's num_records), so each input
//      byte is read from global memory once per workgroup, (tile + halo) / tile times overall.
//   3. Work-item (cv, row, column group) owns QT consecutive output pixels of one row x VEC channels:
//      per filter row it reads a window of WIN = (QT - 1) * SW + (S - 1) * DW + 1 input vectors from
//      LDS into registers and does S * QT * VEC fp32 multiply-adds with it, the weights coming from
//      LDS as 16-byte reads.
//   4. Epilogue act(alpha * acc + bias + beta * residual) (common/epilogue_math.h) from registers,
//      VEC-wide global stores (16 bytes when VEC * sizeof(elem) = 16).
// LDS reads are conflict-free when CV = 8 and VEC * sizeof(elem) = 16: 8 consecutive lanes read one
// pixel's 128 bytes, every bank once. The index math is common/depthwise_index.h.
//
// Compile-time (host: cuconv.backends.depthwise.variants.dw_variant, shared with the CUDA kernel):
// CUCONV_DTYPE (0 fp16, 1 bf16, 2 fp32), DW_R, DW_S, DW_SW (stride along W), DW_DW (dilation along W),
// DW_VEC (channels per work-item), DW_VIN (channels per copy unit), DW_QT, DW_MULT1 (multiplier 1:
// vector reads of the window), CUCONV_KERNEL_NAME. Everything else is run-time (DwGeometry).
// LDS is dynamic: the host launches with cfg.smem bytes (fp32 taps, then the tile), at most 64 KiB.
#ifndef CUCONV_DTYPE
#define CUCONV_DTYPE 1
#endif
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
#ifndef CUCONV_KERNEL_NAME
#define CUCONV_KERNEL_NAME depthwise_fprop
#endif


#include "common/hip_min.h"
#include "common/types.h"
#include "common/epilogue_math.h"
#include "common/depthwise_index.h"
#include "depthwise/vec_io.h"
#include "depthwise/halo_tile.h"

// An empty asm that makes x opaque to the optimiser (see accumulate_slice). The second spelling is for
// the CPU build of this file (tests/test_cdna3_depthwise_emulation.py), where "v" is no VGPR.
#if defined(__AMDGCN__)
#define DW_OPAQUE(x) asm volatile("" : "+v"(x))
#else
#define DW_OPAQUE(x) asm volatile("" : "+r"(x))
#endif

namespace cuconv {
namespace dw {

constexpr int R = DW_R, S = DW_S, SW = DW_SW, DWL = DW_DW, VEC = DW_VEC, VIN = DW_VIN, QT = DW_QT;
constexpr int WIN = (QT - 1) * SW + (S - 1) * DWL + 1;  // window columns one work-item reads per filter row
constexpr int MAX_THREADS = 256;                       // cv <= 8 channel vectors x <= 32 pixel groups
static_assert(VEC * sizeof(elem_t) <= 16 && VIN * sizeof(elem_t) <= 16, "vectors are at most 16 bytes");

// VEC fp32 weights at p (16-byte aligned when VEC >= 4: the weights start at LDS byte 0, rows of cb floats).
CUCONV_DEV void load_weights(const float* p, float (&f)[VEC]) {
  if constexpr (VEC % 4 == 0) {
#pragma unroll
    for (int i = 0; i < VEC / 4; ++i) {
      typedef float f32x4 __attribute__((ext_vector_type(4)));
      const f32x4 v = reinterpret_cast<const f32x4*>(p)[i];
      f[4 * i] = v.x; f[4 * i + 1] = v.y; f[4 * i + 2] = v.z; f[4 * i + 3] = v.w;
    }
  } else {
#pragma unroll
    for (int i = 0; i < VEC; ++i) f[i] = p[i];
  }
}

// The VEC input values a work-item multiplies at one tile pixel (`px`: that pixel's channels). With
// multiplier 1 they are one vector, channels cv * VEC ..; otherwise lane v reads channel chan[v].
CUCONV_DEV void load_inputs(const elem_t* px, int cv, const int (&chan)[VEC], float (&f)[VEC]) {
#if DW_MULT1
  (void)chan;
  load_vec<elem_t, VEC>(px + cv * VEC, f);
#else
  (void)cv;
#pragma unroll
  for (int v = 0; v < VEC; ++v) f[v] = to_float(px[chan[v]]);
#endif
}

// acc += this work-item's share of one input slice (filter depth t), read from the tile in LDS.
// `chan`: dw_input_channel of each lane (used when the multiplier is not 1).
//
// The filter-row loop stays rolled: unrolled, the compiler hoists every window address of every row
// out of the depth loop and runs out of VGPRs (7x7 bf16: 224 VGPRs unrolled, about 100 rolled). For
// the same reason the per-lane channels are passed through an empty asm once per row: the LDS
// addresses pixel + chan[v] then stay inside the loop instead of WIN * VEC of them living across it.
CUCONV_DEV void accumulate_slice(float (&acc)[QT][VEC], const elem_t* sx, const float* sw, const DwGeometry& g,
                                 int t, const DwThread& th, const int (&chan)[VEC]) {
  const int cb = dw_chunk_channels(g, VEC);
#pragma unroll 1
  for (int r = 0; r < R; ++r) {
    const elem_t* src = sx + dw_window_base(g, th, r, QT, SW);
    int ch[VEC];
#pragma unroll
    for (int v = 0; v < VEC; ++v) {
      ch[v] = chan[v];
#if !DW_MULT1
      DW_OPAQUE(ch[v]);
#endif
    }
    float win[WIN][VEC];
#pragma unroll
    for (int j = 0; j < WIN; ++j) load_inputs(src + j * g.cin, th.cv, ch, win[j]);
#pragma unroll
    for (int s = 0; s < S; ++s) {
      float wv[VEC];
      load_weights(sw + dw_tap_slot(t, r, s, R, S, cb) + th.cv * VEC, wv);
#pragma unroll
      for (int q = 0; q < QT; ++q)
#pragma unroll
        for (int v = 0; v < VEC; ++v)
          acc[q][v] = __builtin_fmaf(win[dw_window_col(q, s, SW, DWL)][v], wv[v], acc[q][v]);
    }
  }
}

}  // namespace dw
}  // namespace cuconv

using namespace cuconv;
using namespace cuconv::dw;

extern __shared__ __attribute__((aligned(16))) unsigned char dw_lds[];

extern "C" __global__ void __launch_bounds__(MAX_THREADS)
CUCONV_KERNEL_NAME(const elem_t* __restrict__ x, const elem_t* __restrict__ w, const elem_t* bias,
                   const elem_t* residual, elem_t* out, DwGeometry g, EpilogueParams ep) {
  const int cb = dw_chunk_channels(g, VEC);
  const int taps = g.T * R * S;
  float* sw = reinterpret_cast<float*>(dw_lds);
  elem_t* sx = reinterpret_cast<elem_t*>(dw_lds + dw_weight_bytes(g, R * S, VEC));
  const int tid = (int)thread_id_x();
  const int threads = dw_threads(g);

  const DwBlock blk = dw_block(g, block_id_x());
  const DwTileOrigin org = dw_tile_origin(g, blk, VEC, QT, SW);

  // 1. Filter taps of channels k0 .. k0 + cb - 1 -> sw[tap][k - k0] (zero past K).
  for (int i = tid; i < taps * cb; i += threads) {
    const DwWeightSlot ws = dw_weight_slot(i, taps, cb);
    const int k = org.k0 + ws.kl;
    sw[ws.slot] = k < g.K ? to_float(w[(i64)k * taps + ws.tap]) : 0.f;
  }

  const DwThread th = dw_thread(g, tid);
  int chan[VEC];
#pragma unroll
  for (int v = 0; v < VEC; ++v) chan[v] = DW_MULT1 ? th.cv * VEC + v : dw_input_channel(th.cv, v, VEC, g.mult);
  float acc[QT][VEC];
#pragma unroll
  for (int q = 0; q < QT; ++q)
#pragma unroll
    for (int v = 0; v < VEC; ++v) acc[q][v] = 0.f;

  const i64 slice = (i64)g.H * g.W * g.C;  // elements of one input depth slice
  const elem_t* image = x + (i64)blk.n * g.D * slice;
#pragma unroll 1
  for (int t = 0; t < g.T; ++t) {
    const int d = dw_input_depth(g, blk.o, t);
    if ((unsigned)d >= (unsigned)g.D) continue;  // a padding slice: the same for the whole workgroup
    workgroup_barrier();  // the previous slice is consumed
    // 2. The input tile with its halo.
    load_input_tile<elem_t, VIN>(sx, image + d * slice, g, org, tid, threads);
    workgroup_barrier();  // the tile (and, the first time, sw) is visible to every work-item
    // 3. The multiply-adds.
    accumulate_slice(acc, sx, sw, g, t, th, chan);
  }

  // 4. Epilogue.
  const DwOutputPixel first = dw_output_pixel(org, th, 0, VEC, QT);
  if (first.p >= g.P || first.k >= g.K) return;
  float bv[VEC];
  if (ep.has_bias) load_vec<elem_t, VEC>(bias + first.k, bv);
#pragma unroll
  for (int j = 0; j < QT; ++j) {
    const DwOutputPixel px = dw_output_pixel(org, th, j, VEC, QT);
    if (px.q >= g.Q) break;
    const i64 off = dw_output_offset(g, blk.n, blk.o, px.p, px.q, px.k);
    float rv[VEC];
    if (ep.has_residual) load_vec<elem_t, VEC>(residual + off, rv);
    float y[VEC];
#pragma unroll
    for (int v = 0; v < VEC; ++v)
      y[v] = apply_epilogue(acc[j][v], ep.has_bias ? bv[v] : 0.f, ep.has_residual ? rv[v] : 0.f, ep);
    store_vec<elem_t, VEC>(out + off, y);
  }
}
