"""Shared test geometry: hypothesis strategies, named problems and cases, the model devices, and the
one runner of the GPU property tests over forced tile settings.

* :func:`cases`, :func:`halo_cases`, :func:`coverage_cases`: drawn convolutions.
* :func:`problem2d`, :func:`problem3d`: a :class:`~cuconv.problem.ConvProblem` from short keywords;
  :func:`case2d`, :func:`case3d`: the same as a :class:`Case` (for the GPU tests).
* :data:`H100`, :data:`A100`: :class:`~cuconv.device.DeviceInfo` values of a Hopper and an Ampere GPU,
  so the CPU tests ask the kernels for plans without a device.
* :class:`Setting` and :func:`run_property`: one property test over a list of forced tile settings.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Tuple, Union

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from cuconv.device import DeviceInfo
from cuconv.problem import ConvProblem, Epilogue, output_size

#: A Hopper GPU as the kernels see it (132 SMs, 227 KiB of shared memory per block).
H100 = DeviceInfo(kind="cuda", index=0, name="H100", cc=(9, 0), arch="sm_90a", sm_count=132,
                  smem_per_block_optin=232448)
#: An Ampere GPU (sm_80: no TMA, no wgmma).
A100 = DeviceInfo(kind="cuda", index=0, name="A100", cc=(8, 0), arch="sm_80", sm_count=108,
                  smem_per_block_optin=166912)


@dataclass
class Case:
    nd: int
    batch: int
    spatial: Tuple[int, ...]
    channels: int
    out_channels: int
    filt: Tuple[int, ...]
    stride: Tuple[int, ...]
    dilation: Tuple[int, ...]
    padding: object
    groups: int
    dtype: str
    layout: str
    epilogue: dict = field(default_factory=dict)
    seed: int = 0

    def x_shape(self):
        return ((self.batch, *self.spatial, self.channels) if self.layout in ("NHWC", "NDHWC")
                else (self.batch, self.channels, *self.spatial))

    def w_shape(self):
        cg = self.channels // self.groups
        return ((self.out_channels, *self.filt, cg) if self.layout in ("NHWC", "NDHWC")
                else (self.out_channels, cg, *self.filt))

    def conv_kwargs(self):
        return dict(stride=self.stride, padding=self.padding, dilation=self.dilation, groups=self.groups,
                    layout=self.layout)


def draw_epilogue(draw) -> dict:
    """The epilogue keywords of a drawn case (:func:`check_case`): bias, residual with its beta, alpha,
    activation, each drawn."""
    ep = {}
    if draw(st.booleans()):
        ep["bias"] = True
    if draw(st.booleans()):
        ep["residual"] = True
        ep["beta"] = draw(st.sampled_from([1.0, 0.5, -2.0, 0.0]))
    ep["alpha"] = draw(st.sampled_from([1.0, 1.0, 0.5, -1.25]))
    ep["activation"] = draw(st.sampled_from([None, None, "relu", "silu", "gelu"]))
    return ep


@st.composite
def cases(draw, nd=2, dtypes=("float16", "bfloat16", "float32"), layouts=None, max_spatial=12,
          max_channels=24, groups=True, epilogue=True, channel_multiple=1, allow_same=True):
    """Draw a valid convolution (output size >= 1 in every dim)."""
    if layouts is None:
        layouts = ("NHWC", "NCHW") if nd == 2 else ("NDHWC", "NCDHW")
    g = draw(st.sampled_from([1, 1, 2, 3])) if groups else 1
    cg = draw(st.integers(1, max(1, max_channels // g)))
    kg = draw(st.integers(1, max(1, max_channels // g)))
    cg = -(-cg // channel_multiple) * channel_multiple
    kg = -(-kg // channel_multiple) * channel_multiple
    spatial = tuple(draw(st.integers(1, max_spatial if nd == 2 else max(4, max_spatial // 2))) for _ in range(nd))
    filt = tuple(draw(st.integers(1, 4)) for _ in range(nd))
    stride = tuple(draw(st.integers(1, 3)) for _ in range(nd))
    dilation = tuple(draw(st.integers(1, 2)) for _ in range(nd))
    pad_kind = draw(st.sampled_from(["pairs", "int", "same", "valid"] if allow_same else ["pairs", "int"]))
    if pad_kind == "pairs":
        padding = tuple((draw(st.integers(0, 3)), draw(st.integers(0, 3))) for _ in range(nd))
        lo_hi = padding
    elif pad_kind == "int":
        p = draw(st.integers(0, 2))
        padding, lo_hi = p, ((p, p),) * nd
    else:
        padding, lo_hi = pad_kind, None
    if lo_hi is not None:
        for n, f, s, d, (lo, hi) in zip(spatial, filt, stride, dilation, lo_hi):
            assume(output_size(n, f, s, d, lo, hi) >= 1)
    elif pad_kind == "valid":
        for n, f, d in zip(spatial, filt, dilation):
            assume(n >= (f - 1) * d + 1)
    ep = draw_epilogue(draw) if epilogue else {}
    return Case(nd=nd, batch=draw(st.integers(1, 3)), spatial=spatial, channels=cg * g, out_channels=kg * g,
                filt=filt, stride=stride, dilation=dilation, padding=padding, groups=g,
                dtype=draw(st.sampled_from(dtypes)), layout=draw(st.sampled_from(layouts)), epilogue=ep,
                seed=draw(st.integers(0, 2**31 - 1)))


def make_operands(case: Case, xp=None):
    """Random x, w, bias, residual for ``case`` (NumPy, or moved to ``xp`` = cupy)."""
    import numpy as np

    from conftest import random_array
    rng = np.random.default_rng(case.seed)
    x = random_array(rng, case.x_shape(), case.dtype)
    w = random_array(rng, case.w_shape(), case.dtype, scale=1.0 / max(1, (case.channels // case.groups)) ** 0.5)
    bias = random_array(rng, (case.out_channels,), case.dtype) if case.epilogue.get("bias") else None
    ref_shape = None
    residual = None
    if case.epilogue.get("residual"):
        import cuconv.reference as reference
        ref_shape = reference.convnd(x[:1], w, **case.conv_kwargs()).shape
        out_shape = (case.batch, *ref_shape[1:])
        residual = random_array(rng, out_shape, case.dtype)
    if xp is not None:
        x, w = xp.asarray(x), xp.asarray(w)
        bias = None if bias is None else xp.asarray(bias)
        residual = None if residual is None else xp.asarray(residual)
    return x, w, bias, residual


def check_case(case: Case, xp=None, kernel=None, poison=False, in_place=False):
    """Run cuconv on ``case`` and compare with the float64 reference; returns the relative error."""
    import numpy as np

    import cuconv
    from conftest import assert_close, rel_error
    x, w, bias, residual = make_operands(case, xp)
    ep = case.epilogue
    kwargs = dict(case.conv_kwargs(), alpha=ep.get("alpha", 1.0), beta=ep.get("beta", 1.0),
                  activation=ep.get("activation"))
    fn = cuconv.conv2d if case.nd == 2 else cuconv.conv3d
    ref_fn = cuconv.reference.conv2d if case.nd == 2 else cuconv.reference.conv3d
    ref = ref_fn(x, w, bias, residual=residual, **kwargs)
    out = None
    mod = np if xp is None else xp
    if in_place and residual is not None:
        out = residual
    elif poison:
        out = mod.full(ref.shape, np.nan, dtype=x.dtype)
    got = fn(x, w, bias, residual=residual, out=out, kernel=kernel, **kwargs)
    if out is not None:
        assert got is out
    assert type(got) is type(x), f"result is {type(got).__name__}, input was {type(x).__name__}"
    assert got.dtype == x.dtype and tuple(got.shape) == ref.shape
    assert_close(got, ref, case.dtype, context=repr(case))
    return rel_error(got, ref)


@st.composite
def halo_cases(draw, nd=2, max_width=150, max_channels=80):
    """A conv that the Hopper kernel's halo tiles can serve: H/W stride 1 and a window reach
    (filter extent - 1) x dilation of at most 2 along H and W, widths from 1 to ``max_width`` (several
    64-column tiles, a partial last one), C and K multiples of 8; depth (conv3d) unrestricted."""
    base = draw(cases(nd=nd, dtypes=("bfloat16", "float16"), layouts=(("NHWC", "NCHW") if nd == 2 else
                                                                        ("NDHWC", "NCDHW")),
                      groups=False, channel_multiple=8, max_spatial=8, max_channels=max_channels, allow_same=False))
    # (extent, dilation) per H/W dim with (extent - 1) * dilation <= 2
    hw = [draw(st.sampled_from([(1, 1), (2, 1), (3, 1), (2, 2), (3, 1)])) for _ in range(2)]
    filt = tuple(base.filt[:nd - 2]) + tuple(f for f, _ in hw)
    dilation = tuple(base.dilation[:nd - 2]) + tuple(d for _, d in hw)
    stride = tuple(base.stride[:nd - 2]) + (1, 1)
    spatial = tuple(base.spatial[:nd - 2]) + (draw(st.integers(1, 12)), draw(st.integers(1, max_width)))
    padding = tuple((draw(st.integers(0, 2)), draw(st.integers(0, 2))) for _ in range(nd))
    for n, f, s, d, (lo, hi) in zip(spatial, filt, stride, dilation, padding):
        assume(output_size(n, f, s, d, lo, hi) >= 1)
    return Case(**{**base.__dict__, "spatial": spatial, "filt": filt, "dilation": dilation, "stride": stride,
                   "padding": padding, "batch": draw(st.integers(1, 2))})


def smallc_takes(case: Case, precision: str = "float32") -> bool:
    """Whether ``smallc_direct`` (few input channels, first in the automatic choice for them) serves
    the case: one group, at most MAX_C channels and max_taps multiply-adds per output."""
    import math

    from cuconv.backends.smallc.variants import MAX_C, max_taps
    limit = max_taps(case.dtype, precision)
    return case.groups == 1 and case.channels <= MAX_C and case.channels * math.prod(case.filt) <= limit


def narrowk_takes(case: Case) -> bool:
    """Whether ``narrowk_direct`` (few output channels, float32 only, first in the automatic choice for
    them) serves the case: its own rule, ``nk_declined``, on the case's problem."""
    from cuconv.backends.narrowk.variants import nk_declined
    return case.dtype == "float32" and nk_declined(case_problem(case)) is None


def case_problem(case: Case) -> ConvProblem:
    """The channels-last :class:`~cuconv.problem.ConvProblem` of a case (its layout aside)."""
    return ConvProblem.create(nd=case.nd, batch=case.batch, in_spatial=case.spatial, channels=case.channels,
                              out_channels=case.out_channels, filter_spatial=case.filt, stride=case.stride,
                              dilation=case.dilation, padding=case.padding, groups=case.groups, dtype=case.dtype,
                              layout="NHWC" if case.nd == 2 else "NDHWC")


def with_residual(case: Case) -> Case:
    """``case`` with a residual read (beta kept when it is non-zero, else 1): for the in-place tests."""
    case.epilogue = dict(case.epilogue, residual=True, beta=case.epilogue.get("beta", 1.0) or 1.0)
    return case


def explain_detail(cp, case: Case, kernel: str) -> str:
    """What ``cuconv.explain`` says of ``kernel`` for the case (tile, loader, grid, split), asked with
    channels-last zero arrays of the case's shapes and its epilogue (a bias and a residual when the case
    has them, its beta), so the variant named is the one the case runs."""
    import cuconv
    ep = case.epilogue
    x = cp.zeros((case.batch, *case.spatial, case.channels), dtype=cp.float16)
    w = cp.zeros((case.out_channels, *case.filt, case.channels), dtype=cp.float16)
    bias = cp.zeros((case.out_channels,), dtype=cp.float16) if ep.get("bias") else None
    residual = None
    if ep.get("residual"):
        p = ConvProblem.create(nd=case.nd, batch=case.batch, in_spatial=case.spatial, channels=case.channels,
                               out_channels=case.out_channels, filter_spatial=case.filt, stride=case.stride,
                               dilation=case.dilation, padding=case.padding, groups=1, dtype="float16",
                               layout="NHWC" if case.nd == 2 else "NDHWC")
        residual = cp.zeros((case.batch, *p.out_spatial, case.out_channels), dtype=cp.float16)
    return cuconv.explain(x, w, bias, stride=case.stride, padding=case.padding, dilation=case.dilation,
                          residual=residual, beta=ep.get("beta", 1.0), kernel=kernel).detail


def _pair(v, nd: int):
    return (v,) * nd if isinstance(v, int) else tuple(v)


def problem2d(N=2, H=9, W=11, C=16, K=16, R=3, S=3, stride=1, dilation=1, padding=1, groups=1, dtype="bfloat16",
              epilogue=Epilogue()) -> ConvProblem:
    """An NHWC conv2d problem (defaults: 2 x 9 x 11 x 16 -> 16, 3x3, padding 1, bf16)."""
    return ConvProblem.create(nd=2, batch=N, in_spatial=(H, W), channels=C, out_channels=K, filter_spatial=(R, S),
                              stride=stride, dilation=dilation, padding=padding, groups=groups, dtype=dtype,
                              layout="NHWC", epilogue=epilogue)


def problem3d(N=1, D=6, H=9, W=11, C=16, K=16, T=3, R=3, S=3, stride=1, dilation=1, padding=1, groups=1,
              dtype="bfloat16", epilogue=Epilogue()) -> ConvProblem:
    """An NDHWC conv3d problem (defaults: 1 x 6 x 9 x 11 x 16 -> 16, 3x3x3, padding 1, bf16)."""
    return ConvProblem.create(nd=3, batch=N, in_spatial=(D, H, W), channels=C, out_channels=K,
                              filter_spatial=(T, R, S), stride=stride, dilation=dilation, padding=padding,
                              groups=groups, dtype=dtype, layout="NDHWC", epilogue=epilogue)


def case2d(N=2, H=9, W=9, C=16, K=16, R=3, S=3, stride=1, dilation=1, padding=1, dtype="bfloat16", ep=None,
           seed=0) -> Case:
    """An NHWC conv2d :class:`Case` (``ep``: the epilogue keywords of :func:`check_case`)."""
    return Case(nd=2, batch=N, spatial=(H, W), channels=C, out_channels=K, filt=(R, S), stride=_pair(stride, 2),
                dilation=_pair(dilation, 2), padding=padding, groups=1, dtype=dtype, layout="NHWC",
                epilogue=ep or {}, seed=seed)


def case3d(N=1, D=6, H=9, W=9, C=16, K=16, T=3, R=3, S=3, stride=1, dilation=1, padding=1, dtype="bfloat16",
           ep=None) -> Case:
    """An NDHWC conv3d :class:`Case`."""
    return Case(nd=3, batch=N, spatial=(D, H, W), channels=C, out_channels=K, filt=(T, R, S),
                stride=_pair(stride, 3), dilation=_pair(dilation, 3), padding=padding, groups=1, dtype=dtype,
                layout="NDHWC", epilogue=ep or {})


def coverage_cases(nd=2, **kw):
    """Drawn convolutions inside the Hopper kernels' coverage: fp16/bf16, groups 1, C and K multiples of 8
    (conv2d: up to 14 pixels a side and 80 channels; conv3d: 12 and 72)."""
    kw.setdefault("max_spatial", 14 if nd == 2 else 12)
    kw.setdefault("max_channels", 80 if nd == 2 else 72)
    layouts = ("NHWC", "NCHW") if nd == 2 else ("NDHWC", "NCDHW")
    return cases(nd=nd, dtypes=("bfloat16", "float16"), layouts=layouts, groups=False, channel_multiple=8, **kw)


@dataclass(frozen=True)
class Setting:
    """One forced tile setting of a property test.

    ``overrides``: the :func:`cuconv.overrides` keywords, or a function of the drawn case giving them;
    ``expect``: what ``explain`` must name under them (a string or a function of the case; empty for
    nothing); ``in_place``: the residual is drawn and the output written over it (else the output
    is NaN-poisoned).
    """

    id: str
    cases: object
    overrides: Union[dict, Callable[[Case], dict]] = field(default_factory=dict)
    expect: Union[str, Callable[[Case], str]] = ""
    max_examples: int = 30
    in_place: bool = False


def run_property(cp, kernel: str, setting: Setting):
    """Draw ``setting.max_examples`` cases and check each against the reference under the setting's
    overrides, forced onto ``kernel``."""
    import cuconv

    @settings(max_examples=setting.max_examples)
    @given(case=setting.cases)
    def prop(case):
        if setting.in_place:
            case = with_residual(case)
        kw = setting.overrides(case) if callable(setting.overrides) else setting.overrides
        with cuconv.overrides(**kw):
            want = setting.expect(case) if callable(setting.expect) else setting.expect
            if want:
                detail = explain_detail(cp, case, kernel)
                assert want in detail, detail
            check_case(case, xp=cp, kernel=kernel, poison=not setting.in_place, in_place=setting.in_place)

    prop()


@st.composite
def depthwise_cases(draw, nd=2, dtypes=("float16", "bfloat16", "float32"), layouts=None, max_spatial=20,
                    max_channels=40, multipliers=(1, 1, 1, 2, 3), max_filter=7, epilogue=True, min_filter=1,
                    unit_w_step=False, max_w_span=None, channel_step=1, max_stride=3):
    """A depthwise convolution (groups == C, K = multiplier * C): any C up to ``max_channels`` (odd ones
    included; multiples of ``channel_step``), filters of ``min_filter`` to ``max_filter`` along H and W,
    strides 1-``max_stride``, dilations 1-2 (both 1 along W with ``unit_w_step``; W stride
    1 and a filter spanning at most ``max_w_span`` input columns with ``max_w_span``), asymmetric padding."""
    if layouts is None:
        layouts = ("NHWC", "NCHW") if nd == 2 else ("NDHWC", "NCDHW")
    c = draw(st.integers(1, max_channels // channel_step)) * channel_step
    mult = draw(st.sampled_from(multipliers))
    spatial = tuple(draw(st.integers(1, max_spatial if nd == 2 else max(4, max_spatial // 2))) for _ in range(nd))
    filt = tuple(draw(st.integers(min_filter, max_filter) if d >= nd - 2 else st.integers(1, 3)) for d in range(nd))
    w_stride1 = unit_w_step or max_w_span is not None
    stride = tuple(draw(st.integers(1, 1 if w_stride1 and d == nd - 1 else max_stride)) for d in range(nd))
    dilation = tuple(draw(st.integers(1, 1 if unit_w_step and d == nd - 1 else 2)) for d in range(nd))
    if max_w_span is not None:
        assume((filt[-1] - 1) * dilation[-1] + 1 <= max_w_span)
    padding = tuple((draw(st.integers(0, 3)), draw(st.integers(0, 3))) for _ in range(nd))
    for n, f, s, d, (lo, hi) in zip(spatial, filt, stride, dilation, padding):
        assume(output_size(n, f, s, d, lo, hi) >= 1)
    ep = draw_epilogue(draw) if epilogue else {}
    return Case(nd=nd, batch=draw(st.integers(1, 3)), spatial=spatial, channels=c, out_channels=mult * c,
                filt=filt, stride=stride, dilation=dilation, padding=padding, groups=c,
                dtype=draw(st.sampled_from(dtypes)), layout=draw(st.sampled_from(layouts)), epilogue=ep,
                seed=draw(st.integers(0, 2**31 - 1)))


def check_depthwise_layer(cp, kernel: str, c, hw, filt, stride, mult, dtype, layout="NHWC", forced=False):
    """A depthwise network layer (N = 4, padding filt // 2, bias, gelu) on ``layout`` arrays, chosen
    automatically for ``kernel`` (``forced``: asked for it by name) and checked against the reference."""
    import numpy as np

    import cuconv
    from conftest import assert_close, random_array
    rng = np.random.default_rng(c + hw)
    x = random_array(rng, (4, hw, hw, c), dtype)
    w = random_array(rng, (mult * c, filt, filt, 1), dtype, scale=1.0 / filt)
    b = random_array(rng, (mult * c,), dtype)
    kw = dict(stride=stride, padding=filt // 2, groups=c, activation="gelu")
    ref = cuconv.reference.conv2d(x, w, b, **kw)
    if layout == "NCHW":  # the same convolution on channels-first arrays
        x, w, ref = (np.ascontiguousarray(a.transpose(0, 3, 1, 2)) for a in (x, w, ref))
        kw["layout"] = "NCHW"
    if forced:
        kw["kernel"] = kernel
    e = cuconv.explain(cp.asarray(x), cp.asarray(w), cp.asarray(b), **kw)
    assert e.kernel == kernel, str(e)
    assert_close(cuconv.conv2d(cp.asarray(x), cp.asarray(w), cp.asarray(b), **kw), ref, dtype)


def check_depthwise_same_bits_and_in_place(cp, kernel: str, filt: int, seed: int):
    """A depthwise layer (N = 4, 28 x 28 x 192, bf16, silu, alpha 0.5, beta 2 with a residual) forced onto
    ``kernel``: two runs give the same bits, and a residual written over in place gives the reference."""
    import numpy as np

    import cuconv
    from conftest import assert_close, random_array
    rng = np.random.default_rng(seed)
    x = random_array(rng, (4, 28, 28, 192), "bfloat16")
    w = random_array(rng, (192, filt, filt, 1), "bfloat16", scale=1 / filt)
    r = random_array(rng, (4, 28, 28, 192), "bfloat16")
    kw = dict(padding=filt // 2, groups=192, activation="silu", alpha=0.5, beta=2.0)
    ref = cuconv.reference.conv2d(x, w, residual=r, **kw)
    xg, wg = cp.asarray(x), cp.asarray(w)
    a = cuconv.conv2d(xg, wg, residual=cp.asarray(r), kernel=kernel, **kw)
    b = cuconv.conv2d(xg, wg, residual=cp.asarray(r), kernel=kernel, **kw)
    assert bool((a.view(cp.uint16) == b.view(cp.uint16)).all())
    assert_close(a, ref, "bfloat16")
    rg = cp.asarray(r)
    got = cuconv.conv2d(xg, wg, residual=rg, out=rg, kernel=kernel, **kw)
    assert got is rg
    assert_close(got, ref, "bfloat16")


def check_depthwise_misaligned_views(cp, kernel: str):
    """x, residual and out as views 2 bytes off their allocations, forced onto ``kernel``: the result
    lands in ``out`` and matches the reference (the kernel's vector accesses go through aligned copies)."""
    import numpy as np

    import cuconv
    from conftest import assert_close, random_array
    rng = np.random.default_rng(3)
    c = 24
    xs = random_array(rng, (2 * 10 * 10 * c + 1,), "bfloat16")
    w = random_array(rng, (c, 3, 3, 1), "bfloat16")
    rs = random_array(rng, (2 * 10 * 10 * c + 1,), "bfloat16")
    ref = cuconv.reference.conv2d(xs[1:].reshape(2, 10, 10, c), w, residual=rs[1:].reshape(2, 10, 10, c),
                                  padding=1, groups=c)
    xg = cp.asarray(xs)[1:].reshape(2, 10, 10, c)
    rg = cp.asarray(rs)[1:].reshape(2, 10, 10, c)
    out = cp.full(2 * 10 * 10 * c + 1, np.nan, dtype=xg.dtype)[1:].reshape(2, 10, 10, c)
    got = cuconv.conv2d(xg, cp.asarray(w), residual=rg, out=out, padding=1, groups=c, kernel=kernel)
    assert got is out
    assert_close(got, ref, "bfloat16")
