"""``precision=`` and float64 arrays on the CPU (no GPU).

* ``precision`` is validated per dtype with a ValueError naming it, on every entry point (conv2d,
  conv3d, explain, plan_conv2d / plan_conv3d, matmul); None resolves to the dtype's default.
* The precision is a field of the problem: it keys the problem memo, the plan memo and the call
  signature, and ``explain`` prints it.
* float64 data compute in float64 on the CPU (relative error 1e-12 against the reference), float32 at
  precision "float64" only round the result, float64 at precision "float32" computes in float32.
* Each kernel accepts exactly the (dtype, precision) pairs it is designed for and declines the others
  with a reason naming the dtype.
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest

import cuconv
from cuconv import api, dispatch
from cuconv.backends.generic_gpu import _ROUTES
from cuconv.device import CPU, DeviceInfo
from cuconv.overrides import Overrides
from cuconv.plan import EVERY_PRECISION, FLOAT32_FFMA, SIXTEEN_BIT, Declined, Kernel
from cuconv.problem import PRECISIONS, ConvProblem

from conftest import random_array, rel_error
from geometry import A100, H100, problem2d, problem3d

MI300 = DeviceInfo(kind="hip", index=0, name="MI300X", arch="gfx942", sm_count=304)
rng = np.random.default_rng(30)
X32 = random_array(rng, (2, 7, 6, 8), "float32")
W32 = random_array(rng, (6, 3, 3, 8), "float32", scale=1 / 72 ** 0.5)


def _f64(*arrays):
    return [a.astype(np.float64) for a in arrays]


# ------------------------------------------------------------------------------------------ validation
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("value", ["float32", "tf32", "float64", "float16", "bfloat16"])
def test_sixteen_bit_data_take_none_only(dtype, value):
    x, w = random_array(rng, (1, 5, 5, 4), dtype), random_array(rng, (4, 3, 3, 4), dtype)
    before = x.copy()
    with pytest.raises(ValueError, match=rf"^precision: {dtype} data take precision=None only.*got '{value}'"):
        cuconv.conv2d(x, w, precision=value)
    assert np.array_equal(x.view(np.uint16), before.view(np.uint16))
    assert cuconv.conv2d(x, w, precision=None).dtype == x.dtype
    assert cuconv.explain(x, w).precision == dtype


def test_tf32_is_refused_for_float64_data():
    x, w = _f64(X32, W32)
    for fn in (cuconv.conv2d, cuconv.explain, cuconv.plan_conv2d):
        with pytest.raises(ValueError, match=r"^precision: float64 data take None or one of \('float64', 'float32'\), "
                                             r"got 'tf32'"):
            fn(x, w, precision="tf32")


@pytest.mark.parametrize("value", ["float128", "fp32", "", 32, 1.0, True, ("tf32",)])
def test_unknown_precision_values(value):
    for fn in (cuconv.conv2d, cuconv.explain, cuconv.plan_conv2d):
        with pytest.raises(ValueError, match=r"^precision: expected None or one of \('float32', 'tf32', 'float64'\)"):
            fn(X32, W32, precision=value)
    with pytest.raises(ValueError, match=r"^precision: expected None"):
        cuconv.matmul(X32[0, 0], W32[:, 0, 0].T, precision=value)


def test_unhashable_precision_takes_the_full_path():
    with pytest.raises(ValueError, match=r"^precision: expected None"):
        cuconv.conv2d(X32, W32, precision=["tf32"])


def test_conv3d_and_matmul_validate_precision():
    x3, w3 = random_array(rng, (1, 4, 5, 5, 4), "bfloat16"), random_array(rng, (4, 2, 3, 3, 4), "bfloat16")
    with pytest.raises(ValueError, match=r"^precision: bfloat16 data take precision=None only"):
        cuconv.conv3d(x3, w3, precision="tf32")
    with pytest.raises(ValueError, match=r"^precision: bfloat16 data take precision=None only"):
        cuconv.plan_conv3d(x3, w3, precision="float32")
    a = random_array(rng, (3, 4), "float64")
    with pytest.raises(ValueError, match=r"^precision: float64 data take None or one of"):
        cuconv.matmul(a, a.T, precision="tf32")


def test_precision_ignores_case():
    assert cuconv.explain(X32, W32, precision="TF32").precision == "tf32"
    assert cuconv.explain(X32, W32, precision="Float64").precision == "float64"


def test_problem_checks_its_precision():
    geometry = dict(nd=2, batch=1, in_spatial=(4, 4), channels=2, out_channels=2, filter_spatial=(1, 1), stride=1,
                    dilation=1, padding=0, groups=1, layout="NHWC")
    with pytest.raises(ValueError, match=r"^precision: expected one of \('float16',\) for float16 data, got 'tf32'"):
        ConvProblem.create(dtype="float16", precision="tf32", **geometry)
    p = ConvProblem.create(dtype="float32", precision="tf32", **geometry)
    q = pickle.loads(pickle.dumps(p))
    assert q == p and hash(q) == hash(p) and q.precision == "tf32"
    assert problem2d(dtype="float64").precision == "float64" and problem2d().precision == "bfloat16"
    assert problem2d(dtype="float64").itemsize == 8


# ------------------------------------------------------------------------------------- explain and memos
def test_explain_names_the_precision():
    for kwargs, want in (({}, "float32"), ({"precision": "float32"}, "float32"), ({"precision": "tf32"}, "tf32"),
                         ({"precision": "float64"}, "float64")):
        e = cuconv.explain(X32, W32, padding=1, **kwargs)
        assert e.precision == want and e.problem.precision == want
        text = str(e)
        assert f"precision: {want} (" in text and f"(precision {want})" in text.splitlines()[0]
    e = cuconv.explain(*_f64(X32, W32))
    assert e.precision == "float64" and "precision: float64 (float64 products and accumulation)" in str(e)
    tf32 = cuconv.explain(X32, W32, precision="tf32")
    assert tf32.kernel == "cpu" and "more accurate than tf32 asks" in tf32.reason


def test_none_and_the_default_name_are_one_problem():
    a = cuconv.explain(X32, W32, padding=1)
    b = cuconv.explain(X32, W32, padding=1, precision="float32")
    assert a.problem == b.problem and a.plan is b.plan


def test_plans_are_memoised_per_precision():
    f32, tf32 = problem2d(dtype="float32"), dataclass_replace(problem2d(dtype="float32"), precision="tf32")
    assert f32 != tf32 and hash(f32) != hash(tf32)
    p1, _ = dispatch.select(f32, CPU)
    p2, _ = dispatch.select(tf32, CPU)
    assert p1 is not p2 and p1.problem.precision == "float32" and p2.problem.precision == "tf32"
    assert dispatch.select(tf32, CPU)[0] is p2


def dataclass_replace(p, **changes):
    import dataclasses
    return dataclasses.replace(p, **changes)


def test_call_signature_keys_the_precision():
    api._CALLS.clear()
    x, w = _f64(X32, W32)
    for precision in (None, "float64", "float32", None, "float32"):
        cuconv.conv2d(x, w, padding=1, precision=precision)
    assert len(api._CALLS) == 3  # None, "float64" and "float32": three signatures, two problems
    plans = {k[-2]: v.plan for k, v in api._CALLS.items()}
    assert plans[None].problem.precision == plans["float64"].problem.precision == "float64"
    assert plans["float32"].problem.precision == "float32"
    # a repeated call at another precision computes at that precision
    exact = cuconv.reference.conv2d(x, w, padding=1)
    assert rel_error(cuconv.conv2d(x, w, padding=1), exact) <= 1e-12
    assert rel_error(cuconv.conv2d(x, w, padding=1, precision="float32"), exact) > 1e-10


def test_conv_plan_carries_the_precision():
    x, w = _f64(X32, W32)
    plan = cuconv.plan_conv2d(x, w, padding=1, precision="float32")
    assert plan.problem.precision == "float32" and plan.explanation.precision == "float32"
    exact = cuconv.reference.conv2d(x, w, padding=1)
    got = plan(x, w)
    assert got.dtype == np.float64 and 1e-10 < rel_error(got, exact) <= 1e-5
    assert rel_error(cuconv.plan_conv2d(x, w, padding=1)(x, w), exact) <= 1e-12


# ------------------------------------------------------------------------------------------- CPU float64
EPILOGUES = [dict(), dict(bias=True, activation="gelu", alpha=0.1),
             dict(bias=True, residual=True, beta=-0.3, activation="silu", alpha=-1.25),
             dict(residual=True, beta=0.7, activation="relu")]


@pytest.mark.parametrize("ep", EPILOGUES, ids=lambda e: ",".join(f"{k}={v}" for k, v in e.items()) or "plain")
@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
def test_float64_conv2d_matches_the_reference(ep, layout):
    r = np.random.default_rng(7)
    x = r.standard_normal((2, 9, 8, 12))
    w = r.standard_normal((6, 3, 3, 4)) / 6
    kw = dict(padding=((1, 0), (2, 1)), stride=(1, 2), dilation=(2, 1), groups=3, alpha=ep.get("alpha", 1.0),
              beta=ep.get("beta", 1.0), activation=ep.get("activation"), layout=layout)
    if layout == "NCHW":
        x, w = np.moveaxis(x, -1, 1), np.moveaxis(w, -1, 1)
    bias = r.standard_normal(6) if ep.get("bias") else None
    want0 = cuconv.reference.conv2d(x, w, bias, **kw)
    residual = r.standard_normal(want0.shape) if ep.get("residual") else None
    want = cuconv.reference.conv2d(x, w, bias, residual=residual, **kw)
    out = np.full(want.shape, np.nan)
    got = cuconv.conv2d(x, w, bias, residual=residual, out=out, **kw)
    assert got is out and got.dtype == np.float64
    assert rel_error(got, want) <= 1e-12


def test_float64_conv3d_and_epilogue_alone():
    r = np.random.default_rng(8)
    x, w = r.standard_normal((1, 5, 6, 7, 4)), r.standard_normal((3, 2, 3, 3, 4)) / 5
    bias, res = r.standard_normal(3), r.standard_normal((1, 4, 4, 5, 3))
    kw = dict(padding=((0, 0), (0, 0), (0, 0)), activation="gelu", beta=0.1)
    assert rel_error(cuconv.conv3d(x, w, bias, residual=res, **kw),
                     cuconv.reference.conv3d(x, w, bias, residual=res, **kw)) <= 1e-12
    # alpha = 0: the epilogue alone, in float64 too
    got = cuconv.conv3d(x, w, bias, residual=res, alpha=0.0, **kw)
    assert rel_error(got, cuconv.reference.conv3d(x, w, bias, residual=res, alpha=0.0, **kw)) <= 1e-12


def test_float32_data_at_precision_float64_round_only_the_result():
    exact = cuconv.reference.conv2d(X32, W32, padding=1, activation="gelu")
    got = cuconv.conv2d(X32, W32, padding=1, activation="gelu", precision="float64")
    assert got.dtype == np.float32
    assert rel_error(got, exact) <= 1e-7  # float32's rounding of each output (2**-24 relative) and no more
    assert "float64 matmul" in cuconv.explain(X32, W32, padding=1, precision="float64").detail


def test_matmul_float64_and_precisions_on_the_cpu():
    r = np.random.default_rng(9)
    a, b = r.standard_normal((33, 70)), r.standard_normal((70, 21))
    bias, res = r.standard_normal(21), r.standard_normal((33, 21))
    want = np.maximum(0.1 * (a @ b) + bias - 0.5 * res, 0)
    got = cuconv.matmul(a, b, bias=bias, residual=res, alpha=0.1, beta=-0.5, activation="relu")
    assert got.dtype == np.float64 and rel_error(got, want) <= 1e-12
    low = cuconv.matmul(a, b, bias=bias, residual=res, alpha=0.1, beta=-0.5, activation="relu", precision="float32")
    assert low.dtype == np.float64 and 1e-10 < rel_error(low, want) <= 1e-5
    a32, b32 = a.astype(np.float32), b.astype(np.float32)
    hi = cuconv.matmul(a32, b32, precision="float64")
    assert hi.dtype == np.float32 and rel_error(hi, a32.astype(np.float64) @ b32) <= 1e-7


# ----------------------------------------------------------------------------------- kernels and pairs
#: float32 as split bf16 products (sm90_bf16x3): float32 accuracy, and more than "tf32" asks.
FLOAT32_SPLIT = frozenset({("float32", "float32"), ("float32", "tf32")})
#: kernel -> (device, a problem it plans in bfloat16, the (dtype, precision) pairs it is designed to accept)
DESIGN = {
    "cpu": (CPU, dict(), EVERY_PRECISION),
    "generic_gpu": (H100, dict(), EVERY_PRECISION),
    "depthwise_direct": (A100, dict(C=48, K=48, groups=48), SIXTEEN_BIT | FLOAT32_FFMA),
    "depthwise_mma": (A100, dict(C=48, K=48, groups=48, R=7, S=7, padding=3), SIXTEEN_BIT),
    "depthwise_diag": (A100, dict(C=48, K=48, groups=48), SIXTEEN_BIT),
    "smallc_direct": (A100, dict(C=3, K=32), SIXTEEN_BIT | FLOAT32_FFMA),
    "smallc_mma": (A100, dict(C=3, K=64, R=7, S=7), SIXTEEN_BIT),
    "narrowk_direct": (A100, dict(C=64, K=3), FLOAT32_FFMA),
    "pointwise_mma": (A100, dict(C=24, K=144, R=1, S=1, padding=0), SIXTEEN_BIT),
    "pointwise_narrow": (A100, dict(C=16, K=1, R=1, S=1, padding=0), SIXTEEN_BIT | FLOAT32_FFMA),
    "cdna3_depthwise": (MI300, dict(C=48, K=48, groups=48), SIXTEEN_BIT | FLOAT32_FFMA),
    "sm90_tma": (H100, dict(C=64, K=64), SIXTEEN_BIT),
    "sm90_bf16x3": (H100, dict(C=64, K=64), FLOAT32_SPLIT),
    "sm90_fold": (H100, dict(C=4, K=64), SIXTEEN_BIT),
    "sm90_patch": (H100, dict(H=32, W=32, C=3, K=64, R=16, S=16, stride=16, padding=0), SIXTEEN_BIT),
    "sm90_wpack": (H100, dict(N=16, H=160, W=160, C=32, K=32), SIXTEEN_BIT),
    "conv3d_native_wpack": (H100, dict(nd=3, N=4, D=16, H=96, W=96, C=32, K=32), SIXTEEN_BIT),
    "sm90_grouped": (H100, dict(C=128, K=128, groups=8), SIXTEEN_BIT),
    "conv3d_grouped": (H100, dict(nd=3, C=128, K=128, groups=8), SIXTEEN_BIT),
    "conv3d_native_bf16x3": (H100, dict(nd=3, C=64, K=64), FLOAT32_SPLIT),
    "sm90_tf32": (H100, dict(C=64, K=64), frozenset({("float32", "tf32")})),
    "conv3d_native_tf32": (H100, dict(nd=3, C=64, K=64), frozenset({("float32", "tf32")})),
    "conv3d_native": (H100, dict(nd=3, C=64, K=64), SIXTEEN_BIT),
    "conv3d_qslice": (H100, dict(nd=3, C=64, K=64, padding=((0, 0), (1, 1), (1, 1))), SIXTEEN_BIT),
    "sm80_igemm": (A100, dict(C=64, K=64), SIXTEEN_BIT),
    "sm80_tf32": (A100, dict(C=64, K=64), frozenset({("float32", "tf32")})),
    "cdna3_igemm": (MI300, dict(C=64, K=64), SIXTEEN_BIT),
}


def _problem(dtype, precision, nd=2, **kw):
    p = (problem3d if nd == 3 else problem2d)(dtype=dtype, **kw)
    return dataclass_replace(p, precision=precision)


def test_the_design_covers_every_kernel():
    assert set(DESIGN) == {k.name for k in cuconv.kernels()}
    assert set(_ROUTES) == EVERY_PRECISION == {(d, p) for d, ps in PRECISIONS.items() for p in ps}


@pytest.mark.parametrize("name", list(DESIGN))
def test_each_kernel_accepts_exactly_its_pairs(name):
    kernel = next(k for k in cuconv.kernels() if k.name == name)
    device, kw, accepted = DESIGN[name]
    assert kernel.precisions == accepted
    for dtype, precision in sorted(EVERY_PRECISION):
        answer = kernel.plan(_problem(dtype, precision, **kw), device, Overrides())
        if (dtype, precision) in accepted:
            assert answer, f"{name} declines {dtype} at {precision}: {answer}"
            exact_tf32 = name in ("generic_gpu", "sm90_tf32", "conv3d_native_tf32", "sm80_tf32")  # tf32 as asked
            assert ("more accurate than tf32 asks" in answer.reason) == (precision == "tf32" and not exact_tf32)
        else:
            assert isinstance(answer, Declined) and answer.reason.startswith(f"dtype {dtype}"), (name, answer)
            if precision != dtype:
                assert f"at precision {precision}" in answer.reason


def test_generic_gpu_routes_each_precision():
    kernel = next(k for k in cuconv.kernels() if k.name == "generic_gpu")
    want = {("float32", "float32"): ("float32", 0, "TF32 off"), ("float32", "tf32"): ("tf32", 0, "TF32 tensor cores"),
            ("float32", "float64"): ("float64", 1, "DGEMM"), ("float64", "float64"): ("float64", 1, "DGEMM"),
            ("float64", "float32"): ("float32", 0, "TF32 off"), ("float16", "float16"): ("exact32", 0, "exact"),
            ("bfloat16", "bfloat16"): ("exact32", 0, "exact")}
    for (dtype, precision), (gemm, acc, words) in want.items():
        plan = kernel.plan(_problem(dtype, precision), H100, Overrides())
        assert plan.gemm_precision == gemm and plan.acc_double == acc and words in plan.reason
        (source, defines), = plan.compile_jobs()
        assert defines["CUCONV_ACC"] == acc and defines["CUCONV_DTYPE"] == ["float16", "bfloat16", "float32",
                                                                            "float64"].index(dtype)
        assert f"cuBLAS {gemm} GEMM" in plan.describe()


def test_a_kernel_declares_16_bit_pairs_unless_it_says_more():
    class Sixteen(Kernel):
        name, backend = "sixteen_test_kernel", "cpu"

        def make_plan(self, problem, device, overrides):
            raise AssertionError("asked for a pair it does not honour")

    answer = Sixteen().plan(problem2d(dtype="float32"), CPU, Overrides())
    assert not answer and answer.reason == "dtype float32: this kernel computes float16, bfloat16 only"


def test_float64_on_a_gpu_falls_back_to_generic_visibly():
    p = _problem("float64", "float64", C=48, K=48, groups=48)
    plan, e = dispatch.select(p, H100)
    assert e.kernel == "generic_gpu" and e.precision == "float64"
    assert e.declined["depthwise_direct"].startswith("dtype float64")
    tf32_dw = dispatch.select(_problem("float32", "tf32", C=48, K=48, groups=48), H100)[1]
    assert tf32_dw.kernel == "depthwise_direct" and "more accurate than tf32 asks" in tf32_dw.reason


def test_epilogue_alone_keeps_float64_alpha_and_beta():
    x, w = _f64(X32, W32)
    res = np.full((2, 5, 4, 6), 1 / 3)
    assert np.array_equal(cuconv.conv2d(x, w, residual=res, alpha=0.0, beta=0.1), 0.1 * res)
