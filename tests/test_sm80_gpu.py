"""The sm_80+ implicit-GEMM kernel (``sm80_igemm``) and ``cuconv.matmul`` on the GPU.

gpu-marked: skipped without a GPU, or on one older than sm_80. Each im2col loader sub-path is
forced (``cuconv.overrides(sm80_subpath=...)``) and drawn against ``cuconv.reference``; outputs
are NaN-poisoned so an unwritten element fails; the loader's staged tile (debug entry) is compared
with the NumPy model ``cuconv.models.loader.loader_tile``.
"""

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import cuconv
from cuconv.backends.sm80 import stage_a_tile
from cuconv.backends.sm80.pad import pad_plan
from cuconv.backends.sm80.variants import BLOCK_K, conv_config
from cuconv.models.loader import loader_tile
from cuconv.problem import ConvProblem

from conftest import DTYPES, assert_close, cupy_for_sm80, random_array

pytestmark = pytest.mark.gpu

#: Channel counts the per-lane path must handle (odd ones force 2-byte copies).
ODD_CHANNELS = [1, 2, 3, 4, 5, 7, 8, 16, 24]


@pytest.fixture(scope="module")
def cp():
    return cupy_for_sm80("sm80_igemm")


def run_conv(cp, *, subpath, n, hw, c, k, filt, stride=1, padding=0, dilation=1, groups=1, dtype="bfloat16",
             bias=False, residual=False, alpha=1.0, beta=1.0, activation=None, seed=0, in_place=False):
    """Run sm80_igemm forced onto ``subpath`` (NaN-poisoned out) and compare with the reference."""
    rng = np.random.default_rng(seed)
    x = random_array(rng, (n, *hw, c), dtype)
    w = random_array(rng, (k, *filt, c // groups), dtype, scale=1.0 / np.sqrt(max(1, np.prod(filt) * c // groups)))
    b = random_array(rng, (k,), dtype) if bias else None
    kw = dict(stride=stride, padding=padding, dilation=dilation, groups=groups, alpha=alpha, beta=beta,
              activation=activation)
    ref_shape = cuconv.reference.conv2d(x[:1], w, **{k_: v for k_, v in kw.items() if k_ in
                                                     ("stride", "padding", "dilation", "groups")}).shape
    out_shape = (n, *ref_shape[1:])
    r = random_array(rng, out_shape, dtype) if residual else None
    ref = cuconv.reference.conv2d(x, w, b, residual=r, **kw)
    xg, wg = cp.asarray(x), cp.asarray(w)
    bg = None if b is None else cp.asarray(b)
    rg = None if r is None else cp.asarray(r)
    out = rg if (in_place and rg is not None) else cp.full(out_shape, np.nan, dtype=x.dtype)
    with cuconv.overrides(sm80_subpath=subpath):
        e = cuconv.explain(xg, wg, bg, residual=rg, out=out, kernel="sm80_igemm", **kw)
        got = cuconv.conv2d(xg, wg, bg, residual=rg, out=out, kernel="sm80_igemm", **kw)
    assert got is out
    assert subpath in e.detail, e.detail
    assert_close(got, ref, dtype, context=f"{subpath} n={n} hw={hw} c={c} k={k} filt={filt} stride={stride} "
                                           f"pad={padding} dil={dilation} groups={groups} {kw}")


# ----------------------------------------------------------------------------- per sub-path, drawn
epilogues = st.fixed_dictionaries({
    "bias": st.booleans(), "residual": st.booleans(), "alpha": st.sampled_from([1.0, 0.5, -1.25]),
    "beta": st.sampled_from([1.0, 0.0, -2.0]), "activation": st.sampled_from([None, "relu", "silu", "gelu"])})


@settings(max_examples=30, deadline=None)
@given(c=st.sampled_from(ODD_CHANNELS), kg=st.integers(1, 24), groups=st.sampled_from([1, 1, 2, 3]),
       hw=st.tuples(st.integers(1, 11), st.integers(1, 11)), filt=st.tuples(st.integers(1, 5), st.integers(1, 4)),
       stride=st.tuples(st.integers(1, 3), st.integers(1, 2)), dilation=st.sampled_from([1, 1, 2]),
       pads=st.tuples(st.integers(0, 3), st.integers(0, 3), st.integers(0, 3), st.integers(0, 3)),
       n=st.integers(1, 3), ep=epilogues, seed=st.integers(0, 2**31 - 1))
def test_per_lane_drawn(cp, c, kg, groups, hw, filt, stride, dilation, pads, n, ep, seed):
    padding = ((pads[0], pads[1]), (pads[2], pads[3]))
    for size, f, (lo, hi) in zip(hw, filt, padding):  # output >= 1 in both dims
        assume(size + lo + hi >= (f - 1) * dilation + 1)
    run_conv(cp, subpath="per_lane", n=n, hw=hw, c=c * groups, k=kg * groups, filt=filt, stride=stride,
             padding=padding, dilation=dilation, groups=groups, seed=seed, **ep)


@settings(max_examples=20, deadline=None)
@given(cg=st.sampled_from([32, 64]), kg=st.sampled_from([8, 24, 40, 64]), groups=st.sampled_from([1, 2]),
       hw=st.tuples(st.integers(1, 9), st.integers(1, 9)), filt=st.tuples(st.integers(1, 3), st.integers(1, 3)),
       stride=st.integers(1, 2), pad=st.integers(0, 2), dilation=st.sampled_from([1, 2]),
       n=st.integers(1, 2), ep=epilogues, seed=st.integers(0, 2**31 - 1))
def test_uniform_drawn(cp, cg, kg, groups, hw, filt, stride, pad, dilation, n, ep, seed):
    for size, f in zip(hw, filt):
        assume(size + 2 * pad >= (f - 1) * dilation + 1)
    run_conv(cp, subpath="uniform", n=n, hw=hw, c=cg * groups, k=kg * groups, filt=filt, stride=stride,
             padding=pad, dilation=dilation, groups=groups, seed=seed, **ep)


@settings(max_examples=20, deadline=None)
@given(cg=st.sampled_from(ODD_CHANNELS + [32, 40]), kg=st.integers(1, 40), groups=st.sampled_from([1, 2]),
       hw=st.tuples(st.integers(1, 12), st.integers(1, 12)), n=st.integers(1, 3), ep=epilogues,
       seed=st.integers(0, 2**31 - 1))
def test_pointwise_drawn(cp, cg, kg, groups, hw, n, ep, seed):
    run_conv(cp, subpath="pointwise", n=n, hw=hw, c=cg * groups, k=kg * groups, filt=(1, 1), groups=groups,
             seed=seed, **ep)


# ----------------------------------------------------------------------------- fixed edge cases
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("subpath,c", [("per_lane", 3), ("per_lane", 8), ("uniform", 32), ("pointwise", 16)])
def test_each_subpath_both_dtypes(cp, dtype, subpath, c):
    filt = (1, 1) if subpath == "pointwise" else (3, 3)
    pad = 0 if subpath == "pointwise" else 1
    run_conv(cp, subpath=subpath, n=2, hw=(13, 10), c=c, k=24, filt=filt, padding=pad, dtype=dtype, bias=True,
             residual=True, beta=0.5, activation="relu", seed=11)


@pytest.mark.parametrize("subpath,c", [("per_lane", 3), ("per_lane", 5), ("uniform", 64)])
def test_halo_every_border(cp, subpath, c):
    # asymmetric padding wider than the filter reach on every side: rows and columns of pure halo
    # at the top, bottom, left and right of the output, and taps straddling each border.
    run_conv(cp, subpath=subpath, n=2, hw=(7, 6), c=c, k=16, filt=(5, 3), padding=((4, 3), (2, 3)),
             seed=3, bias=True)
    run_conv(cp, subpath=subpath, n=1, hw=(5, 9), c=c, k=16, filt=(3, 5), stride=2, dilation=(2, 1),
             padding=((3, 2), (4, 1)), seed=4)


@pytest.mark.parametrize("subpath,c", [("per_lane", 8), ("per_lane", 3), ("uniform", 32)])
def test_depthwise_and_grouped(cp, subpath, c):
    if subpath == "per_lane":
        run_conv(cp, subpath=subpath, n=2, hw=(9, 9), c=c, k=c, filt=(3, 3), padding=1, groups=c, seed=5)
        run_conv(cp, subpath=subpath, n=2, hw=(9, 9), c=4 * c, k=4 * c, filt=(3, 3), padding=1, groups=4, seed=6)
    else:
        run_conv(cp, subpath=subpath, n=2, hw=(9, 9), c=4 * c, k=64, filt=(3, 3), padding=1, groups=4, seed=7)


def test_resnext_grouped_block_small_batch(cp):
    # the benchmark's ResNeXt-50 grouped 3x3 (C = K = 128, groups = 32: Cg = Kg = 4) at N = 2
    run_conv(cp, subpath="per_lane", n=2, hw=(14, 14), c=128, k=128, filt=(3, 3), padding=1, groups=32, seed=8)


def test_resnet_stem_small_batch(cp):
    run_conv(cp, subpath="per_lane", n=1, hw=(64, 48), c=3, k=64, filt=(7, 7), stride=2, padding=3, seed=9,
             bias=True, activation="relu")


def test_in_place_residual(cp):
    run_conv(cp, subpath="uniform", n=2, hw=(8, 8), c=64, k=96, filt=(3, 3), padding=1, residual=True, beta=-2.0,
             in_place=True, seed=10)
    run_conv(cp, subpath="per_lane", n=2, hw=(8, 8), c=3, k=20, filt=(3, 3), padding=1, residual=True,
             in_place=True, seed=12)


def test_wide_n_configs(cp):
    # K/groups 128 and 256 pick the 128x128 and 128x256 tiles; M not a multiple of 128
    run_conv(cp, subpath="uniform", n=1, hw=(11, 13), c=64, k=256, filt=(3, 3), padding=1, seed=13, bias=True)
    run_conv(cp, subpath="pointwise", n=1, hw=(11, 13), c=64, k=200, filt=(1, 1), seed=14)


def test_explain_names_subpath_and_declines_float32(cp):
    x = cp.asarray(np.ones((1, 8, 8, 3), dtype=DTYPES["bfloat16"]))
    w = cp.asarray(np.ones((8, 3, 3, 3), dtype=DTYPES["bfloat16"]))
    e = cuconv.explain(x, w, padding=1, kernel="sm80_igemm")
    assert "per_lane" in e.detail
    xf, wf = x.astype(cp.float32), w.astype(cp.float32)
    e = cuconv.explain(xf, wf, padding=1)
    assert "float32" in e.declined["sm80_igemm"]
    with pytest.raises(cuconv.KernelDeclined, match="float32"):
        cuconv.conv2d(xf, wf, padding=1, kernel="sm80_igemm")
    with cuconv.overrides(sm80_subpath="uniform"), pytest.raises(cuconv.KernelDeclined, match="uniform"):
        cuconv.conv2d(x, w, padding=1, kernel="sm80_igemm")


# ----------------------------------------------------------------------------- loader debug entry
@pytest.mark.parametrize("subpath,c,groups,filt,stride,pad", [
    ("per_lane", 3, 1, (7, 7), 2, 3),
    ("per_lane", 5, 1, (3, 3), 1, 1),
    ("per_lane", 8, 2, (3, 3), 1, 2),
    ("uniform", 64, 1, (3, 3), 2, 1),
    ("uniform", 64, 2, (3, 3), 1, 1),
    ("pointwise", 24, 1, (1, 1), 1, 0),
    ("pointwise", 64, 2, (1, 1), 1, 0),
])
def test_stage_a_tile_matches_numpy_model(cp, subpath, c, groups, filt, stride, pad):
    rng = np.random.default_rng(21)
    n, h, w_ = 2, 13, 11
    x = random_array(rng, (n, h, w_, c), "bfloat16")
    p = ConvProblem.create(nd=2, batch=n, in_spatial=(h, w_), channels=c, out_channels=8 * groups,
                           filter_spatial=filt, stride=stride, dilation=1, padding=pad, groups=groups,
                           dtype="bfloat16", layout="NHWC")
    cfg = conv_config(p, subpath)
    xg = cp.asarray(x)
    m_offsets = [0, cfg.bm, max(0, p.gemm_m - cfg.bm // 2)]      # first, second, ragged last tile
    k_offsets = sorted({0, BLOCK_K * ((p.gemm_k - 1) // BLOCK_K)})  # first and last K tile
    for group in range(groups):
        for m0 in m_offsets:
            for k0 in k_offsets:
                got = stage_a_tile(xg, p, m0, k0, group=group, subpath=subpath)
                want = loader_tile(x, p, m0, k0, cfg.bm, BLOCK_K, subpath, group)
                np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16),
                                              err_msg=f"{subpath} group {group} m {m0} k {k0}")


# ----------------------------------------------------------------------------- matmul
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("m,n,k", [(1, 1, 1), (7, 13, 5), (129, 67, 33), (200, 256, 64), (300, 520, 1000),
                                   (64, 48, 40)])
def test_matmul_vs_numpy(cp, dtype, m, n, k):
    rng = np.random.default_rng(m * 1000 + n + k)
    a = random_array(rng, (m, k), dtype)
    b = random_array(rng, (k, n), dtype, scale=1 / np.sqrt(k))
    bias = random_array(rng, (n,), dtype)
    res = random_array(rng, (m, n), dtype)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    ref = np.maximum(0.5 * ref + bias.astype(np.float64) - 2.0 * res.astype(np.float64), 0)
    out = cp.full((m, n), np.nan, dtype=a.dtype)
    got = cuconv.matmul(cp.asarray(a), cp.asarray(b), bias=cp.asarray(bias), residual=cp.asarray(res), alpha=0.5,
                        beta=-2.0, activation="relu", out=out)
    assert got is out
    assert_close(got, ref, dtype, context=f"matmul {m}x{n}x{k}")
    plain = cuconv.matmul(cp.asarray(a), cp.asarray(b))
    assert isinstance(plain, cp.ndarray) and plain.dtype == a.dtype
    assert_close(plain, a.astype(np.float64) @ b.astype(np.float64), dtype)


def test_matmul_in_place_and_strided(cp):
    rng = np.random.default_rng(5)
    a = random_array(rng, (96, 80), "bfloat16")
    b = random_array(rng, (80, 40), "bfloat16")
    r = random_array(rng, (96, 40), "bfloat16")
    out = cp.asarray(r)
    got = cuconv.matmul(cp.asarray(a), cp.asarray(b), residual=out, out=out)
    assert got is out
    assert_close(got, a.astype(np.float64) @ b.astype(np.float64) + r.astype(np.float64), "bfloat16")
    at = cp.asarray(np.ascontiguousarray(a.T)).T  # non-contiguous view
    assert_close(cuconv.matmul(at, cp.asarray(b)), a.astype(np.float64) @ b.astype(np.float64), "bfloat16")


def test_matmul_float32_gpu(cp):
    rng = np.random.default_rng(6)
    a = rng.standard_normal((33, 17)).astype(np.float32)
    b = rng.standard_normal((17, 9)).astype(np.float32)
    got = cuconv.matmul(cp.asarray(a), cp.asarray(b), activation="gelu")
    ref = a.astype(np.float64) @ b
    ref = 0.5 * ref * (1 + np.vectorize(__import__("math").erf)(ref / np.sqrt(2)))
    assert_close(got, ref, "float32")


# ----------------------------------------------------------------------------- grouped_mma / pad_channels
@settings(max_examples=30, deadline=None)
@given(cg=st.sampled_from([1, 2, 4, 8, 16]), super_blocks=st.sampled_from([8, 16, 32, 40, 64, 96, 128]),
       hw=st.tuples(st.integers(1, 12), st.integers(1, 12)), filt=st.tuples(st.integers(1, 5), st.integers(1, 5)),
       stride=st.tuples(st.integers(1, 2), st.integers(1, 3)), dilation=st.sampled_from([1, 1, 2]),
       pads=st.tuples(st.integers(0, 3), st.integers(0, 3), st.integers(0, 3), st.integers(0, 3)),
       n=st.integers(1, 3), dtype=st.sampled_from(["bfloat16", "float16"]), ep=epilogues,
       seed=st.integers(0, 2**31 - 1))
def test_grouped_mma_drawn(cp, cg, super_blocks, hw, filt, stride, dilation, pads, n, dtype, ep, seed):
    # C = K a multiple of 8 (40, 96: partial 32-channel superblocks), Cg = Kg in {1, 2, 4, 8, 16}
    # (cg = 1 is depthwise), asymmetric halo on every border, every epilogue combination.
    c = max(super_blocks, cg * 2)
    assume(c % cg == 0)
    padding = ((pads[0], pads[1]), (pads[2], pads[3]))
    for size, f, (lo, hi) in zip(hw, filt, padding):
        assume(size + lo + hi >= (f - 1) * dilation + 1)
    run_conv(cp, subpath="grouped_mma", n=n, hw=hw, c=c, k=c, filt=filt, stride=stride, padding=padding,
             dilation=dilation, groups=c // cg, dtype=dtype, seed=seed, **ep)


@pytest.mark.parametrize("cg", [1, 2, 4, 8, 16])
def test_grouped_mma_each_group_size(cp, cg):
    run_conv(cp, subpath="grouped_mma", n=2, hw=(9, 11), c=64, k=64, filt=(3, 3), padding=1, groups=64 // cg,
             seed=30 + cg, bias=True, residual=True, beta=-0.5, activation="silu")


def test_grouped_mma_resnext_and_depthwise_auto(cp):
    # the benchmark's ResNeXt-50 layer at N = 2 (picked automatically), a 7x7 depthwise, in-place residual
    x = cp.asarray(np.ones((1, 8, 8, 128), dtype=DTYPES["bfloat16"]))
    w = cp.asarray(np.ones((128, 3, 3, 4), dtype=DTYPES["bfloat16"]))
    assert "grouped_mma" in cuconv.explain(x, w, padding=1, groups=32, kernel="sm80_igemm").detail
    run_conv(cp, subpath="grouped_mma", n=2, hw=(14, 14), c=128, k=128, filt=(3, 3), padding=1, groups=32, seed=40,
             bias=True, activation="relu")
    run_conv(cp, subpath="grouped_mma", n=2, hw=(13, 9), c=48, k=48, filt=(7, 7), padding=3, groups=48, seed=41)
    run_conv(cp, subpath="grouped_mma", n=2, hw=(8, 8), c=64, k=64, filt=(3, 3), padding=1, groups=16,
             residual=True, in_place=True, seed=42)


def test_grouped_mma_misaligned_views(cp):
    # x, out and residual as views 2 bytes off their allocation: x is realigned, stores go scalar
    rng = np.random.default_rng(43)
    x = random_array(rng, (2, 6, 7, 32), "bfloat16")
    w = random_array(rng, (32, 3, 3, 4), "bfloat16", scale=1 / 6)
    r = random_array(rng, (2, 6, 7, 32), "bfloat16")
    ref = cuconv.reference.conv2d(x, w, residual=r, padding=1, groups=8)
    xb = cp.empty(x.size + 1, dtype=x.dtype)
    xb[1:] = cp.asarray(x.reshape(-1))
    ob = cp.full(x.size + 1, np.nan, dtype=x.dtype)
    rb = cp.empty(x.size + 1, dtype=x.dtype)
    rb[1:] = cp.asarray(r.reshape(-1))
    xv, ov, rv = xb[1:].reshape(x.shape), ob[1:].reshape(x.shape), rb[1:].reshape(x.shape)
    with cuconv.overrides(sm80_subpath="grouped_mma"):
        got = cuconv.conv2d(xv, cp.asarray(w), residual=rv, out=ov, padding=1, groups=8, kernel="sm80_igemm")
    assert_close(got, ref, "bfloat16")
    np.testing.assert_array_equal(cp.asnumpy(xv).view(np.uint16), x.view(np.uint16))  # caller's x untouched


@settings(max_examples=25, deadline=None)
@given(c=st.sampled_from([1, 3, 5, 7]), k=st.integers(1, 70), hw=st.tuples(st.integers(1, 13), st.integers(1, 13)),
       filt=st.tuples(st.integers(1, 7), st.integers(2, 7)), stride=st.tuples(st.integers(1, 3), st.integers(1, 4)),
       pads=st.tuples(st.integers(0, 3), st.integers(0, 3), st.integers(0, 3), st.integers(0, 3)),
       dilation=st.sampled_from([1, 1, 2]), n=st.integers(1, 3), dtype=st.sampled_from(["bfloat16", "float16"]),
       ep=epilogues, seed=st.integers(0, 2**31 - 1))
def test_pad_channels_drawn(cp, c, k, hw, filt, stride, pads, dilation, n, dtype, ep, seed):
    # W strides 2..4 with W dilation 1 and S >= stride take the folded layout (sm80.pad.pad_plan)
    padding = ((pads[0], pads[1]), (pads[2], pads[3]))
    for size, f, (lo, hi) in zip(hw, filt, padding):
        assume(size + lo + hi >= (f - 1) * dilation + 1)
    run_conv(cp, subpath="pad_channels", n=n, hw=hw, c=c, k=k, filt=filt, stride=stride, padding=padding,
             dilation=dilation, dtype=dtype, seed=seed, **ep)


@pytest.mark.parametrize("c,hw,filt,stride,padding,fold", [
    (3, (32, 32), (4, 4), 4, 0, 4),            # ViT-style 4x4 stride-4 patchify: 4 pixels -> 16 channels
    (5, (21, 19), (3, 5), 2, (1, 2), 2),       # C 5 -> 8: 2 pixels -> 16 channels, odd S, asymmetric W halo
    (1, (17, 30), (7, 7), (1, 3), 3, 3),       # W stride 3: 3 pixels -> 12 channels (8-byte copies)
    (3, (15, 16), (3, 3), 2, 1, 2),            # W + 2*pad not a multiple of the fold
])
def test_pad_channels_folded_layouts(cp, c, hw, filt, stride, padding, fold):
    p = ConvProblem.create(nd=2, batch=2, in_spatial=hw, channels=c, out_channels=24, filter_spatial=filt,
                           stride=stride, dilation=1, padding=padding, groups=1, dtype="bfloat16", layout="NHWC")
    assert pad_plan(p).fold == fold
    run_conv(cp, subpath="pad_channels", n=2, hw=hw, c=c, k=24, filt=filt, stride=stride, padding=padding,
             seed=51 + fold, bias=True, residual=True, beta=0.5, activation="gelu")


def test_pad_channels_stem_leaves_inputs_alone(cp):
    rng = np.random.default_rng(50)
    x = random_array(rng, (2, 40, 36, 3), "bfloat16")
    w = random_array(rng, (64, 7, 7, 3), "bfloat16", scale=1 / 12)
    b = random_array(rng, (64,), "bfloat16")
    xg, wg = cp.asarray(x), cp.asarray(w)
    e = cuconv.explain(xg, wg, padding=3, stride=2, kernel="sm80_igemm")
    assert "pad_channels" in e.detail and "3 -> 4" in e.detail and "folded 2 pixels -> 1 of 8 channels" in e.detail
    assert "tile 64x64x32" in e.detail  # the short-reduction config (sm80.variants.SHORT_K_CONFIG)
    got = cuconv.conv2d(xg, wg, cp.asarray(b), padding=3, stride=2, activation="relu", kernel="sm80_igemm")
    assert_close(got, cuconv.reference.conv2d(x, w, b, padding=3, stride=2, activation="relu"), "bfloat16")
    np.testing.assert_array_equal(cp.asnumpy(xg).view(np.uint16), x.view(np.uint16))
    np.testing.assert_array_equal(cp.asnumpy(wg).view(np.uint16), w.view(np.uint16))


def test_scratch_buffers_are_reused_per_stream_and_released(cp):
    # the pad_channels copies live in per-stream scratch buffers (cuconv.scratch), reused by later calls
    from cuconv import scratch
    rng = np.random.default_rng(60)
    x = random_array(rng, (2, 30, 30, 3), "bfloat16")
    w = random_array(rng, (16, 7, 7, 3), "bfloat16", scale=1 / 12)
    ref = cuconv.reference.conv2d(x, w, padding=3, stride=2)
    xg, wg = cp.asarray(x), cp.asarray(w)
    cuconv.release_scratch()
    assert scratch.scratch_bytes() == 0
    first = cuconv.conv2d(xg, wg, padding=3, stride=2, kernel="sm80_igemm")
    held = scratch.scratch_bytes()
    assert held > 0
    again = cuconv.conv2d(xg, wg, padding=3, stride=2, kernel="sm80_igemm")
    assert scratch.scratch_bytes() == held  # reused, not grown
    with cp.cuda.Stream(non_blocking=True) as s:
        other = cuconv.conv2d(xg, wg, padding=3, stride=2, kernel="sm80_igemm")
        s.synchronize()
    assert scratch.scratch_bytes() == 2 * held  # a second stream gets its own buffers
    for got in (first, again, other):
        assert_close(got, ref, "bfloat16")
    cuconv.release_scratch()
    assert scratch.scratch_bytes() == 0
