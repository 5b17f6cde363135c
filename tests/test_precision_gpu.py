"""``precision=`` and float64 arrays on a CUDA GPU, against the float64 reference (gpu marker).

* float64 data: drawn conv2d / conv3d calls (automatic dispatch, which picks ``generic_gpu``, and the
  forced kernel, NaN-poisoned outputs, in-place residuals) within 1e-12 of the reference.
* float32 data on a 4,608-term reduction (C = 512, 3x3): precision "float32" within 1e-5, also when
  the cuBLAS handle has TF32 switched on by someone else; "tf32" within 5e-3 and, on sm_80+, above
  1e-5 on the same data (TF32's operand rounding shows: a silent fp32 path fails); "float64" only
  rounds the result.
* float16 / bfloat16 on ``generic_gpu``: products on TF32 tensor cores are exact (equal to the
  reference, rounded, on data whose sums fp32 holds exactly).
* ``depthwise_direct`` serves float32 at "tf32" with fp32 accuracy; ``matmul`` keeps the same bounds.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings

import cuconv

from conftest import DTYPES, rel_error
from geometry import cases, check_case

pytestmark = pytest.mark.gpu


def _cc():
    from cuconv.device import current_gpu
    return current_gpu().cc


# ------------------------------------------------------------------------------------------------- float64
@settings(max_examples=30)
@given(cases(nd=2, dtypes=("float64",)))
def test_float64_conv2d_auto(cp, case):
    check_case(case, xp=cp, poison=True)


@settings(max_examples=20)
@given(cases(nd=2, dtypes=("float64",)))
def test_float64_conv2d_generic_in_place(cp, case):
    check_case(case, xp=cp, kernel="generic_gpu", in_place=True)


@settings(max_examples=20)
@given(cases(nd=3, dtypes=("float64",), max_channels=8, max_spatial=8))
def test_float64_conv3d_auto(cp, case):
    check_case(case, xp=cp, poison=True)


def test_float64_runs_generic_and_says_so(cp):
    r = np.random.default_rng(1)
    x, w = cp.asarray(r.standard_normal((2, 9, 9, 32))), cp.asarray(r.standard_normal((32, 3, 3, 1)) / 3)
    e = cuconv.explain(x, w, padding=1, groups=32)  # depthwise: depthwise_direct declines float64
    assert e.kernel == "generic_gpu" and e.precision == "float64" and "DGEMM" in e.reason
    assert e.declined["depthwise_direct"].startswith("dtype float64")
    assert "precision: float64" in str(e)
    bias = cp.asarray(r.standard_normal(32))
    plan = cuconv.plan_conv2d(x, w, bias, padding=1, groups=32, activation="gelu", alpha=0.1)
    want = cuconv.reference.conv2d(x, w, bias, padding=1, groups=32, activation="gelu", alpha=0.1)
    got = plan(x, w, bias)
    assert got.dtype == cp.float64 and rel_error(got, want) <= 1e-12


def test_float64_data_at_precision_float32(cp):
    r = np.random.default_rng(2)
    x, w = r.standard_normal((2, 10, 10, 64)), r.standard_normal((32, 3, 3, 64)) / 24
    want = cuconv.reference.conv2d(x, w, padding=1)
    got = cuconv.conv2d(cp.asarray(x), cp.asarray(w), padding=1, precision="float32")
    assert got.dtype == cp.float64 and 1e-10 < rel_error(got, want) <= 1e-5


# ------------------------------------------------------------------------------------- float32 precisions
@pytest.fixture(scope="module")
def big(cp):
    """float32 x (4, 16, 16, 512), w (256, 3, 3, 512): GEMM M = 1024, N = 256, K = 4608; standard normal
    data, w scaled by 1/sqrt(4608); and the float64 reference."""
    r = np.random.default_rng(30)
    x = r.standard_normal((4, 16, 16, 512)).astype(np.float32)
    w = (r.standard_normal((256, 3, 3, 512)) / math.sqrt(4608)).astype(np.float32)
    return cp.asarray(x), cp.asarray(w), cuconv.reference.conv2d(x, w, padding=1)


def test_float32_default_is_float32_accurate(cp, big):
    """On Hopper the split-bf16 tensor-core kernel runs (tests/test_split_precision_gpu.py), elsewhere fp32
    cuBLAS; both, and the forced generic path, stay within 1e-5."""
    x, w, ref = big
    e = cuconv.explain(x, w, padding=1)
    assert e.precision == "float32"
    if _cc() == (9, 0):
        assert e.kernel == "sm90_bf16x3" and "bf16 hi + lo" in e.reason
    else:
        assert e.kernel == "generic_gpu" and "TF32 off" in e.reason
    assert "TF32 off" in cuconv.explain(x, w, padding=1, kernel="generic_gpu").reason
    for precision in (None, "float32"):
        for kernel in (None, "generic_gpu"):
            assert rel_error(cuconv.conv2d(x, w, padding=1, precision=precision, kernel=kernel), ref) <= 1e-5


def test_float32_ignores_a_tf32_math_mode_on_the_handle(cp, big):
    from cupy_backends.cuda.libs import cublas
    x, w, ref = big
    handle = cp.cuda.device.get_cublas_handle()
    old = cublas.getMathMode(handle)
    cublas.setMathMode(handle, 3)  # CUBLAS_TF32_TENSOR_OP_MATH (cublas_api.h)
    try:
        got = cuconv.conv2d(x, w, padding=1, precision="float32", kernel="generic_gpu")
        assert cublas.getMathMode(handle) == 3  # put back after the call
    finally:
        cublas.setMathMode(handle, old)
    assert rel_error(got, ref) <= 1e-5


def test_tf32_is_within_its_bound_and_visibly_tf32(cp, big):
    """generic_gpu at "tf32" runs cuBLAS on TF32 tensor cores: its error shows TF32's rounding. (On Hopper
    the automatic choice is sm90_bf16x3, more accurate than asked: tests/test_split_precision_gpu.py.)"""
    x, w, ref = big
    e = cuconv.explain(x, w, padding=1, precision="tf32", kernel="generic_gpu")
    assert e.precision == "tf32" and e.kernel == "generic_gpu" and "TF32 tensor cores" in e.reason
    err = rel_error(cuconv.conv2d(x, w, padding=1, precision="tf32", kernel="generic_gpu"), ref)
    assert err <= 5e-3
    if _cc() >= (8, 0):  # TF32 tensor cores: operands keep 10 mantissa bits, about 1e-3 relative error
        assert err > 1e-5, f"precision='tf32' gave {err:.3g}: fp32 products, not TF32"


def test_float32_at_precision_float64_rounds_only_the_result(cp, big):
    x, w, ref = big
    got = cuconv.conv2d(x, w, padding=1, precision="float64")
    assert got.dtype == cp.float32 and rel_error(got, ref) <= 1e-7


# ---------------------------------------------------------------------------------- 16-bit on generic_gpu
@pytest.mark.parametrize("dtype,step", [("float16", 2.0 ** -10), ("bfloat16", 2.0 ** -7)])
def test_sixteen_bit_products_are_exact_on_generic(cp, dtype, step):
    """x = 1 + k * step uses every mantissa bit of the dtype, w = +-1: each product is exact only if the
    GEMM keeps all of them, and every sum (< 2**11 in multiples of step) is exact in fp32."""
    r = np.random.default_rng(3)
    dt = DTYPES[dtype]
    x = (1 + step * r.integers(0, int(1 / step), (2, 8, 8, 64))).astype(dt)
    w = r.choice([-1.0, 1.0], (16, 3, 3, 64)).astype(dt)
    want = cuconv.reference.conv2d(x, w, padding=1).astype(dt)
    got = cuconv.conv2d(cp.asarray(x), cp.asarray(w), padding=1, kernel="generic_gpu")
    assert np.array_equal(cp.asnumpy(got).astype(np.float64), want.astype(np.float64))


# ------------------------------------------------------------------------------------ depthwise, matmul
def test_depthwise_float32_at_tf32_keeps_fp32_accuracy(cp):
    if _cc() < (8, 0):
        pytest.skip("depthwise_direct needs sm_80+")
    r = np.random.default_rng(4)
    x = r.standard_normal((2, 16, 16, 64)).astype(np.float32)
    w = (r.standard_normal((64, 3, 3, 1)) / 3).astype(np.float32)
    e = cuconv.explain(cp.asarray(x), cp.asarray(w), padding=1, groups=64, precision="tf32")
    assert e.kernel == "depthwise_direct" and e.precision == "tf32" and "more accurate than tf32 asks" in e.reason
    got = cuconv.conv2d(cp.asarray(x), cp.asarray(w), padding=1, groups=64, precision="tf32")
    assert rel_error(got, cuconv.reference.conv2d(x, w, padding=1, groups=64)) <= 1e-5


def test_matmul_precisions(cp):
    r = np.random.default_rng(5)
    a = r.standard_normal((1024, 4608)).astype(np.float32)
    b = (r.standard_normal((4608, 256)) / math.sqrt(4608)).astype(np.float32)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    ag, bg = cp.asarray(a), cp.asarray(b)
    assert rel_error(cuconv.matmul(ag, bg), ref) <= 1e-5
    err = rel_error(cuconv.matmul(ag, bg, precision="tf32"), ref)
    assert err <= 5e-3 and (err > 1e-5 or _cc() < (8, 0))
    hi = cuconv.matmul(ag, bg, precision="float64")
    assert hi.dtype == cp.float32 and rel_error(hi, ref) <= 1e-7


def test_matmul_float64_with_epilogue(cp):
    r = np.random.default_rng(6)
    a, b = r.standard_normal((300, 700)), r.standard_normal((700, 90)) / 26
    bias, res = r.standard_normal(90), r.standard_normal((300, 90))
    v = 0.1 * (a @ b) + bias - 0.5 * res
    erf = np.vectorize(math.erf)
    want = 0.5 * v * (1 + erf(v / math.sqrt(2)))
    got = cuconv.matmul(cp.asarray(a), cp.asarray(b), bias=cp.asarray(bias), residual=cp.asarray(res), alpha=0.1,
                        beta=-0.5, activation="gelu")
    assert got.dtype == cp.float64 and rel_error(got, want) <= 1e-12
