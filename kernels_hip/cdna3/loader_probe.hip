// cuconv (HIP): loader probes for the ISA checks of tests/test_cdna3_compile.py; never launched.
//
// Each probe builds one loader and fills one half-tile, with the same arguments, so the instruction
// streams can be compared mnemonic by mnemonic:
//   probe_loader_linear            the matmul / weight loader (LinearLoader<false>)
//   probe_loader_im2col_pointwise  the im2col loader on its pointwise sub-path: must be the same stream
//   probe_loader_im2col_uniform / _per_lane (+ halo): the other sub-paths, for the division checks
#include "common/hip_min.h"
#include "common/index_math.h"
#include "common/buffer_lds.h"
#include "cdna3/loader_linear.h"
#include "cdna3/loader_im2col.h"

using namespace cuconv;

// Same parameter list for every probe: what differs is only which loader interprets it.
#define CUCONV_PROBE_PARAMS const void* x, ConvGeometryHip g, u32 m_offset, u32 k_offset, u32 group

extern "C" __global__ void __launch_bounds__(kThreads) probe_loader_linear(CUCONV_PROBE_PARAMS) {
  __shared__ __attribute__((aligned(16))) char lds[kHalfTileBytes];
  // The matmul view of the same problem: rows of C elements, columns from group * Cg.
  LinearLoader<false> loader(
      x, LinearLaneAddresses<false>((u32)g.C, group * (u32)g.Cg, (u32)g.Kgemm, g.x_bytes, m_offset, (i32)wave_id(),
                                    (i32)lane_id()));
  loader.load_tile((lds_ptr_t)lds, k_offset);
  wait_vmcnt<0>();
}

extern "C" __global__ void __launch_bounds__(kThreads) probe_loader_im2col_pointwise(CUCONV_PROBE_PARAMS) {
  __shared__ __attribute__((aligned(16))) char lds[kHalfTileBytes];
  Im2colLoader<SUBPATH_POINTWISE, false, false> loader(x, g, m_offset, group);
  loader.load_tile(g, (lds_ptr_t)lds, k_offset);
  wait_vmcnt<0>();
}

extern "C" __global__ void __launch_bounds__(kThreads) probe_loader_im2col_uniform(CUCONV_PROBE_PARAMS) {
  __shared__ __attribute__((aligned(16))) char lds[kHalfTileBytes];
  Im2colLoader<SUBPATH_UNIFORM, false, false> loader(x, g, m_offset, group);
  loader.load_tile(g, (lds_ptr_t)lds, k_offset);
  wait_vmcnt<0>();
}

extern "C" __global__ void __launch_bounds__(kThreads) probe_loader_im2col_uniform_halo(CUCONV_PROBE_PARAMS) {
  __shared__ __attribute__((aligned(16))) char lds[kHalfTileBytes];
  Im2colLoader<SUBPATH_UNIFORM, true, false> loader(x, g, m_offset, group);
  loader.load_tile(g, (lds_ptr_t)lds, k_offset);
  wait_vmcnt<0>();
}

extern "C" __global__ void __launch_bounds__(kThreads) probe_loader_im2col_per_lane_halo(CUCONV_PROBE_PARAMS) {
  __shared__ __attribute__((aligned(16))) char lds[kHalfTileBytes];
  Im2colLoader<SUBPATH_PER_LANE, true, true> loader(x, g, m_offset, group);
  loader.load_tile(g, (lds_ptr_t)lds, k_offset);
  wait_vmcnt<0>();
}

// Positive control for the division detector: the same per-lane decomposition with the compiler's
// own `/` and `%` instead of FastDivmod. Its ISA must show the v_rcp_iflag_f32 sequence; if it did
// not, the "no division" checks on the real loaders would prove nothing.
extern "C" __global__ void __launch_bounds__(kThreads) probe_division_control(CUCONV_PROBE_PARAMS) {
  __shared__ __attribute__((aligned(16))) char lds[kHalfTileBytes];
  const i32x4 rsrc = make_buffer_resource(x, g.x_bytes);
  const u32 m = m_offset + (u32)thread_id_x();
  const u32 k = k_offset + (u32)lane_id() * 2u;
  const u32 q = m % (u32)g.Q, p = (m / (u32)g.Q) % (u32)g.P, n = m / (u32)g.Q / (u32)g.P;
  const u32 c = k % (u32)g.Cg, tap = k / (u32)g.Cg;
  const u32 v = (((n * (u32)g.H + p + tap / (u32)g.S) * (u32)g.W + q + tap % (u32)g.S) * (u32)g.C + group * (u32)g.Cg + c) * 2u;
  buffer_load_dword_lds(rsrc, (lds_ptr_t)(lds + lds_iter_offset(0, (i32)wave_id())), v);
  wait_vmcnt<0>();
}
