"""Reusable plans (cuconv.plan_conv2d / plan_conv3d): the same results as the calls, per-call checks."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import cuconv

gpu = pytest.mark.gpu

RNG = np.random.default_rng(0)


def _arrays(shape_x, shape_w, k, dtype=np.float32):
    return (RNG.standard_normal(shape_x).astype(dtype), RNG.standard_normal(shape_w).astype(dtype),
            RNG.standard_normal(k).astype(dtype))


CASES = {
    "nhwc": dict(nd=2, layout="NHWC", xs=(2, 7, 6, 4), ws=(8, 3, 3, 4), kw=dict(padding=1, activation="relu")),
    "nchw_stride": dict(nd=2, layout="NCHW", xs=(2, 4, 9, 7), ws=(6, 2, 3, 3), kw=dict(stride=2, groups=2)),
    "ndhwc": dict(nd=3, layout="NDHWC", xs=(1, 4, 5, 5, 3), ws=(4, 2, 3, 3, 3), kw=dict(padding="same")),
    "alpha0": dict(nd=2, layout="NHWC", xs=(1, 5, 5, 2), ws=(3, 3, 3, 2), kw=dict(padding=1, alpha=0.0)),
    "empty": dict(nd=2, layout="NHWC", xs=(0, 5, 5, 2), ws=(3, 3, 3, 2), kw=dict(padding=1)),
}


def _run(xp, case, with_residual, use_out, to_xp=lambda a: a):
    c = CASES[case]
    x, w, b = (to_xp(a) for a in _arrays(c["xs"], c["ws"], c["ws"][0]))
    fn = cuconv.conv3d if c["nd"] == 3 else cuconv.conv2d
    make = cuconv.plan_conv3d if c["nd"] == 3 else cuconv.plan_conv2d
    want = fn(x, w, b, layout=c["layout"], **c["kw"])
    res = to_xp(RNG.standard_normal(want.shape).astype(np.float32)) if with_residual else None
    if with_residual:
        want = fn(x, w, b, layout=c["layout"], residual=res, **c["kw"])
    plan = make(x, w, b, layout=c["layout"], residual=res, **c["kw"])
    out = xp.empty_like(want) if use_out else None
    got = plan(x, w, b, residual=res, out=out)
    if use_out:
        assert got is out
    assert got.shape == want.shape and xp.array_equal(got, want)
    x2, w2, b2 = (to_xp(a) for a in _arrays(c["xs"], c["ws"], c["ws"][0]))  # new arrays, same plan
    assert xp.array_equal(plan(x2, w2, b2, residual=res), fn(x2, w2, b2, layout=c["layout"], residual=res, **c["kw"]))


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("with_residual", [False, True])
@pytest.mark.parametrize("use_out", [False, True])
def test_plan_equals_the_call(case, with_residual, use_out):
    _run(np, case, with_residual, use_out)


def test_plan_replays_arrays_like_its_example_and_checks_the_others(monkeypatch):
    """Arrays of the example's shapes, strides, dtype and library go straight to the kernel plan's run (no
    per-call validation: ``execute`` is not reached); a strided view, an ``out`` view and an ``out`` that
    overlaps x take the checked path and still give the call's result."""
    from cuconv import conv_plan
    x, w, b = _arrays((2, 6, 6, 4), (8, 3, 3, 4), 8)
    plan = cuconv.plan_conv2d(x, w, b, padding=1)
    want = cuconv.conv2d(x, w, b, padding=1)
    checked = []
    real_execute = conv_plan.execute
    monkeypatch.setattr(conv_plan, "execute", lambda *a: (checked.append(1), real_execute(*a)))
    x2, w2, b2 = x.copy(), w.copy(), b.copy()
    assert np.array_equal(plan(x2, w2, b2), want) and not checked
    out = np.empty_like(want)
    assert plan(x2, w2, b2, out=out) is out and np.array_equal(out, want) and not checked
    wide = np.zeros((2, 6, 12, 4), np.float32)
    wide[:, :, ::2] = x
    assert np.array_equal(plan(wide[:, :, ::2], w, b), want) and checked
    checked.clear()
    big = np.zeros((2, 6, 6, 16), np.float32)
    assert plan(x, w, b, out=big[..., :8]) is not None and np.array_equal(big[..., :8], want) and checked
    checked.clear()
    x8 = np.concatenate([x, x], axis=-1)  # out=x (8 -> 8 channels): computed apart, then copied into x
    w8 = np.concatenate([w, w], axis=-1)
    want8 = cuconv.conv2d(x8, w8, b, padding=1)
    plan8 = cuconv.plan_conv2d(x8, w8, b, padding=1)
    assert plan8(x8, w8, b, out=x8) is x8 and np.array_equal(x8, want8)


def test_plan_refuses_what_it_was_not_made_for():
    x, w, b = _arrays((2, 6, 6, 4), (8, 3, 3, 4), 8)
    plan = cuconv.plan_conv2d(x, w, b, padding=1)
    with pytest.raises(ValueError, match="^x: this plan was made for shape"):
        plan(x[:1], w, b)
    with pytest.raises(ValueError, match="^w: this plan was made for shape .* dtype float32"):
        plan(x, w.astype(ml_dtypes.bfloat16), b)
    with pytest.raises(ValueError, match="^bias: this plan was made with a bias"):
        plan(x, w)
    with pytest.raises(ValueError, match="^residual: this plan was made without"):
        plan(x, w, b, residual=np.zeros((2, 6, 6, 8), np.float32))
    with pytest.raises(ValueError, match="^out: expected"):
        plan(x, w, b, out=np.zeros((2, 6, 6, 7), np.float32))
    with pytest.raises(TypeError, match="^x: expected an array"):
        plan(1.0, w, b)
    with pytest.raises(ValueError, match="^padding:"):  # making a plan validates as the call does
        cuconv.plan_conv2d(x, w, padding="sometimes")
    assert plan.explanation.kernel == "cpu"


def test_residual_in_place_through_a_plan():
    x, w, b = _arrays((1, 5, 5, 3), (4, 3, 3, 3), 4)
    r = RNG.standard_normal((1, 5, 5, 4)).astype(np.float32)
    want = cuconv.conv2d(x, w, b, padding=1, residual=r)
    plan = cuconv.plan_conv2d(x, w, b, padding=1, residual=r)
    assert plan(x, w, b, residual=r, out=r) is r and np.array_equal(r, want)


@gpu
@pytest.mark.parametrize("case", ["nhwc", "nchw_stride", "ndhwc"])
@pytest.mark.parametrize("with_residual", [False, True])
def test_plan_equals_the_call_on_the_gpu(cp, case, with_residual):
    bf = lambda a: cp.asarray(a.astype(ml_dtypes.bfloat16))  # noqa: E731
    _run(cp, case, with_residual, use_out=True, to_xp=bf)
