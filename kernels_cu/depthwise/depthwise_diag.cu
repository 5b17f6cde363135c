// cuconv: depthwise convolution forward on tensor cores, taps along the MMA's reduction (the
// `depthwise_diag` kernel; host: cuconv/backends/depthwise/diag.py), conv2d, channels-last, fp16 / bf16,
// multiplier 1, C a multiple of 8.
//
// Why: a 3x3 depthwise layer does 9 multiply-adds per output, and the direct kernel (depthwise_fprop.cu)
// spends about 36 instructions per output on them (windows widened to fp32, fp32 multiply-adds): bound by
// instruction issue, not by memory. Here 16 output pixels x 8 channels are one m16n8k16 MMA per pair of
// taps (ta, tb):
//   out[m][n] += sum_{k < 8} x[pix_a(m)][c0 + k] * Da[k][n] + x[pix_b(m)][c0 + k] * Db[k][n],
//   Da = diag(w[c0 .. c0 + 7][ta]), Db = diag(w[c0 .. c0 + 7][tb]),
// so A's row m is the 8 channels of the input pixel tap ta of output m reads, then those of tap tb
// (16-byte rows: ldmatrix reads them from the channels-last tile as it is, no transpose), and B is two
// diagonal 8 x 8 blocks. A 3x3 filter is 5 MMAs (the fifth pairs tap 8 with zeros). Stride and dilation
// only move the lanes' row addresses. Products of 16-bit values are exact in fp32 and the accumulation
// is fp32. The zeros off B's diagonals multiply the other channels of the pixels an output's window
// holds: an Inf or NaN input spreads to the 8 channels of its group in those outputs.
//
// Work item (work_item.cuh): one output tile of TP rows x TQ columns x CB channels of one image;
// persistent grid, each CTA an equal run of consecutive items.
//   1. The input tile [in_rows][IN_COLS] pixels x CB channels (halo included, zero padding) is copied by
//      16-byte cp.async into one of two buffers while the CTA computes the previous item. Unit u (8
//      channels) of tile pixel p is stored at 16-byte slot p * UPP + (u ^ swz(p)) (UPP = CB / 8 units per
//      pixel): the swizzle puts the 8 rows of an ldmatrix block, 8 consecutive pixels, on 8 distinct
//      16-byte bank groups.
//   2. An M block is 2 output rows x 8 columns (16 pixels). Warp w owns the channel group (8 channels,
//      the n-tile) nt = w % NT (NT = CB / 8) and M blocks w / NT, + 8 / NT, ...: its B fragments (one pair
//      of registers per tap pair) live in registers while the chunk lasts. Per M block: one ldmatrix.x4
//      (x2 for an unpaired last tap) and one MMA per tap pair.
//   3. Epilogue straight from the accumulators: a lane holds 2 channels of 2 pixels and stores them with
//      act(alpha * acc + bias + beta * residual) (direct_epilogue.cuh), 4-byte accesses.
//
// Compile-time (host: cuconv.backends.depthwise.diag_variants): dtype, R, S, SW (W stride), DW (W
// dilation), TP, TQ, CB, MIN_BLOCKS (__launch_bounds__ occupancy). Run time (DwGeometry): the H stride,
// dilation and padding, the extents.
#include "common/types.cuh"
#include "common/epilogue_math.cuh"
#include "common/fast_div.cuh"
#include "common/smem.cuh"
#include "sm80/ptx_sm80.cuh"
#include "depthwise/vec_io.cuh"
#include "depthwise/direct_epilogue.cuh"
#include "depthwise/work_item.cuh"

#ifndef DWD_R
#define DWD_R 3
#endif
#ifndef DWD_S
#define DWD_S 3
#endif
#ifndef DWD_SW
#define DWD_SW 1
#endif
#ifndef DWD_DW
#define DWD_DW 1
#endif
#ifndef DWD_TP
#define DWD_TP 8
#endif
#ifndef DWD_TQ
#define DWD_TQ 56
#endif
#ifndef DWD_CB
#define DWD_CB 16
#endif
#ifndef DWD_MIN_BLOCKS
#define DWD_MIN_BLOCKS 4
#endif
#ifndef CUCONV_KERNEL_NAME
#define CUCONV_KERNEL_NAME depthwise_diag
#endif

namespace cuconv {
namespace dwd {

using dw::DwGeometry;
using dw::Item;

constexpr int R = DWD_R, S = DWD_S, SW = DWD_SW, DWL = DWD_DW, TP = DWD_TP, TQ = DWD_TQ, CB = DWD_CB;
constexpr int TAPS = R * S, PAIRS = (TAPS + 1) / 2;
constexpr bool ODD_TAPS = TAPS % 2 != 0;
constexpr int WARPS = 8, THREADS = 32 * WARPS;
constexpr int UPP = CB / 8;             // 16-byte units (8 channels) per tile pixel
constexpr int NT = UPP;                 // n-tiles (channel groups) per chunk
constexpr int WPN = WARPS / NT;         // warps per n-tile
constexpr int IN_COLS = (TQ - 1) * SW + (S - 1) * DWL + 1;
constexpr int MBQ = TQ / 8, MBLOCKS = (TP / 2) * MBQ;  // M blocks: 2 rows x 8 columns
// log2 of the pixels per 128-byte line (8 / UPP): the swizzle's shift.
constexpr int LOG_PPL = UPP == 1 ? 3 : UPP == 2 ? 2 : UPP == 4 ? 1 : 0;
static_assert(UPP == 1 || UPP == 2 || UPP == 4 || UPP == 8, "CB: 8, 16, 32 or 64 channels");
static_assert(TP % 2 == 0 && TQ % 8 == 0, "the tile is whole M blocks of 2 rows x 8 columns");

// The 16-byte slot of unit u of tile pixel pix (see 1. above).
__device__ __forceinline__ uint32_t slot(int pix, int u) {
  return (uint32_t)(pix * UPP + (u ^ ((pix >> LOG_PPL) & (UPP - 1))));
}

// The warp's B fragments for the chunk's n-tile starting at channel k0: for tap pair j,
// b[j][0] = (B[2t][g], B[2t+1][g]) and b[j][1] = (B[2t+8][g], B[2t+9][g]) (g = lane / 4, t = lane % 4;
// low half first) of B = [diag(w[.][2j]); diag(w[.][2j+1])]: lane (g, t) holds w[k0+g] where g / 2 == t.
__device__ __forceinline__ void build_b(uint32_t (&b)[PAIRS][2], const elem_t* w, int K, int k0, int lane) {
  const uint16_t* wb = reinterpret_cast<const uint16_t*>(w);
  const int g = lane >> 2, t = lane & 3;
  const bool holds = (g >> 1) == t && k0 + g < K;
  const int shift = 16 * (g & 1);
  const uint16_t* wk = wb + (int64_t)(k0 + g) * TAPS;
#pragma unroll
  for (int j = 0; j < PAIRS; ++j) {
    const uint32_t lo = holds ? wk[2 * j] : 0u;
    const uint32_t hi = holds && 2 * j + 1 < TAPS ? wk[2 * j + 1] : 0u;
    b[j][0] = lo << shift;
    b[j][1] = hi << shift;
  }
}

// Issue (without waiting) the 16-byte copies of item `item`'s input tile into `buf` (the swizzled
// layout of 1. above; zeros outside the image and past C).
__device__ __forceinline__ void load_item(uint32_t buf, const elem_t* x, const DwGeometry& g, int item) {
  constexpr int ROW_UNITS = IN_COLS * UPP;
  const Item it = dw::decode_item<8>(g, item);
  const int h0 = it.p0 * g.stride_h - g.pad_h, w0 = it.q0 * SW - g.pad_w, c_lo = it.chunk * CB;
  const elem_t* plane = x + (int64_t)it.n * g.H * g.W * g.C;
  const int units = g.in_rows * ROW_UNITS;
#pragma unroll 1
  for (int u = threadIdx.x; u < units; u += THREADS) {
    const int row = u / ROW_UNITS, rem = u - row * ROW_UNITS;
    const int col = rem / UPP, cu = rem % UPP;
    const int h = h0 + row, wi = w0 + col, c = c_lo + cu * 8;
    const bool valid = (unsigned)h < (unsigned)g.H && (unsigned)wi < (unsigned)g.W && c < g.C;
    const uint32_t dst = buf + 16u * slot(row * IN_COLS + col, cu);
    sm80::cp_async_zfill<16>(dst, valid ? plane + (h * g.W + wi) * g.C + c : plane, valid);
  }
}

// The warp's M blocks of one item: MMAs over the tap pairs, then the epilogue of each block.
template <int ACT>
__device__ __forceinline__ void compute_item(uint32_t buf, const uint32_t (&b)[PAIRS][2], const int (&tap_pix)[PAIRS],
                                             const elem_t* bias, const elem_t* residual, elem_t* out,
                                             const DwGeometry& g, const EpilogueParams& ep, const Item& it,
                                             int warp, int lane) {
  const int nt = warp % NT;
  const int k = it.chunk * CB + nt * 8 + 2 * (lane & 3);  // this lane's output channels k, k + 1
  if (it.chunk * CB + nt * 8 >= g.K) return;              // an n-tile past C (the last chunk)
  const int gq = lane >> 2;
  // The A row this lane addresses: output row 2 mr + (lane / 8) % 2, column 8 mc + lane % 8.
  const int lane_pix = ((lane >> 3) & 1) * g.stride_h * IN_COLS + (lane & 7) * SW;
#pragma unroll 1
  for (int mb = warp / NT; mb < MBLOCKS; mb += WPN) {
    const int mr = mb / MBQ, mc = mb - mr * MBQ;
    const int p = it.p0 + 2 * mr, q = it.q0 + 8 * mc;
    if (p >= g.P || q >= g.Q) continue;  // the block lies past the output plane (warp-uniform)
    const int block_pix = 2 * mr * g.stride_h * IN_COLS + 8 * mc * SW + lane_pix;
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int j = 0; j < PAIRS; ++j) {
      const uint32_t addr = buf + 16u * slot(block_pix + tap_pix[j], nt);
      uint32_t a[4];
      if (ODD_TAPS && j == PAIRS - 1) {  // tap 2j alone: A's columns 8-15 are zeros
        uint32_t h[2];
        sm80::ldmatrix_x2(h, addr);
        a[0] = h[0]; a[1] = h[1]; a[2] = 0u; a[3] = 0u;
      } else {
        sm80::ldmatrix_x4(a, addr);
      }
      sm80::mma_16816<elem_t>(acc, a, b[j]);
    }
    const int64_t row0 = ((int64_t)it.n * g.P + p) * g.Q;
    const float top[1][2] = {{acc[0], acc[1]}}, bottom[1][2] = {{acc[2], acc[3]}};
    dw::store_outputs<ACT>(top, bias, residual, out, g, ep, row0, q + gq, k);
    if (p + 1 < g.P) dw::store_outputs<ACT>(bottom, bias, residual, out, g, ep, row0 + g.Q, q + gq, k);
  }
}

}  // namespace dwd
}  // namespace cuconv

using namespace cuconv;
using namespace cuconv::dwd;

extern "C" __global__ void __launch_bounds__(THREADS, DWD_MIN_BLOCKS)
CUCONV_KERNEL_NAME(const elem_t* __restrict__ x, const elem_t* __restrict__ w, const elem_t* bias,
                   const elem_t* residual, elem_t* out, DwGeometry g, EpilogueParams ep) {
  static_assert(sizeof(elem_t) == 2, "16-bit inputs only");
  extern __shared__ __align__(16) unsigned char smem[];
  const uint32_t buf_bytes = (uint32_t)(g.in_rows * IN_COLS * CB * 2);
  const uint32_t buf0 = smem_u32(smem);
  const int64_t total = (int64_t)((g.K + CB - 1) / CB) * g.N * g.tiles_p * g.tiles_q;
  const int begin = (int)(total * blockIdx.x / gridDim.x), end = (int)(total * (blockIdx.x + 1) / gridDim.x);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;

  // Tile pixel offset of each tap pair's tap for this lane: lanes 0-15 address tap 2j, lanes 16-31 tap
  // 2j + 1 (A's columns 8-15; the unpaired last tap's lanes 16-31 repeat tap 2j, unread by ldmatrix.x2).
  int tap_pix[PAIRS];
#pragma unroll
  for (int j = 0; j < PAIRS; ++j) {
    const int tap = (2 * j + (lane >> 4) < TAPS) ? 2 * j + (lane >> 4) : 2 * j;
    tap_pix[j] = (tap / S) * g.dil_h * IN_COLS + (tap % S) * DWL;
  }

  if (begin < end) load_item(buf0, x, g, begin);
  sm80::cp_async_commit();
  int cur = 0;
  int b_chunk = -1;  // the chunk whose B fragments are in registers
  uint32_t bfrag[PAIRS][2];

#pragma unroll 1
  for (int item = begin; item < end; ++item) {
    const Item it = dw::decode_item<8>(g, item);
    if (it.chunk != b_chunk) {
      build_b(bfrag, w, g.K, it.chunk * CB + (warp % NT) * 8, lane);
      b_chunk = it.chunk;
    }
    sm80::cp_async_wait<0>();
    __syncthreads();  // the item's tile landed; every warp is done with the other buffer
    if (item + 1 < end) load_item(buf0 + (cur ^ 1) * buf_bytes, x, g, item + 1);
    sm80::cp_async_commit();
    const uint32_t buf = buf0 + cur * buf_bytes;
    switch (ep.activation) {
      case ACT_RELU: compute_item<ACT_RELU>(buf, bfrag, tap_pix, bias, residual, out, g, ep, it, warp, lane); break;
      case ACT_SILU: compute_item<ACT_SILU>(buf, bfrag, tap_pix, bias, residual, out, g, ep, it, warp, lane); break;
      case ACT_GELU: compute_item<ACT_GELU>(buf, bfrag, tap_pix, bias, residual, out, g, ep, it, warp, lane); break;
      default: compute_item<ACT_NONE>(buf, bfrag, tap_pix, bias, residual, out, g, ep, it, warp, lane); break;
    }
    cur ^= 1;
  }
}
