// cuconv layout: the output phases of a strided result, stacked along the channels, to and from place
// (cuconv/subpixel.py). With P = s0 s1 s2 phases, phase index ph = (p0 s1 + p1) s2 + p2:
//
//   y[n][t0 s0 + p0][t1 s1 + p1][t2 s2 + p2][:] <-> z[n][t0][t1][t2][ph * row : (ph + 1) * row]
//
// z contiguous (N, L0, L1, L2, P * row), y contiguous (N, I0, I1, I2, row), rows of `row_words` words.
// phase_unstack writes y from z (positions t s + p >= I are not in y: skipped); phase_stack writes z
// from y (zeros where t s + p >= I). One thread per word of z; unused spatial dims have L = I = s = 1.
// The _w16 / _w4 / _w2 entries move 16-, 4- or 2-byte words (the host picks the widest that divides
// the row and both addresses).
// Index arithmetic: below 2^31 words of z, each division is a multiply and a shift (common/fast_div.cuh,
// divisors from the host); a 64-bit division is a ~70-instruction call, and with nine of them per
// 16-byte word the kernel was bound by them, not by memory.
#include "common/fast_div.cuh"
#include "common/types.cuh"

namespace cuconv {
namespace layout {

struct StackArgs {
  long long words;           // N * L0 * L1 * L2 * P * row_words: the words of z
  int32_t row_words;
  int32_t L0, L1, L2;        // z's spatial extent (the stacked grid)
  int32_t I0, I1, I2;        // y's spatial extent
  int32_t s0, s1, s2;        // the strides (phases per dim), at most 8
  int32_t sh0[8], sh1[8], sh2[8];  // per dim, the row of z where each phase's rows start
  FastDivisor div_row_words, div_phases, div_l0, div_l1, div_l2, div_s1, div_s2;
};

// The y word of z's pixel (n, t0, t1, t2), phase (p0, p1, p2), word `word`, or -1 where that position
// is outside y.
__device__ __forceinline__ long long y_word_of(long long n, int t0, int t1, int t2, int p0, int p1, int p2, int word,
                                               const StackArgs& a) {
  const int u0 = t0 - a.sh0[p0], u1 = t1 - a.sh1[p1], u2 = t2 - a.sh2[p2];
  if (u0 < 0 || u1 < 0 || u2 < 0) return -1;
  const int i0 = u0 * a.s0 + p0, i1 = u1 * a.s1 + p1, i2 = u2 * a.s2 + p2;
  if (i0 >= a.I0 || i1 >= a.I1 || i2 >= a.I2) return -1;
  return (((n * a.I0 + i0) * a.I1 + i1) * a.I2 + i2) * a.row_words + word;
}

// z word i -> the y word it is, or -1 where that position is outside y.
__device__ __forceinline__ long long y_word(long long i, const StackArgs& a) {
  if (a.words < 0x80000000LL) {  // every index below 2^31: multiply-shift divisions
    const uint32_t x = (uint32_t)i;
    const uint32_t row = fast_div(x, a.div_row_words), r0 = fast_div(row, a.div_phases);
    const uint32_t r1 = fast_div(r0, a.div_l2), r2 = fast_div(r1, a.div_l1), n = fast_div(r2, a.div_l0);
    const uint32_t ph = row - r0 * (uint32_t)(a.s0 * a.s1 * a.s2);
    const uint32_t q = fast_div(ph, a.div_s2), p0 = fast_div(q, a.div_s1);
    return y_word_of(n, (int)(r2 - n * a.L0), (int)(r1 - r2 * a.L1), (int)(r0 - r1 * a.L2), (int)p0,
                     (int)(q - p0 * a.s1), (int)(ph - q * a.s2), (int)(x - row * a.row_words), a);
  }
  const int phases = a.s0 * a.s1 * a.s2;
  long long r = i / a.row_words;
  const int word = (int)(i - r * a.row_words);
  const int ph = (int)(r % phases);
  r /= phases;
  const int t2 = (int)(r % a.L2);
  r /= a.L2;
  const int t1 = (int)(r % a.L1);
  r /= a.L1;
  const int t0 = (int)(r % a.L0);
  const long long n = r / a.L0;
  return y_word_of(n, t0, t1, t2, ph / (a.s2 * a.s1), (ph / a.s2) % a.s1, ph % a.s2, word, a);
}

template <typename W>
__device__ __forceinline__ void unstack(const W* __restrict__ z, W* __restrict__ y, const StackArgs& a) {
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < a.words; i += (long long)gridDim.x * blockDim.x) {
    const long long j = y_word(i, a);
    if (j >= 0) y[j] = z[i];
  }
}

template <typename W>
__device__ __forceinline__ void stack(const W* __restrict__ y, W* __restrict__ z, const StackArgs& a) {
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < a.words; i += (long long)gridDim.x * blockDim.x) {
    const long long j = y_word(i, a);
    z[i] = j >= 0 ? y[j] : W{};
  }
}

}  // namespace layout
}  // namespace cuconv

#define CUCONV_STACK_ENTRIES(BYTES, W)                                                                               \
  extern "C" __global__ void __launch_bounds__(256) phase_unstack_w##BYTES(const W* z, W* y,                         \
                                                                           cuconv::layout::StackArgs a) {            \
    cuconv::layout::unstack(z, y, a);                                                                                \
  }                                                                                                                  \
  extern "C" __global__ void __launch_bounds__(256) phase_stack_w##BYTES(const W* y, W* z,                           \
                                                                         cuconv::layout::StackArgs a) {              \
    cuconv::layout::stack(y, z, a);                                                                                  \
  }

CUCONV_STACK_ENTRIES(16, uint4)
CUCONV_STACK_ENTRIES(4, uint32_t)
CUCONV_STACK_ENTRIES(2, uint16_t)
