// cuconv layout: dst[i] = src[index[i]], or zero where index[i] < 0 (cuconv/subpixel.py: the stacked-phase
// convolution's bias, repeated once per phase). One thread per element; gather_index_b2 / _b4 / _b8 move
// 2-, 4- or 8-byte elements (float16 / bfloat16, float32, float64), copied as bits. (The stacked filter
// is a tiled transpose: stacked_filter.cu.) gather_index_pair_b2 does two such gathers in one launch
// (cuconv/backends/sm90/wpack.py: the packed filter and its repeated bias).
#include "common/types.cuh"

namespace cuconv {
namespace layout {

template <typename E>
__device__ __forceinline__ void gather(const E* __restrict__ src, const int32_t* __restrict__ index,
                                       E* __restrict__ dst, long long count) {
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += (long long)gridDim.x * blockDim.x) {
    const int32_t k = index[i];
    dst[i] = k >= 0 ? src[k] : E{};
  }
}

// Two gathers over one index range: elements [0, count0) of the first, then [count0, count0 + count1) of the
// second.
template <typename E>
__device__ __forceinline__ void gather_pair(const E* __restrict__ src0, const int32_t* __restrict__ index0,
                                            E* __restrict__ dst0, long long count0, const E* __restrict__ src1,
                                            const int32_t* __restrict__ index1, E* __restrict__ dst1,
                                            long long count1) {
  const long long total = count0 + count1;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (long long)gridDim.x * blockDim.x) {
    const bool first = i < count0;
    const long long j = first ? i : i - count0;
    const int32_t k = (first ? index0 : index1)[j];
    (first ? dst0 : dst1)[j] = k >= 0 ? (first ? src0 : src1)[k] : E{};
  }
}

}  // namespace layout
}  // namespace cuconv

extern "C" __global__ void __launch_bounds__(256) gather_index_b2(const uint16_t* src, const int32_t* index,
                                                                 uint16_t* dst, long long count) {
  cuconv::layout::gather(src, index, dst, count);
}
extern "C" __global__ void __launch_bounds__(256) gather_index_b4(const uint32_t* src, const int32_t* index,
                                                                 uint32_t* dst, long long count) {
  cuconv::layout::gather(src, index, dst, count);
}
extern "C" __global__ void __launch_bounds__(256) gather_index_b8(const unsigned long long* src, const int32_t* index,
                                                                 unsigned long long* dst, long long count) {
  cuconv::layout::gather(src, index, dst, count);
}
extern "C" __global__ void __launch_bounds__(256) gather_index_pair_b2(const uint16_t* src0, const int32_t* index0,
                                                                      uint16_t* dst0, long long count0,
                                                                      const uint16_t* src1, const int32_t* index1,
                                                                      uint16_t* dst1, long long count1) {
  cuconv::layout::gather_pair(src0, index0, dst0, count0, src1, index1, dst1, count1);
}
