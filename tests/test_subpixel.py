"""The input gradient of a strided convolution as one convolution over the stacked phases (cuconv/subpixel.py).

CPU: the geometry (windows, shifts, what is declined), the stacked result equal to the phase split on
drawn geometry (float64), the kernels' argument struct against the CUDA source. GPU: the stack, unstack
and gather kernels against their NumPy forms, bit for bit (the calls themselves are covered by
tests/test_grad_gpu.py, which runs strided input gradients and transposed convolutions).
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import cuconv
from cuconv import grad, subpixel
from cuconv.compiler import kernels_dir
from cuconv.validate import conv_problem

from conftest import needs_hopper


def _problem(I, F, s, d=1, lo=0, hi=0, groups=1, C=4, K=6):
    nd = len(I)
    return conv_problem(nd, (1, *I, C), (K, *F, C // groups), "float64", "NHWC" if nd == 2 else "NDHWC", s,
                        tuple(zip((lo,) * nd, (hi,) * nd)), d, groups, 1.0, 1.0, False, False, None)


@pytest.mark.parametrize("F,lo,window,waste", [
    (4, 1, 2, 1.0),   # the upsampling transposed convolution (4x4, stride 2, padding 1): no zero tap
    (3, 1, 2, 16 / 9),
    (2, 0, 1, 1.0),
])
def test_windows_and_waste(F, lo, window, waste):
    sp = subpixel.geometry(_problem((16, 16), (F, F), 2, lo=lo, hi=lo))
    assert sp is not None and sp.window == (window, window) and sp.phases == 4
    assert sp.phases * np.prod(sp.window) / F ** 2 == pytest.approx(waste)


def test_declines():
    assert subpixel.geometry(_problem((16, 16), (3, 3), 1, lo=1, hi=1)) is None          # stride 1
    assert subpixel.geometry(_problem((16, 16), (3, 3), 2, lo=1, hi=1, groups=2)) is None  # groups
    assert subpixel.geometry(_problem((40, 40), (3, 3), 9, lo=1, hi=1)) is None          # stride past 8
    assert subpixel.geometry(_problem((16, 16), (1, 1), 2)) is None                      # 4 x 1 taps: waste 4
    assert subpixel.geometry(_problem((20, 20), (3, 3), 2, lo=6, hi=6)) is None          # base > 0


@st.composite
def geometries(draw):
    nd = draw(st.sampled_from([1, 2, 3]))
    F = tuple(draw(st.integers(1, 5)) for _ in range(nd))
    s = tuple(draw(st.sampled_from([1, 2, 2, 2, 3, 4])) for _ in range(nd))
    d = tuple(draw(st.integers(1, 3)) for _ in range(nd))
    lo = tuple(draw(st.integers(0, 4)) for _ in range(nd))
    hi = tuple(draw(st.integers(0, 4)) for _ in range(nd))
    I = tuple(draw(st.integers(max(1, (f - 1) * dd + 1 - l - h), max(1, (f - 1) * dd + 1 - l - h) + 10))
              for f, dd, l, h in zip(F, d, lo, hi))
    return dict(I=I, F=F, s=s, d=d, pad=tuple(zip(lo, hi)), seed=draw(st.integers(0, 2**31 - 1)),
                bias=draw(st.booleans()), residual=draw(st.booleans()), act=draw(st.sampled_from([None, "relu"])))


@settings(max_examples=200, deadline=None)
@given(g=geometries())
def test_stacked_equals_the_phase_split(g):
    """Under overrides(stacked_phases=True), where the geometry applies, the stacked convolution's result
    equals the phase split's (float64) on the input gradient with every epilogue term; 1-D problems run
    as 2-D ones of height 1."""
    I, F, s, d, pad = g["I"], g["F"], g["s"], g["d"], g["pad"]
    if len(I) == 1:
        I, F, s, d, pad = (1, *I), (1, *F), (1, *s), (1, *d), ((0, 0), *pad)
    nd = len(I)
    conv = cuconv.conv2d if nd == 2 else cuconv.conv3d
    rng = np.random.default_rng(g["seed"])
    x = rng.standard_normal((2, *I, 3))
    w = rng.standard_normal((5, *F, 3))
    try:
        y = conv(x, w, stride=s, padding=pad, dilation=d)
    except ValueError:
        return  # no output for this geometry
    dy = rng.standard_normal(y.shape)
    ep = dict(bias=rng.standard_normal(3) if g["bias"] else None,
              residual=rng.standard_normal(x.shape) if g["residual"] else None, activation=g["act"], beta=0.5)
    layout = "NHWC" if nd == 2 else "NDHWC"
    args = (nd, dy, w, x.shape, s, pad, d, 1, layout, None, None, ep)
    split = grad._input_grad(*args)
    with cuconv.overrides(stacked_phases=True):
        stacked = grad._input_grad(*args)
    np.testing.assert_allclose(stacked, split, rtol=1e-12, atol=1e-12)


@settings(max_examples=200, deadline=None)
@given(g=geometries())
def test_the_shifted_and_the_aligned_forms_compute_the_input_gradient(g):
    """Each form of the stacked convolution (:func:`subpixel.geometry`, shifted and ``aligned``), computed as
    it is defined (W' gathered from w, one stride-1 convolution of dy, the phases put into place), equals
    the phase split's input gradient (float64); where a phase is shifted the aligned form's window is
    wider and its output shorter."""
    I, F, s, d, pad = g["I"], g["F"], g["s"], g["d"], g["pad"]
    nd = len(I)
    if nd == 1:
        I, F, s, d, pad, nd = (1, *I), (1, *F), (1, *s), (1, *d), ((0, 0), *pad), 2
    conv = cuconv.conv2d if nd == 2 else cuconv.conv3d
    layout = "NHWC" if nd == 2 else "NDHWC"
    rng = np.random.default_rng(g["seed"])
    x_shape, w = (2, *I, 3), rng.standard_normal((5, *F, 3))
    try:
        y = conv(np.zeros(x_shape), w, stride=s, padding=pad, dilation=d)
    except ValueError:
        return  # no output for this geometry
    dy = rng.standard_normal(y.shape)
    want = grad._input_grad(nd, dy, w, x_shape, s, pad, d, 1, layout, None, None, {})
    p = conv_problem(nd, x_shape, w.shape, "float64", layout, s, pad, d, 1, 1.0, 1.0, False, False, None)
    shifted, aligned = subpixel.geometry(p), subpixel.geometry(p, aligned=True)
    for sp in (shifted, aligned):
        if sp is None:
            continue
        z = conv(dy, subpixel.stacked_filter(sp, w, np), padding=sp.pad)
        assert z.shape == (2, *sp.length, sp.phases * 3)
        got = np.full(x_shape, np.nan)
        subpixel.unstack(sp, z, got, np)
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    if aligned is not None and shifted is not None:  # (the shifted form declines past MAX_WASTE)
        assert any(any(sh) for sh in shifted.shift) and not any(any(sh) for sh in aligned.shift)
        assert all(a >= b for a, b in zip(aligned.window, shifted.window))
        assert all(a <= b for a, b in zip(aligned.length, shifted.length))


def test_the_aligned_form_of_the_upsampling_layer():
    """A 4x4 filter of stride 2, padding 1: 17 shifted rows with a 2-tap window, or 16 aligned rows with a
    3-tap window of which each phase reads two."""
    p = _problem((32, 32), (4, 4), 2, lo=1, hi=1)
    shifted, aligned = subpixel.geometry(p), subpixel.geometry(p, aligned=True)
    assert (shifted.window, shifted.length, shifted.shift) == ((2, 2), (17, 17), ((0, 1), (0, 1)))
    assert (aligned.window, aligned.length, aligned.shift) == ((3, 3), (16, 16), ((0, 0), (0, 0)))
    assert aligned.tap_of[0] == ((3, 1, -1), (-1, 2, 0))
    assert subpixel.geometry(_problem((32, 32), (3, 3), 2, lo=1, hi=1), aligned=True) is None  # nothing shifted


@settings(max_examples=150, deadline=None)
@given(g=geometries())
def test_scatter_offsets_put_every_phase_where_unstack_does(g):
    """The phase-scattering epilogue's table (stacked row u of phase ph lands at dx row s u + d where that is
    inside dx, kernels_cu/sm90/epilogue.cuh) puts every stacked value where :func:`subpixel.unstack` puts
    it, and every dx position is written exactly once."""
    nd = len(g["I"])
    if nd == 1:
        return
    p = conv_problem(nd, (1, *g["I"], 1), (1, *g["F"], 1), "float64", "NHWC" if nd == 2 else "NDHWC", g["s"],
                     g["pad"], g["d"], 1, 1.0, 1.0, False, False, None)
    sp = subpixel.geometry(p)
    if sp is None:
        return
    C = 2
    z = np.random.default_rng(g["seed"]).standard_normal((1, *sp.length, sp.phases * C))
    want = np.full((1, *sp.extent, C), np.nan)
    subpixel.unstack(sp, z, want, np)
    got = np.full(want.shape, np.nan)
    written = np.zeros(want.shape[:-1], dtype=int)
    table = subpixel.scatter_offsets(sp)
    assert len(table) == sp.phases
    for ph in range(sp.phases):
        d = table[ph]
        for u in np.ndindex(*sp.length):
            y = tuple(s * ui + di for s, ui, di in zip(sp.stride, u, d))
            if all(0 <= yi < e for yi, e in zip(y, sp.extent)):
                got[(0, *y)] = z[(0, *u, slice(ph * C, (ph + 1) * C))]
                written[(0, *y)] += 1
    assert (written == 1).all()
    np.testing.assert_array_equal(got, want)


def test_the_kernel_struct_matches_the_source():
    src = (kernels_dir("cu") / subpixel.STACK_SOURCE).read_text()
    body = re.search(r"struct StackArgs \{(.*?)\};", src, re.S).group(1)
    names = []
    for kind, decl in re.findall(r"(long long|int32_t|FastDivisor)\s+([^;]+);", body):
        for part in decl.split(","):
            part = part.strip()
            m = re.fullmatch(r"(\w+)\[(\d+)\]", part)
            if kind == "FastDivisor":  # two uint32 members
                names += [f"{part}_mul", f"{part}_shr"]
            else:
                names += [f"{m.group(1)[:2]}{m.group(1)[2:]}_{k}" for k in range(int(m.group(2)))] if m else [part]
    assert names == [n for n, _ in subpixel._STACK_FIELDS]


# ----------------------------------------------------------------------------------------------- GPU
gpu = pytest.mark.gpu


@gpu
@needs_hopper
@pytest.mark.parametrize("I,F,s,lo,C,dtype,K", [((15, 9), (4, 4), (2, 2), 1, 8, "float16", 6),
                                                ((11, 12), (3, 3), (2, 3), 1, 3, "float32", 6),
                                                ((7, 5, 6), (3, 2, 3), (2, 2, 3), 0, 16, "float16", 6),
                                                ((9, 9), (5, 5), (3, 3), 2, 1, "float64", 6),
                                                ((6, 7), (3, 3), (2, 2), 1, 72, "float16", 45),   # partial tiles
                                                ((5, 9), (4, 4), (2, 2), 1, 33, "float16", 70)])  # odd rows of w
def test_stack_unstack_gather_kernels_are_their_numpy_forms(cp, I, F, s, lo, C, dtype, K):
    sp = subpixel.geometry(_problem(I, F, s, lo=lo, hi=lo, C=C, K=K))
    assert sp is not None
    rng = np.random.default_rng(1)
    y = rng.standard_normal((2, *I, C)).astype(dtype)
    z = np.full((2, *sp.length, sp.phases * C), 7, dtype)
    subpixel.stack(sp, y, z, np)
    zg = cp.full(z.shape, 7, dtype=dtype)
    subpixel.stack(sp, cp.asarray(y), zg, cp)
    np.testing.assert_array_equal(zg.get(), z)
    back = np.full(y.shape, 9, dtype)
    subpixel.unstack(sp, z, back, np)
    np.testing.assert_array_equal(back, y)
    backg = cp.full(y.shape, 9, dtype=dtype)
    subpixel.unstack(sp, zg, backg, cp)
    np.testing.assert_array_equal(backg.get(), y)
    w = rng.standard_normal((K, *F, C)).astype(dtype)
    want = subpixel.stacked_filter(sp, w, np)
    np.testing.assert_array_equal(subpixel.stacked_filter(sp, cp.asarray(w), cp).get(), want)
    # w one element off the 4-byte grid: the 16-bit transpose falls back to 2-byte loads
    shifted = cp.asarray(np.concatenate([np.zeros(1, dtype), w.ravel()]))[1:].reshape(w.shape)
    np.testing.assert_array_equal(subpixel.stacked_filter(sp, shifted, cp).get(), want)
