// cuconv: matmul out = act(alpha * a @ b + bias + beta * residual) for sm_80+, the conv mainloop
// fed by two linear loaders.
//
// Roles: loader A = LinearLoader over a[M][K] (k contiguous); loader B = LinearLoader over
// b[K][N] (n contiguous, staged [BK][BN], read with ldmatrix.trans); mainloop MmaMainloop;
// epilogue store_accumulators. Barriers: only the ring's one per K tile (see
// pipeline_cp_async.cuh); the epilogue re-shapes each warp's tile in its own part of the drained
// ring with __syncwarp only.
// Grid: x = n tiles (consecutive CTAs share an A row block), y * z = m tiles.
#include "sm80/config.cuh"
#include "sm80/epilogue.cuh"
#include "sm80/loader_linear.cuh"
#include "sm80/mma_mainloop.cuh"

#ifndef CUCONV_KERNEL_NAME
#define CUCONV_KERNEL_NAME matmul_sm80
#endif

namespace cs = cuconv::sm80;

using Mainloop = cs::MmaMainloop<cs::kBM, cs::kBN, cs::kBK, cs::kStages, cs::kWarpsM, cs::kWarpsN, false>;
using LoaderA = cs::LinearLoader<cs::kBM, cs::kBK, cs::kVecA, true, cs::kThreads>;
using LoaderB = cs::LinearLoader<cs::kBN, cs::kBK, cs::kVecB, false, cs::kThreads>;
static_assert(Mainloop::Ring::kBytes <= cs::kSmemBudgetBytes, "ring exceeds the shared-memory budget");
constexpr int kWarps = cs::kWarpsM * cs::kWarpsN;
static_assert(cs::EpilogueStaging<Mainloop::kWarpN, kWarps>::kBytes <= Mainloop::Ring::kBytes,
              "the epilogue re-shapes the tile through the ring");

extern "C" __global__ void __launch_bounds__(cs::kThreads, CUCONV_MIN_BLOCKS)
CUCONV_KERNEL_NAME(const elem_t* __restrict__ a, const elem_t* __restrict__ b, const elem_t* bias,
                   const elem_t* residual, elem_t* out, long long M, int N, int K, int m_tiles, int out_vec,
                   cuconv::EpilogueParams ep) {
  extern __shared__ __align__(128) unsigned char smem[];
  const long long n_offset = (long long)blockIdx.x * cs::kBN;
  const long long m_tile = (long long)blockIdx.z * gridDim.y + blockIdx.y;
  if (m_tile >= m_tiles) return;
  const long long m_offset = m_tile * cs::kBM;

  const LoaderA la{a, M, K, K};
  const LoaderB lb{b, N, K, N};
  float acc[Mainloop::MI][Mainloop::NI][4];
  Mainloop::run(la, lb, m_offset, n_offset, (K + cs::kBK - 1) / cs::kBK, cuconv::smem_u32(smem), acc);

  const cs::OutputView o{out, residual, bias, M, N, N, 0, out_vec};
  cs::store_accumulators<Mainloop::MI, Mainloop::NI, cs::kWarpsM, Mainloop::kWarpM, Mainloop::kWarpN, kWarps>(
      acc, o, ep, m_offset, n_offset, reinterpret_cast<float*>(smem));
}
