"""conv3d Q-slice strategy (T fast 2-D convs + fp32 accumulator) on a Hopper GPU.

gpu-marked; skipped unless the GPU is a Hopper (the slices run on the sm90_tma kernel).
"""

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import cuconv
from cuconv.problem import output_size

from conftest import TOLERANCE, assert_close, hopper_available, random_array, rel_error
from geometry import Case, check_case

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not hopper_available(),
                                 reason="the Q-slice strategy runs its slices on the Hopper kernel")]


@st.composite
def qslice_cases(draw):
    T = draw(st.integers(2, 3))
    spatial = (draw(st.integers(T, T + 3)), draw(st.integers(1, 12)), draw(st.integers(1, 12)))
    filt = (T, draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    pads = ((0, 0), (draw(st.integers(0, 2)), draw(st.integers(0, 2))), (draw(st.integers(0, 2)), draw(st.integers(0, 2))))
    for n, f, (lo, hi) in zip(spatial, filt, pads):
        assume(output_size(n, f, 1, 1, lo, hi) >= 1)
    ep = {"alpha": draw(st.sampled_from([1.0, 0.5])), "activation": draw(st.sampled_from([None, "relu", "gelu"]))}
    if draw(st.booleans()):
        ep["bias"] = True
    if draw(st.booleans()):
        ep["residual"] = True
        ep["beta"] = draw(st.sampled_from([1.0, -0.5]))
    return Case(nd=3, batch=draw(st.integers(1, 2)), spatial=spatial, channels=draw(st.sampled_from([64, 128])),
                out_channels=draw(st.sampled_from([64, 128, 192])), filt=filt, stride=(1, 1, 1), dilation=(1, 1, 1),
                padding=pads, groups=1, dtype=draw(st.sampled_from(["bfloat16", "float16"])),
                layout=draw(st.sampled_from(["NDHWC", "NCDHW"])), epilogue=ep, seed=draw(st.integers(0, 2**31 - 1)))


@settings(max_examples=25)
@given(qslice_cases())
def test_qslice_matches_reference(cp, case):
    check_case(case, xp=cp, kernel="conv3d_qslice", poison=True)


def _operands(cp, shape, K, T, dtype, seed=0):
    rng = np.random.default_rng(seed)
    x = cp.asarray(random_array(rng, shape, dtype))
    w = cp.asarray(random_array(rng, (K, T, 3, 3, shape[-1]), dtype, scale=(T * 9 * shape[-1]) ** -0.5))
    return x, w


def test_k_padding_192_and_fused_epilogue(cp):
    x, w = _operands(cp, (1, 5, 9, 11, 64), 192, 3, "bfloat16", seed=1)
    rng = np.random.default_rng(2)
    b = cp.asarray(random_array(rng, (192,), "bfloat16"))
    res = cp.asarray(random_array(rng, (1, 3, 9, 11, 192), "bfloat16"))
    kw = dict(padding=((0, 0), (1, 1), (1, 1)), alpha=0.75, beta=-1.5, activation="gelu")
    e = cuconv.explain(x, w, b, residual=res, strategy="qslice", **kw)
    assert e.kernel == "conv3d_qslice" and "192 -> 256" in e.reason, str(e)
    out = cp.full((1, 3, 9, 11, 192), cp.nan, dtype=x.dtype)
    y = cuconv.conv3d(x, w, b, residual=res, out=out, strategy="qslice", **kw)
    assert_close(y, cuconv.reference.conv3d(x, w, b, residual=res, **kw), "bfloat16")


@pytest.mark.parametrize("kwargs,reason", [
    (dict(stride=(1, 2, 2)), "needs stride 1"),
    (dict(padding=1), "needs no temporal padding"),
    (dict(dilation=(1, 2, 1)), "needs stride 1 and dilation 1"),
])
def test_declined_cases_fall_through_visibly(cp, kwargs, reason):
    x, w = _operands(cp, (1, 6, 8, 8, 64), 64, 3, "bfloat16")
    e = cuconv.explain(x, w, **kwargs)
    assert e.kernel != "conv3d_qslice" and reason in e.declined["conv3d_qslice"], str(e)
    with pytest.raises(cuconv.KernelDeclined, match="qslice"):
        cuconv.conv3d(x, w, strategy="qslice", **kwargs)
    y = cuconv.conv3d(x, w, **kwargs)  # the fallback still gives the right answer
    assert_close(y, cuconv.reference.conv3d(x, w, **kwargs), "bfloat16")


def test_channel_gate(cp):
    x, w = _operands(cp, (1, 4, 6, 6, 32), 64, 2, "float16")
    e = cuconv.explain(x, w, padding=((0, 0), (1, 1), (1, 1)))
    assert "multiples of 64" in e.declined["conv3d_qslice"]


def test_fp32_accumulator_error_on_a_wan_like_shape(cp):
    """The accumulator's error on a WAN-like shape (C = K = 384, T = 3, 60x104), next to chaining.

    The best a bf16 result can be is the exact result rounded once (``best``). The Q-slice path
    rounds each slice's term once in its 16-bit temporary and the sum once at the end, so its error
    sits near sqrt(2) x best (measured 1.44x on an H100); the bound is 1.6x best.

    Chaining the slices through the bf16 output (residual, beta = 1) is measured too and reported,
    not asserted against: cuconv's 2-D kernels add the residual in fp32 before their one rounding,
    so chaining lands in the same range here, and the issue's claim that it exceeds the bound does
    not hold for these kernels on this shape (see the issue 5 notes).
    """
    x, w = _operands(cp, (1, 6, 60, 104, 384), 384, 3, "bfloat16", seed=3)
    pad = ((0, 0), (1, 1), (1, 1))
    ref = cuconv.reference.conv3d(x, w, padding=pad)
    best = rel_error(ref.astype(np.float32).astype(cp.asnumpy(x).dtype), ref)
    y = cuconv.conv3d(x, w, padding=pad, strategy="qslice")
    err_acc = rel_error(y, ref)
    Z = ref.shape[1]
    chained = None
    for t in range(3):  # out = conv2d(x[z + t], w[:, t]) + 1.0 * out, through the bf16 output
        xt = cp.ascontiguousarray(x[0, t:t + Z])
        wt = cp.ascontiguousarray(w[:, t])
        chained = cuconv.conv2d(xt, wt, padding=1, residual=chained, beta=1.0, out=chained, kernel="sm90_tma")
    err_chain = rel_error(chained[None], ref)
    print(f"best {best:.3e}  qslice {err_acc:.3e} ({err_acc / best:.2f}x)  chained {err_chain:.3e} "
          f"({err_chain / best:.2f}x)")
    assert err_acc <= 1.6 * best, f"Q-slice {err_acc:.3g} > 1.6 x best {best:.3g} (chained {err_chain:.3g})"
    assert err_acc <= TOLERANCE["bfloat16"]
