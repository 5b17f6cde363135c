// cuconv: float32 operands as bfloat16 parts, for the tensor-core float32 path
// (cuconv/backends/sm90/split_precision.py).
//
// Each float32 value v is split into hi = bf16(v) and lo = bf16(v - hi) (v - hi is exact in fp32), so
// v = hi + lo + r with |r| <= 2^-16 |v|: 16 significant bits in two 8-bit parts. The product of two
// split values, hi_x hi_w + lo_x hi_w + hi_x lo_w, leaves out lo_x lo_w (at most 2^-16 of the product)
// and the r terms: at most 3 * 2^-16 of |x w| per product (typically a tenth of that), against
// 2 * 2^-11 for one TF32 product.
//
// The three products are one bf16 convolution over three times the channels: every row of C float32
// values (a pixel of x, or a tap of one filter) becomes three blocks of Cp bf16 values (Cp = C rounded
// up to a multiple of 8, the padding zero), each block holding hi or lo of the row:
//
//   x rows: [hi | lo | hi]        w rows: [hi | hi | lo]        sum over the 3 Cp channels =
//                                                             hi_x hi_w + lo_x hi_w + hi_x lo_w
//
// `lo_parts` says which blocks hold lo (bit b: block b). Where Cp is a multiple of the Hopper kernel's
// 64-channel block, x is written as two blocks [hi | lo] (parts = 2) and the kernel reads its third
// block from the first again (Sm90ConvParams.a_wrap): a third less to write and to read. One thread
// writes eight channels of every block of a row (one 16-byte store per block); with vec_loads it reads
// them as two 16-byte loads (C a multiple of 4 and a 16-byte aligned source), else element by element.
//
// Folding the filter width into the channels (taps > 1), for inputs with few channels: destination
// row (nh, q) holds, for each tap s < taps, the parts of source row nh * src_w + (q * stride - pad +
// s * dil) (zeros where that column is outside [0, src_w)), at channel s * parts * Cp + b * Cp + c.
// An x of 3 channels under a 7-wide filter becomes 7 * 3 * 8 = 168 channels under a 7x1 one: the
// convolution's boxes carry whole 128-byte channel rows instead of 24 of them. The weights fold the
// same way (src_w = taps, dst_w = 1: row k * R + r gathers its S taps). taps = 1, stride = dil = 1,
// pad = 0, src_w = dst_w is the plain split.
//
// Interleaved order (interleave = 1, the filter of the split-in-registers path, kernels_cu/sm90/
// wgmma_split_a.cuh): each group of eight channels is stored as channels 0 4 1 5 2 6 3 7 of the
// group, the order in which that kernel's ldmatrix fragments hold x's channels.
//
// Non-finite values (and finite ones whose hi rounds to an infinity): hi = 0 and lo = v. lo meets only
// the other operand's hi (lo_x hi_w, hi_x lo_w), so an infinity in x or w gives the infinities and NaNs
// the float32 products would; with hi = v instead, hi_x lo_w would be inf * 0 = NaN wherever w is exact
// in bf16. (An infinity in x meeting one in w at the same reduction index gives NaN, not infinity.)
#include "common/types.cuh"

struct SplitArgs {
  long long rows;            // rows of the destination matrix
  long long src_row_stride;  // in elements
  int C;                     // float32 values per row
  int Cp;                    // values per destination block: C rounded up to a multiple of 8
  int lo_parts;              // bit b set: block b holds lo, else hi
  int parts;                 // blocks per row: 3, or 2 (x's [hi | lo])
  int vec_loads;             // 1: two 16-byte loads per eight channels
  int taps;                  // filter columns folded into each destination row (1: none)
  int stride, dil, pad;      // source column of tap s: q * stride - pad + s * dil
  int src_w, dst_w;          // columns per source / destination image row
  int interleave;            // 1: each eight channels stored in the order 0 4 1 5 2 6 3 7 (below)
};

namespace {

__device__ __forceinline__ void split_one(float v, uint16_t& hi, uint16_t& lo) {
  hi = cuconv::from_float<cuconv::bf16_t>(v).bits;
  const float h = cuconv::to_float(cuconv::bf16_t{hi});
  const bool finite = isfinite(h);
  lo = finite ? cuconv::from_float<cuconv::bf16_t>(v - h).bits : hi;
  if (!finite) hi = 0;
}

__device__ __forceinline__ uint32_t pack(uint16_t a, uint16_t b) { return (uint32_t)a | ((uint32_t)b << 16); }

}  // namespace

extern "C" __global__ void __launch_bounds__(256) split_bf16x3(const float* __restrict__ src,
                                                               uint16_t* __restrict__ dst, const SplitArgs a) {
  const int groups = a.Cp / 8;  // eight-channel groups per tap
  const long long total = a.rows * a.taps * groups;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
       i += (long long)gridDim.x * blockDim.x) {
    const long long slot = i / groups;  // (destination row, tap)
    const int c0 = (int)(i - slot * groups) * 8;
    const long long row = slot / a.taps;
    const int tap = (int)(slot - row * a.taps);
    const long long nh = row / a.dst_w;
    const int col = (int)(row - nh * a.dst_w) * a.stride - a.pad + tap * a.dil;
    const bool inside = col >= 0 && col < a.src_w;
    const float* s = src + (nh * a.src_w + (inside ? col : 0)) * a.src_row_stride + c0;
    float v[8];
    if (!inside) {
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] = 0.f;
    } else if (a.vec_loads && c0 + 8 <= a.C) {
      const float4 p = __ldg(reinterpret_cast<const float4*>(s));
      const float4 q = __ldg(reinterpret_cast<const float4*>(s) + 1);
      v[0] = p.x, v[1] = p.y, v[2] = p.z, v[3] = p.w, v[4] = q.x, v[5] = q.y, v[6] = q.z, v[7] = q.w;
    } else {
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] = c0 + j < a.C ? __ldg(s + j) : 0.f;
    }
    if (a.interleave) {
      const float u[8] = {v[0], v[4], v[1], v[5], v[2], v[6], v[3], v[7]};
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] = u[j];
    }
    uint16_t hi[8], lo[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) split_one(v[j], hi[j], lo[j]);
    const uint4 h = make_uint4(pack(hi[0], hi[1]), pack(hi[2], hi[3]), pack(hi[4], hi[5]), pack(hi[6], hi[7]));
    const uint4 l = make_uint4(pack(lo[0], lo[1]), pack(lo[2], lo[3]), pack(lo[4], lo[5]), pack(lo[6], lo[7]));
    uint16_t* d = dst + slot * a.parts * a.Cp + c0;
#pragma unroll
    for (int b = 0; b < 3; ++b) {
      if (b < a.parts) *reinterpret_cast<uint4*>(d + b * a.Cp) = (a.lo_parts >> b) & 1 ? l : h;
    }
  }
}
