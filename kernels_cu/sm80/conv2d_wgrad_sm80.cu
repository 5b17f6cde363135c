// cuconv: conv2d weight gradient for sm_80+, an implicit GEMM whose reduction runs over the output
// pixels (cp.async + ldmatrix.trans + mma.sync), NHWC; split across CTAs, reduced in a fixed order.
//
//   dw[g Kg + k][j] = sum over pixels l of dy[l][g Kg + k] * im2col(x)[l][j]      (loader_im2col_t.cuh)
//
// Roles (every warp plays all of them, as in conv2d_fprop_sm80.cu):
//   loader A   dy viewed as [N*P*Q][K]: LinearLoader, k-major ([BK pixels][BM filters] tiles)
//   loader B   x: Im2colTLoader ([BK pixels][BN columns] tiles)
//   mainloop   MmaMainloop with both operands read by ldmatrix.trans, fp32 accumulators
//   epilogue   the fp32 partial sums of this CTA's pixel range -> ws[split][g Kg + k][j]
// Then the reduce entry (<name>_reduce) adds the splits of every element in a fixed order, in fp32,
// and writes dw in the data's dtype: the result has the same bits on every run.
// Grid: x = n tiles, y = m tiles, z = groups * splits (split fastest).
#include "common/split_sum.cuh"
#include "sm80/config.cuh"
#include "sm80/loader_im2col_t.cuh"
#include "sm80/loader_linear.cuh"
#include "sm80/mma_mainloop.cuh"

#ifndef CUCONV_KERNEL_NAME
#define CUCONV_KERNEL_NAME conv2d_wgrad_sm80
#endif

namespace cs = cuconv::sm80;

using Mainloop = cs::MmaMainloop<cs::kBM, cs::kBN, cs::kBK, cs::kStages, cs::kWarpsM, cs::kWarpsN, false, false>;
using LoaderA = cs::LinearLoader<cs::kBM, cs::kBK, cs::kVecA, false, cs::kThreads>;
using LoaderB = cs::Im2colTLoader<cs::kBN, cs::kBK, cs::kVecB, cs::kThreads>;
static_assert(Mainloop::Ring::kBytes <= cs::kSmemBudgetBytes, "ring exceeds the shared-memory budget");
static_assert(Mainloop::kThreads == cs::kThreads, "one thread count for loaders and mainloop");

extern "C" __global__ void __launch_bounds__(cs::kThreads, CUCONV_MIN_BLOCKS)
CUCONV_KERNEL_NAME(const elem_t* __restrict__ x, const elem_t* __restrict__ dy, float* __restrict__ ws,
                   cs::WgradGeometry geo) {
  extern __shared__ __align__(128) unsigned char smem[];
  const int split = blockIdx.z % geo.splits;
  const int group = blockIdx.z / geo.splits;
  const long long m_offset = (long long)blockIdx.y * cs::kBM;
  const long long n_offset = (long long)blockIdx.x * cs::kBN;
  const int l_begin = split * geo.split_len;
  const int l_end = min(geo.L, l_begin + geo.split_len);

  // dy rows from l_begin on, this group's Kg columns: element (k, l) = base[l * K + k]
  const LoaderA la{dy + (long long)l_begin * geo.K + group * geo.Kg, geo.Kg, l_end - l_begin, geo.K};
  const LoaderB lb(x, geo, group, n_offset, l_begin, l_end);

  float acc[Mainloop::MI][Mainloop::NI][4];
  const int k_tiles = (l_end - l_begin + cs::kBK - 1) / cs::kBK;
  Mainloop::run(la, lb, m_offset, n_offset, k_tiles, cuconv::smem_u32(smem), acc);

  // Fragment layout (epilogue.cuh): row 16 mi + lane / 4 + 8 half, columns 8 ni + 2 (lane % 4) + {0, 1}.
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int row0 = (int)m_offset + (warp % cs::kWarpsM) * Mainloop::kWarpM + lane / 4;
  const int col0 = (int)n_offset + (warp / cs::kWarpsM) * Mainloop::kWarpN + 2 * (lane % 4);
  float* base = ws + ((long long)split * geo.K + (long long)group * geo.Kg) * geo.cols;
#pragma unroll
  for (int mi = 0; mi < Mainloop::MI; ++mi)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = row0 + mi * 16 + 8 * half;
      if (row >= geo.Kg) continue;
#pragma unroll
      for (int ni = 0; ni < Mainloop::NI; ++ni) {
        const int col = col0 + ni * 8;
        float* dst = base + (long long)row * geo.cols + col;
        const float v0 = acc[mi][ni][2 * half], v1 = acc[mi][ni][2 * half + 1];
        if (col + 1 < geo.cols && (geo.cols & 1) == 0) {
          *reinterpret_cast<float2*>(dst) = make_float2(v0, v1);
        } else {
          if (col < geo.cols) dst[0] = v0;
          if (col + 1 < geo.cols) dst[1] = v1;
        }
      }
    }
}

// dw = the splits of ws added in a fixed order (common/split_sum.cuh).
extern "C" __global__ void __launch_bounds__(256)
CUCONV_CAT(CUCONV_KERNEL_NAME, _reduce)(const float* __restrict__ ws, elem_t* __restrict__ dw, long long count,
                                         int splits) {
  cuconv::split_sum(ws, dw, count, splits);
}
