"""``sm80_tf32``: float32 conv2d at precision "tf32" on the portable sm_80+ kernel (16-bit view, tf32 mma.sync).

CPU: the dispatcher's choice (Hopper keeps its own kernels and sends grouped layers here; an sm_80 GPU
runs every float32 "tf32" conv2d here; precision "float32" never), the view the plan hands the loaders.
GPU (any sm_80+): drawn calls (any C, groups, stride, dilation, padding, every epilogue term, NHWC and
NCHW, the residual in place) against the float64 reference, each output within one TF32 product's
bound (2^-9 of alpha (|x| (*) |w|), as tests/test_tf32_gpu.py); a 4,608-term layer whose error shows
the TF32 truncation and matches the float64 convolution of the truncated operands.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import given, settings

import cuconv
from cuconv import dispatch
from cuconv.overrides import Overrides

from geometry import A100, H100, cases, make_operands, problem2d
from test_split_precision_gpu import assert_within_split_bound
from test_tf32_gpu import TF32_PRODUCT, assert_tf32_products


def _f32(**kw):
    return dataclasses.replace(problem2d(dtype="float32", **kw), precision="tf32")


def test_an_sm80_gpu_runs_float32_tf32_here_and_hopper_keeps_its_kernels():
    p = _f32(C=64, K=64)
    assert dispatch.select(p, A100)[0].kernel.name == "sm80_tf32"
    assert dispatch.select(p, H100)[0].kernel.name == "sm90_tf32"
    grouped = _f32(C=64, K=64, groups=16)
    plan, e = dispatch.select(grouped, H100)
    assert plan.kernel.name == "sm80_tf32", str(e)
    exact = dataclasses.replace(p, precision="float32")
    assert dispatch.select(exact, A100)[0].kernel.name != "sm80_tf32"


def test_the_plan_is_the_16bit_view_with_a_tf32_epilogue():
    plan = cuconv.backends.sm80.Sm80Tf32Kernel().plan(_f32(C=6, K=20, groups=2), A100, Overrides())
    assert plan.view.dtype == "bfloat16" and plan.view.channels == 12 and plan.view.groups == 2
    assert plan.view.channels_per_group == 6 and plan.subpath == "per_lane"
    assert "_tf32_" in plan.describe() and "float32 epilogue" in plan.describe()
    (_, defines), = plan.compile_jobs()
    assert defines["CUCONV_TF32"] == 1 and defines["CUCONV_DTYPE"] == 1
    # grouped_mma has no tf32 form: its problems take the per-lane loader
    # (C/g = 4 floats: the view has 8 channels per group, as many as K/g: what grouped_mma would take)
    depthwise = cuconv.backends.sm80.Sm80Tf32Kernel().plan(_f32(C=32, K=64, groups=8), A100, Overrides())
    assert depthwise.subpath == "per_lane" and "no tf32 form" in depthwise.reason


def test_forced_subpaths_without_a_tf32_form_decline():
    kernel = cuconv.backends.sm80.Sm80Tf32Kernel()
    declined = kernel.make_plan(_f32(C=32, K=64, groups=8), A100, Overrides(sm80_subpath="grouped_mma"))
    assert not declined and "no tf32 form" in declined.reason
    assert kernel.make_plan(_f32(C=32, K=64, groups=8), A100, Overrides(sm80_subpath="per_lane"))


# --- GPU ---------------------------------------------------------------------------------------

def _needs_sm80(cp):
    if cp.cuda.Device().compute_capability < "80":
        pytest.skip("needs an sm_80+ GPU")


def _check(cp, case, in_place=False):
    _needs_sm80(cp)
    x, w, bias, residual = make_operands(case, cp)
    ep = case.epilogue
    kwargs = dict(case.conv_kwargs(), alpha=ep.get("alpha", 1.0), beta=ep.get("beta", 1.0),
                  activation=ep.get("activation"), precision="tf32")
    e = cuconv.explain(x, w, bias, residual=residual, kernel="sm80_tf32", **kwargs)
    assert e.kernel == "sm80_tf32" and e.precision == "tf32", str(e)
    ref = cuconv.reference.conv2d(x, w, bias, residual=residual,
                                  **{k: v for k, v in kwargs.items() if k != "precision"})
    operands = [None if a is None else cp.asnumpy(a) for a in (x, w, bias, residual)]
    out = residual if in_place and residual is not None else None
    got = cuconv.conv2d(x, w, bias, residual=residual, out=out, kernel="sm80_tf32", **kwargs)
    assert got.dtype == cp.float32 and tuple(got.shape) == ref.shape
    if out is not None:
        assert got is out
    assert_within_split_bound(got, ref, operands, kwargs, product_bound=TF32_PRODUCT)


@pytest.mark.gpu
@settings(max_examples=60, deadline=None)
@given(cases(nd=2, dtypes=("float32",), max_channels=40, max_spatial=14))
def test_drawn_sm80_tf32_conv2d(cp, case):
    _check(cp, case)


@pytest.mark.gpu
@settings(max_examples=20, deadline=None)
@given(cases(nd=2, dtypes=("float32",), max_channels=24, max_spatial=10))
def test_drawn_sm80_tf32_conv2d_in_place(cp, case):
    _check(cp, case, in_place=True)


@pytest.mark.gpu
def test_a_long_reduction_is_tf32_on_sm80(cp):
    """C = 512, 3x3 (4,608 terms): TF32 products (tests/test_tf32_gpu.py assert_tf32_products)."""
    _needs_sm80(cp)
    r = np.random.default_rng(31)
    x = r.standard_normal((2, 12, 12, 512)).astype(np.float32)
    w = (r.standard_normal((96, 3, 3, 512)) / math.sqrt(4608)).astype(np.float32)
    got = cuconv.conv2d(cp.asarray(x), cp.asarray(w), padding=1, precision="tf32", kernel="sm80_tf32")
    assert_tf32_products(cp, got, x, w, 1)
