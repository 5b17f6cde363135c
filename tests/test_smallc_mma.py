"""The tensor-core few-channel kernel (``smallc_mma``): its policy and dispatch on the CPU, its results on
the GPU.

CPU: :func:`mma_config` keeps its invariants (a 128-pixel tile within shared memory, whole n8 fragments
covering K); the kernel's A addressing, run through its NumPy model (cuconv.models.smallc_mma) on
drawn problems, is the convolution; the dispatcher picks the kernel for 16-bit stems on sm_80+, leaves
the shortest windows and some conv3d problems to ``smallc_direct`` and says why it declines the rest;
every catalog variant compiles without spills (tests/test_compile.py compiles them too).
GPU (gpu-marked): drawn few-channel convolutions (C 1-8, filters up to 7x7, K 1-160, strides,
dilations, asymmetric padding, fp16 / bf16, NHWC / NCHW, conv2d and conv3d, the whole epilogue) run
forced onto the kernel with a NaN-poisoned output, or written in place over the residual; the 7x7
stem runs at full size, chosen automatically.
"""

import dataclasses

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import cuconv
from cuconv import dispatch
from cuconv.backends.smallc.mma import SmallcMmaKernel
from cuconv.backends.smallc.mma_variants import (BM, CATALOG, MAX_TERMS, MMA_MAX_C, MMA_SOURCE, SMEM_LIMIT,
                                                 mma_config, mma_declined, mma_variant)
from cuconv.backends.smallc.params import MMA_FIELDS, mma_geometry
from cuconv.models.smallc_mma import layout, pixel_bases, term_offsets, tile_conv
from cuconv.overrides import Overrides
from cuconv.problem import output_size

from conftest import assert_close, assert_compiles_without_spills, cupy_for_sm80, nvrtc_available, random_array
from geometry import A100, H100, Case, Setting, case_problem, draw_epilogue, problem2d, problem3d, run_property

KERNEL = "smallc_mma"


# ------------------------------------------------------------------------------------------ CPU
@pytest.mark.parametrize("key", sorted(CATALOG))
def test_config_invariants(key):
    p = CATALOG[key]
    cfg = mma_config(p)
    assert cfg.tp * cfg.tq == BM and cfg.smem <= SMEM_LIMIT
    assert cfg.bn % 8 == 0 and cfg.bn <= 64 and cfg.chunks * cfg.bn >= p.out_channels
    assert (cfg.chunks - 1) * cfg.bn < p.out_channels  # no empty chunk
    assert p.channels % cfg.vin == 0 and p.out_channels % cfg.ev == 0
    assert cfg.kp % 16 == 0 and cfg.kp >= p.channels * p.filter_spatial[-1] * p.filter_spatial[-2]
    P, Q = p.out_spatial[-2:]
    assert cfg.tiles_p * cfg.tp >= P and cfg.tiles_q * cfg.tq >= Q
    geo = mma_geometry(p, cfg)
    assert len(geo.dtype.names) == len(MMA_FIELDS) and int(geo["in_rows"]) == cfg.in_rows


def test_dispatch_takes_long_windows_and_leaves_short_ones():
    resnet_stem = problem2d(N=32, H=224, W=224, C=3, K=64, R=7, S=7, stride=2, padding=3)
    for dtype in ("bfloat16", "float16"):
        for dev in (H100, A100):
            p = problem2d(N=32, H=224, W=224, C=3, K=64, R=7, S=7, stride=2, padding=3, dtype=dtype)
            plan, why = dispatch.select(p, dev)
            assert why.kernel == KERNEL and "147 terms" in why.reason, str(why)
    # a 3x3 RGB stem (27 terms) too; a 1x1 of 4 channels, conv3d and float32 stay on smallc_direct
    plan, why = dispatch.select(problem2d(N=32, H=224, W=224, C=3, K=32, stride=2, padding=1), H100)
    assert why.kernel == KERNEL, str(why)
    for p, reason in ((problem2d(H=64, W=64, C=4, K=4, R=1, S=1, padding=0), "less than one k16 step"),
                      (problem3d(C=2, K=16), "conv3d")):
        plan, why = dispatch.select(p, H100, strategy="native" if p.nd == 3 else None)
        assert why.kernel == "smallc_direct", str(why)
        assert reason in why.declined[KERNEL], str(why)
    assert dispatch.select(problem2d(C=3, K=64, R=7, S=7, dtype="float32"), H100)[1].kernel != KERNEL
    k = SmallcMmaKernel()
    assert "float32" in k.plan(problem2d(C=3, K=64, R=7, S=7, dtype="float32"), H100, Overrides()).reason
    assert f"at most {MMA_MAX_C} input channels" in k.plan(problem2d(C=MMA_MAX_C + 1), H100, Overrides()).reason
    assert "grouped" in k.plan(problem2d(C=4, K=4, groups=2), H100, Overrides()).reason
    assert "768 reduction terms" in mma_declined(problem2d(H=64, W=64, C=3, K=768, R=16, S=16, stride=16,
                                                           padding=0))
    assert dispatch.select(resnet_stem, H100)[0].describe().startswith(KERNEL)


def test_dispatch_takes_more_channels_where_the_gemm_kernels_waste_their_blocks():
    """On Hopper the automatic choice takes 9-32 channels under a filter of more than one tap where the
    implicit GEMM kernels' 64-channel blocks or 64-column tiles are mostly empty and sm90_wpack does not
    pack the W axis (an odd width, a 24-channel pixel, a 5x5 filter it leaves); it leaves 32 channels into
    more than 32 outputs, more than one chunk of outputs, 1x1 filters, packed widths, NCHW arrays and
    sm_80 devices to the other kernels, and says so."""
    takes = [problem2d(N=32, H=149, W=149, C=32, K=32, padding=0),  # Inception-v3's second conv
             problem2d(N=32, H=55, W=55, C=16, K=64),                # SqueezeNet's first expand 3x3
             problem2d(N=32, H=56, W=56, C=24, K=64),
             problem2d(N=8, H=64, W=64, C=16, K=32, R=5, S=5, padding=2)]
    for p in takes:
        assert dispatch.select(p, H100)[1].kernel == KERNEL, p.describe()
        why = dispatch.select(p, A100)[1]
        assert why.kernel != KERNEL and "on Hopper" in why.declined[KERNEL]
    leaves = {problem2d(N=32, H=147, W=147, C=32, K=64): "C = 32 into K = 64",
              problem2d(N=32, H=27, W=27, C=32, K=128): "chunks of 64",
              problem2d(N=32, H=56, W=56, C=32, K=32, R=1, S=1, padding=0): "1x1 filter",
              problem2d(N=16, H=160, W=160, C=32, K=32): "sm90_wpack packs 2 pixels",
              dataclasses.replace(problem2d(N=32, H=55, W=55, C=16, K=64), layout="NCHW"): "channels-last arrays"}
    for p, reason in leaves.items():
        why = dispatch.select(p, H100)[1]
        assert why.kernel != KERNEL and reason in why.declined[KERNEL], str(why)


def test_conv3d_plans_and_big_filters_decline():
    p = problem3d(C=2, K=16, T=3, R=5, S=5)
    assert dispatch.select(p, H100, strategy="native", forced=KERNEL)[1].kernel == KERNEL
    # seven filter slices of 160 terms x 64 channels outgrow shared memory
    big = problem3d(D=16, H=32, W=32, C=3, K=64, T=7, R=7, S=7, padding=3)
    assert "shared memory" in mma_config(big)


@pytest.mark.skipif(not nvrtc_available(), reason="needs NVRTC (cuda-bindings)")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("key", sorted(CATALOG))
def test_compiles_without_spills(key, arch):
    p = CATALOG[key]
    assert_compiles_without_spills(MMA_SOURCE, arch, *mma_variant(p, mma_config(p)))


# ------------------------------------------------------------------------------------------ GPU
@st.composite
def mma_cases(draw, nd=2, max_spatial=24, epilogue=True, odd_pairs=False, wide=False):
    """A dense convolution the kernel takes: C 1-8 (1-3 for conv3d), filters up to 7 a side (3 for
    conv3d), K 1-160, strides 1-4, dilations 1-2, asymmetric padding, fp16 / bf16. ``odd_pairs``: odd C
    read as pairs of terms (even W stride, W dilation 1), the widths of both parities. ``wide``: 9-32
    channels (multiples of 8 among them: the padded pixel stride) and filters up to 5 a side."""
    layouts = ("NHWC", "NCHW") if nd == 2 else ("NDHWC", "NCDHW")
    if wide:
        c = draw(st.sampled_from([9, 12, 16, 20, 24, 32]))
    else:
        c = draw(st.sampled_from([1, 3, 5, 7]) if odd_pairs else st.integers(1, 8 if nd == 2 else 3))
    k = draw(st.sampled_from([1, 3, 4, 8, 16, 24, 32, 48, 64, 72, 96, 160]))
    spatial = tuple(draw(st.integers(1, max_spatial if nd == 2 else max(4, max_spatial // 2))) for _ in range(nd))
    filt = tuple(draw(st.integers(1, (5 if wide else 7) if nd == 2 else 3)) for _ in range(nd))
    stride = tuple(draw(st.integers(1, 4)) for _ in range(nd))
    dilation = tuple(draw(st.integers(1, 2)) for _ in range(nd))
    if odd_pairs:
        spatial = spatial[:-1] + (draw(st.integers(8, max_spatial)),)
        stride = stride[:-1] + (draw(st.sampled_from([2, 4])),)
        dilation = dilation[:-1] + (1,)
    padding = tuple((draw(st.integers(0, 3)), draw(st.integers(0, 3))) for _ in range(nd))
    for n, f, s, d, (lo, hi) in zip(spatial, filt, stride, dilation, padding):
        assume(output_size(n, f, s, d, lo, hi) >= 1)
    assume(c * filt[-1] * filt[-2] <= MAX_TERMS)
    ep = draw_epilogue(draw) if epilogue else {}
    case = Case(nd=nd, batch=draw(st.integers(1, 3)), spatial=spatial, channels=c, out_channels=k, filt=filt,
                stride=stride, dilation=dilation, padding=padding, groups=1,
                dtype=draw(st.sampled_from(("float16", "bfloat16"))), layout=draw(st.sampled_from(layouts)),
                epilogue=ep, seed=draw(st.integers(0, 2**31 - 1)))
    # Stride 4 with a long window and 6-8 channels can need a larger input tile than any 128-pixel shape
    # fits in shared memory: the kernel declines those (test_tile_shape_is_one_that_fits).
    assume(not isinstance(mma_config(case_problem(case)), str))
    return case


def test_channels_first_problems_get_the_channels_first_variant():
    """NCHW / NCDHW problems compile the variant that reads x and w and writes the result channels-first,
    and the layout's explain line says no operand moves."""
    from cuconv.layout import describe
    for key, cf in (("c4_3x3", "c4_3x3_nchw"), ("c2_conv3d", "c2_conv3d_ncdhw")):
        plan = SmallcMmaKernel().plan(CATALOG[cf], H100, Overrides())
        assert plan.writes_channels_first and plan.reads_channels_first and plan.defines["MM_NCHW"] == 1
        assert plan.name.endswith("_cf") and "x and w read channels-first" in plan.describe()
        last = SmallcMmaKernel().plan(CATALOG[key], H100, Overrides())
        assert not (last.writes_channels_first or last.reads_channels_first) and "MM_NCHW" not in last.defines
    p = dataclasses.replace(problem2d(N=1, H=64, W=64, C=4, K=512), layout="NCHW")
    plan = SmallcMmaKernel().plan(p, H100, Overrides())
    line = describe(p, H100, plan)
    assert "read and written by the kernel itself" in line and "no operand is moved" in line, line


def test_span_copies_where_rows_allow_them():
    """Channels-last tiles copy their rows' runs as 16-byte words where W x C and a tile's step along
    the row are multiples of 8 elements (an RGB stem's 2-byte pixels otherwise go through registers):
    the run's start within its word (SHIFT) puts a spare term before each filter row where pairs of
    terms would start on odd elements, and x must then be 16-byte aligned. Rows of odd length and x
    already copied 16 bytes per pixel keep their copies. Channels-first x is copied plane by plane
    into a [row][c][col] tile where W and a tile's step are multiples of the word."""
    from cuconv.backends.depthwise.kernel import vector_alignments
    stem = problem2d(N=32, H=224, W=224, C=3, K=64, R=7, S=7, stride=2, padding=3)
    cfg = mma_config(stem)
    assert (cfg.span, cfg.shift, cfg.lead) == (8, (-3 * 3) % 8, 1) and cfg.kp == 160
    assert cfg.rowst % 8 == 0 and cfg.rowst >= ((cfg.tq - 1) * 2 + 7) * 3 + cfg.shift
    assert vector_alignments(stem, cfg)[0] == 16
    plan = SmallcMmaKernel().plan(stem, H100, Overrides())
    assert (plan.defines["MM_SPAN"], plan.defines["MM_SHIFT"]) == (8, 7) and "_v8s7_" in plan.name
    assert "rows copied as 16-byte words" in plan.describe()
    even = mma_config(problem2d(N=32, H=224, W=224, C=3, K=96, R=4, S=4, stride=4, padding=0))
    assert (even.span, even.shift, even.lead) == (8, 0, 0)
    odd_row = mma_config(problem2d(N=2, H=33, W=33, C=3, K=16, R=7, S=7, stride=2, padding=3))
    assert odd_row.span == 0 and odd_row.vin == 1 and odd_row.lead == 0
    assert mma_config(problem2d(N=2, H=32, W=32, C=8, K=16)).span == 0
    cf = dataclasses.replace(stem, layout="NCHW")
    cfg = mma_config(cf)
    assert cfg.planar and (cfg.span, cfg.shift, cfg.lead, cfg.pairs) == (8, (-3) % 8, 1, True)
    assert cfg.kp == 7 * 3 * 8 + 8  # R x C runs of LEAD + S = 8 terms, padded to a k16 step
    plan = SmallcMmaKernel().plan(cf, H100, Overrides())
    assert "stored [row][c][col]" in plan.describe() and "copied from the channel planes" in plan.describe()
    # channels-first output: tiles at least CF_MIN_TQ wide where the output is (full 32-byte store runs)
    from cuconv.backends.smallc.mma_variants import CF_MIN_TQ
    yolo = mma_config(dataclasses.replace(problem2d(N=16, H=640, W=640, C=3, K=32, stride=2, padding=1),
                                          layout="NCHW"))
    assert yolo.tq >= CF_MIN_TQ and mma_config(problem2d(N=16, H=640, W=640, C=3, K=32, stride=2, padding=1)).tq == 8
    # stride 1 channels-first: planar runs have no pairs of terms along s (odd window starts)
    conv_in = mma_config(dataclasses.replace(problem2d(N=1, H=64, W=64, C=4, K=512), layout="NCHW"))
    assert conv_in.planar and not conv_in.pairs and conv_in.lead == 0
    # W not a multiple of two: the channels-first gather
    assert not mma_config(dataclasses.replace(problem2d(N=1, H=33, W=33, C=4, K=64), layout="NCHW")).span


def test_tile_shape_is_one_that_fits():
    """Where the cheapest tile shape's input tile is over the shared-memory limit, the next cheapest that
    fits is chosen; the kernel declines, naming the smallest need, only where no shape fits."""
    p = problem2d(N=1, H=200, W=200, C=6, K=64, R=6, S=5, stride=4, padding=3, dtype="float16")
    cheapest = mma_config(p, smem_limit=2 * SMEM_LIMIT)
    cfg = mma_config(p)
    assert cheapest.smem > SMEM_LIMIT >= cfg.smem and (cfg.tp, cfg.tq) != (cheapest.tp, cheapest.tq)
    wide = problem2d(N=3, H=54, W=52, C=8, K=160, R=4, S=5, stride=4, padding=((1, 0), (3, 1)), dtype="float16")
    why = mma_config(wide)
    assert isinstance(why, str) and "input tile need" in why and f"over the {SMEM_LIMIT}" in why
    assert mma_config(wide, smem_limit=2 * SMEM_LIMIT).smem <= 2 * SMEM_LIMIT


@settings(max_examples=120, deadline=None)
@given(case=st.one_of(mma_cases(nd=2, max_spatial=20, epilogue=False),
                      mma_cases(nd=2, max_spatial=20, epilogue=False, wide=True),
                      mma_cases(nd=2, max_spatial=30, epilogue=False, odd_pairs=True),
                      mma_cases(nd=3, max_spatial=10, epilogue=False)))
def test_model_addressing_is_the_convolution(case):
    """The kernel's A addressing (pixel bases + term offsets into the tile buffer, pairs of terms,
    spare and padding terms against zero weights), run on the CPU through cuconv.models.smallc_mma
    with the host's tile shapes, is the convolution; every read stays in the tile buffer (its tail
    word included) and every pair read is 32-bit aligned. Channels-first problems run the same model
    with the tile their variant stores (a [row][c][col] tile where span copies apply)."""
    p = case_problem(case)
    cfg = mma_config(p)
    assume(not isinstance(cfg, str))
    rng = np.random.default_rng(case.seed)
    x = rng.standard_normal((p.batch, *p.in_spatial, p.channels)).astype(np.float32)
    w = rng.standard_normal((p.out_channels, *p.filter_spatial, p.channels)).astype(np.float32)
    conv = cuconv.reference.conv2d if p.nd == 2 else cuconv.reference.conv3d
    want = conv(x.astype(np.float64), w.astype(np.float64), stride=case.stride, padding=case.padding,
                dilation=case.dilation)
    np.testing.assert_allclose(tile_conv(x, w, p, cfg), want, rtol=1e-4, atol=1e-4)
    lay = layout(p, cfg)
    assert lay.pairs == cfg.pairs and lay.kp == cfg.kp and lay.cols_st == cfg.in_cols
    reads = pixel_bases(lay, p.stride[-2])[:, None] + term_offsets(lay, p.dilation[-2])[None, :]
    assert reads.min() >= 0 and reads.max() < cfg.in_rows * lay.rowst + 2
    if lay.pairs:
        assert (reads[:, 0::2] % 2 == 0).all()


@pytest.mark.parametrize("c, stride", [(16, 1), (24, 1), (32, 1), (16, 2)])
def test_a_quarter_warps_reads_fall_in_distinct_banks(c, stride):
    """With 16 or 32 channels the stored pixel is padded (CST) so that each A read of a quarter warp
    (8 neighbouring pixels x 4 consecutive words) reaches 32 distinct banks where its terms lie in one
    filter row, and at most two words share a bank where they straddle two; 24 channels already do. At
    W stride 2 no stride of whole copies does, and the pixel is left as it is."""
    p = problem2d(N=1, H=40, W=40, C=c, K=64, stride=stride)
    cfg = mma_config(p)
    lay = layout(p, cfg)
    assert not cfg.span and cfg.cst % cfg.vin == 0 and (cfg.cst == c) == (c == 24 or stride == 2)
    if stride == 2:
        return
    bases, offs = pixel_bases(lay, 1), term_offsets(lay, 1)
    for m0 in range(0, BM, 8):
        for ks in range(cfg.kp // 16):
            for half in (0, 8):
                terms = np.arange(ks * 16 + half, ks * 16 + half + 8, 2)
                words = np.unique((bases[m0:m0 + 8, None] + offs[None, terms]) // 2)
                degree = np.bincount(words % 32).max()  # distinct words on the busiest bank
                one_row = len(set((terms // lay.krun).tolist())) == 1 and terms[-1] < lay.R * lay.krun
                assert degree == 1 if one_row else degree <= 2, (m0, ks, half)


@pytest.mark.parametrize("key", ["7x7_s2_rgb_bfloat16", "3x3_s2_rgb_bfloat16", "c1_5x5", "narrow_k3"])
def test_model_keeps_non_finite_inputs_in_their_windows(key):
    """With the A values of unweighted terms masked, an Inf or NaN of x reaches exactly the outputs the
    reference gives as non-finite (checked on the model; the GPU test below checks the kernel)."""
    p = CATALOG[key]
    rng = np.random.default_rng(7)
    x = rng.standard_normal((p.batch, *p.in_spatial, p.channels)).astype(np.float32)
    w = rng.standard_normal((p.out_channels, *p.filter_spatial, p.channels)).astype(np.float32)
    flat = x.reshape(-1)
    flat[rng.choice(flat.size, 6, replace=False)] = [np.inf, -np.inf, np.nan, np.inf, np.nan, -np.inf]
    pad = tuple(zip(p.pad_lo, p.pad_hi))
    with np.errstate(invalid="ignore"):
        want = cuconv.reference.conv2d(x.astype(np.float64), w.astype(np.float64), stride=p.stride, padding=pad,
                                       dilation=p.dilation)
        got = tile_conv(x, w, p, mma_config(p))
    np.testing.assert_array_equal(np.isfinite(got), np.isfinite(want))


@pytest.mark.parametrize("key", sorted(CATALOG))
def test_model_runs_the_catalog(key):
    """The catalog's variants (the networks' stems among them) through the model, against the reference."""
    p = CATALOG[key]
    rng = np.random.default_rng(len(key))
    x = rng.standard_normal((p.batch, *p.in_spatial, p.channels)).astype(np.float32)
    w = rng.standard_normal((p.out_channels, *p.filter_spatial, p.channels)).astype(np.float32)
    conv = cuconv.reference.conv2d if p.nd == 2 else cuconv.reference.conv3d
    pad = tuple(zip(p.pad_lo, p.pad_hi))
    want = conv(x.astype(np.float64), w.astype(np.float64), stride=p.stride, padding=pad, dilation=p.dilation)
    np.testing.assert_allclose(tile_conv(x, w, p, mma_config(p)), want, rtol=1e-4, atol=1e-4)


@pytest.fixture(scope="module")
def cp():
    return cupy_for_sm80(KERNEL)


SETTINGS = [
    Setting("2d", mma_cases(nd=2), max_examples=60),
    Setting("2d_wide", mma_cases(nd=2, max_spatial=90, epilogue=False), max_examples=15),
    Setting("2d_odd_pairs", mma_cases(nd=2, max_spatial=40, odd_pairs=True), max_examples=40),
    Setting("2d_more_channels", mma_cases(nd=2, max_spatial=40, wide=True), max_examples=40),
    Setting("2d_in_place", mma_cases(nd=2), in_place=True, max_examples=20),
    Setting("3d", mma_cases(nd=3, max_spatial=12), max_examples=25),
]


@pytest.mark.gpu
@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: s.id)
def test_drawn(cp, setting):
    run_property(cp, KERNEL, setting)


@pytest.mark.gpu
@pytest.mark.parametrize("c, hw, filt, stride, k", [
    (3, 224, 7, 2, 64),    # ResNet-50 / ResNeXt stem
    (3, 96, 7, 1, 3),      # a narrow 7x7 output
    (1, 128, 5, 1, 32),    # one channel, 5x5
])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
def test_long_window_stems(cp, c, hw, filt, stride, k, dtype, layout):
    rng = np.random.default_rng(c + hw + k)
    x = random_array(rng, (2, hw, hw, c), dtype)
    w = random_array(rng, (k, filt, filt, c), dtype, scale=1.0 / filt)
    b = random_array(rng, (k,), dtype)
    kw = dict(stride=stride, padding=filt // 2, activation="relu")
    ref = cuconv.reference.conv2d(x, w, b, **kw)
    if layout == "NCHW":  # the same convolution on channels-first arrays: read and written so by the kernel
        x, w, ref = (np.ascontiguousarray(a.transpose(0, 3, 1, 2)) for a in (x, w, ref))
        kw["layout"] = "NCHW"
    e = cuconv.explain(cp.asarray(x), cp.asarray(w), cp.asarray(b), **kw)
    assert e.kernel == KERNEL, str(e)
    assert_close(cuconv.conv2d(cp.asarray(x), cp.asarray(w), cp.asarray(b), kernel=KERNEL, **kw), ref, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("c, filt, stride", [(3, 7, 2), (3, 3, 2), (1, 5, 1), (3, 7, 1)])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_non_finite_inputs_stay_in_their_windows(cp, c, filt, stride, dtype):
    """Inf and NaN in x make non-finite exactly the outputs the reference does (the spare and padding
    terms' A values are masked), and leave the others equal to the reference."""
    rng = np.random.default_rng(c * filt + stride)
    x = random_array(rng, (2, 40, 48, c), dtype)
    w = random_array(rng, (32, filt, filt, c), dtype, scale=1.0 / filt)
    flat = x.reshape(-1)
    flat[rng.choice(flat.size, 8, replace=False)] = [np.inf, -np.inf, np.nan, np.inf, np.nan, -np.inf, np.inf, np.nan]
    kw = dict(stride=stride, padding=filt // 2)
    with np.errstate(invalid="ignore"):
        ref = cuconv.reference.conv2d(x, w, **kw)
    got = cp.asnumpy(cuconv.conv2d(cp.asarray(x), cp.asarray(w), kernel=KERNEL, **kw)).astype(np.float64)
    finite = np.isfinite(np.asarray(ref, dtype=np.float64))
    np.testing.assert_array_equal(np.isfinite(got), finite)
    assert_close(np.where(finite, got, 0).astype(np.float32).astype(x.dtype), np.where(finite, ref, 0), dtype)
