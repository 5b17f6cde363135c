"""The CUDA sources of the row kernels (kernels_cu/layout/fold_width.cu, phase_stack.cu, gather_index.cu,
phase_scatter.cu),
built for the CPU and run thread by thread, against their NumPy forms, bit for bit.

These kernels are grid-stride loops with no shared memory and no synchronisation, so running every
(block, thread) of the launch one after another is their semantics. A small harness stands in for
the GPU: ``blockIdx`` / ``threadIdx`` / ``blockDim`` / ``gridDim`` as globals, ``__ldg`` as a load,
``uint4`` as four words, and a host ``common/types.cuh`` with the fixed-width integer types (the real
one holds PTX conversions these kernels do not use). Everything else is the kernel's own code, driven
by the argument structs and launch shapes the host code builds (:class:`cuconv.backends.sm90.fold.FoldWidth`,
:mod:`cuconv.subpixel`, :func:`cuconv.layout.scatter_args`), so a struct that disagrees with the source fails here too.

What this does not check: the GPU code generation (tests/test_compile.py builds every source with
NVRTC) and the 16-byte alignment the vector paths assume (the host asks for it before choosing them).
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cuconv import layout, subpixel
from cuconv.backends.sm90.fold import FoldWidth
from cuconv.models.fold import fold_rows, padded_channels
from cuconv.validate import conv_problem

from conftest import kernel_source_library

_HARNESS = r"""
#include <cstdint>
struct Dim3 { unsigned x, y, z; };
static Dim3 blockIdx, threadIdx, blockDim, gridDim;
#define __global__
#define __device__
#define __forceinline__ inline
#define __restrict__ __restrict
#define __launch_bounds__(...)
struct uint4 { unsigned x, y, z, w; };
inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return uint4{a, b, c, d}; }
template <typename T> inline T __ldg(const T* p) { return *p; }
inline unsigned __umulhi(unsigned a, unsigned b) { return (unsigned)(((unsigned long long)a * b) >> 32); }

#define RUN(kernel_call)                                                   \
  gridDim = Dim3{grid, 1, 1};                                              \
  blockDim = Dim3{block, 1, 1};                                            \
  for (unsigned b = 0; b < grid; ++b)                                      \
    for (unsigned t = 0; t < block; ++t) {                                 \
      blockIdx = Dim3{b, 0, 0};                                            \
      threadIdx = Dim3{t, 0, 0};                                           \
      kernel_call;                                                         \
    }

#include "layout/fold_width.cu"
#include "layout/phase_stack.cu"
#include "layout/gather_index.cu"
#include "layout/phase_scatter.cu"

extern "C" void run_fold(const uint16_t* src, uint16_t* dst, const FoldArgs* a, unsigned grid, unsigned block) {
  RUN(fold_width(src, dst, *a))
}
extern "C" void run_stack(int unstack, int word, const void* from, void* to, const cuconv::layout::StackArgs* a,
                          unsigned grid, unsigned block) {
  if (unstack) {
    if (word == 16) { RUN(phase_unstack_w16((const uint4*)from, (uint4*)to, *a)) }
    else if (word == 4) { RUN(phase_unstack_w4((const uint32_t*)from, (uint32_t*)to, *a)) }
    else { RUN(phase_unstack_w2((const uint16_t*)from, (uint16_t*)to, *a)) }
  } else {
    if (word == 16) { RUN(phase_stack_w16((const uint4*)from, (uint4*)to, *a)) }
    else if (word == 4) { RUN(phase_stack_w4((const uint32_t*)from, (uint32_t*)to, *a)) }
    else { RUN(phase_stack_w2((const uint16_t*)from, (uint16_t*)to, *a)) }
  }
}
extern "C" void run_gather(int itemsize, const void* src, const int32_t* index, void* dst, long long count,
                           unsigned grid, unsigned block) {
  if (itemsize == 2) { RUN(gather_index_b2((const uint16_t*)src, index, (uint16_t*)dst, count)) }
  else if (itemsize == 4) { RUN(gather_index_b4((const uint32_t*)src, index, (uint32_t*)dst, count)) }
  else { RUN(gather_index_b8((const unsigned long long*)src, index, (unsigned long long*)dst, count)) }
}
extern "C" void run_gather_pair(const uint16_t* src0, const int32_t* index0, uint16_t* dst0, long long count0,
                                const uint16_t* src1, const int32_t* index1, uint16_t* dst1, long long count1,
                                unsigned grid, unsigned block) {
  RUN(gather_index_pair_b2(src0, index0, dst0, count0, src1, index1, dst1, count1))
}
extern "C" void run_scatter(int fill, int word, const void* z, void* y, const cuconv::layout::ScatterArgs* a,
                            unsigned grid, unsigned block) {
  if (fill) {
    if (word == 16) { RUN(phase_scatter_fill_w16((const uint4*)z, (uint4*)y, *a)) }
    else if (word == 4) { RUN(phase_scatter_fill_w4((const uint32_t*)z, (uint32_t*)y, *a)) }
    else { RUN(phase_scatter_fill_w2((const uint16_t*)z, (uint16_t*)y, *a)) }
  } else {
    if (word == 16) { RUN(phase_scatter_w16((const uint4*)z, (uint4*)y, *a)) }
    else if (word == 4) { RUN(phase_scatter_w4((const uint32_t*)z, (uint32_t*)y, *a)) }
    else { RUN(phase_scatter_w2((const uint16_t*)z, (uint16_t*)y, *a)) }
  }
}
"""


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    L = kernel_source_library(tmp_path_factory.mktemp("layout_kernels"), _HARNESS)
    P, U = ctypes.c_void_p, ctypes.c_uint
    L.run_fold.argtypes = [P, P, P, U, U]
    L.run_stack.argtypes = [ctypes.c_int, ctypes.c_int, P, P, P, U, U]
    L.run_gather.argtypes = [ctypes.c_int, P, P, P, ctypes.c_longlong, U, U]
    L.run_gather_pair.argtypes = [P, P, P, ctypes.c_longlong, P, P, P, ctypes.c_longlong, U, U]
    L.run_scatter.argtypes = [ctypes.c_int, ctypes.c_int, P, P, P, U, U]
    return L


def _ptr(a):
    return a.ctypes.data_as(ctypes.c_void_p)


def _struct(value):
    """A c_struct value's bytes, as an array whose address the harness takes."""
    return np.frombuffer(value.tobytes(), dtype=np.uint8).copy()


@settings(max_examples=60, deadline=None)
@given(c=st.integers(1, 16), taps=st.integers(1, 7), stride=st.integers(0, 4), dil=st.integers(1, 3),
       pad=st.integers(0, 4), src_w=st.integers(1, 20), dst_w=st.integers(1, 12), rows=st.integers(1, 4),
       seed=st.integers(0, 2**31 - 1))
def test_fold_width_kernel_is_the_model(lib, c, taps, stride, dil, pad, src_w, dst_w, rows, seed):
    x = np.random.default_rng(seed).integers(0, 2**16, size=(rows, src_w, c), dtype=np.uint16)
    fold = FoldWidth(0, rows * dst_w, c, taps, stride, dil, pad, src_w, dst_w)
    for vec in ((False, True) if c % 8 == 0 else (False,)):
        args = _struct(fold.args(vec))
        dst = np.full((rows, dst_w, taps * padded_channels(c)), 0xABCD, dtype=np.uint16)
        lib.run_fold(_ptr(x), _ptr(dst), _ptr(args), fold.grid[0], 256)
        np.testing.assert_array_equal(dst, fold_rows(x, taps, stride, dil, pad, dst_w))


@st.composite
def stack_cases(draw):
    nd = draw(st.sampled_from([1, 2, 3]))
    F = tuple(draw(st.integers(1, 5)) for _ in range(nd))
    s = tuple(draw(st.sampled_from([1, 2, 2, 3, 4])) for _ in range(nd))
    lo = tuple(draw(st.integers(0, 3)) for _ in range(nd))
    I = tuple(draw(st.integers(max(1, f - 2 * l), max(1, f - 2 * l) + 9)) for f, l in zip(F, lo))
    C = draw(st.sampled_from([1, 2, 3, 8, 12]))
    dtype = draw(st.sampled_from(["float16", "float32"]))
    return dict(I=I, F=F, s=s, lo=lo, C=C, dtype=dtype, seed=draw(st.integers(0, 2**31 - 1)))


def _geometry(case):
    nd = len(case["I"])
    layout = {1: "NHWC", 2: "NHWC", 3: "NDHWC"}[nd]
    I, F, s, lo = case["I"], case["F"], case["s"], case["lo"]
    if nd == 1:
        I, F, s, lo = (1, *I), (1, *F), (1, *s), (0, *lo)
    try:
        p = conv_problem(len(I), (2, *I, case["C"]), (3, *F, case["C"]), "float32", layout, s,
                         tuple((a, a) for a in lo), 1, 1, 1.0, 1.0, False, False, None)
    except ValueError:
        return None
    return subpixel.geometry(p)


@settings(max_examples=80, deadline=None)
@given(case=stack_cases())
def test_phase_stack_kernels_are_their_numpy_forms(lib, case):
    sp = _geometry(case)
    if sp is None:
        return
    rng = np.random.default_rng(case["seed"])
    y = rng.standard_normal((2, *sp.extent, case["C"])).astype(case["dtype"])
    z_want = np.empty((2, *sp.length, sp.phases * case["C"]), case["dtype"])
    subpixel.stack(sp, y, z_want, np)
    row = case["C"] * y.itemsize
    for word in (w for w in (16, 4, 2) if row % w == 0):
        args, blocks = subpixel.stack_args(sp, word, row, 2)
        args = _struct(args)
        z = np.full(z_want.shape, 7, case["dtype"])
        lib.run_stack(0, word, _ptr(y), _ptr(z), _ptr(args), blocks, 256)
        np.testing.assert_array_equal(z, z_want)
        back = np.full(y.shape, 9, case["dtype"])
        lib.run_stack(1, word, _ptr(z), _ptr(back), _ptr(args), blocks, 256)
        np.testing.assert_array_equal(back, y)


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_gather_index_kernel_is_the_numpy_gather(lib, dtype):
    p = conv_problem(2, (1, 9, 9, 5), (7, 3, 4, 5), "float32", "NHWC", 2, ((1, 1), (1, 2)), 1, 1, 1.0, 1.0, False,
                     False, None)
    sp = subpixel.geometry(p)
    w = np.random.default_rng(0).standard_normal((7, 3, 4, 5)).astype(dtype)
    want = subpixel.stacked_filter(sp, w, np)
    index = subpixel._index(sp, 7, 5, (3, 4))
    got = np.full(want.shape, 3, dtype)
    lib.run_gather(w.itemsize, _ptr(w), _ptr(index), _ptr(got), got.size, 7, 256)
    np.testing.assert_array_equal(got, want)
    assert (index < 0).any() and (got[index < 0] == 0).all()


@pytest.mark.parametrize("C,K,S,sw,dw,pl,W", [(32, 32, 3, 1, 1, 1, 160), (32, 64, 3, 2, 1, 1, 320),
                                              (16, 24, 5, 1, 2, 4, 64), (8, 8, 3, 3, 1, 0, 48)])
def test_pair_gather_writes_the_packed_filter_and_bias(lib, C, K, S, sw, dw, pl, W):
    """``gather_index_pair_b2`` run as ``sm90_wpack`` runs it (its tables, the launch shape of
    :func:`cuconv.subpixel.gather_pair_launch`) writes :func:`cuconv.models.wpack.pack_filter` and the
    repeated bias, every element (the zeros included)."""
    from cuconv.models.wpack import pack_bias, pack_filter, pack_filter_index, wpack_geometry
    Q = (W + 2 * pl - (S - 1) * dw - 1) // sw + 1
    pack = wpack_geometry(W, Q, S, sw, dw, pl, C)
    rng = np.random.default_rng(C + K)
    w = rng.standard_normal((K, 2, S, C)).astype(np.float16)
    b = rng.standard_normal(K).astype(np.float16)
    index = pack_filter_index(pack, K, 2, S, C, sw, dw, pl).reshape(-1)
    b_index = np.tile(np.arange(K, dtype=np.int32), pack.go)
    wp = np.full(index.size, 5, np.float16)
    bp = np.full(b_index.size, 5, np.float16)
    blocks = max(1, min(-(-(wp.size + bp.size) // 256), 65535))
    lib.run_gather_pair(_ptr(w), _ptr(index), _ptr(wp), wp.size, _ptr(b), _ptr(b_index), _ptr(bp), bp.size, blocks, 256)
    np.testing.assert_array_equal(wp.reshape(pack.go * K, 2, pack.taps, pack.g * C), pack_filter(w, pack, sw, dw, pl))
    np.testing.assert_array_equal(bp, pack_bias(b, pack))


@settings(max_examples=60, deadline=None)
@given(nd=st.integers(1, 3), data=st.data(), C=st.sampled_from([1, 2, 3, 8, 12]),
       dtype=st.sampled_from(["float16", "float32"]), seed=st.integers(0, 2**31 - 1))
def test_phase_scatter_kernels_are_strided_copies(lib, nd, data, C, dtype, seed):
    """phase_scatter writes one phase of y and leaves the rest; phase_scatter_fill writes the phase and
    zeros everywhere else (what the input gradient of a strided 1x1 filter needs)."""
    s = tuple(data.draw(st.integers(1, 4)) for _ in range(nd))
    p = tuple(data.draw(st.integers(0, si - 1)) for si in s)
    I = tuple(data.draw(st.integers(pi + 1, pi + 11)) for pi in p)
    T = tuple(-(-(i - pi) // si) for i, pi, si in zip(I, p, s))
    rng = np.random.default_rng(seed)
    z = rng.standard_normal((2, *T, C)).astype(dtype)
    where = (slice(None), *(slice(pi, None, si) for pi, si in zip(p, s)), slice(None))
    row = C * z.itemsize
    for word in (w for w in (16, 4, 2) if row % w == 0):
        for fill in (False, True):
            args, blocks = layout.scatter_args(word, row, 2, T, I, s, p, fill)
            y = np.full((2, *I, C), 5, dtype)
            lib.run_scatter(int(fill), word, _ptr(z), _ptr(y), _ptr(_struct(args)), blocks, 256)
            want = np.zeros_like(y) if fill else np.full_like(y, 5)
            want[where] = z
            np.testing.assert_array_equal(y, want)
