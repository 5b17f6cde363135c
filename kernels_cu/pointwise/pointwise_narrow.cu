// cuconv: pointwise (1x1, stride 1, unpadded) dense convolution to a few output channels from a few
// input channels (K <= 8, C x K <= 64: a detection head's 16 -> 1 map, a segmentation head's
// 32 -> 2), channels-last, fp16 / bf16 / fp32 data with fp32 multiply-adds: the `pointwise_narrow`
// kernel (host: cuconv.backends.pointwise.narrow_kernel).
//
// In NHWC / NDHWC such a layer is out[M][K] = x[M][C] * w[K][C]^T over the M output pixels, with each
// pixel's C inputs one contiguous run of x and its K outputs one contiguous run of out. It moves
// C + K values per pixel and multiplies C x K: bound by memory many times over. A tensor-core tile
// pads K to 16 columns and C to its reduction block; here each thread owns whole pixels instead:
//   1. The filter goes into registers as fp32 (C x K values, the same for every thread: loaded once).
//   2. Thread t of the grid takes pixels t, t + (threads in the grid), ...; per pixel it loads the
//      C / VIN 16-byte vectors of its row (all before the first multiply-add, so they are in flight
//      together), widens them to fp32 and accumulates its K sums.
//   3. Epilogue act(alpha * acc + bias + beta * residual) per output; consecutive lanes hold
//      consecutive pixels, so a warp's stores of one channel cover 32 consecutive rows of out.
//
// Compile-time (host: cuconv.backends.pointwise.narrow_variants): dtype, C (PN_C) and K (PN_K).
// Run time (PnGeometry): M. The grid is a multiple of the SMs; each thread strides over the pixels.
#include "common/types.cuh"
#include "common/epilogue_math.cuh"
#include "depthwise/vec_io.cuh"

#ifndef PN_C
#define PN_C 16
#endif
#ifndef PN_K
#define PN_K 1
#endif
#ifndef CUCONV_KERNEL_NAME
#define CUCONV_KERNEL_NAME pointwise_narrow
#endif

namespace cuconv {
namespace pn {

using dw::load_vec;

constexpr int NC = PN_C, NK = PN_K;  // input and output channels
constexpr int VIN = 16 / (int)sizeof(elem_t);  // channels per 16-byte vector of x
constexpr int CV = NC / VIN;                    // vectors per pixel
constexpr int THREADS = 256;
static_assert(NC % VIN == 0, "C: whole 16-byte vectors per pixel");
static_assert(NK >= 1 && NK <= 8 && NC * NK <= 64, "the filter lives in registers: K <= 8, C x K <= 64");

// The run-time geometry (cuconv.backends.pointwise.narrow_variants.pn_geometry builds it).
struct PnGeometry {
  long long M;  // output pixels (N x (D) x H x W)
};

}  // namespace pn
}  // namespace cuconv

using namespace cuconv;
using namespace cuconv::pn;

extern "C" __global__ void __launch_bounds__(THREADS)
CUCONV_KERNEL_NAME(const elem_t* __restrict__ x, const elem_t* __restrict__ w, const elem_t* bias,
                   const elem_t* residual, elem_t* out, PnGeometry g, EpilogueParams ep) {
  // 1. The filter w[K][C] as fp32 registers, and the bias.
  float wr[NK][NC];
#pragma unroll
  for (int k = 0; k < NK; ++k)
#pragma unroll
    for (int c = 0; c < NC; ++c) wr[k][c] = to_float(w[k * NC + c]);
  float bv[NK];
#pragma unroll
  for (int k = 0; k < NK; ++k) bv[k] = ep.has_bias ? to_float(bias[k]) : 0.f;

  const long long step = (long long)gridDim.x * THREADS;
#pragma unroll 1
  for (long long m = (long long)blockIdx.x * THREADS + threadIdx.x; m < g.M; m += step) {
    // 2. The pixel's C inputs: every vector's load issued before the multiply-adds.
    float xv[CV][VIN];
#pragma unroll
    for (int j = 0; j < CV; ++j) load_vec<elem_t, VIN>(x + m * NC + j * VIN, xv[j]);
    float acc[NK];
#pragma unroll
    for (int k = 0; k < NK; ++k) {
      acc[k] = 0.f;
#pragma unroll
      for (int j = 0; j < CV; ++j)
#pragma unroll
        for (int e = 0; e < VIN; ++e) acc[k] = fmaf(xv[j][e], wr[k][j * VIN + e], acc[k]);
    }
    // 3. The epilogue, one output at a time (a pixel's K outputs are contiguous, rarely 16-byte aligned).
#pragma unroll
    for (int k = 0; k < NK; ++k) {
      const long long off = m * NK + k;
      const float rv = ep.has_residual ? to_float(residual[off]) : 0.f;
      out[off] = from_float<elem_t>(apply_epilogue(acc[k], bv[k], rv, ep));
    }
  }
}
