"""``sm90_patch``: non-overlapping patches along W, x and w read as width-folded through a view.

On the CPU: the viewed convolution equals the original on drawn geometry (NumPy reference on both sides),
the kernel declines what the view cannot read and says why, and the automatic choice takes patch
embeddings. On a Hopper GPU: drawn patch convolutions, with every epilogue term and in NCHW too, equal the
reference; a ViT-B/16 patch embedding runs on it automatically.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import cuconv
from cuconv import dispatch
from cuconv.backends.sm90.kernel import Sm90TmaKernel
from cuconv.backends.sm90.patch import Sm90PatchKernel, patch_decline, patch_problem
from cuconv.overrides import Overrides
from cuconv.problem import ConvProblem, Epilogue

from conftest import assert_close, needs_hopper, random_array
from geometry import A100, H100

KERNEL = "sm90_patch"


@st.composite
def patches(draw):
    """A convolution whose filter columns tile W exactly (stride S along W, no padding), S x C a multiple of 8
    with C not one; along H anything, half of the time rows that tile H exactly too."""
    c = draw(st.sampled_from([1, 2, 3, 4, 5, 6, 12]))
    s = draw(st.sampled_from([s for s in range(2, 17) if (s * c) % 8 == 0]))
    r = draw(st.integers(1, 4))
    if draw(st.booleans()):  # rows that do not overlap either: a patch embedding
        sh, dh, ph, h = r, 1, (0, 0), r * draw(st.integers(1, 5))
    else:
        sh, dh = draw(st.integers(1, 3)), draw(st.integers(1, 2))
        ph = (draw(st.integers(0, 2)), draw(st.integers(0, 2)))
        h = draw(st.integers(max(1, (r - 1) * dh + 1 - sum(ph)), (r - 1) * dh + 8))
    return dict(n=draw(st.integers(1, 2)), h=h, w=s * draw(st.integers(1, 6)), c=c, k=8 * draw(st.integers(1, 6)),
                r=r, s=s, stride=(sh, s), dilation=(dh, 1), padding=(ph, (0, 0)), seed=draw(st.integers(0, 2**31 - 1)))


def _problem(case, dtype="bfloat16", layout="NHWC", epilogue=Epilogue()):
    return ConvProblem.create(nd=2, batch=case["n"], in_spatial=(case["h"], case["w"]), channels=case["c"],
                              out_channels=case["k"], filter_spatial=(case["r"], case["s"]), stride=case["stride"],
                              dilation=case["dilation"], padding=case["padding"], groups=1, dtype=dtype,
                              layout=layout, epilogue=epilogue)


@settings(max_examples=150, deadline=None)
@given(case=patches())
def test_the_viewed_convolution_is_the_original(case):
    """x (N, H, W, C) viewed as (N, H, W / S, S C) (and, where the rows tile H, as (N P, R, W / S, S C)) and
    w (K, R, S, C) as (K, R, 1, S C), under the viewed problem's geometry, give the original convolution in
    the original output's memory order."""
    rng = np.random.default_rng(case["seed"])
    p = _problem(case, dtype="float64")
    assert patch_decline(p) is None
    x = rng.standard_normal(p.x_shape)
    w = rng.standard_normal(p.w_shape)
    want = cuconv.reference.conv2d(x, w, stride=case["stride"], dilation=case["dilation"], padding=case["padding"])
    ip = patch_problem(p)
    got = cuconv.reference.conv2d(x.reshape(ip.x_shape), w.reshape(ip.w_shape), stride=ip.stride,
                                  dilation=ip.dilation, padding=tuple(zip(ip.pad_lo, ip.pad_hi)))
    rows = (case["stride"][0] == case["r"] > 1 and case["dilation"][0] == 1 and case["padding"][0] == (0, 0)
            and case["h"] % case["r"] == 0)
    assert ip.in_spatial[0] == (case["r"] if rows else case["h"])
    assert ip.batch * ip.out_spatial[0] == p.batch * p.out_spatial[0]
    np.testing.assert_allclose(got.reshape(p.out_shape), want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kw, why", [
    (dict(C=3, K=768, R=16, S=16, stride=8, padding=0), "overlapping"),
    (dict(C=3, K=64, R=16, S=16, stride=16, padding=1), "overlapping"),
    (dict(C=3, K=64, R=4, S=4, stride=4, padding=0), "multiple of 8"),      # a ConvNeXt / Swin stem: 12 channels
    (dict(C=8, K=64, R=2, S=2, stride=2, padding=0), "sm90_tma reads"),
    (dict(C=3, K=64, R=3, S=1, stride=1, padding=0), "one-column"),
    (dict(H=224, W=225, C=4, K=64, R=2, S=2, stride=2, padding=0), "whole patches"),
])
def test_declines_name_the_reason(kw, why):
    from geometry import problem2d
    kw = dict(dict(N=1, H=224, W=224), **kw)
    assert why in Sm90PatchKernel(Sm90TmaKernel()).plan(problem2d(**kw), H100, Overrides()).reason


@pytest.mark.parametrize("c, s, k", [(3, 16, 768), (3, 8, 384), (3, 32, 1024), (1, 16, 512)])
def test_automatic_choice_takes_patch_embeddings(c, s, k):
    """ViT-style patch embeddings (stride = filter, more than 256 terms per filter slice) go to the view on
    Hopper, with every epilogue term, as images of one patch row each; on Ampere the kernel declines."""
    from geometry import problem2d
    for ep in (Epilogue(), Epilogue(has_bias=True, has_residual=True, activation="gelu")):
        p = problem2d(N=8, H=224, W=224, C=c, K=k, R=s, S=s, stride=s, padding=0, epilogue=ep)
        plan, why = dispatch.select(p, H100)
        assert why.kernel == KERNEL, str(why)
        ip = plan.inner.problem
        assert (ip.channels, ip.filter_spatial, ip.stride, ip.batch, ip.in_spatial) == \
            (s * c, (s, 1), (1, 1), 8 * (224 // s), (s, 224 // s))
        assert plan.compile_jobs() == plan.inner.compile_jobs()
    _, why = dispatch.select(problem2d(N=8, H=224, W=224, C=3, K=768, R=16, S=16, stride=16, padding=0), A100)
    assert why.kernel != KERNEL and "Hopper" in why.declined[KERNEL]


def test_small_patches_stay_on_the_few_channel_kernels():
    """A DiT latent patchify (4 channels, 2x2 stride 2: 16 terms) fills an eighth of a 64-channel block as a
    view; the few-channel kernels, asked first, take it."""
    from geometry import problem2d
    _, why = dispatch.select(problem2d(N=8, H=32, W=32, C=4, K=1152, R=2, S=2, stride=2, padding=0), H100)
    assert why.kernel.startswith("smallc") and KERNEL in why.skipped, str(why)


# ------------------------------------------------------------------------------------------ GPU
gpu = pytest.mark.gpu


@gpu
@needs_hopper
@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
def test_patch_calls_match_the_reference(cp, layout):
    """Drawn patch convolutions forced onto the view, bf16 / fp16, with bias, residual, activation, alpha and
    beta, equal the float64 reference; the caller's operands are not modified."""
    @settings(max_examples=40, deadline=None)
    @given(case=patches(), dtype=st.sampled_from(["bfloat16", "float16"]), bias=st.booleans(), res=st.booleans(),
           act=st.sampled_from([None, "relu", "gelu"]), alpha=st.sampled_from([1.0, 0.5]))
    def prop(case, dtype, bias, res, act, alpha):
        rng = np.random.default_rng(case["seed"])
        p = _problem(case, dtype)
        x = random_array(rng, p.x_shape, dtype)
        w = random_array(rng, p.w_shape, dtype, 1 / np.sqrt(case["r"] * case["s"] * case["c"]))
        b = random_array(rng, (case["k"],), dtype) if bias else None
        kw = dict(stride=case["stride"], dilation=case["dilation"], padding=case["padding"], activation=act,
                  alpha=alpha, beta=-0.5)
        r = random_array(rng, p.out_shape, dtype) if res else None
        want = cuconv.reference.conv2d(x, w, b, residual=r, **kw)
        if layout == "NCHW":
            x, w, r = np.moveaxis(x, -1, 1).copy(), np.moveaxis(w, -1, 1).copy(), \
                None if r is None else np.moveaxis(r, -1, 1).copy()
            want = np.moveaxis(want, -1, 1)
        args = [None if a is None else cp.asarray(a) for a in (x, w, b, r)]
        assert cuconv.explain(*args[:3], residual=args[3], layout=layout, kernel=KERNEL, **kw).kernel == KERNEL
        got = cuconv.conv2d(*args[:3], residual=args[3], layout=layout, kernel=KERNEL, **kw)
        assert_close(got.get(), want, dtype, str(case))
        np.testing.assert_array_equal(args[0].get(), x)

    prop()


@gpu
@needs_hopper
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_vit_patch_embedding_runs_on_the_view(cp, dtype):
    """A ViT-B/16 patch embedding (3 -> 768, 16x16 stride 16 at 224 x 224) with its bias, chosen
    automatically, equals the reference on the first images; two calls give the same bits."""
    rng = np.random.default_rng(16)
    x = cp.asarray(random_array(rng, (8, 224, 224, 3), dtype))
    w = cp.asarray(random_array(rng, (768, 16, 16, 3), dtype, 1 / np.sqrt(768)))
    b = cp.asarray(random_array(rng, (768,), dtype))
    assert cuconv.explain(x, w, b, stride=16).kernel == KERNEL
    y = cuconv.conv2d(x, w, b, stride=16)
    want = cuconv.reference.conv2d(cp.asnumpy(x[:2]), cp.asnumpy(w), cp.asnumpy(b), stride=16)
    assert_close(cp.asnumpy(y[:2]), want, dtype)
    assert bool((cuconv.conv2d(x, w, b, stride=16).view(cp.uint16) == y.view(cp.uint16)).all())


def test_run_passes_views_and_keeps_an_in_place_residual_in_place():
    """``PatchPlan.run`` hands the inner plan views of x, w, the residual and out in the viewed problem's
    shapes; a residual that is ``out`` stays the same array as the inner plan's out."""
    from geometry import problem2d
    plan, _ = dispatch.select(problem2d(N=2, H=32, W=32, C=3, K=64, R=16, S=16, stride=16, padding=0,
                                        epilogue=Epilogue(has_residual=True)), H100)
    seen = []
    plan.inner.run = lambda *args: seen.append(args)

    class View:
        def __init__(self, shape):
            self.shape, self.flags = shape, type("F", (), {"c_contiguous": True})()

        def reshape(self, shape):
            return View(shape)
    x, w, out = View(plan.problem.x_shape), View(plan.problem.w_shape), View(plan.problem.out_shape)
    plan.run(x, w, None, out, out)
    xv, wv, _, rv, ov = seen[-1]
    ip = plan.inner.problem
    assert (xv.shape, wv.shape, ov.shape) == (ip.x_shape, ip.w_shape, ip.out_shape) and rv is ov
    plan.run(x, w, None, View(plan.problem.out_shape), out)
    assert seen[-1][3] is not seen[-1][4] and seen[-1][3].shape == ip.out_shape
