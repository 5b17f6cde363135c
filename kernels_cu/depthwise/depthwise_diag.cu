// cuconv: depthwise convolution forward on tensor cores, taps along the MMA's reduction (the
// `depthwise_diag` kernel; host: cuconv/backends/depthwise/diag.py), conv2d, channels-last, fp16 / bf16,
// multiplier 1, C a multiple of 16, filters of up to 9 taps (3x3).
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
// Work item: one output tile of TP rows x TQ columns x CB = 16 channels of one image; items are numbered
// with the chunk fastest (then tile column, tile row, image), so the CTAs at work at one time read
// every chunk of the same pixels and DRAM sees whole pixel rows. Persistent grid, each CTA an equal run
// of consecutive items.
//   1. The input tile [in_rows][IN_COLS] pixels x 16 channels (halo included, zero padding) and the
//      chunk's weights (16 channels x TAPS, 32 TAPS bytes) are one stage of a STAGES-deep ring in shared
//      memory, copied by 16-byte cp.async STAGES - 1 items ahead of the one the CTA computes: a CTA
//      keeps that many tiles in flight, which the latency of DRAM under load asks for (one tile ahead
//      leaves the CTA waiting on each copy). At W stride 2 a tile row holds its even columns, then its
//      odd ones, so 8 consecutive outputs read 8 consecutive pixels. Unit u (8 channels) of tile pixel p
//      is stored at 16-byte slot 2 p + (u ^ ((p >> 2) & 1)): the 8 rows of an ldmatrix block, 8
//      consecutive pixels, then lie on 8 distinct 16-byte bank groups.
//   2. An M block is 2 output rows x 8 columns (16 pixels); warp w takes blocks w, w + 8, ... Per block,
//      both 8-channel groups (n-tiles) and each tap pair: one ldmatrix.x4 (x2 for an unpaired last tap)
//      and one MMA. The B fragments (2 n-tiles x tap pairs) are built per item from the stage's weights.
//   3. Epilogue: act(alpha * acc + bias + beta * residual) on the accumulators (a lane holds channels
//      2t, 2t + 1 of each n-tile for pixels g and g + 8), packed to 16-bit pairs, then a 4 x 4 transpose
//      within each quad of lanes (four shuffles) leaves each lane 8 channels of one pixel: one 16-byte
//      store, a warp's stores 16 pixels x 32 bytes.
//
// Compile-time (host: cuconv.backends.depthwise.diag_variants): dtype, R, S, the strides SH, SW and
// dilations DH, DW (the lanes' row addresses fold to immediates), TP, TQ, STAGES, MIN_BLOCKS
// (__launch_bounds__ occupancy). Run time (DwGeometry): the padding and the extents.
#include "common/types.cuh"
#include "common/epilogue_math.cuh"
#include "common/fast_div.cuh"
#include "common/smem.cuh"
#include "sm80/ptx_sm80.cuh"
#include "depthwise/vec_io.cuh"
#include "depthwise/work_item.cuh"

#ifndef DWD_R
#define DWD_R 3
#endif
#ifndef DWD_S
#define DWD_S 3
#endif
#ifndef DWD_SH
#define DWD_SH 1
#endif
#ifndef DWD_SW
#define DWD_SW 1
#endif
#ifndef DWD_DH
#define DWD_DH 1
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
#ifndef DWD_STAGES
#define DWD_STAGES 4
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

constexpr int R = DWD_R, S = DWD_S, SH = DWD_SH, SW = DWD_SW, DH = DWD_DH, DWL = DWD_DW, TP = DWD_TP, TQ = DWD_TQ;
constexpr int CB = 16, NT = 2;          // channels per chunk: two n-tiles of 8, two 16-byte units a pixel
constexpr int TAPS = R * S, PAIRS = (TAPS + 1) / 2;
constexpr bool ODD_TAPS = TAPS % 2 != 0;
constexpr int WARPS = 8, THREADS = 32 * WARPS, STAGES = DWD_STAGES;
constexpr int W_UNITS = 2 * TAPS;  // 16-byte units of a chunk's weights (16 channels x TAPS, 2 bytes each)
constexpr int IN_COLS = (TQ - 1) * SW + (S - 1) * DWL + 1;
// A tile row is stored in SW phases (at W stride 2: the even input columns, then the odd ones), so the
// columns 8 consecutive outputs read are 8 consecutive pixels of the row: column c at pixel phys(c).
constexpr int HALF = (IN_COLS + SW - 1) / SW, ROW_PIX = SW * HALF;
constexpr int ROW_UNITS = IN_COLS * 2;                 // 16-byte copy units per tile row
constexpr int ROWS_PER_PASS = THREADS / ROW_UNITS;     // tile rows the CTA's threads copy at once
constexpr int MBQ = TQ / 8, MBLOCKS = (TP / 2) * MBQ;  // M blocks: 2 rows x 8 columns
static_assert(TAPS <= 9, "B fragments of 2 n-tiles x 5 tap pairs in registers");
static_assert(TP % 2 == 0 && TQ % 8 == 0, "the tile is whole M blocks of 2 rows x 8 columns");
static_assert(ROW_UNITS <= THREADS, "a tile row's copy units fit the CTA");
static_assert(STAGES >= 2, "a stage computed while the next is copied");

// The pixel of input column c within its tile row (SW phases).
__device__ __forceinline__ constexpr int phys(int c) { return (c % SW) * HALF + c / SW; }

// Byte offset of unit u of tile pixel pix (see 1. above).
__device__ __forceinline__ uint32_t slot_bytes(int pix, int u) {
  return (uint32_t)(32 * pix + 16 * (u ^ ((pix >> 2) & 1)));
}

// The B fragments of a chunk from its weights ws (16 channels x TAPS, in shared memory): for n-tile nt
// and tap pair j, b[nt][j][0] = (B[2t][g], B[2t+1][g]) and b[nt][j][1] = (B[2t+8][g], B[2t+9][g]) (g =
// lane / 4, t = lane % 4; low half first) of B = [diag(w[.][2j]); diag(w[.][2j+1])] over the chunk's
// channels 8 nt .. + 7: lane (g, t) holds ws[8 nt + g] where g / 2 == t.
__device__ __forceinline__ void build_b(uint32_t (&b)[NT][PAIRS][2], const uint16_t* wb, int lane) {
  const int g = lane >> 2, t = lane & 3;
  const bool holds = (g >> 1) == t;
  const int shift = 16 * (g & 1);
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const uint16_t* wk = wb + (8 * nt + g) * TAPS;
#pragma unroll
    for (int j = 0; j < PAIRS; ++j) {
      const uint32_t lo = holds ? wk[2 * j] : 0u;
      const uint32_t hi = holds && 2 * j + 1 < TAPS ? wk[2 * j + 1] : 0u;
      b[nt][j][0] = lo << shift;
      b[nt][j][1] = hi << shift;
    }
  }
}

// The work item: the chunk is the fastest-running index.
__device__ __forceinline__ Item decode(const DwGeometry& g, int item, int chunks) {
  const int rest = item / chunks;
  Item it = dw::decode_item<8>(g, rest);
  it.chunk = item - rest * chunks;
  return it;
}

// Issue (without waiting) the 16-byte copies of item `it`'s stage: its input tile into `buf` (the
// swizzled layout of 1. above; zeros outside the image) and its chunk's weights at `buf + tile_bytes`.
// Thread i keeps one (column, unit) of a tile row and copies it in rows i / ROW_UNITS, + ROWS_PER_PASS,
// ...; threads 0 .. W_UNITS - 1 copy a weight unit each.
__device__ __forceinline__ void load_item(uint32_t buf, uint32_t tile_bytes, const elem_t* x, const elem_t* w,
                                          const DwGeometry& g, const Item& it) {
  if (threadIdx.x < W_UNITS)
    sm80::cp_async_zfill<16>(buf + tile_bytes + 16 * threadIdx.x, w + it.chunk * CB * TAPS + 8 * threadIdx.x, true);
  const int r0 = threadIdx.x / ROW_UNITS;
  if (r0 >= ROWS_PER_PASS) return;
  const int pos = threadIdx.x - r0 * ROW_UNITS;
  const int col = pos >> 1, cu = pos & 1;
  const int wi = it.q0 * SW - g.pad_w + col;
  const bool col_ok = (unsigned)wi < (unsigned)g.W;
  const elem_t* src = x + ((int64_t)it.n * g.H * g.W + wi) * g.C + it.chunk * CB + cu * 8;
  int h = it.p0 * SH - g.pad_h + r0;
#pragma unroll 1
  for (int r = r0; r < g.in_rows; r += ROWS_PER_PASS, h += ROWS_PER_PASS) {
    const bool valid = col_ok && (unsigned)h < (unsigned)g.H;
    const uint32_t dst = buf + slot_bytes(r * ROW_PIX + phys(col), cu);
    sm80::cp_async_zfill<16>(dst, valid ? src + h * g.W * g.C : x, valid);
  }
}

// The 4 x 4 transpose of 32-bit words within each quad of lanes: on entry v[T] is the word this lane
// (t = lane % 4) holds for lane T of its quad; on exit v[s] is the word lane s held for this lane.
__device__ __forceinline__ void quad_transpose(uint32_t (&v)[4], int t) {
  const bool odd = t & 1, hi = t & 2;
  uint32_t s[4];
#pragma unroll
  for (int b = 0; b < 2; ++b) {  // across bit 0: s[2b + i] = the word from lane (t & 2) | i for index 2b + (t & 1)
    const uint32_t keep = odd ? v[2 * b + 1] : v[2 * b];
    const uint32_t got = __shfl_xor_sync(0xffffffffu, odd ? v[2 * b] : v[2 * b + 1], 1);
    s[2 * b] = odd ? got : keep;
    s[2 * b + 1] = odd ? keep : got;
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) {  // across bit 1
    const uint32_t keep = hi ? s[2 + i] : s[i];
    const uint32_t got = __shfl_xor_sync(0xffffffffu, hi ? s[i] : s[2 + i], 2);
    v[i] = hi ? got : keep;
    v[2 + i] = hi ? keep : got;
  }
}

// The warp's M blocks of one item: MMAs over the tap pairs, then the epilogue of each block.
template <int ACT>
__device__ __forceinline__ void compute_item(uint32_t buf, const uint32_t (&b)[NT][PAIRS][2], const elem_t* bias,
                                             const elem_t* residual, elem_t* out, const DwGeometry& g,
                                             const EpilogueParams& ep, const Item& it, int warp, int lane) {
  const int gq = lane >> 2, t = lane & 3;
  // The A row this lane addresses: output row 2 mr + (lane / 8) % 2, column 8 mc + lane % 8, and the
  // tap: lanes 0-15 tap 2j, lanes 16-31 tap 2j + 1 (A's columns 8-15; the unpaired last tap's lanes
  // 16-31 repeat tap 2j, unread by ldmatrix.x2).
  const int lane_pix = ((lane >> 3) & 1) * SH * ROW_PIX + (lane & 7);
  const bool second = lane >= 16;
  constexpr int row_step = 2 * SH * ROW_PIX;
  // After the transpose this lane stores pixel gq + 8 * (t / 2) of the block, channels 8 (t % 2) .. + 7.
  const int st_row = t >> 1, st_k = it.chunk * CB + 8 * (t & 1);
#pragma unroll 1
  for (int mb = warp; mb < MBLOCKS; mb += WARPS) {
    const int mr = (int)((unsigned)mb / MBQ), mc = mb - mr * MBQ;
    const int p = it.p0 + 2 * mr, q = it.q0 + 8 * mc;
    if (p >= g.P || q >= g.Q) continue;  // the block lies past the output plane (warp-uniform)
    const int block_pix = mr * row_step + 8 * mc + lane_pix;
    float acc[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[nt][e] = 0.f;
#pragma unroll
    for (int j = 0; j < PAIRS; ++j) {
      const int ta = 2 * j, tb = 2 * j + 1 < TAPS ? 2 * j + 1 : 2 * j;
      const int tap_pix = second ? (tb / S) * DH * ROW_PIX + phys((tb % S) * DWL)
                                 : (ta / S) * DH * ROW_PIX + phys((ta % S) * DWL);
      const uint32_t addr = buf + slot_bytes(block_pix + tap_pix, 0);
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const uint32_t a_nt = addr ^ (16u * nt);  // unit 1 is the other 16 bytes of the pixel's 32
        uint32_t a[4];
        if (ODD_TAPS && j == PAIRS - 1) {  // tap 2j alone: A's columns 8-15 are zeros
          uint32_t h[2];
          sm80::ldmatrix_x2(h, a_nt);
          a[0] = h[0]; a[1] = h[1]; a[2] = 0u; a[3] = 0u;
        } else {
          sm80::ldmatrix_x4(a, a_nt);
        }
        sm80::mma_16816<elem_t>(acc[nt], a, b[nt][j]);
      }
    }
    // v[2 h + nt]: channels 8 nt + 2t, + 1 of pixel gq + 8 h, for lane 2 h + nt of the quad.
    uint32_t v[4];
    const int row0 = (it.n * g.P + p) * g.Q + q;  // the block's first output pixel (N P Q < 2^31)
    float bv[NT][2];  // bias of channels 8 nt + 2t, + 1 (L1-resident: reloaded per block to spare registers)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      bv[nt][0] = bv[nt][1] = 0.f;
      if (ep.has_bias) dw::unpack2(*reinterpret_cast<const uint32_t*>(bias + it.chunk * CB + 8 * nt + 2 * t),
                                   bv[nt][0], bv[nt][1], elem_t());
    }
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        float y0 = fmaf(ep.alpha, acc[nt][2 * h], bv[nt][0]);
        float y1 = fmaf(ep.alpha, acc[nt][2 * h + 1], bv[nt][1]);
        if (ep.has_residual && p + h < g.P && q + gq < g.Q) {
          float r0, r1;
          const int64_t off = (int64_t)(row0 + h * g.Q + gq) * g.K + it.chunk * CB + 8 * nt + 2 * t;
          dw::unpack2(*reinterpret_cast<const uint32_t*>(residual + off), r0, r1, elem_t());
          y0 = fmaf(ep.beta, r0, y0);
          y1 = fmaf(ep.beta, r1, y1);
        }
        if constexpr (ACT != ACT_NONE) {
          y0 = activate(y0, ACT);
          y1 = activate(y1, ACT);
        }
        v[2 * h + nt] = pack2<elem_t>(y0, y1);
      }
    quad_transpose(v, t);
    if (p + st_row < g.P && q + gq < g.Q) {
      elem_t* dst = out + (int64_t)(row0 + st_row * g.Q + gq) * g.K + st_k;
      *reinterpret_cast<uint4*>(dst) = make_uint4(v[0], v[1], v[2], v[3]);
    }
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
  const uint32_t tile_bytes = (uint32_t)(g.in_rows * ROW_PIX * CB * 2);
  const uint32_t stage_bytes = tile_bytes + W_UNITS * 16;
  const uint32_t buf0 = smem_u32(smem);
  const int chunks = g.K / CB;
  const int64_t total = (int64_t)chunks * g.N * g.tiles_p * g.tiles_q;
  const int begin = (int)(total * blockIdx.x / gridDim.x), end = (int)(total * (blockIdx.x + 1) / gridDim.x);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;

  // The ring: item begin + k in stage k % STAGES; the first STAGES - 1 items' copies go out at once (one
  // commit group per stage, empty past the run).
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (begin + s < end) load_item(buf0 + s * stage_bytes, tile_bytes, x, w, g, decode(g, begin + s, chunks));
    sm80::cp_async_commit();
  }
  int cur = 0;  // the stage of `item`
  uint32_t bfrag[NT][PAIRS][2];

#pragma unroll 1
  for (int item = begin; item < end; ++item) {
    sm80::cp_async_wait<STAGES - 2>();
    __syncthreads();  // the item's stage landed; every warp is done with the stage the item before used
    const int ahead = item + STAGES - 1, ahead_stage = cur == 0 ? STAGES - 1 : cur - 1;
    if (ahead < end) load_item(buf0 + ahead_stage * stage_bytes, tile_bytes, x, w, g, decode(g, ahead, chunks));
    sm80::cp_async_commit();
    const Item it = decode(g, item, chunks);
    const uint32_t buf = buf0 + cur * stage_bytes;
    build_b(bfrag, reinterpret_cast<const uint16_t*>(smem + cur * stage_bytes + tile_bytes), lane);
    switch (ep.activation) {
      case ACT_RELU: compute_item<ACT_RELU>(buf, bfrag, bias, residual, out, g, ep, it, warp, lane); break;
      case ACT_SILU: compute_item<ACT_SILU>(buf, bfrag, bias, residual, out, g, ep, it, warp, lane); break;
      case ACT_GELU: compute_item<ACT_GELU>(buf, bfrag, bias, residual, out, g, ep, it, warp, lane); break;
      default: compute_item<ACT_NONE>(buf, bfrag, bias, residual, out, g, ep, it, warp, lane); break;
    }
    cur = cur == STAGES - 1 ? 0 : cur + 1;
  }
}
