"""The HIP depthwise kernel's source, built for the CPU and run work-item by work-item, against the
float64 reference.

kernels_hip/depthwise/depthwise_fprop.hip is compiled as C++20 by clang-19 with a small harness that
stands in for the GPU: one ``std::thread`` per work-item, a ``std::barrier`` for ``s_barrier``, the
workgroup and work-item ids as thread-local values, a 64 KiB array as LDS (filled with 0xFF bytes, NaN
as fp32, before each workgroup), and the raw buffer loads as memory reads that return zeros at or past
``num_records``, as the hardware does. Everything else is the kernel's own code: the block
decomposition, the tile copy with its unit walk and padding sentinel, the barriers, the window
multiply-adds, the element conversions and the fused epilogue, with the variant's ``-D`` defines
(:func:`cuconv.backends.depthwise.variants.dw_variant`), the struct of
:func:`~cuconv.backends.depthwise.params.dw_geometry` and the launch shape the host uses (grid, work-items).

What this does not check: the AMDGPU code generation (tests/test_cdna3_depthwise_compile.py checks its
ISA), the hardware's out-of-range rule, and timing between waves. The output starts as NaN, so an
element the kernel never stores fails, and each element is compared (not only the norm of the error).
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import cuconv
from cuconv.backends.cdna3.depthwise import DW_HIP_SOURCE, Cdna3DepthwiseKernel, hip_dw_config
from cuconv.backends.depthwise.params import dw_geometry
from cuconv.backends.depthwise.variants import dw_variant
from cuconv.device import DeviceInfo
from cuconv.launch import epilogue_params
from cuconv.overrides import Overrides
from cuconv.problem import ConvProblem, Epilogue

from conftest import DTYPES, assert_close
from geometry import Case, depthwise_cases, make_operands

ROOT = Path(__file__).resolve().parent.parent
HIP_DIR = ROOT / "kernels_hip"
CLANG = shutil.which("clang-19")
MI300 = DeviceInfo(kind="hip", index=0, name="MI300X", arch="gfx942", sm_count=304)

pytestmark = pytest.mark.skipif(CLANG is None, reason="clang-19 not found: the CPU build of the HIP kernel needs it")

_HARNESS = r"""
#include <barrier>
#include <cstddef>
#include <cstring>
#include <thread>
#include <vector>

namespace emu {
thread_local unsigned tid = 0, block = 0;
std::barrier<>* bar = nullptr;
int errors = 0;
}  // namespace emu

// The HIP spellings and the amdgcn builtins the kernel uses, on the CPU.
#define __HIPCC_RTC__ 1
#define __global__
#define __device__
#define __host__
#define __shared__
#define __launch_bounds__(...)
#define __forceinline__ inline
#define __builtin_amdgcn_workitem_id_x() (emu::tid)
#define __builtin_amdgcn_workgroup_id_x() (emu::block)
#define __builtin_amdgcn_workgroup_id_y() 0u
#define __builtin_amdgcn_workgroup_id_z() 0u
#define __builtin_amdgcn_readfirstlane(v) (v)
#define __builtin_amdgcn_s_waitcnt(v) ((void)(v))
#define __builtin_amdgcn_s_barrier() (emu::bar->arrive_and_wait())
#define __builtin_amdgcn_fence(order, scope) ((void)0)

#include "depthwise/depthwise_fprop.hip"

alignas(16) unsigned char dw_lds[65536];

// Raw buffer loads: base address in words 0-1 (48 bits), num_records in word 2, zeros at or past it.
static void emu_buffer_read(cuconv::i32x4 r, int voffset, void* dst, unsigned bytes) {
  const unsigned long long base =
      (unsigned long long)(unsigned)r.x | ((unsigned long long)((unsigned)r.y & 0xFFFFu) << 32);
  const unsigned num = (unsigned)r.z, off = (unsigned)voffset;
  if (off >= num) {
    std::memset(dst, 0, bytes);
    return;
  }
  if ((unsigned long long)off + bytes > num) ++emu::errors;  // straddles num_records: the kernel never does
  std::memcpy(dst, (const void*)(base + off), bytes);
}
cuconv::dw::u32x4 cuconv_raw_buffer_load_v4i32(cuconv::i32x4 r, int v, int, int) {
  cuconv::dw::u32x4 d;
  emu_buffer_read(r, v, &d, 16);
  return d;
}
cuconv::dw::u32x2 cuconv_raw_buffer_load_v2i32(cuconv::i32x4 r, int v, int, int) {
  cuconv::dw::u32x2 d;
  emu_buffer_read(r, v, &d, 8);
  return d;
}
cuconv::u32 cuconv_raw_buffer_load_i32(cuconv::i32x4 r, int v, int, int) {
  cuconv::u32 d;
  emu_buffer_read(r, v, &d, 4);
  return d;
}
short cuconv_raw_buffer_load_i16(cuconv::i32x4 r, int v, int, int) {
  short d;
  emu_buffer_read(r, v, &d, 2);
  return d;
}

// The launch: `threads` work-items run every workgroup of the 1-D grid in turn (a workgroup's LDS is
// refilled with 0xFF bytes first); returns the count of loads that straddled num_records.
extern "C" int emu_launch(const void* x, const void* w, const void* bias, const void* residual, void* out,
                          const cuconv::dw::DwGeometry* g, const cuconv::EpilogueParams* ep, unsigned blocks,
                          unsigned threads) {
  emu::errors = 0;
  std::barrier<> bar((std::ptrdiff_t)threads);
  emu::bar = &bar;
  std::vector<std::thread> team;
  for (unsigned t = 0; t < threads; ++t)
    team.emplace_back([=, &bar] {
      emu::tid = t;
      for (unsigned b = 0; b < blocks; ++b) {
        if (t == 0) std::memset(dw_lds, 0xFF, sizeof(dw_lds));
        bar.arrive_and_wait();
        emu::block = b;
        CUCONV_KERNEL_NAME((const elem_t*)x, (const elem_t*)w, (const elem_t*)bias, (const elem_t*)residual,
                           (elem_t*)out, *g, *ep);
        bar.arrive_and_wait();  // every work-item is done with the workgroup before LDS is refilled
      }
    });
  for (auto& th : team) th.join();
  return emu::errors;
}
"""


@pytest.fixture(scope="module")
def build(tmp_path_factory):
    """``build(name, defines)`` -> the launch function of that variant, compiled once per module."""
    d = tmp_path_factory.mktemp("hip_depthwise_emulation")
    (d / "harness.cpp").write_text(_HARNESS)
    libs = {}

    def get(name, defines):
        if name not in libs:
            so = d / f"{name}.so"
            cmd = [CLANG, "-x", "c++", "-std=c++20", "-O1", "-shared", "-fPIC", "-pthread", f"-I{HIP_DIR}",
                   *[f"-D{k}={v}" for k, v in sorted(defines.items())], str(d / "harness.cpp"), "-o", str(so), "-lstdc++"]
            res = subprocess.run(cmd, capture_output=True, text=True)
            assert res.returncode == 0, f"{' '.join(cmd)}\n{res.stderr}"
            fn = ctypes.CDLL(str(so)).emu_launch
            fn.argtypes = [ctypes.c_void_p] * 7 + [ctypes.c_uint, ctypes.c_uint]
            fn.restype = ctypes.c_int
            libs[name] = fn
        return libs[name]

    assert (HIP_DIR / DW_HIP_SOURCE).is_file()
    return get


#: Element-wise bound |got - ref| <= TOL * (|ref| + rms(ref)), per output dtype: the output rounding
#: and the fp32 accumulation; a missing tap or a wrong channel is an error of the order of rms(ref).
ELEMENT_TOL = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 1.6e-2}


def _run_case(build, case: Case):
    p = ConvProblem.create(nd=case.nd, batch=case.batch, in_spatial=case.spatial, channels=case.channels,
                           out_channels=case.out_channels, filter_spatial=case.filt, stride=case.stride,
                           dilation=case.dilation, padding=case.padding, groups=case.groups, dtype=case.dtype,
                           layout="NHWC" if case.nd == 2 else "NDHWC")
    ep = case.epilogue
    e = Epilogue(alpha=ep.get("alpha", 1.0), beta=ep.get("beta", 1.0), has_bias=bool(ep.get("bias")),
                 has_residual=bool(ep.get("residual")), activation=ep.get("activation"))
    p = p.with_epilogue(e)
    plan = Cdna3DepthwiseKernel().plan(p, MI300, Overrides())
    if not plan:
        return None  # a tile over the LDS: declined on the device too
    cfg = hip_dw_config(p, MI300)
    name, defines = dw_variant(p, cfg)
    assert (plan.name, plan.cfg) == (name, cfg)
    x, w, bias, residual = make_operands(case)
    ref = cuconv.reference.convnd(x, w, bias, stride=case.stride, padding=case.padding, dilation=case.dilation,
                                  groups=case.groups, layout=p.layout, residual=residual, alpha=e.alpha, beta=e.beta,
                                  activation=e.activation)
    out = np.full(ref.shape, np.nan, dtype=DTYPES[case.dtype])
    b = out if bias is None else np.ascontiguousarray(bias)
    r = out if residual is None else np.ascontiguousarray(residual)
    geo, epp = np.array(dw_geometry(p, cfg)), np.array(epilogue_params(e))
    x, w = np.ascontiguousarray(x), np.ascontiguousarray(w)
    straddles = build(name, defines)(x.ctypes.data, w.ctypes.data, b.ctypes.data, r.ctypes.data, out.ctypes.data,
                                     geo.ctypes.data, epp.ctypes.data, plan.grid, cfg.threads)
    assert straddles == 0, f"{straddles} loads straddled num_records"
    ctx = f"{case!r} {name} {plan.describe()}"
    got = out.astype(np.float64)
    assert np.isfinite(got).all(), f"NaN / inf in the output (an element not stored, or an LDS slot not written) {ctx}"
    assert_close(out, ref, case.dtype, context=ctx)
    tol = ELEMENT_TOL[case.dtype]
    bound = tol * (np.abs(ref) + np.sqrt(np.mean(ref ** 2)))
    worst = np.argmax(np.abs(got - ref) - bound)
    assert (np.abs(got - ref) <= bound).all(), f"element {np.unravel_index(worst, ref.shape)}: " \
        f"{got.flat[worst]} vs {ref.flat[worst]} {ctx}"
    return name


def _case(nd=2, N=2, spatial=(9, 11), C=16, mult=1, filt=(3, 3), stride=1, dilation=1, padding=1, dtype="bfloat16",
          ep=None, seed=0) -> Case:
    pad = tuple((padding, padding) for _ in range(nd))
    return Case(nd=nd, batch=N, spatial=spatial, channels=C, out_channels=mult * C, filt=filt,
                stride=(stride,) * nd, dilation=(dilation,) * nd, padding=pad, groups=C, dtype=dtype,
                layout="NHWC" if nd == 2 else "NDHWC", epilogue=ep or {}, seed=seed)


FULL_EP = dict(bias=True, residual=True, beta=0.5, alpha=-1.25, activation="silu")
NAMED = {
    "3x3_bf16_epilogue": _case(ep=FULL_EP),
    "3x3_f16_two_tile_columns": _case(spatial=(12, 37), C=24, dtype="float16", ep=dict(activation="relu")),
    "3x3_f32_s2_three_chunks": _case(spatial=(21, 40), C=40, stride=2, dtype="float32", ep=dict(bias=True)),
    "5x5_bf16_s2": _case(spatial=(17, 19), C=32, filt=(5, 5), stride=2, padding=2, ep=dict(activation="gelu")),
    "7x7_bf16": _case(spatial=(14, 18), C=48, filt=(7, 7), padding=3, ep=dict(residual=True, beta=1.0)),
    "7x7_f32": _case(spatial=(10, 23), C=12, filt=(7, 7), padding=3, dtype="float32"),
    "odd_c_bf16": _case(C=7, ep=dict(bias=True)),
    "odd_c_f16_mult3": _case(C=5, mult=3, dtype="float16", ep=FULL_EP),
    "mult2_bf16": _case(C=12, mult=2, spatial=(8, 20), ep=dict(bias=True, activation="relu")),
    "mult2_f32_dil2": _case(C=6, mult=2, dilation=2, padding=2, dtype="float32"),
    "3x3x3_bf16": _case(nd=3, spatial=(5, 7, 9), C=16, filt=(3, 3, 3), ep=FULL_EP),
    "3x1x1_f32_depth_padding": _case(nd=3, spatial=(4, 6, 5), C=4, filt=(3, 1, 1), stride=2, padding=1,
                                     dtype="float32"),
}


@pytest.mark.parametrize("key", sorted(NAMED))
def test_named_problems(build, key):
    assert _run_case(build, NAMED[key]) is not None, "declined: pick a problem whose tile fits the LDS"


@settings(max_examples=30, deadline=None)
@given(case=st.one_of(depthwise_cases(nd=2, layouts=("NHWC",), max_spatial=24, max_channels=40, max_filter=3),
                      depthwise_cases(nd=3, layouts=("NDHWC",), max_spatial=8, max_channels=12, max_filter=3)))
def test_drawn_problems(build, case):
    _run_case(build, case)
