"""The Hopper kernel's input-gradient plan variants (cuconv/backends/sm90/phase_scatter.py), on the CPU:
which plans store phases into place or read the filter MN-major, the variant each names (and that the
compile list holds it), the tiles they fall back to, and why they decline. The results themselves are
checked on the GPU (tests/test_grad_gpu.py)."""

from __future__ import annotations

import dataclasses

import numpy as np

from cuconv import subpixel
from cuconv.grad import _phases
from cuconv.layout import flip_filter, flip_taps
from cuconv.backends.sm80.kernel import Sm80IgemmKernel
from cuconv.backends.sm90.kernel import Sm90TmaConv3d, Sm90TmaKernel
from cuconv.backends.sm90.phase_scatter import direct_filter, flipped_view, scatter_plan, stacked_view
from cuconv.backends.sm90.variants import COMPILE_VARIANTS, b_mn_fits, defines, phase_out_fits
from cuconv.overrides import Overrides

from geometry import A100, H100, problem2d, problem3d

_COMPILED = {tuple(sorted(d.items())) for _, d, _ in COMPILE_VARIANTS}


def _compiled(plan) -> bool:
    p = plan.problem
    d = defines(plan.cfg, p.dtype, p.epilogue.loads_residual, p.nd, phases=plan.phase_scatter is not None,
                b_mn=plan.b_mn)
    return tuple(sorted(d.items())) in _COMPILED


def _stacked(N=4, H=16, C=128, K=256, f=4, pad=1):
    """The forward problem of a transposed convolution (stride 2) and its stacked-phase convolution's."""
    fwd = problem2d(N=N, H=2 * H, W=2 * H, C=C, K=K, R=f, S=f, stride=2, padding=pad)
    sp = subpixel.geometry(fwd)
    z = problem2d(N=N, H=H, W=H, C=K, K=sp.phases * C, R=sp.window[0], S=sp.window[1], padding=sp.pad)
    return fwd, sp, z


def test_stacked_phases_are_stored_by_a_compiled_variant_that_fits():
    for f, pad in ((4, 1), (3, 1), (2, 0)):
        fwd, sp, z = _stacked(f=f, pad=pad)
        if f == 3:  # the 3x3 stacked problem: a 2x2 window over L = H + 1 rows
            z = problem2d(N=4, H=17, W=17, C=256, K=sp.phases * 128, R=2, S=2, padding=0)
        plan = Sm90TmaKernel().plan(z, H100, Overrides())
        got, why = scatter_plan(plan, 128, sp.extent, sp.stride, subpixel.scatter_offsets(sp))
        assert got is not None, why
        assert got.phase_scatter.channels == 128 and got.phase_scatter.stride == (1, 2, 2)
        assert phase_out_fits(got.cfg) and _compiled(got)
        assert "_ph" in got.describe() and "phase's positions" in got.describe()
        assert plan.phase_scatter is None and "_ph" not in plan.describe()  # the dispatcher's plan is untouched
        assert got.cfg == plan.cfg and "spill" not in why  # every tile the chooser gives these has the variant


def test_a_tile_without_a_scattering_variant_is_replaced_by_one_of_at_most_128_columns():
    # a 256 x 128 halo tile spills with the scattering epilogue; forced, it gives way to 128 rows
    fwd, sp, _ = _stacked(N=16, H=64, C=64, K=128, f=3, pad=1)
    z = problem2d(N=16, H=64, W=64, C=128, K=sp.phases * 64, R=2, S=2, padding=sp.pad)
    plan = Sm90TmaKernel().plan(z, H100, Overrides(block_m=256, block_n=128, halo=True, pingpong=False))
    assert (plan.cfg.block_m, plan.cfg.block_n, plan.cfg.halo) == (256, 128, True) and not phase_out_fits(plan.cfg)
    got, why = scatter_plan(plan, 64, sp.extent, sp.stride, subpixel.scatter_offsets(sp))
    assert got is not None, why
    assert (got.cfg.block_m, got.cfg.block_n) == (128, 128) and phase_out_fits(got.cfg) and _compiled(got)
    assert "spill" in why and "256x128" in why


def _operand(mn, w, window: int) -> np.ndarray:
    """The convolution's filter (``(out columns, window taps, reduction)``) that the MN-major variant reads
    from ``w`` through ``mn``: column ``n`` of phase ``n // cols`` at view column ``n % cols``, window tap
    ``j`` at the view's tap ``table[phase, j]`` (zeros past the view), as the kernel's producer loads it."""
    view = np.concatenate([w.reshape(mn.rows, mn.taps, mn.cols), np.zeros((mn.rows, 1, mn.cols), w.dtype)], axis=1)
    table = np.array(mn.table).reshape(-1, window)
    table = np.where(table < 0, mn.taps, table)  # a missing tap: the box of zeros
    out = np.empty((table.shape[0] * mn.cols, window, mn.rows), w.dtype)
    for ph in range(table.shape[0]):
        out[ph * mn.cols:(ph + 1) * mn.cols] = view[:, table[ph], :].transpose(2, 1, 0)
    return out


def test_the_mn_major_views_read_the_filters_the_flip_and_the_gather_make():
    """Every view's table, applied to ``w`` as the kernel reads it, gives the filter the flip (a phase of the
    split, stride 1 included) or the stacked-phase gather writes."""
    rng = np.random.default_rng(3)
    for f, s, d, lo in ((3, 1, 1, 1), (3, 1, 2, 2), (5, 1, 1, 0), (3, 2, 1, 1), (4, 2, 1, 1), (3, 3, 2, 1)):
        K, C = 8, 128
        w = rng.standard_normal((K, f, f, C)).astype(np.float32)
        for _, T, spec in _phases(16, f, -(-(16 + 2 * lo - d * (f - 1)) // s), s, d, lo):
            if spec is None:
                continue
            flips = flip_taps((f, f), (spec["flip"], spec["flip"]))
            want = flip_filter(w, None, 1, np, flips)
            mn = flipped_view(w.shape, flips)
            got = _operand(mn, w, want.shape[1] * want.shape[2]).reshape(want.shape)
            assert (got == want).all(), (f, s, d, lo)
        fwd = problem2d(N=1, H=16, W=16, C=C, K=K, R=f, S=f, stride=s, padding=lo, dilation=d)
        sp = subpixel.geometry(fwd)
        if sp is None:
            continue
        want = subpixel.stacked_filter(sp, w, np)
        got = _operand(stacked_view(sp, w.shape), w, int(np.prod(sp.window))).reshape(want.shape)
        assert (got == want).all(), (f, s, d, lo)


def test_a_2x2_stride_2_filter_is_w_read_as_one_phase_of_its_taps_side_by_side():
    fwd, sp, z = _stacked(f=2, pad=0)
    assert subpixel.filter_is_w(sp, (2, 2))
    assert not subpixel.filter_is_w(_stacked(f=4, pad=1)[1], (4, 4))
    mn = stacked_view(sp, (256, 2, 2, 72))  # C = 72: the taps side by side need no 64-column phases
    assert (mn.rows, mn.taps, mn.cols, mn.table) == (256, 1, 4 * 72, (0,))
    plan = Sm90TmaKernel().plan(z, H100, Overrides())
    scatter, _ = scatter_plan(plan, 128, sp.extent, sp.stride, subpixel.scatter_offsets(sp))
    got, why = direct_filter(scatter, stacked_view(sp, (256, 2, 2, 128)))
    assert got is not None, why
    assert got.b_mn and got.phase_scatter is not None and b_mn_fits(got.cfg) and _compiled(got)
    assert got.describe().split(":")[0].endswith("_ph_bmn") and "MN-major" in got.describe()


def test_stacked_phases_of_wider_filters_read_w_mn_major():
    for f, pad in ((4, 1), (3, 1)):
        fwd, sp, z = _stacked(N=4, H=16, C=128, K=256, f=f, pad=pad)
        z = problem2d(N=4, H=16, W=16, C=256, K=sp.phases * 128, R=sp.window[0], S=sp.window[1], padding=sp.pad)
        plan = Sm90TmaKernel().plan(z, H100, Overrides())
        scatter, why = scatter_plan(plan, 128, sp.extent, sp.stride, subpixel.scatter_offsets(sp))
        assert scatter is not None, why
        got, why = direct_filter(scatter, stacked_view(sp, (256, f, f, 128)))
        assert got is not None, why
        assert got.mn_filter.taps == f * f and len(got.mn_filter.table) == 4 * sp.window[0] * sp.window[1]
        assert b_mn_fits(got.cfg) and phase_out_fits(got.cfg) and _compiled(got)


def test_halo_tiles_read_w_mn_major_too():
    """A stride-1 input gradient on halo tiles (cooperative and ping-pong) keeps its tiles and reads the
    filter from w; so do the stacked phases on ping-pong halo tiles with the scattering epilogue."""
    for p in (problem2d(N=4, H=64, W=64, C=256, K=256, R=3, S=3, padding=1),
              problem2d(N=32, H=56, W=56, C=64, K=64, R=3, S=3, padding=1)):  # ping-pong, cooperative
        plan = Sm90TmaKernel().plan(p, H100, Overrides())
        assert plan.cfg.halo
        got, why = direct_filter(plan, flipped_view((p.channels, 3, 3, p.out_channels), ((2, 1, 3), (2, 1, 3))))
        assert got is not None, why
        assert got.cfg == plan.cfg and _compiled(got) and "_halo" in got.describe().split(":")[0]
    fwd, sp, _ = _stacked(N=16, H=64, C=64, K=128, f=3, pad=1)  # a 2x2 window over 64 rows
    z = problem2d(N=16, H=64, W=64, C=128, K=sp.phases * 64, R=2, S=2, padding=sp.pad)
    scatter, why = scatter_plan(Sm90TmaKernel().plan(z, H100, Overrides()), 64, sp.extent, sp.stride,
                                subpixel.scatter_offsets(sp))
    assert scatter is not None and scatter.cfg.halo, why
    got, why = direct_filter(scatter, stacked_view(sp, (128, 3, 3, 64)))
    assert got is not None, why
    assert got.cfg == scatter.cfg and got.cfg.pingpong and _compiled(got) and "_halo_pp_ph_bmn" in got.describe()


def test_a_stride_1_input_gradient_reads_its_flipped_taps_from_w():
    p = problem2d(N=32, H=7, W=7, C=512, K=512, R=3, S=3, padding=1)  # dy -> dx of a 3x3 layer
    mn = flipped_view((512, 3, 3, 512), ((2, 1, 3), (2, 1, 3)))
    assert mn.table == tuple(range(8, -1, -1))
    got, why = direct_filter(Sm90TmaKernel().plan(p, H100, Overrides()), mn)
    assert got is not None, why
    assert b_mn_fits(got.cfg) and _compiled(got) and got.describe().split(":")[0].endswith("_bmn")


def test_a_1x1_input_gradient_reads_w_mn_major_with_a_tile_of_whole_column_blocks():
    for K in (40, 96, 160, 512):  # 96 and 160 columns: tiles of 96 / 160 take 64 or 128 instead
        p = problem2d(N=8, H=28, W=28, C=64, K=K, R=1, S=1, padding=0)
        got, why = direct_filter(Sm90TmaKernel().plan(p, H100, Overrides()), flipped_view((64, 1, 1, K),
                                                                                          ((0, 1, 1), (0, 1, 1))))
        assert got is not None, why
        assert got.cfg.block_n % 64 == 0 and b_mn_fits(got.cfg) and _compiled(got)


def test_the_variants_decline_with_a_reason():
    fwd, sp, z = _stacked()
    offsets = subpixel.scatter_offsets(sp)
    plan = Sm90TmaKernel().plan(z, H100, Overrides())
    assert "multiple of 32" in scatter_plan(plan, 48, sp.extent, sp.stride, offsets)[1]
    with_res = dataclasses.replace(z, epilogue=dataclasses.replace(z.epilogue, has_residual=True))
    assert "residual" in scatter_plan(Sm90TmaKernel().plan(with_res, H100, Overrides()), 128, sp.extent, sp.stride,
                                      offsets)[1]
    pairs = Sm90TmaKernel().plan(z, H100, dataclasses.replace(Overrides(), cluster=2))
    assert "CTA pairs" in scatter_plan(pairs, 128, sp.extent, sp.stride, offsets)[1]
    other = Sm80IgemmKernel().plan(z, A100, Overrides())
    assert "not the Hopper kernel" in scatter_plan(other, 128, sp.extent, sp.stride, offsets)[1]
    narrow = problem2d(N=4, H=16, W=16, C=256, K=4 * 96, R=2, S=2, padding=0)
    _, sp96, _ = _stacked(C=96)
    assert "multiple of 64" in direct_filter(Sm90TmaKernel().plan(narrow, H100, Overrides()),
                                             stacked_view(sp96, (256, 4, 4, 96)))[1]
    assert "2-D" in direct_filter(Sm90TmaConv3d().plan(problem3d(C=64, K=64), H100, Overrides()),
                                  flipped_view((64, 3, 3, 3, 64), ((2, 1, 3),) * 3))[1]


def _explained_transpose(N, side, cin, cout, f, pad, op=0, **ov):
    """explain_transpose of a stride-2 transposed convolution as the model H100 would run it."""
    from unittest import mock

    import ml_dtypes

    import cuconv
    import cuconv.device
    x = np.zeros((N, side, side, cin), ml_dtypes.bfloat16)
    w = np.zeros((cin, f, f, cout), ml_dtypes.bfloat16)
    with mock.patch.object(cuconv.device, "device_of", lambda a: H100), cuconv.overrides(**ov):
        return str(cuconv.explain_transpose(x, w, stride=2, padding=pad, output_padding=op))


def test_automatic_scattering_tiles_are_at_most_128_columns():
    # the chooser gives 128 x 256 to these stacked problems; the scattering plans take 128 columns instead,
    # at the chooser's height for that width (192 rows for the 4x4 layer at 32x32)
    for shape, tile in (((16, 32, 256, 128, 3, 1, 1), "128x128x64"), ((16, 32, 256, 128, 4, 1), "192x128x64")):
        e = _explained_transpose(*shape)
        assert f"conv2d_fprop_sm90_tma_{tile}" in e and "at most 128 columns" in e, e
    # a one-tap window (2x2 filter of stride 2: one GEMM) keeps the chooser's 128 x 256
    e = _explained_transpose(16, 32, 256, 128, 2, 0)
    assert "conv2d_fprop_sm90_tma_128x256x64" in e and "at most" not in e, e
    # a forced width is kept
    e = _explained_transpose(16, 32, 256, 128, 3, 1, 1, block_n=256, block_m=128)
    assert "conv2d_fprop_sm90_tma_128x256x64" in e, e


def test_shifted_phases_take_the_aligned_form_on_256_column_tiles_of_one_phase():
    # 4x4 stride 2 padding 1 with 256 channels per phase: the aligned form (16x16 rows, a 3x3 window)
    e = _explained_transpose(16, 16, 512, 256, 4, 1)
    assert "the phases aligned" in e and "16x16 rows per image instead of the shifted form's 17x17" in e, e
    assert "conv2d_fprop_sm90_tma_128x256x64" in e and "are skipped" in e and "3x3 filter" in e, e
    # 128 channels per phase: not a multiple of the 256-column tile, the shifted form
    e = _explained_transpose(16, 32, 256, 128, 4, 1)
    assert "aligned" not in e and "2x2 filter" in e, e
    # a forced width dividing C takes the aligned form at that width
    e = _explained_transpose(16, 32, 256, 128, 4, 1, block_n=128)
    assert "the phases aligned" in e and "x128x64" in e, e
    # a small problem whose aligned tiles would be split along the reduction keeps the shifted form
    e = _explained_transpose(16, 8, 1024, 512, 4, 1)
    assert "the phases shifted (the aligned form declined: its 64 tiles would be split" in e, e
    # a 3x3 filter has no shifted phase: no aligned form
    assert "aligned" not in _explained_transpose(16, 16, 512, 256, 3, 1, 1)
