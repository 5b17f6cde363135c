// cuconv: conv2d forward, implicit GEMM for sm_80+ (cp.async + ldmatrix + mma.sync), NHWC.
//
// Roles (every warp plays all of them; sm_80 has no warp specialisation worth its registers here):
//   loader A   activations: Im2colLoader (uniform / per-lane sub-path) or, for a pointwise 1x1
//              stride-1 unpadded conv, LinearLoader over x viewed as [M][C] (CUCONV_SUBPATH 0/1/2)
//   loader B   weights w[K][R*S*Cg] (rows w_ld apart): LinearLoader, the group's Kg rows
//   mainloop   MmaMainloop: STAGES-deep cp.async ring, ldmatrix, mma.sync m16n8k16, fp32 acc
//   epilogue   act(alpha * acc + bias + beta * residual) -> out[m][g*Kg + n], 16-byte stores (epilogue.cuh)
// CUCONV_TF32 (float32 at precision "tf32", cuconv/backends/sm80/tf32.py): x and w are float32 arrays
// seen as 16-bit ones of twice the channels (the loaders move bytes), each k16 step one tf32 mma,
// and bias, residual and out are float32.
// Barriers: one __syncthreads after setup_rows (RowInfo in shared memory), then per K tile the
// ring's wait_tiles (cp.async.wait_group + __syncthreads, see pipeline_cp_async.cuh). No CTA barrier
// in the epilogue: each warp re-shapes its own tile in its own part of the drained ring.
// Grid: x = n_tiles * groups (consecutive CTAs share an m tile, so its activations stay in L2),
//       y * z = m tiles (z only when there are more than 65535).
#include "sm80/config.cuh"
#include "sm80/epilogue.cuh"
#include "sm80/loader_im2col.cuh"
#include "sm80/loader_linear.cuh"
#include "sm80/mma_mainloop.cuh"

#ifndef CUCONV_SUBPATH
#define CUCONV_SUBPATH 1
#endif
#ifndef CUCONV_KERNEL_NAME
#define CUCONV_KERNEL_NAME conv2d_fprop_sm80
#endif

namespace cs = cuconv::sm80;

using Mainloop = cs::MmaMainloop<cs::kBM, cs::kBN, cs::kBK, cs::kStages, cs::kWarpsM, cs::kWarpsN, true>;
#ifndef CUCONV_B_L1
#define CUCONV_B_L1 0
#endif
// CUCONV_B_L1 (host: the group's filters fit sm80.B_L1_MAX_BYTES): the weight copies allocate in L1,
// so the CTAs of an SM share them there instead of each reading them from L2.
using LoaderB = cs::LinearLoader<cs::kBN, cs::kBK, cs::kVecB, true, cs::kThreads, CUCONV_B_L1 != 0>;
#if CUCONV_SUBPATH == 0
using LoaderA = cs::LinearLoader<cs::kBM, cs::kBK, cs::kVecA, true, cs::kThreads>;
constexpr int kRowInfoBytes = 0;
#else
using LoaderA = cs::Im2colLoader<cs::kBM, cs::kBK, cs::kVecA, CUCONV_SUBPATH, cs::kThreads>;
constexpr int kRowInfoBytes = LoaderA::kRowInfoBytes;
#endif
constexpr int kSmemBytes = Mainloop::Ring::kBytes + kRowInfoBytes;
static_assert(kSmemBytes <= cs::kSmemBudgetBytes, "ring + row table exceed the shared-memory budget");
static_assert(Mainloop::kThreads == cs::kThreads, "one thread count for loaders and mainloop");
constexpr int kWarps = cs::kWarpsM * cs::kWarpsN;
static_assert(cs::EpilogueStaging<Mainloop::kWarpN, kWarps>::kBytes <= Mainloop::Ring::kBytes,
              "the epilogue re-shapes the tile through the ring");

// The A loader of group `group` for the CTA whose tile starts at m_offset (row table filled;
// the caller must __syncthreads before the first load_tile).
__device__ __forceinline__ LoaderA make_loader_a(const elem_t* x, const cs::Im2colGeometry& geo, int group,
                                                 long long m_offset, unsigned char* smem) {
#if CUCONV_SUBPATH == 0
  (void)m_offset;
  (void)smem;
  return LoaderA{x + (long long)group * geo.Cg, geo.M, geo.Cg, geo.C};
#else
  LoaderA la{x, geo, group * geo.Cg, nullptr};
  la.setup_rows(reinterpret_cast<cs::RowInfo*>(smem + Mainloop::Ring::kBytes), m_offset);
  return la;
#endif
}

extern "C" __global__ void __launch_bounds__(cs::kThreads, CUCONV_MIN_BLOCKS)
CUCONV_KERNEL_NAME(const elem_t* __restrict__ x, const elem_t* __restrict__ w, const cs::out_t* bias,
                   const cs::out_t* residual, cs::out_t* out, cs::Im2colGeometry geo, int Kg, int w_ld, int n_tiles,
                   int m_tiles, int out_vec, cuconv::EpilogueParams ep) {
  extern __shared__ __align__(128) unsigned char smem[];
  const int group = blockIdx.x / n_tiles;
  const long long n_offset = (long long)(blockIdx.x % n_tiles) * cs::kBN;
  const long long m_tile = (long long)blockIdx.z * gridDim.y + blockIdx.y;
  if (m_tile >= m_tiles) return;
  const long long m_offset = m_tile * cs::kBM;

  const LoaderA la = make_loader_a(x, geo, group, m_offset, smem);
  // w rows are w_ld >= R*S*Cg elements apart (the pad_channels path pads them to a multiple of 8,
  // zero-filled, so that B moves in 16-byte copies).
  const LoaderB lb{w + (long long)group * Kg * w_ld, Kg, geo.k_gemm, w_ld};
  __syncthreads();  // row table visible

  float acc[Mainloop::MI][Mainloop::NI][4];
  const int k_tiles = (geo.k_gemm + cs::kBK - 1) / cs::kBK;
  Mainloop::run(la, lb, m_offset, n_offset, k_tiles, cuconv::smem_u32(smem), acc);

  const cs::OutputView o{out, residual, bias, geo.M, Kg, (long long)Kg * (geo.C / geo.Cg), group * Kg, out_vec};
  cs::store_accumulators<Mainloop::MI, Mainloop::NI, cs::kWarpsM, Mainloop::kWarpM, Mainloop::kWarpN, kWarps>(
      acc, o, ep, m_offset, n_offset, reinterpret_cast<float*>(smem));
}

// Debug entry: run loader A once for (m_offset, k_offset) of `group` and copy the staged tile,
// un-swizzled, to tile_out[BM][BK]. One CTA. Compared with cuconv.models.loader.loader_tile.
extern "C" __global__ void __launch_bounds__(cs::kThreads)
CUCONV_CAT(CUCONV_KERNEL_NAME, _stage_a)(const elem_t* __restrict__ x, cs::Im2colGeometry geo, int group,
                                        long long m_offset, long long k_offset, elem_t* tile_out) {
  extern __shared__ __align__(128) unsigned char smem[];
  const LoaderA la = make_loader_a(x, geo, group, m_offset, smem);
  __syncthreads();
  la.load_tile(cuconv::smem_u32(smem), m_offset, k_offset);
  cs::cp_async_commit();
  cs::cp_async_wait<0>();
  __syncthreads();
  for (int i = threadIdx.x; i < cs::kBM * cs::kBK; i += cs::kThreads) {
    const int row = i / cs::kBK, col = i % cs::kBK;
    tile_out[i] = *reinterpret_cast<const elem_t*>(smem + LoaderA::Tile::elem_offset(row, col));
  }
}
