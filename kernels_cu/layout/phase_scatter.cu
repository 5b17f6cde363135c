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
// Index arithmetic: below 2^31 words, each division is a multiply and a shift (common/fast_div.cuh,
// divisors from the host); 64-bit divisions (a ~70-instruction call each) above.
#include "common/fast_div.cuh"
#include "common/types.cuh"

namespace cuconv {
namespace layout {

struct ScatterArgs {
  long long words;           // scatter: N * T0 * T1 * T2 * row_words (z's words); fill: y's words
  int32_t row_words;
  int32_t T0, T1, T2;        // the phase's extent per spatial dim
  int32_t I0, I1, I2;        // y's spatial extent
  int32_t s0, s1, s2, p0, p1, p2;
  FastDivisor div_row_words, div_t0, div_t1, div_t2, div_i0, div_i1, div_i2, div_s0, div_s1, div_s2;
};

// (n, e0, e1, e2, word) of word i of a contiguous (N, E0, E1, E2, row) tensor: with fast divisors
// below 2^31 words.
struct Position {
  long long n;
  int e0, e1, e2, word;
};

__device__ __forceinline__ Position position(long long i, bool fast, int E0, int E1, int E2, int row_words,
                                             FastDivisor d0, FastDivisor d1, FastDivisor d2, FastDivisor dw) {
  Position q;
  if (fast) {
    const uint32_t x = (uint32_t)i, row = fast_div(x, dw), r2 = fast_div(row, d2), r1 = fast_div(r2, d1),
                   n = fast_div(r1, d0);
    q.word = (int)(x - row * row_words);
    q.e2 = (int)(row - r2 * E2);
    q.e1 = (int)(r2 - r1 * E1);
    q.e0 = (int)(r1 - n * E0);
    q.n = n;
    return q;
  }
  long long r = i / row_words;
  q.word = (int)(i - r * row_words);
  q.e2 = (int)(r % E2);
  r /= E2;
  q.e1 = (int)(r % E1);
  r /= E1;
  q.e0 = (int)(r % E0);
  q.n = r / E0;
  return q;
}

template <typename W>
__device__ __forceinline__ void scatter(const W* __restrict__ z, W* __restrict__ y, const ScatterArgs& a) {
  const bool fast = a.words < 0x80000000LL;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < a.words; i += (long long)gridDim.x * blockDim.x) {
    const Position q = position(i, fast, a.T0, a.T1, a.T2, a.row_words, a.div_t0, a.div_t1, a.div_t2, a.div_row_words);
    const long long dst = ((q.n * a.I0 + q.e0 * a.s0 + a.p0) * a.I1 + q.e1 * a.s1 + a.p1) * a.I2 + q.e2 * a.s2 + a.p2;
    y[dst * a.row_words + q.word] = z[i];
  }
}

// The phase position t of y index i along one dim (p + s t), or -1 where i is not one of them.
__device__ __forceinline__ int phase_row(int i, int s, int p, int T, FastDivisor ds) {
  const int d = i - p;
  if (d < 0) return -1;
  const int t = (int)fast_div((uint32_t)d, ds);
  return (t * s == d && t < T) ? t : -1;
}

template <typename W>
__device__ __forceinline__ void scatter_fill(const W* __restrict__ z, W* __restrict__ y, const ScatterArgs& a) {
  const bool fast = a.words < 0x80000000LL;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < a.words; i += (long long)gridDim.x * blockDim.x) {
    const Position q = position(i, fast, a.I0, a.I1, a.I2, a.row_words, a.div_i0, a.div_i1, a.div_i2, a.div_row_words);
    const int t0 = phase_row(q.e0, a.s0, a.p0, a.T0, a.div_s0), t1 = phase_row(q.e1, a.s1, a.p1, a.T1, a.div_s1),
              t2 = phase_row(q.e2, a.s2, a.p2, a.T2, a.div_s2);
    W v;
    if (t0 >= 0 && t1 >= 0 && t2 >= 0) {
      v = z[(((q.n * a.T0 + t0) * a.T1 + t1) * a.T2 + t2) * a.row_words + q.word];
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
