"""Channels-first operands (cuconv.layout): the transpose kernel, its views, and NCHW / NCDHW calls.

CPU: the transpose source compiles for sm_80 / sm_90a without spills; which views one transpose
takes; the explain line. GPU: the transposes equal NumPy's ``moveaxis`` bit for bit on drawn shapes,
views and dtypes; channels-first convolutions with every epilogue term, non-contiguous inputs,
``out`` views and in-place residuals against the float64 reference.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cuconv
from cuconv.compiler import compile_cuda
from cuconv.layout import SOURCE, _matrix_view, describe

from conftest import assert_close, nvrtc_available, random_array
from geometry import H100, case2d, cases, check_case, make_operands, problem2d

KERNELS = ("transpose_b16", "transpose_b32", "transpose_thin_b16", "transpose_thin_b32", "transpose_pair_b16",
           "transpose_pair_b32")


@pytest.mark.skipif(not nvrtc_available(), reason="needs NVRTC (cuda-bindings)")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_transpose_compiles_without_spills(arch):
    _, report = compile_cuda(SOURCE, arch, {})
    for name in KERNELS:
        f = report.function(name)
        assert f.spill_stores == 0 and f.spill_loads == 0, report.log


def test_matrix_view_takes_channel_slices_and_refuses_strided_pixels():
    a = np.zeros((2, 8, 5, 6), np.float16)
    assert _matrix_view(a) == (2, 8, 30, 240, 30)
    assert _matrix_view(a[:, 2:6]) == (2, 4, 30, 240, 30)   # a channel slice: one transpose
    assert _matrix_view(a[:, ::2]) == (2, 4, 30, 240, 60)   # every other channel: still one
    assert _matrix_view(a[:, :, :, ::2]) is None            # pixels not contiguous: the library's copy
    assert _matrix_view(a[:, :, 1:3]) == (2, 8, 12, 240, 30)  # whole rows of pixels: contiguous block
    assert _matrix_view(a[:, :, :, 1:3]) is None
    w = np.zeros((16, 4, 3, 3), np.float32)                  # KCRS weights: batch K, rows C, cols RS
    assert _matrix_view(w) == (16, 4, 9, 36, 9)



@pytest.mark.parametrize("filt", [(3, 3), (1, 1)])
@pytest.mark.parametrize("x_view", [False, True])
def test_kept_x_mover_keeps_x_and_moves_w(filt, x_view):
    """The mover a signature keeps for a kernel that reads x channels-first (layout._KeptXMovedW), call after
    call with fresh arrays: x as it is, made contiguous; w moved to (K, *filter, C) (NumPy: the move is the
    library's)."""
    from cuconv.layout import _KeptXMovedW
    rng = np.random.default_rng(3)

    def arrays():
        x = rng.standard_normal((2, 8, 5, 6)).astype(np.float32)
        w = rng.standard_normal((4, 8, *filt)).astype(np.float32)
        return (np.concatenate([x, x], axis=1)[:, ::2] if x_view else x), w

    x, w = arrays()
    mover = _KeptXMovedW(x, w, np)
    for _ in range(3):
        x, w = arrays()
        (gx, gw), (wx, ww) = mover(x, w), (x, np.moveaxis(w, 1, -1))
        np.testing.assert_array_equal(gx, wx)
        np.testing.assert_array_equal(gw, ww)
        assert gx.flags.c_contiguous and gw.flags.c_contiguous and gw.shape == (4, *filt, 8)

def test_explain_names_the_moves_and_their_bytes():
    p = dataclasses.replace(problem2d(N=2, H=8, W=8, C=16, K=32, dtype="float16"), layout="NCHW")
    line = describe(p, H100)
    assert "transpose kernel" in line and "NCHW" in line
    x_bytes, w_bytes, y_bytes = 2 * 8 * 8 * 16 * 2, 32 * 9 * 16 * 2, 2 * 8 * 8 * 32 * 2
    assert f"x {x_bytes / 1e3:.3g} kB" in line and f"w {w_bytes / 1e3:.3g} kB" in line
    assert f"result {y_bytes / 1e3:.3g} kB" in line
    assert "no operand is moved" in describe(problem2d(), H100)
    x = np.zeros((1, 3, 8, 8), np.float32)
    assert "array library's copy" in str(cuconv.explain(x, np.zeros((4, 3, 3, 3), np.float32), layout="NCHW"))


def test_operands_split_one_grid_between_x_and_w():
    """The one-launch move of x and w: move 1's blocks follow move 0's, each its single-move grid; each
    copy starts aligned in one buffer; a contiguous one-pixel operand is reshaped (a single move, or
    none); an operand no transpose takes leaves the call to the per-operand path."""
    from cuconv.layout import _operands_of
    x = np.zeros((3, 40, 9, 70), np.float16)    # tiled: 40 rows x 630 cols
    w = np.zeros((24, 40, 3, 3), np.float16)    # thin: 40 rows x 9 cols
    ops = _operands_of(x.shape, x.strides, w.shape, w.strides, x.dtype, 0)
    assert [m.name for m in ops.moves] == ["transpose_b16", "transpose_thin_b16"]
    x_blocks = -(-630 // 64) * -(-40 // 64) * 3
    assert ops.first_blocks == (0, x_blocks) and ops.grid == x_blocks + 1 * 1 * 24
    assert ops.shapes == ((3, 9, 70, 40), (24, 3, 3, 40))
    assert ops.offsets[0] == 0 and ops.offsets[1] % 256 == 0 and ops.offsets[1] >= x.nbytes
    assert ops.nbytes >= ops.offsets[1] + w.nbytes
    w1 = np.zeros((24, 40, 1, 1), np.float16)
    one = _operands_of(x.shape, x.strides, w1.shape, w1.strides, x.dtype, 0)
    assert one.moves[1] is None and one.launched == [0] and one.grid == x_blocks  # w reshaped
    x1 = np.zeros((3, 40, 1, 1), np.float16)
    assert not _operands_of(x1.shape, x1.strides, w1.shape, w1.strides, x.dtype, 0).launched
    xs = x[:, :, :, ::2]
    assert _operands_of(xs.shape, xs.strides, w.shape, w.strides, x.dtype, 0) is None   # pixels not contiguous


# --- GPU ---------------------------------------------------------------------------------------

@st.composite
def _arrays(draw):
    """A channels-first array view: shape, dtype, and a channel slice or offset drawn."""
    dtype = draw(st.sampled_from(["float16", "bfloat16", "float32"]))
    nd = draw(st.sampled_from([2, 3]))
    n = draw(st.integers(1, 3))
    c = draw(st.integers(1, 140))
    spatial = tuple(draw(st.integers(1, 70 if nd == 2 else 12)) for _ in range(nd))
    lo = draw(st.integers(0, 3))
    hi = lo + c
    step = draw(st.sampled_from([1, 1, 2]))
    return dtype, (n, hi + 2, *spatial), (slice(None), slice(lo, hi, step))


@pytest.mark.gpu
@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(_arrays(), st.integers(0, 2**31 - 1))
def test_transposes_equal_moveaxis(cp, drawn, seed):
    from cuconv.layout import to_channels_first, to_channels_last
    dtype, shape, index = drawn
    host = random_array(np.random.default_rng(seed), shape, dtype)
    a = cp.asarray(host)[index]
    want = np.moveaxis(host[index], 1, -1)
    got = to_channels_last(a, True, cp)
    assert got.flags.c_contiguous and got.shape == want.shape
    assert np.array_equal(cp.asnumpy(got).view(np.uint8), np.ascontiguousarray(want).view(np.uint8))
    back = to_channels_first(got, cp)
    assert np.array_equal(cp.asnumpy(back).view(np.uint8), np.ascontiguousarray(host[index]).view(np.uint8))
    dest = cp.full((shape[0], a.shape[1] + 3, *shape[2:]), np.nan, dtype=a.dtype)[:, 1:-2]  # an out view
    assert to_channels_first(got, cp, dest) is dest
    assert np.array_equal(cp.asnumpy(dest).view(np.uint8), np.ascontiguousarray(host[index]).view(np.uint8))


@pytest.mark.gpu
@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(_arrays(), st.integers(1, 70), st.sampled_from([(1, 1), (3, 3), (5, 5), (1, 7), (9, 9)]), st.booleans(),
       st.integers(0, 2**31 - 1))
def test_operand_pairs_equal_moveaxis(cp, drawn, k, filt, w_view, seed):
    """x and w made channels-last together (one launch: tiled or thin each, or a reshape for one pixel;
    channel slices, odd offsets, a w offset by one filter) equal NumPy's moveaxis bit for bit, twice in
    a row (the scratch views are reused)."""
    from cuconv.layout import operands_to_channels_last
    dtype, shape, index = drawn
    rng = np.random.default_rng(seed)
    xh = random_array(rng, shape, dtype)[index]
    c = xh.shape[1]
    wh = random_array(rng, (k + 1, c, *filt), dtype)
    x = cp.asarray(random_array(rng, shape, dtype))[index]
    x[...] = cp.asarray(np.ascontiguousarray(xh))
    w = cp.asarray(wh)[1:] if w_view else cp.asarray(wh[1:])
    for _ in range(2):
        gx, gw = operands_to_channels_last(x, w, cp)
        for got, host in ((gx, xh), (gw, wh[1:])):
            want = np.ascontiguousarray(np.moveaxis(host, 1, -1))
            assert got.flags.c_contiguous and got.shape == want.shape
            assert np.array_equal(cp.asnumpy(got).view(np.uint8), want.view(np.uint8))


@pytest.mark.gpu
@settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck))
@given(cases(nd=2, layouts=("NCHW",), max_channels=40, max_spatial=14))
def test_nchw_conv2d_matches_reference(cp, case):
    check_case(case, cp, poison=True)


@pytest.mark.gpu
@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(cases(nd=3, layouts=("NCDHW",), max_channels=24, max_spatial=10))
def test_ncdhw_conv3d_matches_reference(cp, case):
    check_case(case, cp, poison=True)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_nchw_in_place_residual_and_views(cp, dtype):
    """Residual is ``out`` (in place); x a channel slice; w a view; out a channel slice of a bigger array."""
    rng = np.random.default_rng(3)
    xh = random_array(rng, (2, 40, 17, 19), dtype)
    wh = random_array(rng, (24, 16, 3, 3), dtype, scale=0.25)
    bh = random_array(rng, (24,), dtype)
    x, w, b = cp.asarray(xh)[:, 4:36:2], cp.asarray(wh), cp.asarray(bh)
    ref_x = xh[:, 4:36:2]
    big = cp.asarray(random_array(rng, (2, 30, 17, 19), dtype))
    out = big[:, 3:27]
    res_host = cp.asnumpy(out).copy()
    outside = cp.asnumpy(big).copy()
    ref = cuconv.reference.conv2d(ref_x, wh, bh, padding=1, layout="NCHW", residual=res_host, beta=0.5,
                                  activation="silu")
    got = cuconv.conv2d(x, w, b, padding=1, layout="NCHW", residual=out, beta=0.5, activation="silu", out=out)
    assert got is out
    assert_close(got, ref, dtype)
    after = cp.asnumpy(big)
    for keep in (slice(0, 3), slice(27, 30)):  # the channels around the out view are untouched
        assert np.array_equal(after[:, keep].view(np.uint8), outside[:, keep].view(np.uint8))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_nchw_out_and_residual_at_odd_element_offsets(cp, dtype):
    """out and the residual start 2 bytes past an 8-byte boundary, on planes of a multiple of 4 pixels
    (where the channels-first epilogue otherwise stores 8-byte groups of pixels)."""
    rng = np.random.default_rng(4)
    xh = random_array(rng, (2, 32, 12, 12), dtype)
    wh = random_array(rng, (64, 32, 1, 1), dtype, scale=0.25)
    rh = random_array(rng, (2, 64, 12, 12), dtype)
    size = rh.size
    out = cp.zeros(size + 1, dtype=rh.dtype)[1:].reshape(rh.shape)
    res = cp.zeros(size + 3, dtype=rh.dtype)[3:].reshape(rh.shape)
    res[...] = cp.asarray(rh)
    ref = cuconv.reference.conv2d(xh, wh, layout="NCHW", residual=rh, beta=-1.0, activation="relu")
    got = cuconv.conv2d(cp.asarray(xh), cp.asarray(wh), layout="NCHW", residual=res, beta=-1.0, activation="relu",
                        out=out)
    assert got is out
    assert_close(got, ref, dtype)
    assert np.array_equal(cp.asnumpy(res).view(np.uint8), rh.view(np.uint8))


@pytest.mark.gpu
def test_nchw_repeated_calls_and_plans_use_fresh_weights(cp):
    """The weights are moved on every call: new values at the same address give new results."""
    rng = np.random.default_rng(5)
    x = cp.asarray(random_array(rng, (2, 32, 12, 12), "bfloat16"))
    w = cp.asarray(random_array(rng, (32, 32, 3, 3), "bfloat16", scale=0.2))
    plan = cuconv.plan_conv2d(x, w, padding=1, layout="NCHW")
    for _ in range(3):
        w[...] = cp.asarray(random_array(rng, (32, 32, 3, 3), "bfloat16", scale=0.2))
        ref = cuconv.reference.conv2d(cp.asnumpy(x), cp.asnumpy(w), padding=1, layout="NCHW")
        assert_close(cuconv.conv2d(x, w, padding=1, layout="NCHW"), ref, "bfloat16")
        assert_close(plan(x, w), ref, "bfloat16")


@pytest.mark.gpu
def test_nchw_repeated_calls_follow_the_scratch_buffers(cp):
    """A signature called again moves x and w into the scratch views it kept while no scratch buffer was
    made or dropped; after :func:`cuconv.release_scratch`, on another stream and with new operand values it
    takes the buffers there are and its results stay right."""
    rng = np.random.default_rng(6)
    x = cp.asarray(random_array(rng, (2, 32, 10, 10), "bfloat16"))
    w = cp.asarray(random_array(rng, (48, 32, 3, 3), "bfloat16", scale=0.2))

    def check():
        ref = cuconv.reference.conv2d(cp.asnumpy(x), cp.asnumpy(w), padding=1, layout="NCHW")
        assert_close(cuconv.conv2d(x, w, padding=1, layout="NCHW"), ref, "bfloat16")

    check()
    check()
    cuconv.release_scratch()
    x[...] = cp.asarray(random_array(rng, (2, 32, 10, 10), "bfloat16"))
    check()
    with cp.cuda.Stream(non_blocking=True) as s:
        w[...] = cp.asarray(random_array(rng, (48, 32, 3, 3), "bfloat16", scale=0.2))
        check()
        s.synchronize()
    check()


# --- the Hopper kernel's channels-first epilogue ------------------------------------------------

def test_hopper_plan_writes_channels_first_and_explain_says_so():
    from cuconv.backends.sm90.kernel import Sm90TmaKernel
    from cuconv.overrides import Overrides
    p = dataclasses.replace(problem2d(N=2, H=16, W=16, C=64, K=64), layout="NCHW")
    plan = Sm90TmaKernel().plan(p, H100, Overrides())
    assert plan.writes_channels_first and "_nchw" in plan.describe() and "channels-first" in plan.describe()
    line = describe(p, H100, plan)
    assert "x " in line and "w " in line and "result" not in line.split(";")[0]
    assert "epilogue writes the result" in line
    nhwc = Sm90TmaKernel().plan(problem2d(N=2, H=16, W=16, C=64, K=64), H100, Overrides())
    assert not nhwc.writes_channels_first and "_nchw" not in nhwc.describe()


def test_explain_names_the_channels_first_store_pattern():
    """8-byte stores of 4 pixels where the output plane (and, on halo tiles, the row) is a multiple of 4."""
    from cuconv.backends.sm90.kernel import nchw_store_pattern
    def pattern(H, W, halo=False):
        return nchw_store_pattern(dataclasses.replace(problem2d(N=2, H=H, W=W, C=64, K=64), layout="NCHW"), halo)
    assert pattern(16, 16).startswith("8-byte stores") and "16-bit stores only for an out or residual view" in pattern(16, 16)
    assert pattern(14, 14).startswith("8-byte stores")           # 196 pixels, im2col tiles: every warp
    assert "its 49 pixels are not a multiple of 4" in pattern(7, 7)
    assert "rows of 14 pixels" in pattern(14, 14, halo=True)     # halo rows start at y * 14
    assert pattern(10, 36, halo=True).startswith("8-byte stores") and "rows of" not in pattern(10, 36, halo=True)


def _nchw(case):
    return dataclasses.replace(case, layout="NCHW")


#: Channels-first cases for the Hopper kernel: (case, overrides, what explain names).
HOPPER_NCHW = {
    "im2col_tiles": (_nchw(case2d(N=3, H=13, W=11, C=32, K=64, ep=dict(bias=True, residual=True, beta=0.5,
                                                                        activation="relu"))), dict(split=False), "_nchw"),
    "image_boundaries_in_tile": (_nchw(case2d(N=5, H=5, W=7, C=16, K=24)), dict(split=False), "_nchw"),
    "split_tail": (_nchw(case2d(N=2, H=8, W=8, C=256, K=128, R=3, S=3, ep=dict(residual=True, activation="silu"))),
                   dict(split=True, split_ways=2, block_m=128), "split in two"),
    "tall_256": (_nchw(case2d(N=2, H=20, W=20, C=64, K=64, ep=dict(bias=True))), dict(block_m=256, block_n=64,
                                                                                         split=False), "256x"),
    "halo": (_nchw(case2d(N=2, H=9, W=70, C=32, K=40, ep=dict(residual=True, beta=-1.0, activation="gelu"))),
             dict(halo=True), "_halo_nchw"),
    "halo_pingpong": (_nchw(case2d(N=1, H=6, W=130, C=16, K=64, ep=dict(bias=True))), dict(halo=True, pingpong=True),
                      "_halo_pp_nchw"),
    "fp16_odd_plane": (_nchw(case2d(N=3, H=7, W=7, C=64, K=136, dtype="float16", ep=dict(residual=True))),
                       dict(split=False), "_nchw"),
    # planes of a multiple of 4 pixels: the rows store pattern (8-byte accesses of 4 pixels per channel)
    "rows_partial_columns": (_nchw(case2d(N=2, H=12, W=12, C=64, K=72, ep=dict(bias=True, residual=True, beta=0.5,
                                                                               activation="gelu"))),
                             dict(split=False), "_nchw"),
    "rows_14x14_fp16": (_nchw(case2d(N=3, H=14, W=14, C=32, K=128, dtype="float16",
                                     ep=dict(bias=True, residual=True, beta=-0.5))), dict(split=False), "_nchw"),
    "rows_halo": (_nchw(case2d(N=2, H=10, W=36, C=32, K=64, ep=dict(residual=True, activation="silu"))),
                  dict(halo=True), "_halo_nchw"),
}


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(HOPPER_NCHW))
def test_hopper_channels_first_epilogue(cp, name):
    from conftest import hopper_available
    if not hopper_available():
        pytest.skip("needs a Hopper (cc 9.0) GPU")
    case, overrides, want = HOPPER_NCHW[name]
    with cuconv.overrides(**overrides):
        x, w, bias, residual = make_operands(case, cp)
        detail = cuconv.explain(x, w, bias, residual=residual, beta=case.epilogue.get("beta", 1.0), kernel="sm90_tma",
                                **case.conv_kwargs()).detail
        assert want in detail and "_nchw" in detail, detail
        check_case(case, cp, kernel="sm90_tma", poison=True)
        if case.epilogue.get("residual"):
            check_case(case, cp, kernel="sm90_tma", in_place=True)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bfloat16", "float32", "float64"])
@pytest.mark.parametrize("taps,groups", [((slice(None, None, -1), slice(None, None, -1)), 1),
                                         ((slice(2, None, -2), slice(1, None, -2)), 2),
                                         ((slice(0, 1), slice(None, None, -1), slice(3, 0, -3)), 1)])
def test_flip_filter_matches_the_array_copy(cp, dtype, taps, groups):
    """The input gradient's filter (taps selected and reversed, K and C exchanged per group): the
    kernel's bits equal NumPy's moveaxis copy."""
    from cuconv.layout import flip_filter
    rng = np.random.default_rng(8)
    shape = (6 * groups, 3, 4, 5) if len(taps) == 2 else (4, 2, 3, 4, 6)
    w = random_array(rng, shape, dtype)
    want = flip_filter(w, taps, groups, np)
    got = flip_filter(cp.asarray(w), taps, groups, cp)
    assert got.shape == want.shape and got.flags.c_contiguous
    assert np.array_equal(cp.asnumpy(got).view(np.uint8), want.view(np.uint8))


@pytest.mark.gpu
@pytest.mark.parametrize("channels,dtype", [(16, "bfloat16"), (3, "bfloat16"), (5, "float32"), (2, "float64")])
@pytest.mark.parametrize("stride,phase", [((2, 2), (1, 0)), ((3, 2), (2, 1)), ((1, 2, 2), (0, 1, 1))])
def test_scatter_phase_writes_its_positions_only(cp, channels, dtype, stride, phase):
    from cuconv.layout import scatter_phase
    rng = np.random.default_rng(9)
    I = (7, 6) if len(stride) == 2 else (3, 5, 4)
    T = tuple(-(-(i - q) // s) for i, q, s in zip(I, phase, stride))
    z = random_array(rng, (2, *T, channels), dtype)
    y0 = random_array(rng, (2, *I, channels), dtype)
    want = y0.copy()
    scatter_phase(z, want, stride, phase, np)
    y = cp.asarray(y0)
    scatter_phase(cp.asarray(z), y, stride, phase, cp)
    assert np.array_equal(cp.asnumpy(y).view(np.uint8), want.view(np.uint8))
