"""Gradients and transposed convolution on a CUDA GPU (gpu marker): CuPy results against the CPU's
float64 ones (tests/test_grad.py checks those against adjoint identities, finite differences and a
scatter-add definition). Each is a composition of forward calls, so it runs on the kernels the
dispatcher picks for them (float32 on Hopper: sm90_bf16x3; bf16: the 16-bit kernels)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import cuconv
from cuconv.backends.sm90.wgrad import TMA_TILES

from conftest import DTYPES, TOLERANCE, hopper_available, needs_hopper, rel_error, split_order_sum
from geometry import cases

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


def _output_padding(case, dy_shape):
    """The output_padding that makes the transposed convolution of ``dy_shape`` give back ``case``'s input
    shape (:func:`cuconv.conv_transpose_output_shape` without it, subtracted from x's), or None where the
    case's padding is a string ("same" / "valid")."""
    if isinstance(case.padding, str):
        return None
    base = cuconv.conv_transpose_output_shape(dy_shape, case.w_shape(), stride=case.stride, padding=case.padding,
                                              dilation=case.dilation, groups=case.groups, layout=case.layout)
    sl = slice(1, -1) if case.layout == "NHWC" else slice(2, None)
    return tuple(i - b for i, b in zip(case.x_shape()[sl], base[sl]))


@settings(max_examples=40, deadline=None)
@given(case=cases(nd=2, epilogue=False))
def test_drawn_gradients_match_the_float64_reference(cp, case):
    """Input and weight gradients and the transposed convolution on drawn geometries (stride, dilation,
    asymmetric, "same" and "valid" padding, groups, NHWC and NCHW, fp16 / bf16 / fp32) on the GPU, against
    the float64 CPU path on the same rounded operands; the weight gradient's bits are equal on a second
    call; the transposed convolution (its output_padding giving back x's shape) matches the reference input
    gradient."""
    rng = np.random.default_rng(case.seed)
    dt = DTYPES[case.dtype]
    kw = case.conv_kwargs()
    x = rng.standard_normal(case.x_shape()).astype(dt)
    w = (rng.standard_normal(case.w_shape()) / np.sqrt(np.prod(case.w_shape()[1:]))).astype(dt)
    y_shape = cuconv.conv2d(x.astype(np.float64), w.astype(np.float64), **kw).shape
    dy = rng.standard_normal(y_shape).astype(dt)
    x64, w64, dy64 = (a.astype(np.float64) for a in (x, w, dy))
    xg, wg, dyg = cp.asarray(x), cp.asarray(w), cp.asarray(dy)
    dx = cuconv.conv2d_input_grad(dyg, wg, x.shape, **kw)
    dw = cuconv.conv2d_weight_grad(xg, dyg, w.shape, **kw)
    assert isinstance(dx, cp.ndarray) and dx.dtype == dt and dx.shape == x.shape
    assert isinstance(dw, cp.ndarray) and dw.dtype == dt and dw.shape == w.shape
    assert rel_error(dx, cuconv.conv2d_input_grad(dy64, w64, x.shape, **kw)) <= TOLERANCE[case.dtype], case
    assert rel_error(dw, cuconv.conv2d_weight_grad(x64, dy64, w.shape, **kw)) <= TOLERANCE[case.dtype], case
    assert bool((cuconv.conv2d_weight_grad(xg, dyg, w.shape, **kw) == dw).all()), case
    op = _output_padding(case, y_shape)
    if op is not None:  # the transposed weight is the forward one: C_in = dy's channels first
        t = cuconv.conv_transpose2d(dyg, wg, stride=case.stride, padding=case.padding, output_padding=op,
                                    dilation=case.dilation, groups=case.groups, layout=case.layout)
        assert t.shape == x.shape and t.dtype == dt
        assert rel_error(t, cuconv.conv2d_input_grad(dy64, w64, x.shape, **kw)) <= TOLERANCE[case.dtype], case


@settings(max_examples=12, deadline=None)
@given(case=cases(nd=2, dtypes=("float64",), epilogue=False, max_channels=8, max_spatial=8))
def test_gpu_gradients_match_finite_differences_of_the_gpu_forward(cp, case):
    """float64 on the GPU: along a random direction ``v``, the central difference of ``L = <conv(x, w), dy>``
    (the GPU forward) equals ``<dx, v>`` for the input and ``<dw, v>`` for the weight (L is linear in each,
    so the difference is exact to rounding)."""
    rng = np.random.default_rng(case.seed)
    kw = case.conv_kwargs()
    x, w = cp.asarray(rng.standard_normal(case.x_shape())), cp.asarray(rng.standard_normal(case.w_shape()))
    dy = cp.asarray(rng.standard_normal(cuconv.conv2d(x, w, **kw).shape))
    dx = cuconv.conv2d_input_grad(dy, w, x.shape, **kw)
    dw = cuconv.conv2d_weight_grad(x, dy, w.shape, **kw)

    def loss(xa, wa):
        return float((cuconv.conv2d(xa, wa, **kw) * dy).sum())
    h = 0.5
    for a, g, name in ((x, dx, "x"), (w, dw, "w")):
        v = cp.asarray(rng.standard_normal(a.shape))
        hi, lo = (loss(a + h * v, w), loss(a - h * v, w)) if name == "x" else (loss(x, a + h * v), loss(x, a - h * v))
        fd, want = (hi - lo) / (2 * h), float((g * v).sum())
        scale = float(cp.sqrt((g * g).sum() * (v * v).sum())) + 1e-300
        assert abs(fd - want) <= 1e-9 * scale, (name, fd, want, case)


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


@pytest.mark.parametrize("stacked", [False, True, None])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("kw", [dict(stride=2, padding=1, output_padding=1, filt=3),
                                dict(stride=2, padding=1, output_padding=0, filt=4),
                                dict(stride=(3, 2), padding=((2, 0), (1, 1)), output_padding=(1, 0), filt=5),
                                dict(stride=2, padding=0, output_padding=1, filt=2)])
def test_transpose_phase_split_and_stacked_phases(cp, dtype, kw, stacked):
    """Strided transposed convolutions with every epilogue term through the phase split
    (overrides(stacked_phases=False)) and through the stacked phases (True, or None: the default on a
    GPU; the filter gather, the residual stacked, one forward
    convolution, the phases put into place), against the CPU in float64."""
    rng = np.random.default_rng(3)
    dt = DTYPES[dtype]
    f, kw = kw["filt"], {k: v for k, v in kw.items() if k != "filt"}
    x = rng.standard_normal((2, 7, 9, 24)).astype(dt)
    w = (rng.standard_normal((24, f, f, 16)) / (3 * f)).astype(dt)
    bias = rng.standard_normal(16).astype(dt)
    shape = cuconv.conv_transpose_output_shape(x.shape, w.shape, **kw)
    res = rng.standard_normal(shape).astype(dt)
    ep = dict(activation="relu", beta=0.5, alpha=0.75)
    f64 = [a.astype(np.float64) for a in (x, w, bias, res)]
    want = cuconv.conv_transpose2d(*f64[:3], residual=f64[3], **kw, **ep)
    with cuconv.overrides(stacked_phases=stacked):
        e = cuconv.explain_transpose(cp.asarray(x), cp.asarray(w), cp.asarray(bias), **kw)
        assert ("stacked along the channels" in e.detail) == (stacked is not False), e.detail
        got = cuconv.conv_transpose2d(cp.asarray(x), cp.asarray(w), cp.asarray(bias), residual=cp.asarray(res),
                                      **kw, **ep)
        got2 = cuconv.conv_transpose2d(cp.asarray(x), cp.asarray(w), cp.asarray(bias), residual=cp.asarray(res),
                                       **kw, **ep)
    assert got.shape == tuple(shape) and rel_error(got, want) <= TOLERANCE[dtype]
    assert bool((got == got2).all())  # the same bits on every run


@needs_hopper
@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_stacked_phases_stored_into_place_by_the_epilogue(cp, data):
    """Transposed convolutions whose output channels are a multiple of 32 run the stacked-phase convolution
    with the Hopper kernel's phase-scattering epilogue (no stacked intermediate, no unstack pass): 2-D and
    3-D, strides 2 and 3, bias and activation, against the CPU in float64; a repeated call (the replay)
    gives the same bits."""
    nd = data.draw(st.sampled_from([2, 2, 3]))
    f, s, pad, op = data.draw(st.sampled_from([(2, 2, 0, 0), (4, 2, 1, 0), (3, 2, 1, 1), (3, 3, 1, 2), (5, 2, 2, 1)]))
    C = data.draw(st.sampled_from([32, 64, 96]))
    Cin = data.draw(st.sampled_from([16, 40, 64]))
    N = data.draw(st.integers(1, 3))
    size = tuple(data.draw(st.integers(2, 9 if nd == 2 else 5)) for _ in range(nd))
    dtype = data.draw(st.sampled_from(["bfloat16", "float16"]))
    bias_on, act = data.draw(st.booleans()), data.draw(st.sampled_from([None, "relu"]))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**31 - 1)))
    dt = DTYPES[dtype]
    x = rng.standard_normal((N, *size, Cin)).astype(dt)
    w = (rng.standard_normal((Cin, *(f,) * nd, C)) / np.sqrt(Cin * f ** nd / s ** nd)).astype(dt)
    bias = rng.standard_normal(C).astype(dt) if bias_on else None
    kw = dict(stride=s, padding=pad, output_padding=op, activation=act)
    fn = cuconv.conv_transpose2d if nd == 2 else cuconv.conv_transpose3d
    want = fn(x.astype(np.float64), w.astype(np.float64), None if bias is None else bias.astype(np.float64), **kw)
    xg, wg, bg = cp.asarray(x), cp.asarray(w), None if bias is None else cp.asarray(bias)
    e = cuconv.explain_transpose(xg, wg, bg, **kw)
    if "stacked along the channels" not in e.detail:  # the geometry multiplies too many zero taps
        return
    assert "stored into place in dx by the epilogue" in str(e), str(e)
    got = fn(xg, wg, bg, **kw)
    got2 = fn(xg, wg, bg, **kw)
    assert got.shape == want.shape and rel_error(got, want) <= TOLERANCE[dtype], str(e)
    assert bool((got == got2).all())


@needs_hopper
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("f,pad,op,C,Cin,N,side,block_n", [(4, 1, 0, 256, 96, 2, 9, None), (4, 1, 0, 512, 64, 1, 6, None),
                                                          (5, 2, 1, 256, 64, 2, 8, None), (4, 1, 0, 128, 40, 3, 7, 128),
                                                          (4, 1, 0, 320, 64, 1, 6, 64)], ids=str)
def test_aligned_stacked_phases_skip_each_phases_dead_window_taps(cp, dtype, f, pad, op, C, Cin, N, side, block_n):
    """Transposed convolutions whose stacked phases are shifted (a 4x4 or 5x5 filter of stride 2) run the
    aligned form on Hopper (a wider window, each phase's taps at their own offsets, one phase per tile, the
    other taps skipped) where C is a multiple of its 256-column tiles, or of a forced narrower width: bias
    and activation, against the CPU in float64, the same bits on repeated calls."""
    rng = np.random.default_rng(f * 1000 + C + side)
    dt = DTYPES[dtype]
    x = rng.standard_normal((N, side, side, Cin)).astype(dt)
    w = (rng.standard_normal((Cin, f, f, C)) / np.sqrt(Cin * f * f / 4)).astype(dt)
    bias = rng.standard_normal(C).astype(dt)
    kw = dict(stride=2, padding=pad, output_padding=op, activation="relu")
    want = cuconv.conv_transpose2d(x.astype(np.float64), w.astype(np.float64), bias.astype(np.float64), **kw)
    xg, wg, bg = cp.asarray(x), cp.asarray(w), cp.asarray(bias)
    with cuconv.overrides(block_n=block_n):
        e = str(cuconv.explain_transpose(xg, wg, bg, **kw))
        assert "the phases aligned" in e and "are skipped" in e and "_bmn" in e and "_halo" not in e, e
        assert f"x{block_n or 256}x64_" in e, e
        got, got2 = cuconv.conv_transpose2d(xg, wg, bg, **kw), cuconv.conv_transpose2d(xg, wg, bg, **kw)
    assert got.shape == want.shape and rel_error(got, want) <= TOLERANCE[dtype], e
    assert bool((got == got2).all())


@needs_hopper
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("f,s,pad,stacked", [(1, 2, 0, None), (1, (2, 3), 0, None), (3, 2, 1, False),
                                             (2, 2, 0, False)])
def test_phase_split_phases_stored_into_place_by_the_epilogue(cp, dtype, f, s, pad, stacked):
    """Input gradients through the phase split (a strided 1x1 filter: one phase with taps, zeros elsewhere;
    or the split asked for) with C a multiple of 32: each phase's convolution stores it into dx itself, dx
    zeroed first where phases have no tap; against the CPU in float64, and a repeated call (the replay) gives
    the same bits."""
    rng = np.random.default_rng(5)
    dt = DTYPES[dtype]
    N, H, W, C, K = 2, 13, 11, 64, 48
    kw = dict(stride=s, padding=pad)
    w = (rng.standard_normal((K, f, f, C)) / (f * np.sqrt(K))).astype(dt)
    x_shape = (N, H, W, C)
    y = cuconv.conv2d(np.zeros(x_shape), w.astype(np.float64), **kw)
    dy = rng.standard_normal(y.shape).astype(dt)
    want = cuconv.conv2d_input_grad(dy.astype(np.float64), w.astype(np.float64), x_shape, **kw)
    with cuconv.overrides(stacked_phases=stacked):
        e = cuconv.explain_input_grad(cp.asarray(dy), cp.asarray(w), x_shape, **kw)
        assert "stored into place in dx by the epilogue" in str(e), str(e)
        got = cuconv.conv2d_input_grad(cp.asarray(dy), cp.asarray(w), x_shape, **kw)
        got2 = cuconv.conv2d_input_grad(cp.asarray(dy), cp.asarray(w), x_shape, **kw)
    assert got.shape == x_shape and rel_error(got, want) <= TOLERANCE[dtype], str(e)
    assert bool((got == got2).all())


@needs_hopper
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("case", [
    dict(f=1, stride=1), dict(f=1, stride=2), dict(f=3, stride=1, padding=((2, 0), (1, 1)), dilation=(1, 2)),
    dict(f=3, stride=2, padding=1, stacked=False), dict(f=5, stride=1, padding=2),
    dict(f=1, stride=1, transpose=True), dict(f=2, stride=2, transpose=True), dict(f=4, stride=2, padding=1,
                                                                                  transpose=True),
    dict(f=3, stride=2, padding=1, output_padding=1, transpose=True),
    dict(f=3, stride=1, padding=1, x=(2, 8, 64, 64), halo=True), dict(f=3, stride=1, padding=1, x=(1, 8, 64, 128),
                                                                     halo=True)], ids=str)
def test_input_gradients_read_w_as_it_is(cp, dtype, case):
    """Input gradients (stride 1 with padding and dilation, one phase of a stride, the phase split's phases)
    and transposed convolutions (the stacked phases) on Hopper read their filter MN-major straight from w,
    a tap per phase and window tap (no flip or gather launch), on im2col and halo tiles (cooperative and
    ping-pong), with a reduction (dy's channels, 40) that ends inside a 64-channel block; against the CPU in
    float64, and the same bits on repeated calls."""
    case = dict(case)
    rng = np.random.default_rng(9)
    dt = DTYPES[dtype]
    C, K, f = 64, 40, case.pop("f")
    stacked, halo, x_at = case.pop("stacked", None), case.pop("halo", False), case.pop("x", None)
    if not case.pop("transpose", False):
        x_shape = x_at or (2, 12, 10, C)
        C = x_shape[-1]
        w = (rng.standard_normal((K, f, f, C)) / np.sqrt(K * f * f)).astype(dt)
        dy_shape = cuconv.conv2d(np.zeros(x_shape), w.astype(np.float64), **case).shape
        dy = rng.standard_normal(dy_shape).astype(dt)
        want = cuconv.conv2d_input_grad(dy.astype(np.float64), w.astype(np.float64), x_shape, **case)
        explain = lambda: cuconv.explain_input_grad(cp.asarray(dy), cp.asarray(w), x_shape, **case)  # noqa: E731
        run = lambda: cuconv.conv2d_input_grad(cp.asarray(dy), cp.asarray(w), x_shape, **case)  # noqa: E731
    else:
        x = rng.standard_normal(x_at or (2, 7, 9, K)).astype(dt)
        w = (rng.standard_normal((K, f, f, C)) / np.sqrt(K * f * f)).astype(dt)
        bias = rng.standard_normal(C).astype(dt)
        kw = dict(case, activation="relu")
        want = cuconv.conv_transpose2d(x.astype(np.float64), w.astype(np.float64), bias.astype(np.float64), **kw)
        explain = lambda: cuconv.explain_transpose(cp.asarray(x), cp.asarray(w), cp.asarray(bias), **kw)  # noqa
        run = lambda: cuconv.conv_transpose2d(cp.asarray(x), cp.asarray(w), cp.asarray(bias), **kw)  # noqa: E731
    with cuconv.overrides(stacked_phases=stacked):
        e = explain()
        assert "read straight from w" in str(e) and "_bmn" in str(e), str(e)
        assert ("_halo" in str(e)) == halo, str(e)
        got, got2, got3 = run(), run(), run()
    assert got.shape == want.shape and rel_error(got, want) <= TOLERANCE[dtype], str(e)
    assert bool((got == got2).all()) and bool((got == got3).all())


# ------------------------------------------------------------------------------------------ sm80_wgrad
@st.composite
def wgrad_problems(draw, multiples_of_8=False):
    """A conv2d whose weight gradient the GEMM kernels compute: channel counts that make every copy
    width (8, 4, 2 and 1 elements; only 8 with ``multiples_of_8``, what sm90_wgrad takes), stride,
    dilation, asymmetric padding, groups, and batches long enough to split the reduction."""
    groups = draw(st.sampled_from([1, 1, 2, 3]))
    cg = draw(st.sampled_from([8, 16, 24, 64] if multiples_of_8 else [1, 3, 4, 8, 16, 24]))
    kg = draw(st.sampled_from([8, 16, 40, 72, 136] if multiples_of_8 else [2, 5, 8, 16, 40, 72]))
    R, S = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    stride = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    dilation = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    padding = tuple((draw(st.integers(0, 2)), draw(st.integers(0, 2))) for _ in range(2))
    H = draw(st.integers((R - 1) * dilation[0] + 1, 24))
    W = draw(st.integers((S - 1) * dilation[1] + 1, 24))
    N = draw(st.sampled_from([1, 2, 9]))
    dtype = draw(st.sampled_from(["bfloat16", "float16"]))
    return dict(N=N, H=H, W=W, C=cg * groups, K=kg * groups, R=R, S=S, dtype=dtype,
                kw=dict(stride=stride, padding=padding, dilation=dilation, groups=groups))


def _check_wgrad(cp, case, kernel):
    rng = np.random.default_rng(7)
    dt = DTYPES[case["dtype"]]
    x = rng.standard_normal((case["N"], case["H"], case["W"], case["C"])).astype(dt)
    w_shape = (case["K"], case["R"], case["S"], case["C"] // case["kw"]["groups"])
    p = cuconv.grad._forward_problem(2, x.shape, w_shape, case["dtype"], "NHWC", case["kw"]["stride"],
                                     case["kw"]["padding"], case["kw"]["dilation"], case["kw"]["groups"], None)
    dy = rng.standard_normal(p.out_shape).astype(dt)
    want = cuconv.conv2d_weight_grad(x.astype(np.float64), dy.astype(np.float64), w_shape, **case["kw"])
    got = cuconv.conv2d_weight_grad(cp.asarray(x), cp.asarray(dy), w_shape, kernel=kernel, **case["kw"])
    assert got.dtype == dt and got.shape == w_shape
    assert rel_error(got, want) <= TOLERANCE[case["dtype"]]


@settings(max_examples=30)
@given(wgrad_problems())
def test_sm80_wgrad_matches_the_reference(cp, case):
    _check_wgrad(cp, case, "sm80_wgrad")


@needs_hopper
@settings(max_examples=30)
@given(wgrad_problems(multiples_of_8=True))
def test_sm90_wgrad_matches_the_reference(cp, case):
    _check_wgrad(cp, case, "sm90_wgrad")


@needs_hopper
@settings(max_examples=30)
@given(groups=st.sampled_from([1, 2]), cg=st.sampled_from([64, 128]), kg=st.sampled_from([8, 40, 64, 136, 256]),
       R=st.integers(1, 3), S=st.integers(1, 3), stride=st.integers(1, 2), dilation=st.integers(1, 2),
       pad=st.integers(0, 2), H=st.integers(5, 19), W=st.integers(5, 19), N=st.sampled_from([1, 3, 9]),
       dtype=st.sampled_from(["bfloat16", "float16"]))
def test_sm90_wgrad_tma_form_matches_the_reference(cp, groups, cg, kg, R, S, stride, dilation, pad, H, W, N, dtype):
    """Channels per group a multiple of 64: sm90_wgrad's TMA form (im2col boxes of x, tiled boxes of dy,
    a producer warp), with splits whose last tile runs past the last pixel, partial filter tiles and
    groups, against the float64 reference; the explanation names the form."""
    case = dict(N=N, H=H, W=W, C=cg * groups, K=kg * groups, R=R, S=S, dtype=dtype,
                kw=dict(stride=stride, padding=pad, dilation=dilation, groups=groups))
    _check_wgrad(cp, case, "sm90_wgrad")
    x = cp.zeros((N, H, W, cg * groups), dtype=DTYPES[dtype])
    p = cuconv.grad._forward_problem(2, x.shape, (kg * groups, R, S, cg), dtype, "NHWC", stride, pad, dilation,
                                     groups, None)
    dy = cp.zeros(p.out_shape, dtype=DTYPES[dtype])
    e = cuconv.explain_weight_grad(x, dy, (kg * groups, R, S, cg), **case["kw"])
    assert e.kernel == "sm90_wgrad" and "TMA" in e.detail, e.detail


def _with_tile(tile, fn):
    """``fn()`` with sm90_wgrad's TMA-form tile forced to ``tile`` (``wgrad.tma_tile_for`` patched), the launch
    and choice caches cleared before and after (plans made under the forced tile are not the automatic ones)."""
    from unittest import mock
    from cuconv.backends.sm90 import wgrad as w90

    def clear():
        w90.launch_for.cache_clear()
        cuconv.grad._wgrad_choice.cache_clear()
        cuconv.grad._WGRAD_CALLS.clear()
    clear()
    try:
        with mock.patch.object(w90, "tma_tile_for", lambda p, sm_count=132: tile):
            return fn()
    finally:
        clear()


@needs_hopper
@settings(max_examples=30)
@given(groups=st.sampled_from([1, 1, 2]), cg=st.sampled_from([64, 128]), kg=st.sampled_from([8, 64, 136, 200]),
       R=st.integers(1, 3), S=st.integers(1, 3), stride=st.integers(1, 2), pad=st.integers(0, 1),
       H=st.integers(5, 30), W=st.integers(5, 30), N=st.sampled_from([1, 2, 5]),
       dtype=st.sampled_from(["bfloat16", "float16"]), tile=st.sampled_from(TMA_TILES))
def test_sm90_wgrad_tma_tiles_match_the_reference(cp, groups, cg, kg, R, S, stride, pad, H, W, N, dtype, tile):
    """sm90_wgrad's TMA form on each of its tiles, forced (64 x 128 at 6 stages; 128 x 128, 192 or 256):
    partial filter tiles, columns past the last tile, groups, one split (the sums rounded into dw) or several
    (partial sums and the reduce); against the float64 reference, two calls giving the same bits, and the
    explanation naming the tile and its ring depth."""
    rng = np.random.default_rng(13)
    dt = DTYPES[dtype]
    w_shape = (kg * groups, R, S, cg)
    x = rng.standard_normal((N, H, W, cg * groups)).astype(dt)
    kw = dict(stride=stride, padding=pad, groups=groups)
    p = cuconv.grad._forward_problem(2, x.shape, w_shape, dtype, "NHWC", stride, pad, 1, groups, None)
    dy = rng.standard_normal(p.out_shape).astype(dt)
    want = cuconv.conv2d_weight_grad(x.astype(np.float64), dy.astype(np.float64), w_shape, **kw)
    xg, dyg = cp.asarray(x), cp.asarray(dy)

    def run():
        e = cuconv.explain_weight_grad(xg, dyg, w_shape, kernel="sm90_wgrad", **kw)
        got = [cuconv.conv2d_weight_grad(xg, dyg, w_shape, kernel="sm90_wgrad", **kw) for _ in range(2)]
        return e, got
    e, (got, again) = _with_tile(tile, run)
    assert f"tile {tile[0]}x{tile[1]}x64" in e.detail and f"_s{tile[2]}:" in e.detail, e.detail
    assert got.dtype == dt and got.shape == w_shape
    assert rel_error(got, want) <= TOLERANCE[dtype], e.detail
    assert bool((got == again).all())


@needs_hopper
@pytest.mark.parametrize("side,detail", [(64, "in one split"), (128, "split(s)")])
def test_sm90_wgrad_vae_layers_choose_their_tile_and_are_deterministic(cp, side, detail):
    """The VAE's 3x3 512 -> 512 weight gradients at 64x64 (one split of 128 x 192 tiles, rounded into dw) and
    128x128 (128 x 256 tiles in splits) on an H100 / H200: the automatic choice, the reference's result, equal
    bits on every call."""
    rng = np.random.default_rng(17)
    x = rng.standard_normal((1, side, side, 512)).astype(ml_dtypes.bfloat16)
    dy = rng.standard_normal((1, side, side, 512)).astype(ml_dtypes.bfloat16)
    w_shape = (512, 3, 3, 512)
    xg, dyg = cp.asarray(x), cp.asarray(dy)
    e = cuconv.explain_weight_grad(xg, dyg, w_shape, padding=1)
    if cp.cuda.Device().attributes["MultiProcessorCount"] < 120:
        pytest.skip("the choice is for 132-SM Hopper GPUs")
    assert e.kernel == "sm90_wgrad" and detail in e.detail, e.detail
    want = cuconv.conv2d_weight_grad(x.astype(np.float32), dy.astype(np.float32), w_shape, padding=1)
    got = [cuconv.conv2d_weight_grad(xg, dyg, w_shape, padding=1) for _ in range(3)]
    assert rel_error(got[0], want) <= TOLERANCE["bfloat16"]
    assert all(bool((g == got[0]).all()) for g in got[1:])


@needs_hopper
@pytest.mark.parametrize("dtype,N,H,W,C,K,groups", [("bfloat16", 1, 8, 8, 64, 128, 1), ("float16", 2, 5, 7, 128, 208, 2),
                                                    ("bfloat16", 1, 6, 6, 192, 72, 1)])
def test_sm90_wgrad_one_split_rounds_its_sums_into_dw(cp, dtype, N, H, W, C, K, groups):
    """A weight gradient whose reduction is one split (a few output pixels) takes no workspace and no reduce:
    the TMA form's epilogue rounds the sums into dw (partial filter tiles, groups); against the float64
    reference, with equal bits on a second call."""
    rng = np.random.default_rng(21)
    dt = DTYPES[dtype]
    w_shape = (K, 3, 3, C // groups)
    x = rng.standard_normal((N, H, W, C)).astype(dt)
    kw = dict(padding=1, groups=groups)
    p = cuconv.grad._forward_problem(2, x.shape, w_shape, dtype, "NHWC", 1, 1, 1, groups, None)
    dy = rng.standard_normal(p.out_shape).astype(dt)
    xg, dyg = cp.asarray(x), cp.asarray(dy)
    e = cuconv.explain_weight_grad(xg, dyg, w_shape, **kw)
    assert e.kernel == "sm90_wgrad" and "rounded into dw" in e.detail, e.detail
    want = cuconv.conv2d_weight_grad(x.astype(np.float64), dy.astype(np.float64), w_shape, **kw)
    got = cuconv.conv2d_weight_grad(xg, dyg, w_shape, **kw)
    assert rel_error(got, want) <= TOLERANCE[dtype], e.detail
    assert bool((got == cuconv.conv2d_weight_grad(xg, dyg, w_shape, **kw)).all())


@needs_hopper
@pytest.mark.parametrize("K,C", [(3, 128), (5, 64), (7, 24)])
def test_few_filters_pad_to_eight_on_sm90_wgrad(cp, K, C):
    """3, 5 or 7 filters: the weight gradient runs on sm90_wgrad as one of 8 (dy's channels padded with
    zeros, the first K rows kept), twice (the second call replays), against the float64 reference."""
    rng = np.random.default_rng(9)
    x = rng.standard_normal((2, 21, 19, C)).astype(ml_dtypes.bfloat16)
    dy = rng.standard_normal((2, 11, 10, K)).astype(ml_dtypes.bfloat16)
    kw = dict(stride=2, padding=1)
    e = cuconv.explain_weight_grad(cp.asarray(x), cp.asarray(dy), (K, 3, 3, C), **kw)
    assert e.kernel == "sm90_wgrad" and f"padded from {K} to 8" in e.detail, e.detail
    want = cuconv.conv2d_weight_grad(x.astype(np.float64), dy.astype(np.float64), (K, 3, 3, C), **kw)
    for _ in range(2):
        got = cuconv.conv2d_weight_grad(cp.asarray(x), cp.asarray(dy), (K, 3, 3, C), **kw)
        assert got.shape == (K, 3, 3, C) and rel_error(got, want) <= TOLERANCE["bfloat16"]


def _twice_with_the_fold_lifted(xg, dyg, w_shape, kw, want, dtype, says):
    """Two weight-gradient calls (the second replays) under the width fold with its size threshold lifted,
    each against ``want``; the explanation names sm90_wgrad and ``says`` (when given). The choice caches
    are cleared before and after: choices under the lifted threshold are not the automatic ones."""
    from unittest import mock
    from cuconv.backends.sm90 import wgrad as w90
    cuconv.grad._wgrad_choice.cache_clear()
    cuconv.grad._WGRAD_CALLS.clear()
    try:
        with mock.patch.object(w90, "FOLD_MIN_PIXELS", 0):
            e = cuconv.explain_weight_grad(xg, dyg, w_shape, **kw)
            if says:
                assert e.kernel == "sm90_wgrad" and says in e.detail, e.detail
            for _ in range(2):
                got = cuconv.conv2d_weight_grad(xg, dyg, w_shape, **kw)
                assert got.dtype == DTYPES[dtype] and got.shape == tuple(w_shape)
                assert rel_error(got, want) <= TOLERANCE[dtype]
    finally:
        cuconv.grad._wgrad_choice.cache_clear()
        cuconv.grad._WGRAD_CALLS.clear()


@needs_hopper
@settings(max_examples=30)
@given(C=st.integers(1, 7), K=st.sampled_from([8, 16, 64]), R=st.integers(1, 7), S=st.integers(1, 7),
       stride=st.tuples(st.integers(1, 3), st.integers(1, 3)), dilation=st.tuples(st.integers(1, 2), st.integers(1, 2)),
       pad=st.tuples(st.integers(0, 3), st.integers(0, 3)), H=st.integers(13, 40), W=st.integers(13, 40),
       N=st.sampled_from([1, 2, 5]), dtype=st.sampled_from(["bfloat16", "float16"]))
def test_few_channels_fold_the_width_on_sm90_wgrad(cp, C, K, R, S, stride, dilation, pad, H, W, N, dtype):
    """C = 1-7 (an RGB stem, a latent): the weight gradient runs on sm90_wgrad over the width-folded x
    (S columns x 8 channels) where the fold fits one 64-channel block, twice (the second call replays),
    against the float64 reference. The fold's size threshold is lifted so that small images take it; one
    large stem runs under the automatic rule (test_weight_grad_explanation_names_the_kernel_that_runs)."""
    kw = dict(stride=stride, padding=pad, dilation=dilation)
    rng = np.random.default_rng(11)
    dt = DTYPES[dtype]
    x = rng.standard_normal((N, H, W, C)).astype(dt)
    p = cuconv.grad._forward_problem(2, x.shape, (K, R, S, C), dtype, "NHWC", stride, pad, dilation, 1, None)
    dy = rng.standard_normal(p.out_shape).astype(dt)
    want = cuconv.conv2d_weight_grad(x.astype(np.float64), dy.astype(np.float64), (K, R, S, C), **kw)
    _twice_with_the_fold_lifted(cp.asarray(x), cp.asarray(dy), (K, R, S, C), kw, want, dtype,
                                "width-folded" if S * 8 <= 64 else None)


def test_wgrad_kernel_splits_deterministically(cp):
    """A long reduction (N*P*Q = 32 * 28 * 28) on few output tiles is split across many CTAs; the
    split sums are added in a fixed order, so two calls give the same bits."""
    from cuconv.backends.sm80.wgrad import choose_splits, sm80_variant
    from cuconv.backends.sm90 import wgrad as w90
    from cuconv.device import device_of
    rng = np.random.default_rng(3)
    x = cp.asarray(rng.standard_normal((32, 28, 28, 64)).astype(ml_dtypes.bfloat16))
    dy = cp.asarray(rng.standard_normal((32, 28, 28, 64)).astype(ml_dtypes.bfloat16))
    kw = dict(stride=1, padding=1)
    p = cuconv.grad._forward_problem(2, x.shape, (64, 3, 3, 64), "bfloat16", "NHWC", 1, 1, 1, 1, None)
    dev = device_of(x)
    variant = w90.variant(p) if w90.declines(p, dev) is None else sm80_variant(p)
    assert choose_splits(p, variant, dev.sm_count).count > 1
    a = cuconv.conv2d_weight_grad(x, dy, (64, 3, 3, 64), **kw)
    b = cuconv.conv2d_weight_grad(x, dy, (64, 3, 3, 64), **kw)
    assert bool((a.view(cp.uint16) == b.view(cp.uint16)).all())
    want = cuconv.conv2d_weight_grad(cp.asnumpy(x).astype(np.float64), cp.asnumpy(dy).astype(np.float64),
                                     (64, 3, 3, 64), **kw)
    assert rel_error(a, want) <= TOLERANCE["bfloat16"]


@needs_hopper
@settings(max_examples=30)
@given(K=st.sampled_from([1, 3, 4, 7, 12]), C=st.sampled_from([8, 16, 64]), R=st.integers(1, 3), S=st.integers(1, 3),
       dilation=st.tuples(st.integers(1, 2), st.integers(1, 2)), H=st.integers(5, 30), W=st.integers(5, 30),
       N=st.sampled_from([1, 3]), dtype=st.sampled_from(["bfloat16", "float16"]), data=st.data())
def test_few_filters_exchange_roles_on_sm90_wgrad(cp, K, C, R, S, dilation, H, W, N, dtype, data):
    """A stride-1 weight gradient with a filter count that is not a multiple of 8 runs as the weight gradient
    of the convolution taking dy as its input (its few channels width-folded; the fold's size threshold
    lifted so that small images take it), flipped back with the channel axes exchanged: twice (the second
    call replays), against the float64 reference."""
    padding = tuple((data.draw(st.integers(0, (f - 1) * d)), data.draw(st.integers(0, (f - 1) * d)))
                    for f, d in zip((R, S), dilation))
    kw = dict(padding=padding, dilation=dilation)
    rng = np.random.default_rng(13)
    x = rng.standard_normal((N, H, W, C)).astype(DTYPES[dtype])
    try:
        p = cuconv.grad._forward_problem(2, x.shape, (K, R, S, C), dtype, "NHWC", 1, padding, dilation, 1, None)
    except ValueError:
        return  # no output pixel
    dy = rng.standard_normal(p.out_shape).astype(DTYPES[dtype])
    want = cuconv.conv2d_weight_grad(x.astype(np.float64), dy.astype(np.float64), (K, R, S, C), **kw)
    _twice_with_the_fold_lifted(cp.asarray(x), cp.asarray(dy), (K, R, S, C), kw, want, dtype, "roles exchanged")


@needs_hopper
@settings(max_examples=25, deadline=None)
@given(groups=st.sampled_from([1, 1, 2]), cg=st.sampled_from([64, 128]), kg=st.sampled_from([8, 64, 136, 256]),
       R=st.integers(1, 3), stride=st.integers(1, 2), H=st.integers(6, 30), N=st.sampled_from([2, 8, 32]),
       dtype=st.sampled_from(["bfloat16", "float16"]))
def test_sm90_wgrad_fused_split_end_gives_the_reduce_launchs_bits(cp, groups, cg, kg, R, stride, H, N, dtype):
    """Where every CTA of a split grid is resident at once, the TMA form adds the splits inside the grid (each
    CTA a share of its tile, after the tile's splits meet at a counter): the same bits as the same launch
    followed by the reduce launch, every call, and the reference's result; the explanation says so."""
    from cuconv.backends.sm90 import wgrad as w90
    from cuconv.device import device_of
    rng = np.random.default_rng(H * 1000 + N)
    dt = DTYPES[dtype]
    w_shape = (kg * groups, R, R, cg)
    x = rng.standard_normal((N, H, H, cg * groups)).astype(dt)
    kw = dict(stride=stride, padding=R // 2, groups=groups)
    p = cuconv.grad._forward_problem(2, x.shape, w_shape, dtype, "NHWC", stride, R // 2, 1, groups, None)
    dy = rng.standard_normal(p.out_shape).astype(dt)
    xg, dyg = cp.asarray(x), cp.asarray(dy)
    dev = device_of(xg)
    v = w90.variant(p, sm_count=dev.sm_count)
    fused, by_reduce = w90.TmaWgradLaunch(p, dev, v), w90.TmaWgradLaunch(p, dev, v)
    assume(fused.end == w90.END_FUSED)  # not one split (rounded into dw), nor a grid past one wave
    by_reduce.end = w90.END_PARTIALS
    got = [cp.empty(w_shape, dtype=dt) for _ in range(3)]
    for out in got[:2]:
        fused(xg, dyg, out)
    by_reduce(xg, dyg, got[2])
    bits = [g.view(cp.uint16) for g in got]
    assert bool((bits[0] == bits[1]).all()) and bool((bits[0] == bits[2]).all()), fused.describe()
    want = cuconv.conv2d_weight_grad(x.astype(np.float64), dy.astype(np.float64), w_shape, **kw)
    assert rel_error(got[0], want) <= TOLERANCE[dtype]
    e = cuconv.explain_weight_grad(xg, dyg, w_shape, **kw)
    assert "by the grid itself" in e.detail, e.detail


@pytest.mark.parametrize("K,C,hw,N", [(64, 64, 56, 32), (512, 512, 64, 1), (24, 16, 9, 3), (32, 3, 224, 32),
                                     (5, 3, 224, 32)])
def test_split_reduce_adds_in_its_documented_order(cp, K, C, hw, N):
    """The weight gradient's reduce launch on random partial sums equals, bit for bit, the float32 sum in
    the order common/split_sum.cuh documents (runs of consecutive splits for long sums), rounded to bf16:
    the order is fixed by the split count alone. Problems with few and with many splits (the RGB stem's
    fold), element counts with 16-byte quads and an odd one (5 filters of 3 channels on sm80_wgrad)."""
    from cuconv.backends.sm80 import wgrad as w80
    from cuconv.backends.sm90 import wgrad as w90
    from cuconv.device import device_of
    x = cp.zeros((N, hw, hw, C), dtype=ml_dtypes.bfloat16)
    p = cuconv.grad._forward_problem(2, x.shape, (K, 3, 3, C), "bfloat16", "NHWC", 1, 1, 1, 1, None)
    dev = device_of(x)
    pf = w90.folded_width(p) if C % 8 else None
    q = pf if pf is not None and w90.declines(pf, dev) is None else p
    launch = (w90.launch_for(q, dev, w90.variant(q)) if w90.declines(q, dev) is None
              else w80.launch_for(q, dev, w80.sm80_variant(q)))
    count, splits = launch.count, launch.splits.count
    rng = np.random.default_rng(splits)
    ws_host = rng.standard_normal((splits, count)).astype(np.float32)
    ws, dw = cp.asarray(ws_host), cp.empty(count, dtype=ml_dtypes.bfloat16)
    launch._reduce(ws.data.ptr, dw.data.ptr)
    want = split_order_sum(ws_host).astype(ml_dtypes.bfloat16)
    assert np.array_equal(dw.get().view(np.uint16), want.view(np.uint16)), (splits, count)


def test_wgrad_kernel_nchw_and_bias_grad(cp):
    rng = np.random.default_rng(4)
    x = rng.standard_normal((3, 16, 11, 13)).astype(np.float16)     # NCHW
    dy = rng.standard_normal((3, 24, 6, 7)).astype(np.float16)
    kw = dict(stride=2, padding=1, layout="NCHW")
    want_w, want_b = cuconv.conv2d_weight_grad(x.astype(np.float64), dy.astype(np.float64), (24, 16, 3, 3),
                                               bias_grad=True, **kw)
    got_w, got_b = cuconv.conv2d_weight_grad(cp.asarray(x), cp.asarray(dy), (24, 16, 3, 3), bias_grad=True, **kw)
    assert rel_error(got_w, want_w) <= TOLERANCE["float16"]
    assert rel_error(got_b, want_b) <= TOLERANCE["float16"]



def test_weight_grad_explanation_names_the_kernel_that_runs(cp):
    """16-byte channel counts on a Hopper: sm90_wgrad; 3 channels over 4 x 128 x 128 pixels: sm90_wgrad
    on the width-folded x on a Hopper, else sm80_wgrad; 3 channels over 2 x 8 x 8 pixels (too few for the
    fold) and 12 channels under a 7-wide filter (7 x 16 folded channels): sm80_wgrad, sm90_wgrad saying
    why not; float32: the forward formulation, both GEMMs saying why not."""
    from cuconv.device import current_gpu
    x = cp.zeros((2, 8, 8, 16), dtype=ml_dtypes.bfloat16)
    dy = cp.zeros((2, 8, 8, 32), dtype=ml_dtypes.bfloat16)
    e = cuconv.explain_weight_grad(x, dy, (32, 3, 3, 16), padding=1)
    assert e.kernel == ("sm90_wgrad" if current_gpu().is_hopper else "sm80_wgrad")
    assert "split" in e.detail
    x3 = cp.zeros((4, 128, 128, 3), dtype=ml_dtypes.bfloat16)
    e = cuconv.explain_weight_grad(x3, cp.zeros((4, 128, 128, 32), dtype=x3.dtype), (32, 3, 3, 3), padding=1)
    if current_gpu().is_hopper:
        assert e.kernel == "sm90_wgrad" and "width-folded" in e.detail, e.detail
    else:
        assert e.kernel == "sm80_wgrad"
    e = cuconv.explain_weight_grad(x[..., :3], dy, (32, 3, 3, 3), padding=1)
    assert e.kernel == "sm80_wgrad"
    if current_gpu().is_hopper:
        assert "output pixels" in e.declined["sm90_wgrad"], e.declined
    x12 = cp.zeros((2, 8, 14, 12), dtype=ml_dtypes.bfloat16)
    e = cuconv.explain_weight_grad(x12, dy, (32, 3, 7, 12), padding=(1, 0))
    assert e.kernel == "sm80_wgrad" and "multiples of 8" in e.declined.get("sm90_wgrad", "multiples of 8")
    e = cuconv.explain_weight_grad(x.astype(cp.float32), dy.astype(cp.float32), (32, 3, 3, 16), padding=1)
    assert e.kernel.startswith("forward formulation on ") and "fp16/bf16" in e.declined["sm80_wgrad"]


# ------------------------------------------------------------------------------------------ replays
REPLAYS = [  # (case, forward geometry, filter, the replay the second call runs; on Hopper in 16 bits the
    # stride-1 convolution reads w itself: DirectInput)
    ("stride 1", dict(stride=1, padding=1), 3, "WholeInput"),
    ("stacked phases", dict(stride=2, padding=1), 3, "StackedInput"),
    ("1x1 stride 2", dict(stride=2, padding=0), 1, "OnePhaseInput"),
]


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("case,kw,f,replay", REPLAYS, ids=[r[0] for r in REPLAYS])
def test_repeated_input_grads_replay_their_launches(cp, dtype, case, kw, f, replay):
    """A signature's first call takes the full path and leaves a replay (cuconv.grad_replay); later calls
    with new operands run it: each result against the float64 reference, the same bits as the full path
    on the same operands; as a transposed convolution (the same input gradient) with a bias, and into
    ``out``, also at an address 2 bytes past a 16-byte boundary (which the replay launches with narrower
    words)."""
    from cuconv import grad, grad_replay
    if case == "stride 1" and dtype == "bfloat16" and hopper_available():
        replay = "DirectInput"
    rng = np.random.default_rng(7)
    dt = DTYPES[dtype]
    x_shape = (2, 9, 11, 24)  # the transposed convolutions below give this shape with output_padding 0
    w_shape = (40, f, f, 24)
    grad._GRAD_CALLS.clear()
    p = grad._forward_problem(2, x_shape, w_shape, dtype, "NHWC", kw["stride"], kw["padding"], 1, 1, None)
    dy_shape = (2, *p.out_shape[1:])
    full = None
    for call in range(3):
        dy = rng.standard_normal(dy_shape).astype(dt)
        w = (rng.standard_normal(w_shape) / (3 * f)).astype(dt)
        want = cuconv.conv2d_input_grad(dy.astype(np.float64), w.astype(np.float64), x_shape, **kw)
        got = cuconv.conv2d_input_grad(cp.asarray(dy), cp.asarray(w), x_shape, **kw)
        assert rel_error(got, want) <= TOLERANCE[dtype], call
        (known,) = [k for k in grad._GRAD_CALLS.values() if k.replay is not False]  # the CuPy signature
        assert isinstance(known.replay, getattr(grad_replay, replay))
        if call == 0:
            full = (dy, w, got)
    dy, w, first = full
    again = cuconv.conv2d_input_grad(cp.asarray(dy), cp.asarray(w), x_shape, **kw)
    assert bool((again == first).all())
    bias = rng.standard_normal(24).astype(dt)
    want_b = cuconv.conv_transpose2d(dy.astype(np.float64), w.astype(np.float64), bias.astype(np.float64), **kw)
    for _ in range(2):  # the full path, then the replay (a 1x1 filter of stride 2 with a bias has none)
        got_b = cuconv.conv_transpose2d(cp.asarray(dy), cp.asarray(w), cp.asarray(bias), **kw)
        assert got_b.shape == x_shape and rel_error(got_b, want_b) <= TOLERANCE[dtype]
    base = cp.zeros(int(np.prod(x_shape)) + 1, dtype=dt)
    for out in (cp.empty(x_shape, dtype=dt), base[1:].reshape(x_shape)):
        for _ in range(2):  # the full path for this out's signature, then its replay
            r = cuconv.conv_transpose2d(cp.asarray(dy), cp.asarray(w), out=out, **kw)
            assert r is out and bool((out == first).all())


@pytest.mark.parametrize("bias_grad", [False, True])
def test_repeated_weight_grads_replay_their_launches(cp, bias_grad):
    """The weight gradient's replay (the GEMM's launches, the workspace from scratch): new operands each
    call, against the float64 reference; x at an address 2 bytes past a 16-byte boundary takes another
    launch of the same replay."""
    from cuconv import grad
    rng = np.random.default_rng(8)
    grad._WGRAD_CALLS.clear()
    kw = dict(stride=2, padding=1)
    for call in range(3):
        x = rng.standard_normal((2, 13, 12, 16)).astype(ml_dtypes.bfloat16)
        dy = rng.standard_normal((2, 7, 6, 24)).astype(ml_dtypes.bfloat16)
        want = cuconv.conv2d_weight_grad(x.astype(np.float64), dy.astype(np.float64), (24, 3, 3, 16),
                                         bias_grad=bias_grad, **kw)
        xs = [cp.asarray(x)]
        if call == 2:
            base = cp.zeros(x.size + 1, dtype=x.dtype)
            base[1:] = cp.asarray(x).ravel()
            xs.append(base[1:].reshape(x.shape))
        for xg in xs:
            got = cuconv.conv2d_weight_grad(xg, cp.asarray(dy), (24, 3, 3, 16), bias_grad=bias_grad, **kw)
            if bias_grad:
                assert rel_error(got[1], want[1]) <= TOLERANCE["bfloat16"]
                got, want_w = got[0], want[0]
            else:
                want_w = want
            assert got.shape == (24, 3, 3, 16) and rel_error(got, want_w) <= TOLERANCE["bfloat16"], call
    assert any(type(r).__name__ == "WeightReplay" for r in grad._WGRAD_CALLS.values())
