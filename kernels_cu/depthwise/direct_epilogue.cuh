// cuconv direct kernels (depthwise, smallc): the fp32 weights a thread multiplies and the epilogue of its
// outputs, shared by both kernels.
//
// A thread of a direct kernel owns NPX consecutive output pixels of one row x V consecutive output
// channels, accumulated in fp32. `load_weights` reads V fp32 weights from shared memory (16-byte loads
// when V is a multiple of 4); `store_outputs` applies act(alpha * acc + bias + beta * residual)
// (common/epilogue_math.cuh) and stores V-wide vectors (vec_io.cuh), the activation a template argument
// so that the caller switches on it once per thread; `store_outputs_channels_first` is the same
// epilogue into channels-first arrays. Needs `elem_t` (common/types.cuh).
#pragma once
#include "common/types.cuh"
#include "common/epilogue_math.cuh"
#include "depthwise/vec_io.cuh"

namespace cuconv {
namespace dw {

// V floats of fp32 weights at p (16-byte aligned when V >= 4).
template <int V>
__device__ __forceinline__ void load_weights(const float* p, float (&f)[V]) {
  if constexpr (V % 4 == 0) {
#pragma unroll
    for (int i = 0; i < V / 4; ++i) {
      const float4 v = reinterpret_cast<const float4*>(p)[i];
      f[4 * i] = v.x; f[4 * i + 1] = v.y; f[4 * i + 2] = v.z; f[4 * i + 3] = v.w;
    }
  } else {
#pragma unroll
    for (int i = 0; i < V; ++i) f[i] = p[i];
  }
}

// Channels k .. k + V - 1 of the bias (zeros without one).
template <int V>
__device__ __forceinline__ void load_bias(const elem_t* bias, int k, const EpilogueParams& ep, float (&bv)[V]) {
  if (ep.has_bias) {
    load_vec<elem_t, V>(bias + k, bv);
  } else {
#pragma unroll
    for (int v = 0; v < V; ++v) bv[v] = 0.f;
  }
}

// The epilogue of a thread's outputs: pixels q_first .. q_first + NPX - 1 (those below g.Q) of the
// output row starting at pixel row_base, channels k .. k + V - 1 of g.K per pixel (Geometry: the
// kernel's geometry struct).
template <int ACT, int NPX, int V, class Geometry>
__device__ __forceinline__ void store_outputs(const float (&acc)[NPX][V], const elem_t* bias, const elem_t* residual,
                                              elem_t* out, const Geometry& g, const EpilogueParams& ep,
                                              int64_t row_base, int q_first, int k) {
  float bv[V];
  load_bias(bias, k, ep, bv);
#pragma unroll
  for (int q = 0; q < NPX; ++q) {
    if (q_first + q >= g.Q) break;
    const int64_t off = (row_base + q_first + q) * g.K + k;
    float y[V];
#pragma unroll
    for (int v = 0; v < V; ++v) y[v] = fmaf(ep.alpha, acc[q][v], bv[v]);
    if (ep.has_residual) {
      float rv[V];
      load_vec<elem_t, V>(residual + off, rv);
#pragma unroll
      for (int v = 0; v < V; ++v) y[v] = fmaf(ep.beta, rv[v], y[v]);
    }
    if constexpr (ACT != ACT_NONE) {
#pragma unroll
      for (int v = 0; v < V; ++v) y[v] = activate(y[v], ACT);
    }
    store_vec<elem_t, V>(out + off, y);
  }
}

// The same epilogue into channels-first out and residual ((N, K, O, P, Q): smallc_direct on NCHW /
// NCDHW arrays): channel k + v of the thread's pixels starts at `plane0 + v * opq` (plane0: the element
// of channel k at pixel q_first). Per channel, the NPX pixels are one vector where all of them are in
// the row and the addresses are aligned to it, else single elements.
template <int ACT, int NPX, int V, class Geometry>
__device__ __forceinline__ void store_outputs_channels_first(const float (&acc)[NPX][V], const elem_t* bias,
                                                             const elem_t* residual, elem_t* out, const Geometry& g,
                                                             const EpilogueParams& ep, int64_t plane0, int64_t opq,
                                                             int q_first, int k) {
  constexpr int ALIGN = NPX * (int)sizeof(elem_t) < 16 ? NPX * (int)sizeof(elem_t) : 16;
  const int npx = g.Q - q_first < NPX ? g.Q - q_first : NPX;
  float bv[V];
  load_bias(bias, k, ep, bv);
#pragma unroll
  for (int v = 0; v < V; ++v) {
    const int64_t off = plane0 + v * opq;
    float y[NPX];
#pragma unroll
    for (int q = 0; q < NPX; ++q) y[q] = fmaf(ep.alpha, acc[q][v], bv[v]);
    const bool whole = npx == NPX && reinterpret_cast<unsigned long long>(out + off) % ALIGN == 0 &&
                       (!ep.has_residual || reinterpret_cast<unsigned long long>(residual + off) % ALIGN == 0);
    if (whole) {
      if (ep.has_residual) {
        float rv[NPX];
        load_vec<elem_t, NPX>(residual + off, rv);
#pragma unroll
        for (int q = 0; q < NPX; ++q) y[q] = fmaf(ep.beta, rv[q], y[q]);
      }
      if constexpr (ACT != ACT_NONE) {
#pragma unroll
        for (int q = 0; q < NPX; ++q) y[q] = activate(y[q], ACT);
      }
      store_vec<elem_t, NPX>(out + off, y);
    } else {
#pragma unroll
      for (int q = 0; q < NPX; ++q) {
        if (q >= npx) break;
        float yq = y[q];
        if (ep.has_residual) yq = fmaf(ep.beta, to_float(residual[off + q]), yq);
        if constexpr (ACT != ACT_NONE) yq = activate(yq, ACT);
        out[off + q] = from_float<elem_t>(yq);
      }
    }
  }
}

}  // namespace dw
}  // namespace cuconv
