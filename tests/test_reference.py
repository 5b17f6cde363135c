"""cuconv.reference checks its arguments as the library does, and both follow one epilogue convention;
explain validates exactly as the call; the small things a NumPy user meets."""

from __future__ import annotations

import numpy as np
import pytest

import cuconv

X = np.random.default_rng(0).standard_normal((2, 6, 6, 4)).astype(np.float32)
W = np.random.default_rng(1).standard_normal((8, 3, 3, 4)).astype(np.float32)

#: Invalid calls: (keyword overrides of a valid conv2d call, the argument the message must name).
INVALID = [
    (dict(groups=3), "groups"),
    (dict(groups=2, w=W[:, :, :, :3]), "w"),
    (dict(w=W[:, :, :, :3]), "w"),
    (dict(layout="NCWH"), "layout"),
    (dict(stride=0), "stride"),
    (dict(stride=1.5), "stride"),
    (dict(dilation=(1, 0)), "dilation"),
    (dict(padding="sometimes"), "padding"),
    (dict(padding=-1), "padding"),
    (dict(padding=((1, 2),)), "padding"),
    (dict(activation="tanh"), "activation"),
    (dict(alpha="1"), "alpha"),
    (dict(beta=True), "beta"),
    (dict(bias=np.ones(7, np.float32)), "bias"),
    (dict(residual=np.ones((2, 6, 6, 7), np.float32)), "residual"),
    (dict(x=X[0]), "x"),
    (dict(w=W[0]), "w"),
    (dict(x=[[1.0]]), "x"),
    (dict(x=np.float32(1.0)), "x"),
    (dict(padding=0, w=np.ones((8, 9, 9, 4), np.float32)), "output size"),
]


def _call(fn, **kw):
    args = dict(x=X, w=W, padding=1)
    args.update(kw)
    x, w = args.pop("x"), args.pop("w")
    return fn(x, w, **args)


@pytest.mark.parametrize("kw,name", INVALID, ids=[f"{n}-{i}" for i, (_, n) in enumerate(INVALID)])
def test_reference_refuses_what_the_library_refuses_with_the_same_message(kw, name):
    with pytest.raises((ValueError, TypeError)) as lib:
        _call(cuconv.conv2d, **kw)
    with pytest.raises((ValueError, TypeError)) as ref:
        _call(cuconv.reference.conv2d, **kw)
    with pytest.raises((ValueError, TypeError)) as exp:
        _call(cuconv.explain, **{"layout": "NHWC", **kw})  # the rank from the layout, as conv2d
    assert str(lib.value).startswith(f"{name}:"), str(lib.value)
    assert type(ref.value) is type(lib.value) and str(ref.value) == str(lib.value)
    assert type(exp.value) is type(lib.value) and str(exp.value) == str(lib.value)


def test_explain_refuses_a_strategy_as_the_call_would():
    with pytest.raises(ValueError, match="^strategy:"):
        cuconv.explain(X, W, strategy="bogus")
    with pytest.raises(ValueError, match="^strategy:"):
        cuconv.explain(X, W, strategy="native")  # conv2d takes no strategy
    x5, w5 = X[:, None], W[:, None]
    with pytest.raises(ValueError, match="^strategy:"):
        cuconv.conv3d(x5, w5, strategy="bogus")
    with pytest.raises(ValueError, match="^strategy:"):
        cuconv.explain(x5, w5, strategy="bogus")


def test_beta_zero_does_not_read_the_residual():
    res = np.full((2, 6, 6, 8), np.nan, np.float32)
    want = cuconv.reference.conv2d(X, W, padding=1)
    for fn in (cuconv.conv2d, cuconv.reference.conv2d):
        got = fn(X, W, padding=1, residual=res, beta=0.0)
        assert np.isfinite(got).all()
        assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-5


def test_alpha_zero_does_not_compute_the_convolution():
    x = X.copy()
    x[0, 0, 0, 0] = np.inf
    bias = np.arange(8, dtype=np.float32)
    res = np.ones((2, 6, 6, 8), np.float32)
    want = np.maximum(bias + 0.5 * res, 0)
    for fn in (cuconv.conv2d, cuconv.reference.conv2d):
        got = fn(x, W, bias, padding=1, residual=res, alpha=0.0, beta=0.5, activation="relu")
        np.testing.assert_allclose(got, want, rtol=1e-6)
    assert "alpha = 0" in cuconv.explain(x, W, bias, padding=1, alpha=0.0).reason


def test_reference_takes_float64():
    got = cuconv.reference.conv2d(X.astype(np.float64), W.astype(np.float64), padding=1)
    assert got.dtype == np.float64 and np.allclose(got, cuconv.reference.conv2d(X, W, padding=1))


def test_float64_data_compute_in_float64():
    x, w = X.astype(np.float64), W.astype(np.float64)
    got = cuconv.conv2d(x, w, padding=1)
    want = cuconv.reference.conv2d(x, w, padding=1)
    assert got.dtype == np.float64
    assert np.linalg.norm(got - want) <= 1e-12 * np.linalg.norm(want)


def test_activation_ignores_case():
    a = cuconv.conv2d(X, W, padding=1, activation="GeLU")
    b = cuconv.conv2d(X, W, padding=1, activation="gelu")
    assert np.array_equal(a, b)
    assert np.allclose(cuconv.reference.conv2d(X, W, padding=1, activation="SILU"),
                       cuconv.reference.conv2d(X, W, padding=1, activation="silu"))


@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
def test_an_empty_batch_gives_an_empty_result(layout):
    x = np.ones((0, 6, 6, 4), np.float32) if layout == "NHWC" else np.ones((0, 4, 6, 6), np.float32)
    w = W if layout == "NHWC" else np.moveaxis(W, -1, 1)
    y = cuconv.conv2d(x, w, padding="same", stride=2, layout=layout)
    assert y.shape == ((0, 3, 3, 8) if layout == "NHWC" else (0, 8, 3, 3)) and y.dtype == np.float32
    assert cuconv.reference.conv2d(x, w, padding="same", stride=2, layout=layout).shape == y.shape
    out = np.empty_like(y)
    assert cuconv.conv2d(x, w, padding="same", stride=2, layout=layout, out=out) is out
    assert "empty batch" in cuconv.explain(x, w, padding="same", stride=2, layout=layout).reason
