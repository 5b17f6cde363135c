"""Gradients and transposed convolution on a CUDA GPU (gpu marker): CuPy results against the CPU's
float64 ones (tests/test_grad.py checks those against adjoint identities, finite differences and a
scatter-add definition). Each is a composition of forward calls, so it runs on the kernels the
dispatcher picks for them (float32 on Hopper: sm90_bf16x3; bf16: the 16-bit kernels)."""

from __future__ import annotations

import numpy as np
import pytest

import cuconv

from conftest import DTYPES, TOLERANCE, rel_error

pytestmark = pytest.mark.gpu

GEOMETRIES = [
    dict(stride=1, padding=1, dilation=1, groups=1),
    dict(stride=2, padding=((1, 0), (0, 1)), dilation=1, groups=1),
    dict(stride=(2, 1), padding="same", dilation=(1, 2), groups=2),
]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("kw", GEOMETRIES)
def test_gradients_match_the_cpu(cp, dtype, kw):
    rng = np.random.default_rng(1)
    dt = DTYPES[dtype]
    x = rng.standard_normal((2, 12, 10, 16)).astype(dt)
    w = (rng.standard_normal((32, 3, 3, 16 // kw["groups"])) / 12).astype(dt)
    y = cuconv.conv2d(x.astype(np.float64), w.astype(np.float64), **kw)
    dy = rng.standard_normal(y.shape).astype(dt)
    x64, w64, dy64 = (a.astype(np.float64) for a in (x, w, dy))
    want_dx = cuconv.conv2d_input_grad(dy64, w64, x.shape, **kw)
    want_dw = cuconv.conv2d_weight_grad(x64, dy64, w.shape, **kw)
    dx = cuconv.conv2d_input_grad(cp.asarray(dy), cp.asarray(w), x.shape, **kw)
    dw = cuconv.conv2d_weight_grad(cp.asarray(x), cp.asarray(dy), w.shape, **kw)
    assert isinstance(dx, cp.ndarray) and dx.dtype == dt and dx.shape == x.shape
    assert rel_error(dx, want_dx) <= TOLERANCE[dtype]
    assert rel_error(dw, want_dw) <= TOLERANCE[dtype]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_transpose_with_epilogue_matches_the_cpu(cp, dtype):
    rng = np.random.default_rng(2)
    dt = DTYPES[dtype]
    x = rng.standard_normal((2, 64, 9, 9)).astype(dt)           # NCHW, C_in 64
    w = (rng.standard_normal((64, 32, 4, 4)) / 16).astype(dt)    # torch layout (C_in, C_out, R, S)
    bias = rng.standard_normal(32).astype(dt)
    kw = dict(stride=2, padding=1, layout="NCHW", activation="silu")
    want = cuconv.conv_transpose2d(x.astype(np.float64), w.astype(np.float64), bias.astype(np.float64), **kw)
    got = cuconv.conv_transpose2d(cp.asarray(x), cp.asarray(w), cp.asarray(bias), **kw)
    assert got.shape == want.shape == (2, 32, 18, 18)
    assert rel_error(got, want) <= TOLERANCE[dtype]
