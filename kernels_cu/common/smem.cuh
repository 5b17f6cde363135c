// cuconv: shared-memory addressing shared by the sm_80 and sm_90 kernels.
//
// cp.async, ldmatrix, mbarriers, TMA and wgmma descriptors all take 32-bit addresses in the
// shared-memory window, not generic pointers.
#pragma once

#include "common/types.cuh"

namespace cuconv {

// Generic pointer into shared memory -> its 32-bit shared-window address.
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  uint32_t a;
  asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
  return a;
}

}  // namespace cuconv
