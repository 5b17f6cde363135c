// cuconv: grouped / depthwise conv2d forward with few channels per group (Cg == Kg in {1,2,4,8,16}),
// NHWC, as block-diagonal mma.sync straight from registers ("grouped_mma" path of sm80_igemm).
//
// Why: with Cg = Kg = 4 (ResNeXt) the implicit-GEMM tile is >= 75% padding in N and every group's CTA
// re-reads the activation sectors of the others. Here one warp reads a pixel's channels once and
// does every group at that pixel.
//
// Superblock: 32 consecutive channels (in == out, groups never straddle one since Cg | 32). At one
// filter tap, out[pixel][32 ch] = Wsb[32 out][32 in] . x[pixel][32 in], Wsb block-diagonal (zeros
// across groups). Per 8 pixels that is 2 m-tiles x 2 k-steps of mma m16n8k16 with the *pixels as the
// mma N dimension*: B = x, whose fragment (k = 2t+{0,1}, 2t+8+{0,1}; n = lane/4) is filled by one
// 16-byte load per lane: lane (g = lane/4, t = lane%4) loads channels 8t..8t+7 of pixel g. That works
// because k and the output rows are only labels; the permutations are folded into the A fragments:
//   input  channel of label k in k-step ks:   8*((k&7)>>1) + 4*ks + 2*(k>>3) + (k&1)
//   output channel of row rho in m-tile mt:   4*(rho&7) + 2*mt + (rho>>3)
// so each lane also owns 4 consecutive output channels (4g..4g+3) of pixels 2t and 2t+1; the epilogue
// swaps halves with lane g^1 to hold 8 channels of one pixel (16-byte stores).
// A (the weights) never changes along the pixels: `<name>_frags` (a prep kernel) writes every
// (tap, superblock) as ready fragments, frags[tap][sb][f = 2*mt+ks][lane][4] (u32), once per call.
//
// Roles: every warp loads its pixels' channels (ld.global.nc, L1 keeps the R*S-fold reuse), runs the
// mmas and the epilogue act(alpha*acc + bias + beta*residual) from its registers. Per tap the address
// work is one 64-bit add and a bounds test per pixel (pointers to each pixel's window origin are
// computed once per pixel block), so the loop is mostly loads and mmas.
// Shared memory: the CTA's slab of fragments (SBS superblocks x taps x 2 KiB). Barrier: one
// __syncthreads after staging it. Grid: x = pixel blocks (grid-stride loop), y = channel slabs.
//
// Shape (host: sm80.grouped_variant): SBS = 1 superblock per CTA, 4 octets (32 pixels) per warp, 2
// CTAs per SM. Per 32-channel tap a warp then issues 4 LDS.128 of fragments for 32 pixels; L1/shared
// wavefronts are what bounds this kernel (~79% of peak on the H100), and 2 superblocks x 2 octets
// (the same registers) read twice the fragments per pixel: ResNeXt 32x4d 0.096 vs 0.085 ms.
#include "sm80/config.cuh"
#include "sm80/ptx_sm80.cuh"
#include "common/epilogue_math.cuh"
#include "common/fast_div.cuh"
#include "sm80/epilogue.cuh"

#ifndef CUCONV_SBS
#define CUCONV_SBS 1
#endif
#ifndef CUCONV_OCTETS
#define CUCONV_OCTETS 4
#endif
#ifndef CUCONV_GM_MIN_BLOCKS
#define CUCONV_GM_MIN_BLOCKS 2
#endif
#ifndef CUCONV_KERNEL_NAME
#define CUCONV_KERNEL_NAME conv2d_fprop_sm80_grouped_mma
#endif

namespace cuconv {
namespace sm80 {

struct GroupedGeometry {
  long long M;     // N * P * Q
  int H, W, C;     // C == K (Cg == Kg)
  int P, Q, R, S;
  int Cg;
  int stride_h, stride_w, dil_h, dil_w, pad_h, pad_w;
  int out_vec;     // widest output access, 8 / 2 / 1 elements (OutputView::out_vec)
  cuconv::FastDivisor div_q, div_p;  // m / Q and (m / Q) / P as multiply-shift
};

constexpr int kGmSuper = 32;                  // channels per superblock
constexpr int kGmWarps = 8;
constexpr int kGmThreads = 32 * kGmWarps;
constexpr int kGmOctets = CUCONV_OCTETS;      // 8-pixel mma columns per warp and iteration
constexpr int kGmSbs = CUCONV_SBS;            // superblocks per CTA (its channel slab)
constexpr int kGmWordsPerTapSb = 4 * 32 * 4;  // f x lane x reg

// Budget: the fragment slab for a 7x7 filter must fit the 99 KiB opt-in shared memory with SBS = 1.
static_assert(kGmSbs == 1 || kGmSbs == 2 || kGmSbs == 4, "SBS is 1, 2 or 4 superblocks");
static_assert(49 * kGmWordsPerTapSb * 4 <= kSmemBudgetBytes, "a 7x7 slab of one superblock fits");

__device__ __forceinline__ void ld_global_nc_v4(uint32_t (&r)[4], const void* p, bool valid) {
  r[0] = r[1] = r[2] = r[3] = 0u;
  if (valid)
    asm("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];\n" : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "l"(p));
}
__device__ __forceinline__ void ld_shared_v4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n" : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ __forceinline__ void st_shared_v4(uint32_t addr, const uint32_t (&r)[4]) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3]));
}

}  // namespace sm80
}  // namespace cuconv

namespace cs = cuconv::sm80;

// Prep: w[K][R*S][Cg] -> frags[tap][sb][f][lane][reg] (u32, two 16-bit halves, low = column 2t / 2t+8).
extern "C" __global__ void __launch_bounds__(256)
CUCONV_CAT(CUCONV_KERNEL_NAME, _frags)(const elem_t* __restrict__ w, uint32_t* __restrict__ frags, int taps,
                                      int C, int Cg, int n_super) {
  const long long total = (long long)taps * n_super * cs::kGmWordsPerTapSb;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
       i += (long long)gridDim.x * blockDim.x) {
    const int a = (int)(i & 3), lane = (int)((i >> 2) & 31), f = (int)((i >> 7) & 3);
    const long long tap_sb = i >> 9;
    const int sb = (int)(tap_sb % n_super), tap = (int)(tap_sb / n_super);
    const int mt = f >> 1, ks = f & 1, g = lane >> 2, t = lane & 3;
    const int rho = g + 8 * (a & 1);                       // mma A row of register a
    const int oc = sb * cs::kGmSuper + 4 * (rho & 7) + 2 * mt + (rho >> 3);
    uint32_t word = 0;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int k = 2 * t + h + 8 * (a >> 1);              // mma A column of half h
      const int ic = sb * cs::kGmSuper + 8 * ((k & 7) >> 1) + 4 * ks + 2 * (k >> 3) + (k & 1);
      uint32_t bits = 0;
      if (oc < C && ic < C && oc / Cg == ic / Cg)
        bits = w[((long long)oc * taps + tap) * Cg + (ic % Cg)].bits;
      word |= bits << (16 * h);
    }
    frags[i] = word;
  }
}

extern "C" __global__ void __launch_bounds__(cs::kGmThreads, CUCONV_GM_MIN_BLOCKS)
CUCONV_KERNEL_NAME(const elem_t* __restrict__ x, const uint32_t* __restrict__ frags, const elem_t* bias,
                   const elem_t* residual, elem_t* out, cs::GroupedGeometry g, cuconv::EpilogueParams ep) {
  extern __shared__ __align__(128) unsigned char smem[];
  const int taps = g.R * g.S;
  const int n_super = (g.C + cs::kGmSuper - 1) / cs::kGmSuper;
  const int sb0 = blockIdx.y * cs::kGmSbs;
  const uint32_t fr = cuconv::smem_u32(smem);

  // Stage the slab's fragments: smem [tap][j < SBS][f][lane] x 16 bytes (superblocks past the end: 0).
  constexpr int kVecPerTapSb = cs::kGmWordsPerTapSb / 4;  // 128 x 16 bytes
  for (int i = threadIdx.x; i < taps * cs::kGmSbs * kVecPerTapSb; i += cs::kGmThreads) {
    const int within = i % kVecPerTapSb, j = (i / kVecPerTapSb) % cs::kGmSbs, tap = i / (kVecPerTapSb * cs::kGmSbs);
    uint32_t v[4];
    const bool ok = sb0 + j < n_super;
    cs::ld_global_nc_v4(v, ok ? frags + (((long long)tap * n_super + sb0 + j) * kVecPerTapSb + within) * 4 : frags,
                        ok);
    cs::st_shared_v4(fr + (uint32_t)i * 16, v);
  }
  __syncthreads();

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int gq = lane >> 2, t = lane & 3;
  const int c_lane = sb0 * cs::kGmSuper + 8 * t;  // + 32 j: this lane's 8 input channels of superblock j
  bool c_ok[cs::kGmSbs];
#pragma unroll
  for (int j = 0; j < cs::kGmSbs; ++j) c_ok[j] = c_lane + j * cs::kGmSuper < g.C;  // C % 8 == 0
  constexpr int kPixelsPerWarp = 8 * cs::kGmOctets;
  const long long blocks = (g.M + cs::kGmWarps * kPixelsPerWarp - 1) / (cs::kGmWarps * kPixelsPerWarp);
  const long long row_elems = (long long)g.W * g.C;
  const long long tap_step = 2ll * g.dil_w * g.C;                                  // bytes to the next tap
  const long long row_step = 2ll * g.dil_h * row_elems - (long long)(g.S - 1) * tap_step;  // and filter row
  const cuconv::sm80::OutputView view{out, residual, bias, g.M, g.C, g.C, 0, g.out_vec};

  for (long long blk = blockIdx.x; blk < blocks; blk += gridDim.x) {
    const long long m_warp = (blk * cs::kGmWarps + warp) * kPixelsPerWarp;
    // The pixel this lane loads (mma column gq) in each octet: its window origin, and the byte address
    // of its channels there (outside the image when padded; dereferenced only inside it).
    unsigned long long px[cs::kGmOctets];
    int h0[cs::kGmOctets], w0[cs::kGmOctets];
#pragma unroll
    for (int o = 0; o < cs::kGmOctets; ++o) {
      const long long m = m_warp + o * 8 + gq;  // < 2^31 (host gate)
      const unsigned nq = cuconv::fast_div((unsigned)m, g.div_q), n = cuconv::fast_div(nq, g.div_p);
      const int q = (int)((unsigned)m - nq * (unsigned)g.Q), p = (int)(nq - n * (unsigned)g.P);
      h0[o] = m < g.M ? p * g.stride_h - g.pad_h : -(1 << 30);  // rows past M: every tap out of the image
      w0[o] = q * g.stride_w - g.pad_w;
      px[o] = reinterpret_cast<unsigned long long>(x) +
              2ull * (unsigned long long)(((long long)n * g.H + h0[o]) * row_elems + (long long)w0[o] * g.C + c_lane);
    }

    float acc[cs::kGmOctets][cs::kGmSbs][2][4];
#pragma unroll
    for (int o = 0; o < cs::kGmOctets; ++o)
#pragma unroll
      for (int j = 0; j < cs::kGmSbs; ++j)
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
          for (int e = 0; e < 4; ++e) acc[o][j][mt][e] = 0.f;

    // this lane's activation chunks of every octet and superblock at the tap (dh, dw), `off` bytes
    // from the window origin (zero outside the image)
    auto load_tap = [&](uint32_t (&b)[cs::kGmOctets][cs::kGmSbs][4], int dh, int dw, long long off) {
#pragma unroll
      for (int o = 0; o < cs::kGmOctets; ++o) {
        const bool in = (unsigned)(h0[o] + dh) < (unsigned)g.H && (unsigned)(w0[o] + dw) < (unsigned)g.W;
#pragma unroll
        for (int j = 0; j < cs::kGmSbs; ++j)
          cs::ld_global_nc_v4(b[o][j], reinterpret_cast<const void*>(px[o] + off + j * cs::kGmSuper * 2),
                              in && c_ok[j]);
      }
    };
    uint32_t b[cs::kGmOctets][cs::kGmSbs][4];  // {ks0: b0 b1, ks1: b0 b1}
    int s = 0, dh = 0, dw = 0;
    long long off = 0;  // bytes: (dh * W + dw) * C * 2
#pragma unroll 1
    for (int tap = 0; tap < taps; ++tap) {
      load_tap(b, dh, dw, off);
      const bool wrap = ++s == g.S;  // next filter row
      s = wrap ? 0 : s;
      dw = wrap ? 0 : dw + g.dil_w;
      dh = wrap ? dh + g.dil_h : dh;
      off += wrap ? row_step : tap_step;
      const uint32_t fr_tap = fr + (uint32_t)(tap * cs::kGmSbs * cs::kGmWordsPerTapSb * 4 + lane * 16);
#pragma unroll
      for (int j = 0; j < cs::kGmSbs; ++j) {
        uint32_t a[4][4];
#pragma unroll
        for (int f = 0; f < 4; ++f) cs::ld_shared_v4(a[f], fr_tap + (uint32_t)((j * 4 + f) * 32 * 16));
#pragma unroll
        for (int o = 0; o < cs::kGmOctets; ++o) {
          const uint32_t b0[2] = {b[o][j][0], b[o][j][1]};
          const uint32_t b1[2] = {b[o][j][2], b[o][j][3]};
#pragma unroll
          for (int mt = 0; mt < 2; ++mt) {
            cs::mma_16816<elem_t>(acc[o][j][mt], a[2 * mt], b0);
            cs::mma_16816<elem_t>(acc[o][j][mt], a[2 * mt + 1], b1);
          }
        }
      }
    }

    // Epilogue: lane (gq, t) holds channels 4 gq .. 4 gq + 3 of superblock j at pixels 2t and 2t + 1
    // of each octet. Lanes gq and gq ^ 1 swap halves (one shuffle per value) so that each holds 8
    // consecutive channels 8 (gq / 2) .. + 7 of one pixel, 2t + (gq & 1), for the shared epilogue
    // and one 16-byte store (4 lanes write a pixel's 64-byte superblock segment).
    const int odd = gq & 1;
#pragma unroll
    for (int o = 0; o < cs::kGmOctets; ++o) {
      const long long m = m_warp + o * 8 + 2 * t + odd;
#pragma unroll
      for (int j = 0; j < cs::kGmSbs; ++j) {
        float v[8];
#pragma unroll
        for (int e = 0; e < 4; ++e) {  // channel 4 gq + e of pixel 2t + pp: acc[o][j][e / 2][2 (e % 2) + pp]
          const float p0 = acc[o][j][e >> 1][2 * (e & 1)], p1 = acc[o][j][e >> 1][2 * (e & 1) + 1];
          const float other = __shfl_xor_sync(0xffffffffu, odd ? p0 : p1, 4);
          v[e] = odd ? other : p0;
          v[4 + e] = odd ? p1 : other;
        }
        cuconv::sm80::store8(v, view, ep, m, (long long)(sb0 + j) * cs::kGmSuper + 8 * (gq >> 1));
      }
    }
  }
}
