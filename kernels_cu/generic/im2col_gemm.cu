// cuconv generic GPU path: explicit im2col + cuBLAS + one fused epilogue.
//
// Correct for every valid problem (any rank, stride, dilation, padding, groups, dtype); it is the
// visible fallback of the fast kernels. Two kernels, both grid-stride elementwise:
//
//   im2col     x (N, D, H, W, C) native layout  ->  A[g][m - m_begin][kk]  as acc_t
//              kk = ((t * R + r) * S + s) * Cg + c, the order of the native weight layout
//   epilogue   acc[g][m - m_begin][k] (acc_t, from the batched GEMM)  ->  out[m][g * Kg + k]
//              out = act(alpha * acc + bias + beta * residual), cast to the output type
//
// CUCONV_DTYPE selects the element type (common/types.cuh); CUCONV_ACC the type of A, of the GEMM's
// result and of the epilogue arithmetic: 0 float (EpilogueParams; the default), 1 double
// (EpilogueParams64; the problem's precision is "float64"). 2-D problems are run as 3-D ones with
// D = T = 1. All indices are 64-bit.
#include "common/types.cuh"
#include "common/epilogue_math.cuh"

#ifndef CUCONV_ACC
#define CUCONV_ACC 0
#endif

#if CUCONV_ACC == 1
typedef double acc_t;
typedef cuconv::EpilogueParams64 epilogue_params_t;
#else
typedef float acc_t;
typedef cuconv::EpilogueParams epilogue_params_t;
#endif

// An element as the accumulator type, and back (float and double convert directly; the 16-bit types
// through fp32, which holds them exactly).
__device__ __forceinline__ acc_t widen(float v) { return (acc_t)v; }
__device__ __forceinline__ acc_t widen(double v) { return (acc_t)v; }
__device__ __forceinline__ acc_t widen(cuconv::half_t v) { return (acc_t)cuconv::to_float(v); }
__device__ __forceinline__ acc_t widen(cuconv::bf16_t v) { return (acc_t)cuconv::to_float(v); }

template <typename T> __device__ __forceinline__ T narrow(acc_t v) { return cuconv::from_float<T>((float)v); }
template <> __device__ __forceinline__ float narrow<float>(acc_t v) { return (float)v; }
template <> __device__ __forceinline__ double narrow<double>(acc_t v) { return (double)v; }

struct ConvGeometry {
  long long N, D, H, W, C;     // input
  long long Z, P, Q;           // output spatial
  long long T, R, S, Cg, G;    // filter, channels per group, groups
  long long Kg;                // output channels per group
  int stride_d, stride_h, stride_w;
  int dil_d, dil_h, dil_w;
  int pad_d, pad_h, pad_w;     // low-side padding (the high side is implied by the output size)
};

extern "C" __global__ void im2col(const elem_t* __restrict__ x, acc_t* __restrict__ a,
                                  ConvGeometry g, long long m_begin, long long m_count) {
  const long long k_gemm = g.T * g.R * g.S * g.Cg;
  const long long total = g.G * m_count * k_gemm;
  for (long long idx = blockIdx.x * (long long)blockDim.x + threadIdx.x; idx < total;
       idx += (long long)gridDim.x * blockDim.x) {
    long long kk = idx % k_gemm;
    long long rest = idx / k_gemm;
    const long long m = m_begin + rest % m_count;
    const long long grp = rest / m_count;
    // kk -> (t, r, s, c)
    const long long c = kk % g.Cg;
    kk /= g.Cg;
    const long long s = kk % g.S;
    kk /= g.S;
    const long long r = kk % g.R;
    const long long t = kk / g.R;
    // m -> (n, z, p, q)
    long long mm = m;
    const long long q = mm % g.Q;
    mm /= g.Q;
    const long long p = mm % g.P;
    mm /= g.P;
    const long long z = mm % g.Z;
    const long long n = mm / g.Z;
    const long long di = z * g.stride_d + t * g.dil_d - g.pad_d;
    const long long hi = p * g.stride_h + r * g.dil_h - g.pad_h;
    const long long wi = q * g.stride_w + s * g.dil_w - g.pad_w;
    acc_t v = 0;
    if (di >= 0 && di < g.D && hi >= 0 && hi < g.H && wi >= 0 && wi < g.W) {
      v = widen(x[(((n * g.D + di) * g.H + hi) * g.W + wi) * g.C + grp * g.Cg + c]);
    }
    a[idx] = v;
  }
}

extern "C" __global__ void epilogue(const acc_t* __restrict__ acc, const elem_t* __restrict__ bias,
                                    const elem_t* residual, elem_t* out, ConvGeometry g,
                                    long long m_begin, long long m_count, epilogue_params_t ep) {
  // `residual` may alias `out` (in-place residual): each element is read before it is written by
  // the same thread, so no __restrict__ on either.
  const long long K = g.G * g.Kg;
  const long long total = m_count * K;
  for (long long idx = blockIdx.x * (long long)blockDim.x + threadIdx.x; idx < total;
       idx += (long long)gridDim.x * blockDim.x) {
    const long long k = idx % K;
    const long long m_local = idx / K;
    const long long grp = k / g.Kg;
    const long long kg = k % g.Kg;
    const acc_t a = acc[(grp * m_count + m_local) * g.Kg + kg];
    const long long o = (m_begin + m_local) * K + k;
    const acc_t b = ep.has_bias ? widen(bias[k]) : (acc_t)0;
    const acc_t r = ep.has_residual ? widen(residual[o]) : (acc_t)0;
    out[o] = narrow<elem_t>(cuconv::apply_epilogue(a, b, r, ep));
  }
}
