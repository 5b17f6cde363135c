// cuconv (HIP): the epilogue arithmetic, a port of kernels_cu/common/epilogue_math.cuh.
//
//   out = act(alpha * acc + bias + beta * residual)
//
// Same terms, same activation codes (cuconv.problem.Epilogue.activation_code: 0 none, 1 relu,
// 2 silu, 3 gelu with the exact erf form). Host-callable: tests/test_cdna3_index_math.py compiles it
// for the CPU and compares with cuconv.epilogue.apply_epilogue_numpy.
//
// erf: the device libraries (ocml) are not linked in the CI compile (-nogpulib), so erf is our own
// rational approximation (Abramowitz & Stegun 7.1.26, |error| <= 1.5e-7), far below the 16-bit
// output rounding; exp is __builtin_expf, which the AMDGPU backend lowers to v_exp_f32 inline.
#pragma once

#include "common/hip_min.h"

namespace cuconv {

enum Activation : i32 { ACT_NONE = 0, ACT_RELU = 1, ACT_SILU = 2, ACT_GELU = 3 };

CUCONV_HD float erf_approx(float x) {
  const float ax = x < 0.f ? -x : x;
  const float t = 1.f / (1.f + 0.3275911f * ax);
  const float poly = t * (0.254829592f + t * (-0.284496736f + t * (1.421413741f + t * (-1.453152027f + t * 1.061405429f))));
  const float y = 1.f - poly * __builtin_expf(-ax * ax);
  return x < 0.f ? -y : y;
}

CUCONV_HD float activate(float v, i32 act) {
  switch (act) {
    case ACT_RELU: return v > 0.f ? v : 0.f;
    case ACT_SILU: return v / (1.f + __builtin_expf(-v));
    case ACT_GELU: return 0.5f * v * (1.f + erf_approx(v * 0.70710678118654752f));
    default: return v;
  }
}

// Runtime epilogue parameters, by value; the layout of cuconv.launch.epilogue_params.
struct EpilogueParams {
  float alpha;
  float beta;
  i32 activation;    // Activation
  i32 has_bias;      // bias[K] present
  i32 has_residual;  // residual present and beta != 0 (the host folds beta == 0 to "absent")
};

CUCONV_HD float apply_epilogue(float acc, float bias, float residual, const EpilogueParams& p) {
  float v = p.alpha * acc;
  if (p.has_bias) v += bias;
  if (p.has_residual) v += p.beta * residual;
  return activate(v, p.activation);
}

}  // namespace cuconv
