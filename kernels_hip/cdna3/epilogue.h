// cuconv (HIP, CDNA3): the epilogue: fp32 accumulators -> act(alpha * acc + bias + beta * residual)
// -> 16-bit NHWC output, straight from registers (no LDS staging).
//
// MFMA 32x32 C layout (mainloop_mfma.h): lane L, register i holds row 8 * (i / 4) + 4 * (L / 32) + i % 4,
// column L % 32, so the 32 lanes of a half-wave store 32 consecutive output channels of one pixel.
// `residual` may alias `out` (in-place residual): each element is read, then written, by one lane.
#pragma once

#include "cdna3/mainloop_mfma.h"
#include "common/epilogue_math.h"
#include "common/index_math.h"
#include "common/types.h"

namespace cuconv {

#if CUCONV_HIP_DEVICE_COMPILE

template <typename Elem>
CUCONV_DEV void store_tile(const ConvGeometryHip& g, const EpilogueParams& ep, const MfmaWaveTile<Elem>& tile,
                           const Elem* __restrict__ bias, const Elem* residual, Elem* out, u32 m_tile, u32 n_tile,
                           u32 group, i32 wave_m, i32 wave_n, i32 lane) {
#pragma unroll
  for (i32 fm = 0; fm < kFragsM; ++fm) {
#pragma unroll
    for (i32 fn = 0; fn < kFragsN; ++fn) {
      const u32 n = n_tile + (u32)(wave_n * kWaveTileN + fn * kMfmaN + lane % 32);  // channel within the group
      if (n >= (u32)g.Kg) continue;
      const u32 channel = group * (u32)g.Kg + n;
      const float b = ep.has_bias ? to_float(bias[channel]) : 0.f;
#pragma unroll
      for (i32 i = 0; i < 16; ++i) {
        const u32 m = m_tile + (u32)(wave_m * kWaveTileM + fm * kMfmaM + 8 * (i / 4) + 4 * (lane / 32) + i % 4);
        if (m >= (u32)g.M) continue;
        const u64 o = (u64)m * (u64)g.K + channel;  // output can exceed 4 GiB: 64-bit index
        const float r = ep.has_residual ? to_float(residual[o]) : 0.f;
        out[o] = from_float<Elem>(apply_epilogue(tile.acc[fm][fn][i], b, r, ep));
      }
    }
  }
}

#endif  // CUCONV_HIP_DEVICE_COMPILE

}  // namespace cuconv
