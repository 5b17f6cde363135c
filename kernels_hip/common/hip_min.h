// cuconv: the few HIP declarations our device code needs, when no HIP header provides them.
//
// Two ways these sources are compiled:
//   * on ROCm, by hiprtc through cupy.RawModule(backend="hiprtc"): the HIP runtime builtins
//     (__global__, __device__, __shared__, threadIdx...) are already there (__HIPCC_RTC__);
//   * in CI, by Debian's clang-19 with `-x hip --cuda-device-only -nogpulib -nogpuinc`: no HIP
//     header at all, so the attribute spellings below are defined here.
// Our code never uses threadIdx/blockIdx; it reads the hardware ids through the amdgcn builtins
// (thread_id_x() etc.), which exist in both worlds, so nothing here can clash with a real header.
//
// The headers under common/ that carry index or epilogue math are also compiled for the host
// (tests/test_cdna3_index_math.py builds them with the system C++ compiler): CUCONV_HD is then empty.
#pragma once

#if defined(__HIP__) || defined(__HIPCC_RTC__)
#define CUCONV_HIP_DEVICE_COMPILE 1
#else
#define CUCONV_HIP_DEVICE_COMPILE 0
#endif

#if CUCONV_HIP_DEVICE_COMPILE && !defined(__HIPCC_RTC__) && !defined(HIP_INCLUDE_HIP_HIP_RUNTIME_H) && \
    !defined(__HIP_RUNTIME_WRAPPER_H__) && !defined(__global__)
// clang's HIP mode understands these attributes natively; the runtime headers only spell them.
#define __global__ __attribute__((global))
#define __device__ __attribute__((device))
#define __host__ __attribute__((host))
#define __shared__ __attribute__((shared))
#endif

#if CUCONV_HIP_DEVICE_COMPILE && !defined(__launch_bounds__)
// HIP's spelling: at most `n` work-items per workgroup (lets the compiler budget registers for it).
#define __launch_bounds__(n) __attribute__((amdgpu_flat_work_group_size(1, n)))
#endif

#if CUCONV_HIP_DEVICE_COMPILE && !defined(__forceinline__)
#define __forceinline__ inline __attribute__((always_inline))
#endif

#if CUCONV_HIP_DEVICE_COMPILE
#define CUCONV_HD __host__ __device__ __forceinline__
#define CUCONV_DEV __device__ __forceinline__
#else  // host C++ (index-math tests): plain inline functions
#define CUCONV_HD inline
#endif

namespace cuconv {

// Fixed-width integers under our own names: hiprtc predefines the <stdint.h> ones, clang -nogpuinc
// does not, and a second typedef of uint32_t would clash on one side or the other.
typedef unsigned int u32;
typedef int i32;
typedef unsigned long long u64;
typedef long long i64;

#if CUCONV_HIP_DEVICE_COMPILE
// Hardware ids. Wave64: a workgroup of 256 work-items is 4 waves.
CUCONV_DEV u32 thread_id_x() { return __builtin_amdgcn_workitem_id_x(); }
CUCONV_DEV u32 block_id_x() { return __builtin_amdgcn_workgroup_id_x(); }
CUCONV_DEV u32 block_id_y() { return __builtin_amdgcn_workgroup_id_y(); }
CUCONV_DEV u32 block_id_z() { return __builtin_amdgcn_workgroup_id_z(); }
// The wave index as a scalar (SGPR) value: lanes of one wave agree, readfirstlane says so to the
// compiler, so LDS bases derived from it stay scalar (M0 is written from an SGPR).
CUCONV_DEV u32 wave_id() { return __builtin_amdgcn_readfirstlane(thread_id_x() >> 6); }
CUCONV_DEV u32 lane_id() { return thread_id_x() & 63u; }
#endif

}  // namespace cuconv
