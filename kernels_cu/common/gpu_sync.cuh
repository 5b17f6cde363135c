// cuconv: the synchronisation a kernel's code reaches through functions rather than inline PTX, so that
// the code around it can also be built for the CPU (tests/test_wgrad_fused_end_emulated.py stands in a
// host version of this file, with threads, a condition variable and std::atomic):
//
//   named_barrier_sync<NT>()   bar.sync 1, NT: the first NT threads of the CTA (a role's warps, the
//                              producer warp outside it) meet;
//   atomic_add_release_gpu     atom.add.release.gpu on a 32-bit word: returns the old value, the
//                              thread's earlier writes visible GPU-wide before the add;
//   load_acquire_gpu           ld.acquire.gpu: later reads see what the writers released.
#pragma once

namespace cuconv {

template <int NT>
__device__ __forceinline__ void named_barrier_sync() {
  asm volatile("bar.sync 1, %0;" ::"n"(NT) : "memory");
}

__device__ __forceinline__ unsigned atomic_add_release_gpu(unsigned* word, unsigned add) {
  unsigned old;
  asm volatile("atom.add.release.gpu.global.u32 %0, [%1], %2;" : "=r"(old) : "l"(word), "r"(add) : "memory");
  return old;
}

__device__ __forceinline__ unsigned load_acquire_gpu(const unsigned* word) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(word) : "memory");
  return v;
}

}  // namespace cuconv
