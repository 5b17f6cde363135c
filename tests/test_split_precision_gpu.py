"""``sm90_bf16x3`` on a Hopper GPU: float32 convolutions within 1e-5 of float64 (gpu marker).

* the split kernel against its NumPy model (hi = bf16(v), lo = bf16(v - hi)), bit for bit;
* drawn conv2d and conv3d calls (any C and K, stride, dilation, padding, every epilogue term, NHWC and
  NCHW, precision "float32" and "tf32") against the float64 reference, each output within the split's
  bound (3 * 2^-16 of the convolution of |x| and |w|, tests/test_split_precision.py, plus the epilogue's
  fp32 rounding): drawn problems are small, so a norm-relative figure would measure cancellation;
* network-sized layers within 1e-5 of the float64 result's norm (what precision "float32" promises);
* the residual read in place (``out`` is the residual), misaligned views, equal bits on two runs;
* where C is a multiple of 16, x split in the kernel's registers (the filter split per 16 channels):
  the same bounds on drawn conv2d and conv3d calls, and infinities kept out of lo.
"""

from __future__ import annotations

import dataclasses

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import cuconv
from cuconv.backends.sm90.split_precision import W_PARTS, X_PARTS, padded_channels, split_bf16x3
from cuconv.backends.smallc.variants import MAX_C, MAX_TAPS_F32

from conftest import needs_hopper, rel_error
from geometry import cases, make_operands, narrowk_takes, smallc_takes

pytestmark = [pytest.mark.gpu, needs_hopper]

BOUND = 1e-5  # what precision "float32" promises (cuconv.problem.PRECISION_MEANING)


def assert_within_split_bound(got, ref, operands, kwargs, nd=2, product_bound=3.2 * 2.0 ** -16):
    """Each output within the products' bound (``product_bound`` of |alpha| (|x| (*) |w|); by default the
    split products', :func:`test_split_precision.split_error_bound`), times 1.2 for the activation's
    slope (gelu's is at most 1.13), plus 2^-20 of the epilogue's terms and of the result (fp32 rounding,
    exp/erf). ``operands``: host copies of x, w, bias, residual (None where absent) taken before the call."""
    import cuconv.reference as reference
    host = [None if a is None else np.abs(np.asarray(a, np.float64)) for a in operands]
    geometry = {k: kwargs[k] for k in ("stride", "padding", "dilation", "layout", "groups") if k in kwargs}
    conv = reference.conv2d if nd == 2 else reference.conv3d
    mags = conv(host[0], host[1], **geometry)
    alpha, beta = abs(kwargs.get("alpha", 1.0)), abs(kwargs.get("beta", 1.0))
    terms = alpha * mags + (0 if host[2] is None else _per_channel(host[2], mags.shape, kwargs["layout"])) + (
        0 if host[3] is None else beta * host[3])
    bound = 1.2 * product_bound * alpha * mags + 2.0 ** -20 * (terms + np.abs(ref)) + 1e-30
    diff = np.abs(np.asarray(got.get(), np.float64) - ref)
    worst = np.unravel_index(np.argmax(diff / bound), diff.shape)
    assert np.all(diff <= bound), (f"output {worst}: error {diff[worst]:.3g} > bound {bound[worst]:.3g} "
                                   f"(|x| (*) |w| = {mags[worst]:.3g})")


def _per_channel(b, shape, layout):
    """A bias of K values broadcast over an output of ``shape`` in ``layout``."""
    return b if layout in ("NHWC", "NDHWC") else b.reshape((-1,) + (1,) * (len(shape) - 2))


def _split_model(a: np.ndarray, lo_parts: int, parts: int = 3) -> np.ndarray:
    hi = a.astype(ml_dtypes.bfloat16)
    finite = np.isfinite(hi.astype(np.float32))  # a non-finite hi: hi 0, the whole value in lo
    lo = np.where(finite, (a - np.where(finite, hi.astype(np.float32), 0)).astype(ml_dtypes.bfloat16), hi)
    hi = np.where(finite, hi, np.zeros_like(hi))
    c, cp_ = a.shape[-1], padded_channels(a.shape[-1])
    pad = [(0, 0)] * (a.ndim - 1) + [(0, cp_ - c)]
    blocks = [np.pad((lo if lo_parts >> b & 1 else hi).view(np.uint16), pad) for b in range(parts)]
    return np.concatenate(blocks, axis=-1)


@pytest.mark.parametrize("shape", [(3, 5, 7, 3), (2, 4, 4, 8), (1, 3, 3, 13), (64, 3, 3, 64), (5, 100)])
@pytest.mark.parametrize("lo_parts,parts", [(X_PARTS, 3), (X_PARTS, 2), (W_PARTS, 3)])
def test_split_matches_its_model(cp, shape, lo_parts, parts):
    r = np.random.default_rng(sum(shape))
    a = (r.standard_normal(shape) * np.exp(r.uniform(-20, 20, shape))).astype(np.float32)
    a.flat[::7] = 0.0
    got = split_bf16x3(cp.asarray(a), lo_parts, parts)
    np.testing.assert_array_equal(cp.asnumpy(got), _split_model(a, lo_parts, parts))


@pytest.mark.parametrize("fold", [
    dict(taps=7, stride=2, dil=1, pad=3, src_w=23, dst_w=12),   # an RGB stem's x
    dict(taps=3, stride=1, dil=2, pad=1, src_w=9, dst_w=8),
    dict(taps=7, stride=0, dil=1, pad=0, src_w=7, dst_w=1),     # a stem's w: (K * R) rows of 7 taps
])
def test_folded_split_matches_its_model(cp, fold):
    """The width fold (split_bf16.cu's gather of S columns per output column) against the NumPy model
    of tests/test_split_precision.py."""
    from cuconv.backends.sm90.split_precision import _Split
    from test_split_precision import split_model
    r = np.random.default_rng(fold["taps"] + fold["src_w"])
    rows_src = 5 * fold["src_w"]
    a = r.standard_normal((rows_src, 3)).astype(np.float32)
    rows = rows_src // fold["src_w"] * fold["dst_w"]
    want = split_model(a, X_PARTS, 3, fold)
    got = cp.empty((rows, fold["taps"] * 3 * padded_channels(3)), dtype=cp.uint16)
    _Split(0, rows, 3, X_PARTS, 3, fold)(cp.asarray(a), got)
    np.testing.assert_array_equal(cp.asnumpy(got).view(ml_dtypes.bfloat16).astype(np.float32), want)


def test_filter_pairs_match_their_model(cp):
    """The split-in-registers path's filter: per 16 channels [hi x 16 | lo x 16], each eight in the order
    0 4 1 5 2 6 3 7 (split_bf16.cu with rows of 16 channels, parts [hi | lo], interleaved)."""
    from cuconv.backends.sm90.split_precision import _Split
    r = np.random.default_rng(16)
    a = (r.standard_normal((8, 3, 3, 48)) * np.exp(r.uniform(-20, 20, (8, 3, 3, 48)))).astype(np.float32)
    got = cp.empty(a.shape[:-1] + (96,), dtype=cp.uint16)
    _Split(0, a.size // 16, 16, 0b10, 2, interleave=True)(cp.asarray(a), got)
    order = np.array([0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15])  # the fragments' channel order
    want = _split_model(a.reshape(-1, 16)[:, order], 0b10, 2).reshape(got.shape)
    np.testing.assert_array_equal(cp.asnumpy(got), want)


@pytest.mark.parametrize("C", [16, 24, 64])
def test_infinities_propagate(cp, C):
    """An infinity in x or w gives infinities (not NaNs) and NaNs where the float32 products would: each
    non-finite value is all lo (hi 0), so it meets only the other operand's hi (an infinity in x and one
    in w at the same channel would give NaN, not infinity: not drawn here). C = 24 runs the split pass,
    16 and 64 split x in registers."""
    x = np.ones((1, 6, 6, C), np.float32)
    x[0, 2, 3, 5] = np.inf
    x[0, 4, 1, C - 1] = -np.inf
    w = np.full((8, 3, 3, C), 0.5, np.float32)
    w[2, 1, 1, 7] = np.inf  # x is 0 in the padding: NaN at the border of filter 2's outputs
    xg, wg = cp.asarray(x), cp.asarray(w)
    split = dict(padding=1, kernel="sm90_bf16x3")  # K = 8 runs on narrowk_direct by default
    assert ("x split in registers" in str(cuconv.explain(xg, wg, **split))) == (C % 16 == 0)
    got = cp.asnumpy(cuconv.conv2d(xg, wg, **split))
    ref = cuconv.reference.conv2d(x, w, padding=1)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
    np.testing.assert_array_equal(got[np.isinf(ref)], ref[np.isinf(ref)])
    finite = np.isfinite(ref)
    assert np.all(np.abs(got[finite] - ref[finite]) <= 1e-5 * np.abs(ref[finite]))


def test_split_puts_non_finite_values_in_lo(cp):
    a = np.array([[np.inf, -np.inf, np.nan, 1.0, 3.0e38, -1e-40, 0.0, 2.5]], dtype=np.float32)
    got = cp.asnumpy(split_bf16x3(cp.asarray(a), X_PARTS)).view(ml_dtypes.bfloat16).astype(np.float32)
    hi, lo = got[0, :8], got[0, 8:16]
    assert hi[0] == 0 and hi[1] == 0 and hi[2] == 0 and hi[3] == 1.0
    assert lo[0] == np.inf and lo[1] == -np.inf and np.isnan(lo[2]) and lo[3] == 0


def _float32_case(case):
    """The drawn case with groups 1 and C >= 2 (C = 1 is a depthwise problem, served by
    depthwise_direct); any K, odd ones included."""
    return dataclasses.replace(case, groups=1, channels=max(2, case.channels))


def _check(cp, case, precision=None, in_place=False):
    x, w, bias, residual = make_operands(case, cp)
    ep = case.epilogue
    kwargs = dict(case.conv_kwargs(), alpha=ep.get("alpha", 1.0), beta=ep.get("beta", 1.0),
                  activation=ep.get("activation"), precision=precision)
    e = cuconv.explain(x, w, bias, residual=residual, **dict(kwargs, kernel="sm90_bf16x3"))
    assert ("x split in registers" in str(e)) == (case.channels % 16 == 0), str(e)
    e = cuconv.explain(x, w, bias, residual=residual, **kwargs)
    # at "tf32" most problems go to sm90_tf32 (its routing: tests/test_tf32_gpu.py), few-channel ones to
    # smallc_direct (tests/test_smallc.py); forced here
    if smallc_takes(case, precision or "float32"):
        assert e.kernel == "smallc_direct", str(e)
    elif narrowk_takes(case):  # few output channels: tests/test_narrowk.py
        assert e.kernel == "narrowk_direct", str(e)
    else:
        assert e.kernel in (("sm90_tf32", "sm90_bf16x3") if precision == "tf32" else ("sm90_bf16x3",)), str(e)
    ref = cuconv.reference.conv2d(x, w, bias, residual=residual, **{k: v for k, v in kwargs.items() if k != "precision"})
    operands = [None if a is None else cp.asnumpy(a) for a in (x, w, bias, residual)]
    out = residual if in_place and residual is not None else None
    got = cuconv.conv2d(x, w, bias, residual=residual, out=out, kernel="sm90_bf16x3", **kwargs)
    assert got.dtype == cp.float32 and tuple(got.shape) == ref.shape
    if out is not None:
        assert got is out
    assert_within_split_bound(got, ref, operands, kwargs)


@settings(max_examples=60, deadline=None)
@given(cases(nd=2, dtypes=("float32",), groups=False, max_channels=40, max_spatial=14))
def test_drawn_float32_calls(cp, case):
    _check(cp, _float32_case(case))


@settings(max_examples=40, deadline=None)
@given(cases(nd=2, dtypes=("float32",), groups=False, max_channels=8, max_spatial=14), st.integers(1, 6))
def test_drawn_calls_split_in_registers(cp, case, sixteens):
    """C a multiple of 16: x split in the kernel's registers (halo tiles and im2col boxes, every epilogue)."""
    _check(cp, dataclasses.replace(_float32_case(case), channels=16 * sixteens))


@settings(max_examples=25, deadline=None)
@given(cases(nd=2, dtypes=("float32",), groups=False, max_channels=24, max_spatial=10))
def test_drawn_tf32_and_in_place(cp, case):
    _check(cp, _float32_case(case), precision="tf32", in_place=True)


@pytest.mark.parametrize("C,K,hw,filt,stride", [
    (512, 256, 16, 3, 1),    # a 4,608-term reduction (halo tiles; x as [hi | lo], hi read twice)
    (64, 64, 56, 3, 1),      # ResNet-50 stage 1
    (256, 512, 28, 1, 2),    # strided 1x1 (im2col boxes)
    (3, 64, 64, 7, 2),       # an RGB stem: smallc_direct's fp32 multiply-adds
    (192, 64, 20, 3, 2),     # strided 3x3 on im2col boxes, x as [hi | lo]
    (320, 320, 8, 3, 1),     # few output tiles: the split tail
    (128, 3, 64, 3, 1),      # a decoder's last layer: K = 3 (narrowk_direct)
    (4, 4, 32, 1, 1),        # C = K = 4, 1x1
])
def test_network_layers(cp, C, K, hw, filt, stride):
    r = np.random.default_rng(C + K)
    x = r.standard_normal((2, hw, hw, C)).astype(np.float32)
    w = (r.standard_normal((K, filt, filt, C)) / np.sqrt(C * filt * filt)).astype(np.float32)
    bias = r.standard_normal(K).astype(np.float32)
    res = r.standard_normal((2, (hw + 2 * (filt // 2) - filt) // stride + 1, (hw + 2 * (filt // 2) - filt) // stride + 1,
                             K)).astype(np.float32)
    kw = dict(stride=stride, padding=filt // 2, residual=None, beta=0.5, activation="relu")
    ref = cuconv.reference.conv2d(x, w, bias, **dict(kw, residual=res))
    xg, wg, bg, rg = (cp.asarray(a) for a in (x, w, bias, res))
    got = cuconv.conv2d(xg, wg, bg, **dict(kw, residual=rg))
    few = C <= MAX_C and C * filt * filt <= MAX_TAPS_F32  # exact fp32 multiply-adds (tests/test_smallc.py)
    narrow = K <= 8 and filt > 1  # fp32 multiply-adds over lanes (tests/test_narrowk.py)
    assert cuconv.explain(xg, wg, bg, **dict(kw, residual=rg)).kernel == (
        "smallc_direct" if few else "narrowk_direct" if narrow else "sm90_bf16x3")
    assert rel_error(got, ref) <= BOUND
    again = cuconv.conv2d(xg, wg, bg, **dict(kw, residual=rg))
    assert cp.array_equal(got, again)  # a fixed reduction order: the same bits on every run


@settings(max_examples=25, deadline=None)
@given(cases(nd=3, dtypes=("float32",), groups=False, max_channels=20, max_spatial=8), st.sampled_from([0, 1, 2]))
def test_drawn_float32_conv3d(cp, case, sixteens):
    """Any C (``sixteens`` 0), and C a multiple of 16 (x split in registers)."""
    case = _float32_case(case)
    if sixteens:
        case = dataclasses.replace(case, channels=16 * sixteens)
    x, w, bias, residual = make_operands(case, cp)
    ep = case.epilogue
    kwargs = dict(case.conv_kwargs(), alpha=ep.get("alpha", 1.0), beta=ep.get("beta", 1.0),
                  activation=ep.get("activation"))
    want = "smallc_direct" if smallc_takes(case) else "conv3d_native_bf16x3"
    assert cuconv.explain(x, w, bias, residual=residual, **kwargs).kernel == want
    ref = cuconv.reference.conv3d(x, w, bias, residual=residual, **kwargs)
    got = cuconv.conv3d(x, w, bias, residual=residual, **kwargs)
    assert got.dtype == cp.float32
    assert_within_split_bound(got, ref, [None if a is None else cp.asnumpy(a) for a in (x, w, bias, residual)],
                              kwargs, nd=3)


def test_misaligned_views_and_nchw(cp):
    r = np.random.default_rng(7)
    x = r.standard_normal((2, 12, 12, 33)).astype(np.float32)
    w = (r.standard_normal((16, 3, 3, 33)) / 17).astype(np.float32)
    bias = r.standard_normal(17).astype(np.float32)
    ref = cuconv.reference.conv2d(x[..., 1:], w[..., 1:], bias[1:], padding=1)
    got = cuconv.conv2d(cp.asarray(x)[..., 1:], cp.asarray(w)[..., 1:], cp.asarray(bias)[1:], padding=1)
    assert rel_error(got, ref) <= BOUND
    xn, wn = np.ascontiguousarray(np.moveaxis(x, -1, 1)), np.ascontiguousarray(np.moveaxis(w, -1, 1))
    ref = cuconv.reference.conv2d(xn, wn, padding=1, layout="NCHW")
    got = cuconv.conv2d(cp.asarray(xn), cp.asarray(wn), padding=1, layout="NCHW")
    assert rel_error(got, ref) <= BOUND
