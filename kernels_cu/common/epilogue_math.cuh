// cuconv: the epilogue arithmetic every kernel applies to its fp32 accumulator (and the generic path
// to its fp64 one, with EpilogueParams64).
//
//   out = act(alpha * acc + bias + beta * residual)
//
// Each term only when present; the activation codes match cuconv.problem.Epilogue.activation_code
// (0 none, 1 relu, 2 silu, 3 gelu with the exact erf form). One definition, so every kernel and the
// NumPy reference agree on what "gelu" means.
#pragma once

namespace cuconv {

enum Activation : int { ACT_NONE = 0, ACT_RELU = 1, ACT_SILU = 2, ACT_GELU = 3 };

__device__ __forceinline__ float activate(float v, int act) {
  switch (act) {
    case ACT_RELU: return v > 0.f ? v : 0.f;
    case ACT_SILU: return v / (1.f + __expf(-v));
    case ACT_GELU: return 0.5f * v * (1.f + erff(v * 0.70710678118654752f));
    default: return v;
  }
}

// Runtime epilogue parameters, passed by value to kernels.
struct EpilogueParams {
  float alpha;
  float beta;
  int activation;    // Activation
  int has_bias;      // bias[K] present
  int has_residual;  // residual present and beta != 0 (the caller folds beta == 0 to "absent")
};

__device__ __forceinline__ float apply_epilogue(float acc, float bias, float residual,
                                                const EpilogueParams& p) {
  float v = p.alpha * acc;
  if (p.has_bias) v += bias;
  if (p.has_residual) v += p.beta * residual;
  return activate(v, p.activation);
}

// The same in fp64 (exp and erf to double accuracy), for accumulators kept in double: alpha and beta
// travel as doubles, so a scale such as 0.1 is not rounded to fp32 first.
__device__ __forceinline__ double activate(double v, int act) {
  switch (act) {
    case ACT_RELU: return v > 0.0 ? v : 0.0;
    case ACT_SILU: return v / (1.0 + exp(-v));
    case ACT_GELU: return 0.5 * v * (1.0 + erf(v * 0.70710678118654752440));
    default: return v;
  }
}

struct EpilogueParams64 {
  double alpha;
  double beta;
  int activation;
  int has_bias;
  int has_residual;
};

__device__ __forceinline__ double apply_epilogue(double acc, double bias, double residual,
                                                 const EpilogueParams64& p) {
  double v = p.alpha * acc;
  if (p.has_bias) v += bias;
  if (p.has_residual) v += p.beta * residual;
  return activate(v, p.activation);
}

}  // namespace cuconv
