"""The tap-pair tensor-core depthwise kernel (``depthwise_diag``): policy and index math on the CPU, results
on the GPU.

CPU: the NumPy model of the kernel (items chunk fastest, swizzled tile slots, the lanes' ldmatrix rows,
B fragments of two diagonal blocks, M block by M block MMAs, with the tile shapes the host picks) equals
the float64 reference; an ldmatrix block's 8 rows fall on 8 distinct bank groups (W stride 1 and 2); the
epilogue's quad transpose leaves each lane 8 channels of one pixel; the dispatcher takes
the kernel for 16-bit depthwise filters narrower than ``depthwise_mma``'s and says why it declines the
problems outside its design; every catalog variant is in the compile list and compiles without spills.

GPU (gpu-marked, sm_80+): drawn depthwise convolutions forced onto the kernel (filters up to 3x3,
strides, dilations, asymmetric padding, C a multiple of 16, NHWC / NCHW, the whole epilogue) against the
reference, with a NaN-poisoned output or in place over the residual; the network layers it is chosen for;
the same bits on two runs.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings

import cuconv
from cuconv import dispatch
from cuconv.backends.depthwise.diag import AUTOMATIC, DepthwiseDiagKernel
from cuconv.backends.depthwise.diag_variants import (COMPILE_VARIANTS, DIAG_CATALOG, DIAG_SOURCE, MAX_TAPS,
                                                     MIN_BLOCKS, SMEM_TARGET, STAGES, diag_config,
                                                     diag_variant)
from cuconv.backends.depthwise.variants import SMEM_LIMIT
from cuconv.models.depthwise_diag import (b_fragment, diag_conv, item_coordinates, lane_pixels, quad_transpose,
                                          slot, store_lanes, tap_pixels)
from cuconv.overrides import Overrides

from conftest import assert_compiles_without_spills, cupy_for_sm80, nvrtc_available, random_array
from geometry import (H100, Setting, case_problem, check_depthwise_layer, check_depthwise_same_bits_and_in_place,
                      depthwise_cases, problem2d, run_property)

KERNEL = "depthwise_diag"

#: Drawn problems the kernel takes: 16-bit, multiplier 1, C a multiple of 16, strides 1-2, filters up to
#: 3x3.
DIAG_CASES = dict(nd=2, dtypes=("float16", "bfloat16"), multipliers=(1,), max_filter=3, channel_step=16,
                  max_stride=2)


# ---------------------------------------------------------------------------------------------- CPU


def test_b_fragments_hold_two_diagonal_blocks():
    """The 32 lanes' words are B = [diag(w_a); diag(w_b)]: every entry once, zero off the diagonals."""
    w_a, w_b = np.arange(1, 9, dtype=np.float32), np.arange(11, 19, dtype=np.float32)
    B = np.zeros((16, 8))
    seen = np.zeros((16, 8))
    for lane in range(32):
        (b0, b1), (b2, b3) = b_fragment(w_a, w_b, lane)
        g, t = lane // 4, lane % 4
        for i, v in ((2 * t, b0), (2 * t + 1, b1), (2 * t + 8, b2), (2 * t + 9, b3)):
            B[i, g] = v
            seen[i, g] += 1
    assert (seen == 1).all()
    np.testing.assert_array_equal(B, np.concatenate([np.diag(w_a), np.diag(w_b)]))


def test_swizzle_is_a_permutation_and_conflict_free():
    """Each pixel's two units fill its own two slots; 8 consecutive pixels' unit u lie on 8 bank groups."""
    pix = np.arange(64)
    slots = np.stack([slot(pix, u) for u in range(2)], axis=1)
    assert sorted(slots.ravel()) == list(range(128))
    assert ((slots // 2) == pix[:, None]).all()
    for u in range(2):
        for start in range(16):
            assert len(set(slot(np.arange(start, start + 8), u) % 8)) == 8


@pytest.mark.parametrize("key", ["3x3_c144_56_s1_bfloat16", "3x3_c32_112_s1_float16", "dil2", "odd", "f1x9",
                                 "3x3_c96_112_s2_bfloat16", "3x3_c144_56_s2_float16"])
def test_ldmatrix_blocks_conflict_free(key):
    """Each 8-lane group of every ldmatrix (an 8 x 8 block) addresses 8 distinct 16-byte bank groups."""
    p = DIAG_CATALOG[key]
    cfg = diag_config(p)
    taps = tap_pixels(p, cfg)
    for mb in range(cfg.m_blocks):
        mr, mc = divmod(mb, cfg.tqg)
        for j in range(taps.shape[0]):
            for nt in range(2):
                banks = slot(lane_pixels(p, cfg, mr, mc, taps[j]), nt) % 8
                for group in range(4):
                    assert len(set(banks[8 * group:8 * group + 8])) == 8, (mb, j, nt, group)


def test_epilogue_transpose_gives_each_lane_a_pixels_channel_run():
    """Lane (g, t) holds channels 8 nt + 2t, + 1 of pixels g and g + 8 (the MMA's C fragment); after
    the quad transpose lane l's four words are channels c0 .. c0 + 7 of one pixel m, every (m, c0) of
    the block once."""
    v = np.zeros((32, 4), dtype=np.int64)  # a word named by 100 * pixel + its first channel
    for lane in range(32):
        g, t = lane // 4, lane % 4
        for h in range(2):
            for nt in range(2):
                v[lane, 2 * h + nt] = 100 * (g + 8 * h) + 8 * nt + 2 * t
    out = quad_transpose(v)
    seen = set()
    for lane, (m, c0) in enumerate(store_lanes()):
        assert list(out[lane]) == [100 * m + c0 + 2 * s for s in range(4)]
        seen.add((m, c0))
    assert seen == {(m, c0) for m in range(16) for c0 in (0, 8)}


def test_items_run_chunk_fastest():
    p = DIAG_CATALOG["3x3_c144_56_s1_bfloat16"]
    cfg = diag_config(p)
    got = [item_coordinates(i, p, cfg) for i in range(cfg.tiles(p))]
    assert len(set(got)) == cfg.tiles(p)
    assert [c for *_, c in got[:cfg.chunks + 1]] == list(range(cfg.chunks)) + [0]


@settings(max_examples=40, deadline=None)
@given(case=depthwise_cases(max_spatial=30, max_channels=40, epilogue=False, **DIAG_CASES))
def test_model_matches_reference(case):
    """The kernel's index math (swizzled tiles, lane rows, diagonal B blocks) computes the convolution."""
    p = case_problem(case)
    cfg = diag_config(p)
    assert not isinstance(cfg, str), cfg
    rng = np.random.default_rng(case.seed)
    x = random_array(rng, (case.batch, *case.spatial, case.channels), "float32")
    w = random_array(rng, (case.out_channels, *case.filt, 1), "float32")
    ref = cuconv.reference.conv2d(x, w, stride=case.stride, padding=case.padding, dilation=case.dilation,
                                  groups=case.groups)
    np.testing.assert_allclose(diag_conv(x, w, p, cfg), ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("key", sorted(DIAG_CATALOG))
def test_config_invariants(key):
    p = DIAG_CATALOG[key]
    cfg = diag_config(p)
    R, S = p.filter_spatial
    (sh, sw), (dh, dw) = p.stride, p.dilation
    P, Q = p.out_spatial
    assert cfg.in_rows == (cfg.tp - 1) * sh + (R - 1) * dh + 1
    assert cfg.in_cols == (cfg.tq - 1) * sw + (S - 1) * dw + 1
    assert cfg.tp % 2 == 0 and cfg.tq % 8 == 0 and cfg.cb == 16 and p.channels % 16 == 0
    assert cfg.tiles_p * cfg.tp >= P > (cfg.tiles_p - 1) * cfg.tp
    assert cfg.tiles_q * cfg.tq >= Q > (cfg.tiles_q - 1) * cfg.tq
    assert cfg.row_pixels == -(-cfg.in_cols // sw) * sw
    assert cfg.taps == R * S
    assert cfg.smem == STAGES * (cfg.in_rows * cfg.row_pixels * cfg.cb * 2 + cfg.cb * R * S * 2)
    assert cfg.smem <= SMEM_LIMIT and (cfg.m_blocks == 1 or cfg.smem <= SMEM_TARGET)
    assert MIN_BLOCKS * (cfg.smem + 1024) <= 228 * 1024 and 2 * cfg.in_cols <= 256


def test_tile_follows_the_gpus_sm_count():
    """The plan's tile is the cost model's for the plan's GPU: rounds of items over its SMs x MIN_BLOCKS CTAs."""
    import dataclasses
    p = problem2d(N=32, H=56, W=56, C=144, K=144, R=3, S=3, padding=1, groups=144, dtype="bfloat16")
    for sms in (132, 58, 16):
        dev = dataclasses.replace(H100, sm_count=sms)
        got = DepthwiseDiagKernel().plan(p, dev, Overrides())
        assert got and got.cfg == diag_config(p, sm_count=sms)
    # fewer CTAs leave each more items: a GPU of 16 SMs takes a tile of no fewer input pixels than the H100's
    big, small = diag_config(p, sm_count=132), diag_config(p, sm_count=16)
    assert small.in_rows * small.in_cols >= big.in_rows * big.in_cols


_AUTO = "depthwise_diag" if AUTOMATIC else "depthwise_direct"


@pytest.mark.parametrize("c, hw, filt, stride, kernel, why", [
    (144, 56, 3, 1, _AUTO, "measured slower"), (32, 112, 3, 1, _AUTO, "measured slower"),
    (96, 112, 3, 2, _AUTO, "measured slower"), (960, 7, 3, 1, _AUTO, "measured slower"),
    (96, 56, 7, 1, "depthwise_mma", "49 taps > 9"), (240, 28, 5, 1, "depthwise_mma", "25 taps > 9"),
    (144, 56, 5, 2, "depthwise_direct", "25 taps > 9"), (120, 28, 3, 1, "depthwise_direct", "not a multiple of 16"),
])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_dispatch(c, hw, filt, stride, kernel, why, dtype):
    p = problem2d(N=32, H=hw, W=hw, C=c, K=c, R=filt, S=filt, stride=stride, padding=filt // 2, groups=c,
                  dtype=dtype)
    plan, sel = dispatch.select(p, H100)
    assert sel.kernel == kernel, str(sel)
    if kernel == KERNEL:
        assert "diagonal" in sel.reason and "MMA" in sel.detail
    else:
        assert why in sel.declined[KERNEL], sel.declined[KERNEL]
    forced = dispatch.select(p, H100, KERNEL) if why in ("", "measured slower") else None
    if forced:
        assert forced[1].kernel == KERNEL and "diagonal" in forced[1].reason


@pytest.mark.parametrize("kw, why", [
    (dict(dtype="float32"), "dtype"),
    (dict(K=192), "channel multiplier 2"),
    (dict(stride=(1, 3)), "stride (1, 3)"),
    (dict(C=100, K=100, groups=100), "not a multiple of 16"),
    (dict(R=7, S=7, padding=3), f"49 taps > {MAX_TAPS}"),
    (dict(groups=48), "not depthwise"),
])
def test_declines_outside_its_design(kw, why):
    args = dict(N=2, H=20, W=20, C=96, K=96, R=3, S=3, padding=1, groups=96, dtype="bfloat16")
    args.update(kw)
    p = problem2d(**args)
    got = DepthwiseDiagKernel().plan(p, H100, Overrides())
    assert not got and why in got.reason, got.reason
    plan, sel = dispatch.select(p, H100)
    assert sel.kernel != KERNEL and why in sel.declined[KERNEL]


def test_conv3d_is_declined_with_the_reason():
    from geometry import problem3d
    p = problem3d(N=1, D=4, H=8, W=8, C=32, K=32, T=3, R=3, S=3, padding=1, groups=32, dtype="bfloat16")
    got = DepthwiseDiagKernel().plan(p, H100, Overrides())
    assert not got and "conv3d" in got.reason


def test_catalog_variants_are_compiled_in_ci():
    names = {d["CUCONV_KERNEL_NAME"] for src, d, arch in COMPILE_VARIANTS if src == DIAG_SOURCE}
    assert names == {diag_variant(p, diag_config(p))[0] for p in DIAG_CATALOG.values()}


@pytest.mark.skipif(not nvrtc_available(), reason="needs NVRTC (cuda-bindings)")
@pytest.mark.parametrize("key", ["3x3_c144_56_s1_bfloat16", "3x3_c96_112_s2_float16", "dil2", "odd", "f1x9"])
def test_compiles_without_spills(key):
    p = DIAG_CATALOG[key]
    f = assert_compiles_without_spills(DIAG_SOURCE, "sm_90a", *diag_variant(p, diag_config(p)))
    assert f.registers <= 65536 // (256 * MIN_BLOCKS)


# ---------------------------------------------------------------------------------------------- GPU


@pytest.fixture(scope="module")
def cp():
    return cupy_for_sm80(KERNEL)


SETTINGS = [
    Setting("2d", depthwise_cases(max_spatial=40, max_channels=80, **DIAG_CASES), max_examples=60),
    Setting("2d_in_place", depthwise_cases(max_spatial=30, max_channels=40, **DIAG_CASES), in_place=True,
            max_examples=20),
]


@pytest.mark.gpu
@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: s.id)
def test_drawn(cp, setting):
    run_property(cp, KERNEL, setting)


@pytest.mark.gpu
@pytest.mark.parametrize("c, hw, stride", [(32, 112, 1), (96, 112, 2), (144, 56, 1), (144, 56, 2), (192, 28, 1),
                                           (384, 14, 1), (576, 14, 2), (960, 7, 1), (48, 17, 1)])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
def test_network_layers(cp, c, hw, stride, dtype, layout):
    check_depthwise_layer(cp, KERNEL, c, hw, 3, stride, 1, dtype, layout, forced=not AUTOMATIC)


@pytest.mark.gpu
def test_same_bits_twice_and_in_place_residual(cp):
    """Two runs give the same bits; a residual written over in place gives the reference."""
    check_depthwise_same_bits_and_in_place(cp, KERNEL, filt=3, seed=12)
