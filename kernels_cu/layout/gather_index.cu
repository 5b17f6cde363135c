// cuconv layout: dst[i] = src[index[i]], or zero where index[i] < 0 (cuconv/subpixel.py: the stacked-phase
// convolution's bias, repeated once per phase). One thread per element; gather_index_b2 / _b4 / _b8 move
// 2-, 4- or 8-byte elements (float16 / bfloat16, float32, float64), copied as bits. (The stacked filter
// is a tiled transpose: stacked_filter.cu.)
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
