// cuconv (HIP): conv2d forward, NHWC, bf16/fp16 -> fp32 accumulate, implicit GEMM on CDNA3 (gfx942;
// gfx90a has every instruction used here).
//
//   GEMM view (one group per blockIdx.z):  D[m, n] = sum_k A[m, k] * B[n, k]
//     A = im2col(x)       [M = N*P*Q, Kgemm = R*S*Cg]   loader_im2col.h  (DRAM -> LDS, no VGPRs)
//     B = padded weights  [G*Kg, Kpad]                 loader_linear.h  (zero columns Kgemm..Kpad)
//     D -> act(alpha * D + bias + beta * residual)     epilogue.h
//
// Workgroup: 256 work-items = 4 waves of 64, output tile 128 x 128, each wave 64 x 64 (2 x 2 MFMA
// 32x32x8 blocks). LDS: two stages ("ping", "pong") x {A, B} half-tiles of 128 x 32 16-bit = 32 KiB.
//
// The 4-wave schedule. Every wave loads and every wave computes (no producer/consumer split): each
// lane issues exactly kLoadIters = 8 buffer_load_dword ... lds per half-tile, i.e. kLoadsPerStage = 16
// per K step (A + B), and no other vector-memory instruction inside the loop, so vmcnt counts
// exactly the K steps in flight:
//
//   prologue   issue step 0 -> ping                                   (16 outstanding)
//   loop, two K steps a trip (k_tiles = Kpad / 32 is even, hence K padded to 2 * BK = 64):
//     issue step kt+1 -> pong                                         (32 outstanding)
//     s_waitcnt vmcnt(16)   waits on: my step-kt loads (they retire in order, before step kt+1's)
//     s_barrier             waits on: every wave's step-kt loads -> ping is complete in LDS
//     MFMA on ping          (ds_read_b64 operands, 16 MFMAs per wave)
//     s_barrier             waits on: every wave's ping reads -> ping may be overwritten
//     issue step kt+2 -> ping, s_waitcnt vmcnt(16)   (last trip: no issue, s_waitcnt vmcnt(0))
//     s_barrier             pong is complete
//     MFMA on pong
//     s_barrier             pong may be overwritten (by the next trip's first issue)
//   epilogue   straight from the accumulators to global memory.
//
// Note: LLVM's waitcnt pass does not know which LDS bytes an in-flight LDS-DMA load writes, and may
// insert a conservative s_waitcnt vmcnt(0) before the ds_reads of a stage; that costs overlap, not
// correctness. The schedule's own waits are what make it correct.
//
// Compile-time variant (-D): CUCONV_DTYPE 0 fp16 / 1 bf16; CUCONV_SUBPATH 0 pointwise / 1 uniform /
// 2 per_lane; CUCONV_HALO 0/1 (padding present); CUCONV_MASK_K 0/1 (Kgemm < Kpad). The kernel name
// spells the variant; cuconv/backends/cdna3/variants.py: kernel_name() builds the same string.
// Defaults (a plain compile builds the bf16 uniform variant); the host always passes all four.
#ifndef CUCONV_DTYPE
#define CUCONV_DTYPE 1
#endif
#if CUCONV_DTYPE != 0 && CUCONV_DTYPE != 1
#error "conv2d_fprop_cdna3: CUCONV_DTYPE must be 0 (float16) or 1 (bfloat16); float32 has no MFMA path here"
#endif
#ifndef CUCONV_SUBPATH
#define CUCONV_SUBPATH 1
#endif
#ifndef CUCONV_HALO
#define CUCONV_HALO 0
#endif
#ifndef CUCONV_MASK_K
#define CUCONV_MASK_K 0
#endif

#include "common/hip_min.h"
#include "common/types.h"
#include "common/index_math.h"
#include "common/buffer_lds.h"
#include "common/epilogue_math.h"
#include "cdna3/loader_linear.h"
#include "cdna3/loader_im2col.h"
#include "cdna3/mainloop_mfma.h"
#include "cdna3/epilogue.h"

#if CUCONV_SUBPATH == 0 && CUCONV_HALO
#error "CUCONV_SUBPATH=0 (pointwise) has no padding: CUCONV_HALO must be 0"
#endif

// conv2d_fprop_cdna3_<dtype>_128x128x32_<subpath>[_halo][_maskk]
#define CUCONV_PASTE_(a, b) a##b
#define CUCONV_PASTE(a, b) CUCONV_PASTE_(a, b)
#if CUCONV_DTYPE == 0
#define CUCONV_NAME_DTYPE f16
#else
#define CUCONV_NAME_DTYPE bf16
#endif
#if CUCONV_SUBPATH == 0
#define CUCONV_NAME_PATH pointwise
#elif CUCONV_SUBPATH == 1
#define CUCONV_NAME_PATH uniform
#else
#define CUCONV_NAME_PATH per_lane
#endif
#if CUCONV_HALO
#define CUCONV_NAME_HALO _halo
#else
#define CUCONV_NAME_HALO
#endif
#if CUCONV_MASK_K
#define CUCONV_NAME_MASKK _maskk
#else
#define CUCONV_NAME_MASKK
#endif
#define CUCONV_KERNEL_NAME                                                                                          \
  CUCONV_PASTE(CUCONV_PASTE(CUCONV_PASTE(CUCONV_PASTE(CUCONV_PASTE(conv2d_fprop_cdna3_, CUCONV_NAME_DTYPE),       \
                                                      _128x128x32_), CUCONV_NAME_PATH), CUCONV_NAME_HALO),          \
               CUCONV_NAME_MASKK)

using namespace cuconv;

extern "C" __global__ void __launch_bounds__(kThreads)
CUCONV_KERNEL_NAME(const elem_t* __restrict__ x, const elem_t* __restrict__ w_padded, const elem_t* __restrict__ bias,
                   const elem_t* residual, elem_t* out, ConvGeometryHip g, EpilogueParams ep) {
  __shared__ __attribute__((aligned(16))) char lds_storage[kLdsBytes];
  const lds_ptr_t lds = (lds_ptr_t)lds_storage;

  const u32 m_tile = block_id_x() * (u32)kBlockM;   // GEMM rows (output pixels)
  const u32 n_tile = block_id_y() * (u32)kBlockN;   // output channels within the group
  const u32 group = block_id_z();
  const i32 wave = (i32)wave_id();
  const i32 lane = (i32)lane_id();
  const i32 wave_m = wave / 2, wave_n = wave % 2;

  Im2colLoader<CUCONV_SUBPATH, (bool)CUCONV_HALO, (bool)CUCONV_MASK_K> load_a(x, g, m_tile, group);
  // Weights [G * Kg, Kpad], K already zero-padded by the host: no K mask, rows past Kg don't matter.
  LinearLoader<false> load_b(w_padded, weight_lane_addresses(g, n_tile, group, wave, lane));

  MfmaWaveTile<elem_t> tile;
  tile.zero();
  mainloop<elem_t>(g, load_a, load_b, lds, g.Kpad / kBlockK, tile, wave_m, wave_n, lane);
  store_tile<elem_t>(g, ep, tile, bias, residual, out, m_tile, n_tile, group, wave_m, wave_n, lane);
}
