// cuconv conv3d Q-slice strategy: the fp32 accumulate and the final cast + epilogue.
//
// A stride-1 3-D convolution with no temporal padding is a sum over filter depth slices t of 2-D
// convolutions: out[n, z] = sum_t conv2d(x[n, z + t], w[:, t]). The strategy runs one fast 2-D
// convolution per (n, t) into a reusable 16-bit temporary and adds it into an fp32 accumulator
// here; only the final cast rounds, so the result carries one rounding, as a single 3-D conv would.
//
//   qslice_accumulate   acc[i] += float(tmp[i])            (count elements, 8 per thread-iteration)
//   qslice_cast         out[m, k] = act(alpha * acc[m, k] + bias[k] + beta * residual[m, k])
//                       for k < K, reading acc with row stride k_pad >= K (padded filter columns
//                       are computed but dropped here)
#include "common/types.cuh"
#include "common/epilogue_math.cuh"

constexpr int kVec = 8;  // 8 x 16-bit = one 16-byte load of the temporary

extern "C" __global__ void qslice_accumulate(const elem_t* __restrict__ tmp, float* __restrict__ acc,
                                             long long count) {
  const long long stride = (long long)gridDim.x * blockDim.x;
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  const long long vec_count = count / kVec;
  for (long long v = i; v < vec_count; v += stride) {
    const uint4 raw = reinterpret_cast<const uint4*>(tmp)[v];
    const elem_t* e = reinterpret_cast<const elem_t*>(&raw);
    float4* a = reinterpret_cast<float4*>(acc + v * kVec);
    float4 lo = a[0], hi = a[1];
    lo.x += cuconv::to_float(e[0]); lo.y += cuconv::to_float(e[1]);
    lo.z += cuconv::to_float(e[2]); lo.w += cuconv::to_float(e[3]);
    hi.x += cuconv::to_float(e[4]); hi.y += cuconv::to_float(e[5]);
    hi.z += cuconv::to_float(e[6]); hi.w += cuconv::to_float(e[7]);
    a[0] = lo;
    a[1] = hi;
  }
  for (long long j = vec_count * kVec + i; j < count; j += stride) acc[j] += cuconv::to_float(tmp[j]);
}

extern "C" __global__ void qslice_cast(const float* __restrict__ acc, const elem_t* __restrict__ bias,
                                       const elem_t* residual, elem_t* out, long long rows, int K, int k_pad,
                                       cuconv::EpilogueParams ep) {
  // residual may alias out (in-place residual): read before write by the same thread.
  const long long total = rows * K;
  for (long long idx = blockIdx.x * (long long)blockDim.x + threadIdx.x; idx < total;
       idx += (long long)gridDim.x * blockDim.x) {
    const long long m = idx / K;
    const int k = (int)(idx - m * K);
    const float b = ep.has_bias ? cuconv::to_float(bias[k]) : 0.f;
    const float r = ep.has_residual ? cuconv::to_float(residual[idx]) : 0.f;
    out[idx] = cuconv::from_float<elem_t>(cuconv::apply_epilogue(acc[m * k_pad + k], b, r, ep));
  }
}
