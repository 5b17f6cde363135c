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
// so each lane also owns 4 consecutive output channels (4g..4g+3) of pixels 2t and 2t+1 (8-byte stores).
// A (the weights) never changes along the pixels: `<name>_frags` (a prep kernel) writes every
// (tap, superblock) as ready fragments, frags[tap][sb][f = 2*mt+ks][lane][4] (u32), once per call.
//
// Roles: every warp loads its pixels' channels (ld.global.nc, L1 keeps the R*S-fold reuse), runs the
// mmas and the epilogue act(alpha*acc + bias + beta*residual) from its registers.
// Shared memory: the CTA's slab of fragments (SBS superblocks x taps x 2 KiB). Barrier: one
// __syncthreads after staging it. Grid: x = pixel blocks (grid-stride loop), y = channel slabs.
#include "sm80/config.cuh"
#include "sm80/ptx_sm80.cuh"
#include "common/epilogue_math.cuh"

#ifndef CUCONV_SBS
#define CUCONV_SBS 4
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
  int out_vec;     // out and residual 8-byte aligned: 4-channel stores / loads
};

constexpr int kGmSuper = 32;                  // channels per superblock
constexpr int kGmWarps = 8;
constexpr int kGmThreads = 32 * kGmWarps;
constexpr int kGmOctets = 2;                  // 8-pixel mma columns per warp and iteration
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

extern "C" __global__ void __launch_bounds__(cs::kGmThreads, 1)
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
  constexpr int kPixelsPerWarp = 8 * cs::kGmOctets;
  const long long blocks = (g.M + cs::kGmWarps * kPixelsPerWarp - 1) / (cs::kGmWarps * kPixelsPerWarp);

  for (long long blk = blockIdx.x; blk < blocks; blk += gridDim.x) {
    const long long m_warp = (blk * cs::kGmWarps + warp) * kPixelsPerWarp;
    // the pixel this lane loads (mma column gq) in each octet
    long long pix_base[cs::kGmOctets];
    int h0[cs::kGmOctets], w0[cs::kGmOctets];
#pragma unroll
    for (int o = 0; o < cs::kGmOctets; ++o) {
      const long long m = m_warp + o * 8 + gq;
      pix_base[o] = 0;
      h0[o] = -(1 << 30);
      w0[o] = 0;
      if (m < g.M) {
        const long long nq = m / g.Q;
        const int q = (int)(m - nq * g.Q);
        const long long n = nq / g.P;
        const int p = (int)(nq - n * g.P);
        pix_base[o] = n * g.H * g.W * (long long)g.C;
        h0[o] = p * g.stride_h - g.pad_h;
        w0[o] = q * g.stride_w - g.pad_w;
      }
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

#pragma unroll 1
    for (int tap = 0; tap < taps; ++tap) {
      const int r = tap / g.S, s = tap - (tap / g.S) * g.S;
      uint32_t b[cs::kGmOctets][cs::kGmSbs][4];  // {ks0: b0 b1, ks1: b0 b1}
#pragma unroll
      for (int o = 0; o < cs::kGmOctets; ++o) {
        const int h = h0[o] + r * g.dil_h, wc = w0[o] + s * g.dil_w;
        const bool in = (unsigned)h < (unsigned)g.H && (unsigned)wc < (unsigned)g.W;
        const elem_t* px = x + pix_base[o] + ((long long)h * g.W + wc) * g.C;
#pragma unroll
        for (int j = 0; j < cs::kGmSbs; ++j) {
          const int c = c_lane + j * cs::kGmSuper;
          const bool ok = in && c < g.C;
          cs::ld_global_nc_v4(b[o][j], ok ? (const void*)(px + c) : (const void*)x, ok);
        }
      }
#pragma unroll
      for (int j = 0; j < cs::kGmSbs; ++j) {
        uint32_t a[4][4];
#pragma unroll
        for (int f = 0; f < 4; ++f)
          cs::ld_shared_v4(a[f], fr + (uint32_t)((((tap * cs::kGmSbs + j) * 4 + f) * 32 + lane) * 16));
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

    // Epilogue: lane owns channels 4 gq .. 4 gq + 3 of superblock j at pixels 2t and 2t + 1.
#pragma unroll
    for (int o = 0; o < cs::kGmOctets; ++o) {
#pragma unroll
      for (int pp = 0; pp < 2; ++pp) {
        const long long m = m_warp + o * 8 + 2 * t + pp;
        if (m >= g.M) continue;
#pragma unroll
        for (int j = 0; j < cs::kGmSbs; ++j) {
          const int c = (sb0 + j) * cs::kGmSuper + 4 * gq;
          if (c >= g.C) continue;  // C % 8 == 0: the 4 channels are all in or all out
          const long long idx = m * g.C + c;
          float v[4] = {acc[o][j][0][pp], acc[o][j][0][2 + pp], acc[o][j][1][pp], acc[o][j][1][2 + pp]};
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const float bv = ep.has_bias ? cuconv::to_float(bias[c + e]) : 0.f;
            const float rv = ep.has_residual ? cuconv::to_float(residual[idx + e]) : 0.f;
            v[e] = cuconv::apply_epilogue(v[e], bv, rv, ep);
          }
          if (g.out_vec) {
            const uint32_t lo = cuconv::pack2<elem_t>(v[0], v[1]), hi = cuconv::pack2<elem_t>(v[2], v[3]);
            asm volatile("st.global.v2.u32 [%0], {%1, %2};\n" ::"l"(out + idx), "r"(lo), "r"(hi) : "memory");
          } else {
#pragma unroll
            for (int e = 0; e < 4; ++e) out[idx + e] = cuconv::from_float<elem_t>(v[e]);
          }
        }
      }
    }
  }
}
