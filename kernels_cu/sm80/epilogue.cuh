// cuconv sm80: accumulator -> out, with act(alpha * acc + bias + beta * residual).
//
// mma.sync m16n8k16 accumulator layout, per thread: acc[mi][ni][e] with e = 2 * half + j at
//   row = 16 mi + lane / 4 + 8 half,  col = 8 ni + 2 (lane % 4) + j      (inside the warp tile)
// That layout scatters a row over four lanes, two elements each, so storing straight from it
// writes 4-byte pieces. Instead each warp re-shapes its tile through shared memory (the operand
// ring, free once the mainloop has drained), one 16-row block at a time and without any CTA
// barrier: the warp writes acc[mi] as fp32 rows, then every lane takes 8 consecutive columns of a
// row, applies the epilogue and stores them as one 16-byte vector (8 lanes = one 128-byte row
// segment). The per-element work sits in one loop body, not unrolled over the whole tile, which
// keeps the kernel's code small (the fully unrolled version had ~40 K instructions and stalled on
// instruction fetch).
//
// Each output element is read (residual) and written (out) by the same lane, so `residual` may
// be `out` itself. `out_vec` (host-checked alignment of out / residual / bias, row pitch and column
// base) is the widest access allowed: 8 elements (16 bytes), 2 (4 bytes) or 1.
#pragma once
#include "common/epilogue_math.cuh"
#include "common/types.cuh"

#ifndef CUCONV_TF32
#define CUCONV_TF32 0
#endif

namespace cuconv {
namespace sm80 {

// The output (bias, residual) element type: the operands' own, or float32 for CUCONV_TF32.
#if CUCONV_TF32
typedef float out_t;
#else
typedef elem_t out_t;
#endif

struct OutputView {
  out_t* out;                // out[row * ldo + col_base + col]
  const out_t* residual;     // same indexing; may alias out
  const out_t* bias;         // bias[col_base + col]
  long long rows;            // valid rows (M)
  int cols;                  // valid columns of this CTA's group (Kg or N)
  long long ldo;
  int col_base;              // g * Kg for a grouped conv, 0 otherwise
  int out_vec;               // 8, 2 or 1 elements per access (alignment, see above; float32: 8 = two
                             // 16-byte vectors, 2 = one 8-byte pair)
};

// Shared memory the staging needs: one 16-row fp32 block per warp, rows padded by 8 floats so
// that the fragment writes of the eight rows of a half-warp hit different banks.
template <int WARP_N, int WARPS>
struct EpilogueStaging {
  static constexpr int kPitch = WARP_N + 8;  // floats
  static constexpr int kWarpFloats = 16 * kPitch;
  static constexpr int kBytes = WARPS * kWarpFloats * 4;
};

// act() of 8 values, the activation switch taken once for all of them.
__device__ __forceinline__ void activate8(float (&v)[8], int act) {
  switch (act) {
    case ACT_NONE: break;
    case ACT_RELU:
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] = v[j] > 0.f ? v[j] : 0.f;
      break;
    case ACT_SILU:
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] = activate(v[j], ACT_SILU);
      break;
    case ACT_GELU:
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] = activate(v[j], ACT_GELU);
      break;
    default: break;
  }
}

// Epilogue of 8 consecutive columns [col, col + 8) of one output row, accumulators in v.
__device__ __forceinline__ void store8(const float (&acc)[8], const OutputView& o, const EpilogueParams& ep,
                                       long long row, long long col) {
  if (row >= o.rows || col >= o.cols) return;
  const long long idx = row * o.ldo + o.col_base + col;
  if (o.out_vec == 8 && col + 8 <= o.cols) {
    // Whole vector: bias and residual gathered once, then branch-free arithmetic.
    float v[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = ep.alpha * acc[j];
    if (ep.has_bias) {
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] += to_float(o.bias[o.col_base + col + j]);
    }
    if constexpr (sizeof(out_t) == 4) {
      if (ep.has_residual) {
        const float4 lo = *reinterpret_cast<const float4*>(o.residual + idx);
        const float4 hi = *reinterpret_cast<const float4*>(o.residual + idx + 4);
        const float re[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
#pragma unroll
        for (int j = 0; j < 8; ++j) v[j] += ep.beta * re[j];
      }
      activate8(v, ep.activation);
      *reinterpret_cast<float4*>(o.out + idx) = make_float4(v[0], v[1], v[2], v[3]);
      *reinterpret_cast<float4*>(o.out + idx + 4) = make_float4(v[4], v[5], v[6], v[7]);
    } else {
      if (ep.has_residual) {
        const uint4 raw = *reinterpret_cast<const uint4*>(o.residual + idx);
        const elem_t* re = reinterpret_cast<const elem_t*>(&raw);
#pragma unroll
        for (int j = 0; j < 8; ++j) v[j] += ep.beta * to_float(re[j]);
      }
      activate8(v, ep.activation);
      uint32_t packed[4];
#pragma unroll
      for (int j = 0; j < 8; j += 2) packed[j / 2] = pack2<elem_t>(v[j], v[j + 1]);
      *reinterpret_cast<uint4*>(o.out + idx) = make_uint4(packed[0], packed[1], packed[2], packed[3]);
    }
    return;
  }
  // Row end, or an output that is not 16-byte aligned: pairs (4-byte aligned) or single elements.
#pragma unroll
  for (int j = 0; j < 8; j += 2) {
    if (col + j >= o.cols) break;
    const bool two = col + j + 1 < o.cols;
    float e[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      if (i == 1 && !two) break;
      const float b = ep.has_bias ? to_float(o.bias[o.col_base + col + j + i]) : 0.f;
      const float r = ep.has_residual ? to_float(o.residual[idx + j + i]) : 0.f;
      e[i] = apply_epilogue(acc[j + i], b, r, ep);
    }
    if (two && o.out_vec >= 2) {
      if constexpr (sizeof(out_t) == 4) {
        *reinterpret_cast<float2*>(o.out + idx + j) = make_float2(e[0], e[1]);
      } else {
        *reinterpret_cast<uint32_t*>(o.out + idx + j) = pack2<elem_t>(e[0], e[1]);
      }
    } else {
      o.out[idx + j] = from_float<out_t>(e[0]);
      if (two) o.out[idx + j + 1] = from_float<out_t>(e[1]);
    }
  }
}

// The same, accumulators from shared memory (8 floats at src, 16-byte aligned).
__device__ __forceinline__ void store_row8(const float* src, const OutputView& o, const EpilogueParams& ep,
                                           long long row, long long col) {
  if (row >= o.rows || col >= o.cols) return;
  const float4 lo = *reinterpret_cast<const float4*>(src);
  const float4 hi = *reinterpret_cast<const float4*>(src + 4);
  const float v[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
  store8(v, o, ep, row, col);
}

// All warps call this after the mainloop (the ring drained: every cp.async landed, every warp past
// its last shared-memory read). `staging` = the shared-memory ring (>= EpilogueStaging::kBytes).
template <int MI, int NI, int WARPS_M, int WARP_M, int WARP_N, int WARPS>
__device__ __forceinline__ void store_accumulators(const float (&acc)[MI][NI][4], const OutputView& o,
                                                   const EpilogueParams& ep, long long m_offset, long long n_offset,
                                                   float* staging) {
  using Staging = EpilogueStaging<WARP_N, WARPS>;
  static_assert(WARP_N % 8 == 0 && 32 % (WARP_N / 8) == 0, "a warp tile row is 8-column pieces, <= 32 of them");
  constexpr int kLanesPerRow = WARP_N / 8;
  constexpr int kRowsPerIter = 32 / kLanesPerRow;
  constexpr int kIters = (16 + kRowsPerIter - 1) / kRowsPerIter;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  float* mine = staging + warp * Staging::kWarpFloats;
  const long long row0 = m_offset + (warp % WARPS_M) * WARP_M;
  const long long col0 = n_offset + (warp / WARPS_M) * WARP_N;
  const int lane_row = lane / kLanesPerRow;
  const int lane_col = (lane % kLanesPerRow) * 8;
#pragma unroll
  for (int mi = 0; mi < MI; ++mi) {
#pragma unroll
    for (int ni = 0; ni < NI; ++ni)
#pragma unroll
      for (int half = 0; half < 2; ++half)
        *reinterpret_cast<float2*>(mine + (lane / 4 + 8 * half) * Staging::kPitch + 8 * ni + 2 * (lane % 4)) =
            make_float2(acc[mi][ni][2 * half], acc[mi][ni][2 * half + 1]);
    __syncwarp();
#pragma unroll 1
    for (int it = 0; it < kIters; ++it) {
      const int r = it * kRowsPerIter + lane_row;
      if (kRowsPerIter * kIters == 16 || r < 16)
        store_row8(mine + r * Staging::kPitch + lane_col, o, ep, row0 + mi * 16 + r, col0 + lane_col);
    }
    __syncwarp();  // the block is read before the next one overwrites it
  }
}

}  // namespace sm80
}  // namespace cuconv
