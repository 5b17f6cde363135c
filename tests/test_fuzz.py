"""A fuzz of random calls, valid and invalid: every valid call matches the reference, every invalid one
raises ValueError/TypeError naming the argument, and no input is modified. Valid calls pass
``precision=None`` or a precision at least as accurate as the dtype's default.

``CUCONV_FUZZ_EXAMPLES`` sets the number of calls (default 300 on NumPy, 100 on CuPy; the acceptance
runs use 10,000 and 2,000).
"""

from __future__ import annotations

import os

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cuconv

ARGUMENT_NAMES = ("x", "w", "bias", "residual", "out", "stride", "padding", "dilation", "groups", "layout",
                  "alpha", "beta", "activation", "output size", "kernel", "strategy", "precision")
DTYPES = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16, "float32": np.float32, "float64": np.float64}
TOL = {"float16": 3e-3, "bfloat16": 2e-2, "float32": 1e-5, "float64": 1e-12}
#: precision= values of valid calls per dtype (None, or one at least as accurate as the default)
VALID_PRECISIONS = {"float16": [None], "bfloat16": [None], "float32": [None, "float32", "float64"],
                    "float64": [None, "float64"]}


def _examples(default: int) -> int:
    return int(os.environ.get("CUCONV_FUZZ_EXAMPLES", default))


@st.composite
def calls(draw):
    """A conv2d / conv3d call; about half of them carry one invalid argument."""
    nd = draw(st.sampled_from([2, 2, 3]))
    dtype = draw(st.sampled_from(list(DTYPES)))
    n, c_per, k_per, groups = (draw(st.integers(1, 2)), draw(st.integers(1, 4)), draw(st.integers(1, 4)),
                               draw(st.integers(1, 3)))
    spatial = tuple(draw(st.integers(1, 7)) for _ in range(nd))
    filt = tuple(draw(st.integers(1, 3)) for _ in range(nd))
    kw = dict(stride=draw(st.integers(1, 2)), dilation=draw(st.integers(1, 2)),
              padding=draw(st.sampled_from(["same", "valid", 0, 1, 2])), groups=groups,
              activation=draw(st.sampled_from([None, "relu", "silu", "gelu", "ReLU"])),
              alpha=draw(st.sampled_from([1.0, 0.5, 0.0])), beta=draw(st.sampled_from([1.0, -0.5, 0.0])))
    channels_first = draw(st.booleans())
    kw["layout"] = {(2, False): "NHWC", (2, True): "NCHW", (3, False): "NDHWC", (3, True): "NCDHW"}[nd, channels_first]
    C, K = c_per * groups, k_per * groups
    x_shape = (n, C, *spatial) if channels_first else (n, *spatial, C)
    w_shape = (K, c_per, *filt) if channels_first else (K, *filt, c_per)
    use_bias, use_res = draw(st.booleans()), draw(st.booleans())
    kw["precision"] = draw(st.sampled_from(VALID_PRECISIONS[dtype]))
    broken = draw(st.none() | st.sampled_from(["stride", "padding", "groups", "layout", "activation", "alpha",
                                               "w_channels", "w_dtype", "bias_shape", "x_rank", "dilation",
                                               "precision"]))
    return dict(nd=nd, dtype=dtype, x_shape=x_shape, w_shape=w_shape, kw=kw, use_bias=use_bias, use_res=use_res,
                broken=broken, K=K, seed=draw(st.integers(0, 2**31 - 1)))


def _break(call, kw, x, w, bias):
    b = call["broken"]
    if b == "stride":
        kw["stride"] = 0
    elif b == "padding":
        kw["padding"] = "most"
    elif b == "groups":
        kw["groups"] = 0
    elif b == "layout":
        kw["layout"] = "NWHC"
    elif b == "activation":
        kw["activation"] = "tanh"
    elif b == "alpha":
        kw["alpha"] = "2"
    elif b == "dilation":
        kw["dilation"] = -1
    elif b == "precision":
        kw["precision"] = "tf32" if call["dtype"] != "float32" else "float16"
    elif b == "w_channels":
        w = np.concatenate([w, w], axis=1 if kw["layout"].startswith("NC") else -1)
    elif b == "w_dtype":
        w = w.astype(np.float32 if call["dtype"] == "float64" else np.float64)
    elif b == "bias_shape":
        bias = np.ones(call["K"] + 1, x.dtype)
    elif b == "x_rank":
        x = x[0]
    return kw, x, w, bias


def _run_call(call, xp):
    rng = np.random.default_rng(call["seed"])
    dt = DTYPES[call["dtype"]]
    x = rng.standard_normal(call["x_shape"]).astype(np.float32).astype(dt)
    w = (rng.standard_normal(call["w_shape"]) * 0.5).astype(np.float32).astype(dt)
    bias = rng.standard_normal(call["K"]).astype(np.float32).astype(dt) if call["use_bias"] else None
    kw = dict(call["kw"])
    kw, x, w, bias = _break(call, kw, x, w, bias)
    precision = kw.pop("precision")  # cuconv's argument; the reference has none
    fn = cuconv.conv3d if call["nd"] == 3 else cuconv.conv2d
    ref_fn = cuconv.reference.conv3d if call["nd"] == 3 else cuconv.reference.conv2d
    try:
        want = ref_fn(x, w, bias, **kw)
    except (ValueError, TypeError) as e:
        want = e
    res = None
    if call["use_res"] and not isinstance(want, Exception):
        res = rng.standard_normal(want.shape).astype(np.float32).astype(dt)
        want = ref_fn(x, w, bias, residual=res, **kw)
    args = [a for a in (x, w, bias, res) if a is not None]
    before = [a.copy() for a in args]
    dev = [xp.asarray(a) for a in (x, w)] + [None if a is None else xp.asarray(a) for a in (bias, res)]
    try:
        got = fn(dev[0], dev[1], dev[2], residual=dev[3], precision=precision, **kw)
    except (ValueError, TypeError) as e:
        assert call["broken"] is not None or isinstance(want, Exception), f"valid call refused: {e}"
        assert str(e).split(":")[0] in ARGUMENT_NAMES, f"the message names no argument: {e}"
        return
    assert not isinstance(want, Exception), f"cuconv accepted what the reference refuses: {want}"
    assert call["broken"] is None, f"invalid argument {call['broken']} accepted"
    got = got if isinstance(got, np.ndarray) else got.get()
    got = got.astype(np.float64)
    assert np.isfinite(got).all() or not np.isfinite(want).all()
    scale = max(np.linalg.norm(want), 1e-3)
    assert np.linalg.norm(got - want) / scale < TOL[call["dtype"]] * 4
    for a, b in zip(args, before):  # nothing the caller passed is modified
        assert np.array_equal(a.view(np.uint8), b.view(np.uint8))
    for a, b in zip([d for d in dev if d is not None], [x, w] + [a for a in (bias, res) if a is not None]):
        assert np.array_equal(np.asarray(a if xp is np else a.get()).view(np.uint8), b.view(np.uint8))


@settings(max_examples=_examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(call=calls())
def test_fuzz_numpy(call):
    _run_call(call, np)


@pytest.mark.gpu
@settings(max_examples=_examples(100), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(call=calls())
def test_fuzz_cupy(call):
    import cupy
    _run_call(call, cupy)
