"""The HIP loaders' index math, compiled for the CPU, against the NumPy loader model.

kernels_hip/common/index_math.h is host-callable (CUCONV_HD is empty outside a HIP compile). This
test builds it, with a small C shim, into a shared library using the system C++ compiler
(clang-19, clang++, g++ or c++, whichever exists) and calls it through ctypes:

* every lane's voffset, for every loader iteration, for the im2col sub-paths (pointwise / uniform /
  per_lane, halo and K mask on and off) equals ``cuconv.models.loader.loader_addresses`` (x 2 bytes),
  and every element the model marks as zero (-1: halo or K tail) gets exactly the num_records
  sentinel; rows past M (never stored) fall past num_records too;
* the weight loader's addresses equal the padded weight matrix's;
* the LDS slot <-> (row, k) map is a bijection and the mainloop's read offsets invert it;
* FastDivmod with the host's parameters (cuconv.backends.cdna3.params.fast_divmod_params) divides exactly;
* the ported epilogue matches cuconv.epilogue.apply_epilogue;
* the struct layout agrees with cuconv.backends.cdna3.params.hip_geometry.

The geometry struct passed in is the one the CDNA3 backend builds for the kernel launch.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from cuconv.backends.cdna3 import params, variants  # noqa: E402
from cuconv.epilogue import apply_epilogue  # noqa: E402
from cuconv.launch import epilogue_params  # noqa: E402
from cuconv.models.loader import loader_addresses, subpath_ok  # noqa: E402
from cuconv.problem import ConvProblem, Epilogue  # noqa: E402

from conftest import host_shared_library  # noqa: E402

LANES = 4 * 64  # threads of a workgroup
ITERS = 8       # loader iterations per half-tile

_SHIM = r"""
#include "common/index_math.h"
#include "common/epilogue_math.h"
#include <cstddef>
using namespace cuconv;

template <int Path, bool Halo, bool MaskK>
static void im2col_tile(const ConvGeometryHip& g, u32 m_offset, u32 k_offset, u32 group, u32* out) {
  // What Im2colLoader<Path, Halo, MaskK> does per lane (cdna3/loader_im2col.h), for every lane.
  for (i32 wave = 0; wave < kWaves; ++wave)
    for (i32 lane = 0; lane < kWaveSize; ++lane) {
      Im2colLaneAddresses<Path, Halo, MaskK> plan(g, m_offset, group, wave, lane);
      Im2colTap tap = {0u, 0u, 0u};
      if (Path == SUBPATH_UNIFORM) tap = plan.tile_tap(g, k_offset);
      for (i32 it = 0; it < kLoadIters; ++it) out[(it * kWaves + wave) * kWaveSize + lane] = plan.voffset(g, it, k_offset, tap);
    }
}

template <bool MaskK>
static void pointwise_tile(const ConvGeometryHip& g, u32 m_offset, u32 k_offset, u32 group, u32* out) {
  for (i32 wave = 0; wave < kWaves; ++wave)
    for (i32 lane = 0; lane < kWaveSize; ++lane) {
      const LinearLaneAddresses<MaskK> plan = pointwise_lane_addresses<MaskK>(g, m_offset, group, wave, lane);
      for (i32 it = 0; it < kLoadIters; ++it) out[(it * kWaves + wave) * kWaveSize + lane] = plan.voffset(it, k_offset);
    }
}

extern "C" {

int cuconv_constants(long long* out) {
  out[0] = kBlockM; out[1] = kBlockN; out[2] = kBlockK; out[3] = kThreads; out[4] = kLoadIters; out[5] = kSchedK;
  out[6] = sizeof(ConvGeometryHip); out[7] = offsetof(ConvGeometryHip, Kpad); out[8] = offsetof(ConvGeometryHip, x_bytes);
  out[9] = offsetof(ConvGeometryHip, div_S); out[10] = sizeof(EpilogueParams);
  return 11;
}

void cuconv_slots(int* rows, int* ks, int* read_offsets) {
  for (i32 it = 0; it < kLoadIters; ++it)
    for (i32 wave = 0; wave < kWaves; ++wave)
      for (i32 lane = 0; lane < kWaveSize; ++lane) {
        const i32 i = (it * kWaves + wave) * kWaveSize + lane;
        const TileSlot e = slot_element(it, wave, lane);
        rows[i] = e.row; ks[i] = e.k; read_offsets[i] = lds_byte_offset(e.row, e.k);
      }
}

unsigned cuconv_fast_div(unsigned d, unsigned mul, unsigned shift, unsigned n) {
  FastDivmod f = {d, mul, shift};
  return fast_div(f, n);
}

int cuconv_tile_voffsets(const ConvGeometryHip* g, int subpath, int halo, int mask_k, unsigned m_offset,
                         unsigned k_offset, unsigned group, unsigned* out) {
  const int key = subpath * 4 + halo * 2 + mask_k;
  switch (key) {
    case 0: pointwise_tile<false>(*g, m_offset, k_offset, group, out); return 0;
    case 1: pointwise_tile<true>(*g, m_offset, k_offset, group, out); return 0;
    case 4: im2col_tile<SUBPATH_UNIFORM, false, false>(*g, m_offset, k_offset, group, out); return 0;
    case 5: im2col_tile<SUBPATH_UNIFORM, false, true>(*g, m_offset, k_offset, group, out); return 0;
    case 6: im2col_tile<SUBPATH_UNIFORM, true, false>(*g, m_offset, k_offset, group, out); return 0;
    case 7: im2col_tile<SUBPATH_UNIFORM, true, true>(*g, m_offset, k_offset, group, out); return 0;
    case 8: im2col_tile<SUBPATH_PER_LANE, false, false>(*g, m_offset, k_offset, group, out); return 0;
    case 9: im2col_tile<SUBPATH_PER_LANE, false, true>(*g, m_offset, k_offset, group, out); return 0;
    case 10: im2col_tile<SUBPATH_PER_LANE, true, false>(*g, m_offset, k_offset, group, out); return 0;
    case 11: im2col_tile<SUBPATH_PER_LANE, true, true>(*g, m_offset, k_offset, group, out); return 0;
    default: return -1;  // pointwise with halo does not exist
  }
}

void cuconv_weight_voffsets(const ConvGeometryHip* g, unsigned n_tile, unsigned k_offset, unsigned group, unsigned* out) {
  for (i32 wave = 0; wave < kWaves; ++wave)
    for (i32 lane = 0; lane < kWaveSize; ++lane) {
      const LinearLaneAddresses<false> plan = weight_lane_addresses(*g, n_tile, group, wave, lane);
      for (i32 it = 0; it < kLoadIters; ++it) out[(it * kWaves + wave) * kWaveSize + lane] = plan.voffset(it, k_offset);
    }
}

float cuconv_apply_epilogue(float acc, float bias, float residual, const EpilogueParams* p) {
  return apply_epilogue(acc, bias, residual, *p);
}

}  // extern "C"
"""


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    d = tmp_path_factory.mktemp("hip_index_math")
    src = d / "shim.cpp"
    src.write_text(_SHIM)
    L = host_shared_library(d, src, ("-lm",))
    u32p = np.ctypeslib.ndpointer(np.uint32, flags="C_CONTIGUOUS")
    L.cuconv_tile_voffsets.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_uint,
                                       ctypes.c_uint, ctypes.c_uint, u32p]
    L.cuconv_tile_voffsets.restype = ctypes.c_int
    L.cuconv_weight_voffsets.argtypes = [ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, u32p]
    L.cuconv_fast_div.argtypes = [ctypes.c_uint] * 4
    L.cuconv_fast_div.restype = ctypes.c_uint
    L.cuconv_apply_epilogue.argtypes = [ctypes.c_float, ctypes.c_float, ctypes.c_float, ctypes.c_void_p]
    L.cuconv_apply_epilogue.restype = ctypes.c_float
    return L


def _slots(lib):
    rows, ks, offs = (np.zeros(ITERS * LANES, np.int32) for _ in range(3))
    p = np.ctypeslib.ndpointer(np.int32, flags="C_CONTIGUOUS")
    lib.cuconv_slots.argtypes = [p, p, p]
    lib.cuconv_slots(rows, ks, offs)
    return rows, ks, offs


# ------------------------------------------------------------------------------ layout / constants
def test_constants_and_struct_layout_match_python(lib):
    out = (ctypes.c_longlong * 16)()
    n = lib.cuconv_constants(out)
    c = list(out)[:n]
    assert c[:6] == [variants.BLOCK_M, variants.BLOCK_N, variants.BLOCK_K, variants.THREADS, ITERS, variants.SCHED_K]
    p = ConvProblem.create(nd=2, batch=1, in_spatial=(4, 4), channels=8, out_channels=8, filter_spatial=(3, 3),
                           stride=1, dilation=1, padding=1, groups=1, dtype="bfloat16", layout="NHWC")
    dt = params.hip_geometry(p).dtype
    assert c[6] == dt.itemsize
    assert c[7] == dt.fields["Kpad"][1]
    assert c[8] == dt.fields["x_bytes"][1]
    assert c[9] == dt.fields["div_S_divisor"][1]
    assert c[10] == epilogue_params(Epilogue()).dtype.itemsize


def test_lds_slots_are_a_bijection_and_reads_invert_them(lib):
    rows, ks, offs = _slots(lib)
    # every (row, even k) of the 128 x 32 half-tile exactly once
    pairs = rows.astype(np.int64) * 32 + ks
    assert sorted(pairs.tolist()) == list(range(0, 128 * 32, 2))
    # slot i is the dword M0 + 4 * lane writes: byte 4 * i of the half-tile; the mainloop's reads
    # (lds_byte_offset) must find element (row, k) exactly there
    np.testing.assert_array_equal(offs, 4 * np.arange(ITERS * LANES))
    # a lane's k is the same on every iteration (the loaders compute it once)
    np.testing.assert_array_equal(ks.reshape(ITERS, LANES), np.broadcast_to(ks[:LANES], (ITERS, LANES)))


# ------------------------------------------------------------------------------ fast divmod
@settings(max_examples=300, deadline=None)
@given(d=st.one_of(st.integers(1, 64), st.integers(1, (1 << 31) - 1)), n=st.integers(0, (1 << 32) - 1))
def test_fast_divmod_is_exact(lib, d, n):
    dd, mul, shift = params.fast_divmod_params(d)
    assert lib.cuconv_fast_div(dd, mul, shift, n) == n // d


def test_fast_divmod_edges(lib):
    for d in [1, 2, 3, 5, 7, 31, 32, 33, 63, 64, 65, 127, 255, 1000, 65535, 65536, 65537, (1 << 31) - 1]:
        dd, mul, shift = params.fast_divmod_params(d)
        for n in [0, 1, d - 1, d, d + 1, 2 * d - 1, (1 << 31) - 1, (1 << 31), (1 << 32) - 1, (1 << 32) - d]:
            n %= 1 << 32
            assert lib.cuconv_fast_div(dd, mul, shift, n) == n // d, (d, n)


# ------------------------------------------------------------------------------ im2col loaders
@st.composite
def conv_cases(draw):
    """A 2-D bf16 problem the kernel accepts (even Cg), a sub-path that may serve it, a tile."""
    groups = draw(st.integers(1, 3))
    cg = draw(st.sampled_from([2, 4, 6, 16, 30, 32, 48, 64, 96]))
    kg = draw(st.integers(1, 40))
    pointwise = draw(st.booleans())
    if pointwise:
        r = s = 1
        stride = dil = (1, 1)
        pad = ((0, 0), (0, 0))
    else:
        r, s = draw(st.integers(1, 4)), draw(st.integers(1, 4))
        stride = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
        dil = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
        pad = ((draw(st.integers(0, 2)), draw(st.integers(0, 2))), (draw(st.integers(0, 2)), draw(st.integers(0, 2))))
    h = draw(st.integers((r - 1) * dil[0] + 1, 14))
    w = draw(st.integers((s - 1) * dil[1] + 1, 14))
    p = ConvProblem.create(nd=2, batch=draw(st.integers(1, 3)), in_spatial=(h, w), channels=cg * groups,
                           out_channels=kg * groups, filter_spatial=(r, s), stride=stride, dilation=dil, padding=pad,
                           groups=groups, dtype="bfloat16", layout="NHWC")
    # the kernel's own choice, or per_lane (valid for every problem) to cover it on the others too
    subpath = draw(st.sampled_from([variants.choose_variant(p).subpath, "per_lane"]))
    kpad = variants.padded_k(p)
    m_offset = variants.BLOCK_M * draw(st.integers(0, (p.gemm_m - 1) // variants.BLOCK_M))
    k_offset = variants.BLOCK_K * draw(st.integers(0, kpad // variants.BLOCK_K - 1))
    group = draw(st.integers(0, groups - 1))
    return p, subpath, m_offset, k_offset, group


def _check_tile(lib, slots, p, subpath, m_offset, k_offset, group):
    v = variants.choose_variant(p)
    geom = np.array(params.hip_geometry(p))
    out = np.zeros(ITERS * LANES, np.uint32)
    rc = lib.cuconv_tile_voffsets(geom.ctypes.data, variants.SUBPATH_CODES[subpath], int(v.halo), int(v.mask_k),
                                  m_offset, k_offset, group, out)
    assert rc == 0
    rows, ks, _ = slots
    # the model, over the padded K extent (columns >= Kgemm are -1 there)
    model = loader_addresses(p, m_offset, k_offset, variants.BLOCK_M, variants.BLOCK_K, subpath, group)
    x_bytes = int(geom["x_bytes"])
    addr = model[rows, ks]                    # element of the dword's first half
    addr_hi = model[rows, ks + 1]             # ... and of its second half
    real_row = m_offset + rows < p.gemm_m
    ctx = f"{p.describe()} subpath={subpath} m_offset={m_offset} k_offset={k_offset} group={group}"
    # valid elements: the exact byte address, and the dword's two halves are adjacent channels
    ok = real_row & (addr >= 0)
    np.testing.assert_array_equal(out[ok].astype(np.int64), 2 * addr[ok], err_msg=ctx)
    np.testing.assert_array_equal(addr_hi[ok], addr[ok] + 1, err_msg=ctx)
    # zeros of real rows (halo, K tail): exactly the num_records sentinel
    zero = real_row & (addr < 0)
    assert (addr_hi[zero] < 0).all(), ctx
    np.testing.assert_array_equal(out[zero], np.full(zero.sum(), x_bytes, np.uint32), err_msg=ctx)
    # rows past M are never stored; with tensors away from the 4 GiB cap they also read 0
    assert (out[~real_row].astype(np.int64) >= x_bytes).all(), ctx
    return int(zero.sum())


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=conv_cases())
def test_im2col_loader_matches_model(lib, case):
    p, subpath, m_offset, k_offset, group = case
    assert subpath_ok(p, subpath, variants.BLOCK_K)
    _check_tile(lib, _slots(lib), p, subpath, m_offset, k_offset, group)


@pytest.mark.parametrize("case", [
    # stem-like: C = 16, 7x7 stride 2 pad 3 (per-lane, halo, K tail: 7*7*16 = 784 -> 832)
    dict(n=1, hw=(20, 20), c=16, k=24, rs=(7, 7), stride=2, pad=3, groups=1, subpath="per_lane"),
    # 3x3 pad 1, C = 64: uniform with halo, no K tail (576 = 9 * 64)
    dict(n=2, hw=(9, 11), c=64, k=40, rs=(3, 3), stride=1, pad=1, groups=1, subpath="uniform"),
    # uniform with a whole K tile past Kgemm: 3 * 32 = 96 -> 128
    dict(n=1, hw=(5, 5), c=32, k=8, rs=(1, 3), stride=1, pad=((0, 0), (1, 1)), groups=1, subpath="uniform"),
    # asymmetric padding only on the high side still needs the halo path
    dict(n=1, hw=(5, 5), c=32, k=8, rs=(2, 2), stride=2, pad=((0, 1), (0, 1)), groups=1, subpath="uniform"),
    # pointwise, grouped, K tail (Cg = 48 -> 64)
    dict(n=2, hw=(7, 9), c=96, k=32, rs=(1, 1), stride=1, pad=0, groups=2, subpath="pointwise"),
    # pointwise, Cg = 64: the unmasked stream (same as the matmul loader)
    dict(n=1, hw=(16, 16), c=64, k=64, rs=(1, 1), stride=1, pad=0, groups=1, subpath="pointwise"),
])
def test_named_geometries_every_tile(lib, case):
    p = ConvProblem.create(nd=2, batch=case["n"], in_spatial=case["hw"], channels=case["c"], out_channels=case["k"],
                           filter_spatial=case["rs"], stride=case["stride"], dilation=1, padding=case["pad"],
                           groups=case["groups"], dtype="bfloat16", layout="NHWC")
    assert variants.choose_variant(p).subpath == case["subpath"]
    slots = _slots(lib)
    zeros = 0
    for group in range(p.groups):
        for m_offset in range(0, p.gemm_m, variants.BLOCK_M):
            for k_offset in range(0, variants.padded_k(p), variants.BLOCK_K):
                zeros += _check_tile(lib, slots, p, case["subpath"], m_offset, k_offset, group)
    v = variants.choose_variant(p)
    if v.halo or v.mask_k:
        assert zeros > 0, "the halo / K-tail sentinel path was not exercised"


def test_halo_flag_changes_only_padded_lanes(lib):
    """With padding but Halo off, in-bounds lanes keep their address: the flag only adds the sentinel."""
    p = ConvProblem.create(nd=2, batch=1, in_spatial=(8, 8), channels=32, out_channels=8, filter_spatial=(3, 3),
                           stride=1, dilation=1, padding=1, groups=1, dtype="bfloat16", layout="NHWC")
    geom = np.array(params.hip_geometry(p))
    with_halo, without = np.zeros(ITERS * LANES, np.uint32), np.zeros(ITERS * LANES, np.uint32)
    lib.cuconv_tile_voffsets(geom.ctypes.data, 1, 1, 0, 0, 0, 0, with_halo)
    lib.cuconv_tile_voffsets(geom.ctypes.data, 1, 0, 0, 0, 0, 0, without)
    differ = with_halo != without
    assert differ.any() and (with_halo[differ] == int(geom["x_bytes"])).all()


# ------------------------------------------------------------------------------ weight loader
@settings(max_examples=60, deadline=None)
@given(case=conv_cases())
def test_weight_loader_matches_padded_weights(lib, case):
    p, _, _, _, group = case
    geom = np.array(params.hip_geometry(p))
    kpad = variants.padded_k(p)
    rows, ks, _ = _slots(lib)
    out = np.zeros(ITERS * LANES, np.uint32)
    for n_tile in range(0, p.gemm_n, variants.BLOCK_N):
        for k_offset in range(0, kpad, variants.BLOCK_K):
            lib.cuconv_weight_voffsets(geom.ctypes.data, n_tile, k_offset, group, out)
            n = n_tile + rows
            real = n < p.gemm_n
            expect = ((group * p.gemm_n + n) * kpad + k_offset + ks) * 2
            np.testing.assert_array_equal(out[real].astype(np.int64), expect[real])
            assert int(geom["w_bytes"]) == p.out_channels * kpad * 2


# ------------------------------------------------------------------------------ epilogue math
@pytest.mark.parametrize("activation", [None, "relu", "silu", "gelu"])
def test_epilogue_math_matches_numpy(lib, activation):
    rng = np.random.default_rng(0)
    acc = rng.standard_normal(400).astype(np.float32) * 4
    bias = rng.standard_normal(400).astype(np.float32)
    res = rng.standard_normal(400).astype(np.float32)
    for has_bias, has_res, alpha, beta in [(False, False, 1.0, 1.0), (True, True, 0.5, -2.0), (True, False, 3.0, 0.0)]:
        e = Epilogue(alpha=alpha, beta=beta, has_bias=has_bias, has_residual=has_res, activation=activation)
        params = np.array(epilogue_params(e))
        got = np.array([lib.cuconv_apply_epilogue(a, b, r, params.ctypes.data) for a, b, r in zip(acc, bias, res)])
        ref = apply_epilogue(np, acc.astype(np.float64), e, bias, res, dtype=np.float64)
        err = np.linalg.norm(got - ref) / np.linalg.norm(ref)
        assert np.isfinite(got).all() and err < 1e-6, (activation, has_bias, has_res, err)
