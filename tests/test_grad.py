"""Gradients and transposed convolution (cuconv.grad) on the CPU, in float64.

* adjoint identities on drawn geometries (stride, dilation, asymmetric / "same" / "valid" padding,
  groups, both layouts, 2-D and 3-D): ``<conv(x, w), dy> = <x, dx> = <w, dw>``, to float64 rounding;
* finite differences of the forward convolution;
* the transposed convolution against an independent scatter-add definition (every input pixel adds
  ``x * w`` into the output positions its taps reach), with output_padding, groups and the epilogue;
* the bias gradient, channels-first layouts, and the errors.

The GPU counterparts are in tests/test_grad_gpu.py.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import cuconv
from cuconv import grad

from geometry import cases


def _operands(case, rng):
    x = rng.standard_normal(case.x_shape())
    w = rng.standard_normal(case.w_shape())
    return x, w


def _adjoint_check(case):
    rng = np.random.default_rng(case.seed)
    x, w = _operands(case, rng)
    kw = case.conv_kwargs()
    fwd = cuconv.conv2d if case.nd == 2 else cuconv.conv3d
    input_grad = grad.conv2d_input_grad if case.nd == 2 else grad.conv3d_input_grad
    weight_grad = grad.conv2d_weight_grad if case.nd == 2 else grad.conv3d_weight_grad
    y = fwd(x, w, **kw)
    dy = rng.standard_normal(y.shape)
    dx = input_grad(dy, w, x.shape, **kw)
    dw = weight_grad(x, dy, w.shape, **kw)
    assert dx.shape == x.shape and dw.shape == w.shape and dx.dtype == np.float64
    scale = np.sqrt(np.sum(y * y) * np.sum(dy * dy)) + 1e-300
    lhs = np.sum(y * dy)
    assert abs(np.sum(x * dx) - lhs) <= 1e-10 * scale, case
    assert abs(np.sum(w * dw) - lhs) <= 1e-10 * scale, case


@settings(max_examples=120, deadline=None)
@given(cases(nd=2, dtypes=("float64",), epilogue=False))
def test_adjoint_identities_2d(case):
    _adjoint_check(case)


@settings(max_examples=40, deadline=None)
@given(cases(nd=3, dtypes=("float64",), epilogue=False, max_channels=6, max_spatial=8))
def test_adjoint_identities_3d(case):
    _adjoint_check(case)


@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
def test_finite_differences(layout):
    """dx and dw agree with central differences of L = sum(conv(x, w) * dy)."""
    rng = np.random.default_rng(3)
    cf = layout == "NCHW"
    x = rng.standard_normal((2, 3, 7, 6) if cf else (2, 7, 6, 3))
    w = rng.standard_normal((4, 3, 3, 2) if cf else (4, 3, 2, 3))
    kw = dict(stride=(2, 1), padding=((1, 2), (0, 1)), dilation=(1, 2), layout=layout)
    dy = rng.standard_normal(cuconv.conv2d(x, w, **kw).shape)
    dx = cuconv.conv2d_input_grad(dy, w, x.shape, **kw)
    dw = cuconv.conv2d_weight_grad(x, dy, w.shape, **kw)

    def loss(xa, wa):
        return float(np.sum(cuconv.conv2d(xa, wa, **kw) * dy))
    h = 1e-6
    for a, g, other in ((x, dx, "x"), (w, dw, "w")):
        for idx in [tuple(rng.integers(0, n) for n in a.shape) for _ in range(6)]:
            plus, minus = a.copy(), a.copy()
            plus[idx] += h
            minus[idx] -= h
            fd = ((loss(plus, w) - loss(minus, w)) if other == "x" else (loss(x, plus) - loss(x, minus))) / (2 * h)
            assert abs(fd - g[idx]) <= 1e-6 * max(1.0, abs(fd)), (other, idx, fd, g[idx])


def _scatter_transpose(x, w, stride, pads, dilation, output_padding, groups):
    """conv_transpose2d by its definition, NHWC: each input pixel o adds x[o] w into the output pixels
    o s - lo + f d of its taps f."""
    N, H, W, Cin = x.shape
    _, R, S, Cog = w.shape
    (sh, sw), (dh, dw), ((lh, hh), (lw, hw)), (oh, ow) = stride, dilation, pads, output_padding
    Ho = (H - 1) * sh - lh - hh + (R - 1) * dh + oh + 1
    Wo = (W - 1) * sw - lw - hw + (S - 1) * dw + ow + 1
    Cig = Cin // groups
    y = np.zeros((N, Ho, Wo, Cog * groups))
    for g, i, j, r, s in itertools.product(range(groups), range(H), range(W), range(R), range(S)):
        oi, oj = i * sh - lh + r * dh, j * sw - lw + s * dw
        if 0 <= oi < Ho and 0 <= oj < Wo:
            xs = x[:, i, j, g * Cig:(g + 1) * Cig]                      # (N, Cig)
            ws = w[g * Cig:(g + 1) * Cig, r, s, :]                      # (Cig, Cog)
            y[:, oi, oj, g * Cog:(g + 1) * Cog] += xs @ ws
    return y


@pytest.mark.parametrize("stride,pads,dilation,output_padding,groups", [
    ((2, 2), ((1, 1), (1, 1)), (1, 1), (1, 1), 1),     # a decoder's 3x3 stride-2 upsampling (torch p=1, op=1)
    ((2, 3), ((0, 2), (1, 0)), (2, 1), (1, 2), 2),     # uneven everything, groups
    ((1, 1), ((0, 0), (0, 0)), (1, 1), (0, 0), 3),
    ((3, 2), ((2, 0), (0, 0)), (1, 3), (0, 1), 1),     # padding larger than a stride step
    ((2, 2), ((0, 0), (0, 1)), (2, 2), (1, 1), 1),     # odd output positions reached by no tap: epilogue only
])
def test_transpose_matches_its_definition(stride, pads, dilation, output_padding, groups):
    rng = np.random.default_rng(sum(stride) + groups)
    x = rng.standard_normal((2, 5, 4, 6))
    w = rng.standard_normal((6, 3, 3, 4 // 2 * 2 if groups != 3 else 2))
    bias = rng.standard_normal(w.shape[-1] * groups)
    want = _scatter_transpose(x, w, stride, pads, dilation, output_padding, groups)
    got = cuconv.conv_transpose2d(x, w, stride=stride, padding=pads, output_padding=output_padding,
                                  dilation=dilation, groups=groups)
    assert got.shape == want.shape and np.allclose(got, want, rtol=1e-12, atol=1e-12)
    res = rng.standard_normal(want.shape)
    fused = cuconv.conv_transpose2d(x, w, bias, stride=stride, padding=pads, output_padding=output_padding,
                                    dilation=dilation, groups=groups, residual=res, alpha=0.5, beta=-2.0,
                                    activation="relu")
    assert np.allclose(fused, np.maximum(0.5 * want + bias - 2.0 * res, 0), rtol=1e-12, atol=1e-12)
    assert cuconv.conv_transpose_output_shape(x.shape, w.shape, stride=stride, padding=pads,
                                              output_padding=output_padding, dilation=dilation,
                                              groups=groups) == want.shape


def test_transpose_is_the_input_gradient_and_torch_shaped():
    """conv_transpose2d(x, w) = conv2d_input_grad(x, w, output shape); NCHW weights as torch's (C_in, C_out/g, R, S)."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 8, 5, 5))          # NCHW, C_in = 8
    w = rng.standard_normal((8, 3, 4, 4))          # (C_in, C_out/groups, R, S), groups 1 -> C_out 3
    y = cuconv.conv_transpose2d(x, w, stride=2, padding=1, layout="NCHW")
    assert y.shape == (2, 3, 10, 10)  # torch: (5 - 1) * 2 - 2 * 1 + (4 - 1) + 1 = 10
    same = cuconv.conv2d_input_grad(x, w, y.shape, stride=2, padding=1, layout="NCHW")
    assert np.array_equal(y, same)
    nhwc = cuconv.conv_transpose2d(np.moveaxis(x, 1, -1), np.moveaxis(w, 1, -1), stride=2, padding=1)
    assert np.allclose(np.moveaxis(nhwc, -1, 1), y, rtol=1e-12, atol=1e-12)
    out = np.empty_like(y)
    assert cuconv.conv_transpose2d(x, w, stride=2, padding=1, layout="NCHW", out=out) is out
    assert np.array_equal(out, y)


def test_transpose3d_matches_the_input_gradient():
    rng = np.random.default_rng(6)
    x = rng.standard_normal((1, 3, 4, 5, 4))
    w = rng.standard_normal((4, 2, 3, 3, 3))
    y = cuconv.conv_transpose3d(x, w, stride=(1, 2, 2), padding=1, output_padding=(0, 1, 0))
    assert y.shape == (1, 2, 8, 9, 3)  # D: (3 - 1) - 2 + 1 + 1, H: 3 * 2 - 2 + 2 + 1 + 1, W: 4 * 2 - 2 + 2 + 1
    assert np.array_equal(y, cuconv.conv3d_input_grad(x, w, y.shape, stride=(1, 2, 2), padding=1))


def test_bias_gradient_and_dtypes():
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 6, 6, 4)).astype(np.float32)
    w = rng.standard_normal((5, 3, 3, 4)).astype(np.float32)
    dy = rng.standard_normal((2, 6, 6, 5)).astype(np.float32)
    dw, db = cuconv.conv2d_weight_grad(x, dy, w.shape, padding="same", bias_grad=True)
    assert dw.dtype == np.float32 and db.dtype == np.float32 and db.shape == (5,)
    assert np.allclose(db, dy.astype(np.float64).sum(axis=(0, 1, 2)), rtol=1e-5)
    want = cuconv.conv2d_weight_grad(x.astype(np.float64), dy.astype(np.float64), w.shape, padding="same")
    assert np.allclose(dw, want, rtol=1e-4, atol=1e-4)


def test_errors_name_the_argument():
    x, w = np.zeros((1, 6, 6, 4)), np.zeros((8, 3, 3, 4))
    dy = np.zeros((1, 6, 6, 8))
    with pytest.raises(ValueError, match="dy: expected shape"):
        cuconv.conv2d_input_grad(dy[:, :5], w, x.shape, padding=1)
    with pytest.raises(ValueError, match="x_shape: expected 4 ints"):
        cuconv.conv2d_input_grad(dy, w, (1, 6, 6), padding=1)
    with pytest.raises(TypeError, match="w: expected dtype float64 like dy"):
        cuconv.conv2d_input_grad(dy, w.astype(np.float32), x.shape, padding=1)
    with pytest.raises(ValueError, match="dy: expected shape"):
        cuconv.conv2d_weight_grad(x, dy, w.shape, padding=0)
    with pytest.raises(TypeError, match="bias_grad"):
        cuconv.conv2d_weight_grad(x, dy, w.shape, padding=1, bias_grad=1)
    xt, wt = np.zeros((1, 4, 4, 8)), np.zeros((8, 3, 3, 2))
    with pytest.raises(ValueError, match="padding: a transposed convolution takes ints"):
        cuconv.conv_transpose2d(xt, wt, padding="same")
    with pytest.raises(ValueError, match="output_padding: must be smaller than the stride"):
        cuconv.conv_transpose2d(xt, wt, stride=2, output_padding=2)
    with pytest.raises(ValueError, match="w: a transposed convolution's weight has the input's C_in=8"):
        cuconv.conv_transpose2d(xt, np.zeros((4, 3, 3, 2)))
    with pytest.raises(ValueError, match="output size"):
        cuconv.conv_transpose2d(xt, wt, padding=5)


def test_wgrad_kernel_named_for_numpy_is_an_error():
    x = np.zeros((1, 4, 4, 8), np.float32)
    dy = np.zeros((1, 4, 4, 8), np.float32)
    with pytest.raises(ValueError, match="kernel: sm80_wgrad"):
        cuconv.conv2d_weight_grad(x, dy, (8, 1, 1, 8), kernel="sm80_wgrad")


def test_explanations_name_what_runs_and_why_the_others_declined():
    rng = np.random.default_rng(11)
    x = rng.standard_normal((2, 9, 9, 16))
    w = rng.standard_normal((8, 3, 3, 16))
    dy = rng.standard_normal((2, 5, 5, 8))
    e = cuconv.explain_weight_grad(x, dy, w.shape, stride=2, padding=1)
    assert e.kernel == "forward formulation on cpu"
    assert set(e.declined) == {"sm90_wgrad", "sm80_wgrad"} and "NumPy" in e.declined["sm80_wgrad"]
    e = cuconv.explain_input_grad(dy, w, x.shape, stride=2, padding=1)
    assert e.kernel == "cpu" and len(e.steps) == 4 and "taps (2, 2)" in str(e)
    with cuconv.overrides(stacked_phases=True):  # the phases stacked: one convolution, the same result
        e = cuconv.explain_input_grad(dy, w, x.shape, stride=2, padding=1)
        assert e.kernel == "cpu" and len(e.steps) == 1 and "8 -> 4 x 16 channels, 2x2 filter" in str(e)
        assert "4 output phases of stride (2, 2) stacked" in e.detail
        stacked = cuconv.conv2d_input_grad(dy, w, x.shape, stride=2, padding=1)
        e = cuconv.explain_input_grad(dy, w[..., :8], (2, 9, 9, 16), stride=2, padding=1, groups=2)  # groups: phases
        assert len(e.steps) == 4
    np.testing.assert_allclose(stacked, cuconv.conv2d_input_grad(dy, w, x.shape, stride=2, padding=1), rtol=1e-12,
                               atol=1e-12)
    e = cuconv.explain_transpose(dy, rng.standard_normal((8, 4, 4, 6)), stride=2, padding=1)
    assert "transposed convolution" in str(e) and len(e.steps) == 4


def test_repeated_calls_skip_validation_but_not_its_errors():
    """A repeated input-gradient or transposed call (same shapes, dtypes, arguments) reuses its validation
    and plan (grad._GRAD_CALLS, grad._TRANSPOSE_SHAPES) and gives the full path's result; arguments that
    only look equal (2.0 for 2, True for 1), a bad activation or a read-only out still raise."""
    rng = np.random.default_rng(11)
    x = rng.standard_normal((2, 5, 6, 4))
    w = rng.standard_normal((4, 3, 3, 3))
    bias = rng.standard_normal(3)
    grad._GRAD_CALLS.clear()
    grad._TRANSPOSE_SHAPES.clear()
    first = cuconv.conv_transpose2d(x, w, bias, stride=2, padding=1, output_padding=1, activation="relu")
    assert len(grad._GRAD_CALLS) == 1 and len(grad._TRANSPOSE_SHAPES) == 1
    x2 = rng.standard_normal(x.shape)
    again = cuconv.conv_transpose2d(x2, w, bias, stride=2, padding=1, output_padding=1, activation="relu")
    assert len(grad._GRAD_CALLS) == 1 and len(grad._TRANSPOSE_SHAPES) == 1
    grad._GRAD_CALLS.clear()
    grad._TRANSPOSE_SHAPES.clear()
    fresh = cuconv.conv_transpose2d(x2, w, bias, stride=2, padding=1, output_padding=1, activation="relu")
    np.testing.assert_array_equal(again, fresh)
    assert not np.array_equal(first, again)
    with pytest.raises(TypeError, match="stride"):
        cuconv.conv_transpose2d(x, w, bias, stride=2.0, padding=1, output_padding=1, activation="relu")
    with pytest.raises(ValueError, match="groups"):
        cuconv.conv_transpose2d(x, w, bias, stride=2, padding=1, output_padding=1, groups=True)
    with pytest.raises(ValueError, match="activation"):
        cuconv.conv_transpose2d(x, w, bias, stride=2, padding=1, output_padding=1, activation="tanh")
    out = np.empty_like(fresh)
    cuconv.conv_transpose2d(x2, w, bias, stride=2, padding=1, output_padding=1, activation="relu", out=out)
    np.testing.assert_array_equal(out, fresh)
    out.flags.writeable = False
    with pytest.raises(ValueError, match="out"):
        cuconv.conv_transpose2d(x2, w, bias, stride=2, padding=1, output_padding=1, activation="relu", out=out)
    dy = rng.standard_normal((2, 3, 3, 3))
    a = cuconv.conv2d_input_grad(dy, w.transpose(3, 1, 2, 0).copy(), (2, 5, 6, 4), stride=2, padding=1)
    b = cuconv.conv2d_input_grad(dy, w.transpose(3, 1, 2, 0).copy(), (2, 5, 6, 4), stride=2, padding=1)
    np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="x_shape"):
        cuconv.conv2d_input_grad(dy, w.transpose(3, 1, 2, 0).copy(), (2, 5, 6, 4, 1), stride=2, padding=1)


def test_sm90_wgrad_takes_its_tma_form_where_64_channels_of_one_tap_fill_a_box():
    """The TMA form of sm90_wgrad needs the channels per group in multiples of 64 (an im2col box holds
    64 channels of one tap); its tile: 64 x 128 for few filters over many columns, else the one of
    128 x 128, 128 x 192 and 128 x 256 with the shortest modelled time (tile_time); other channel counts
    take the cp.async form."""
    from cuconv.backends.sm90 import wgrad as w90
    from cuconv.problem import ConvProblem

    def problem(c, k, side=16, batch=2, groups=1, f=3):
        return ConvProblem.create(nd=2, batch=batch, in_spatial=(side, side), channels=c, out_channels=k,
                                  filter_spatial=(f, f), stride=1, dilation=1, padding=f // 2, groups=groups,
                                  dtype="bfloat16", layout="NHWC")
    v = w90.variant(problem(64, 64, side=56, batch=32))
    assert v.tma and (v.bm, v.bn) == (64, 128) and v.threads == 64 * 2 + 32 and v.source == w90.TMA_SOURCE
    assert w90.variant(problem(256, 80, groups=2)).tma  # 128 channels per group
    for c, groups in ((96, 1), (64, 2)):  # 96 or 32 channels per group: the cp.async form
        p = problem(c, 64, groups=groups)
        assert "64 channels of one tap" in w90.tma_declines(p)
        v = w90.variant(p)
        assert not v.tma and v.source == w90.SOURCE


@pytest.mark.parametrize("c,k,side,batch,f,tile", [
    (512, 512, 64, 1, 3, (128, 192, 4)),    # the VAE's 3x3 512 at 64x64: 96 tiles in one split, no reduce
    (512, 512, 128, 1, 3, (128, 256, 4)),   # long splits, full column tiles
    (256, 256, 256, 1, 3, (128, 256, 4)),
    (128, 128, 512, 1, 3, (128, 192, 4)),   # 1152 columns: six full 192-column tiles
    (512, 512, 7, 32, 3, (128, 192, 4)),    # ResNet-50's 3x3 512 at 7x7: one split
    (128, 128, 28, 32, 3, (128, 128, 4)),   # ResNet-50's 3x3 128: the wider tiles' splits would be short
    (128, 512, 28, 32, 1, (64, 128, 6)),    # 1x1 layers of few columns: half the splits of the 128-row tile
    (2048, 512, 7, 32, 1, (64, 128, 6)),    # one split on 128 CTAs, no partial sums
    (64, 64, 56, 32, 1, (64, 128, 6)),      # a tie at the DRAM floor: the tile without empty rows
    (64, 64, 56, 32, 3, (64, 128, 4)),      # few filters over 576 columns: two CTAs per SM
])
def test_sm90_wgrad_tma_tile_is_the_one_with_the_shorter_modelled_time(c, k, side, batch, f, tile):
    """The TMA form's automatic tile ``(bm, bn, stages)`` (H100, 132 SMs) on layers where the modelled
    choice is the measured fastest (docs/tuning.md#T-wgrad-tile): the shortest modelled time, ties to the
    tile with the fewest empty rows and columns."""
    from cuconv.backends.sm90 import wgrad as w90
    from cuconv.problem import ConvProblem
    p = ConvProblem.create(nd=2, batch=batch, in_spatial=(side, side), channels=c, out_channels=k,
                           filter_spatial=(f, f), stride=1, dilation=1, padding=f // 2, groups=1,
                           dtype="bfloat16", layout="NHWC")
    assert w90.tma_tile_for(p, 132) == tile
    if tile in w90.TMA_TILES:
        times = {t: w90.tile_time(p, t[0], t[1], 132, t[2]) for t in w90.TMA_TILES}
        assert times[tile] == min(times.values()), times
    v = w90.variant(p, sm_count=132)
    assert (v.bm, v.bn) == tile[:2] and v.name.endswith(f"_s{tile[2]}")


def test_sm90_wgrad_pads_a_few_filters_to_eight():
    """A weight gradient of 3 filters (a decoder's RGB output) runs as one of 8 on sm90_wgrad (dy's
    channels padded with zeros); 8 or more filters, groups, or channel counts the kernel cannot take,
    are not padded."""
    from cuconv.backends.sm90 import wgrad as w90
    from cuconv.problem import ConvProblem

    def problem(c, k, groups=1):
        return ConvProblem.create(nd=2, batch=1, in_spatial=(32, 32), channels=c, out_channels=k,
                                  filter_spatial=(3, 3), stride=1, dilation=1, padding=1, groups=groups,
                                  dtype="bfloat16", layout="NHWC")
    p8 = w90.padded_filters(problem(128, 3))
    assert p8.out_channels == 8 and p8.channels == 128 and p8.filter_spatial == (3, 3) and p8.gemm_n == 8
    assert w90.padded_filters(problem(128, 16)) is None      # already a multiple of 8
    assert w90.padded_filters(problem(128, 12)) is None      # 8 or more: sm80_wgrad copies 8 bytes
    assert w90.padded_filters(problem(128, 6, groups=2)) is None
    assert w90.padded_filters(problem(3, 5)) is None         # 3 channels: not a kernel the padding reaches


@settings(max_examples=60, deadline=None)
@given(C=st.sampled_from([8, 16]), K=st.integers(1, 7), R=st.integers(1, 4), S=st.integers(1, 4),
       dil=st.tuples(st.integers(1, 2), st.integers(1, 2)), pads=st.tuples(*[st.integers(0, 3)] * 4),
       H=st.integers(6, 14), W=st.integers(6, 14), N=st.integers(1, 2), seed=st.integers(0, 2**31 - 1))
def test_the_exchanged_weight_gradient_is_the_original(C, K, R, S, dil, pads, H, W, N, seed):
    """A stride-1 weight gradient with few filters equals that of the convolution taking dy as its input and
    giving x's shape under the flipped filter (:func:`cuconv.backends.sm90.wgrad.exchanged_roles`), flipped
    back with its channel axes exchanged (float64, CPU); None exactly where a padding would be negative."""
    from cuconv.backends.sm90.wgrad import exchanged_roles
    from cuconv.problem import ConvProblem
    padding = ((pads[0], pads[1]), (pads[2], pads[3]))
    try:
        p = ConvProblem.create(nd=2, batch=N, in_spatial=(H, W), channels=C, out_channels=K, filter_spatial=(R, S),
                               stride=1, dilation=dil, padding=padding, groups=1, dtype="bfloat16", layout="NHWC")
    except ValueError:
        return  # no output
    q = exchanged_roles(p)
    feasible = all(a <= (f - 1) * d and b <= (f - 1) * d
                   for f, d, (a, b) in zip((R, S), dil, padding))
    assert (q is not None) == feasible
    if q is None:
        return
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((N, H, W, C))
    dy = rng.standard_normal(p.out_shape)
    want = cuconv.conv2d_weight_grad(x, dy, (K, R, S, C), dilation=dil, padding=padding)
    got = cuconv.conv2d_weight_grad(dy, x, q.w_shape, dilation=q.dilation, padding=tuple(zip(q.pad_lo, q.pad_hi)))
    np.testing.assert_allclose(np.moveaxis(got[:, ::-1, ::-1, :], (0, 3), (3, 0)), want, rtol=1e-10, atol=1e-10)


@settings(max_examples=40, deadline=None)
@given(C=st.sampled_from([8, 16]), K=st.integers(1, 7), R=st.integers(1, 3), S=st.integers(1, 3),
       dil=st.tuples(st.integers(1, 2), st.integers(1, 2)), H=st.integers(6, 12), W=st.integers(6, 12),
       seed=st.integers(0, 2**31 - 1))
def test_exchanged_then_folded_weight_gradient_is_the_original(C, K, R, S, dil, H, W, seed):
    """What sm90_wgrad computes for a few-filter, stride-1 weight gradient, step by step on the CPU
    (float64): the roles exchanged (:func:`exchanged_roles`), the exchanged problem's input (dy) densely
    width-folded (:func:`folded_width`, ``fold_x_dense``), the folded gradient unfolded (``unfold_w_dense``),
    then flipped with its channel axes exchanged: the original weight gradient."""
    from unittest import mock
    from cuconv.backends.sm90 import wgrad as w90
    from cuconv.models.fold import fold_x_dense, unfold_w_dense
    from cuconv.problem import ConvProblem
    padding = tuple(((f - 1) * d // 2, (f - 1) * d - (f - 1) * d // 2) for f, d in zip((R, S), dil))  # "same"
    p = ConvProblem.create(nd=2, batch=2, in_spatial=(H, W), channels=C, out_channels=K, filter_spatial=(R, S),
                           stride=1, dilation=dil, padding=padding, groups=1, dtype="bfloat16", layout="NHWC")
    q = w90.exchanged_roles(p)
    with mock.patch.object(w90, "FOLD_MIN_PIXELS", 0):
        qf = w90.folded_width(q)
    assert q is not None and qf is not None
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((2, H, W, C))
    dy = rng.standard_normal(p.out_shape)
    want = cuconv.conv2d_weight_grad(x, dy, (K, R, S, C), dilation=dil, padding=padding)
    dyf = fold_x_dense(dy, S, 1, dil[1], q.pad_lo[1], W)
    assert dyf.shape == qf.x_shape
    dwf = cuconv.conv2d_weight_grad(dyf, x, qf.w_shape, stride=qf.stride, dilation=qf.dilation,
                                    padding=tuple(zip(qf.pad_lo, qf.pad_hi)))
    dwx = unfold_w_dense(dwf, S, K)                                    # (C, R, S, K)
    np.testing.assert_allclose(np.moveaxis(dwx[:, ::-1, ::-1, :], (0, 3), (3, 0)), want, rtol=1e-10, atol=1e-10)


def test_gradient_convolutions_on_hopper_take_the_kernel_with_in_place_variants():
    """The automatic choice gives a 1x1 convolution from 40 channels to pointwise_mma, which has no variant
    storing phases into place or reading the filter from w; a gradient's forward convolution on Hopper runs
    on sm90_tma instead and says so, while a forced kernel and other GPUs keep the automatic choice."""
    from cuconv.problem import ConvProblem
    from geometry import A100, H100
    p = ConvProblem.create(nd=2, batch=2, in_spatial=(12, 10), channels=64, out_channels=40, filter_spatial=(1, 1),
                           stride=1, dilation=1, padding=0, groups=1, dtype="bfloat16", layout="NHWC")
    args = ((2, 12, 10, 40), (64, 1, 1, 40), 1, 0, 1, 1, {})
    plan, e = grad._forward_explanation(p, H100, *args, None, with_plan=True)
    assert e.kernel == plan.kernel.name == "sm90_tma", e.kernel
    assert "chosen over pointwise_mma" in e.detail, e.detail
    assert grad._forward_explanation(p, H100, *args, "pointwise_mma").kernel == "pointwise_mma"
    assert grad._forward_explanation(p, A100, *args, None).kernel == "pointwise_mma"


@pytest.mark.parametrize("batch,resident,end", [(1, 2, "direct"), (32, 2, "fused"), (32, 0, "partials")])
def test_sm90_wgrad_tma_launch_hands_each_end_its_addresses(monkeypatch, batch, resident, end):
    """``TmaWgradLaunch`` picks its end from the split count and the occupancy, and hands the main kernel
    (workspace, dw, counters): one split writes dw alone; a split grid takes one scratch buffer whose first
    ``TILE_COUNTERS`` words are the tile counters (zeroed when allocated) and whose partial sums follow
    them; the reduce launch, where it runs, reads those partial sums into dw."""
    import cuconv.launch
    from cuconv.backends.sm80 import wgrad as w80
    from cuconv.backends.sm90 import tensormap
    from cuconv.backends.sm90 import wgrad as w90
    from cuconv.problem import ConvProblem

    from conftest import DeviceBuf

    launches, scratch_calls = [], []

    class Recorder:
        def __init__(self, fn, grid, block, smem, args, slots=()):
            self.name, self.slots = fn, slots

        def __call__(self, *ptrs):
            launches.append((self.name, ptrs))

    buf = DeviceBuf()

    def scratch(purpose, shape, dtype, zeroed=False):
        scratch_calls.append((purpose, tuple(shape), np.dtype(dtype), zeroed))
        return buf

    monkeypatch.setattr(w80, "load_cuda_function", lambda source, dev, defines, name, smem=0: name)
    monkeypatch.setattr(w80, "PackedLaunch", Recorder)
    monkeypatch.setattr(cuconv.launch, "resident_blocks", lambda fn, threads, smem: resident)
    monkeypatch.setattr(w90, "scratch", scratch)
    monkeypatch.setattr(tensormap, "encode_im2col_x", lambda *a, **k: np.zeros(16, np.uint64))
    monkeypatch.setattr(tensormap, "encode_tiled_c", lambda *a, **k: np.zeros(16, np.uint64))
    monkeypatch.setattr(tensormap, "tma_box_params", lambda *a, **k: None)
    p = ConvProblem.create(nd=2, batch=batch, in_spatial=(8, 8) if batch == 1 else (56, 56), channels=64,
                           out_channels=64, filter_spatial=(1, 1), stride=1, dilation=1, padding=0, groups=1,
                           dtype="bfloat16", layout="NHWC")
    device = type("Device", (), {"sm_count": 132, "cc": (9, 0)})()
    v = w90.variant(p, tma=True)
    run = w90.TmaWgradLaunch(p, device, v)
    assert run.end == {"direct": w90.END_DIRECT, "fused": w90.END_FUSED, "partials": w90.END_PARTIALS}[end]
    x, dy, dw = DeviceBuf(), DeviceBuf(), DeviceBuf()
    run(x, dy, dw)
    main, ws = v.name, buf.data.ptr + 4 * w90.TILE_COUNTERS
    if end == "direct":
        assert run.splits.count == 1 and not scratch_calls and launches == [(main, (0, dw.data.ptr, 0))]
        return
    assert run.splits.count > 1 and run.splits.tiles <= w90.TILE_COUNTERS
    assert scratch_calls == [(scratch_calls[0][0], (w90.TILE_COUNTERS + run.splits.count * run.count,),
                              np.dtype(np.uint32), True)]
    if end == "fused":
        assert launches == [(main, (ws, dw.data.ptr, buf.data.ptr))]
        assert "by the grid itself" in run.describe()
    else:
        assert launches == [(main, (ws, dw.data.ptr, 0)), (main + "_reduce", (ws, dw.data.ptr))]
        assert "a second launch" in run.describe()
