"""The Hopper kernel reading channels-first x itself (the ``_cf`` variants: NCHW / NCDHW in and out).

CPU: which problems the kernel reads channels-first and why others move x (the plan, ``explain`` and the
layout line); the windows' tile configs; the NumPy model of a channels-first window (cuconv.models.halo:
per filter column, its channel rows read MN-major) reproduces the explicit im2col matrix, in the order
the kernel walks (depth tap, channel block, filter column, filter row). GPU: drawn NCHW / NCDHW problems
with every epilogue term, every tile height and ping-pong, forced onto the windows, against the float64
reference; in-place residuals; two runs give equal bits.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import cuconv
from cuconv.backends.sm90.kernel import Sm90TmaConv3d, Sm90TmaKernel
from cuconv.backends.sm90.tiles import channels_first_x_decline, channels_first_x_pays, tile_config
from cuconv.backends.sm90.variants import COMPILE_VARIANTS
from cuconv.layout import _size, describe
from cuconv.overrides import Overrides
from cuconv.problem import ConvProblem, output_size

from conftest import hopper_available
from geometry import H100, Case, check_case, draw_epilogue, make_operands, problem2d, problem3d


def _cf(p):
    return dataclasses.replace(p, layout="NCHW" if p.nd == 2 else "NCDHW")


# --- which problems read x channels-first ----------------------------------------------------------------

def test_nchw_column_filters_read_x_channels_first():
    """R x 1 filters (and 1x1 ones) on NCHW arrays: halo windows of channels-first x, only the filter moved (the
    transposing variant, which takes those with few column tiles, switched off)."""
    for H, C in ((512, 128), (256, 256), (64, 512)):
        p = _cf(problem2d(N=1, H=H, W=H, C=C, K=C, R=3, S=1, padding=((1, 1), (0, 0))))
        plan = Sm90TmaKernel().plan(p, H100, Overrides(x_transpose=False))
        assert plan.reads_x_channels_first and plan.writes_channels_first and not plan.reads_channels_first
        assert plan.cfg.a_cf and plan.cfg.halo and "_cf" in plan.describe()
        assert "reading x channels-first" in plan.describe()
        line = describe(p, H100, plan)
        assert "x read and the result written channels-first by the kernel itself" in line
        assert f"w {_size(C * C * 3 * 2)}" in line and "x " not in line.split(";")[1]


def test_one_by_one_filters_move_nothing():
    p = _cf(problem2d(N=8, H=64, W=64, C=64, K=256, R=1, S=1, padding=0))
    plan = Sm90TmaKernel().plan(p, H100, Overrides())
    assert plan.reads_x_channels_first
    assert "reshaped: no operand is moved" in describe(p, H100, plan)


def test_conv3d_reads_ncdhw_x():
    p = _cf(problem3d(N=1, D=4, H=64, W=64, C=128, K=128, S=1, padding=((1, 1), (1, 1), (0, 0))))
    plan = Sm90TmaConv3d().plan(p, H100, Overrides(x_transpose=False))
    assert plan.reads_x_channels_first and "conv3d_fprop_sm90_tma_" in plan.describe() and "_cf" in plan.describe()


@pytest.mark.parametrize("problem, why", [
    (problem2d(N=2, H=64, W=64, C=64, K=64, stride=2), "stride"),
    (problem2d(N=2, H=64, W=64, C=64, K=64, R=5, S=5, padding=2), "reach"),
    (problem2d(N=2, H=64, W=60, C=64, K=64, R=1, S=1, padding=0), "not a multiple of 16"),
    (problem2d(N=2, H=64, W=64, C=64, K=64), "16-byte boundary"),                   # 3x3: pad_w 1, shifts 1, 2
    (problem2d(N=2, H=64, W=64, C=64, K=64, R=1, S=1, padding=((0, 0), (4, 4))), "16-byte boundary"),
])
def test_declines_name_the_reason(problem, why):
    """(With the transposing variant switched off: it serves the unaligned columns, tests/test_sm90_xpose_x.py.)"""
    p = _cf(problem)
    assert why in channels_first_x_decline(p)
    plan = Sm90TmaKernel().plan(p, H100, Overrides(x_transpose=False))
    assert not plan.reads_x_channels_first and why in plan.describe() and "x moved to channels-last first" in plan.describe()
    assert "x " in describe(p, H100, plan)  # the layout line counts x among the moved operands


def test_narrow_images_move_x_unless_forced():
    """32 output columns in 64-column tiles: half the work padding, so x moves; forced, it is read."""
    p = _cf(problem2d(N=2, H=32, W=32, C=64, K=64, R=1, S=1, padding=0))
    assert channels_first_x_decline(p) is None and "pad to 64" in channels_first_x_pays(p)
    assert not Sm90TmaKernel().plan(p, H100, Overrides()).reads_x_channels_first
    assert Sm90TmaKernel().plan(p, H100, Overrides(x_channels_first=True)).reads_x_channels_first
    wide = _cf(problem2d(N=2, H=64, W=64, C=64, K=64, R=1, S=1, padding=0))
    off = Sm90TmaKernel().plan(wide, H100, Overrides(x_channels_first=False))
    assert not off.reads_x_channels_first and "switched off" in off.describe()


def test_channels_last_and_rewritten_problems_keep_their_x():
    """NHWC problems, and the plans other kernels make of rewritten problems (make_plan), never read x
    channels-first: only the dispatcher's own Hopper plans do."""
    p = problem2d(N=1, H=128, W=128, C=64, K=64, R=1, S=1, padding=0)
    assert not Sm90TmaKernel().plan(p, H100, Overrides()).reads_x_channels_first
    assert "channels-last" in channels_first_x_decline(p)
    assert not Sm90TmaKernel().make_plan(_cf(p), H100, Overrides()).reads_x_channels_first


def test_windows_tile_configs():
    """Channels-first windows are halo tiles of the channels-first epilogue's heights, single CTAs, their slots
    whole 8192-byte blocks per input row (so the filter ring is as deep as the channels-last windows' or deeper)."""
    p = _cf(problem2d(N=1, H=256, W=256, C=256, K=256, S=1, padding=((1, 1), (0, 0))))
    for ov in (Overrides(), Overrides(pingpong=False), Overrides(pingpong=False, block_m=192, block_n=192),
               Overrides(pingpong=False, block_m=256, block_n=128), Overrides(cluster=2)):
        cfg = tile_config(p, 132, ov, a_cf=True)
        assert cfg.a_cf and cfg.halo and cfg.cluster == 1
        assert cfg.block_m == 128 or (cfg.block_m == 192 and cfg.block_n <= 192) or cfg.block_n <= 96
        plain = tile_config(dataclasses.replace(p, layout="NHWC"), 132, dataclasses.replace(ov, cluster=None))
        if plain.halo and plain.variant[:2] == cfg.variant[:2]:
            assert cfg.stages >= plain.stages
    with pytest.raises(ValueError, match="a_cf"):
        tile_config(_cf(problem2d(stride=2)), 132, Overrides(), a_cf=True)


def test_cf_variants_are_in_the_compile_list():
    names = [d for _, d, _ in COMPILE_VARIANTS if d.get("SM90_A_CF")]
    assert len(names) >= 8
    assert all(d["SM90_HALO"] == 1 and d["SM90_NCHW_OUT"] == 1 and d["SM90_CLUSTER"] == 1 for d in names)
    assert any(d["SM90_NDIM"] == 3 for d in names) and any(d["CUCONV_DTYPE"] == 0 for d in names)


# --- the window model -------------------------------------------------------------------------------------

@st.composite
def cf_cases(draw, nd=2, max_width=136, max_channels=80, max_spatial=6):
    """A conv that channels-first windows serve: NCHW / NCDHW, H/W stride 1, (R-1) dil_h <= 2, W a
    multiple of 8, C and K multiples of 8, every window column on a 16-byte boundary (pad_w 0 or 8, and
    one filter column or a W dilation of 8); depth (conv3d) unrestricted."""
    c = 8 * draw(st.integers(1, max_channels // 8))
    k = 8 * draw(st.integers(1, max_channels // 8))
    r, dh = draw(st.sampled_from([(1, 1), (2, 1), (3, 1), (2, 2)]))
    s, dw = draw(st.sampled_from([(1, 1), (1, 1), (1, 2), (2, 8), (3, 8)]))
    lead = ()
    lead_f = lead_s = lead_d = ()
    if nd == 3:
        lead = (draw(st.integers(1, 4)),)
        lead_f, lead_s, lead_d = (draw(st.integers(1, 3)),), (draw(st.integers(1, 2)),), (draw(st.integers(1, 2)),)
    spatial = lead + (draw(st.integers(1, max_spatial)), 8 * draw(st.integers(1, max_width // 8)))
    filt, stride, dilation = lead_f + (r, s), lead_s + (1, 1), lead_d + (dh, dw)
    padding = tuple((draw(st.integers(0, 2)), draw(st.integers(0, 3))) for _ in range(nd - 1)) + (
        (draw(st.sampled_from([0, 0, 8])), draw(st.integers(0, 9))),)
    for n, f, st_, d, (lo, hi) in zip(spatial, filt, stride, dilation, padding):
        assume(output_size(n, f, st_, d, lo, hi) >= 1)
    return Case(nd=nd, batch=draw(st.integers(1, 2)), spatial=spatial, channels=c, out_channels=k, filt=filt,
                stride=stride, dilation=dilation, padding=padding, groups=1,
                dtype=draw(st.sampled_from(["bfloat16", "float16"])), layout="NCHW" if nd == 2 else "NCDHW",
                epilogue=draw_epilogue(draw), seed=draw(st.integers(0, 2**31 - 1)))


def _problem(case, dtype=None):
    return ConvProblem.create(nd=case.nd, batch=case.batch, in_spatial=case.spatial, channels=case.channels,
                              out_channels=case.out_channels, filter_spatial=case.filt, stride=case.stride,
                              dilation=case.dilation, padding=case.padding, groups=1, dtype=dtype or case.dtype,
                              layout=case.layout)


@pytest.mark.parametrize("nd", [2, 3])
@settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_cf_windows_reproduce_explicit_im2col(nd, data):
    """Every (filter column, filter row) block of a channels-first window, transposed, is the explicit im2col
    rows of the tile's output pixels, walked as the kernel walks them (t, c-block, s, r): the filter tap of
    block r of column s's window is (t R + r) S + s."""
    from cuconv.models import cf_tap_block, cf_window, im2col_matrix
    case = data.draw(cf_cases(nd=nd, max_width=80, max_channels=24, max_spatial=4), label="case")
    p = _problem(case, "float32")
    assert channels_first_x_decline(p) is None
    rows = data.draw(st.sampled_from([2, 3, 4]), label="rows")
    x_cf = np.random.default_rng(case.seed).standard_normal(case.x_shape()).astype(np.float32)
    a = im2col_matrix(np.ascontiguousarray(np.moveaxis(x_cf, 1, -1)), p)
    *planes, P, Q = p.out_spatial
    O = planes[0] if planes else 1
    T = p.filter_spatial[0] if nd == 3 else 1
    R, S = p.filter_spatial[-2:]
    C = p.channels
    for n in range(p.batch):
        for z in range(O):
            for y0 in range(0, P, rows):
                for x0 in range(0, Q, 64):
                    valid = min(64, Q - x0)
                    for t in range(T):
                        for c0 in range(0, C, 16):
                            cw = min(16, C - c0)
                            for s in range(S):
                                win = cf_window(x_cf, p, n, z, y0, x0, t, c0, s, rows, channels=16)
                                for g in range(min(rows, P - y0)):
                                    m = ((n * O + z) * P + y0 + g) * Q + x0
                                    for r in range(R):
                                        tap = (t * R + r) * S + s
                                        got = cf_tap_block(win, p, g, r)[:cw, :valid].T
                                        want = a[m:m + valid, tap * C + c0:tap * C + c0 + cw]
                                        np.testing.assert_array_equal(got, want, err_msg=f"{p.describe()} n{n} z{z} "
                                                                      f"y0 {y0} x0 {x0} t{t} c0 {c0} s{s} g{g} r{r}")


# --- GPU ---------------------------------------------------------------------------------------------------

#: Forced tile settings of the GPU property test (channels-first windows forced on every drawn case).
SETTINGS = {
    "auto": dict(x_channels_first=True, x_transpose=False),
    "cooperative_128": dict(x_channels_first=True, x_transpose=False, pingpong=False, block_m=128),
    "cooperative_192": dict(x_channels_first=True, x_transpose=False, pingpong=False, block_m=192, block_n=128),
    "cooperative_256": dict(x_channels_first=True, x_transpose=False, pingpong=False, block_m=256, block_n=64),
    "pingpong": dict(x_channels_first=True, x_transpose=False, pingpong=True),
}


def _explained(cp, case):
    x, w, bias, residual = make_operands(case, cp)
    ep = case.epilogue
    fn = cuconv.explain
    return fn(x, w, bias, residual=residual, beta=ep.get("beta", 1.0), kernel="sm90_tma" if case.nd == 2 else
              "conv3d_native", **case.conv_kwargs()).detail


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(SETTINGS))
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(case=cf_cases(nd=2))
def test_nchw_windows_match_reference(cp, name, case):
    if not hopper_available():
        pytest.skip("needs a Hopper (cc 9.0) GPU")
    with cuconv.overrides(**SETTINGS[name]):
        assert "_cf" in _explained(cp, case)
        check_case(case, cp, kernel="sm90_tma", poison=True)
        if case.epilogue.get("residual"):
            check_case(case, cp, kernel="sm90_tma", in_place=True)


@pytest.mark.gpu
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(case=cf_cases(nd=3, max_width=72, max_channels=48, max_spatial=5))
def test_ncdhw_windows_match_reference(cp, case):
    if not hopper_available():
        pytest.skip("needs a Hopper (cc 9.0) GPU")
    with cuconv.overrides(x_channels_first=True, x_transpose=False):
        assert "_cf" in _explained(cp, case)
        check_case(case, cp, kernel="conv3d_native", poison=True)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_vae_sized_layer_runs_channels_first_and_repeats_its_bits(cp, dtype):
    """An SD VAE 1x1 layer (C = 256 -> K = 128 at 256x256) on NCHW arrays reads x channels-first by itself (one
    column tile: the transposing variant), matches the reference with a residual and bias, and two calls give
    the same bits."""
    if not hopper_available():
        pytest.skip("needs a Hopper (cc 9.0) GPU")
    case = Case(nd=2, batch=1, spatial=(256, 256), channels=256, out_channels=128, filt=(1, 1), stride=(1, 1),
                dilation=(1, 1), padding=0, groups=1, dtype=dtype, layout="NCHW",
                epilogue=dict(bias=True, residual=True, beta=1.0, activation="silu"), seed=7)
    assert "reading x channels-first" in _explained(cp, case)
    check_case(case, cp, poison=True)
    x, w, bias, residual = make_operands(case, cp)
    one = cuconv.conv2d(x, w, bias, layout="NCHW", residual=residual, activation="silu")
    two = cuconv.conv2d(x, w, bias, layout="NCHW", residual=residual, activation="silu")
    assert cp.array_equal(one.view(cp.uint16), two.view(cp.uint16))
