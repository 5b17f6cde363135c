"""The HIP depthwise kernel's index math, compiled for the CPU, against the NumPy model of the kernel.

kernels_hip/common/depthwise_index.h is host-callable (CUCONV_HD is plain ``inline`` outside a HIP
compile). This test builds it with a small C shim (tests/cdna3_depthwise_index_shim.cpp) into a shared
library (the system C++ compiler) and calls it through ctypes, on depthwise problems drawn by hypothesis, with the tile shapes the host picks
(:func:`cuconv.backends.depthwise.variants.dw_config`) and the struct it launches with
(:func:`cuconv.backends.depthwise.params.dw_geometry`):

* the struct: the C ``DwGeometry`` reads back every member of ``dw_geometry``'s bytes in order;
* blocks: ``dw_block`` equals :func:`cuconv.models.depthwise.cta_coordinates` for every block;
* the tile: for every block and filter depth, each copy unit's source offset (or the zero sentinel),
  gathered from the input plane in LDS order, equals :func:`~cuconv.models.depthwise.input_tile`; the
  walk a work-item makes over its units (``DwUnitWalker``, no division per unit) visits exactly
  ``dw_unit`` of each of its units;
* windows: work-item ids map one to one onto (cv, row, qg), and the tile element each (r, s, q, v)
  reads is the one :func:`~cuconv.models.depthwise.thread_outputs` multiplies (found by running the
  model on a tile of distinct values with one filter tap set);
* weights and outputs: the LDS weight slots hold the model's ``[tap][cb]`` taps, and each work-item's
  output offsets are where :func:`~cuconv.models.depthwise.direct_conv` stores;
* composed: those functions, composed as the kernel composes them, compute the convolution that
  :func:`cuconv.reference.convnd` computes.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import cuconv
from cuconv.backends.depthwise.params import DW_FIELDS, dw_geometry
from cuconv.backends.depthwise.variants import dw_config
from cuconv.models.depthwise import cta_coordinates, input_tile, thread_outputs
from cuconv.problem import ConvProblem

from conftest import host_shared_library
from geometry import depthwise_cases


#: The C shim (compiled with the header for the host): tests/cdna3_depthwise_index_shim.cpp.
SHIM = Path(__file__).resolve().parent / "cdna3_depthwise_index_shim.cpp"


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    L = host_shared_library(tmp_path_factory.mktemp("hip_depthwise_index"), SHIM, ("-Wall", "-Werror"))
    P, I, U = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint
    signatures = {  # every pointer typed: an untyped Python int argument is passed as a 32-bit int
        "dw_struct_size": ([], ctypes.c_longlong),
        "dw_struct_members": ([P, P], I),
        "dw_blocks": ([P, U, P], None),
        "dw_depth": ([P, I, I], I),
        "dw_tile_voffsets": ([P, U, I, I, I, I, I, U, P], I),
        "dw_walk": ([P, I, I, I, P], I),
        "dw_walk_tile": ([I, I, I, I, I, P], I),
        "dw_thread_map": ([P, P], None),
        "dw_window_reads": ([P, I, I, I, I, I, I, P], None),
        "dw_weight_slots": ([I, I, P], None),
        "dw_tap": ([I] * 6, I),
        "dw_weight_lds_bytes": ([P, I, I], I),
        "dw_outputs": ([P, U, I, I, I, P], None),
    }
    for name, (args, res) in signatures.items():
        fn = getattr(L, name)
        fn.argtypes, fn.restype = args, res
    return L


# --------------------------------------------------------------------------------------------- helpers
def _problem(case) -> ConvProblem:
    return ConvProblem.create(nd=case.nd, batch=case.batch, in_spatial=case.spatial, channels=case.channels,
                              out_channels=case.out_channels, filter_spatial=case.filt, stride=case.stride,
                              dilation=case.dilation, padding=case.padding, groups=case.groups, dtype=case.dtype,
                              layout="NHWC" if case.nd == 2 else "NDHWC")


class Shape:
    """The compile-time values of the variant serving a problem, and its run-time struct."""

    def __init__(self, p: ConvProblem):
        self.p = p
        self.cfg = cfg = dw_config(p, buffers=1)  # the HIP kernel's single LDS tile
        assert not isinstance(cfg, str), cfg
        self.geo = np.array(dw_geometry(p, cfg))
        self.ptr = self.geo.ctypes.data
        lead = 3 - p.nd
        self.D, self.H, self.W = (1,) * lead + tuple(p.in_spatial)
        self.O, self.P, self.Q = (1,) * lead + tuple(p.out_spatial)
        self.T, self.R, self.S = (1,) * lead + tuple(p.filter_spatial)
        self.sw, self.dwl = p.stride[-1], p.dilation[-1]
        self.sd = ((1,) * lead + tuple(p.stride))[0]      # depth stride, dilation, padding before
        self.dd = ((1,) * lead + tuple(p.dilation))[0]
        self.pd = ((0,) * lead + tuple(p.pad_lo))[0]
        self.esize = p.itemsize
        self.blocks = p.batch * self.O * cfg.tiles_p * cfg.tiles_q * cfg.chunks

    def i32(self, n):
        return np.zeros(n, np.int32)


def _blocks(lib, sh: Shape) -> np.ndarray:
    out = sh.i32(5 * sh.blocks)
    lib.dw_blocks(sh.ptr, sh.blocks, out.ctypes.data)
    return out.reshape(sh.blocks, 5)


def _tile_from_voffsets(lib, sh: Shape, x5: np.ndarray, block: int, n: int, d: int) -> np.ndarray:
    """The tile the kernel's copy units build: each unit's VIN elements from the plane, or zeros."""
    cfg = sh.cfg
    sentinel = sh.H * sh.W * sh.p.channels * sh.esize
    offs = np.zeros(cfg.in_rows * cfg.in_cols * cfg.cin // cfg.vin, np.uint32)
    units = lib.dw_tile_voffsets(sh.ptr, block, cfg.vec, cfg.vin, cfg.qt, sh.sw, sh.esize, sentinel, offs.ctypes.data)
    assert units == len(offs)
    valid = offs != sentinel
    assert (offs[valid] < sentinel).all() and (offs[valid] % (cfg.vin * sh.esize) == 0).all()
    plane = x5[n, d].reshape(-1)
    idx = (offs[valid].astype(np.int64) // sh.esize)[:, None] + np.arange(cfg.vin)
    tile = np.zeros((units, cfg.vin), x5.dtype)
    tile[valid] = plane[idx]
    return tile.reshape(cfg.in_rows, cfg.in_cols, cfg.cin)


def _window_reads(lib, sh: Shape) -> np.ndarray:
    cfg = sh.cfg
    out = sh.i32(cfg.threads * sh.R * sh.S * cfg.qt * cfg.vec)
    lib.dw_window_reads(sh.ptr, sh.R, sh.S, cfg.vec, cfg.qt, sh.sw, sh.dwl, out.ctypes.data)
    return out.reshape(cfg.threads, sh.R, sh.S, cfg.qt, cfg.vec)


def _thread_map(lib, sh: Shape) -> np.ndarray:
    out = sh.i32(3 * sh.cfg.threads)
    lib.dw_thread_map(sh.ptr, out.ctypes.data)
    return out.reshape(-1, 3)


def _outputs(lib, sh: Shape, block: int) -> np.ndarray:
    out = np.zeros(sh.cfg.threads * sh.cfg.qt, np.int64)
    lib.dw_outputs(sh.ptr, block, sh.cfg.vec, sh.cfg.qt, sh.sw, out.ctypes.data)
    return out.reshape(sh.cfg.threads, sh.cfg.qt)


def _weight_lds(lib, sh: Shape, w5: np.ndarray, chunk: int) -> np.ndarray:
    """The fp32 weights the staging loop leaves in LDS for one chunk (zero past K)."""
    cfg = sh.cfg
    taps = sh.T * sh.R * sh.S
    slots = sh.i32(3 * taps * cfg.cb)
    lib.dw_weight_slots(taps, cfg.cb, slots.ctypes.data)
    kl, tap, slot = slots.reshape(-1, 3).T
    wk = w5.reshape(w5.shape[0], taps)
    k = chunk * cfg.cb + kl
    lds = np.full(taps * cfg.cb, np.nan)
    lds[slot] = np.where(k < sh.p.out_channels, wk[np.minimum(k, w5.shape[0] - 1), tap], 0.0)
    return lds


# Small problems, and wide thin ones (several tile rows and columns: tiles are up to 16 columns wide).
CASES = st.one_of(depthwise_cases(nd=2, max_spatial=14, max_channels=24, max_filter=5, epilogue=False),
                  depthwise_cases(nd=2, max_spatial=48, max_channels=4, max_filter=3, epilogue=False),
                  depthwise_cases(nd=3, max_spatial=8, max_channels=12, max_filter=3, epilogue=False))


# ----------------------------------------------------------------------------------------------- tests
def test_struct_members_in_order(lib):
    p = ConvProblem.create(nd=3, batch=2, in_spatial=(5, 9, 13), channels=40, out_channels=80,
                           filter_spatial=(3, 3, 5), stride=(1, 2, 1), dilation=(2, 1, 1), padding=1, groups=40,
                           dtype="float16", layout="NDHWC")
    sh = Shape(p)
    assert lib.dw_struct_size() == sh.geo.dtype.itemsize == 4 * len(DW_FIELDS)
    out = sh.i32(64)
    n = lib.dw_struct_members(sh.ptr, out.ctypes.data)
    assert n == len(DW_FIELDS)
    np.testing.assert_array_equal(out[:n].astype(np.uint32), [int(sh.geo[name]) for name, _ in DW_FIELDS])


@settings(max_examples=60, deadline=None)
@given(case=CASES)
def test_blocks_and_tiles_match_the_model(lib, case):
    p = _problem(case)
    sh = Shape(p)
    cfg = sh.cfg
    got = _blocks(lib, sh)
    want = np.array([cta_coordinates(b, p, cfg) for b in range(sh.blocks)])
    np.testing.assert_array_equal(got, want)
    # distinct nonzero values: a gathered element names its source, and a zero can only be padding
    x5 = (np.arange(p.batch * sh.D * sh.H * sh.W * p.channels, dtype=np.int64) + 1).reshape(
        p.batch, sh.D, sh.H, sh.W, p.channels)
    for block in range(sh.blocks):
        n, o, tile_p, tile_q, chunk = want[block]
        for t in range(sh.T):
            d = lib.dw_depth(sh.ptr, int(o), t)
            assert d == o * sh.sd + t * sh.dd - sh.pd
            if not 0 <= d < sh.D:
                continue  # the kernel skips a padding slice (the model's tile is all zeros there)
            tile = _tile_from_voffsets(lib, sh, x5, block, n, d)
            np.testing.assert_array_equal(tile, input_tile(x5, p, cfg, n, d, tile_p, tile_q, chunk),
                                          err_msg=f"{p.describe()} block {block} t {t}")
    weight_bytes = lib.dw_weight_lds_bytes(sh.ptr, sh.R * sh.S, cfg.vec)
    assert weight_bytes + cfg.in_rows * cfg.in_cols * cfg.cin * sh.esize == cfg.smem


def _walk(lib, sh: Shape, tid: int, step: int) -> np.ndarray:
    """(u, walker's row, col, cu, dw_unit's row, col, cu) of every unit tid, tid + step, ... of the tile."""
    cfg = sh.cfg
    units = cfg.in_rows * cfg.in_cols * cfg.cin // cfg.vin
    out = sh.i32(7 * (units + 1))
    n = lib.dw_walk(sh.ptr, cfg.vin, tid, step, out.ctypes.data)
    rows = out[:7 * n].reshape(n, 7)
    np.testing.assert_array_equal(rows[:, 1:4], rows[:, 4:7], err_msg=f"work-item {tid}, step {step}")
    pix, cu = np.divmod(rows[:, 0], cfg.cin // cfg.vin)
    np.testing.assert_array_equal(rows[:, 4:7], np.stack([pix // cfg.in_cols, pix % cfg.in_cols, cu], 1))
    return rows


@settings(max_examples=60, deadline=None)
@given(case=CASES, data=st.data())
def test_unit_walk_visits_each_units_coordinates(lib, case, data):
    sh = Shape(_problem(case))
    cfg = sh.cfg
    units = cfg.in_rows * cfg.in_cols * cfg.cin // cfg.vin
    seen = []
    for tid in range(cfg.threads):
        seen.extend(_walk(lib, sh, tid, cfg.threads)[:, 0].tolist())
    assert sorted(seen) == list(range(units))  # the work-items share the tile's units exactly once
    # the walker's carries for any step, not only the block sizes dw_config picks
    step = data.draw(st.integers(1, 300))
    _walk(lib, sh, data.draw(st.integers(0, step - 1)), step)


def test_unit_walk_carries_on_every_small_tile(lib):
    """Every tile of 1-3 rows x 1-7 columns x 1-9 units per pixel, every step up to 40, every start."""
    out = np.zeros(7 * 3 * 7 * 9, np.int32)
    for rows, cols, upp in np.ndindex(3, 7, 9):
        rows, cols, upp = rows + 1, cols + 1, upp + 1
        for step in range(1, 41):
            for tid in range(min(step, rows * cols * upp)):
                n = lib.dw_walk_tile(rows, cols, upp, tid, step, out.ctypes.data)
                got = out[:7 * n].reshape(n, 7)
                np.testing.assert_array_equal(got[:, 0], np.arange(tid, rows * cols * upp, step))
                np.testing.assert_array_equal(got[:, 1:4], got[:, 4:7], err_msg=f"{rows}x{cols}x{upp} step {step}")


@settings(max_examples=40, deadline=None)
@given(case=CASES, data=st.data())
def test_windows_read_what_the_model_multiplies(lib, case, data):
    p = _problem(case)
    sh = Shape(p)
    cfg = sh.cfg
    th = _thread_map(lib, sh)
    assert sorted(map(tuple, th.tolist())) == [(c, r, q) for c in range(cfg.cv) for r in range(cfg.tp)
                                              for q in range(cfg.tqg)]
    reads = _window_reads(lib, sh)
    tile = (np.arange(cfg.in_rows * cfg.in_cols * cfg.cin, dtype=np.float32) + 1).reshape(
        cfg.in_rows, cfg.in_cols, cfg.cin)
    taps_rs = {(0, 0), (sh.R - 1, sh.S - 1),
               (data.draw(st.integers(0, sh.R - 1)), data.draw(st.integers(0, sh.S - 1)))}
    tids = range(cfg.threads) if cfg.threads <= 48 else sorted(
        set(data.draw(st.lists(st.integers(0, cfg.threads - 1), min_size=16, max_size=16))) | {0, cfg.threads - 1})
    for r, s in taps_rs:
        taps = np.zeros((sh.R, sh.S, cfg.cb), np.float32)
        taps[r, s] = 1.0  # one tap: the model's sum is the one tile element that tap multiplies
        for tid in tids:
            cv, row, qg = th[tid]
            want = thread_outputs(tile, taps, p, cfg, cv, row, qg).astype(np.int64) - 1
            np.testing.assert_array_equal(reads[tid, r, s], want, err_msg=f"{p.describe()} tid {tid} r {r} s {s}")


@settings(max_examples=40, deadline=None)
@given(case=CASES)
def test_weights_and_outputs_match_the_model(lib, case):
    p = _problem(case)
    sh = Shape(p)
    cfg = sh.cfg
    K = p.out_channels
    w5 = np.random.default_rng(case.seed).standard_normal((K, sh.T, sh.R, sh.S))
    th = _thread_map(lib, sh)
    blocks = _blocks(lib, sh)
    for chunk in range(cfg.chunks):
        lds = _weight_lds(lib, sh, w5, chunk)
        assert not np.isnan(lds).any()  # every slot written once
        k0 = chunk * cfg.cb
        kk = np.arange(k0, min(k0 + cfg.cb, K))
        taps = np.zeros((sh.T, sh.R, sh.S, cfg.cb))  # direct_conv's taps: [T][R][S][cb], zero past K
        taps[..., :len(kk)] = np.moveaxis(w5[kk], 0, -1)
        for t, r, s in np.ndindex(sh.T, sh.R, sh.S):
            slot = lib.dw_tap(t, r, s, sh.R, sh.S, cfg.cb)
            np.testing.assert_array_equal(lds[slot:slot + cfg.cb], taps[t, r, s])
    for block in range(sh.blocks):
        n, o, tile_p, tile_q, chunk = blocks[block]
        got = _outputs(lib, sh, block)
        for tid in range(cfg.threads):
            cv, row, qg = th[tid]
            pp, k = tile_p * cfg.tp + row, chunk * cfg.cb + cv * cfg.vec
            for j in range(cfg.qt):
                qq = tile_q * cfg.tq + qg * cfg.qt + j
                want = -1 if (pp >= sh.P or k >= K or qq >= sh.Q) else \
                    np.ravel_multi_index((n, o, pp, qq, k), (p.batch, sh.O, sh.P, sh.Q, K))
                assert got[tid, j] == want, (p.describe(), block, tid, j)


def _emulate(lib, sh: Shape, x5: np.ndarray, w5: np.ndarray) -> np.ndarray:
    """The kernel's data flow on the CPU, every index from the shim: weights and tiles to 'LDS', windows
    times taps, stores at the output offsets (float64)."""
    p, cfg = sh.p, sh.cfg
    out = np.full(p.batch * sh.O * sh.P * sh.Q * p.out_channels, np.nan)
    reads = _window_reads(lib, sh)                                      # [tid][r][s][q][v]
    th = _thread_map(lib, sh)
    tap_slots = np.array([[[lib.dw_tap(t, r, s, sh.R, sh.S, cfg.cb) for s in range(sh.S)] for r in range(sh.R)]
                          for t in range(sh.T)])                        # [t][r][s]
    wsel = tap_slots[None, :, :, :, None] + (th[:, 0] * cfg.vec)[:, None, None, None, None] + np.arange(cfg.vec)
    for block, (n, o, _, _, chunk) in enumerate(_blocks(lib, sh)):
        lds_w = _weight_lds(lib, sh, w5, chunk)
        acc = np.zeros((cfg.threads, cfg.qt, cfg.vec))
        for t in range(sh.T):
            d = lib.dw_depth(sh.ptr, int(o), t)
            if not 0 <= d < sh.D:
                continue
            tile = _tile_from_voffsets(lib, sh, x5, block, n, d).reshape(-1)
            wt = lds_w[wsel[:, t]]                                      # [tid][r][s][v]
            acc += np.einsum("irsqv,irsv->iqv", tile[reads], wt)
        offs = _outputs(lib, sh, block)
        stored = offs >= 0
        idx = offs[stored][:, None] + np.arange(cfg.vec)
        out[idx] = acc[stored]
    assert not np.isnan(out).any(), "an output element was never stored"
    return out.reshape(p.batch, sh.O, sh.P, sh.Q, p.out_channels)


@settings(max_examples=40, deadline=None)
@given(case=CASES)
def test_composed_index_math_is_the_convolution(lib, case):
    p = _problem(case)
    sh = Shape(p)
    rng = np.random.default_rng(case.seed)
    x = rng.standard_normal(p.x_shape)
    w = rng.standard_normal(p.w_shape)
    x5 = x if p.nd == 3 else x[:, None]
    got = _emulate(lib, sh, x5, w.reshape(p.out_channels, sh.T, sh.R, sh.S))
    ref = cuconv.reference.convnd(x, w, stride=case.stride, padding=case.padding, dilation=case.dilation,
                                  groups=case.groups, layout=p.layout)
    np.testing.assert_allclose(got if p.nd == 3 else got[:, 0], ref, rtol=1e-12, atol=1e-12)
