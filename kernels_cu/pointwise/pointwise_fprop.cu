// cuconv: pointwise (1x1, stride 1, unpadded) dense convolution with a short reduction or a narrow
// output, channels-last, fp16 / bf16, on tensor cores (mma.sync m16n8k16): the `pointwise_mma` kernel
// (host: cuconv.backends.pointwise).
//
// In NHWC / NDHWC such a layer is the GEMM out[M][K] = x[M][C] * w[K][C]^T with M = N * (D) * H * W:
// the rows of a tile of BM output pixels are BM * C consecutive elements of x and BM * K consecutive
// elements of out. With C or K small (a mobile network's expansion 24 -> 144 or projection 144 -> 24)
// the layer moves bytes, it barely multiplies: what counts is reading x once, writing out in whole
// lines, and keeping enough of both in flight. The implicit GEMM kernels give such layers 64-channel
// reduction blocks (mostly zero) and tiles whose epilogue stores half sectors.
//
// CTA: 8 warps, a tile of BM output pixels x NT output channels (one column chunk of K; a single
// chunk where K <= 256). Warps are WM x WN (WN = 1 or 2 along the channels): warp (wm, wn) computes
// 16 pixels x NW = NT / WN channels, BM = 16 * WM.
//   1. The chunk's filter goes to shared memory as [NT][KCS] (reduction contiguous, zero past C and
//      past K; KCS = KC + 8 makes the ldmatrix rows conflict-free), again only when a later tile of
//      the CTA is in another chunk (tiles run chunk by chunk).
//   2. The grid is persistent: a CTA takes tiles blockIdx.x, + gridDim.x, ...; the next tile's x rows
//      are copied (cp.async of XVEC channels: 16 bytes, or 8 / 4 where C is a multiple of 4 / 2 only;
//      zero-filled past C and past M) into the second of two buffers [BM][KCS] while the current one is
//      multiplied.
//   3. Per k16 step: the warp's A fragment (one ldmatrix.x4), then per 16 channels one ldmatrix.x4 of
//      B and two mma.sync.
//   4. Epilogue act(alpha * acc + bias + beta * residual) in fp32: per 64 channels the warp stages its
//      16 x 64 sums in its own shared memory, then lanes write 16-byte vectors along each pixel's
//      channels (a pixel's row segment of the chunk is contiguous; with one chunk the warp's 16 rows
//      are one contiguous run of out), reading bias and residual as 16-byte vectors too. Where K is
//      not a multiple of 8 (OVEC = 1: a head's 1-7 maps, any K off the 16-byte grid) the rows of out
//      are not 16-byte aligned, and consecutive lanes take single channels of a row instead.
//
// Compile-time (host: cuconv.backends.pointwise.variants): dtype, KC (C rounded up to 16), NT, WN,
// OVEC (channels per epilogue access: 8 or 1), XVEC (channels per copy of x and load of w: 8, 4 or 2),
// MIN_BLOCKS. Run time (PwGeometry): M, C, K, the tile
// counts.
#include "common/types.cuh"
#include "common/smem.cuh"
#include "common/epilogue_math.cuh"
#include "sm80/ptx_sm80.cuh"
#include "depthwise/vec_io.cuh"

#ifndef PW_KC
#define PW_KC 32
#endif
#ifndef PW_NT
#define PW_NT 144
#endif
#ifndef PW_WN
#define PW_WN 1
#endif
#ifndef PW_OVEC  // channels per access of out, bias and the residual: 8 (16 bytes) or 1
#define PW_OVEC 8
#endif
#ifndef PW_XVEC  // channels per copy of x's rows and load of w's: 8 (16 bytes), 4 or 2
#define PW_XVEC 8
#endif
#ifndef PW_MIN_BLOCKS
#define PW_MIN_BLOCKS 2
#endif
#ifndef CUCONV_KERNEL_NAME
#define CUCONV_KERNEL_NAME pointwise_mma
#endif

namespace cuconv {
namespace pw {

using dw::load_vec;
using dw::store_vec;

constexpr int THREADS = 256;
constexpr int WARPS = THREADS / 32;
constexpr int KC = PW_KC, NT = PW_NT, WN = PW_WN, OVEC = PW_OVEC, XVEC = PW_XVEC;
constexpr int WM = WARPS / WN;
constexpr int BM = 16 * WM;           // output pixels per tile
constexpr int NW = NT / WN;           // output channels per warp
constexpr int KCS = KC + 8;           // row stride (elements) of the x buffers and the filter
constexpr int KSTEPS = KC / 16;
constexpr int SUB = 64;               // channels per staged block of the epilogue
constexpr int SLD = SUB + 8;          // staged row stride (floats): float2 stores of 8 rows conflict-free
static_assert(KC % 16 == 0 && KC <= 256, "KC: whole k16 steps, at most 256 channels");
static_assert(WN == 1 || WN == 2, "WN: one or two warps along the channels");
static_assert(OVEC == 8 || OVEC == 1, "OVEC: 16-byte vectors or single channels in the epilogue");
static_assert(XVEC == 8 || XVEC == 4 || XVEC == 2, "XVEC: copies of 16, 8 or 4 bytes");
static_assert(NT % (16 * WN) == 0 && NW <= 128, "NW: whole pairs of n8 fragments, at most 128 per warp");

// The run-time geometry (cuconv.backends.pointwise.variants.pw_geometry builds it; same field order).
struct PwGeometry {
  long long M;      // output pixels: N * (D) * H * W
  int C, K;         // input channels (a multiple of XVEC) and output channels (one of 8 where OVEC = 8)
  int m_tiles;      // tiles of BM pixels
  int chunks;       // column chunks of NT channels
  int tiles;        // m_tiles * chunks, chunk by chunk
};

// Shared memory: the filter [NT][KCS], two x buffers [BM][KCS], the warps' staging [WARPS][16][SLD].
constexpr int FILTER_BYTES = NT * KCS * 2;
constexpr int BUFFER_BYTES = BM * KCS * 2;
constexpr int STAGE_BYTES = WARPS * 16 * SLD * 4;
constexpr int SMEM_BYTES = FILTER_BYTES + 2 * BUFFER_BYTES + STAGE_BYTES;  // PwConfig.smem on the host
static_assert(SMEM_BYTES <= 227 * 1024, "within an sm_90 CTA's opt-in shared memory");
static_assert(FILTER_BYTES % 16 == 0 && BUFFER_BYTES % 16 == 0, "16-byte aligned regions");

// XVEC 16-bit values as one word of 16, 8 or 4 bytes.
template <int N> struct VecWord;
template <> struct VecWord<8> { using type = uint4; };
template <> struct VecWord<4> { using type = uint2; };
template <> struct VecWord<2> { using type = uint32_t; };
using xword_t = typename VecWord<XVEC>::type;

// Filter columns k0 .. k0 + NT - 1 (w: [K][C]) -> sf[n][c], zero past K and past C.
__device__ __forceinline__ void load_filter(uint16_t* sf, const elem_t* w, const PwGeometry& g, int k0) {
  constexpr int VECS = KC / XVEC;  // words per filter row
  for (int i = threadIdx.x; i < NT * VECS; i += THREADS) {
    const int n = i / VECS, v = i - n * VECS;
    xword_t val = {};
    if (k0 + n < g.K && v * XVEC < g.C) {
      val = *reinterpret_cast<const xword_t*>(w + (int64_t)(k0 + n) * g.C + v * XVEC);
    }
    *reinterpret_cast<xword_t*>(sf + n * KCS + v * XVEC) = val;
  }
}

// Start the copy of the x rows of pixel tile `mt` into the buffer at shared address `dst`.
__device__ __forceinline__ void start_copy(uint32_t dst, const elem_t* x, const PwGeometry& g, int mt) {
  constexpr int VECS = KC / XVEC;
  const long long m0 = (long long)mt * BM;
#pragma unroll 4
  for (int i = threadIdx.x; i < BM * VECS; i += THREADS) {
    const int r = i / VECS, v = i - r * VECS;
    const bool valid = m0 + r < g.M && v * XVEC < g.C;
    const elem_t* src = valid ? x + (m0 + r) * g.C + v * XVEC : x;
    sm80::cp_async_zfill<2 * XVEC>(dst + (uint32_t)((r * KCS + v * XVEC) * 2), src, valid);
  }
}

// Staged block B of a warp's sums (channels 64 B .. 64 B + 63 of its NW) -> stage[16][SLD] as fp32:
// lane (g8, t4) holds rows g8 and g8 + 8, columns 2 t4 and 2 t4 + 1 of each n8 fragment.
template <int B>
__device__ __forceinline__ void stage_block(const float (&acc)[NW / 8][4], float* stage, int g8, int t4) {
  constexpr int FIRST = B * SUB / 8, FRAGS = (NW - B * SUB < SUB ? NW - B * SUB : SUB) / 8;
#pragma unroll
  for (int jj = 0; jj < FRAGS; ++jj) {
    const float* f = acc[FIRST + jj];
    const int col = jj * 8 + 2 * t4;
    *reinterpret_cast<float2*>(stage + g8 * SLD + col) = make_float2(f[0], f[1]);
    *reinterpret_cast<float2*>(stage + (g8 + 8) * SLD + col) = make_float2(f[2], f[3]);
  }
}

// The epilogue of a staged block of VECS 16-byte vectors per pixel: out[m][k0 + 8 v ...] =
// act(alpha * sum + bias + beta * residual) for the 16 pixels m0 .. m0 + 15 (those below M) and the
// vectors below K; consecutive lanes along a pixel's vectors, then along the pixels. The trip count
// is a compile-time constant, so the loads of the iterations are issued together; where VECS divides
// 32 a lane's vector (and so its bias) is the same in every iteration.
template <int VECS>
__device__ __forceinline__ void store_block(const float* stage, const elem_t* bias, const elem_t* residual,
                                            elem_t* out, const PwGeometry& g, const EpilogueParams& ep,
                                            long long m0, int k0, int lane) {
  constexpr int ITERS = (16 * VECS + 31) / 32;
  constexpr bool FIXED_V = 32 % VECS == 0;
  float bv[8];
  if (FIXED_V && ep.has_bias && k0 + (lane % VECS) * 8 < g.K) {
    load_vec<elem_t, 8>(bias + k0 + (lane % VECS) * 8, bv);
  } else {
#pragma unroll
    for (int e = 0; e < 8; ++e) bv[e] = 0.f;
  }
#pragma unroll
  for (int it = 0; it < ITERS; ++it) {
    const int i = lane + 32 * it;
    const int r = i / VECS, v = i - r * VECS;
    const long long m = m0 + r;
    const int k = k0 + v * 8;
    if (i < 16 * VECS && m < g.M && k < g.K) {
      const float4 s0 = *reinterpret_cast<const float4*>(stage + r * SLD + v * 8);
      const float4 s1 = *reinterpret_cast<const float4*>(stage + r * SLD + v * 8 + 4);
      float y[8] = {s0.x, s0.y, s0.z, s0.w, s1.x, s1.y, s1.z, s1.w};
      if (!FIXED_V && ep.has_bias) load_vec<elem_t, 8>(bias + k, bv);
#pragma unroll
      for (int e = 0; e < 8; ++e) y[e] = fmaf(ep.alpha, y[e], bv[e]);
      const long long off = m * g.K + k;
      if (ep.has_residual) {
        float rv[8];
        load_vec<elem_t, 8>(residual + off, rv);
#pragma unroll
        for (int e = 0; e < 8; ++e) y[e] = fmaf(ep.beta, rv[e], y[e]);
      }
      if (ep.activation != ACT_NONE) {
#pragma unroll
        for (int e = 0; e < 8; ++e) y[e] = activate(y[e], ep.activation);
      }
      store_vec<elem_t, 8>(out + off, y);
    }
  }
}

// The epilogue of a staged block of COLS channels per pixel, one channel per lane and access (OVEC =
// 1: rows of out off the 16-byte grid): consecutive lanes along a pixel's channels, then along the
// pixels, so a warp's stores cover each row's channels of the block contiguously.
template <int COLS>
__device__ __forceinline__ void store_block_scalar(const float* stage, const elem_t* bias, const elem_t* residual,
                                                   elem_t* out, const PwGeometry& g, const EpilogueParams& ep,
                                                   long long m0, int k0, int lane) {
  static_assert(COLS % 8 == 0, "COLS: whole n8 fragments");
  constexpr int ITERS = 16 * COLS / 32;
#pragma unroll
  for (int it = 0; it < ITERS; ++it) {
    const int i = lane + 32 * it;
    const int r = i / COLS, c = i - r * COLS;
    const long long m = m0 + r;
    const int k = k0 + c;
    if (m < g.M && k < g.K) {
      const long long off = m * g.K + k;
      const float bv = ep.has_bias ? to_float(bias[k]) : 0.f;
      const float rv = ep.has_residual ? to_float(residual[off]) : 0.f;
      out[off] = from_float<elem_t>(apply_epilogue(stage[r * SLD + c], bv, rv, ep));
    }
  }
}

// Staged block (COLS channels from k0) -> out, in the epilogue's access width.
template <int COLS>
__device__ __forceinline__ void store_staged(const float* stage, const elem_t* bias, const elem_t* residual,
                                             elem_t* out, const PwGeometry& g, const EpilogueParams& ep,
                                             long long m0, int k0, int lane) {
  if constexpr (OVEC == 8) {
    store_block<COLS / 8>(stage, bias, residual, out, g, ep, m0, k0, lane);
  } else {
    store_block_scalar<COLS>(stage, bias, residual, out, g, ep, m0, k0, lane);
  }
}

}  // namespace pw
}  // namespace cuconv

using namespace cuconv;
using namespace cuconv::pw;

extern "C" __global__ void __launch_bounds__(THREADS, PW_MIN_BLOCKS)
CUCONV_KERNEL_NAME(const elem_t* __restrict__ x, const elem_t* __restrict__ w, const elem_t* bias,
                   const elem_t* residual, elem_t* out, PwGeometry g, EpilogueParams ep) {
  extern __shared__ __align__(16) unsigned char smem[];
  uint16_t* sf = reinterpret_cast<uint16_t*>(smem);                                   // [NT][KCS]
  const uint32_t buf0 = smem_u32(smem + FILTER_BYTES);                                // 2 x [BM][KCS]
  float* stage = reinterpret_cast<float*>(smem + FILTER_BYTES + 2 * BUFFER_BYTES);   // [WARPS][16][SLD]

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int wm = warp % WM, wn = warp / WM;
  const int g8 = lane >> 2, t4 = lane & 3;
  float* my_stage = stage + warp * 16 * SLD;
  // ldmatrix lane addresses (bytes, relative to a buffer / the filter): A rows lane & 15 of the warp's
  // 16 pixels, k half lane >> 4; B rows (channels) lane & 7 (+ 8 for lanes 16-31), k half (lane >> 3) & 1.
  const uint32_t a_lane = (uint32_t)(((wm * 16 + (lane & 15)) * KCS + (lane >> 4) * 8) * 2);
  const uint32_t b_lane = smem_u32(sf) +
                          (uint32_t)(((wn * NW + (lane & 7) + ((lane >> 4) << 3)) * KCS + ((lane >> 3) & 1) * 8) * 2);

  int tile = blockIdx.x;
  if (tile < g.tiles) start_copy(buf0, x, g, tile % g.m_tiles);
  sm80::cp_async_commit();
  int loaded_chunk = -1;
  for (int buf = 0; tile < g.tiles; tile += gridDim.x, buf ^= 1) {
    const int chunk = tile / g.m_tiles, mt = tile - chunk * g.m_tiles;
    if (chunk != loaded_chunk) {  // the previous iteration's closing barrier freed the filter
      load_filter(sf, w, g, chunk * NT);
      loaded_chunk = chunk;
    }
    const int next = tile + gridDim.x;
    if (next < g.tiles) start_copy(buf0 + (buf ^ 1) * BUFFER_BYTES, x, g, next % g.m_tiles);
    sm80::cp_async_commit();
    sm80::cp_async_wait<1>();
    __syncthreads();  // this tile's rows and the filter are in shared memory

    float acc[NW / 8][4];
#pragma unroll
    for (int j = 0; j < NW / 8; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
    const uint32_t a_base = buf0 + buf * BUFFER_BYTES + a_lane;
#pragma unroll
    for (int ks = 0; ks < KSTEPS; ++ks) {
      uint32_t a[4];
      sm80::ldmatrix_x4(a, a_base + ks * 32);
#pragma unroll
      for (int j = 0; j < NW / 16; ++j) {
        uint32_t b[4];
        sm80::ldmatrix_x4(b, b_lane + (uint32_t)(j * 16 * KCS * 2 + ks * 32));
        const uint32_t b01[2] = {b[0], b[1]}, b23[2] = {b[2], b[3]};
        sm80::mma_16816<elem_t>(acc[2 * j], a, b01);
        sm80::mma_16816<elem_t>(acc[2 * j + 1], a, b23);
      }
    }

    // Epilogue, 64 channels at a time: fragments -> the warp's staging -> 16-byte vectors of out.
    const long long m_warp = (long long)mt * BM + wm * 16;
    const int k_warp = chunk * NT + wn * NW;
    stage_block<0>(acc, my_stage, g8, t4);
    __syncwarp();
    store_staged<(NW < SUB ? NW : SUB)>(my_stage, bias, residual, out, g, ep, m_warp, k_warp, lane);
    if constexpr (NW > SUB) {
      __syncwarp();  // the staging is written again
      stage_block<(NW > SUB ? 1 : 0)>(acc, my_stage, g8, t4);
      __syncwarp();
      store_staged<(NW > SUB ? NW - SUB : 8)>(my_stage, bias, residual, out, g, ep, m_warp, k_warp + SUB, lane);
    }
    __syncthreads();  // every warp is done with this buffer (copied into again) and the filter
  }
  sm80::cp_async_wait<0>();
}
