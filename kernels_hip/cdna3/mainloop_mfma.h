// cuconv (HIP, CDNA3): the MFMA mainloop and its 4-wave double-buffered K schedule.
//
// Wave tile: each of the 4 waves owns 64 x 64 of the workgroup's 128 x 128 output tile
// (wave_m = wave / 2, wave_n = wave % 2) as 2 x 2 blocks of v_mfma_f32_32x32x8{bf16_1k,f16}:
//   A operand, lane L: row  L % 32 of the block, k = 4 * (L / 32) .. + 3   (one 8-byte ds_read)
//   B operand, lane L: col  L % 32 of the block, k = 4 * (L / 32) .. + 3   (B half-tile is [n][k])
//   C (16 fp32 per lane): register i -> row 8 * (i / 4) + 4 * (L / 32) + i % 4, col L % 32
// A half-tile (kBlockK = 32) is 4 MFMA k-steps of 8. Accumulators: 4 x 16 = 64 fp32 per lane.
//
// The schedule (which waits on what) is described at the top of conv2d_fprop_cdna3.hip.
#pragma once

#include "common/buffer_lds.h"
#include "common/index_math.h"
#include "common/types.h"

namespace cuconv {

constexpr i32 kWaveTileM = 64;
constexpr i32 kWaveTileN = 64;
constexpr i32 kMfmaM = 32, kMfmaN = 32, kMfmaK = 8;
constexpr i32 kFragsM = kWaveTileM / kMfmaM;  // 2
constexpr i32 kFragsN = kWaveTileN / kMfmaN;  // 2
constexpr i32 kLoadsPerStage = 2 * kLoadIters;  // A + B half-tiles: the vmcnt one K step adds per lane
constexpr i32 kLdsBytes = 4 * kHalfTileBytes;   // {A, B} x {ping, pong} = 32 KiB
static_assert(kWaveTileM * 2 == kBlockM && kWaveTileN * 2 == kBlockN, "2 x 2 waves cover the block tile");
static_assert(kBlockK % kMfmaK == 0, "a half-tile is a whole number of MFMA k-steps");
static_assert(kLoadsPerStage < 64 / 2, "two stages in flight must fit the 6-bit vmcnt");
static_assert(kLdsBytes <= 64 * 1024, "LDS budget of one workgroup on gfx90a / gfx942");

#if CUCONV_HIP_DEVICE_COMPILE

typedef __attribute__((address_space(3))) const char* lds_cptr_t;

template <typename Elem> struct Mfma;

template <> struct Mfma<bf16_t> {
  static CUCONV_DEV f32x16 mma(u64 a, u64 b, f32x16 c) {
    return __builtin_amdgcn_mfma_f32_32x32x8bf16_1k(__builtin_bit_cast(i16x4, a), __builtin_bit_cast(i16x4, b), c,
                                                    0, 0, 0);
  }
};

template <> struct Mfma<half_t> {
  static CUCONV_DEV f32x16 mma(u64 a, u64 b, f32x16 c) {
    return __builtin_amdgcn_mfma_f32_32x32x8f16(__builtin_bit_cast(f16x4, a), __builtin_bit_cast(f16x4, b), c, 0, 0,
                                                0);
  }
};

template <typename Elem>
struct MfmaWaveTile {
  f32x16 acc[kFragsM][kFragsN];

  CUCONV_DEV void zero() {
#pragma unroll
    for (i32 i = 0; i < kFragsM; ++i)
#pragma unroll
      for (i32 j = 0; j < kFragsN; ++j) acc[i][j] = f32x16{};
  }

  // acc += A_half_tile[wave rows] x B_half_tile[wave cols]^T over the half-tile's kBlockK columns.
  CUCONV_DEV void compute(lds_cptr_t a_tile, lds_cptr_t b_tile, i32 wave_m, i32 wave_n, i32 lane) {
    const i32 row_in_frag = lane % 32;
    const i32 k_in_step = 4 * (lane / 32);
#pragma unroll
    for (i32 ks = 0; ks < kBlockK / kMfmaK; ++ks) {
      u64 a[kFragsM], b[kFragsN];
#pragma unroll
      for (i32 i = 0; i < kFragsM; ++i)
        a[i] = *(const __attribute__((address_space(3))) u64*)(
            a_tile + lds_byte_offset(wave_m * kWaveTileM + i * kMfmaM + row_in_frag, ks * kMfmaK + k_in_step));
#pragma unroll
      for (i32 j = 0; j < kFragsN; ++j)
        b[j] = *(const __attribute__((address_space(3))) u64*)(
            b_tile + lds_byte_offset(wave_n * kWaveTileN + j * kMfmaN + row_in_frag, ks * kMfmaK + k_in_step));
#pragma unroll
      for (i32 i = 0; i < kFragsM; ++i)
#pragma unroll
        for (i32 j = 0; j < kFragsN; ++j) acc[i][j] = Mfma<Elem>::mma(a[i], b[j], acc[i][j]);
    }
  }
};

// The K loop. `k_tiles` = Kpad / kBlockK is even (the host pads K to kSchedK = 2 * kBlockK), so the
// loop body handles a ping and a pong half-tile with LDS addresses fixed at compile time.
template <typename Elem, class LoaderA, class LoaderB>
CUCONV_DEV void mainloop(const ConvGeometryHip& g, const LoaderA& load_a, const LoaderB& load_b, lds_ptr_t lds,
                         i32 k_tiles, MfmaWaveTile<Elem>& tile, i32 wave_m, i32 wave_n, i32 lane) {
  typedef __attribute__((address_space(3))) char* lds_bytes_t;
  const lds_ptr_t a_ping = lds;
  const lds_ptr_t b_ping = (lds_ptr_t)((lds_bytes_t)lds + 1 * kHalfTileBytes);
  const lds_ptr_t a_pong = (lds_ptr_t)((lds_bytes_t)lds + 2 * kHalfTileBytes);
  const lds_ptr_t b_pong = (lds_ptr_t)((lds_bytes_t)lds + 3 * kHalfTileBytes);

  // prologue: K step 0 -> ping                                         vmcnt: +kLoadsPerStage
  load_a.load_tile(g, a_ping, 0u);
  load_b.load_tile(b_ping, 0u);
  for (i32 kt = 0; kt < k_tiles; kt += 2) {
    // K step kt + 1 -> pong (exists: k_tiles is even)                   vmcnt: 2 stages in flight
    load_a.load_tile(g, a_pong, (u32)(kt + 1) * kBlockK);
    load_b.load_tile(b_pong, (u32)(kt + 1) * kBlockK);
    wait_vmcnt<kLoadsPerStage>();  // my ping loads landed (loads retire in order; pong's may fly)
    workgroup_barrier();           // ... and every other lane's: ping is complete
    tile.compute((lds_cptr_t)a_ping, (lds_cptr_t)b_ping, wave_m, wave_n, lane);
    workgroup_barrier();           // every wave has read ping: it may be refilled
    if (kt + 2 < k_tiles) {
      load_a.load_tile(g, a_ping, (u32)(kt + 2) * kBlockK);
      load_b.load_tile(b_ping, (u32)(kt + 2) * kBlockK);
      wait_vmcnt<kLoadsPerStage>();  // my pong loads landed, the new ping loads may fly
    } else {
      wait_vmcnt<0>();               // last pong: nothing else in flight
    }
    workgroup_barrier();           // pong is complete
    tile.compute((lds_cptr_t)a_pong, (lds_cptr_t)b_pong, wave_m, wave_n, lane);
    workgroup_barrier();           // every wave has read pong
  }
}

#endif  // CUCONV_HIP_DEVICE_COMPILE

}  // namespace cuconv
