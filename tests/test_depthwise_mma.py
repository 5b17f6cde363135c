"""The tensor-core depthwise kernel (``depthwise_mma``): policy and index math on the CPU, results on the GPU.

CPU: the NumPy model of the kernel (banded filter rows, B fragments, channel planes, tile by tile MMAs,
with the tile shapes the host picks) equals the float64 reference; the dispatcher takes the kernel for
16-bit depthwise filters 5 and more wide, leaves narrower ones to ``depthwise_direct`` and says why it
declines the problems outside its design; every catalog variant is in the compile list.

GPU (gpu-marked, sm_80+): drawn depthwise convolutions forced onto the kernel (filters 1-9 wide, W
dilation up to the MMA's 16 columns, H strides and dilations, asymmetric padding, odd channel counts,
NHWC / NCHW, the whole epilogue) against the reference, with a NaN-poisoned output or in place over the
residual; the network layers it is chosen for at full size; the same bits on two runs.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings

import cuconv
from cuconv import dispatch
from cuconv.backends.depthwise.mma import DepthwiseMmaKernel, min_rows
from cuconv.backends.depthwise.mma_variants import (COMPILE_VARIANTS, MMA_CATALOG, MMA_SOURCE, SMEM_TARGET,
                                                    mma_config, mma_variant)
from cuconv.backends.depthwise.variants import SMEM_LIMIT
from cuconv.models.depthwise_mma import b_fragment, banded_filter, mma_conv
from cuconv.overrides import Overrides

from conftest import assert_close, assert_compiles_without_spills, cupy_for_sm80, nvrtc_available, random_array
from geometry import (H100, Setting, case_problem, check_depthwise_layer, check_depthwise_same_bits_and_in_place,
                      depthwise_cases, problem2d, run_property)

KERNEL = "depthwise_mma"

#: Drawn problems the kernel takes: 16-bit, multiplier 1, W stride 1, a filter spanning <= 9 columns.
MMA_CASES = dict(nd=2, dtypes=("float16", "bfloat16"), multipliers=(1,), max_filter=9, max_w_span=9)


# ---------------------------------------------------------------------------------------------- CPU


def test_banded_filter_and_its_fragments():
    """T[i][j] = w[s] on the band i - j = s * dil_w; the 32 lanes' B fragments hold all of T once."""
    w_row = np.arange(1, 8, dtype=np.float32)
    for dil in (1, 2):
        S = 7 if dil == 1 else 5
        T = banded_filter(w_row[:S], dil)
        for j in range(8):
            for i in range(16):
                d = i - j
                want = w_row[d // dil] if d >= 0 and d % dil == 0 and d // dil < S else 0.0
                assert T[i, j] == want
        seen = np.zeros((16, 8))
        for lane in range(32):
            (a0, a1), (b0, b1) = b_fragment(T, lane)
            g, t = lane // 4, lane % 4
            for i, v in ((2 * t, a0), (2 * t + 1, a1), (2 * t + 8, b0), (2 * t + 9, b1)):
                assert v == T[i, g]
                seen[i, g] += 1
        assert (seen == 1).all()


@settings(max_examples=40, deadline=None)
@given(case=depthwise_cases(max_spatial=40, max_channels=40, epilogue=False, **MMA_CASES))
def test_model_matches_reference(case):
    """The kernel's index math (tiles, planes, banded MMAs) computes the convolution."""
    p = case_problem(case)
    cfg = mma_config(p)
    assert not isinstance(cfg, str), cfg
    rng = np.random.default_rng(case.seed)
    x = random_array(rng, (case.batch, *case.spatial, case.channels), "float32")
    w = random_array(rng, (case.out_channels, *case.filt, 1), "float32")
    ref = cuconv.reference.conv2d(x, w, stride=case.stride, padding=case.padding, dilation=case.dilation,
                                  groups=case.groups)
    np.testing.assert_allclose(mma_conv(x, w, p, cfg), ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("key", sorted(MMA_CATALOG))
def test_config_invariants(key):
    p = MMA_CATALOG[key]
    cfg = mma_config(p)
    R, S = p.filter_spatial
    (sh, _), (dh, dw) = p.stride, p.dilation
    P, Q = p.out_spatial
    assert cfg.in_rows == (cfg.tp - 1) * sh + (R - 1) * dh + 1 and cfg.in_cols == cfg.tq + (S - 1) * dw
    assert cfg.tiles_p * cfg.tp >= P > (cfg.tiles_p - 1) * cfg.tp
    assert cfg.tiles_q * cfg.tq >= Q > (cfg.tiles_q - 1) * cfg.tq
    assert cfg.smem <= SMEM_LIMIT and (cfg.nb == 1 or cfg.smem <= SMEM_TARGET)
    assert p.channels % cfg.vin == 0 and p.channels % cfg.vec == 0 and cfg.cb % cfg.vec == 0


@pytest.mark.parametrize("c, hw, filt, kernel, why", [
    (96, 56, 7, "depthwise_mma", ""), (384, 14, 7, "depthwise_mma", ""), (240, 28, 5, "depthwise_mma", ""),
    (100, 30, 5, "depthwise_mma", ""), (64, 20, 9, "depthwise_mma", ""),
    (768, 7, 7, "depthwise_direct", "7 output rows < 14"), (672, 14, 5, "depthwise_direct", "14 output rows < 28"),
    (1152, 7, 5, "depthwise_direct", "7 output rows < 28"), (144, 56, 3, "depthwise_direct", "filter width 3 < 5"),
])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_dispatch_takes_wide_16bit_filters_on_large_planes(c, hw, filt, kernel, why, dtype):
    p = problem2d(N=32, H=hw, W=hw, C=c, K=c, R=filt, S=filt, padding=filt // 2, groups=c, dtype=dtype)
    plan, sel = dispatch.select(p, H100)
    assert sel.kernel == kernel, str(sel)
    if kernel == "depthwise_mma":
        assert "banded" in sel.reason and "MMA" in sel.detail
    else:
        assert why in sel.declined[KERNEL], sel.declined[KERNEL]
    assert min_rows(filt) == (14 if filt >= 7 else 28)


@pytest.mark.parametrize("kw, why", [
    (dict(dtype="float32"), "dtype"),
    (dict(K=192), "channel multiplier 2"),
    (dict(stride=(1, 2)), "W stride 2"),
    (dict(dilation=(1, 2)), "exceed the MMA's 16 reduction columns"),
    (dict(groups=48), "not depthwise"),
])
def test_declines_outside_its_design(kw, why):
    args = dict(N=2, H=20, W=20, C=96, K=96, R=7, S=7, padding=3, groups=96, dtype="bfloat16")
    args.update(kw)
    p = problem2d(**args)
    got = DepthwiseMmaKernel().plan(p, H100, Overrides())
    assert not got and why in got.reason, got.reason
    plan, sel = dispatch.select(p, H100)
    assert sel.kernel != KERNEL and why in sel.declined[KERNEL]


def test_conv3d_is_declined_with_the_reason():
    from geometry import problem3d
    p = problem3d(N=1, D=4, H=8, W=8, C=32, K=32, T=3, R=5, S=5, padding=2, groups=32, dtype="bfloat16")
    got = DepthwiseMmaKernel().plan(p, H100, Overrides())
    assert not got and "conv3d" in got.reason


def test_catalog_variants_are_compiled_in_ci():
    names = {d["CUCONV_KERNEL_NAME"] for src, d, arch in COMPILE_VARIANTS if src == MMA_SOURCE}
    assert names == {mma_variant(p, mma_config(p))[0] for p in MMA_CATALOG.values()}


@pytest.mark.skipif(not nvrtc_available(), reason="needs NVRTC (cuda-bindings)")
@pytest.mark.parametrize("key", ["7x7_c96_56_bfloat16", "5x5_c240_28_float16", "odd_c", "dil2", "stride_h2"])
def test_compiles_without_spills(key):
    p = MMA_CATALOG[key]
    f = assert_compiles_without_spills(MMA_SOURCE, "sm_90a", *mma_variant(p, mma_config(p)))
    assert f.registers <= 80  # 3 CTAs of 256 threads per SM


# ---------------------------------------------------------------------------------------------- GPU


@pytest.fixture(scope="module")
def cp():
    return cupy_for_sm80(KERNEL)


SETTINGS = [
    Setting("2d", depthwise_cases(max_spatial=40, max_channels=80, **MMA_CASES), max_examples=60),
    Setting("2d_in_place", depthwise_cases(max_spatial=30, max_channels=40, **MMA_CASES), in_place=True,
            max_examples=20),
]


@pytest.mark.gpu
@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: s.id)
def test_drawn(cp, setting):
    run_property(cp, KERNEL, setting)


@pytest.mark.gpu
@pytest.mark.parametrize("c, hw, filt", [(96, 56, 7), (192, 28, 7), (384, 14, 7), (240, 28, 5), (100, 29, 5), (98, 17, 7)])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
def test_network_layers(cp, c, hw, filt, dtype, layout):
    check_depthwise_layer(cp, KERNEL, c, hw, filt, 1, 1, dtype, layout)


@pytest.mark.gpu
@pytest.mark.parametrize("c, hw, filt", [(768, 7, 7), (672, 14, 5), (1152, 7, 5)])
def test_small_planes_forced(cp, c, hw, filt):
    """Layers the automatic choice leaves to depthwise_direct, forced onto the kernel."""
    rng = np.random.default_rng(c)
    x = random_array(rng, (4, hw, hw, c), "bfloat16")
    w = random_array(rng, (c, filt, filt, 1), "bfloat16", scale=1.0 / filt)
    kw = dict(padding=filt // 2, groups=c)
    ref = cuconv.reference.conv2d(x, w, **kw)
    assert_close(cuconv.conv2d(cp.asarray(x), cp.asarray(w), kernel=KERNEL, **kw), ref, "bfloat16")


@pytest.mark.gpu
def test_same_bits_twice_and_in_place_residual(cp):
    """Two runs give the same bits; a residual written over in place gives the reference."""
    check_depthwise_same_bits_and_in_place(cp, KERNEL, filt=7, seed=11)
