// cuconv: dense conv2d with few output channels (K <= 8: the last layer of a decoder or a UNet, a
// prediction head) and many input channels, channels-last, as a direct kernel with fp32
// multiply-adds (the `narrowk_direct` kernel; host: cuconv.backends.narrowk).
//
// An implicit GEMM pads N = K to its narrowest tile (16 or 64 columns) and reads every A byte from
// shared memory once per product of that tile: at K = 3 the tensor cores multiply mostly zeros, and
// a float32 split into three bf16 products triples that. Here the reduction (C x R x S) runs across
// the lanes instead:
//
//   A group of UL lanes owns PX consecutive output pixels of one row x KV output channels (KV >= K,
//   the extra ones zero). Lane u of the group takes the 16-byte channel vectors u, u + UL, ... of
//   each input pixel, so a group's load of one pixel is one contiguous run of channels. Per filter
//   row r and channel vector it loads the WIN = (PX - 1) * SW + (S - 1) * DW + 1 input vectors of its
//   window once and, per filter column s, the KV weight vectors of that (r, s), and multiplies every
//   input value into each output it reaches: S * PX * KV multiply-adds per value of the vector.
//   At the end the group's UL partial sums of its PX * KV outputs are reduce-scattered over the
//   lanes (butterfly shuffles; each stage halves the values a lane holds), so lane u holds
//   PX * KV / UL finished sums, which it stores through the epilogue.
//
// CTA: WARPS warps, one output row each (consecutive rows: the input rows they share are read from
// L1), each warp 32 / UL groups side by side along W. Grid: (image, row block, column block), the
// column block fastest. Weights are read straight from global memory (ld.global.nc: every warp of
// the SM reads the same few kilobytes, which stay in L1).
//
// Compile-time (host: cuconv.backends.narrowk.variants): dtype (the host runs float32 only; 16-bit
// data builds too, and is slower there than the tensor-core kernels), S, SW (stride along W), DW
// (dilation along W), KV, PX, UL, WARPS and MIN_BLOCKS (the __launch_bounds__). Run-time: NkGeometry.
#include "common/types.cuh"
#include "common/epilogue_math.cuh"

#ifndef NK_S
#define NK_S 3
#endif
#ifndef NK_SW
#define NK_SW 1
#endif
#ifndef NK_DW
#define NK_DW 1
#endif
#ifndef NK_KV
#define NK_KV 4
#endif
#ifndef NK_PX
#define NK_PX 8
#endif
#ifndef NK_UL
#define NK_UL 32
#endif
#ifndef NK_WARPS
#define NK_WARPS 8
#endif
#ifndef NK_MIN_BLOCKS  // CTAs per SM the registers must allow
#define NK_MIN_BLOCKS 1
#endif
#ifndef CUCONV_KERNEL_NAME
#define CUCONV_KERNEL_NAME narrowk_fprop
#endif

namespace cuconv {
namespace nk {

constexpr int S = NK_S, SW = NK_SW, DWL = NK_DW, KV = NK_KV, PX = NK_PX, UL = NK_UL, WARPS = NK_WARPS;
constexpr int VEC = 16 / (int)sizeof(elem_t);  // channels per 16-byte vector
constexpr int WIN = (PX - 1) * SW + (S - 1) * DWL + 1;
constexpr int OUTS = PX * KV;                   // outputs of one group
constexpr int PER_LANE = OUTS / UL;             // finished sums per lane after the reduce-scatter
static_assert(UL == 4 || UL == 8 || UL == 16 || UL == 32, "lanes per group: a power of two dividing the warp");
static_assert(OUTS % UL == 0 && (OUTS & (OUTS - 1)) == 0, "the reduce-scatter halves PX * KV values per stage");

// The run-time geometry (cuconv.backends.narrowk.variants.nk_geometry builds it; same field order).
struct NkGeometry {
  int N, H, W, C, K;        // input extents and channels; output channels
  int P, Q, R;              // output extents; filter rows (S is compile-time)
  int stride_h, dil_h;      // along H (along W: compile-time)
  int pad_h, pad_w;         // padding before H and W
  int units;                // C / VEC: channel vectors per pixel
  int row_blocks, col_blocks;  // CTAs per image: ceil(P / WARPS) x ceil(Q / (PX * 32 / UL))
};

__device__ __forceinline__ uint4 ldg16(const elem_t* p) { return __ldg(reinterpret_cast<const uint4*>(p)); }

// Channel i (< VEC) of a 16-byte vector of T, as fp32.
template <typename T>
__device__ __forceinline__ float channel(const uint4& v, int i) {
  const uint32_t word = i / (VEC / 4) == 0 ? v.x : i / (VEC / 4) == 1 ? v.y : i / (VEC / 4) == 2 ? v.z : v.w;
  if constexpr (VEC == 4) {
    return __uint_as_float(word);
  } else {
    T e;
    e.bits = (uint16_t)((i & 1) ? (word >> 16) : (word & 0xFFFF));
    return to_float(e);
  }
}

__device__ __forceinline__ float shfl_xor_f(float v, int mask) { return __shfl_xor_sync(0xffffffffu, v, mask); }

// One reduce-scatter stage over lane bit M (the values v[0 .. 2 * HALF)), then the next; see the
// kernel's end.
template <int M, int HALF>
__device__ __forceinline__ void reduce_scatter(float (&v)[OUTS], int u) {
  if constexpr (M >= 1) {
    const bool upper = (u & M) != 0;
#pragma unroll
    for (int i = 0; i < HALF; ++i) {
      const float send = upper ? v[i] : v[i + HALF];
      const float keep = upper ? v[i + HALF] : v[i];
      v[i] = keep + shfl_xor_f(send, M);
    }
    reduce_scatter<M / 2, HALF / 2>(v, u);
  }
}

}  // namespace nk
}  // namespace cuconv

using namespace cuconv;
using namespace cuconv::nk;

extern "C" __global__ void __launch_bounds__(WARPS * 32, NK_MIN_BLOCKS)
CUCONV_KERNEL_NAME(const elem_t* __restrict__ x, const elem_t* __restrict__ w, const elem_t* bias,
                   const elem_t* residual, elem_t* out, NkGeometry g, EpilogueParams ep) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int u = lane % UL;              // this lane's place in its group
  const int grp = lane / UL;            // the group's place in the warp
  int b = blockIdx.x;
  const int cblk = b % g.col_blocks; b /= g.col_blocks;
  const int rblk = b % g.row_blocks;
  const int n = b / g.row_blocks;
  const int p = rblk * WARPS + warp;
  const int q0 = (cblk * (32 / UL) + grp) * PX;
  const bool row_ok = p < g.P;  // a warp past the last row loads nothing and stores nothing

  float acc[PX][KV];
#pragma unroll
  for (int q = 0; q < PX; ++q)
#pragma unroll
    for (int k = 0; k < KV; ++k) acc[q][k] = 0.f;

  if (row_ok && q0 < g.Q) {
    const int w_first = q0 * SW - g.pad_w;  // input column of window position 0
    const long long img = (long long)n * g.H;
    const int RSC = g.R * S * g.C;          // elements of one output channel's filter
#pragma unroll 1
    for (int r = 0; r < g.R; ++r) {
      const int h = p * g.stride_h - g.pad_h + r * g.dil_h;
      if ((unsigned)h >= (unsigned)g.H) continue;
      const elem_t* xrow = x + (img + h) * g.W * (long long)g.C;
      const elem_t* wr = w + (long long)r * S * g.C;
#pragma unroll 1
      for (int cu = u; cu < g.units; cu += UL) {
        const int c0 = cu * VEC;
        uint4 xv[WIN];
#pragma unroll
        for (int j = 0; j < WIN; ++j) {
          const int col = w_first + j;
          xv[j] = (unsigned)col < (unsigned)g.W ? ldg16(xrow + (long long)col * g.C + c0) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int s = 0; s < S; ++s) {
          uint4 wv[KV];
#pragma unroll
          for (int k = 0; k < KV; ++k) {
            wv[k] = k < g.K ? ldg16(wr + (long long)k * RSC + s * g.C + c0) : make_uint4(0, 0, 0, 0);
          }
#pragma unroll
          for (int i = 0; i < VEC; ++i) {
            float wf[KV];
#pragma unroll
            for (int k = 0; k < KV; ++k) wf[k] = channel<elem_t>(wv[k], i);
#pragma unroll
            for (int q = 0; q < PX; ++q) {
              const float xf = channel<elem_t>(xv[q * SW + s * DWL], i);
#pragma unroll
              for (int k = 0; k < KV; ++k) acc[q][k] = fmaf(xf, wf[k], acc[q][k]);
            }
          }
        }
      }
    }
  }

  // Reduce-scatter over the group's UL lanes: at the stage of lane bit m, a lane keeps the upper
  // half of its values when its bit m is set (else the lower) and receives the partner's share of
  // that half. After the last stage lane u holds outputs u * PER_LANE .. u * PER_LANE + PER_LANE - 1
  // of the group (output o = q * KV + k).
  float v[OUTS];
#pragma unroll
  for (int q = 0; q < PX; ++q)
#pragma unroll
    for (int k = 0; k < KV; ++k) v[q * KV + k] = acc[q][k];
  reduce_scatter<UL / 2, OUTS / 2>(v, u);
  if (!row_ok) return;
  const long long row_base = ((long long)n * g.P + p) * g.Q;
#pragma unroll
  for (int i = 0; i < PER_LANE; ++i) {
    const int o = u * PER_LANE + i;
    const int q = q0 + o / KV, k = o % KV;
    if (q < g.Q && k < g.K) {
      const long long at = (row_base + q) * g.K + k;
      const float bv = ep.has_bias ? to_float(bias[k]) : 0.f;
      const float rv = ep.has_residual ? to_float(residual[at]) : 0.f;
      out[at] = from_float<elem_t>(apply_epilogue(v[i], bv, rv, ep));
    }
  }
}
