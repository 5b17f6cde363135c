// cuconv: division by a run-time divisor as a multiply and a shift.
//
// x / d for 0 <= x < 2^31 equals (umulhi(x, mul) + x) >> shr with shr = ceil(log2 d) and
// mul = floor(2^32 * (2^shr - d) / d) + 1 (a rounded-up reciprocal; the sum cannot overflow 32 bits
// because x < 2^31). The host computes (mul, shr) once per launch: cuconv.launch.fast_divisor, which
// the CPU tests check against x // d. Three instructions instead of the ~20 of a 32-bit division.
#pragma once
#include "common/types.cuh"

namespace cuconv {

struct FastDivisor {
  uint32_t mul, shr;
};

__device__ __forceinline__ uint32_t fast_div(uint32_t x, FastDivisor d) { return (__umulhi(x, d.mul) + x) >> d.shr; }

}  // namespace cuconv
