"""``sm90_fold``: the filter's width folded into the channels (kernels_cu/layout/fold_width.cu), then the Hopper
kernel. On the CPU: the folded convolution equals the original on drawn geometry (the proof of
:mod:`cuconv.models.fold`), the folded problem the plan runs is that one, and the dispatcher's choices.
On a Hopper GPU: the kernel's fold equals the model bit for bit, and forced calls equal the reference.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import cuconv
from cuconv import dispatch
from cuconv.backends.sm90.fold import fold_width_problem
from cuconv.models.fold import fold_w, fold_x, fold_rows, padded_channels
from cuconv.problem import ConvProblem, Epilogue

from conftest import assert_close, needs_hopper, random_array
from geometry import H100


@st.composite
def folds(draw):
    """A conv2d with few channels: C 1-9, filters up to 7 wide, strides, dilations, asymmetric padding."""
    c, k = draw(st.integers(1, 9)), draw(st.integers(1, 6))
    r, s = draw(st.integers(1, 4)), draw(st.integers(1, 7))
    sh, sw, dh, dw = (draw(st.integers(1, 3)) for _ in range(4))
    pads = tuple(draw(st.integers(0, 3)) for _ in range(4))
    h = draw(st.integers((r - 1) * dh + 1, (r - 1) * dh + 12))
    w = draw(st.integers((s - 1) * dw + 1, (s - 1) * dw + 12))
    return dict(shape=(draw(st.integers(1, 2)), h, w, c), k=k, filt=(r, s), stride=(sh, sw), dilation=(dh, dw),
                padding=((pads[0], pads[1]), (pads[2], pads[3])), seed=draw(st.integers(0, 2**31 - 1)))


@settings(max_examples=150, deadline=None)
@given(case=folds())
def test_the_folded_convolution_is_the_original(case):
    """conv(x, w) == conv(fold_x(x), fold_w(w)) under an R x 1 filter (float64, CPU): the fold's geometry
    (its column formula, padding taken into the fold, channel padding to 8) is exact."""
    rng = np.random.default_rng(case["seed"])
    x = rng.standard_normal(case["shape"])
    (r, s), c = case["filt"], case["shape"][-1]
    w = rng.standard_normal((case["k"], r, s, c))
    kw = dict(stride=case["stride"], dilation=case["dilation"], padding=case["padding"])
    want = cuconv.conv2d(x, w, **kw)
    q = want.shape[2]
    xf = fold_x(x, s, case["stride"][1], case["dilation"][1], case["padding"][1][0], q)
    wf = fold_w(w)
    assert xf.shape[-1] == wf.shape[-1] == s * padded_channels(c)
    got = cuconv.conv2d(xf, wf, stride=(case["stride"][0], 1), dilation=(case["dilation"][0], 1),
                        padding=(case["padding"][0], (0, 0)))
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    # the plan's folded problem is that convolution
    p = ConvProblem.create(nd=2, batch=x.shape[0], in_spatial=x.shape[1:3], channels=c, out_channels=case["k"],
                           filter_spatial=(r, s), stride=case["stride"], dilation=case["dilation"],
                           padding=case["padding"], groups=1, dtype="bfloat16", layout="NHWC", epilogue=Epilogue())
    fp = fold_width_problem(p, padded_channels(c), "bfloat16", "NHWC")
    assert fp.x_shape == xf.shape and fp.w_shape == wf.shape and fp.out_shape == want.shape


def test_fold_rows_is_the_kernel_formula():
    src = np.arange(2 * 5 * 3).reshape(2, 5, 3) + 1
    out = fold_rows(src, taps=2, stride=2, dil=3, pad=1, dst_w=3)  # column of (q, s): 2q - 1 + 3s
    assert out.shape == (2, 3, 16)
    for q in range(3):
        for s in range(2):
            col = 2 * q - 1 + 3 * s
            want = src[:, col] if 0 <= col < 5 else np.zeros((2, 3), src.dtype)
            np.testing.assert_array_equal(out[:, q, 8 * s:8 * s + 3], want)
            assert not out[:, q, 8 * s + 3:8 * s + 8].any()


def _problem(c, k, filt, **kw):
    return ConvProblem.create(nd=2, batch=2, in_spatial=(32, 32), channels=c, out_channels=k, filter_spatial=filt,
                              stride=kw.get("stride", (1, 1)), dilation=(1, 1),
                              padding=kw.get("padding", ((1, 1), (1, 1))), groups=kw.get("groups", 1),
                              dtype=kw.get("dtype", "bfloat16"), layout=kw.get("layout", "NHWC"), epilogue=Epilogue())


def test_dispatch_runs_it_only_when_asked():
    """Below sm80_igemm's priority: listed by explain, chosen only with kernel="sm90_fold"."""
    p = _problem(4, 64, (3, 3))
    plan, ex = dispatch.select(p, H100)
    assert plan.kernel.name != "sm90_fold"
    assert "sm90_fold" in ex.skipped, ex.skipped  # would accept, lower priority
    forced, _ = dispatch.select(p, H100, forced="sm90_fold")
    assert forced.inner.problem == fold_width_problem(p, 8, "bfloat16", "NHWC")
    assert "3 columns x 8 channels" in forced.describe()
    nchw, _ = dispatch.select(_problem(3, 64, (7, 7), stride=(2, 2), padding=((3, 3), (3, 3)), layout="NCHW"), H100,
                              forced="sm90_fold")
    assert nchw.writes_channels_first and nchw.inner.problem.layout == "NCHW"


@pytest.mark.parametrize("kw,why", [
    (dict(c=24, filt=(3, 3)), "fill more than one 64-channel block"),
    (dict(c=8, filt=(1, 1)), "nothing to fold"),
    (dict(c=4, filt=(3, 3), groups=2), "groups=2"),
])
def test_declines(kw, why):
    p = _problem(kw["c"], 64, kw["filt"], groups=kw.get("groups", 1))
    with pytest.raises(cuconv.KernelDeclined, match=why):
        dispatch.select(p, H100, forced="sm90_fold")


# ----------------------------------------------------------------------------------------------- GPU
gpu = pytest.mark.gpu


@gpu
@needs_hopper
@pytest.mark.parametrize("c,taps,stride,dil,pad", [(3, 7, 2, 1, 3), (4, 3, 1, 1, 1), (1, 4, 4, 1, 0), (8, 3, 1, 2, 2),
                                                   (5, 5, 3, 1, 0)])
def test_kernel_fold_is_the_model_bit_for_bit(cp, c, taps, stride, dil, pad):
    from cuconv.backends.sm90.fold import FoldWidth
    rng = np.random.default_rng(c * 100 + taps)
    x = rng.integers(0, 2**16, size=(3, 11, 37, c), dtype=np.uint16)
    q = (37 + 2 * pad - dil * (taps - 1) - 1) // stride + 1
    want = fold_rows(x.reshape(33, 37, c), taps, stride, dil, pad, q)
    dst = cp.full((33, q, taps * padded_channels(c)), 0xFFFF, dtype=cp.uint16)
    FoldWidth(0, 33 * q, c, taps, stride, dil, pad, 37, q)(cp.asarray(x), dst)
    np.testing.assert_array_equal(dst.get(), want)


@gpu
@needs_hopper
@pytest.mark.parametrize("c,taps,stride,dil,pad", [(3, 7, 2, 1, 3), (4, 3, 1, 1, 1), (1, 4, 4, 1, 0), (3, 3, 1, 2, 2),
                                                   (5, 5, 3, 1, 0), (7, 7, 1, 1, 3)])
def test_kernel_dense_fold_is_the_model_bit_for_bit(cp, c, taps, stride, dil, pad):
    """``fold_width_dense`` equals ``fold_x_dense`` (every element written, the padding zeros included), and
    ``unfold_channels`` equals ``unfold_w_dense``."""
    from cuconv.backends.sm90.fold import DenseFoldWidth, UnfoldChannels
    from cuconv.models.fold import fold_x_dense, unfold_w_dense
    rng = np.random.default_rng(c * 100 + taps)
    x = rng.integers(0, 2**16, size=(3, 11, 37, c), dtype=np.uint16)
    q = (37 + 2 * pad - dil * (taps - 1) - 1) // stride + 1
    want = fold_x_dense(x, taps, stride, dil, pad, q)
    dst = cp.full(want.shape, 0xFFFF, dtype=cp.uint16)
    DenseFoldWidth(0, 33 * q, c, taps, stride, dil, pad, 37, q)(cp.asarray(x), dst)
    np.testing.assert_array_equal(dst.get(), want)
    wf = rng.integers(0, 2**16, size=(5, 3, 1, want.shape[-1]), dtype=np.uint16)
    got = cp.full((5, 3, taps, c), 0xFFFF, dtype=cp.uint16)
    UnfoldChannels(0, 15, taps * c, want.shape[-1])(cp.asarray(wf), got)
    np.testing.assert_array_equal(got.get(), unfold_w_dense(wf, taps, c))


@st.composite
def gpu_cases(draw):
    c = draw(st.sampled_from([1, 2, 3, 4, 5, 6, 7, 8, 12, 16]))
    s = draw(st.integers(1, max(1, min(7, 64 // padded_channels(c)))))
    if s == 1 and c % 8 == 0:
        s = 2
    r = draw(st.integers(1, 7))
    k = draw(st.sampled_from([8, 16, 64, 96]))
    stride = (draw(st.integers(1, 4)), draw(st.integers(1, 4)))
    pads = ((draw(st.integers(0, 3)), draw(st.integers(0, 3))), (draw(st.integers(0, 3)), draw(st.integers(0, 3))))
    h, w = draw(st.integers(r, 40)), draw(st.integers(s, 40))
    return dict(shape=(draw(st.integers(1, 3)), h, w, c), k=k, filt=(r, s), stride=stride, padding=pads,
                dtype=draw(st.sampled_from(["bfloat16", "float16"])), layout=draw(st.sampled_from(["NHWC", "NCHW"])),
                bias=draw(st.booleans()), residual=draw(st.booleans()),
                activation=draw(st.sampled_from([None, "relu", "gelu"])), seed=draw(st.integers(0, 2**31 - 1)))


@gpu
@needs_hopper
def test_forced_fold_matches_the_reference(cp):
    @settings(max_examples=60, deadline=None)
    @given(case=gpu_cases())
    def prop(case):
        rng = np.random.default_rng(case["seed"])
        dt, (r, s), c, k = case["dtype"], case["filt"], case["shape"][-1], case["k"]
        x = random_array(rng, case["shape"], dt)
        w = random_array(rng, (k, r, s, c), dt, 1 / np.sqrt(r * s * c))
        kw = dict(stride=case["stride"], padding=case["padding"], activation=case["activation"])
        b = random_array(rng, (k,), dt) if case["bias"] else None
        ref_shape = cuconv.reference.conv2d(x[:, :, :, :], w, **kw).shape
        res = random_array(rng, ref_shape, dt) if case["residual"] else None
        ref = cuconv.reference.conv2d(x, w, b, residual=res, **kw)
        if case["layout"] == "NCHW":
            to_cf = lambda a: None if a is None else np.ascontiguousarray(np.moveaxis(a, -1, 1))  # noqa: E731
            xg, wg, rg = cp.asarray(to_cf(x)), cp.asarray(to_cf(w)), None if res is None else cp.asarray(to_cf(res))
            got = cuconv.conv2d(xg, wg, None if b is None else cp.asarray(b), residual=rg, layout="NCHW",
                                kernel="sm90_fold", **kw)
            got = np.moveaxis(got.get(), 1, -1)
        else:
            got = cuconv.conv2d(cp.asarray(x), cp.asarray(w), None if b is None else cp.asarray(b),
                                residual=None if res is None else cp.asarray(res), kernel="sm90_fold", **kw)
        assert_close(got, ref, dt, str(case))

    prop()


@gpu
@needs_hopper
def test_network_stems_through_the_fold(cp):
    """The RGB stems and the latent input layers of the networks suite, forced onto the fold."""
    rng = np.random.default_rng(3)
    for shape, k, f, stride, pad in [((2, 224, 224, 3), 64, 7, 2, 3), ((2, 224, 224, 3), 96, 4, 4, 0),
                                     ((1, 64, 64, 4), 512, 3, 1, 1), ((2, 96, 96, 3), 32, 3, 2, 1)]:
        x = random_array(rng, shape, "bfloat16")
        w = random_array(rng, (k, f, f, shape[-1]), "bfloat16", 1 / np.sqrt(f * f * shape[-1]))
        assert cuconv.explain(cp.asarray(x), cp.asarray(w), stride=stride, padding=pad,
                              kernel="sm90_fold").kernel == "sm90_fold"
        got = cuconv.conv2d(cp.asarray(x), cp.asarray(w), stride=stride, padding=pad, kernel="sm90_fold")
        assert_close(got, cuconv.reference.conv2d(x, w, stride=stride, padding=pad), "bfloat16", str(shape))


@settings(max_examples=60, deadline=None)
@given(case=folds())
def test_the_folded_weight_gradient_unfolds_into_the_original(case):
    """The weight gradient of the densely folded convolution (``sm90_wgrad`` on few-channel x,
    :func:`cuconv.backends.sm90.wgrad.folded_width`) unfolded by ``unfold_w_dense`` is the original's
    (float64, CPU), where the fold applies; the problem it computes is that of ``fold_x_dense``."""
    from unittest import mock
    from cuconv.backends.sm90 import wgrad as w90
    from cuconv.models.fold import fold_x_dense, unfold_w_dense
    rng = np.random.default_rng(case["seed"])
    (r, s), c = case["filt"], case["shape"][-1]
    kw = dict(stride=case["stride"], dilation=case["dilation"], padding=case["padding"])
    x = rng.standard_normal(case["shape"])
    p = ConvProblem.create(nd=2, batch=x.shape[0], in_spatial=x.shape[1:3], channels=c, out_channels=case["k"],
                           filter_spatial=(r, s), dilation=case["dilation"], stride=case["stride"],
                           padding=case["padding"], groups=1, dtype="bfloat16", layout="NHWC", epilogue=Epilogue())
    with mock.patch.object(w90, "FOLD_MIN_PIXELS", 0):  # the geometry, whatever the size
        pf = w90.folded_width(p)
    if c % 8 == 0 or padded_channels(s * c) > 64:
        assert pf is None
        return
    dy = rng.standard_normal(p.out_shape)
    want = cuconv.conv2d_weight_grad(x, dy, (case["k"], r, s, c), **kw)
    xf = fold_x_dense(x, s, case["stride"][1], case["dilation"][1], case["padding"][1][0], p.out_spatial[1])
    assert pf.x_shape == xf.shape and pf.out_shape == dy.shape and xf.shape[-1] == padded_channels(s * c)
    got = cuconv.conv2d_weight_grad(xf, dy, pf.w_shape, stride=pf.stride, dilation=pf.dilation,
                                    padding=tuple(zip(pf.pad_lo, pf.pad_hi)))
    np.testing.assert_allclose(unfold_w_dense(got, s, c), want, rtol=1e-12, atol=1e-12)


def test_folded_weight_gradient_declines():
    """No fold for channels a multiple of 8, groups, a filter whose columns fill more than one 64-channel block,
    fewer output pixels than FOLD_MIN_PIXELS, or a folded x over FOLD_MAX_BYTES; fold_declined says why."""
    from cuconv.backends.sm90.wgrad import FOLD_MAX_BYTES, FOLD_MIN_PIXELS, fold_declined, folded_width

    def prob(c=3, s=7, groups=1, n=2, hw=256):
        return ConvProblem.create(nd=2, batch=n, in_spatial=(hw, hw), channels=c, out_channels=8 * groups,
                                  filter_spatial=(3, s), stride=1, dilation=1, padding=1, groups=groups,
                                  dtype="bfloat16", layout="NHWC", epilogue=Epilogue())
    assert folded_width(prob()) is not None
    assert folded_width(prob(c=16)) is None
    assert folded_width(prob(c=6, groups=2)) is None
    assert folded_width(prob(c=7, s=10)) is None      # 7 x 10 = 70 channels
    assert prob().gemm_m >= FOLD_MIN_PIXELS > prob(hw=64).gemm_m
    assert folded_width(prob(hw=64)) is None and "output pixels" in fold_declined(prob(hw=64))
    big = prob(n=64, hw=1024)
    assert math.prod(folded_width(prob(n=1, hw=1024)).x_shape) * 2 <= FOLD_MAX_BYTES
    assert folded_width(big) is None and "bytes" in fold_declined(big)
    assert "64-channel block" in fold_declined(prob(c=7, s=10))  # 70 channels
