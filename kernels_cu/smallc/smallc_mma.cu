// cuconv: dense convolution with few input channels and a long window (a 7x7 RGB stem: 147 terms per
// output), 2-D and 3-D, channels-last, fp16 / bf16, on tensor cores (mma.sync m16n8k16) with the
// im2col read from a halo tile in shared memory (the `smallc_mma` kernel; host:
// cuconv.backends.smallc.mma).
//
// The implicit GEMM kernels cannot read a pixel of 3 channels as a 16-byte row, and the fp32 direct
// kernel (smallc_fprop.cu) spends C*R*S multiply-adds per output, too many for a 7x7 window. Here an
// output pixel's im2col row is read straight from the input tile, stored [row][col][c] with an even
// row stride ROWST (COLS_ST columns: one spare when IN_COLS * C is odd; with span copies, below, the
// row's run starts SHIFT elements in). The reduction runs over filter rows r, each a run of KRUN terms
// j = s * C + c of the filter's (S, C) order, after LEAD spare terms, KRUN = LEAD + S * C rounded up
// to even:
//   A[m][kk] = tile[base(m) + off(kk)],  base(m) = row(m) * stride_h * ROWST + col(m) * SW * CST,
//                         off(r * KRUN + LEAD + j) = r * dil_h * ROWST + SHIFT + s * DW * CST + c;
//   (CST, the stored pixel's elements: C, or for 16 or 32 channels C plus zero channels, so that a
//   quarter warp's eight pixels read distinct banks);
//   the spare term j = S * C of an odd run reads, against a zero weight, the element after the run
//   under PAIRS (below), else the window's first element; a leading spare term (j = -1) the element
//   before the run.
// With dilation 1 along W a run is S*C consecutive elements, so where SW * C is even (every base even)
// and DW == 1 or C is even, each pair of terms (kk even, kk + 1) is one aligned 32-bit word: PAIRS,
// one shared-memory read per A register (an odd SHIFT puts LEAD = 1 spare term before each run so
// that the pairs stay aligned). Otherwise (PAIRS = 0) each term is read on its own. One table of
// offsets (shared memory) and four pixel bases per thread (registers) address every A element; no
// im2col is ever written. The spare and padding terms (kk >= R * KRUN) carry zero
// weights, and the A values they read are masked to zero as well (the offset table's codes), so an Inf
// or NaN in x reaches only the outputs whose windows hold it, as in the reference.
//
// The input tile's copy (one per tile and filter depth slice) starts before the CTA multiplies the
// current tile, into a second buffer, and runs while the tensor cores work: channels-last rows whose
// length W * C and tile step TQ * SW * C are multiples of MM_SPAN elements are copied as the aligned
// 4-16 byte words covering each tile row's run (smallc/span_tile.cuh, "span copies": an RGB stem's
// rows are 16-byte copies, not 2-byte pixels; channels-first rows of length W likewise, below); other
// tiles pixel by pixel (depthwise/halo_tile.cuh), cp.async of 4-16 bytes for even C, and for odd C
// 2-byte copies through registers, which wait for their loads. A zeroed word follows each buffer's
// tile (TAIL).
//
// CTA: 4 warps, an output tile of TP rows x TQ columns (BM = TP * TQ = 128 pixels: 32 per warp, two
// m16 fragments) x BN output channels (BN / 8 n8 fragments) of one (image, output depth slice). The
// grid is persistent: a CTA takes tiles blockIdx.x, + gridDim.x, ... of (chunk of BN channels, n, o,
// tile row, tile column), fastest last, and loads its chunk's filter once (again only when a later
// tile is in another chunk).
//   1. The chunk's filter goes to shared memory as elem_t [t][BN][KPS] (reduction contiguous, zero
//      past the terms and past K; KPS = KP + 8 makes the B reads (ldmatrix) conflict-free), with the
//      offset table.
//   2. Per filter depth t whose input slice lies in the image: wait for its input tile (halo
//      included, all C channels, zero-filled padding), then start the copy of the next one (the next
//      slice, or the first slice of the CTA's next tile) into the other buffer.
//   3. Per k16 step: B fragments by ldmatrix, then per m16 fragment four 32-bit (PAIRS) or eight
//      16-bit reads of A and BN / 8 mma.sync.
//   4. Epilogue act(alpha * acc + bias + beta * residual) (depthwise/direct_epilogue.cuh): each warp
//      stages 16 of its pixels at a time as fp32 in its own shared memory and writes EV-channel
//      vectors, consecutive lanes along a pixel's channels, then along the tile row. With MM_NCHW every
//      operand is channels-first: the input tile is copied from C channel planes, by span copies into
//      a [row][c][col] tile (PLANAR: the terms then run (r, c, s), each channel's run of S terms read
//      along a row of its plane) or, where W does not allow them, gathered element by element
//      (cf_tile.cuh) into the [row][col][c] order; the filter is read from (K, C, T, R, S), and the
//      output (and the residual) written with consecutive lanes along a channel's pixels, a pair of
//      pixels per 32-bit store: the layout's caller moves nothing.
//
// Compile-time (host: cuconv.backends.smallc.mma_variants): dtype, C, R, S, SW (stride along W), DW
// (dilation along W), TP, TQ, BN, EV, VIN (channels per input copy), SPAN and SHIFT (span copies) and
// NCHW (the operands' layout).
// Everything else is run-time (MmaGeometry).
#include "common/types.cuh"
#include "common/smem.cuh"
#include "common/epilogue_math.cuh"
#include "common/fast_div.cuh"
#include "sm80/ptx_sm80.cuh"
#include "depthwise/vec_io.cuh"
#include "depthwise/halo_tile.cuh"
#include "depthwise/direct_epilogue.cuh"
#include "smallc/cf_tile.cuh"
#include "smallc/span_tile.cuh"

#ifndef SC_C
#define SC_C 3
#endif
#ifndef SC_R
#define SC_R 7
#endif
#ifndef SC_S
#define SC_S 7
#endif
#ifndef SC_SW
#define SC_SW 2
#endif
#ifndef SC_DW
#define SC_DW 1
#endif
#ifndef SC_VIN
#define SC_VIN 1
#endif
#ifndef MM_TP
#define MM_TP 8
#endif
#ifndef MM_TQ
#define MM_TQ 16
#endif
#ifndef MM_BN
#define MM_BN 64
#endif
#ifndef MM_EV
#define MM_EV 8
#endif
#ifndef MM_MIN_BLOCKS
#define MM_MIN_BLOCKS 4
#endif
#ifndef MM_NCHW
#define MM_NCHW 0
#endif
#ifndef MM_SPAN
#define MM_SPAN 0
#endif
#ifndef MM_SHIFT
#define MM_SHIFT 0
#endif
#ifndef MM_CST
#define MM_CST SC_C
#endif
#ifndef CUCONV_KERNEL_NAME
#define CUCONV_KERNEL_NAME smallc_mma
#endif

namespace cuconv {
namespace scm {

using dw::load_input_tile;
using dw::store_outputs;
using dw::TileOrigin;
using dw::load_vec;
using dw::store_vec;

constexpr int C = SC_C, R = SC_R, S = SC_S, SW = SC_SW, DWL = SC_DW;
constexpr int TP = MM_TP, TQ = MM_TQ, BM = TP * TQ, BN = MM_BN, EV = MM_EV;
// MM_NCHW: every operand channels-first: x (N, C, D, H, W), w (K, C, T, R, S), out and the residual
// (N, K, O, P, Q). The caller then moves none of them.
constexpr bool CHANNELS_FIRST = MM_NCHW != 0;
// MM_CST: elements per stored pixel of the channels-last tile copied pixel by pixel, C or C padded with
// zero channels (C a multiple of 8): with C = 16 or 32 the 8 pixels a quarter warp's A reads reach
// would start 8 or 16 words apart and share banks; at a stride of 4 x an odd number of words they fall
// in 8 distinct groups of 4 banks (host: cuconv.backends.smallc.mma_variants.pixel_stride).
constexpr int CST = MM_CST;
static_assert(CST == C || (C % 8 == 0 && CST > C && MM_SPAN == 0 && MM_NCHW == 0),
              "a padded pixel stride only for per-pixel copies of channels-last x, C a multiple of 8");
constexpr int IN_COLS = (TQ - 1) * SW + (S - 1) * DWL + 1;  // input tile columns
constexpr int COLS_ST = IN_COLS + ((IN_COLS * CST) & 1);    // stored columns: an even row stride
// MM_SPAN = V (2, 4 or 8 elements): span copies (smallc/span_tile.cuh). Channels-last, each tile row
// is copied as the aligned V-element words covering its run of IN_COLS * C elements of x; the run
// starts SHIFT elements into the stored row. Channels-first (PLANAR), the tile is stored [row][c][col]
// instead: each row holds C runs of IN_COLS elements, one per channel plane, ROWC elements apart, each
// starting SHIFT elements in.
constexpr int SPAN = MM_SPAN, SHIFT = MM_SHIFT;
static_assert(SPAN == 0 || SPAN == 2 || SPAN == 4 || SPAN == 8, "span copies of 4, 8 or 16 bytes");
static_assert(SHIFT == 0 || (SPAN > 0 && SHIFT < SPAN), "a shift lies within the first copied word");
constexpr bool PLANAR = SPAN > 0 && CHANNELS_FIRST;
constexpr int RUN_ELEMS = PLANAR ? IN_COLS : IN_COLS * C;   // elements of one copied run
constexpr int SPAN_WORDS = SPAN ? (RUN_ELEMS + SHIFT + SPAN - 1) / SPAN : 0;  // copies per run
constexpr int ROWC = PLANAR ? SPAN_WORDS * SPAN : 0;        // PLANAR: stride of the channels' runs
constexpr int ROWST = PLANAR ? C * ROWC : SPAN ? SPAN_WORDS * SPAN : COLS_ST * CST;  // tile row stride (elements)
// A pixel's window moves SW * CST elements per output column (SW when PLANAR); pairs of terms are
// adjacent elements of one run: along (s, c) channels-last, along s within one channel when PLANAR.
constexpr int PIX_STEP = PLANAR ? SW : SW * CST;
constexpr bool PAIRS = PLANAR ? (SW % 2 == 0 && DWL == 1) : (SW * C) % 2 == 0 && (DWL == 1 || C % 2 == 0);
// Under PAIRS every pixel's window starts SHIFT elements past an even offset; an odd SHIFT puts one
// spare term (LEAD) before each run of terms, so that each pair of terms is one aligned word.
constexpr int LEAD = PAIRS ? (SHIFT & 1) : 0;
// Terms of one channel's run (PLANAR: LEAD + S, even under PAIRS), of one filter row (even).
constexpr int RUNC = PLANAR ? (PAIRS ? (S + LEAD + 1) / 2 * 2 : S) : 0;
constexpr int KRUN = PLANAR ? (C * RUNC + 1) / 2 * 2 : (S * C + LEAD + 1) / 2 * 2;
constexpr int KTERMS = R * KRUN;                            // terms of one filter depth slice
constexpr int KP = (KTERMS + 15) / 16 * 16;                 // padded to whole k16 steps
constexpr int KPS = KP + 8;                                 // row stride of the filter in shared memory
constexpr int KSTEPS = KP / 16;
constexpr int NFRAG = BN / 8;
constexpr int OFFS = PAIRS ? KP / 2 : KP;                   // offset table entries (pairs or terms)
constexpr int SLD = BN + ((BN % 32 == 0 || BN % 32 == 16) ? 8 : 0);  // staged row stride (floats)
constexpr int THREADS = 128;                                // 4 warps x 32 pixels
static_assert(BM == 32 * (THREADS / 32), "the CTA tile is 4 warps of 32 pixels");
static_assert(BN % 8 == 0 && BN <= 64, "BN: whole n8 fragments, at most 64 channels");
static_assert(BN % EV == 0 && (EV == 1 || EV == 2 || EV == 4 || EV == 8), "EV: 1, 2, 4 or 8 channels");

// The run-time geometry (cuconv.backends.smallc.params.mma_geometry builds it; same field order).
struct MmaGeometry {
  int N, D, H, W, K;              // input extents (C is compile-time); output channels
  int O, P, Q, T;                 // output extents; filter depth (R, S are compile-time)
  int stride_d, stride_h, dil_d, dil_h;
  int pad_d, pad_h, pad_w;        // padding before each dim
  int tiles_p, tiles_q;           // tiles per output plane
  int tiles;                      // tiles of the whole problem: chunks x N x O x tiles_p x tiles_q
  int in_rows;                    // input tile rows
  FastDivisor div_upp, div_cols;  // the loader's divisions: by C / VIN (copy units per pixel), by COLS_ST
  FastDivisor div_tq, div_tp, div_o, div_n;  // a tile index's divisions: by tiles_q, tiles_p, O, N
};

// A tile index as (chunk, n, o, tile row, tile column), tile column fastest.
struct TileCoords {
  int chunk, n, o, tile_p, tile_q;
};
__device__ __forceinline__ TileCoords tile_coords(const MmaGeometry& g, int tile) {
  TileCoords c;
  uint32_t b = (uint32_t)tile, q = fast_div(b, g.div_tq);
  c.tile_q = (int)(b - q * (uint32_t)g.tiles_q);
  b = q; q = fast_div(b, g.div_tp);
  c.tile_p = (int)(b - q * (uint32_t)g.tiles_p);
  b = q; q = fast_div(b, g.div_o);
  c.o = (int)(b - q * (uint32_t)g.O);
  b = q; q = fast_div(b, g.div_n);
  c.n = (int)(b - q * (uint32_t)g.N);
  c.chunk = (int)q;
  return c;
}

// Shared-memory bytes of the filter slices (16-byte aligned), of one input tile buffer (16-byte
// aligned, a zeroed word after the tile included).
__device__ __forceinline__ int filter_bytes(int T) { return (T * BN * KPS * 2 + 15) & ~15; }
__device__ __forceinline__ int tile_buffer_bytes(int in_rows) { return (in_rows * ROWST * 2 + 4 + 15) & ~15; }

// Term kk of a filter depth slice as (filter row r, channel c, filter column s); false for a term
// without weight: padding past R * KRUN, a run's leading spare term (s = -1) or the spare term after
// an odd run. Channels-last: term r * KRUN + LEAD + s * C + c. PLANAR: term r * KRUN + c * RUNC + LEAD + s.
__device__ __forceinline__ bool term_position(int kk, int& r, int& c, int& s) {
  r = kk / KRUN;
  const int jj = kk - r * KRUN;
  if constexpr (PLANAR) {
    c = jj / RUNC;
    s = jj - c * RUNC - LEAD;
    return r < R && c < C && s >= 0 && s < S;
  } else {
    const int j = jj - LEAD;
    s = j >= 0 ? j / C : -1;
    c = j - s * C;
    return r < R && j >= 0 && j < S * C;
  }
}

// Where term kk's weight lies in one filter slice (k, t) of w, or -1 for a term without weight: the
// table `wtab` the filter copy reads, built once per CTA. Channels-last w[k][t][r][s][c]: the slice
// starts at (k * T + t) * R * S * C and the term is at (r * S + s) * C + c. Channels-first
// w[k][c][t][r][s]: the slice starts at k * C * T * R * S + t * R * S and the term is at
// c * T * R * S + r * S + s.
__device__ __forceinline__ int weight_entry(int kk, int T) {
  int r, c, s;
  if (!term_position(kk, r, c, s)) return -1;
  return CHANNELS_FIRST ? c * T * (R * S) + r * S + s : (r * S + s) * C + c;
}

// The chunk's filter -> sw[t][k - k0][kk] in the order of term_position, zero for the terms without
// weight and past K. Each thread issues FILTER_BATCH loads (through the read-only path) before their
// stores, so the filter costs a few memory latencies per CTA, not one per handful of elements; a
// term's place in the slice comes from `wtab`, so an element costs a few integer operations.
constexpr int FILTER_BATCH = 16;
__device__ __forceinline__ void load_filter(uint16_t* sw, const elem_t* w, const int* wtab, const MmaGeometry& g,
                                            int k0) {
  const uint16_t* wu = reinterpret_cast<const uint16_t*>(w);
  const int total = g.T * BN * KP;
  const int64_t k_stride = (int64_t)g.T * (R * S * C);  // elements per output channel's filter
  const int t_stride = CHANNELS_FIRST ? R * S : R * S * C;
#pragma unroll 1
  for (int i0 = threadIdx.x; i0 < total; i0 += FILTER_BATCH * THREADS) {
    uint16_t v[FILTER_BATCH];
#pragma unroll
    for (int b = 0; b < FILTER_BATCH; ++b) {
      const int i = i0 + b * THREADS;
      const int rest = i / KP, kk = i - rest * KP;  // rest = t * BN + nn
      const int t = rest / BN, k = k0 + rest - t * BN;
      const int e = i < total ? wtab[kk] : -1;
      const bool valid = e >= 0 && k < g.K;
      v[b] = sm80::load_u16_zfill(wu + (valid ? k * k_stride + t * t_stride + e : 0), valid);
    }
#pragma unroll
    for (int b = 0; b < FILTER_BATCH; ++b) {
      const int i = i0 + b * THREADS;
      const int rest = i / KP;
      if (i < total) sw[rest * KPS + (i - rest * KP)] = v[b];
    }
  }
}

// The offset of term kk in the input tile, relative to a pixel's base (padding terms: the tile
// row's first element). The terms of filter row r read tile row r * dil_h of the window, whose run
// (channels-last) or channel c's run (PLANAR) starts SHIFT elements in. Under PAIRS the table holds
// even terms only: a pair ending at the spare term after an odd run reads the element after the run
// (the next pixel or row, the row's spare element, or after the tile's last row a zeroed word: TAIL);
// a pair starting at a leading spare term (s = -1) reads the element before the run (the pixel
// before, or the last of the run's first SHIFT elements).
__device__ __forceinline__ int term_offset(int kk, int dil_h) {
  int r, c, s;
  term_position(kk, r, c, s);
  if (r >= R || c >= C || s >= S) return 0;  // padding, or the spare term after an odd run
  const int row = r * dil_h * ROWST + SHIFT;
  if constexpr (PLANAR) return row + c * ROWC + s * DWL;  // s = -1: the leading spare (DWL is 1 there)
  return s < 0 ? row - 1 : row + s * DWL * CST + c;
}

// Whether term kk carries a weight (a real filter term, not a spare term of a run nor padding past
// R * KRUN).
__device__ __forceinline__ bool term_weighted(int kk) {
  int r, c, s;
  return term_position(kk, r, c, s);
}

// PAIRS: the code in the two low bits of a pair's byte offset (a multiple of 4) says which halves
// carry no weight: bit 0 the high one, bit 1 the low one (0 both carry weights, 3 neither: padding).
// The A register is masked to the weighted halves, so a term without weight contributes an exact zero
// whatever the tile holds there (an Inf or NaN of x included).
__device__ __forceinline__ int pair_code(int kk) {
  return (term_weighted(kk) ? 0 : 2) | (term_weighted(kk + 1) ? 0 : 1);
}
__device__ __forceinline__ uint32_t pair_mask(int entry) {
  return ((entry & 2) ? 0u : 0x0000FFFFu) | ((entry & 1) ? 0u : 0xFFFF0000u);
}

// Without PAIRS: a term's element offset, or -1 for a term without weight (read as zero).
__device__ __forceinline__ int term_entry(int kk, int dil_h) {
  return term_weighted(kk) ? term_offset(kk, dil_h) : -1;
}

// The epilogue of this warp's 32 pixels, 16 at a time through its staging rows `st` (16 x SLD floats).
template <int ACT>
__device__ __forceinline__ void store_tile(const float (&acc)[2][NFRAG][4], float* st, const elem_t* bias,
                                           const elem_t* residual, elem_t* out, const MmaGeometry& g,
                                           const EpilogueParams& ep, int n, int o, int p0, int q0, int k0) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int gq = lane >> 2, c0 = (lane & 3) * 2;
  constexpr int VPP = BN / EV;  // vectors per pixel
#pragma unroll
  for (int f = 0; f < 2; ++f) {
    __syncwarp();  // the previous half's reads are done
#pragma unroll
    for (int j = 0; j < NFRAG; ++j) {
      *reinterpret_cast<float2*>(st + gq * SLD + j * 8 + c0) = make_float2(acc[f][j][0], acc[f][j][1]);
      *reinterpret_cast<float2*>(st + (gq + 8) * SLD + j * 8 + c0) = make_float2(acc[f][j][2], acc[f][j][3]);
    }
    __syncwarp();
    if constexpr (CHANNELS_FIRST) {
      // Channels-first: lanes 0-7 take the 8 pixel pairs of the half's 16 pixels in one channel, lanes
      // 8-15, 16-23 and 24-31 those of the next three channels; a pair is one 32-bit store where both
      // pixels are in the row and the addresses are 4-byte aligned (two 16-bit stores otherwise). TQ
      // is even, so a pair never straddles two tile rows.
      static_assert(TQ % 2 == 0, "pixel pairs lie in one tile row");
      const int64_t plane = (int64_t)g.O * g.P * g.Q;
#pragma unroll 4
      for (int idx = lane; idx < 8 * BN; idx += 32) {
        const int px = (idx & 7) * 2, kk = idx >> 3;
        const int m = warp * 32 + f * 16 + px;
        const int p = p0 + m / TQ, q = q0 + m % TQ, k = k0 + kk;
        if (p >= g.P || q >= g.Q || k >= g.K) continue;
        const int64_t off = ((int64_t)n * g.K + k) * plane + ((int64_t)o * g.P + p) * g.Q + q;
        const float b = ep.has_bias ? to_float(bias[k]) : 0.f;
        float y[2] = {fmaf(ep.alpha, st[px * SLD + kk], b), fmaf(ep.alpha, st[(px + 1) * SLD + kk], b)};
        const bool two = q + 1 < g.Q;
        if (two && reinterpret_cast<unsigned long long>(out + off) % 4 == 0 &&
            (!ep.has_residual || reinterpret_cast<unsigned long long>(residual + off) % 4 == 0)) {
          if (ep.has_residual) {
            float r[2];
            load_vec<elem_t, 2>(residual + off, r);
            y[0] = fmaf(ep.beta, r[0], y[0]);
            y[1] = fmaf(ep.beta, r[1], y[1]);
          }
          y[0] = activate(y[0], ACT);
          y[1] = activate(y[1], ACT);
          store_vec<elem_t, 2>(out + off, y);
        } else {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            if (e == 1 && !two) break;
            if (ep.has_residual) y[e] = fmaf(ep.beta, to_float(residual[off + e]), y[e]);
            out[off + e] = from_float<elem_t>(activate(y[e], ACT));
          }
        }
      }
      continue;
    }
#pragma unroll 2
    for (int idx = lane; idx < 16 * VPP; idx += 32) {
      const int px = idx / VPP, cv = idx - px * VPP;
      const int m = warp * 32 + f * 16 + px;
      const int p = p0 + m / TQ, q = q0 + m % TQ, k = k0 + cv * EV;
      if (p >= g.P || q >= g.Q || k >= g.K) continue;
      float v[1][EV];
#pragma unroll
      for (int e = 0; e < EV; ++e) v[0][e] = st[px * SLD + cv * EV + e];
      store_outputs<ACT, 1, EV>(v, bias, residual, out, g, ep, (((int64_t)n * g.O + o) * g.P + p) * g.Q, q, k);
    }
  }
}

// Tile copies: where the input tile of (tile, slice t) of the problem comes from.
struct TileSource {
  const elem_t* plane;  // x at (n, d) (channels-first: at (n, channel 0, d)): the input plane of the slice
  int h0, w0;           // the tile's top-left input pixel (may be negative: padding)
};

__device__ __forceinline__ TileSource tile_source(const elem_t* x, const MmaGeometry& g, int tile, int t) {
  const TileCoords c = tile_coords(g, tile);
  const int d = c.o * g.stride_d - g.pad_d + t * g.dil_d;
  TileSource src;
  src.plane = CHANNELS_FIRST ? x + ((int64_t)c.n * C * g.D + d) * ((int64_t)g.H * g.W)
                            : x + ((int64_t)c.n * g.D + d) * ((int64_t)g.H * g.W * C);
  src.h0 = c.tile_p * TP * g.stride_h - g.pad_h;
  src.w0 = c.tile_q * TQ * SW - g.pad_w;
  return src;
}

// Whether filter slice t of tile `tile` reads the image (not a depth padding slice).
__device__ __forceinline__ bool slice_in_image(const MmaGeometry& g, int tile, int t) {
  const int o = tile_coords(g, tile).o;
  return (unsigned)(o * g.stride_d - g.pad_d + t * g.dil_d) < (unsigned)g.D;
}

// The next (tile, t) of this CTA after (tile, t) whose slice reads the image: tile >= g.tiles when none.
__device__ __forceinline__ void next_slice(const MmaGeometry& g, int& tile, int& t) {
  ++t;
  while (tile < g.tiles) {
    for (; t < g.T; ++t)
      if (slice_in_image(g, tile, t)) return;
    tile += gridDim.x;
    t = 0;
  }
}

}  // namespace scm
}  // namespace cuconv

using namespace cuconv;
using namespace cuconv::scm;

extern "C" __global__ void __launch_bounds__(THREADS, MM_MIN_BLOCKS)
CUCONV_KERNEL_NAME(const elem_t* __restrict__ x, const elem_t* __restrict__ w, const elem_t* bias,
                   const elem_t* residual, elem_t* out, MmaGeometry g, EpilogueParams ep) {
  extern __shared__ __align__(16) unsigned char smem[];
  uint16_t* sw = reinterpret_cast<uint16_t*>(smem);                     // [T][BN][KPS]
  const int f_bytes = filter_bytes(g.T);
  int* offtab = reinterpret_cast<int*>(smem + f_bytes);                 // [OFFS]
  int* wtab = offtab + OFFS;                                            // [KP]
  unsigned char* tiles = smem + f_bytes + (OFFS + KP) * 4;              // two buffers [in_rows][ROWST]
  const int buf_bytes = tile_buffer_bytes(g.in_rows);
  float* stage = reinterpret_cast<float*>(tiles + 2 * buf_bytes);      // [4 warps][16][SLD]
  const int tile_bytes = g.in_rows * ROWST * 2;

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int c0 = (lane & 3) * 2;

  // Once per CTA: the offset table (byte offsets of term pairs under PAIRS, else element offsets of
  // terms), the filter terms' places (wtab) and the zeroed word after each tile buffer (TAIL).
  for (int i = threadIdx.x; i < OFFS; i += THREADS)
    offtab[i] = PAIRS ? term_offset(2 * i, g.dil_h) * 2 | pair_code(2 * i) : term_entry(i, g.dil_h);
  for (int i = threadIdx.x; i < KP; i += THREADS) wtab[i] = weight_entry(i, g.T);
  if (threadIdx.x < 2) *reinterpret_cast<uint32_t*>(tiles + threadIdx.x * buf_bytes + tile_bytes) = 0u;
  // This thread's ldmatrix address of the B fragments (lane -> n row, k half), relative to a slice.
  const uint32_t b_lane =
      smem_u32(sw) + (uint32_t)((((lane >> 4) * 8 + (lane & 7)) * KPS + ((lane >> 3) & 1) * 8) * 2);

  // Start the copy of input tile (tile, t) into buffer `buf`.
  auto start_copy = [&](int tile, int t, int buf) {
    const TileSource src = tile_source(x, g, tile, t);
    unsigned char* dst = tiles + buf * buf_bytes;
    if constexpr (PLANAR) {  // C runs per tile row, one from each channel plane
      sc::copy_tile_span<SPAN, SPAN_WORDS, THREADS, C>(reinterpret_cast<elem_t*>(dst), src.plane,
                                                       (int64_t)g.D * g.H * g.W, src.h0, src.w0 - SHIFT,
                                                       g.in_rows, ROWST, ROWC, g.H, g.W);
      sm80::cp_async_commit();
      return;
    } else if constexpr (SPAN > 0) {  // one run per tile row
      sc::copy_tile_span<SPAN, SPAN_WORDS, THREADS, 1>(reinterpret_cast<elem_t*>(dst), src.plane, 0, src.h0,
                                                       src.w0 * C - SHIFT, g.in_rows, ROWST, 0, g.H, g.W * C);
      sm80::cp_async_commit();
      return;
    }
    if constexpr (CHANNELS_FIRST) {
      sc::gather_tile_channels_first<C, COLS_ST>(reinterpret_cast<elem_t*>(dst), src.plane, (int64_t)g.D * g.H * g.W,
                                             src.h0, src.w0, g.in_rows, COLS_ST, FastDivisor{}, g.H, g.W, THREADS);
      sm80::cp_async_commit();  // an empty group: the waits count groups as for cp.async copies
      return;
    }
    TileOrigin org;
    org.plane = src.plane;
    org.h0 = src.h0;
    org.w0 = src.w0;
    org.c_lo = 0;
    org.rows = g.in_rows;
    org.cols = COLS_ST;
    org.cin = CST;  // channels C..CST-1 of each stored pixel are zero-filled
    load_input_tile<SC_VIN>(reinterpret_cast<elem_t*>(dst), org, g.H, g.W, C, g.div_upp, g.div_cols);
    sm80::cp_async_commit();
  };

  // The copy in flight: (next_tile, next_t) into buffer `buf` (none when next_tile >= g.tiles).
  int next_tile = blockIdx.x, next_t = -1;
  next_slice(g, next_tile, next_t);
  int buf = 0;
  if (next_tile < g.tiles) start_copy(next_tile, next_t, buf);

  int k0_loaded = -1;
#pragma unroll 1
  for (int tile = blockIdx.x; tile < g.tiles; tile += gridDim.x) {
    const TileCoords tc = tile_coords(g, tile);
    const int n = tc.n, o = tc.o;
    const int k0 = tc.chunk * BN;
    const int p0 = tc.tile_p * TP, q0 = tc.tile_q * TQ;

    if (k0 != k0_loaded) {  // 1. this chunk's filter
      __syncthreads();      // every warp is done with the previous chunk's
      load_filter(sw, w, wtab, g, k0);
      k0_loaded = k0;
    }

    int base[2][2];  // [m16 fragment][rows lane/4, lane/4 + 8]: the pixel's window origin (bytes)
#pragma unroll
    for (int f = 0; f < 2; ++f)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int m = warp * 32 + f * 16 + h * 8 + (lane >> 2);
        base[f][h] = ((m / TQ) * g.stride_h * ROWST + (m % TQ) * PIX_STEP) * 2;
      }
    float acc[2][NFRAG][4];
#pragma unroll
    for (int f = 0; f < 2; ++f)
#pragma unroll
      for (int j = 0; j < NFRAG; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[f][j][e] = 0.f;

#pragma unroll 1
    while (next_tile == tile) {  // the slices of this tile that read the image
      const int t = next_t;
      // 2. Wait for this slice's tile; once every thread has it (and is done with the other buffer),
      //    start the next copy there.
      sm80::cp_async_wait<0>();
      __syncthreads();
      const unsigned char* sxb = tiles + buf * buf_bytes;
      next_slice(g, next_tile, next_t);
      buf ^= 1;
      if (next_tile < g.tiles) start_copy(next_tile, next_t, buf);
      // 3. The k16 steps.
      const uint32_t b_slice = b_lane + (uint32_t)(t * BN * KPS * 2);
#pragma unroll 2  // a whole unroll keeps every step's loads in flight: spills at 128 registers
      for (int ks = 0; ks < KSTEPS; ++ks) {
        uint32_t bf[NFRAG][2];
#pragma unroll
        for (int jj = 0; jj < NFRAG / 2; ++jj) {
          uint32_t r4[4];
          sm80::ldmatrix_x4(r4, b_slice + (uint32_t)((jj * 16 * KPS + ks * 16) * 2));
          bf[2 * jj][0] = r4[0]; bf[2 * jj][1] = r4[1]; bf[2 * jj + 1][0] = r4[2]; bf[2 * jj + 1][1] = r4[3];
        }
        if constexpr (NFRAG % 2) {  // the last n8 fragment alone (lanes 0-15 give its addresses)
          uint32_t r2[2];
          sm80::ldmatrix_x2(r2, b_slice + (uint32_t)(((NFRAG - 1) * 8 * KPS + ks * 16) * 2));
          bf[NFRAG - 1][0] = r2[0]; bf[NFRAG - 1][1] = r2[1];
        }
        uint32_t a[2][4];
        if constexpr (PAIRS) {
          const int ea = offtab[ks * 8 + (lane & 3)], eb = offtab[ks * 8 + 4 + (lane & 3)];
          const int oa = ea & ~3, ob = eb & ~3;  // byte offsets of the pairs
          const uint32_t ma = pair_mask(ea), mb = pair_mask(eb);
#pragma unroll
          for (int f = 0; f < 2; ++f) {
            const unsigned char* r0 = sxb + base[f][0];
            const unsigned char* r1 = sxb + base[f][1];
            a[f][0] = *reinterpret_cast<const uint32_t*>(r0 + oa) & ma;
            a[f][1] = *reinterpret_cast<const uint32_t*>(r1 + oa) & ma;
            a[f][2] = *reinterpret_cast<const uint32_t*>(r0 + ob) & mb;
            a[f][3] = *reinterpret_cast<const uint32_t*>(r1 + ob) & mb;
          }
        } else {
          const int2 ea = *reinterpret_cast<const int2*>(offtab + ks * 16 + c0);
          const int2 eb = *reinterpret_cast<const int2*>(offtab + ks * 16 + c0 + 8);
          // a term entry below zero carries no weight: read the window's first element, keep zero
          const int2 oa = make_int2(max(ea.x, 0), max(ea.y, 0)), ob = make_int2(max(eb.x, 0), max(eb.y, 0));
          const uint32_t ma = (ea.x < 0 ? 0u : 0xFFFFu) | (ea.y < 0 ? 0u : 0xFFFF0000u);
          const uint32_t mb = (eb.x < 0 ? 0u : 0xFFFFu) | (eb.y < 0 ? 0u : 0xFFFF0000u);
#pragma unroll
          for (int f = 0; f < 2; ++f) {
            const uint16_t* r0 = reinterpret_cast<const uint16_t*>(sxb + base[f][0]);
            const uint16_t* r1 = reinterpret_cast<const uint16_t*>(sxb + base[f][1]);
            a[f][0] = ((uint32_t)r0[oa.x] | ((uint32_t)r0[oa.y] << 16)) & ma;
            a[f][1] = ((uint32_t)r1[oa.x] | ((uint32_t)r1[oa.y] << 16)) & ma;
            a[f][2] = ((uint32_t)r0[ob.x] | ((uint32_t)r0[ob.y] << 16)) & mb;
            a[f][3] = ((uint32_t)r1[ob.x] | ((uint32_t)r1[ob.y] << 16)) & mb;
          }
        }
#pragma unroll
        for (int f = 0; f < 2; ++f)
#pragma unroll
          for (int j = 0; j < NFRAG; ++j) sm80::mma_16816<elem_t>(acc[f][j], a[f], bf[j]);
      }
    }

    // 4. Epilogue (warp-private staging: no CTA-wide barrier).
    float* st = stage + warp * 16 * SLD;
    switch (ep.activation) {
      case ACT_RELU: store_tile<ACT_RELU>(acc, st, bias, residual, out, g, ep, n, o, p0, q0, k0); break;
      case ACT_SILU: store_tile<ACT_SILU>(acc, st, bias, residual, out, g, ep, n, o, p0, q0, k0); break;
      case ACT_GELU: store_tile<ACT_GELU>(acc, st, bias, residual, out, g, ep, n, o, p0, q0, k0); break;
      default: store_tile<ACT_NONE>(acc, st, bias, residual, out, g, ep, n, o, p0, q0, k0); break;
    }
  }
}
