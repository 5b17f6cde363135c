"""``sm90_wpack`` / ``conv3d_native_wpack``: neighbouring pixels packed into the channels, then the Hopper kernel.

On the CPU: the packed convolution equals the original on drawn geometry (the proof of
:mod:`cuconv.models.wpack`), the packed problem the plan runs is that one, and the dispatcher's choices.
On a Hopper GPU: automatic and forced calls equal the reference, with every epilogue term, in 2-D and 3-D.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import cuconv
from cuconv import dispatch
from cuconv.backends.sm90.wpack import MAX_WORK_RATIO, wpack_problem
from cuconv.models.wpack import pack_bias, pack_filter, pack_filter_index, work_ratio, wpack_geometry
from cuconv.problem import ConvProblem, Epilogue

from conftest import assert_close, needs_hopper, random_array
from geometry import A100, H100


@st.composite
def packs(draw, nd=2):
    """A convolution of 8, 16 or 32 channels whose last axis packs: W a multiple of 64 / C."""
    c = draw(st.sampled_from([8, 16, 32]))
    g = 64 // c
    k = draw(st.sampled_from([4, 8, 16, 24, 32, 40]))
    filt = tuple(draw(st.integers(1, 4)) for _ in range(nd - 1)) + (draw(st.integers(1, 6)),)
    stride = tuple(draw(st.integers(1, 3)) for _ in range(nd))
    dilation = tuple(draw(st.integers(1, 2)) for _ in range(nd))
    padding = tuple((draw(st.integers(0, 3)), draw(st.integers(0, 3))) for _ in range(nd))
    spatial = tuple(draw(st.integers((f - 1) * d + 1, (f - 1) * d + 7)) for f, d in zip(filt[:-1], dilation[:-1]))
    reach = (filt[-1] - 1) * dilation[-1] + 1
    spatial += (g * draw(st.integers(-(-reach // g), -(-reach // g) + 5)),)
    return dict(shape=(draw(st.integers(1, 2)), *spatial, c), k=k, filt=filt, stride=stride, dilation=dilation,
                padding=padding, seed=draw(st.integers(0, 2**31 - 1)))


def _geometry(case, q):
    return wpack_geometry(case["shape"][-2], q, case["filt"][-1], case["stride"][-1], case["dilation"][-1],
                          case["padding"][-1][0], case["shape"][-1])


def _problem_of(case, nd, dtype="bfloat16", layout=None, epilogue=Epilogue()):
    return ConvProblem.create(nd=nd, batch=case["shape"][0], in_spatial=case["shape"][1:-1],
                              channels=case["shape"][-1], out_channels=case["k"], filter_spatial=case["filt"],
                              stride=case["stride"], dilation=case["dilation"], padding=case["padding"], groups=1,
                              dtype=dtype, layout=layout or ("NHWC" if nd == 2 else "NDHWC"), epilogue=epilogue)


@settings(max_examples=200, deadline=None)
@given(case=packs(), nd=st.sampled_from([2, 3]))
def test_the_packed_convolution_is_the_original(case, nd):
    """conv(x, w) == conv(x seen in groups of g pixels, pack_filter(w)) (float64, CPU), the output seen in groups
    of go pixels; the plan's packed problem is that convolution."""
    if nd == 3:
        case = dict(case, shape=(case["shape"][0], 3, *case["shape"][1:]), filt=(2, *case["filt"]),
                    stride=(1, *case["stride"]), dilation=(1, *case["dilation"]), padding=((1, 0), *case["padding"]))
    rng = np.random.default_rng(case["seed"])
    x = rng.standard_normal(case["shape"])
    c, k = x.shape[-1], case["k"]
    w = rng.standard_normal((k, *case["filt"], c))
    b = rng.standard_normal(k)
    kw = dict(stride=case["stride"], dilation=case["dilation"], padding=case["padding"])
    conv = cuconv.conv2d if nd == 2 else cuconv.conv3d
    want = conv(x, w, b, **kw)
    pack = _geometry(case, want.shape[-2])
    assume(pack is not None)
    lead = w.shape[1:-2]
    wp = pack_filter(w.reshape(k, -1, w.shape[-2], c), pack, case["stride"][-1], case["dilation"][-1],
                     case["padding"][-1][0]).reshape(pack.go * k, *lead, pack.taps, pack.g * c)
    xp = x.reshape(*x.shape[:-2], x.shape[-2] // pack.g, pack.g * c)
    got = conv(xp, wp, pack_bias(b, pack), stride=(*case["stride"][:-1], pack.stride),
               dilation=(*case["dilation"][:-1], 1),
               padding=(*case["padding"][:-1], (pack.pad_lo, pack.pad_hi)))
    assert got.shape == (*want.shape[:-2], want.shape[-2] // pack.go, pack.go * k)
    np.testing.assert_allclose(got.reshape(want.shape), want, rtol=1e-12, atol=1e-12)
    inner = wpack_problem(_problem_of(case, nd), pack)
    assert inner.x_shape == xp.shape and inner.w_shape == wp.shape and inner.out_shape == got.shape


def test_filter_index_copies_each_weight_once_per_output_pixel():
    pack = wpack_geometry(W=40, Q=40, S=3, sw=1, dw=1, pl=1, C=32)
    assert (pack.g, pack.go, pack.taps, pack.stride, pack.pad_lo, pack.pad_hi) == (2, 2, 3, 1, 1, 1)
    index = pack_filter_index(pack, K=5, R=2, S=3, C=32, sw=1, dw=1, pl=1)
    assert index.shape == (10, 2, 3, 64)
    used = index[index >= 0]
    assert len(used) == 2 * 5 * 2 * 3 * 32 and set(np.bincount(used)) == {2}  # each weight, once per output pixel
    # output pixel 0 of a pair reads input columns -1, 0, 1: the odd half of group -1, then group 0
    assert (index[0, 0, 0, 32:] == np.arange(32)).all() and (index[0, 0, 0, :32] < 0).all()
    assert (index[0, 0, 1, :32] == 32 + np.arange(32)).all() and (index[0, 0, 2] < 0).all()


@pytest.mark.parametrize("args,why", [
    (dict(W=41, Q=41, S=3, sw=1, dw=1, pl=1, C=32), None),    # W odd
    (dict(W=40, Q=39, S=3, sw=1, dw=1, pl=0, C=32), None),    # Q odd
    (dict(W=40, Q=40, S=3, sw=1, dw=1, pl=1, C=24), None),    # 24 does not divide 64
    (dict(W=40, Q=40, S=3, sw=1, dw=1, pl=1, C=64), None),    # nothing to pack
])
def test_no_packing(args, why):
    assert wpack_geometry(**args) is None


def test_work_ratio_counts_tile_width_and_taps():
    yolo = wpack_geometry(W=160, Q=160, S=3, sw=1, dw=1, pl=1, C=32)
    assert work_ratio(yolo, 32, 32, 3) == 0.5          # K 32 -> 64 wide tiles full, the same taps
    down = wpack_geometry(W=320, Q=160, S=3, sw=2, dw=1, pl=1, C=32)
    assert (down.go, down.taps) == (1, 2) and work_ratio(down, 32, 64, 3) == pytest.approx(2 / 3)
    assert work_ratio(yolo, 32, 64, 3) == 1.0          # K 64 fills its tiles already


def _p(c, k, f, stride=1, h=256, w=256, layout="NHWC", nd=2, dtype="bfloat16"):
    return ConvProblem.create(nd=nd, batch=8, in_spatial=(h,) * (nd - 1) + (w,), channels=c, out_channels=k,
                              filter_spatial=(f,) * nd, stride=stride, dilation=1, padding=f // 2, groups=1,
                              dtype=dtype, layout=layout, epilogue=Epilogue(has_bias=True))


@pytest.mark.parametrize("c,k,f,stride", [(32, 32, 3, 1), (32, 64, 3, 2), (16, 32, 3, 1), (16, 64, 3, 2),
                                          (32, 16, 5, 1)])
def test_dispatch_packs_few_channel_layers(c, k, f, stride):
    plan, ex = dispatch.select(_p(c, k, f, stride, h=256 * stride, w=256 * stride), H100)
    assert ex.kernel == "sm90_wpack", ex.declined
    assert plan.inner.kernel.name == "sm90_tma"
    assert plan.ratio <= MAX_WORK_RATIO and "width pack" in plan.describe()
    assert plan.unpacked().kernel.name == "sm90_tma" and plan.unpacked().problem == plan.problem


def test_dispatch_packs_3d_layers_on_the_native_kernel():
    plan, ex = dispatch.select(_p(32, 32, 3, layout="NDHWC", nd=3, h=48, w=64), H100)
    assert ex.kernel == "conv3d_native_wpack" and plan.inner.kernel.name == "conv3d_native"


@pytest.mark.parametrize("kw,kernel,why", [
    (dict(c=32, k=32, f=1), "pointwise_mma", "one-column filter"),
    (dict(c=32, k=64, f=3), "sm90_tma", "1.00 of the tensor-core work"),
    (dict(c=64, k=32, f=3), "sm90_tma", "C=64"),
    (dict(c=32, k=32, f=3, w=63), "smallc_mma", "W=63 is not a multiple of 2"),
    (dict(c=32, k=32, f=3, layout="NCHW"), "sm90_tma", "NCHW output"),
    (dict(c=32, k=32, f=3, h=96, w=96), "smallc_mma", "fewer than 8 waves of 132 SMs"),
])
def test_dispatch_declines_with_a_reason(kw, kernel, why):
    plan, ex = dispatch.select(_p(**kw), H100)
    assert ex.kernel == kernel
    assert why in ex.declined["sm90_wpack"], ex.declined["sm90_wpack"]


@pytest.mark.parametrize("kw, kernel", [(dict(c=32, k=128, f=1, stride=2), "sm90_tma"),
                                        (dict(c=32, k=64, f=3), "sm90_tma"),
                                        (dict(c=32, k=32, f=3, h=96, w=96), "smallc_mma")])
def test_what_the_automatic_choice_passes_over_runs_when_forced(kw, kernel):
    """The pay-off rules are the automatic choice's (``passes_over``): forced, the kernel packs the problem."""
    p = _p(**kw)
    _, ex = dispatch.select(p, H100)
    assert ex.kernel == kernel and "passes it over" in ex.declined["sm90_wpack"]
    plan, forced = dispatch.select(p, H100, forced="sm90_wpack")
    assert forced.forced and plan.kernel.name == "sm90_wpack" and plan.inner.problem.channels == 64


def test_input_gradient_variants_take_the_unpacked_plan():
    """A stride-1 input gradient of a 32-channel layer is a forward convolution the pack takes; its MN-major
    filter variant (and the phase-storing one) are built on the unpacked Hopper plan of the same problem."""
    from cuconv.backends.sm90.kernel import Sm90Plan
    from cuconv.backends.sm90.phase_scatter import direct_filter, flipped_view
    p = _p(32, 32, 3)
    plan, ex = dispatch.select(p, H100)
    assert ex.kernel == "sm90_wpack"
    got, why = direct_filter(plan, flipped_view((32, 3, 3, 32), ((2, 1, 3), (2, 1, 3))))
    assert isinstance(got, Sm90Plan) and got.problem == p and got.mn_filter is not None, why


def test_not_on_ampere():
    _, ex = dispatch.select(_p(32, 32, 3), A100)
    assert ex.kernel != "sm90_wpack" and "Hopper" in ex.declined["sm90_wpack"]


# ----------------------------------------------------------------------------------------------- GPU
gpu = pytest.mark.gpu


@st.composite
def gpu_cases(draw):
    case = draw(packs(nd=draw(st.sampled_from([2, 2, 3]))))
    return dict(case, dtype=draw(st.sampled_from(["bfloat16", "float16"])), bias=draw(st.booleans()),
                residual=draw(st.booleans()), activation=draw(st.sampled_from([None, "relu", "silu", "gelu"])),
                alpha=draw(st.sampled_from([1.0, 0.5])), beta=draw(st.sampled_from([1.0, -0.75])))


@gpu
@needs_hopper
def test_packed_calls_match_the_reference(cp):
    """Every drawn problem the pack takes (forced where the automatic choice would not pack it, the work ratio
    aside) equals the float64 reference, every epilogue term included."""
    @settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
    @given(case=gpu_cases())
    def prop(case):
        nd = len(case["shape"]) - 2
        kernel = "sm90_wpack" if nd == 2 else "conv3d_native_wpack"
        dt, rng = case["dtype"], np.random.default_rng(case["seed"])
        c, k = case["shape"][-1], case["k"]
        x = random_array(rng, case["shape"], dt)
        w = random_array(rng, (k, *case["filt"], c), dt, 1 / np.sqrt(np.prod(case["filt"]) * c))
        kw = dict(stride=case["stride"], dilation=case["dilation"], padding=case["padding"],
                  activation=case["activation"], alpha=case["alpha"], beta=case["beta"])
        ref_fn = cuconv.reference.conv2d if nd == 2 else cuconv.reference.conv3d
        b = random_array(rng, (k,), dt) if case["bias"] else None
        res = random_array(rng, ref_fn(x, w, **kw).shape, dt) if case["residual"] else None
        ref = ref_fn(x, w, b, residual=res, **kw)
        fn = cuconv.conv2d if nd == 2 else cuconv.conv3d
        args = (cp.asarray(x), cp.asarray(w), None if b is None else cp.asarray(b))
        gres = None if res is None else cp.asarray(res)
        try:
            ex = cuconv.explain(*args, residual=gres, kernel=kernel, **kw)
        except cuconv.KernelDeclined:
            assume(False)
        assert ex.kernel == kernel
        got = fn(*args, residual=gres, kernel=kernel, **kw)
        assert_close(got.get(), ref, dt, str(case))
        if gres is not None:
            np.testing.assert_array_equal(gres.get(), res)  # the caller's residual is not modified

    prop()


@gpu
@needs_hopper
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("c,h,k,stride", [(32, 192, 32, 1), (32, 384, 64, 2), (16, 192, 32, 1), (16, 384, 64, 2)])
def test_few_channel_layers_run_packed_automatically(cp, dtype, c, h, k, stride):
    """YOLOv8s-style few-channel layers (at least 8 waves of tiles unpacked) take the pack without being asked,
    with a bias, an activation and a residual, and equal the unpacked kernel's result (the property test above
    holds the pack to the reference)."""
    rng = np.random.default_rng(c + h + k)
    x = cp.asarray(random_array(rng, (8, h, h, c), dtype))
    w = cp.asarray(random_array(rng, (k, 3, 3, c), dtype, 1 / np.sqrt(9 * c)))
    b = cp.asarray(random_array(rng, (k,), dtype))
    kw = dict(stride=stride, padding=1, activation="silu")
    res = cp.asarray(random_array(rng, (8, h // stride, h // stride, k), dtype))
    assert cuconv.explain(x, w, b, residual=res, **kw).kernel == "sm90_wpack"
    want = cuconv.conv2d(x, w, b, residual=res, kernel="sm90_tma", **kw).get().astype(np.float64)
    for _ in range(2):  # the second call reuses the plan, its launch records and the filter table
        got = cuconv.conv2d(x, w, b, residual=res, **kw)
        assert_close(got.get(), want, dtype)
