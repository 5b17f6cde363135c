// cuconv: 2-D and 3-D convolution forward (implicit GEMM) for Hopper, sm_90a.
//
//   2-D (SM90_NDIM 2, NHWC):
//   out[m, k] = act(alpha * sum_{r,s,c} x[n, p*sh - ph + r*dh, q*sw - pw + s*dw, c] * w[k, r, s, c]
//                   + bias[k] + beta * C[m, k]),        m = (n * P + p) * Q + q
//   3-D (SM90_NDIM 3, NDHWC): the same with a depth axis in front of every spatial one,
//   x[n, z*sd - pd + t*dd, p*sh - ph + r*dh, q*sw - pw + s*dw, c] * w[k, t, r, s, c],
//                                                        m = ((n * O + z) * P + p) * Q + q
//
// GEMM view: M = N*(O*)P*Q rows, N = K columns, reduction over (t, r, s, c-block); the K-loop walks
// the channel blocks of one tap before the next tap, so the filter coordinate is
// ((t*R + r)*S + s, c_block*BK). A 2-D problem is the 3-D one with O = T = 1: both ranks share
// every line but the TMA instruction that loads the A box (4-D or 5-D im2col).
//
// Warp roles (THREADS = 128 * (1 + CONSUMERS)):
//   warpgroup 0, the producer (setmaxnreg.dec to PRODUCER_REGS):
//     warp 0  main load: one elected lane issues, per ring slot, the TMA im2col box of A
//             (BM pixels x BK channels of tap (r, s)) and the tiled box of B (BN filters x BK).
//     warp 1  epilogue load (HAS_RESIDUAL only): TMA-loads C in 64-channel chunks through the
//             C ring, starting after the load-order barrier. With SM90_A_XPOSE: stages the rows of
//             channels-first x (transpose_loader.cuh), and warp 0 loads the filter boxes only.
//     warps 2, 3 idle (they exist so that the consumers start on a warpgroup boundary); with
//             SM90_A_XPOSE they transpose the staged rows into the halo windows.
//   warpgroups 1..CONSUMERS, the consumers (setmaxnreg.inc to CONSUMER_REGS): warpgroup g owns
//     tile rows [64 (g-1), +64): wgmma m64nBNk16 into fp32 registers, then the epilogue, stored
//     straight from registers to global memory.
//
// Barriers (shared-memory mbarriers; "waits on" = who blocks on it):
//   full[s]     count 1 + tx bytes   main load arrives (expect_tx), TMA completes the bytes;
//                                    consumers wait on it before their wgmmas read slot s.
//   empty[s]    count 4*CONSUMERS    every consumer warp arrives once its wgmmas reading slot s
//               (x CLUSTER)          retired - with a cluster, on slot s of every CTA of the
//                                    cluster; the main load waits on it before refilling s.
//   load_order  count 1              main load arrives after issuing its prologue (first STAGES
//                                    slots); the epilogue-load warp waits on it before any C load.
//   c_full[j]   count 1 + tx bytes   epilogue load arrives (expect_tx); consumers wait on it.
//   c_empty[j]  count 4*CONSUMERS    consumer warps arrive after reading C chunk j; the epilogue
//                                    load waits on it before refilling.
//
// Split tiles (scheduler.cuh, split_reduce.cuh): a unit is a whole tile or one part of a split one.
// Every role walks the same units; the main load issues only the unit's reduction steps, the consumers
// of a PARTIAL part hand their fp32 sums to the FINISH part through `partials` / `partial_flags` and
// skip the epilogue (so the epilogue-load warp skips those units too).
//
// Clusters (SM90_CLUSTER = 2): the two CTAs of a cluster compute vertically adjacent tiles (same
// filter columns, see scheduler.cuh), so they need the same B tile in every slot. Each main-load
// warp loads its half (BN/2 filter rows) once and multicasts it into the slot of both CTAs; the
// full barrier of each CTA expects its own A box plus both halves. A slot may be refilled only
// when the consumers of *both* CTAs are done with it, hence the doubled empty count and the
// remote arrivals. L2->SM traffic per slot drops from (BM + BN) x BK to (BM + BN/2) x BK elements.
//
// Halo tiles (SM90_HALO = 1, stride-1 H and W only; halo_loader.cuh): a tile is BM/64 output rows
// x 64 output columns of one plane; per (depth tap, channel block) one window of those rows plus
// the filter's halo is loaded once into an A ring of A_STAGES slots and read by all R x S taps at
// shifted row starts, while the filter boxes stream through the B ring (full/empty above; the
// window ring has its own a_full/a_empty). Nine times less activation traffic for 3x3 filters.
//
// Channels-first x (SM90_A_CF = 1, with SM90_HALO and SM90_NCHW_OUT: NCHW / NCDHW operands read and written as
// they are): the halo windows are boxes of the tensor viewed as (W, H, D, C, N), one per input row: 64 channel
// rows of 64 pixels, read by wgmma MN-major (imm-trans-a); one window per (depth tap, channel block, filter column),
// read by the R taps of its column (halo_loader.cuh). Only the filter moves to channels-last before the call.
//
// Compile-time choices (-D): CUCONV_DTYPE (0 fp16, 1 bf16), SM90_NDIM (2 or 3), SM90_BM (128, 192 or 256: two,
// three or four consumer warpgroups), SM90_BN (64/96/128/160/192/256), SM90_STAGES, SM90_HAS_RESIDUAL (0/1), SM90_CLUSTER
// (1/2), SM90_HALO (0/1), SM90_NCHW_OUT (0/1: channels-first output and residual), SM90_A_CF (0/1: channels-first x, above),
// SM90_A_XPOSE (0/1: channels-first x staged by rows and transposed into channels-last halo windows), SM90_PHASE_OUT (0/1: the output
// columns are the stacked phases of an input gradient, stored into place; epilogue.cuh,
// consumer_epilogue_phases), SM90_B_MN (0/1: the filter read MN-major, straight from a weight whose
// output channels are contiguous: an input gradient's forward weight, per tap and phase from a table of
// taps, wgmma_mainloop.cuh), SM90_OUT_F32 (0/1: float32 output, bias
// and residual), SM90_TF32 (0/1, with SM90_OUT_F32 and CUCONV_DTYPE 1: float32 operands moved as 16-bit
// pairs and multiplied as tf32, wgmma_mainloop.cuh; no promotion), SM90_XSPLIT (0/1, with SM90_OUT_F32 and
// CUCONV_DTYPE 1: float32 x moved as SM90_TF32 moves it, split into bf16 parts in the consumers' registers,
// against a filter split ahead of the call; wgmma_split_a.cuh), SM90_NARROW_OUT (0/1, with SM90_BN 16: 16-bit
// output of any K stored element by element by the consumers, channels-last or, with SM90_NCHW_OUT,
// channels-first; the residual read there; epilogue.cuh, consumer_epilogue_narrow). The kernel's name spells them out,
// e.g. conv2d_fprop_sm90_tma_128x256x64_s4 (no residual) / conv3d_..._s4_c2_res (3-D, pair, residual) /
// conv2d_fprop_sm90_tma_256x96x64_s5 (256-row tile) / conv2d_..._s4_halo_nchw (channels-first output).
#include "common/epilogue_math.cuh"
#include "common/fast_div.cuh"
#include "common/types.cuh"
#include "sm90/blockdiag_prologue.cuh"
#include "sm90/budget.cuh"
#include "sm90/epilogue.cuh"
#include "sm90/epilogue_load.cuh"
#include "sm90/halo_loader.cuh"
#include "sm90/mn_filter_loader.cuh"
#include "sm90/pipeline.cuh"
#include "sm90/scheduler.cuh"
#include "sm90/split_reduce.cuh"
#include "sm90/tma_im2col_loader.cuh"
#include "sm90/transpose_loader.cuh"
#include "sm90/wgmma_mainloop.cuh"

#ifndef SM90_BM
#define SM90_BM 128
#endif
#ifndef SM90_BN
#define SM90_BN 256
#endif
#ifndef SM90_STAGES
#define SM90_STAGES 4
#endif
#ifndef SM90_HAS_RESIDUAL
#define SM90_HAS_RESIDUAL 0
#endif
#ifndef SM90_NDIM
#define SM90_NDIM 2
#endif
#ifndef SM90_CLUSTER
#define SM90_CLUSTER 1
#endif
#ifndef SM90_HALO
#define SM90_HALO 0
#endif
#ifndef SM90_PINGPONG
#define SM90_PINGPONG 0
#endif
#ifndef SM90_NCHW_OUT
#define SM90_NCHW_OUT 0
#endif
#ifndef SM90_A_CF
#define SM90_A_CF 0
#endif
#ifndef SM90_A_XPOSE
#define SM90_A_XPOSE 0
#endif
#ifndef SM90_OUT_F32
#define SM90_OUT_F32 0
#endif
#ifndef SM90_NARROW_OUT
#define SM90_NARROW_OUT 0
#endif
#ifndef SM90_PHASE_OUT
#define SM90_PHASE_OUT 0
#endif
// The variants that hold the narrow-group filter writer (sm90/blockdiag_prologue.cuh): those sm90_grouped
// runs (64-filter tiles, 16-bit output, its own filter K-major). Its registers cost the others' consumers
// spills (the phase-storing variants; 192 x 192 tiles at 128 registers a thread).
#define SM90_BLOCKDIAG (SM90_BN == SM90_BD_TILE_N && !(SM90_PHASE_OUT || SM90_B_MN || SM90_OUT_F32 || SM90_NARROW_OUT))
#ifndef SM90_PROMOTE_SLOTS  // (SM90_TF32's default: wgmma_mainloop.cuh)
#define SM90_PROMOTE_SLOTS (SM90_TF32 ? 0 : SM90_XSPLIT ? 3 : 4)
#endif
#if SM90_XSPLIT && !SM90_OUT_F32
#error "SM90_XSPLIT splits float32 x into a float32 epilogue (SM90_OUT_F32)"
#endif
#if SM90_TF32 && !(SM90_OUT_F32 && CUCONV_DTYPE == 1)
#error "SM90_TF32 moves float32 operands as 16-bit pairs (CUCONV_DTYPE 1) into a float32 epilogue (SM90_OUT_F32)"
#endif
// The output (and bias and residual) element type: the operands' own, or float32 (SM90_OUT_F32).
#if SM90_OUT_F32
typedef float out_t;
#else
typedef elem_t out_t;
#endif
#if SM90_NDIM != 2 && SM90_NDIM != 3
#error "SM90_NDIM must be 2 (NHWC, 4-D im2col boxes) or 3 (NDHWC, 5-D im2col boxes)"
#endif

namespace cfg {
constexpr int BM = SM90_BM, BN = SM90_BN, BK = SM90_BLOCK_K, STAGES = SM90_STAGES;
// Ping-pong (SM90_PINGPONG, halo tiles only): two consumer warpgroups take turns, each owning a whole
// BM x BN tile (MB = BM / 64 row blocks of accumulators); otherwise one warpgroup per 64 tile rows.
constexpr bool PINGPONG = SM90_PINGPONG != 0;
constexpr int CONSUMERS = PINGPONG ? 2 : BM / 64;
constexpr int MB = PINGPONG ? BM / 64 : 1;           // 64-row accumulator blocks per consumer warpgroup
constexpr int SLOT_READERS = PINGPONG ? 1 : CONSUMERS;  // consumer warpgroups reading each ring slot
constexpr int THREADS = 128 * (1 + CONSUMERS);
constexpr bool HAS_RESIDUAL = SM90_HAS_RESIDUAL != 0;
// Channels-first output (SM90_NCHW_OUT): the epilogue stores (N, K, O*P*Q) and reads a residual from
// g.residual (epilogue.cuh, consumer_epilogue_nchw); the epilogue-load warp (HAS_RESIDUAL) is off.
constexpr bool NCHW_OUT = SM90_NCHW_OUT != 0;
// Phase-scattered output (SM90_PHASE_OUT): the epilogue stores each column group's phase into place
// in the input gradient (epilogue.cuh, consumer_epilogue_phases; the ph_* members of the params).
constexpr bool PHASE_OUT = SM90_PHASE_OUT != 0;
// float32 output (SM90_OUT_F32): the epilogue stores fp32 sums (epilogue.cuh, consumer_epilogue_f32) and
// reads a float32 residual from g.residual; the epilogue-load warp (HAS_RESIDUAL) is off.
constexpr bool OUT_F32 = SM90_OUT_F32 != 0;
// Narrow 16-bit output (SM90_NARROW_OUT): 16-column tiles whose epilogue stores each value with a 16-bit
// access (any K: the last convolutions of decoders, K = 1-16) and reads the residual itself from
// g.residual; the epilogue-load warp (HAS_RESIDUAL) is off.
constexpr bool NARROW_OUT = SM90_NARROW_OUT != 0;
// Slots per promoted partial sum in the float32-output variant (wgmma_mainloop.cuh, Promotion): the
// operands are split parts of float32 data, whose accuracy the tensor cores' one-sided accumulation
// error would otherwise cap. 0 (off) in every other variant.
constexpr int PROMOTE = OUT_F32 ? SM90_PROMOTE_SLOTS : 0;
constexpr int C_STAGES = SM90_C_STAGES;
constexpr int CLUSTER = SM90_CLUSTER;  // CTAs per cluster sharing (multicasting) the filter tile
constexpr bool HALO = SM90_HALO != 0;   // halo tiles (halo_loader.cuh) instead of im2col boxes
constexpr bool A_CF = SM90_A_CF != 0;   // halo windows of channels-first x (64-pixel channel rows, MN-major)
// Channels-first x transposed in shared memory into the channels-last windows (transpose_loader.cuh): a
// staging ring of XPOSE_ST_STAGES rows before the window ring, its barriers and scratch after the others.
constexpr bool A_XPOSE = SM90_A_XPOSE != 0;
constexpr int XPOSE_ST_STAGES = SM90_XPOSE_ST_STAGES;
constexpr int ST_RING_BYTES = A_XPOSE ? XPOSE_ST_STAGES * cuconv::sm90::XPOSE_ST_STAGE_BYTES : 0;
constexpr int XPOSE_EXTRA_BYTES = A_XPOSE ? SM90_XPOSE_EXTRA_BYTES : 0;
// Halo windows: at most (S-1) dil_w = 2 extra columns and (R-1) dil_h = 2 extra rows (3x3 and
// smaller filters at dilation 1; the host checks), so a window slot holds (64 + 2) x (BM/64 + 2)
// pixel rows of 128 bytes, not rounded up to the 1024-byte swizzle atom: the window ring comes last
// (below), so only its second slot starts off an atom boundary (by 256 bytes at BM = 192, 512 at
// BM = 256), which TMA's swizzled writes and the wgmma reads agree on as they do for every tap row
// (both apply the swizzle to address bits, see halo_loader.cuh). Rounding cost the 192 x 128 halo
// tile with a residual its sixth filter slot (1280 bytes short).
constexpr int HALO_COLS_MAX = 64 + SM90_HALO_REACH_MAX, HALO_ROWS_MAX = BM / 64 + SM90_HALO_REACH_MAX;
constexpr int A_STAGES = HALO ? SM90_HALO_A_STAGES : STAGES;  // the window ring is separate from the filter ring

// Shared-memory budget per ring slot and in total. The tiles start on a 1024-byte boundary (the
// 128B-swizzle atom): the kernel re-aligns the dynamic shared memory, and the launch asks for up to
// 1 KiB of slack for that on top of what the tiles and barriers use, as much of it as fits under the
// 227 KiB limit. With no static shared memory the dynamic area starts 1024-aligned on sm_90 (CUTLASS's
// sm90 kernels rely on it too), so a variant that fills the limit needs none; the kernel checks
// that the aligned layout fits what it was given and traps otherwise (see the kernel's prologue).
// A channels-first window holds HALO_ROWS_MAX input rows of 64 channel rows of 128 bytes: every slot starts
// on an atom boundary.
constexpr int A_STAGE_BYTES = A_CF ? 64 * HALO_ROWS_MAX * 128 : HALO ? HALO_COLS_MAX * HALO_ROWS_MAX * 128 : BM * BK * 2;
constexpr int B_STAGE_BYTES = BN * BK * 2;
constexpr int C_CHUNK_BYTES = BM * SM90_C_CHUNK * 2;
constexpr int C_RING_BYTES = HAS_RESIDUAL ? C_STAGES * C_CHUNK_BYTES : 0;
constexpr int BARRIER_BYTES = SM90_BARRIER_BYTES;
constexpr int SMEM_ALIGN_SLACK = SM90_SMEM_ALIGN_SLACK;
constexpr int SMEM_USED = A_STAGES * A_STAGE_BYTES + STAGES * B_STAGE_BYTES + C_RING_BYTES + BARRIER_BYTES +
                          ST_RING_BYTES + XPOSE_EXTRA_BYTES;
constexpr int SMEM_LIMIT = SM90_SMEM_LIMIT;
constexpr int SMEM_BYTES = SMEM_USED + SMEM_ALIGN_SLACK < SMEM_LIMIT ? SMEM_USED + SMEM_ALIGN_SLACK : SMEM_LIMIT;
constexpr int STAGE_TX_BYTES = A_STAGE_BYTES + B_STAGE_BYTES;  // with a cluster: own A + every B share
constexpr int B_SHARE_ROWS = BN / CLUSTER;                     // filter rows each CTA of a cluster loads
constexpr int B_SHARE_BYTES = B_SHARE_ROWS * BK * 2;

// Register budget per role (setmaxnreg). The CTA is launched with LAUNCH_REGS per thread (what
// __launch_bounds__(THREADS, 1) allows of the 64 K register file, in steps of 8); setmaxnreg only
// moves registers inside that allocation - an increase that the decreases do not cover waits
// forever. BM = 128: 384 x 168 = 128 x 40 + 256 x 232; BM = 192: 512 x 128 = 128 x 32 + 384 x 160;
// BM = 256: 640 x 96 = 128 x 32 + 512 x 112.
constexpr int LAUNCH_REGS = (65536 / THREADS) / 8 * 8;
constexpr int PRODUCER_REGS = CONSUMERS == 2 ? 40 : 32;
constexpr int CONSUMER_REGS = ((LAUNCH_REGS * THREADS - 128 * PRODUCER_REGS) / (128 * CONSUMERS)) / 8 * 8;
constexpr int ACC_REGS = MB * BN / 2;  // fp32 accumulators per consumer thread

static_assert(BM == 128 || BM == 192 || BM == 256 || (PINGPONG && BM == 64),
              "BM: 128, 192 or 256 (two, three or four consumer warpgroups; 64 too in ping-pong)");
static_assert(!PINGPONG || (HALO && !HAS_RESIDUAL && CLUSTER == 1),
              "ping-pong warpgroups: halo tiles without a residual, single CTAs");
static_assert(!PINGPONG || ACC_REGS <= 128, "a ping-pong warpgroup holds its whole tile: MB * BN / 2 <= 128");
static_assert(BN == 64 || BN == 96 || BN == 128 || BN == 160 || BN == 192 || BN == 256 || (BN == 16 && (OUT_F32 || NARROW_OUT)),
              "wgmma N of this kernel: 64, 96, 128, 160, 192 or 256 (and 16 with the float32 or narrow epilogue)");
static_assert(!NARROW_OUT || (BN == 16 && !HAS_RESIDUAL && !OUT_F32 && !PHASE_OUT && !SM90_B_MN && !A_CF && !A_XPOSE && !PINGPONG),
              "the narrow epilogue (SM90_NARROW_OUT): 16-column cooperative tiles of 16-bit output, x channels-last, "
              "the residual read by the consumers");
static_assert(CLUSTER == 1 || CLUSTER == 2, "clusters of 1 or 2 CTAs");
static_assert(!(NCHW_OUT && HAS_RESIDUAL), "a channels-first residual is read by the consumers, not by TMA");
static_assert(!(OUT_F32 && HAS_RESIDUAL), "a float32 residual is read by the consumers, not by TMA");
static_assert(!(OUT_F32 && NCHW_OUT), "float32 output is channels-last");
static_assert(!SM90_B_MN || (CLUSTER == 1 && BN % 64 == 0 && !HAS_RESIDUAL && !NCHW_OUT && !OUT_F32),
              "an MN-major filter (SM90_B_MN): single CTAs, tiles of whole 64-column blocks, 16-bit output");
static_assert(!A_CF || (HALO && NCHW_OUT && CLUSTER == 1 && !HAS_RESIDUAL && !SM90_B_MN && !PHASE_OUT && !OUT_F32),
              "channels-first x (SM90_A_CF): halo windows of single CTAs, the channels-first 16-bit epilogue");
static_assert(!A_CF || A_STAGE_BYTES % 1024 == 0, "channels-first windows start on 128B-swizzle atoms");
static_assert(!A_XPOSE || (HALO && NCHW_OUT && !A_CF && CLUSTER == 1 && !HAS_RESIDUAL && !SM90_B_MN && !PHASE_OUT && !OUT_F32),
              "transposed channels-first x (SM90_A_XPOSE): halo windows of single CTAs, the channels-first 16-bit epilogue");
static_assert(ST_RING_BYTES % 1024 == 0, "the window ring after the staging ring starts on a 128B-swizzle atom");
static_assert(2 * XPOSE_ST_STAGES * 8 + 16 <= SM90_XPOSE_EXTRA_BYTES, "staging barriers and scratch area too small");
static_assert(!(PHASE_OUT && (HAS_RESIDUAL || NCHW_OUT || OUT_F32)),
              "the phase-scattering epilogue stores 16-bit channels-last values and reads no residual");
static_assert(B_SHARE_BYTES % 1024 == 0, "each multicast share must start on a 128B-swizzle atom");
static_assert(STAGES >= 3, "the ring needs at least 3 slots to overlap load and MMA");
static_assert(SMEM_USED <= SMEM_LIMIT, "shared-memory budget exceeded");
static_assert(B_STAGE_BYTES % 1024 == 0 && C_CHUNK_BYTES % 1024 == 0 && (HALO || A_STAGE_BYTES % 1024 == 0),
              "every tile but the second halo window must start on a 1024-byte (128B-swizzle atom) boundary");
static_assert(A_STAGE_BYTES % 128 == 0, "window slots hold whole 128-byte pixel rows");
static_assert(2 * STAGES + 2 * C_STAGES + 1 + (HALO ? 2 * A_STAGES : 0) + 2 <= BARRIER_BYTES / 8, "barrier area too small");
static_assert(128 * PRODUCER_REGS + 128 * CONSUMERS * CONSUMER_REGS <= LAUNCH_REGS * THREADS,
              "setmaxnreg: the roles' registers exceed the CTA's launch allocation");
static_assert(!(PROMOTE && PINGPONG), "promotion doubles the accumulators: not with ping-pong warpgroups");
static_assert(ACC_REGS * (PROMOTE ? 2 : 1) + 48 <= CONSUMER_REGS, "consumers need room beyond their accumulators (the compile test checks for spills)");
static_assert(PRODUCER_REGS % 8 == 0 && CONSUMER_REGS % 8 == 0, "setmaxnreg takes multiples of 8");
}  // namespace cfg

// Geometry the kernel needs at run time (built by cuconv/backends/sm90/params.py, same order).
// A 2-D problem has O = T = 1, stride_d = dil_d = 1, pad_d = 0.
struct Sm90ConvParams {
  long long M;      // N * O * P * Q
  int K;            // output channels
  int O, P, Q;      // output spatial size (depth, height, width)
  int T, R, S;      // filter
  int stride_d, stride_h, stride_w, dil_d, dil_h, dil_w, pad_d, pad_h, pad_w;  // pad_* = low side
  int c_blocks;     // ceil(C / BK)
  int last_k16;     // k16 steps holding real channels in the last channel block: ceil((C - (c_blocks-1) BK) / 16)
  int n_tiles;      // ceil(K / BN)
  int num_units;    // ceil(ceil(M / BM) / CLUSTER) * n_tiles + split_tiles * (split_ways - 1) (scheduler.cuh)
  int dp_tiles;     // units that are whole tiles (= num_units when no tile is split)
  int k_iters;      // reduction steps of a whole tile: T * R * S * c_blocks
  int split_ways;   // parts of a split tile along the reduction (scheduler.cuh; 2 when no tile is split)
  int x_tiles;      // halo tiles: ceil(Q / 64) column tiles per output row
  int y_tiles;      // halo tiles: ceil(P / (BM / 64)) row tiles per plane
  int halo_w;       // halo tiles: window width in pixels, 64 + (S - 1) * dil_w
  int halo_tx;      // halo tiles: bytes of one window box, halo_w * (BM/64 + (R - 1) * dil_h) * 128
  int a_wrap;       // channel blocks x holds (c_blocks, or fewer: block cb >= a_wrap of the reduction reads
                    // x's block cb - a_wrap; the split float32 path's [hi | lo] x against [hi | hi | lo] w)
  // Multiply-shift divisors (common/fast_div.cuh) of the per-tile index splits: the producer does
  // them before its first load, where a chain of 32-bit divisions cost ~0.5 us at kernel start.
  cuconv::FastDivisor n_tiles_div;  // n_tiles: unit -> (row tile, column tile)
  cuconv::FastDivisor opq_div;      // O * P * Q: first pixel of a row tile -> image
  cuconv::FastDivisor pq_div;       // P * Q: -> output depth
  cuconv::FastDivisor q_div;        // Q: -> output row and column
  cuconv::FastDivisor x_tiles_div;  // halo tiles: tile -> column tile
  cuconv::FastDivisor y_tiles_div;  // halo tiles: -> row tile, plane
  cuconv::FastDivisor o_div;        // halo tiles: plane -> image, depth
  const void* residual;             // SM90_NCHW_OUT / SM90_OUT_F32 / SM90_NARROW_OUT: the residual the consumers read (when ep.has_residual)
  // SM90_PHASE_OUT (zeros otherwise): the input gradient dx (N, ph_ext0, ph_ext1, ph_ext2, ph_channels)
  // the stacked phases are stored into; per axis the stride ph_s*; ph_table: per phase (row-major) the
  // offsets (d0, d1, d2, 0) of its first position, in global memory (epilogue.cuh, consumer_epilogue_phases;
  // indexed in the parameter space, a run-time index makes ptxas copy the struct to the stack).
  const int4* ph_table;
  int ph_channels, ph_ext0, ph_ext1, ph_ext2, ph_s0, ph_s1, ph_s2;
  cuconv::FastDivisor ph_channels_div;
  // SM90_B_MN (zeros otherwise): the filter is a weight viewed as (rows = the reduction's channels, taps,
  // b_cols output-channel columns), read in 64 x 64 boxes at (column, tap, row). GEMM column n lies in
  // phase n / b_cols at view column n % b_cols; b_taps[phase * T*R*S + window tap] is the view's tap that
  // the window tap reads, -1 where none: that box comes from tmap_c, which then maps a 64 x 64 block of
  // zeros (sm90/mn_filter_loader.cuh; docs/tuning.md T-direct-filter).
  const int* b_taps;
  int b_cols;
  // Grouped convolutions (sm90_grouped; 0 for a dense one): output channel n reads x's channels from
  // (n / a_kg) * a_cg on, the reduction's c_blocks blocks of them. A group of a_kg filters over a_cg
  // channels, or a 64-channel block of smaller groups against their block-diagonal filter (a_kg = a_cg = 64).
  int a_kg, a_cg;
  // Narrow groups (bd_src non-null): the grid first writes the block-diagonal filter (bd_rows = K * taps
  // rows of bd_cg weights from bd_src) into bd_dst, the buffer tmap_w maps, and meets on the counter
  // bd_sync (sm90/blockdiag_prologue.cuh).
  const uint16_t* bd_src;
  uint16_t* bd_dst;
  unsigned long long* bd_sync;
  int bd_rows, bd_taps, bd_cg;
  // SM90_A_XPOSE (zeros otherwise): staged rows of st_w pixels (a multiple of 8, odd in 16-byte chunks) from
  // window column -st_shift on (st_shift = -pad_w mod 8: the staging box starts on a 16-byte boundary).
  int st_w, st_shift;
};

#define CUCONV_CAT10(a, b, c, d, e, f, g, h, i, j) a##b##c##d##e##f##g##h##i##j
#define CUCONV_XCAT10(a, b, c, d, e, f, g, h, i, j) CUCONV_CAT10(a, b, c, d, e, f, g, h, i, j)
#define CUCONV_CAT2(a, b) a##b
#define CUCONV_XCAT2(a, b) CUCONV_CAT2(a, b)
#if SM90_HALO && SM90_XSPLIT
#define CUCONV_SM90_SUFFIX _halo_xs
#elif SM90_XSPLIT
#define CUCONV_SM90_SUFFIX _xs
#elif SM90_HALO && SM90_PINGPONG && SM90_TF32
#define CUCONV_SM90_SUFFIX _halo_pp_tf32
#elif SM90_HALO && SM90_TF32
#define CUCONV_SM90_SUFFIX _halo_tf32
#elif SM90_TF32
#define CUCONV_SM90_SUFFIX _tf32
#elif SM90_HALO && SM90_PINGPONG && SM90_OUT_F32
#define CUCONV_SM90_SUFFIX _halo_pp_f32
#elif SM90_HALO && SM90_OUT_F32
#define CUCONV_SM90_SUFFIX _halo_f32
#elif SM90_OUT_F32
#define CUCONV_SM90_SUFFIX _f32
#elif SM90_HALO && SM90_NARROW_OUT && SM90_NCHW_OUT
#define CUCONV_SM90_SUFFIX _halo_nk_nchw
#elif SM90_HALO && SM90_NARROW_OUT
#define CUCONV_SM90_SUFFIX _halo_nk
#elif SM90_NARROW_OUT && SM90_NCHW_OUT
#define CUCONV_SM90_SUFFIX _nk_nchw
#elif SM90_NARROW_OUT
#define CUCONV_SM90_SUFFIX _nk
#elif SM90_HALO && SM90_PINGPONG && SM90_PHASE_OUT
#define CUCONV_SM90_SUFFIX _halo_pp_ph
#elif SM90_HALO && SM90_PHASE_OUT
#define CUCONV_SM90_SUFFIX _halo_ph
#elif SM90_PHASE_OUT
#define CUCONV_SM90_SUFFIX _ph
#elif SM90_HALO && SM90_PINGPONG && SM90_A_XPOSE
#define CUCONV_SM90_SUFFIX _halo_pp_xp
#elif SM90_HALO && SM90_A_XPOSE
#define CUCONV_SM90_SUFFIX _halo_xp
#elif SM90_HALO && SM90_PINGPONG && SM90_A_CF
#define CUCONV_SM90_SUFFIX _halo_pp_cf
#elif SM90_HALO && SM90_A_CF
#define CUCONV_SM90_SUFFIX _halo_cf
#elif SM90_HALO && SM90_PINGPONG && SM90_NCHW_OUT
#define CUCONV_SM90_SUFFIX _halo_pp_nchw
#elif SM90_HALO && SM90_PINGPONG
#define CUCONV_SM90_SUFFIX _halo_pp
#elif SM90_HALO && SM90_NCHW_OUT
#define CUCONV_SM90_SUFFIX _halo_nchw
#elif SM90_NCHW_OUT
#define CUCONV_SM90_SUFFIX _nchw
#elif SM90_HALO && SM90_HAS_RESIDUAL
#define CUCONV_SM90_SUFFIX _halo_res
#elif SM90_HALO
#define CUCONV_SM90_SUFFIX _halo
#elif SM90_HAS_RESIDUAL
#define CUCONV_SM90_SUFFIX _res
#else
#define CUCONV_SM90_SUFFIX
#endif
#if SM90_CLUSTER > 1
#define CUCONV_SM90_CLUSTER_TAG _c2
#define CUCONV_SM90_CLUSTER_ATTR __cluster_dims__(SM90_CLUSTER, 1, 1)
#else
#define CUCONV_SM90_CLUSTER_TAG
#define CUCONV_SM90_CLUSTER_ATTR
#endif
#if SM90_B_MN
#define CUCONV_SM90_B_TAG _bmn
#else
#define CUCONV_SM90_B_TAG
#endif
#define CUCONV_SM90_KERNEL                                                                              \
  CUCONV_XCAT2(CUCONV_XCAT10(conv, SM90_NDIM, d_fprop_sm90_tma_, SM90_BM, x, SM90_BN, x64_s, SM90_STAGES,     \
                             CUCONV_SM90_CLUSTER_TAG, CUCONV_SM90_SUFFIX), CUCONV_SM90_B_TAG)

namespace sm90 = cuconv::sm90;
using Scheduler = sm90::TileScheduler<cfg::CLUSTER, Sm90ConvParams, SM90_B_MN != 0>;

__device__ __forceinline__ void main_load_warp(const sm90::TmaDescriptor& tmap_x, const sm90::TmaDescriptor& tmap_w,
                                               const sm90::TmaDescriptor& tmap_zero,
                                               const Sm90ConvParams& g, const Scheduler& sched,
                                               uint32_t a_base, uint32_t b_base, uint32_t full_bar,
                                               uint32_t empty_bar, uint32_t load_order_bar) {
  sm90::RingState<cfg::STAGES> ring;
  // Slots still to issue before the load-order barrier is signalled (0: done, or no residual).
  int before_order = cfg::HAS_RESIDUAL ? cfg::STAGES : 0;
  const int pq = g.P * g.Q;
  const int opq = g.O * pq;
  for (int t = sched.first(); sched.valid(t); t = sched.next(t)) {
    const int m0 = sched.m_tile(t) * cfg::BM;
    const int n0 = sched.n_tile(t) * cfg::BN;
    const int c0 = sm90::grouped_c0(g, n0);
    // The tile's first output pixel (n, z, p, q) -> its window origin in the input.
    const int n_img = (int)cuconv::fast_div((uint32_t)m0, g.opq_div);
    int rem = m0 - n_img * opq;
    const int z = (int)cuconv::fast_div((uint32_t)rem, g.pq_div);
    rem -= z * pq;
    const int p = (int)cuconv::fast_div((uint32_t)rem, g.q_div);
    const int q = rem - p * g.Q;
    const int d0 = z * g.stride_d - g.pad_d;
    const int h0 = p * g.stride_h - g.pad_h;
    const int w0 = q * g.stride_w - g.pad_w;
    // The unit's reduction steps [k_begin, k_end) (a whole tile: all of them), step k = the
    // channel block cb of tap (ft, r, s) with k = ((ft * R + r) * S + s) * c_blocks + cb; the
    // counters start from k_begin's decomposition and then advance like nested loops.
    const int k_begin = sched.k_begin(t);
    const int k_end = sched.k_end(t);
    int cb = 0, s = 0, r = 0, ft = 0;
#if SM90_B_MN
    int b_col[cfg::BN / 64], b_row[cfg::BN / 64];  // sm90/mn_filter_loader.cuh
    sm90::mn_filter_blocks<cfg::BN / 64>(b_col, b_row, n0, g);
#endif
    if (k_begin != 0) {  // a later part of a split tile (whole tiles start at step 0)
      const int tap0 = k_begin / g.c_blocks;
      cb = k_begin - tap0 * g.c_blocks;
      s = tap0 % g.S;
      r = (tap0 / g.S) % g.R;
      ft = tap0 / (g.S * g.R);
    }
#if SM90_B_MN
    // The blocks' taps at the current window tap, read again when the window tap changes, right after the
    // last step of the previous one was issued (read in front of every slot's boxes, the dependent load
    // cost 15% on 14x14 layers: docs/tuning.md T-direct-filter).
    int b_tap[cfg::BN / 64];
    sm90::mn_filter_taps<cfg::BN / 64>(b_tap, b_col, b_row, g.b_taps, (ft * g.R + r) * g.S + s);
    // A window tap no block of the tile reads a filter tap at is skipped (its consumers count the same
    // slots: mn_filter_live_steps).
    bool tap_live = sm90::mn_filter_tap_live<cfg::BN / 64>(b_tap);
#else
    constexpr bool tap_live = true;  // every window tap has filter taps
#endif
#pragma unroll 1
    for (int k = k_begin; k < k_end; ++k) {
      if (tap_live) {
        const uint32_t full = full_bar + 8 * ring.stage;
        const uint32_t a_dst = a_base + ring.stage * cfg::A_STAGE_BYTES;
        sm90::mbar_wait(empty_bar + 8 * ring.stage, ring.phase ^ 1u);
        sm90::mbar_arrive_expect_tx(full, cfg::STAGE_TX_BYTES);
#if SM90_NDIM == 3
        sm90::tma_load_im2col_5d(a_dst, tmap_x, full, sm90::x_channel<cfg::BK>(g, c0, cb), w0, h0, d0, n_img,
                                 (uint16_t)(s * g.dil_w), (uint16_t)(r * g.dil_h), (uint16_t)(ft * g.dil_d));
#else
        sm90::tma_load_im2col_4d(a_dst, tmap_x, full, sm90::x_channel<cfg::BK>(g, c0, cb), w0, h0, n_img,
                                 (uint16_t)(s * g.dil_w), (uint16_t)(r * g.dil_h));
#endif
#if SM90_B_MN
        sm90::mn_filter_boxes<cfg::BN / 64, cfg::BK>(b_base + ring.stage * cfg::B_STAGE_BYTES, tmap_w, tmap_zero, full,
                                                     b_col, b_tap, cb * cfg::BK);
#else
        sm90::tma_load_filter_box<cfg::CLUSTER, cfg::BN, cfg::BK>(b_base + ring.stage * cfg::B_STAGE_BYTES, tmap_w,
                                                                  full, cb * cfg::BK, (ft * g.R + r) * g.S + s, n0,
                                                                  sched.rank);
#endif
        ring.advance();
        if (before_order > 0 && --before_order == 0) sm90::mbar_arrive(load_order_bar);
      }
      if (++cb == g.c_blocks) {  // next tap
        cb = 0;
        if (++s == g.S) {
          s = 0;
          if (++r == g.R) {
            r = 0;
            ++ft;
          }
        }
#if SM90_B_MN
        if (k + 1 < k_end) {
          sm90::mn_filter_taps<cfg::BN / 64>(b_tap, b_col, b_row, g.b_taps, (ft * g.R + r) * g.S + s);
          tap_live = sm90::mn_filter_tap_live<cfg::BN / 64>(b_tap);
        }
#endif
      }
    }
    if (before_order > 0) {  // the first tile was shorter than the ring
      sm90::mbar_arrive(load_order_bar);
      before_order = 0;
    }
  }
}

// Output pixels per image and channel (O * P * Q): the plane stride of a channels-first output.
__device__ __forceinline__ long long out_plane(const Sm90ConvParams& g) { return (long long)g.O * g.P * g.Q; }

// Cooperative consumer on im2col tiles: warpgroup `consumer` owns tile rows [64 consumer, +64) of
// every tile; a split tile's halves meet in the workspace (split_reduce.cuh).
// The three consumers take the shared addresses and their lane coordinates as scalars: bundled in
// structs, ptxas spills 8 bytes in the 192 x 192 tiles with a residual (the compile test checks
// every variant for spills).
__device__ __forceinline__ void consumer_cooperative(const Sm90ConvParams& g, const Scheduler& sched, out_t* out,
                                                     const out_t* bias, const cuconv::EpilogueParams& ep,
                                                     float4* partials, int* partial_flags, uint32_t a_base,
                                                     uint32_t b_base, uint32_t c_base, uint32_t full_bar,
                                                     uint32_t empty_bar, uint32_t c_full_bar, uint32_t c_empty_bar,
                                                     int consumer, int warp_in_group, int lane) {
  sm90::RingState<cfg::STAGES> ring;
  sm90::RingState<cfg::C_STAGES> cring;
  const uint32_t a_rows = a_base + consumer * 64 * 128;  // its 64 rows of each A box
  const int row_base = 64 * consumer + 16 * warp_in_group + lane / 4;
  const int col_lane = 2 * (lane % 4);
  float acc[cfg::BN / 2];
  for (int t = sched.first(); sched.valid(t); t = sched.next(t)) {
    const int part = sched.part(t);
    const int k_begin = sched.k_begin(t);
#if SM90_B_MN
    // the slots the loader issues: the steps of the window taps the tile reads a filter tap at
    const sm90::MnLiveSteps live =
        sm90::mn_filter_live_steps<cfg::BN / 64>(g, sched.n_tile(t) * cfg::BN, k_begin, sched.k_end(t));
    const int k_iters = live.count, first_cb = live.first_cb;
#else
    const int k_iters = sched.k_end(t) - k_begin, first_cb = k_begin % g.c_blocks;
#endif
    sm90::consumer_mainloop<cfg::BN, cfg::STAGES, cfg::BK, cfg::A_STAGE_BYTES, cfg::B_STAGE_BYTES, cfg::CLUSTER,
                            cfg::PROMOTE>(
        acc, ring, k_iters, first_cb, g.c_blocks, g.last_k16, a_rows, b_base, full_bar, empty_bar);
#if SM90_B_MN
    if (k_iters == 0) {  // no live window tap in the unit's steps: its sums are zero
#pragma unroll
      for (int i = 0; i < cfg::BN / 2; ++i) acc[i] = 0.f;
    }
#endif
    if (part != sm90::UNIT_WHOLE) {
      // 0 .. 128 * CONSUMERS - 1, read here (volatile) so that it and the values derived from it
      // are not hoisted out of the tile loop: kept live, they spill at BN = 256 with a residual.
      const int consumer_thread = (int)sm90::thread_index_volatile() - 128;
      if (part == sm90::UNIT_PARTIAL) {
        const int slot = sched.slot(t, sched.part_index(t));
        int* flag = partial_flags + slot * (4 * cfg::CONSUMERS) + consumer_thread / 32;
        sm90::store_partial<cfg::BN / 2, 128 * cfg::CONSUMERS>(acc, partials, flag, slot, consumer_thread);
        continue;  // the FINISH part of this tile runs the epilogue
      }
      // The FINISH part: the other parts' sums in part order (a fixed order: the same bits every run).
#pragma unroll 1
      for (int j = 0; j < g.split_ways - 1; ++j) {
        const int slot = sched.slot(t, j);
        int* flag = partial_flags + slot * (4 * cfg::CONSUMERS) + consumer_thread / 32;
        sm90::add_partial<cfg::BN / 2, 128 * cfg::CONSUMERS>(acc, partials, flag, slot, consumer_thread);
      }
    }
    const long long m_row = (long long)sched.m_tile(t) * cfg::BM + row_base;
    const long long rows_left = g.M - m_row;
    const int row_limit = rows_left > 16 ? 16 : (int)rows_left;
    sm90::consumer_epilogue_any<elem_t, out_t, cfg::BN, cfg::C_STAGES, cfg::HAS_RESIDUAL, cfg::C_CHUNK_BYTES, cfg::NCHW_OUT, cfg::PHASE_OUT, cfg::NARROW_OUT>(
        acc, m_row, row_limit, sched.n_tile(t) * cfg::BN, g.K, out, bias, ep, cring, c_base, c_full_bar,
        c_empty_bar, row_base, col_lane, lane == 0, out_plane(g), static_cast<const out_t*>(g.residual), g);
  }
}

// Cooperative consumer on halo tiles: warpgroup `consumer` owns output row y0 + consumer of every
// tile (its window rows start `consumer` rows down).
__device__ __forceinline__ void consumer_halo(const Sm90ConvParams& g, const Scheduler& sched, out_t* out,
                                              const out_t* bias, const cuconv::EpilogueParams& ep, uint32_t a_base,
                                              uint32_t b_base, uint32_t c_base, uint32_t full_bar, uint32_t empty_bar,
                                              uint32_t c_full_bar, uint32_t c_empty_bar, uint32_t a_full_bar,
                                              uint32_t a_empty_bar, int consumer, int warp_in_group, int lane) {
  sm90::RingState<cfg::STAGES> ring;
  sm90::RingState<cfg::C_STAGES> cring;
  sm90::RingState<cfg::A_STAGES> aring;
  const int row_base = 64 * consumer + 16 * warp_in_group + lane / 4;
  const int col_lane = 2 * (lane % 4);
  const int row_in_group = 16 * warp_in_group + lane / 4;  // this thread's first column of its output row
  float acc[1][cfg::BN / 2];
  for (int t = sched.first(); sched.valid(t); t = sched.next(t)) {
    sm90::consumer_mainloop_halo<cfg::BN, 1, cfg::A_STAGES, cfg::A_STAGE_BYTES, cfg::STAGES, cfg::B_STAGE_BYTES,
                                 cfg::CLUSTER, false, Sm90ConvParams, cfg::PROMOTE>(acc, aring, ring, g, (uint32_t)(consumer * g.halo_w * 128), a_base,
                                                      b_base, a_full_bar, a_empty_bar, full_bar, empty_bar);
    const sm90::HaloTile ht = sm90::halo_tile<cfg::BM / 64>(sched.m_tile(t), g);
    const int x = ht.x0 + row_in_group;
    const long long m_row = (long long)(ht.plane_row0 + consumer) * g.Q + x;
    // (a pair's ghost CTA past the last tile has m_row >= M and stores nothing)
    const int row_limit = (ht.y0 + consumer < g.P && m_row < g.M) ? g.Q - x : 0;
    sm90::consumer_epilogue_any<elem_t, out_t, cfg::BN, cfg::C_STAGES, cfg::HAS_RESIDUAL, cfg::C_CHUNK_BYTES, cfg::NCHW_OUT, cfg::PHASE_OUT, cfg::NARROW_OUT>(
        acc[0], m_row, row_limit, sched.n_tile(t) * cfg::BN, g.K, out, bias, ep, cring, c_base, c_full_bar,
        c_empty_bar, row_base, col_lane, lane == 0, out_plane(g), static_cast<const out_t*>(g.residual), g);
  }
}

// Ping-pong consumer on halo tiles (no residual): the CTA's tiles alternate between the two
// warpgroups, tile i of its sequence being warpgroup i % 2's, which passes over the other's ring
// slots. A warpgroup starts a tile's mainloop only once the other has waited for every slot of the
// tile before (turn_bar): the producer has then filled them, so no slot of the new tile can be a
// whole ring lap ahead of its full barrier (a parity wait would pass on it). While one warpgroup
// runs its mainloop, the other runs its epilogue: the tensor cores are never idle for a tile's stores.
__device__ __forceinline__ void consumer_pingpong(const Sm90ConvParams& g, const Scheduler& sched, out_t* out,
                                                  const out_t* bias, const cuconv::EpilogueParams& ep,
                                                  uint32_t a_base, uint32_t b_base, uint32_t c_base, uint32_t full_bar,
                                                  uint32_t empty_bar, uint32_t c_full_bar, uint32_t c_empty_bar,
                                                  uint32_t a_full_bar, uint32_t a_empty_bar, uint32_t turn_bar,
                                                  int consumer, int warp_in_group, int lane) {
  sm90::RingState<cfg::STAGES> ring;
  sm90::RingState<cfg::C_STAGES> cring;
  sm90::RingState<cfg::A_STAGES> aring;
  float acc[cfg::MB][cfg::BN / 2];
  // The warpgroup's index broadcast from lane 0: ptxas then knows it is warp-uniform, so the
  // branches on it below are not divergent paths ahead of wgmmas (it would serialise them: C7519).
  const int turn = __shfl_sync(0xffffffffu, consumer, 0);
  const int a_slots = g.T * g.c_blocks * (cfg::A_CF ? g.S : 1);  // window slots of one tile (k_iters filter slots)
  const int row_in_group = 16 * warp_in_group + lane / 4;
  uint32_t turn_phase = 0;
  int i = 0;
  for (int t = sched.first(); sched.valid(t); t = sched.next(t), ++i) {
    if ((i & 1) != turn) {
      aring.skip(a_slots);
      ring.skip(g.k_iters);
      continue;
    }
    if (i > 0) {
      sm90::mbar_wait(turn_bar + 8 * turn, turn_phase);
      turn_phase ^= 1u;
    }
    sm90::consumer_mainloop_halo<cfg::BN, cfg::MB, cfg::A_STAGES, cfg::A_STAGE_BYTES, cfg::STAGES,
                                 cfg::B_STAGE_BYTES, 1, true>(acc, aring, ring, g, 0u, a_base, b_base, a_full_bar,
                                                              a_empty_bar, full_bar, empty_bar,
                                                              turn_bar + 8 * (turn ^ 1));
    const sm90::HaloTile ht = sm90::halo_tile<cfg::MB>(sched.m_tile(t), g);
    const int x = ht.x0 + row_in_group;
#pragma unroll
    for (int b = 0; b < cfg::MB; ++b) {
      const long long m_row = (long long)(ht.plane_row0 + b) * g.Q + x;
      const int row_limit = (ht.y0 + b < g.P && m_row < g.M) ? g.Q - x : 0;
      sm90::consumer_epilogue_any<elem_t, out_t, cfg::BN, cfg::C_STAGES, false, cfg::C_CHUNK_BYTES, cfg::NCHW_OUT, cfg::PHASE_OUT, cfg::NARROW_OUT>(
          acc[b], m_row, row_limit, sched.n_tile(t) * cfg::BN, g.K, out, bias, ep, cring, c_base, c_full_bar,
          c_empty_bar, row_in_group, 2 * (lane % 4), lane == 0, out_plane(g), static_cast<const out_t*>(g.residual), g);
    }
  }
}

extern "C" __global__ void __launch_bounds__(cfg::THREADS, 1) CUCONV_SM90_CLUSTER_ATTR
    CUCONV_SM90_KERNEL(const __grid_constant__ sm90::TmaDescriptor tmap_x,
                       const __grid_constant__ sm90::TmaDescriptor tmap_w,
                       const __grid_constant__ sm90::TmaDescriptor tmap_c, out_t* out, const out_t* bias,
                       const __grid_constant__ Sm90ConvParams g, const cuconv::EpilogueParams ep, float4* partials,
                       int* partial_flags) {
  extern __shared__ uint8_t smem_raw[];
  // Carve the dynamic shared memory: [B ring | C ring | A ring | barriers], 1024-aligned. With halo
  // tiles the A ring holds windows (A_STAGES slots of whole pixel rows, last so that only the second
  // one may start off an atom boundary) and full/empty guard the B ring alone.
  const uint32_t raw = cuconv::smem_u32(smem_raw);
  const uint32_t base = (raw + 1023u) & ~1023u;
  const uint32_t b_base = base;
  const uint32_t c_base = b_base + cfg::STAGES * cfg::B_STAGE_BYTES;
  const uint32_t st_base = c_base + cfg::C_RING_BYTES;  // A_XPOSE only: the staging ring
  const uint32_t a_base = st_base + cfg::ST_RING_BYTES;
  const uint32_t bar_base = a_base + cfg::A_STAGES * cfg::A_STAGE_BYTES;
  const uint32_t full_bar = bar_base;
  const uint32_t empty_bar = full_bar + 8 * cfg::STAGES;
  const uint32_t c_full_bar = empty_bar + 8 * cfg::STAGES;
  const uint32_t c_empty_bar = c_full_bar + 8 * cfg::C_STAGES;
  const uint32_t load_order_bar = c_empty_bar + 8 * cfg::C_STAGES;
  const uint32_t a_full_bar = load_order_bar + 8;  // halo tiles only
  const uint32_t a_empty_bar = a_full_bar + 8 * cfg::A_STAGES;
  const uint32_t turn_bar = a_empty_bar + 8 * cfg::A_STAGES;  // ping-pong only: turn_bar[g] = warpgroup g may start
  // A_XPOSE only: the staging ring's barriers, then the transpose's 16-byte scratch row (transpose_loader.cuh)
  const uint32_t st_full_bar = bar_base + cfg::BARRIER_BYTES;
  const uint32_t st_empty_bar = st_full_bar + 8 * cfg::XPOSE_ST_STAGES;

  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (threadIdx.x == 0) {
    // The re-aligned layout must fit the allocation (cfg::SMEM_BYTES: its alignment slack may be
    // partial, see above). Never taken where the dynamic area starts 1024-aligned; a trap, not a
    // silent overrun, if a platform ever places it otherwise.
    uint32_t dyn_bytes;
    asm volatile("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn_bytes));
    if (base - raw + (uint32_t)cfg::SMEM_USED > dyn_bytes) __trap();
    for (int s = 0; s < cfg::STAGES; ++s) {
      sm90::mbar_init(full_bar + 8 * s, 1);
      sm90::mbar_init(empty_bar + 8 * s, 4 * cfg::SLOT_READERS * cfg::CLUSTER);  // consumer warps of every CTA
    }
    for (int s = 0; s < cfg::C_STAGES; ++s) {
      sm90::mbar_init(c_full_bar + 8 * s, 1);
      sm90::mbar_init(c_empty_bar + 8 * s, 4 * cfg::CONSUMERS);
    }
    sm90::mbar_init(load_order_bar, 1);
    if constexpr (cfg::HALO) {
      for (int s = 0; s < cfg::A_STAGES; ++s) {
        sm90::mbar_init(a_full_bar + 8 * s, cfg::A_XPOSE ? 2 : 1);  // A_XPOSE: the two transposing warps
        sm90::mbar_init(a_empty_bar + 8 * s, 4 * cfg::SLOT_READERS);
      }
    }
    if constexpr (cfg::A_XPOSE) {
      for (int s = 0; s < cfg::XPOSE_ST_STAGES; ++s) {
        sm90::mbar_init(st_full_bar + 8 * s, 1);
        sm90::mbar_init(st_empty_bar + 8 * s, 2);
      }
    }
    if constexpr (cfg::PINGPONG) {
      sm90::mbar_init(turn_bar, 4);
      sm90::mbar_init(turn_bar + 8, 4);
    }
    sm90::mbar_init_fence();
  }
#if SM90_BLOCKDIAG
  // Narrow groups: the filter the TMA reads, written by every thread of the grid (blockdiag_prologue.cuh).
  if (g.bd_src != nullptr) sm90::write_blockdiag_filter<cfg::THREADS>(g);
#endif
  if (warp == 0 && lane == 0) {
    sm90::tma_prefetch_descriptor(tmap_x);
    sm90::tma_prefetch_descriptor(tmap_w);
    if (cfg::HAS_RESIDUAL || SM90_B_MN) sm90::tma_prefetch_descriptor(tmap_c);
  }
  if constexpr (cfg::CLUSTER > 1) {
    sm90::cluster_sync_all();  // the peer's barriers are initialised before anyone multicasts into them
  } else {
    __syncthreads();
  }

  // The scheduler reads its counts from the parameter bank (g is __grid_constant__): values held in
  // registers here would stay live across setmaxnreg into every role, and ptxas spills them there.
  const Scheduler sched{g, cfg::CLUSTER > 1 ? (int)sm90::cluster_ctarank() : 0};
  const int warpgroup = threadIdx.x / 128;
  if (warpgroup == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(cfg::PRODUCER_REGS));
#if SM90_BLOCKDIAG
    if (g.bd_src != nullptr) sm90::await_blockdiag_filter(g);  // every CTA's share of the filter written
#endif
    if (warp == 0) {
      if (lane == 0) {
        if constexpr (cfg::HALO) {
          sm90::halo_load_warp<cfg::BM / 64, cfg::BN, cfg::BK, cfg::A_STAGES, cfg::A_STAGE_BYTES, cfg::STAGES,
                               cfg::B_STAGE_BYTES, cfg::HAS_RESIDUAL, cfg::CLUSTER, SM90_B_MN != 0, cfg::A_CF,
                               cfg::A_XPOSE>(
              tmap_x, tmap_w, tmap_c, g, sched, a_base, b_base, a_full_bar, a_empty_bar, full_bar, empty_bar,
              load_order_bar);
        } else {
          main_load_warp(tmap_x, tmap_w, tmap_c, g, sched, a_base, b_base, full_bar, empty_bar, load_order_bar);
        }
      }
    } else if (warp == 1) {
      if constexpr (cfg::HAS_RESIDUAL) {
        if (lane == 0)
          sm90::epilogue_load_warp<cfg::BM, cfg::BN, cfg::C_STAGES, cfg::C_CHUNK_BYTES, cfg::HALO>(
              tmap_c, g, sched, c_base, c_full_bar, c_empty_bar, load_order_bar);
      } else if constexpr (cfg::A_XPOSE) {
        if (lane == 0)
          sm90::staging_load_warp<cfg::BM / 64, cfg::BN, cfg::BK, cfg::XPOSE_ST_STAGES>(tmap_x, g, sched, st_base,
                                                                                     st_full_bar, st_empty_bar);
      }
    } else if constexpr (cfg::A_XPOSE) {
      // (PAIRED: two loads in flight where the producer has 40 registers)
      sm90::transpose_warps<cfg::BM / 64, cfg::A_STAGES, cfg::A_STAGE_BYTES, cfg::XPOSE_ST_STAGES,
                            cfg::PRODUCER_REGS >= 40>(
          g, sched, st_base, a_full_bar, st_full_bar, warp - 2, lane);
    }
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(cfg::CONSUMER_REGS));
    const int consumer = warpgroup - 1, warp_in_group = warp % 4;
    if constexpr (cfg::PINGPONG) {
      consumer_pingpong(g, sched, out, bias, ep, a_base, b_base, c_base, full_bar, empty_bar, c_full_bar, c_empty_bar,
                        a_full_bar, a_empty_bar, turn_bar, consumer, warp_in_group, lane);
    } else if constexpr (cfg::HALO) {
      consumer_halo(g, sched, out, bias, ep, a_base, b_base, c_base, full_bar, empty_bar, c_full_bar, c_empty_bar,
                    a_full_bar, a_empty_bar, consumer, warp_in_group, lane);
    } else {
      consumer_cooperative(g, sched, out, bias, ep, partials, partial_flags, a_base, b_base, c_base, full_bar,
                           empty_bar, c_full_bar, c_empty_bar, consumer, warp_in_group, lane);
    }
  }
  // A CTA leaves only when its peer is done too: the peer's consumers still release slots here.
  if constexpr (cfg::CLUSTER > 1) sm90::cluster_sync_all();
}
