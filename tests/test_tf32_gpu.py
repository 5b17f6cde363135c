"""``sm90_tf32`` / ``conv3d_native_tf32`` on a Hopper GPU: float32 data at precision "tf32" (gpu marker).

* drawn conv2d and conv3d calls (C a multiple of 4, any K, stride, dilation, padding, every epilogue
  term, NHWC and NCHW, the residual in place) against the float64 reference: each output within one
  TF32 product's bound, 2^-9 of alpha (|x| (*) |w|) (each operand keeps 10 of its 23 mantissa bits:
  relative error below 2^-10 each), times 1.2 for an activation's slope, plus the epilogue's fp32
  rounding;
* a 4,608-term layer: within 5e-3 of the float64 result's norm and above 1e-5 (TF32's operand
  truncation shows: a silent fp32 or split-bf16 path fails), and within fp32 accumulation error of
  the float64 convolution of the operands truncated to TF32 (what the tensor cores multiply);
* few channels (stems, drawn C) fold the filter's columns into them; channel counts that neither
  the view nor the fold holds go to ``sm90_bf16x3``, visibly.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import given, settings

import cuconv

from conftest import needs_hopper, rel_error
from geometry import cases, make_operands, narrowk_takes, smallc_takes
from test_split_precision_gpu import assert_within_split_bound

pytestmark = [pytest.mark.gpu, needs_hopper]

#: One TF32 product's relative error bound (both operands truncated to 10 mantissa bits).
TF32_PRODUCT = 2.0 ** -9


def _tf32_case(case):
    """The drawn case with groups 1 and C a multiple of 4 (what the 16-bit view needs)."""
    return dataclasses.replace(case, groups=1, channels=4 * max(1, -(-case.channels // 4)))


def _check(cp, case, nd=2, in_place=False):
    x, w, bias, residual = make_operands(case, cp)
    ep = case.epilogue
    kwargs = dict(case.conv_kwargs(), alpha=ep.get("alpha", 1.0), beta=ep.get("beta", 1.0),
                  activation=ep.get("activation"), precision="tf32")
    conv = cuconv.conv2d if nd == 2 else cuconv.conv3d
    name = "sm90_tf32" if nd == 2 else "conv3d_native_tf32"
    # forced: a few-channel case runs smallc_direct by default (exact fp32 multiply-adds)
    e = cuconv.explain(x, w, bias, residual=residual, kernel=name, **kwargs)
    assert e.kernel == name and e.precision == "tf32", str(e)
    reference = cuconv.reference.conv2d if nd == 2 else cuconv.reference.conv3d
    ref = reference(x, w, bias, residual=residual, **{k: v for k, v in kwargs.items() if k != "precision"})
    operands = [None if a is None else cp.asnumpy(a) for a in (x, w, bias, residual)]
    out = residual if in_place and residual is not None else None
    got = conv(x, w, bias, residual=residual, out=out, kernel=name, **kwargs)
    assert got.dtype == cp.float32 and tuple(got.shape) == ref.shape
    if out is not None:
        assert got is out
    assert_within_split_bound(got, ref, operands, kwargs, nd=nd, product_bound=TF32_PRODUCT)


@settings(max_examples=60, deadline=None)
@given(cases(nd=2, dtypes=("float32",), groups=False, max_channels=40, max_spatial=14))
def test_drawn_tf32_conv2d(cp, case):
    _check(cp, _tf32_case(case))


@settings(max_examples=25, deadline=None)
@given(cases(nd=2, dtypes=("float32",), groups=False, max_channels=24, max_spatial=10))
def test_drawn_tf32_conv2d_in_place(cp, case):
    _check(cp, _tf32_case(case), in_place=True)


@settings(max_examples=25, deadline=None)
@given(cases(nd=3, dtypes=("float32",), groups=False, max_channels=16, max_spatial=8))
def test_drawn_tf32_conv3d(cp, case):
    _check(cp, _tf32_case(case), nd=3)


def _truncated_tf32(a: np.ndarray) -> np.ndarray:
    """float32 values with their 13 low mantissa bits cleared (the operand a tf32 product reads)."""
    return (np.ascontiguousarray(a, np.float32).view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32)


def assert_tf32_products(cp, got, x, w, padding):
    """``got`` (a 3x3-or-larger float32 conv of x and w, NHWC) shows TF32 truncation and only that: norm
    error against float64 between 1e-5 and 5e-3, and within fp32 accumulation error (2^-16 of
    |x| (*) |w|, generously) of the float64 convolution of the TF32-truncated operands."""
    err = rel_error(got, cuconv.reference.conv2d(x, w, padding=padding))
    assert 1e-5 < err <= 5e-3, err
    model = cuconv.reference.conv2d(_truncated_tf32(x).astype(np.float64), _truncated_tf32(w).astype(np.float64),
                                    padding=padding)
    mags = cuconv.reference.conv2d(np.abs(x).astype(np.float64), np.abs(w).astype(np.float64), padding=padding)
    diff = np.abs(cp.asnumpy(got).astype(np.float64) - model)
    assert np.all(diff <= 2.0 ** -16 * mags + 1e-30), float(np.max(diff / (mags + 1e-30)))


def test_a_long_reduction_is_tf32_and_within_its_bound(cp):
    """C = 512, 3x3 (4,608 terms): TF32 products (:func:`assert_tf32_products`)."""
    r = np.random.default_rng(30)
    x = r.standard_normal((4, 16, 16, 512)).astype(np.float32)
    w = (r.standard_normal((256, 3, 3, 512)) / math.sqrt(4608)).astype(np.float32)
    got = cuconv.conv2d(cp.asarray(x), cp.asarray(w), padding=1, precision="tf32")
    assert cuconv.explain(cp.asarray(x), cp.asarray(w), padding=1, precision="tf32").kernel == "sm90_tf32"
    assert_tf32_products(cp, got, x, w, 1)


@settings(max_examples=40, deadline=None)
@given(cases(nd=2, dtypes=("float32",), groups=False, max_channels=12, max_spatial=12))
def test_drawn_tf32_any_channels(cp, case):
    """Any C: few channels fold the filter's columns into them (the 16-bit view of the width fold), other
    counts that are not multiples of 4 run sm90_bf16x3 (more accurate than asked); both within the bound."""
    case = dataclasses.replace(case, groups=1, channels=max(2, case.channels))
    x, w, bias, residual = make_operands(case, cp)
    ep = case.epilogue
    kwargs = dict(case.conv_kwargs(), alpha=ep.get("alpha", 1.0), beta=ep.get("beta", 1.0),
                  activation=ep.get("activation"), precision="tf32")
    e = cuconv.explain(x, w, bias, residual=residual, **kwargs)
    folds = case.filt[-1] * 8 * -(-case.channels // 4) <= 64 and (case.filt[-1] > 1 or case.channels % 4 != 0)
    if smallc_takes(case, "tf32"):  # few channels and taps: exact fp32 multiply-adds first (tests/test_smallc.py)
        assert e.kernel == "smallc_direct", str(e)
    elif narrowk_takes(case):  # few output channels: exact fp32 multiply-adds (tests/test_narrowk.py)
        assert e.kernel == "narrowk_direct", str(e)
    else:
        assert e.kernel == ("sm90_tf32" if folds or case.channels % 4 == 0 else "sm90_bf16x3"), str(e)
        assert ("fold_width" in e.detail) == folds, e.detail
    ref = cuconv.reference.conv2d(x, w, bias, residual=residual, **{k: v for k, v in kwargs.items() if k != "precision"})
    operands = [None if a is None else cp.asnumpy(a) for a in (x, w, bias, residual)]
    got = cuconv.conv2d(x, w, bias, residual=residual, **kwargs)
    assert_within_split_bound(got, ref, operands, kwargs, product_bound=TF32_PRODUCT)


@pytest.mark.parametrize("shape,w_shape,stride,pad", [
    ((4, 64, 64, 3), (64, 7, 7, 3), 2, 3),   # ResNet's stem
    ((2, 80, 80, 3), (32, 3, 3, 3), 2, 1),   # YOLO's / MobileNet's stem
])
def test_stems_fold_their_filter_columns(cp, shape, w_shape, stride, pad):
    r = np.random.default_rng(7)
    x = r.standard_normal(shape).astype(np.float32)
    w = (r.standard_normal(w_shape) / math.sqrt(np.prod(w_shape[1:]))).astype(np.float32)
    # forced: the 3x3 stem runs smallc_direct by default (27 multiply-adds per output)
    e = cuconv.explain(cp.asarray(x), cp.asarray(w), stride=stride, padding=pad, precision="tf32", kernel="sm90_tf32")
    assert e.kernel == "sm90_tf32" and "fold_width" in e.detail and "_tf32" in e.detail, e.detail
    got = cuconv.conv2d(cp.asarray(x), cp.asarray(w), stride=stride, padding=pad, precision="tf32", kernel="sm90_tf32")
    kwargs = dict(stride=stride, padding=pad, dilation=1, layout="NHWC")
    assert_within_split_bound(got, cuconv.reference.conv2d(x, w, **kwargs), [x, w, None, None], kwargs,
                              product_bound=TF32_PRODUCT)


def test_channels_the_view_cannot_hold_go_to_the_split_kernel(cp):
    r = np.random.default_rng(4)
    x = cp.asarray(r.standard_normal((2, 9, 9, 6)).astype(np.float32))
    w = cp.asarray(r.standard_normal((8, 5, 5, 6)).astype(np.float32))  # 5 x 8 floats: no one-block fold
    e = cuconv.explain(x, w, padding=2, precision="tf32")
    assert e.kernel == "sm90_bf16x3" and "not a multiple of 4" in e.declined["sm90_tf32"]
    assert rel_error(cuconv.conv2d(x, w, padding=2, precision="tf32"),
                     cuconv.reference.conv2d(cp.asnumpy(x), cp.asnumpy(w), padding=2)) <= 1e-5
