"""Every invalid argument raises ValueError/TypeError naming the argument; inputs stay untouched."""

import numpy as np
import pytest

import cuconv
from cuconv.problem import ConvProblem

from conftest import random_array

rng = np.random.default_rng(0)
X = random_array(rng, (2, 8, 8, 4), "float32")
W = random_array(rng, (6, 3, 3, 4), "float32")
X3 = random_array(rng, (1, 4, 5, 6, 4), "float32")
W3 = random_array(rng, (6, 2, 3, 3, 4), "float32")


def _raises(exc, pattern, fn=cuconv.conv2d, *args, **kwargs):
    with pytest.raises(exc, match=pattern):
        fn(*args, **kwargs)


def test_wrong_ndim():
    _raises(ValueError, r"^x: expected a 4-D", cuconv.conv2d, X[0], W)
    _raises(ValueError, r"^w: expected a 4-D", cuconv.conv2d, X, W[0])
    _raises(ValueError, r"^x: expected a 5-D", cuconv.conv3d, X, W3)


def test_channel_mismatch():
    _raises(ValueError, r"^w: channel mismatch.*C=4.*got 3", cuconv.conv2d, X, W[..., :3])
    _raises(ValueError, r"^w: channel mismatch", cuconv.conv2d, X, W, groups=2)
    _raises(ValueError, r"^w: channel mismatch", cuconv.conv2d, np.moveaxis(X, -1, 1), W, layout="NCHW")


def test_groups():
    _raises(ValueError, r"^groups: must divide the input channels C=4", cuconv.conv2d, X, W[..., :1], groups=3)
    _raises(ValueError, r"^groups: must divide the output channels K=6", cuconv.conv2d, X, W[:, :, :, :1], groups=4)
    _raises(ValueError, r"^groups: must be >= 1", cuconv.conv2d, X, W, groups=0)
    _raises(TypeError, r"^groups: expected an int", cuconv.conv2d, X, W, groups=1.5)


@pytest.mark.parametrize("name", ["stride", "dilation"])
def test_stride_dilation(name):
    _raises(ValueError, rf"^{name}: every value must be >= 1", cuconv.conv2d, X, W, **{name: 0})
    _raises(ValueError, rf"^{name}: every value must be >= 1", cuconv.conv2d, X, W, **{name: (1, -1)})
    _raises(ValueError, rf"^{name}: expected an int or 2 ints", cuconv.conv2d, X, W, **{name: (1, 1, 1)})
    _raises(TypeError, rf"^{name}: expected an int or a sequence", cuconv.conv2d, X, W, **{name: "2"})


def test_padding():
    _raises(ValueError, r"^padding: must be non-negative", cuconv.conv2d, X, W, padding=-1)
    _raises(ValueError, r"^padding: must be non-negative", cuconv.conv2d, X, W, padding=((0, -1), (0, 0)))
    _raises(ValueError, r"^padding: expected 'same', 'valid'.*'full'", cuconv.conv2d, X, W, padding="full")
    _raises(TypeError, r"^padding: expected", cuconv.conv2d, X, W, padding=(1, 2, 3))
    _raises(TypeError, r"^padding: expected", cuconv.conv2d, X, W, padding=1.0)


def test_output_too_small():
    _raises(ValueError, r"^output size: must be >= 1", cuconv.conv2d, X[:, :2, :2], W)
    _raises(ValueError, r"^output size: must be >= 1", cuconv.conv2d, X, W, dilation=4)


def test_dtypes():
    _raises(TypeError, r"^x: expected dtype float16, bfloat16.*float32 or float64, got int32", cuconv.conv2d,
            X.astype(np.int32), W)
    _raises(TypeError, r"^w: expected dtype float64 like x, got float32", cuconv.conv2d, X.astype(np.float64), W)
    _raises(TypeError, r"^w: expected dtype float32 like x, got float16", cuconv.conv2d, X, W.astype(np.float16))


def test_bias():
    _raises(ValueError, r"^bias: expected shape \(6,\), got \(5,\)", cuconv.conv2d, X, W, np.zeros(5, np.float32))
    _raises(ValueError, r"^bias: expected shape \(6,\)", cuconv.conv2d, X, W, np.zeros((6, 1), np.float32))
    _raises(TypeError, r"^bias: expected dtype float32 like x, got float16", cuconv.conv2d, X, W,
            np.zeros(6, np.float16))
    _raises(TypeError, r"^bias: expected a NumPy", cuconv.conv2d, X, W, [0.0] * 6)


@pytest.mark.parametrize("name", ["residual", "out"])
def test_residual_and_out(name):
    good = np.zeros((2, 6, 6, 6), np.float32)
    _raises(ValueError, rf"^{name}: expected shape \(2, 6, 6, 6\), got \(2, 6, 6, 5\)", cuconv.conv2d, X, W,
            **{name: good[..., :5]})
    _raises(TypeError, rf"^{name}: expected dtype float32 like x, got float16", cuconv.conv2d, X, W,
            **{name: good.astype(np.float16)})
    _raises(TypeError, rf"^{name}: expected a NumPy", cuconv.conv2d, X, W, **{name: good.tolist()})
    # NCHW shapes are checked in the caller's layout
    _raises(ValueError, rf"^{name}: expected shape \(2, 6, 6, 6\)", cuconv.conv2d, np.moveaxis(X, -1, 1),
            np.moveaxis(W, -1, 1), layout="NCHW", **{name: good[:, :, :, :4]})


def test_read_only_out():
    out = np.zeros((2, 6, 6, 6), np.float32)
    out.flags.writeable = False
    _raises(ValueError, r"^out: expected a writeable array", cuconv.conv2d, X, W, out=out)


def test_not_arrays():
    _raises(TypeError, r"^x: expected a NumPy or CuPy array", cuconv.conv2d, X.tolist(), W)
    _raises(TypeError, r"^w: expected a NumPy or CuPy array", cuconv.conv2d, X, "w")


def test_unknown_strings():
    _raises(ValueError, r"^layout: expected one of \['NHWC', 'NCHW'\], got 'NHCW'", cuconv.conv2d, X, W,
            layout="NHCW")
    _raises(ValueError, r"^layout: expected one of", cuconv.conv2d, X, W, layout="NDHWC")
    _raises(ValueError, r"^layout: expected one of \['NDHWC', 'NCDHW'\]", cuconv.conv3d, X3, W3, layout="NHWC")
    _raises(ValueError, r"^activation: expected None or one of .*got 'tanh'", cuconv.conv2d, X, W,
            activation="tanh")
    _raises(ValueError, r"^strategy: expected one of", cuconv.conv3d, X3, W3, strategy="fast")
    _raises(ValueError, r"^kernel: expected one of", cuconv.conv2d, X, W, kernel="nope")


def test_alpha_beta_types():
    _raises(TypeError, r"^alpha: expected a real number", cuconv.conv2d, X, W, alpha="1")
    _raises(TypeError, r"^beta: expected a real number", cuconv.conv2d, X, W, beta=None)


def test_forcing_a_declining_kernel_is_a_clear_error():
    _raises(cuconv.KernelDeclined, r"^kernel: 'generic_gpu' declines this problem: runs on cuda", cuconv.conv2d,
            X, W, kernel="generic_gpu")
    assert issubclass(cuconv.KernelDeclined, ValueError)


def test_inputs_are_not_modified():
    x, w = X.copy(), W.copy()
    b = np.ones(6, np.float32)
    res = np.ones((2, 6, 6, 6), np.float32)
    copies = [a.copy() for a in (x, w, b, res)]
    cuconv.conv2d(x, w, b, residual=res, activation="relu")
    for a, c in zip((x, w, b, res), copies):
        np.testing.assert_array_equal(a, c)


def test_problem_is_frozen_and_has_the_gemm_view():
    p = ConvProblem.create(nd=2, batch=2, in_spatial=(8, 8), channels=4, out_channels=6, filter_spatial=(3, 3),
                           stride=1, dilation=1, padding="same", groups=2, dtype="float16", layout="NHWC")
    assert (p.gemm_m, p.gemm_n, p.gemm_k) == (2 * 8 * 8, 3, 9 * 2)
    assert p.pad_lo == (1, 1) and p.pad_hi == (1, 1) and p.out_spatial == (8, 8)
    assert p.flops == 2 * p.gemm_m * p.gemm_n * p.gemm_k * 2
    with pytest.raises(Exception):
        p.batch = 3


@pytest.mark.parametrize("size,f,s,d,lo,hi,out", [
    (7, 3, 2, 1, 1, 1, 4),   # ceil(7/2) = 4, total pad 2
    (8, 3, 2, 1, 0, 1, 4),   # odd total pad: the extra element at the end (TF/JAX SAME)
    (8, 4, 1, 1, 1, 2, 8),   # even filter
    (5, 3, 1, 2, 2, 2, 5),   # dilation
    (3, 5, 3, 1, 1, 1, 1),
])
def test_same_padding(size, f, s, d, lo, hi, out):
    p = ConvProblem.create(nd=2, batch=1, in_spatial=(size, size), channels=1, out_channels=1,
                           filter_spatial=(f, f), stride=s, dilation=d, padding="same", groups=1,
                           dtype="float32", layout="NHWC")
    assert p.pad_lo == (lo, lo) and p.pad_hi == (hi, hi) and p.out_spatial == (out, out)


@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
def test_residual_aliasing_out(layout):
    """In place (residual is out) and a residual that is another view of out's memory both add the
    residual as it was before the call."""
    x, w = (X, W) if layout == "NHWC" else (np.moveaxis(X, -1, 1), np.moveaxis(W, -1, 1))
    shape = (2, 6, 6, 6)
    res0 = random_array(np.random.default_rng(5), shape, "float32")
    ref = cuconv.reference.conv2d(x, w, residual=res0, beta=0.5, layout=layout)
    buf = res0.copy()
    got = cuconv.conv2d(x, w, residual=buf, beta=0.5, out=buf, layout=layout)
    assert got is buf
    np.testing.assert_allclose(buf, ref, rtol=1e-4, atol=1e-4)
    buf = res0.copy()
    cuconv.conv2d(x, w, residual=buf[...], beta=0.5, out=buf, layout=layout)
    np.testing.assert_allclose(buf, ref, rtol=1e-4, atol=1e-4)


def test_validation_is_not_bypassed_by_the_problem_cache():
    cuconv.conv2d(X, W, stride=1, groups=1)  # caches this geometry
    _raises(TypeError, r"^stride: expected an int", cuconv.conv2d, X, W, stride=1.0)
    _raises(TypeError, r"^groups: expected an int, got True", cuconv.conv2d, X, W, groups=True)
    _raises(TypeError, r"^padding: expected", cuconv.conv2d, X, W, padding=0.0)
