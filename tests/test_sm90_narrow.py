"""The Hopper kernel's narrow variant (``_nk``: 16-column tiles, 16-bit output of any K stored value by
value; the last convolutions of decoders and heads, K = 1-16).

CPU: the automatic choice takes multi-tap layers with K <= 16 onto it (channels-last and channels-first,
conv2d and conv3d) and leaves one-tap maps to the pointwise kernels; ``block_n=16`` forces it at any K,
another forced width declines K = 3 and names the forced width; its variant spells ``_nk``, reads the
residual in the consumers (no C ring, no epilogue-load warp) and is in the compile list.
GPU (gpu-marked, Hopper): drawn convolutions with K 1-16 under every tiling the variant has (automatic,
halo tiles, im2col boxes, 256-row tiles, small problems split along the reduction, 3-D), checked against
the float64 reference with the output NaN-poisoned or written in place over the residual; the SD VAE
decoder's and UNet's ``conv_out`` at full size, chosen automatically, the same bits on a second call;
an output and residual off the 4-byte grid.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import strategies as st

import cuconv
from cuconv import dispatch
from cuconv.backends.sm90.tiles import NARROW_BLOCK_N, NARROW_MAX_K
from cuconv.backends.sm90.variants import COMPILE_VARIANTS, SOURCE, defines, kernel_name
from cuconv.overrides import Overrides

from conftest import assert_close, needs_hopper, random_array
from geometry import H100, Case, Setting, coverage_cases, halo_cases, problem2d, problem3d, run_property

KERNEL = "sm90_tma"


def _select(p, **kw):
    return dispatch.select(p, H100, overrides=Overrides(**kw))


def _nchw(p):
    """``p`` (an NHWC problem) on NCHW arrays."""
    from cuconv.problem import ConvProblem
    return ConvProblem.create(nd=2, batch=p.batch, in_spatial=p.in_spatial, channels=p.channels,
                              out_channels=p.out_channels, filter_spatial=p.filter_spatial, stride=p.stride,
                              dilation=p.dilation, padding=tuple(zip(p.pad_lo, p.pad_hi)), groups=p.groups,
                              dtype=p.dtype, layout="NCHW", epilogue=p.epilogue)


# ------------------------------------------------------------------------------------------ CPU
def test_decoder_output_layers_take_the_narrow_variant():
    """A VAE's and a UNet's conv_out (K = 3 and 4), a K = 16 head and a 3-D K = 3 layer, channels-last and
    channels-first: sm90_tma's 16-column variant, the residual read by the consumers."""
    from cuconv.problem import Epilogue
    ep = Epilogue(has_bias=True, has_residual=True, activation="silu")
    for p in (problem2d(N=1, H=512, W=512, C=128, K=3),
              problem2d(N=2, H=64, W=64, C=320, K=4, epilogue=ep),
              problem2d(N=8, H=128, W=128, C=64, K=16),
              _nchw(problem2d(N=1, H=512, W=512, C=128, K=3)),
              problem3d(C=64, K=3, T=3, R=3, S=3)):
        plan, why = _select(p)
        assert why.kernel == "sm90_tma" or why.kernel == "conv3d_native", str(why)
        assert plan.narrow and plan.cfg.block_n == NARROW_BLOCK_N, plan.describe()
        assert "_nk" in plan.describe() and "narrow epilogue" in plan.describe(), plan.describe()
        if p.layout == "NCHW":
            assert plan.writes_channels_first and "_nk_nchw" in plan.describe()
            assert "x moved to channels-last" in plan.describe()
        if p.epilogue.loads_residual:
            assert plan.compile_jobs()[0][1].get("SM90_HAS_RESIDUAL") == 0
            assert "reads the residual there" in plan.describe()


def test_one_tap_maps_and_wide_outputs_keep_their_kernels():
    """1x1 maps to a few channels stay with the pointwise kernels; K over 16 off the 8-channel grid
    declines on sm90_tma with the reason."""
    for p in (problem2d(N=16, H=80, W=80, C=256, K=8, R=1, S=1, padding=0),
              problem2d(N=8, H=32, W=32, C=16, K=5, R=1, S=1, padding=0)):
        plan, why = _select(p)
        assert why.kernel != "sm90_tma", str(why)
    _, why = _select(problem2d(N=1, H=64, W=64, C=128, K=20))
    assert why.kernel != "sm90_tma"
    reason = why.declined["sm90_tma"]
    assert "K=20 is not a multiple of 8" in reason and f"K <= {NARROW_MAX_K}" in reason, reason


def test_forced_widths():
    """block_n=16 runs any K on the narrow variant; another forced width declines K = 3 and names it."""
    plan, why = _select(problem2d(N=1, H=32, W=32, C=64, K=64), block_n=16)
    assert why.kernel == "sm90_tma" and plan.narrow and plan.cfg.n_tiles == 4, plan.describe()
    plan, why = _select(problem2d(N=1, H=32, W=32, C=64, K=16), block_n=64)
    assert why.kernel == "sm90_tma" and not plan.narrow and plan.cfg.block_n == 64
    _, why = _select(problem2d(N=1, H=32, W=32, C=64, K=3), block_n=64)
    assert why.kernel != "sm90_tma" and "block_n=64 is forced" in why.declined["sm90_tma"], str(why)


def test_narrow_tiles_take_halo_windows_up_to_5_8_padding():
    """Narrow tiles read halo windows wherever at most 5/8 of the padded columns are padding (80 of
    128, 28 of 64: the usual rule's 1/8 would take im2col boxes), and boxes beyond (20 of 64), saying why."""
    plan, _ = _select(problem2d(N=16, H=80, W=80, C=128, K=16))
    assert plan.narrow and plan.cfg.halo, plan.describe()
    plan, _ = _select(problem2d(N=16, H=80, W=80, C=128, K=128))
    assert not plan.cfg.halo  # the 128-column tiles keep the usual rule
    plan, _ = _select(problem2d(N=32, H=28, W=28, C=256, K=4))
    assert plan.narrow and plan.cfg.halo, plan.describe()
    plan, _ = _select(problem2d(N=32, H=20, W=20, C=256, K=4))
    assert plan.narrow and not plan.cfg.halo and "more than 5/8 of them padding" in plan.describe(), plan.describe()
    plan, _ = _select(problem2d(N=16, H=80, W=80, C=128, K=16), halo=False)
    assert plan.narrow and not plan.cfg.halo


def test_forced_choices_the_narrow_variant_lacks_keep_the_wide_tiles():
    """Forced ping-pong or a channels-first x read take the 64-column tiles that have them where K is a
    multiple of 8; K = 3 stays narrow (the forced value cannot be taken)."""
    plan, _ = _select(problem2d(N=2, H=8, W=66, C=64, K=16, padding=0), halo=True, pingpong=True)
    assert not plan.narrow and plan.cfg.pingpong, plan.describe()
    plan, _ = _select(problem2d(N=2, H=8, W=66, C=64, K=3, padding=0), halo=True, pingpong=True)
    assert plan.narrow and not plan.cfg.pingpong, plan.describe()
    p = _nchw(problem2d(N=1, H=8, W=64, C=64, K=8, R=3, S=1, padding=((1, 1), (0, 0))))
    assert _select(p)[0].narrow
    plan, _ = _select(p, x_channels_first=True)
    assert not plan.narrow and plan.reads_x_channels_first, plan.describe()


def test_variant_names_and_compile_list():
    plan, _ = _select(problem2d(N=1, H=512, W=512, C=128, K=3))
    cfg = plan.cfg
    assert kernel_name(cfg, True, 2, narrow=True).endswith("_halo_nk")
    assert kernel_name(cfg, False, 2, nchw=True, narrow=True).endswith("_halo_nk_nchw")
    d = defines(cfg, "bfloat16", True, 2, narrow=True)
    assert d["SM90_NARROW_OUT"] == 1 and d["SM90_HAS_RESIDUAL"] == 0 and d["SM90_BN"] == 16
    assert (SOURCE, d, "sm_90a") in COMPILE_VARIANTS


def test_input_gradients_do_not_take_narrow_plans():
    from cuconv.backends.sm90.phase_scatter import _declines
    plan, _ = _select(problem2d(N=1, H=32, W=32, C=64, K=3))
    assert "narrow" in _declines(plan)


# ------------------------------------------------------------------------------------------ GPU
@st.composite
def narrow_cases(draw, base=None):
    """A case of ``base`` (coverage or halo cases) with K drawn from 1 to 16."""
    case = draw(base if base is not None else coverage_cases())
    return Case(**{**case.__dict__, "out_channels": draw(st.integers(1, NARROW_MAX_K))})


def _multi_tap(case: Case) -> bool:
    return any(f > 1 for f in case.filt)


SETTINGS = [
    Setting("forced_narrow", narrow_cases(), dict(block_n=16, split=False), "_nk", max_examples=50),
    Setting("halo", narrow_cases(halo_cases(nd=2)), dict(block_n=16, halo=True), "_halo_nk", max_examples=40),
    Setting("im2col", narrow_cases(), dict(block_n=16, halo=False, split=False), "_nk", max_examples=30),
    Setting("tall_256", narrow_cases(), dict(block_n=16, block_m=256, split=False), "256x16", max_examples=25),
    Setting("split_ways", narrow_cases(), lambda c: dict(block_n=16, split_ways=2 + c.seed % 5, halo=False),
            "_nk", max_examples=25),
    Setting("in_place_residual", narrow_cases(), dict(block_n=16), "_nk", max_examples=25, in_place=True),
    Setting("3d", narrow_cases(coverage_cases(nd=3)), dict(block_n=16), "_nk", max_examples=20),
    Setting("wide_k", coverage_cases(), dict(block_n=16, split=False), "_nk", max_examples=15),  # several tiles
]


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("setting", SETTINGS, ids=[s.id for s in SETTINGS])
def test_narrow_property(cp, setting):
    run_property(cp, "conv3d_native" if setting.id == "3d" else KERNEL, setting)


def _full_size(cp, x_shape, k, dtype, layout="NHWC"):
    rng = np.random.default_rng(5)
    c = x_shape[-1] if layout == "NHWC" else x_shape[1]
    x = cp.asarray(random_array(rng, x_shape, dtype))
    w_shape = (k, 3, 3, c) if layout == "NHWC" else (k, c, 3, 3)
    w = cp.asarray(random_array(rng, w_shape, dtype, scale=1.0 / c ** 0.5))
    b = cp.asarray(random_array(rng, (k,), dtype))
    return x, w, b


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
def test_vae_conv_out(cp, dtype, layout):
    """SD VAE decoder conv_out (C128 -> K3 3x3 at 512x512), chosen automatically: the narrow variant, the
    reference's result on two images' rows, the same bits on a second call."""
    shape = (1, 512, 512, 128) if layout == "NHWC" else (1, 128, 512, 512)
    x, w, b = _full_size(cp, shape, 3, dtype, layout)
    ex = cuconv.explain(x, w, b, padding=1, layout=layout)
    assert ex.kernel == KERNEL and "_nk" in ex.detail, ex.detail
    y = cuconv.conv2d(x, w, b, padding=1, layout=layout)
    rows = (slice(None), slice(0, 40)) if layout == "NHWC" else (slice(None), slice(None), slice(0, 40))
    xs = x[:, :42] if layout == "NHWC" else x[:, :, :42]
    ref = cuconv.reference.conv2d(cp.asnumpy(xs), cp.asnumpy(w), cp.asnumpy(b), padding=((1, 1), (1, 1)),
                                  layout=layout)
    assert_close(cp.asnumpy(y[rows]), ref[rows], dtype)
    assert bool((cuconv.conv2d(x, w, b, padding=1, layout=layout) == y).all())


@pytest.mark.gpu
@needs_hopper
def test_unet_conv_out_with_residual_is_deterministic(cp):
    """SD UNet conv_out (N = 2, C320 -> K4 at 64x64) with a residual and SiLU, chosen automatically and
    with its reduction split in five: the reference's result, the same bits on a second call."""
    x, w, b = _full_size(cp, (2, 64, 64, 320), 4, "bfloat16")
    r = cp.asarray(random_array(np.random.default_rng(6), (2, 64, 64, 4), "bfloat16"))
    ref = cuconv.reference.conv2d(cp.asnumpy(x), cp.asnumpy(w), cp.asnumpy(b), padding=1, residual=cp.asnumpy(r),
                                  beta=0.5, activation="silu")
    for kw in ({}, dict(halo=False, split_ways=5)):
        with cuconv.overrides(**kw):
            ex = cuconv.explain(x, w, b, padding=1, residual=r, beta=0.5, activation="silu")
            assert ex.kernel == KERNEL and "_nk" in ex.detail, ex.detail
            y = cuconv.conv2d(x, w, b, padding=1, residual=r, beta=0.5, activation="silu")
            assert_close(cp.asnumpy(y), ref, "bfloat16")
            assert bool((cuconv.conv2d(x, w, b, padding=1, residual=r, beta=0.5, activation="silu") == y).all())


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("k", [3, 4])
def test_output_and_residual_off_the_4_byte_grid(cp, k):
    """out and the residual 2 bytes past a 4-byte boundary (K = 4: the paired stores step aside for
    16-bit ones): the reference's result."""
    dtype = "bfloat16"
    rng = np.random.default_rng(8)
    x = cp.asarray(random_array(rng, (2, 9, 70, 64), dtype))
    w = cp.asarray(random_array(rng, (k, 3, 3, 64), dtype, scale=0.125))
    r_host = random_array(rng, (2, 9, 70, k), dtype)
    r = cp.empty(r_host.size + 1, r_host.dtype)[1:].reshape(r_host.shape)
    r[...] = cp.asarray(r_host)
    out = cp.empty(r_host.size + 1, r_host.dtype)[1:].reshape(r_host.shape)
    assert r.data.ptr % 4 and out.data.ptr % 4
    got = cuconv.conv2d(x, w, padding=1, residual=r, out=out)
    assert got is out and "_nk" in cuconv.explain(x, w, padding=1, residual=r).detail
    ref = cuconv.reference.conv2d(cp.asnumpy(x), cp.asnumpy(w), padding=1, residual=r_host)
    assert_close(cp.asnumpy(out), ref, dtype)
