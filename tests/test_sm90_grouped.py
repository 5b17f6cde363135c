"""``sm90_grouped`` / ``conv3d_grouped``: grouped convolutions as dense 64-filter tiles on the Hopper kernel.

On the CPU: the tiled plan of :mod:`cuconv.models.grouped` (block-diagonal filters for narrow groups, each
tile reading its group's channels) equals the grouped reference on drawn problems; the forms and declines;
the dispatcher's choice; the filter pre-pass compiles. On a Hopper GPU: forced and automatic calls equal the
reference with every epilogue term, both layouts, in 2-D and 3-D, and ResNeXt-50's grouped layers.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import cuconv
from cuconv import dispatch
from cuconv.backends.sm90.grouped import MIN_GROUP_CHANNELS, filter_rounds, grouped_form
from cuconv.models.grouped import blockdiag_filter, grouped_as_tiles
from cuconv.overrides import Overrides
from cuconv.problem import output_size

from conftest import assert_close, needs_hopper, random_array
from geometry import A100, H100, Case, Setting, draw_epilogue, problem2d, problem3d, run_property

KERNEL = "sm90_grouped"


@st.composite
def grouped_cases(draw, nd=2, max_spatial=14, epilogue=True):
    """A grouped convolution one of the two forms takes: narrow groups (Cg == Kg of 4-64 dividing 64) or
    wide ones (Kg a multiple of 64, Cg a multiple of 8); filters up to 3 a side (5 along W in 2-D), strides
    1-2, dilations 1-2, asymmetric padding, fp16 / bf16, both layouts."""
    layouts = ("NHWC", "NCHW") if nd == 2 else ("NDHWC", "NCDHW")
    if draw(st.booleans()):
        cg = kg = draw(st.sampled_from([4, 8, 16, 32, 64]))
        groups = draw(st.integers(2, max(2, 256 // cg)))
    else:
        cg, kg = draw(st.sampled_from([8, 16, 64])), draw(st.sampled_from([64, 128]))
        groups = draw(st.integers(2, 3))
    assume(groups * cg % 8 == 0)
    spatial = tuple(draw(st.integers(1, max_spatial if nd == 2 else 6)) for _ in range(nd))
    filt = tuple(draw(st.integers(1, 3)) for _ in range(nd - 1)) + (draw(st.integers(1, 5 if nd == 2 else 3)),)
    stride = tuple(draw(st.integers(1, 2)) for _ in range(nd))
    dilation = tuple(draw(st.integers(1, 2)) for _ in range(nd))
    padding = tuple((draw(st.integers(0, 2)), draw(st.integers(0, 2))) for _ in range(nd))
    for n, f, s, d, (lo, hi) in zip(spatial, filt, stride, dilation, padding):
        assume(output_size(n, f, s, d, lo, hi) >= 1)
    return Case(nd=nd, batch=draw(st.integers(1, 2)), spatial=spatial, channels=groups * cg,
                out_channels=groups * kg, filt=filt, stride=stride, dilation=dilation, padding=padding,
                groups=groups, dtype=draw(st.sampled_from(("float16", "bfloat16"))),
                layout=draw(st.sampled_from(layouts)), epilogue=draw_epilogue(draw) if epilogue else {},
                seed=draw(st.integers(0, 2**31 - 1)))


# ------------------------------------------------------------------------------------------------ CPU
@settings(max_examples=60, deadline=None)
@given(case=grouped_cases(epilogue=False))
def test_tiles_of_the_plan_are_the_grouped_convolution(case):
    """Per 64 filters, a dense convolution over the channels the tile reads (against the block-diagonal
    filter for narrow groups) gives the grouped convolution (float64, CPU)."""
    rng = np.random.default_rng(case.seed)
    x = rng.standard_normal((case.batch, *case.spatial, case.channels))
    w = rng.standard_normal((case.out_channels, *case.filt, case.channels // case.groups))
    kw = dict(stride=case.stride, padding=case.padding, dilation=case.dilation)
    conv = cuconv.reference.conv2d if case.nd == 2 else cuconv.reference.conv3d
    want = conv(x, w, groups=case.groups, **kw)
    np.testing.assert_allclose(grouped_as_tiles(x, w, case.groups, conv, **kw), want, rtol=1e-12, atol=1e-12)


def test_blockdiag_filter_places_each_group_at_its_offset():
    w = np.arange(128 * 2 * 16, dtype=np.float32).reshape(128, 2, 16) + 1
    b = blockdiag_filter(w, 16)
    assert b.shape == (128, 2, 64)
    for k in (0, 15, 16, 63, 64, 100):
        off = (k % 64) - (k % 16)
        np.testing.assert_array_equal(b[k, :, off:off + 16], w[k])
        assert not b[k, :, :off].any() and not b[k, :, off + 16:].any()


@pytest.mark.parametrize("c, k, groups, want", [
    (128, 128, 32, (64, 64, 64)),     # ResNeXt 4 channels per group: narrow
    (512, 512, 32, (64, 64, 64)),     # 16 per group
    (1024, 1024, 32, (64, 64, 64)),   # 32 per group
    (256, 256, 2, (128, 128, 128)),   # wide groups read their own 128 channels
    (128, 256, 2, (128, 64, 64)),     # wide groups, more filters than channels
])
def test_forms(c, k, groups, want):
    assert grouped_form(problem2d(C=c, K=k, groups=groups)) == want


@pytest.mark.parametrize("c, k, groups, reason", [
    (64, 128, 32, "as many filters as channels"),
    (96, 96, 4, "must divide 64"),
    (64, 64, 32, f"fewer than {MIN_GROUP_CHANNELS} channels per group"),
    (72, 128, 2, "multiple of 8"),
])
def test_declines_name_the_reason(c, k, groups, reason):
    k_ = next(kk for kk in cuconv.kernels() if kk.name == KERNEL)
    got = k_.plan(problem2d(C=c, K=k, groups=groups, dtype="float16"), H100, Overrides())
    assert not got and reason in got.reason, got.reason


def test_dispatch_takes_grouped_layers_on_hopper_only():
    p = problem2d(N=32, H=56, W=56, C=128, K=128, groups=32, dtype="float16")  # ResNeXt layer1
    plan, e = dispatch.select(p, H100)
    assert e.kernel == KERNEL and "16 groups of 4 per 64-channel block" in e.detail and "x64x64" in e.detail
    assert dispatch.select(p, A100)[1].kernel == "sm80_igemm"
    assert not next(k for k in cuconv.kernels() if k.name == KERNEL).plan(p, A100, Overrides())
    wide = problem2d(N=1, H=8, W=8, C=256, K=256, groups=2, dtype="bfloat16")  # wide groups: any size
    assert dispatch.select(wide, H100)[1].kernel == KERNEL


@pytest.mark.parametrize("n, hw, c, stride", [(32, 56, 128, 1), (32, 28, 256, 1), (32, 28, 512, 2), (32, 14, 512, 1),
                                          (1, 56, 128, 1), (1, 28, 256, 1), (8, 14, 512, 1), (2, 14, 512, 1),
                                          (32, 14, 1024, 1), (16, 14, 1024, 1)])
def test_grouped_layers_are_taken(n, hw, c, stride):
    """Groups of 4-16 channels whose grid writes the filter in one round of loads, and groups of 32 on 2048
    output pixels or more: one launch per call."""
    p = problem2d(N=n, H=hw, W=hw, C=c, K=c, groups=32, stride=stride, dtype="float16")
    plan, e = dispatch.select(p, H100)
    assert e.kernel == KERNEL and filter_rounds(plan) == 1


@pytest.mark.parametrize("n, hw, c, stride, why", [
    (32, 14, 1024, 2, "32 channels per group"), (32, 7, 1024, 1, "32 channels per group"),
    (8, 7, 1024, 1, "32 channels per group"), (1, 7, 1024, 1, "32 channels per group"),
    (1, 14, 512, 1, "in 2 rounds of loads"), (1, 8, 128, 1, "in 3 rounds of loads")])
def test_groups_of_32_and_tiny_grids_are_left_to_sm80(n, hw, c, stride, why):
    """Groups of 32 channels on fewer than 2048 output pixels (sm80_igemm reduces over them without zeros)
    and grids that write the filter in several rounds of loads go to sm80_igemm; forced, the kernel still
    runs them."""
    p = problem2d(N=n, H=hw, W=hw, C=c, K=c, groups=32, stride=stride, dtype="float16")
    plan, e = dispatch.select(p, H100)
    assert e.kernel == "sm80_igemm" and why in e.declined[KERNEL], e.declined.get(KERNEL)
    assert dispatch.select(p, H100, forced=KERNEL)[1].kernel == KERNEL


def test_conv3d_and_wide_groups_are_not_left():
    """The yield is a 2-D rule of narrow groups: conv3d and wide groups keep the Hopper kernel."""
    p = problem3d(N=1, D=4, H=7, W=7, C=1024, K=1024, groups=32, dtype="float16")
    assert dispatch.select(p, H100)[1].kernel == "conv3d_grouped"
    wide = problem2d(N=1, H=8, W=8, C=256, K=256, groups=2, dtype="bfloat16")
    assert dispatch.select(wide, H100)[1].kernel == KERNEL


def test_dense_and_depthwise_layers_are_not_taken():
    k = next(kk for kk in cuconv.kernels() if kk.name == KERNEL)
    assert "dense" in k.plan(problem2d(C=64, K=64, dtype="float16"), H100, Overrides()).reason
    p = problem2d(C=64, K=64, groups=64, dtype="float16")
    assert dispatch.select(p, H100)[1].kernel in ("depthwise_direct", "depthwise_diag")


# ------------------------------------------------------------------------------------------------ GPU
SETTINGS = [
    Setting("2d", grouped_cases(nd=2), max_examples=50),
    Setting("2d_wide", grouped_cases(nd=2, max_spatial=70, epilogue=False), max_examples=10),
    Setting("2d_in_place", grouped_cases(nd=2), in_place=True, max_examples=15),
    Setting("3d", grouped_cases(nd=3), max_examples=15),
]


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: s.id)
def test_drawn(cp, setting):
    kernel = KERNEL if "3d" not in setting.id else "conv3d_grouped"
    run_property(cp, kernel, setting)


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("c, hw, stride", [(128, 56, 1), (256, 56, 2), (256, 28, 1), (512, 28, 2), (512, 14, 1),
                                           (1024, 14, 2), (1024, 7, 1)])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_resnext_layers(cp, c, hw, stride, dtype):
    """ResNeXt-50 32x4d's grouped 3x3 layers (N = 2) on the kernel, with bias, ReLU and a residual."""
    rng = np.random.default_rng(c + hw)
    x = random_array(rng, (2, hw, hw, c), dtype)
    w = random_array(rng, (c, 3, 3, c // 32), dtype, scale=1.0 / 3)
    b = random_array(rng, (c,), dtype)
    ho = (hw - 1) // stride + 1
    r = random_array(rng, (2, ho, ho, c), dtype)
    kw = dict(stride=stride, padding=1, groups=32, activation="relu")
    ref = cuconv.reference.conv2d(x, w, b, residual=r, **kw)
    got = cuconv.conv2d(cp.asarray(x), cp.asarray(w), cp.asarray(b), residual=cp.asarray(r), kernel=KERNEL, **kw)
    assert_close(got, ref, dtype)
