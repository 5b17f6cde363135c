// cuconv: depthwise convolution forward on tensor cores (the `depthwise_mma` kernel; host:
// cuconv/backends/depthwise/mma.py), conv2d, channels-last, fp16 / bf16, multiplier 1, W stride 1.
//
// Why tensor cores: a depthwise layer's reduction is one channel wide, so it is no implicit GEMM. But
// along W one filter row is a banded (Toeplitz) matrix: for one channel and filter row r, 8 consecutive
// outputs of an output row are
//   out[p][q0 + j] += sum_i in[p * stride_h + r * dil_h][q0 + i] * T_r[i][j],   i < 16, j < 8,
//   T_r[i][j] = w[r][s] where i - j == s * dil_w (0 <= s < S), else 0,
// one m16n8k16 MMA per filter row when 8 + (S - 1) * dil_w <= 16: M = 16 output rows, N = 8 output
// columns, K = 16 input columns. For a 7x7 filter 7 of its 16 K-columns per output are taps (44% of the
// MMA's multiply-adds), still ~15x the throughput of the fp32 multiply-adds that bind the direct kernel
// (depthwise_fprop.cu) on filters 5 and more wide. Products of 16-bit values are exact in fp32 and the
// accumulation is fp32, as in the direct kernel.
// The zeros of T_r multiply input values of the 16-column window that the output's own window does not
// reach: an Inf or NaN input spreads to the 16 x 8 block of outputs whose MMA reads it (as it does in a
// Winograd or FFT convolution), where the direct kernel confines it to the outputs whose window holds it.
//
// Work item (work_item.cuh): one output tile of TP = 16 * MB rows x TQ = 8 * NB columns x CB channels of
// one image; persistent grid, each CTA an equal run of consecutive items (as the direct kernel).
//   1. The input tile [in_rows][in_cols][CB] (halo included, zero padding) is copied by cp.async
//      (halo_tile.cuh) into one of two raw buffers while the CTA computes the previous item.
//   2. Transpose: the raw tile becomes one plane per channel, [c][row][PLANE_COLS] 16-bit (two columns
//      per 4-byte store), so a channel's 8 x 8 blocks are ldmatrix rows. Plane columns past the tile
//      (read by the last A block) are written as zeros.
//   3. MMA: warp w owns channels w * CPW .. w * CPW + CPW - 1 of the chunk. Its B fragments (T_r of
//      each channel and filter row, built from w in global memory) live in registers while the chunk
//      lasts. Per (channel, 16-row block, filter row): one ldmatrix.x4 for the first 8 output columns,
//      then one ldmatrix.x2 per further 8 (the A block of columns 8nb .. 8nb + 15 shares its first
//      8 x 16 half with the previous block's second), one MMA each. The fp32 results go to a staging
//      tile [p][c][q] in the raw buffer the item came from (its transpose is done), a column pair
//      per 8-byte store.
//   4. Epilogue (direct_epilogue.cuh): a thread reads QTE pixels x VEC channels of the staging tile
//      (a warp instruction reads 32 distinct banks) and stores them with
//      act(alpha * acc + bias + beta * residual), VEC-wide.
//
// Compile-time (host: cuconv.backends.depthwise.mma): dtype, R, S, DWM_DW (dilation along W), NB, MB,
// CB (channels per chunk, 8 warps x CPW), VIN (channels per input copy), VEC (channels per epilogue
// access), QTE (pixels per epilogue thread), MIN_BLOCKS (__launch_bounds__ occupancy).
#include "common/types.cuh"
#include "common/epilogue_math.cuh"
#include "common/fast_div.cuh"
#include "common/smem.cuh"
#include "sm80/ptx_sm80.cuh"
#include "depthwise/vec_io.cuh"
#include "depthwise/halo_tile.cuh"
#include "depthwise/direct_epilogue.cuh"
#include "depthwise/work_item.cuh"

#ifndef DWM_R
#define DWM_R 7
#endif
#ifndef DWM_S
#define DWM_S 7
#endif
#ifndef DWM_DW
#define DWM_DW 1
#endif
#ifndef DWM_NB
#define DWM_NB 2
#endif
#ifndef DWM_MB
#define DWM_MB 1
#endif
#ifndef DWM_CB
#define DWM_CB 16
#endif
#ifndef DWM_VIN
#define DWM_VIN 8
#endif
#ifndef DWM_VEC
#define DWM_VEC 8
#endif
#ifndef DWM_QTE
#define DWM_QTE 2
#endif
#ifndef DWM_MIN_BLOCKS
#define DWM_MIN_BLOCKS 3
#endif
#ifndef CUCONV_KERNEL_NAME
#define CUCONV_KERNEL_NAME depthwise_mma
#endif

namespace cuconv {
namespace dwm {

using dw::DwGeometry;
using dw::Item;

constexpr int R = DWM_R, S = DWM_S, DWL = DWM_DW, NB = DWM_NB, MB = DWM_MB, CB = DWM_CB;
constexpr int VIN = DWM_VIN, VEC = DWM_VEC, QTE = DWM_QTE;
constexpr int TQ = 8 * NB, TP = 16 * MB;
constexpr int WARPS = 8, THREADS = 32 * WARPS;
constexpr int CPW = CB / WARPS;  // channels per warp
static_assert(CB % WARPS == 0 && CB % 8 == 0, "CB: whole channels per warp, whole 8-channel groups");
static_assert(8 + (S - 1) * DWL <= 16, "the 8 outputs' window must fit the MMA's 16 K-columns");
static_assert(TQ % QTE == 0 && CB % VEC == 0, "epilogue vectors tile the staging tile");
// Plane row length (16-bit elements): the last 16-column A block ends at TQ + 8; an odd number of
// 16-byte units per row keeps the 8 rows of an ldmatrix block on distinct banks.
constexpr int PLANE_COLS = ((TQ + 8) / 8) % 2 ? TQ + 8 : TQ + 16;
// Channel planes: plane c starts at c * plane bytes + (c / 8) * PLANE_GAP, so the transpose's 8-channel
// groups (two per warp instruction) write to different banks.
constexpr int PLANE_GAP = 64;
// Staging tile (fp32) [p][c][q]: channel stride CSP = TQ + 2 (= 2 mod 4: the epilogue's lanes, two
// 8-channel groups x up to 16 pixels, read distinct banks), row stride RSP = 8 mod 32 (an MMA's
// 64-bit column-pair stores of rows g and g + 8 are conflict-free).
constexpr int CSP = TQ + 2;
constexpr int RSP = CB * CSP + ((8 - (CB * CSP) % 32) + 32) % 32;
constexpr int STAGE_BYTES = TP * RSP * 4;

// The 16-bit tap T_r[i][j] of output channel k (0 past the band or past K).
__device__ __forceinline__ uint32_t toeplitz(const uint16_t* w, int k, int K, int r, int i, int j) {
  const int d = i - j;
  if (k >= K || d < 0 || d % DWL != 0 || d / DWL >= S) return 0u;
  return w[((int64_t)k * R + r) * S + d / DWL];
}

// The warp's B fragments: for each of its CPW channels and each filter row, b[0] = (T[2t][g], T[2t+1][g]),
// b[1] = (T[2t+8][g], T[2t+9][g]) (g = lane / 4, t = lane % 4; low half first).
__device__ __forceinline__ void build_b(uint32_t (&b)[CPW][R][2], const elem_t* w, int K, int k0, int lane) {
  const uint16_t* wb = reinterpret_cast<const uint16_t*>(w);
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int ci = 0; ci < CPW; ++ci)
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int k = k0 + ci;
      b[ci][r][0] = toeplitz(wb, k, K, r, 2 * t, g) | toeplitz(wb, k, K, r, 2 * t + 1, g) << 16;
      b[ci][r][1] = toeplitz(wb, k, K, r, 2 * t + 8, g) | toeplitz(wb, k, K, r, 2 * t + 9, g) << 16;
    }
}

// Byte offset of channel c's plane.
__device__ __forceinline__ int plane_offset(int c, int plane_elems) { return c * plane_elems * 2 + (c >> 3) * PLANE_GAP; }

// The raw tile [in_rows][in_cols][CB] -> planes [CB][in_rows][PLANE_COLS], zero past in_cols: a unit is
// a column pair x 8 channels (two 16-byte loads, eight 4-byte stores). Units run over whole plane rows,
// so a warp's stores are 16 consecutive words of two planes 16 banks apart (PLANE_GAP).
__device__ __forceinline__ void transpose_tile(unsigned char* planes, const uint16_t* raw, const DwGeometry& g,
                                               int plane_elems) {
  constexpr int GROUPS = CB / 8, PAIRS = PLANE_COLS / 2;
  const int units = g.in_rows * PAIRS * GROUPS;
  const int step = plane_elems / 2;  // words from one channel's plane to the next
#pragma unroll 1
  for (int u = threadIdx.x; u < units; u += THREADS) {
    const int cg = u % GROUPS;
    const int pix = u / GROUPS;  // the pair's word in the plane: row * PAIRS + column pair
    const int row = pix / PAIRS;
    const int col = 2 * (pix - row * PAIRS);
    const uint16_t* src = raw + (row * g.in_cols + col) * CB + cg * 8;
    uint4 a = make_uint4(0u, 0u, 0u, 0u), b = a;
    if (col < g.in_cols) a = *reinterpret_cast<const uint4*>(src);
    if (col + 1 < g.in_cols) b = *reinterpret_cast<const uint4*>(src + CB);
    uint32_t* dst = reinterpret_cast<uint32_t*>(planes + plane_offset(cg * 8, plane_elems)) + pix;
    const uint32_t aw[4] = {a.x, a.y, a.z, a.w}, bw[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
    for (int v = 0; v < 4; ++v) {
      dst[(2 * v) * step] = __byte_perm(aw[v], bw[v], 0x5410);      // channel 2v: (col, col + 1)
      dst[(2 * v + 1) * step] = __byte_perm(aw[v], bw[v], 0x7632);  // channel 2v + 1
    }
  }
}

// The warp's MMAs for one item: its channels' outputs into the fp32 staging tile [p][c][q].
__device__ __forceinline__ void mma_tile(float* stage, uint32_t planes_addr, const uint32_t (&b)[CPW][R][2],
                                        const DwGeometry& g, int plane_elems, int warp, int lane) {
  const int gq = lane >> 2, t = lane & 3;
#pragma unroll
  for (int ci = 0; ci < CPW; ++ci) {
    const int c = warp * CPW + ci;
    const uint32_t plane = planes_addr + (uint32_t)plane_offset(c, plane_elems);
#pragma unroll
    for (int mb = 0; mb < MB; ++mb) {
      float acc[NB][4];
#pragma unroll
      for (int nb = 0; nb < NB; ++nb)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[nb][e] = 0.f;
      const int out_row = 16 * mb + (lane & 15);  // the A row this lane addresses
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const uint32_t row_addr = plane + (uint32_t)((out_row * g.stride_h + r * g.dil_h) * PLANE_COLS * 2);
        uint32_t a[4];
        sm80::ldmatrix_x4(a, row_addr + (uint32_t)((lane >> 4) * 16));  // columns 0-7 / 8-15
        sm80::mma_16816<elem_t>(acc[0], a, b[ci][r]);
#pragma unroll
        for (int nb = 1; nb < NB; ++nb) {
          uint32_t h[2];
          sm80::ldmatrix_x2(h, row_addr + (uint32_t)((nb + 1) * 16));  // columns 8(nb+1) .. 8(nb+1) + 7
          a[0] = a[2]; a[1] = a[3]; a[2] = h[0]; a[3] = h[1];
          sm80::mma_16816<elem_t>(acc[nb], a, b[ci][r]);
        }
      }
#pragma unroll
      for (int nb = 0; nb < NB; ++nb) {
        float* s0 = stage + (16 * mb + gq) * RSP + c * CSP + 8 * nb + 2 * t;
        *reinterpret_cast<float2*>(s0) = make_float2(acc[nb][0], acc[nb][1]);
        *reinterpret_cast<float2*>(s0 + 8 * RSP) = make_float2(acc[nb][2], acc[nb][3]);
      }
    }
  }
}

// Issue (without waiting) the copies of item `item`'s input tile into `buf`.
__device__ __forceinline__ void load_item(elem_t* buf, const elem_t* x, const DwGeometry& g, int item) {
  const Item it = dw::decode_item<8>(g, item);
  dw::TileOrigin org;
  org.h0 = it.p0 * g.stride_h - g.pad_h;
  org.w0 = it.q0 - g.pad_w;
  org.c_lo = it.chunk * CB;
  org.rows = g.in_rows;
  org.cols = g.in_cols;
  org.cin = CB;
  org.plane = x + (int64_t)it.n * g.H * g.W * g.C;
  dw::load_input_tile<VIN>(buf, org, g.H, g.W, g.C, g.div_upp, g.div_cols);
}

// The epilogue of one item from the staging tile: thread e takes VEC channels x QTE pixels of one row.
template <int ACT>
__device__ __forceinline__ void store_item(const float* stage, const elem_t* bias, const elem_t* residual,
                                           elem_t* out, const DwGeometry& g, const EpilogueParams& ep,
                                           const Item& it) {
  constexpr int CVS = CB / VEC, QGS = TQ / QTE;
#pragma unroll 1
  for (int e = threadIdx.x; e < CVS * QGS * TP; e += THREADS) {
    const int cv = e % CVS;
    const int qg = (e / CVS) % QGS;
    const int row = e / (CVS * QGS);
    const int p = it.p0 + row, k = it.chunk * CB + cv * VEC, q_first = it.q0 + qg * QTE;
    if (p >= g.P || k >= g.K || q_first >= g.Q) continue;
    float acc[QTE][VEC];
    const float* src = stage + row * RSP + cv * VEC * CSP + qg * QTE;
#pragma unroll
    for (int q = 0; q < QTE; ++q)
#pragma unroll
      for (int v = 0; v < VEC; ++v) acc[q][v] = src[v * CSP + q];
    const int64_t row_base = ((int64_t)it.n * g.P + p) * g.Q;
    dw::store_outputs<ACT>(acc, bias, residual, out, g, ep, row_base, q_first, k);
  }
}

}  // namespace dwm
}  // namespace cuconv

using namespace cuconv;
using namespace cuconv::dwm;

extern "C" __global__ void __launch_bounds__(THREADS, DWM_MIN_BLOCKS)
CUCONV_KERNEL_NAME(const elem_t* __restrict__ x, const elem_t* __restrict__ w, const elem_t* bias,
                   const elem_t* residual, elem_t* out, DwGeometry g, EpilogueParams ep) {
  static_assert(sizeof(elem_t) == 2, "16-bit inputs only");
  extern __shared__ __align__(16) unsigned char smem[];
  const int plane_elems = g.in_rows * PLANE_COLS;
  const int planes_bytes = (CB * plane_elems * 2 + (CB / 8) * PLANE_GAP + 15) & ~15;
  const int raw_bytes = (g.in_rows * g.in_cols * CB * 2 + 15) & ~15;
  const int buf_bytes = raw_bytes > STAGE_BYTES ? raw_bytes : STAGE_BYTES;
  unsigned char* planes = smem;
  unsigned char* raw0 = smem + planes_bytes;  // buffer b: raw0 + b * buf_bytes
  const uint32_t planes_addr = smem_u32(planes);
  const int64_t total = (int64_t)((g.K + CB - 1) / CB) * g.N * g.tiles_p * g.tiles_q;
  const int begin = (int)(total * blockIdx.x / gridDim.x), end = (int)(total * (blockIdx.x + 1) / gridDim.x);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;

  // The planes start zeroed, although every item's transpose rewrites every plane row it reads: ptxas
  // fits the 7x7 variants in 80 registers with this pass and spills 4-12 bytes without it (the compile
  // test of tests/test_depthwise_mma.py checks the catalog for spills).
  for (int i = threadIdx.x; i < planes_bytes / 16; i += THREADS)
    reinterpret_cast<uint4*>(smem)[i] = make_uint4(0u, 0u, 0u, 0u);
  if (begin < end) load_item(reinterpret_cast<elem_t*>(raw0), x, g, begin);
  sm80::cp_async_commit();
  int buf = 0;
  int b_chunk = -1;  // the chunk whose B fragments are in registers
  uint32_t bfrag[CPW][R][2];

#pragma unroll 1
  for (int item = begin; item < end; ++item) {
    const Item it = dw::decode_item<8>(g, item);
    if (it.chunk != b_chunk) {
      build_b(bfrag, w, g.K, it.chunk * CB + warp * CPW, lane);
      b_chunk = it.chunk;
    }
    unsigned char* cur = raw0 + buf * buf_bytes;
    sm80::cp_async_wait<0>();
    __syncthreads();  // the item's tile landed; the planes and the other buffer are no longer read
    if (item + 1 < end) load_item(reinterpret_cast<elem_t*>(raw0 + (buf ^ 1) * buf_bytes), x, g, item + 1);
    sm80::cp_async_commit();
    transpose_tile(planes, reinterpret_cast<const uint16_t*>(cur), g, plane_elems);
    __syncthreads();  // planes complete; the raw tile is free for the staging tile
    float* stage = reinterpret_cast<float*>(cur);
    mma_tile(stage, planes_addr, bfrag, g, plane_elems, warp, lane);
    __syncthreads();  // staging tile complete
    switch (ep.activation) {
      case ACT_RELU: store_item<ACT_RELU>(stage, bias, residual, out, g, ep, it); break;
      case ACT_SILU: store_item<ACT_SILU>(stage, bias, residual, out, g, ep, it); break;
      case ACT_GELU: store_item<ACT_GELU>(stage, bias, residual, out, g, ep, it); break;
      default: store_item<ACT_NONE>(stage, bias, residual, out, g, ep, it); break;
    }
    buf ^= 1;
  }
}
