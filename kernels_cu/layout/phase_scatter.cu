// cuconv layout: one output phase of a strided result into place,
//   y[n][t0 s0 + p0][t1 s1 + p1][t2 s2 + p2][:] = z[n][t0][t1][t2][:]      (t_i < T_i),
// z contiguous (N, T0, T1, T2, row), y contiguous (N, I0, I1, I2, row), rows of `row_words` words.
// The input gradient of a strided convolution computes each phase (positions p + s t) as its own
// forward convolution (cuconv/grad.py); this puts a phase's result into dx. Unused spatial dims
// have T = I = s = 1, p = 0. One thread per word; phase_scatter_w16 / _w4 / _w2 move 16-, 4- or
// 2-byte words (the host picks the widest that divides the row and both addresses).
// phase_scatter_fill_w16 / _w4 / _w2 write all of y instead: the phase's rows from z, zeros at every
// other position (the input gradient of a strided 1x1 filter, where one phase is reached by a tap and
// the others are zeros); `words` then counts y's words, N * I0 * I1 * I2 * row_words.
#include "common/types.cuh"

namespace cuconv {
namespace layout {

struct ScatterArgs {
  long long words;           // N * T0 * T1 * T2 * row_words
  int32_t row_words;
  int32_t T0, T1, T2;        // the phase's extent per spatial dim
  int32_t I0, I1, I2;        // y's spatial extent
  int32_t s0, s1, s2, p0, p1, p2;
};

template <typename W>
__device__ __forceinline__ void scatter(const W* __restrict__ z, W* __restrict__ y, const ScatterArgs& a) {
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < a.words; i += (long long)gridDim.x * blockDim.x) {
    const long long row = i / a.row_words;
    const int word = (int)(i - row * a.row_words);
    long long r = row;
    const int t2 = (int)(r % a.T2);
    r /= a.T2;
    const int t1 = (int)(r % a.T1);
    r /= a.T1;
    const int t0 = (int)(r % a.T0);
    const long long n = r / a.T0;
    const long long dst = ((n * a.I0 + t0 * a.s0 + a.p0) * a.I1 + t1 * a.s1 + a.p1) * a.I2 + t2 * a.s2 + a.p2;
    y[dst * a.row_words + word] = z[i];
  }
}

// The phase position t of y index i along one dim (p + s t), or -1 where i is not one of them.
__device__ __forceinline__ int phase_row(int i, int s, int p, int T) {
  const int d = i - p;
  if (d < 0) return -1;
  const int t = d / s;
  return (t * s == d && t < T) ? t : -1;
}

template <typename W>
__device__ __forceinline__ void scatter_fill(const W* __restrict__ z, W* __restrict__ y, const ScatterArgs& a) {
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < a.words; i += (long long)gridDim.x * blockDim.x) {
    const long long row = i / a.row_words;
    const int word = (int)(i - row * a.row_words);
    long long r = row;
    const int i2 = (int)(r % a.I2);
    r /= a.I2;
    const int i1 = (int)(r % a.I1);
    r /= a.I1;
    const int i0 = (int)(r % a.I0);
    const long long n = r / a.I0;
    const int t0 = phase_row(i0, a.s0, a.p0, a.T0), t1 = phase_row(i1, a.s1, a.p1, a.T1),
              t2 = phase_row(i2, a.s2, a.p2, a.T2);
    W v;
    if (t0 >= 0 && t1 >= 0 && t2 >= 0) {
      v = z[(((n * a.T0 + t0) * a.T1 + t1) * a.T2 + t2) * a.row_words + word];
    } else {
      v = W{};
    }
    y[i] = v;
  }
}

}  // namespace layout
}  // namespace cuconv

extern "C" __global__ void __launch_bounds__(256) phase_scatter_w16(const uint4* z, uint4* y, cuconv::layout::ScatterArgs a) {
  cuconv::layout::scatter(z, y, a);
}
extern "C" __global__ void __launch_bounds__(256) phase_scatter_w4(const uint32_t* z, uint32_t* y,
                                                                  cuconv::layout::ScatterArgs a) {
  cuconv::layout::scatter(z, y, a);
}
extern "C" __global__ void __launch_bounds__(256) phase_scatter_w2(const uint16_t* z, uint16_t* y,
                                                                  cuconv::layout::ScatterArgs a) {
  cuconv::layout::scatter(z, y, a);
}
extern "C" __global__ void __launch_bounds__(256) phase_scatter_fill_w16(const uint4* z, uint4* y,
                                                                        cuconv::layout::ScatterArgs a) {
  cuconv::layout::scatter_fill(z, y, a);
}
extern "C" __global__ void __launch_bounds__(256) phase_scatter_fill_w4(const uint32_t* z, uint32_t* y,
                                                                       cuconv::layout::ScatterArgs a) {
  cuconv::layout::scatter_fill(z, y, a);
}
extern "C" __global__ void __launch_bounds__(256) phase_scatter_fill_w2(const uint16_t* z, uint16_t* y,
                                                                       cuconv::layout::ScatterArgs a) {
  cuconv::layout::scatter_fill(z, y, a);
}
