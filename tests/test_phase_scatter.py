"""The Hopper kernel's input-gradient plan variants (cuconv/backends/sm90/phase_scatter.py), on the CPU:
which plans store phases into place or read the filter MN-major, the variant each names (and that the
compile list holds it), the tiles they fall back to, and why they decline. The results themselves are
checked on the GPU (tests/test_grad_gpu.py)."""

from __future__ import annotations

import dataclasses

from cuconv import subpixel
from cuconv.backends.sm80.kernel import Sm80IgemmKernel
from cuconv.backends.sm90.kernel import Sm90TmaKernel
from cuconv.backends.sm90.phase_scatter import direct_filter, scatter_plan
from cuconv.backends.sm90.variants import COMPILE_VARIANTS, b_mn_fits, defines, phase_out_fits
from cuconv.overrides import Overrides

from geometry import A100, H100, problem2d

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
        if plan.cfg.block_n == 256:  # the 128 x 256 tile spills with this epilogue: 128 columns instead
            assert got.cfg.block_n == 128 and "spill" in why


def test_a_2x2_stride_2_filter_is_w_read_mn_major():
    fwd, sp, z = _stacked(f=2, pad=0)
    assert subpixel.filter_is_w(sp, (2, 2))
    assert not subpixel.filter_is_w(_stacked(f=4, pad=1)[1], (4, 4))
    plan = Sm90TmaKernel().plan(z, H100, Overrides())
    scatter, _ = scatter_plan(plan, 128, sp.extent, sp.stride, subpixel.scatter_offsets(sp))
    got, why = direct_filter(scatter)
    assert got is not None, why
    assert got.b_mn and got.phase_scatter is not None and b_mn_fits(got.cfg) and _compiled(got)
    assert got.describe().split(":")[0].endswith("_ph_bmn") and "MN-major" in got.describe()


def test_a_1x1_input_gradient_reads_w_mn_major_with_a_tile_of_whole_column_blocks():
    for K in (40, 96, 160, 512):  # 96 and 160 columns: tiles of 96 / 160 take 64 or 128 instead
        p = problem2d(N=8, H=28, W=28, C=64, K=K, R=1, S=1, padding=0)
        got, why = direct_filter(Sm90TmaKernel().plan(p, H100, Overrides()))
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
    assert "1x1" in direct_filter(plan)[1]  # a 2x2 window: the filter is gathered
