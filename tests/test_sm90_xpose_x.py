"""The Hopper kernel transposing channels-first x in shared memory (the ``_xp`` variants: NCHW / NCDHW in and
out, kernels_cu/sm90/transpose_loader.cuh).

CPU: which problems take the transposing variant and why others do not (plan, ``explain``, the layout line);
the staged row's geometry; tile configs and the compile list; the NumPy model of a staged row transposed
into a window (cuconv.models.halo.xpose_window, the kernel's per-lane ldmatrix / stmatrix addresses) equals
the channels-last window. GPU: drawn NCHW / NCDHW problems with every epilogue term, every tile height and
ping-pong, forced onto the transposing variant, against the float64 reference; in-place residuals; two runs
give equal bits.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import cuconv
from cuconv.backends.sm90.kernel import Sm90TmaConv3d, Sm90TmaKernel
from cuconv.backends.sm90.tiles import staging_row, tile_config, transposed_x_decline
from cuconv.backends.sm90.variants import COMPILE_VARIANTS, defines
from cuconv.layout import describe
from cuconv.overrides import Overrides
from cuconv.problem import output_size

from conftest import hopper_available
from geometry import H100, Case, check_case, draw_epilogue, make_operands, problem2d, problem3d
from test_sm90_cf_x import _explained, _problem  # the case's problem; explain's line for a drawn case


def _cf(p):
    return dataclasses.replace(p, layout="NCHW" if p.nd == 2 else "NCDHW")


# --- which problems transpose x ---------------------------------------------------------------------------

@pytest.mark.parametrize("N, H, C, K", [(1, 512, 128, 128), (1, 512, 256, 256), (1, 256, 256, 256),
                                        (2, 64, 320, 320)])
def test_nchw_3x3_layers_transpose_x(N, H, C, K):
    """The VAE / UNet 3x3 layers with at most two column tiles on NCHW arrays: staged rows transposed into
    channels-last windows, only the filter moved."""
    p = _cf(problem2d(N=N, H=H, W=H, C=C, K=K))
    plan = Sm90TmaKernel().plan(p, H100, Overrides())
    assert plan.reads_x_channels_first and plan.writes_channels_first and plan.cfg.n_tiles <= 2
    assert plan.cfg.a_xpose and not plan.cfg.a_cf and plan.cfg.halo and "_xp" in plan.describe()
    assert "staged by TMA (88 pixels x 64 channels" in plan.describe()
    assert "x read and the result written channels-first by the kernel itself" in describe(p, H100, plan)


def test_many_column_tiles_move_x_unless_forced():
    """K = 512 in 128-column tiles: every window would be transposed four times, so x moves (explain says
    why); x_transpose=True transposes anyway."""
    p = _cf(problem2d(N=1, H=128, W=128, C=512, K=512))
    plan = Sm90TmaKernel().plan(p, H100, Overrides())
    assert not plan.reads_x_channels_first and "would transpose every window" in plan.describe()
    assert Sm90TmaKernel().plan(p, H100, Overrides(x_transpose=True)).cfg.a_xpose


def test_conv3d_transposes_ncdhw_x():
    p = _cf(problem3d(N=1, D=4, H=64, W=64, C=128, K=128))
    plan = Sm90TmaConv3d().plan(p, H100, Overrides())
    assert plan.reads_x_channels_first and plan.cfg.a_xpose and "conv3d_fprop_sm90_tma_" in plan.describe()


def test_windows_of_channel_rows_serve_the_rest():
    """1x1 filters with more than two column tiles keep the windows of channel rows, and so do those with fewer
    under x_transpose=False; x_transpose=False moves x for a 3x3 filter, with both reasons in explain."""
    wide = _cf(problem2d(N=2, H=64, W=64, C=320, K=640, R=1, S=1, padding=0))
    assert Sm90TmaKernel().plan(wide, H100, Overrides()).cfg.a_cf
    p = _cf(problem2d(N=8, H=64, W=64, C=64, K=256, R=1, S=1, padding=0))
    assert Sm90TmaKernel().plan(p, H100, Overrides()).cfg.a_xpose
    assert Sm90TmaKernel().plan(p, H100, Overrides(x_transpose=False)).cfg.a_cf
    q = _cf(problem2d(N=1, H=256, W=256, C=128, K=128))
    off = Sm90TmaKernel().plan(q, H100, Overrides(x_transpose=False))
    assert not off.reads_x_channels_first
    assert "16-byte boundary" in off.describe() and "switched off" in off.describe()


@pytest.mark.parametrize("problem, why", [
    (problem2d(N=2, H=64, W=64, C=64, K=64, stride=2), "stride"),
    (problem2d(N=2, H=64, W=64, C=64, K=64, R=5, S=5, padding=2), "reach"),
    (problem2d(N=2, H=64, W=60, C=64, K=64), "not a multiple of 16"),
])
def test_declines_name_the_reason(problem, why):
    p = _cf(problem)
    assert why in transposed_x_decline(p)
    plan = Sm90TmaKernel().plan(p, H100, Overrides())
    assert not plan.reads_x_channels_first and "transposed rows: " in plan.describe()
    assert why in plan.describe().split("transposed rows: ")[1]
    assert "channels-last" in transposed_x_decline(problem)


@pytest.mark.parametrize("R, S, dil, pad_w, want", [
    (3, 3, 1, 1, (88, 7)), (3, 3, 1, 0, (72, 0)), (1, 1, 1, 0, (72, 0)), (3, 3, 1, 2, (72, 6)),
    (1, 3, 1, 1, (88, 7)), (2, 2, 2, 3, (72, 5)), (3, 3, 1, 8, (72, 0)), (3, 3, 1, 9, (88, 7))])
def test_staging_row(R, S, dil, pad_w, want):
    """A staged row starts on a 16-byte boundary at or before the window's first column and covers the
    window, in an odd count of 16-byte chunks."""
    p = _cf(problem2d(N=1, H=64, W=64, C=64, K=64, R=R, S=S, dilation=dil, padding=((1, 1), (pad_w, 1))))
    st_w, shift = staging_row(p)
    assert (st_w, shift) == want
    assert (pad_w + shift) % 8 == 0 and shift + 64 + (S - 1) * dil <= st_w and (st_w // 8) % 2 == 1


@pytest.mark.parametrize("ov", [Overrides(), Overrides(pingpong=False), Overrides(pingpong=True),
                                Overrides(pingpong=False, block_m=192, block_n=192),
                                Overrides(pingpong=False, block_m=256, block_n=96), Overrides(cluster=2)])
def test_transposing_tile_configs_fit_and_are_listed(ov):
    """Halo tiles of the channels-first epilogue's heights, single CTAs, at least three filter slots beside the
    staging ring; the catalog's tile shapes are in the compile list (others compile when first used)."""
    listed = {tuple(sorted(d.items())) for _, d, _ in COMPILE_VARIANTS if d.get("SM90_A_XPOSE")}
    for H, C, K in ((512, 128, 128), (256, 256, 256), (64, 320, 320), (64, 640, 640)):
        p = _cf(problem2d(N=1, H=H, W=H, C=C, K=K))
        cfg = tile_config(p, 132, ov, a_xpose=True)
        assert cfg.a_xpose and cfg.halo and cfg.cluster == 1 and cfg.stages >= 3
        assert cfg.smem_bytes(False) <= 227 * 1024
        if (cfg.block_n in (64, 128, 256) if cfg.pingpong
                else cfg.block_m == 128 or (cfg.block_m, cfg.block_n) in ((192, 192), (256, 96))):
            assert tuple(sorted(defines(cfg, "bfloat16", False, 2, nchw=True).items())) in listed, cfg
    with pytest.raises(ValueError, match="a_xpose"):
        tile_config(_cf(problem2d(stride=2)), 132, Overrides(), a_xpose=True)


# --- the transpose model ----------------------------------------------------------------------------------

@st.composite
def xpose_cases(draw, nd=2, max_width=136, max_channels=80, max_spatial=6):
    """A conv the transposing variant serves: NCHW / NCDHW, H/W stride 1, (R-1) dil_h and (S-1) dil_w at most
    2, W a multiple of 8, C and K multiples of 8, any padding; depth (conv3d) unrestricted."""
    c = 8 * draw(st.integers(1, max_channels // 8))
    k = 8 * draw(st.integers(1, max_channels // 8))
    r, dh = draw(st.sampled_from([(1, 1), (2, 1), (3, 1), (2, 2), (3, 1)]))
    s, dw = draw(st.sampled_from([(1, 1), (3, 1), (3, 1), (2, 1), (2, 2)]))
    lead = lead_f = lead_s = lead_d = ()
    if nd == 3:
        lead = (draw(st.integers(1, 4)),)
        lead_f, lead_s, lead_d = (draw(st.integers(1, 3)),), (draw(st.integers(1, 2)),), (draw(st.integers(1, 2)),)
    spatial = lead + (draw(st.integers(1, max_spatial)), 8 * draw(st.integers(1, max_width // 8)))
    filt, stride, dilation = lead_f + (r, s), lead_s + (1, 1), lead_d + (dh, dw)
    padding = tuple((draw(st.integers(0, 2)), draw(st.integers(0, 3))) for _ in range(nd - 1)) + (
        (draw(st.integers(0, 9)), draw(st.integers(0, 9))),)
    for n, f, st_, d, (lo, hi) in zip(spatial, filt, stride, dilation, padding):
        assume(output_size(n, f, st_, d, lo, hi) >= 1)
    return Case(nd=nd, batch=draw(st.integers(1, 2)), spatial=spatial, channels=c, out_channels=k, filt=filt,
                stride=stride, dilation=dilation, padding=padding, groups=1,
                dtype=draw(st.sampled_from(["bfloat16", "float16"])), layout="NCHW" if nd == 2 else "NCDHW",
                epilogue=draw_epilogue(draw), seed=draw(st.integers(0, 2**31 - 1)))


@pytest.mark.parametrize("nd", [2, 3])
@settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_transposed_rows_make_the_channels_last_window(nd, data):
    """Staged rows of channels-first x, moved by the kernel's per-lane ldmatrix.trans / stmatrix addresses
    (swizzle included, read back unswizzled), are the channels-last halo window of the same tile."""
    from cuconv.models import halo_window, xpose_window
    case = data.draw(xpose_cases(nd=nd, max_width=80, max_channels=72, max_spatial=4), label="case")
    p = _problem(case, "float32")
    assert transposed_x_decline(_problem(case)) is None
    rows = data.draw(st.sampled_from([1, 2, 3, 4]), label="rows")
    slot_offset = data.draw(st.sampled_from([0, 256, 512]), label="slot offset")
    x_cf = np.random.default_rng(case.seed).standard_normal(case.x_shape()).astype(np.float32)
    x_cl = np.ascontiguousarray(np.moveaxis(x_cf, 1, -1))
    *planes, P, Q = p.out_spatial
    O = planes[0] if planes else 1
    T = p.filter_spatial[0] if nd == 3 else 1
    for n in range(p.batch):
        for z in range(O):
            for y0 in range(0, P, rows):
                for x0 in range(0, Q, 64):
                    for t in range(T):
                        for c0 in range(0, p.channels, 64):
                            got = xpose_window(x_cf, p, n, z, y0, x0, t, c0, rows, slot_offset=slot_offset)
                            want = halo_window(x_cl, p, n, z, y0, x0, t, c0, rows)
                            np.testing.assert_array_equal(got, want, err_msg=f"{p.describe()} n{n} z{z} y0 {y0} "
                                                          f"x0 {x0} t{t} c0 {c0}")


# --- GPU ---------------------------------------------------------------------------------------------------

#: Forced tile settings of the GPU property test (the transposing variant forced on every drawn case).
SETTINGS = {
    "auto": dict(x_channels_first=True, x_transpose=True),
    "cooperative_128": dict(x_channels_first=True, x_transpose=True, pingpong=False, block_m=128),
    "cooperative_192": dict(x_channels_first=True, x_transpose=True, pingpong=False, block_m=192, block_n=128),
    "cooperative_256": dict(x_channels_first=True, x_transpose=True, pingpong=False, block_m=256, block_n=64),
    "pingpong": dict(x_channels_first=True, x_transpose=True, pingpong=True),
}


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(SETTINGS))
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(case=xpose_cases(nd=2))
def test_nchw_transposed_windows_match_reference(cp, name, case):
    if not hopper_available():
        pytest.skip("needs a Hopper (cc 9.0) GPU")
    with cuconv.overrides(**SETTINGS[name]):
        assert "_xp" in _explained(cp, case)
        check_case(case, cp, kernel="sm90_tma", poison=True)
        if case.epilogue.get("residual"):
            check_case(case, cp, kernel="sm90_tma", in_place=True)


@pytest.mark.gpu
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(case=xpose_cases(nd=3, max_width=72, max_channels=48, max_spatial=5))
def test_ncdhw_transposed_windows_match_reference(cp, case):
    if not hopper_available():
        pytest.skip("needs a Hopper (cc 9.0) GPU")
    with cuconv.overrides(x_channels_first=True, x_transpose=True):
        assert "_xp" in _explained(cp, case)
        check_case(case, cp, kernel="conv3d_native", poison=True)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_vae_sized_3x3_layer_transposes_and_repeats_its_bits(cp, dtype):
    """An SD VAE 3x3 layer (C = K = 256 at 128x128) on NCHW arrays takes the transposing variant by itself,
    matches the reference with a residual and bias, and two calls give the same bits."""
    if not hopper_available():
        pytest.skip("needs a Hopper (cc 9.0) GPU")
    case = Case(nd=2, batch=1, spatial=(128, 128), channels=256, out_channels=256, filt=(3, 3), stride=(1, 1),
                dilation=(1, 1), padding=1, groups=1, dtype=dtype, layout="NCHW",
                epilogue=dict(bias=True, residual=True, beta=1.0, activation="silu"), seed=7)
    assert "_xp" in _explained(cp, case)
    check_case(case, cp, poison=True)
    x, w, bias, residual = make_operands(case, cp)
    one = cuconv.conv2d(x, w, bias, padding=1, layout="NCHW", residual=residual, activation="silu")
    two = cuconv.conv2d(x, w, bias, padding=1, layout="NCHW", residual=residual, activation="silu")
    assert cp.array_equal(one.view(cp.uint16), two.view(cp.uint16))
