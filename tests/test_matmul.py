"""``cuconv.matmul`` on the CPU (NumPy path) and its argument validation."""

import numpy as np
import pytest

import cuconv


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("m,n,k", [(1, 1, 1), (7, 13, 5), (33, 17, 64)])
def test_matmul_numpy(dtype, m, n, k):
    rng = np.random.default_rng(m + n + k)
    a = rng.standard_normal((m, k)).astype(dtype)
    b = rng.standard_normal((k, n)).astype(dtype)
    bias = rng.standard_normal(n).astype(dtype)
    r = rng.standard_normal((m, n)).astype(dtype)
    got = cuconv.matmul(a, b, bias=bias, residual=r, alpha=0.5, beta=-1.0, activation="silu")
    v = 0.5 * (a.astype(np.float64) @ b.astype(np.float64)) + bias - r.astype(np.float64)
    ref = v / (1 + np.exp(-v))
    assert got.dtype == dtype and got.shape == (m, n)
    tol = 1e-5 if dtype == np.float32 else 2e-3
    assert np.linalg.norm(got.astype(np.float64) - ref) <= tol * np.linalg.norm(ref)
    out = r.copy()
    res = cuconv.matmul(a, b, residual=out, out=out)
    assert res is out
    np.testing.assert_allclose(out.astype(np.float64), a.astype(np.float64) @ b.astype(np.float64) + r,
                               rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("kwargs,exc,match", [
    (dict(a=np.ones((2, 3), np.float32), b=np.ones((4, 2), np.float32)), ValueError, "b: expected 3 rows"),
    (dict(a=np.ones((2, 3, 1), np.float32), b=np.ones((3, 2), np.float32)), ValueError, "a: expected a 2-D"),
    (dict(a=np.ones((2, 3), np.float32), b=np.ones((3, 2), np.float16)), TypeError, "b: expected dtype float32"),
    (dict(a=np.ones((2, 3), np.int32), b=np.ones((3, 2), np.int32)), TypeError, "a: expected dtype"),
    (dict(a=np.ones((2, 3), np.float32), b=np.ones((3, 2), np.float32), bias=np.ones(3, np.float32)),
     ValueError, r"bias: expected shape \(2,\)"),
    (dict(a=np.ones((2, 3), np.float32), b=np.ones((3, 2), np.float32), activation="tanh"), ValueError, "activation"),
    (dict(a=np.ones((2, 3), np.float32), b=np.ones((3, 2), np.float32), alpha="x"), TypeError, "alpha"),
    (dict(a=[[1.0]], b=np.ones((1, 1), np.float32)), TypeError, "a: expected a NumPy or CuPy array"),
])
def test_matmul_validation(kwargs, exc, match):
    a, b = kwargs.pop("a"), kwargs.pop("b")
    with pytest.raises(exc, match=match):
        cuconv.matmul(a, b, **kwargs)
