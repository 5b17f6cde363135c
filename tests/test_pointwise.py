"""The pointwise kernel (``pointwise_mma``): its policy and dispatch on the CPU, its results on the GPU.

CPU: :func:`pw_config` keeps its invariants (whole k16 steps, whole n16 pairs per warp, tiles covering
M and K), the kernel declines what it cannot take and says why, the automatic choice takes mobile
networks' expansions and projections and outputs off the multiples of 8 on sm_80+, with any epilogue,
and leaves the rest (:meth:`passes_over`); every
catalog variant compiles without spills (tests/test_compile.py compiles them too).
GPU (gpu-marked): drawn pointwise convolutions (C 8-256, K 8-384: chunks of K included, any K with
single-channel stores, partial tiles, fp16 / bf16, conv2d and conv3d, the whole epilogue) run forced onto the kernel with a
NaN-poisoned output, or written in place over the residual; mobile-network layers at full size,
chosen automatically; operands off the 16-byte grid; two runs give the same bits.
"""

import dataclasses

import numpy as np
import pytest
from hypothesis import strategies as st

import cuconv
from cuconv import dispatch
from cuconv.backends.pointwise.kernel import PointwiseKernel
from cuconv.backends.pointwise.variants import (CATALOG, MAX_C, PW_FIELDS, PW_SOURCE, pw_config, pw_geometry,
                                                pw_variant)
from cuconv.overrides import Overrides

from conftest import DeviceBuf, assert_close, assert_compiles_without_spills, cupy_for_sm80, nvrtc_available, random_array
from geometry import A100, H100, Case, Setting, draw_epilogue, problem2d, problem3d, run_property

KERNEL = "pointwise_mma"


# ------------------------------------------------------------------------------------------ CPU
@pytest.mark.parametrize("key", sorted(CATALOG))
def test_config_invariants(key):
    p = CATALOG[key]
    cfg = pw_config(p)
    assert cfg.kc % 16 == 0 and p.channels <= cfg.kc < p.channels + 16
    assert p.channels % cfg.xvec == 0 and cfg.xvec in (8, 4, 2) and (cfg.xvec == 8 or p.channels % (2 * cfg.xvec))
    assert cfg.wn in (1, 2) and cfg.nw % 16 == 0 and cfg.nw <= 128, "whole n16 pairs, at most 128 per warp"
    assert cfg.chunks * cfg.nt >= p.out_channels and (cfg.chunks - 1) * cfg.nt < p.out_channels
    assert cfg.m_tiles * cfg.bm >= p.gemm_m > (cfg.m_tiles - 1) * cfg.bm
    assert cfg.smem <= H100.smem_per_block_optin
    geo = pw_geometry(p, cfg)
    assert len(geo.dtype.names) == len(PW_FIELDS) and int(geo["tiles"]) == cfg.m_tiles * cfg.chunks


def test_wide_outputs_run_in_chunks_and_long_reductions_in_short_tiles():
    wide = pw_config(problem2d(C=64, K=1024, R=1, S=1, padding=0))
    assert (wide.nt, wide.chunks, wide.wn) == (128, 8, 1)
    long = pw_config(problem2d(C=256, K=64, R=1, S=1, padding=0))
    assert (long.wn, long.bm, long.nt) == (2, 64, 64)
    assert pw_config(problem2d(C=24, K=144, R=1, S=1, padding=0)).nt == 160  # two warps along 144 channels


def test_declines_name_the_reason():
    k = PointwiseKernel()

    def why(**kw):
        return k.plan(problem2d(**kw), H100, Overrides()).reason
    assert "not a pointwise layer" in why(C=16, K=96)  # 3x3
    assert "not a pointwise layer" in why(C=16, K=96, R=1, S=1, padding=0, stride=2)
    assert "not a pointwise layer" in why(C=16, K=96, R=1, S=1, padding=1)
    assert "grouped" in why(C=32, K=96, R=1, S=1, padding=0, groups=2)
    assert "C must be even" in why(C=21, K=96, R=1, S=1, padding=0)
    assert "copies of 2 channels" in why(C=58, K=58, R=1, S=1, padding=0)  # C off the 16-byte grid: taken
    assert f"at most {MAX_C}" in why(C=MAX_C + 8, K=32, R=1, S=1, padding=0)
    assert "computes float16, bfloat16" in why(C=24, K=144, R=1, S=1, padding=0, dtype="float32")
    nchw = dataclasses.replace(problem2d(C=24, K=144, R=1, S=1, padding=0), layout="NCHW")
    assert "channels-last" in k.plan(nchw, H100, Overrides()).reason
    small = dataclasses.replace(H100, smem_per_block_optin=48 * 1024)
    assert "shared memory per CTA" in k.plan(problem2d(C=256, K=64, R=1, S=1, padding=0), small, Overrides()).reason


@pytest.mark.parametrize("c, hw, k", [
    (16, 112, 96),    # MobileNetV2 / EfficientNet-B0 features.2 expansion
    (24, 56, 144),    # features.3-4 expansion
    (32, 28, 192),    # features.5-7 expansion
    (40, 28, 240),    # EfficientNet-B0 stage 4 expansion
    (144, 56, 24),    # MobileNetV2 features.3 projection
    (192, 28, 32),    # features.6-7 projection
])
def test_automatic_choice_takes_mobile_pointwise_layers(c, hw, k):
    for dev in (H100, A100):
        for dtype in ("bfloat16", "float16"):
            _, why = dispatch.select(problem2d(N=32, H=hw, W=hw, C=c, K=k, R=1, S=1, padding=0, dtype=dtype), dev)
            assert why.kernel == KERNEL, str(why)


def test_automatic_choice_takes_epilogue_terms_and_conv3d_off_the_16_byte_grid():
    from cuconv.problem import Epilogue
    for ep in (Epilogue(has_bias=True), Epilogue(has_residual=True), Epilogue(activation="relu"), Epilogue(alpha=0.5),
               Epilogue(has_bias=True, has_residual=True, activation="silu")):
        _, why = dispatch.select(problem2d(N=32, H=56, W=56, C=24, K=144, R=1, S=1, padding=0, epilogue=ep), H100)
        assert why.kernel == KERNEL, str(why)
    _, why = dispatch.select(problem3d(C=24, K=144, T=1, R=1, S=1, padding=0), H100)
    assert why.kernel == "conv3d_native" and "conv3d_native runs it" in why.declined[KERNEL], str(why)
    for p, dev in ((problem3d(C=24, K=144, T=1, R=1, S=1, padding=0), A100),
                   (problem3d(C=128, K=3, T=1, R=1, S=1, padding=0), H100)):
        _, why = dispatch.select(p, dev)
        assert why.kernel == KERNEL, str(why)


def test_automatic_choice_leaves_short_reductions_to_few_channels():
    """A map of 16 channels to 5 runs faster on sm80_igemm's pointwise loader; a detection head's 16 -> 1
    (YOLOv8 Detect.dfl) is pointwise_narrow's, above both."""
    _, why = dispatch.select(problem2d(N=16, H=8, W=840, C=16, K=5, R=1, S=1, padding=0), H100)
    assert why.kernel == "sm80_igemm" and "fewer than 8 channels" in why.declined[KERNEL], str(why)
    _, why = dispatch.select(problem2d(N=16, H=4, W=8400, C=16, K=1, R=1, S=1, padding=0), H100)
    assert why.kernel == "pointwise_narrow", str(why)
    _, why = dispatch.select(problem3d(C=16, K=5, T=1, R=1, S=1, padding=0), H100)  # sm80_igemm serves conv2d only
    assert why.kernel == KERNEL, str(why)


@pytest.mark.parametrize("c, hw, k", [
    (64, 128, 3),     # an RGB map (a mask logit, 32 -> 1, is pointwise_narrow's)
    (128, 80, 255),   # a YOLOv3/v5 head: 3 anchors x (80 classes + 5)
    (96, 1, 4),       # EfficientNet-B0 squeeze-excite reduction on a 1x1 image
    (256, 56, 100),   # a wide output off the 16-byte grid
])
def test_automatic_choice_takes_outputs_off_the_16_byte_grid(c, hw, k):
    """K not a multiple of 8: the Hopper kernels decline, and the epilogue stores single channels."""
    for dev in (H100, A100):
        plan, why = dispatch.select(problem2d(N=16, H=hw, W=hw, C=c, K=k, R=1, S=1, padding=0), dev)
        assert why.kernel == KERNEL, str(why)
        assert plan.cfg.vec == 1 and plan.defines["PW_OVEC"] == 1 and "_v1_" in plan.name
    plan, _ = dispatch.select(problem2d(N=16, H=8, W=8, C=c, K=8 * k, R=1, S=1, padding=0), H100, forced=KERNEL)
    assert plan.cfg.vec == 8 and "PW_OVEC" not in plan.defines


@pytest.mark.parametrize("c, hw, k", [
    (256, 56, 64),    # ResNet-50 layer1 reduction: a long reduction and a wide enough output
    (64, 56, 256),    # ResNet-50 layer1 expansion
    (512, 28, 128),   # over MAX_C
])
def test_automatic_choice_leaves_dense_pointwise_layers_on_hopper(c, hw, k):
    plan, why = dispatch.select(problem2d(N=32, H=hw, W=hw, C=c, K=k, R=1, S=1, padding=0), H100)
    assert why.kernel == "sm90_tma", str(why)
    if c <= MAX_C:
        assert KERNEL in why.skipped or KERNEL in why.declined, str(why)


@pytest.mark.skipif(not nvrtc_available(), reason="needs NVRTC (cuda-bindings)")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("key", sorted(CATALOG))
def test_compiles_without_spills(key, arch):
    p = CATALOG[key]
    assert_compiles_without_spills(PW_SOURCE, arch, *pw_variant(p, pw_config(p)), no_stack=True)


def test_run_passes_outputs_off_the_16_byte_grid_as_they_are():
    """Single-channel epilogue accesses (K not a multiple of 8): out, bias and the residual need only their
    element's alignment; x (16-byte copies of its rows) still goes through an aligned copy."""
    from cuconv.problem import Epilogue
    p = problem2d(N=4, H=8, W=8, C=16, K=3, R=1, S=1, padding=0, epilogue=Epilogue(has_bias=True, has_residual=True))
    plan = PointwiseKernel().plan(p, H100, Overrides())
    sent = []
    plan._launch = lambda *ptrs: sent.append(ptrs)
    odd = [DeviceBuf(DeviceBuf().data.ptr + 2) for _ in range(5)]
    plan.run(*odd)
    assert sent[-1][0] % 16 == 0 and sent[-1][0] != odd[0].data.ptr
    assert sent[-1][2:] == (odd[2].data.ptr, odd[3].data.ptr, odd[4].data.ptr)
    assert odd[4].assigned is None, "out is written in place"


def test_run_passes_aligned_addresses():
    """``PointwisePlan.run`` hands the launch x, w, bias, the residual and out on the 16-byte grid of its
    vectors (aligned copies of operands off it, the result copied back into ``out``); the output's address
    stands for absent operands."""
    from cuconv.problem import Epilogue
    p = problem2d(N=4, H=8, W=8, C=24, K=144, R=1, S=1, padding=0,
                  epilogue=Epilogue(has_bias=True, has_residual=True))
    plan = PointwiseKernel().plan(p, H100, Overrides())
    sent = []
    plan._launch = lambda *ptrs: sent.append(ptrs)
    x, w, out = DeviceBuf(), DeviceBuf(), DeviceBuf()
    plan.run(x, w, None, None, out)
    assert sent[-1] == (x.data.ptr, w.data.ptr, out.data.ptr, out.data.ptr, out.data.ptr)
    odd = [DeviceBuf(DeviceBuf().data.ptr + 4) for _ in range(5)]
    plan.run(*odd)
    assert all(ptr % 16 == 0 for ptr in sent[-1]) and sent[-1][0] != odd[0].data.ptr
    assert odd[4].assigned is not None, "the aligned result is copied into out"


# ------------------------------------------------------------------------------------------ GPU
@st.composite
def pointwise_cases(draw, nd=2, max_spatial=20, max_k=48, epilogue=True, any_k=False, any_c=False):
    """A dense 16-bit pointwise convolution the kernel takes: C 8-256 and K 8-8*max_k in steps of 8 (K
    over 256: chunks), or with ``any_k`` any K up to 8*max_k (single-channel stores off the multiples of
    8), with ``any_c`` any even C (copies of 4 or 2 channels off the multiples of 8), any number of
    pixels (partial tiles), conv2d or conv3d."""
    spatial = tuple(draw(st.integers(1, max_spatial if nd == 2 else 6)) for _ in range(nd))
    ep = draw_epilogue(draw) if epilogue else {}
    channels = 2 * draw(st.integers(1, MAX_C // 2)) if any_c else 8 * draw(st.integers(1, MAX_C // 8))
    return Case(nd=nd, batch=draw(st.integers(1, 3)), spatial=spatial, channels=channels,
                out_channels=draw(st.integers(1, 8 * max_k)) if any_k else 8 * draw(st.integers(1, max_k)),
                filt=(1,) * nd, stride=(1,) * nd, dilation=(1,) * nd,
                padding=0, groups=1, dtype=draw(st.sampled_from(("bfloat16", "float16"))),
                layout="NHWC" if nd == 2 else "NDHWC", epilogue=ep, seed=draw(st.integers(0, 2**31 - 1)))


@pytest.fixture(scope="module")
def cp():
    return cupy_for_sm80(KERNEL)


SETTINGS = [
    Setting("2d", pointwise_cases(), max_examples=60),
    Setting("2d_large", pointwise_cases(max_spatial=70, epilogue=False), max_examples=15),
    Setting("3d", pointwise_cases(nd=3), max_examples=20),
    Setting("2d_in_place", pointwise_cases(), in_place=True, max_examples=20),
    Setting("2d_any_k", pointwise_cases(any_k=True, max_k=40), max_examples=40),
    Setting("3d_any_k_in_place", pointwise_cases(nd=3, any_k=True, max_k=8), in_place=True, max_examples=15),
    Setting("2d_any_c", pointwise_cases(any_c=True, any_k=True, max_k=40), max_examples=40),
    Setting("3d_any_c_in_place", pointwise_cases(nd=3, any_c=True, max_k=8), in_place=True, max_examples=15),
]


@pytest.mark.gpu
@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: s.id)
def test_drawn(cp, setting):
    run_property(cp, KERNEL, setting)


@pytest.mark.gpu
@pytest.mark.parametrize("n, hw, c, k", [
    (32, 56, 24, 144),   # MobileNetV2 expansion
    (32, 56, 144, 24),   # MobileNetV2 projection (with its residual add)
    (16, 112, 16, 96),   # EfficientNet-B0 expansion
    (32, 56, 58, 58),    # ShuffleNetV2's 1x1 of 58 channels (copies of 2 channels, single-channel stores)
    (32, 28, 116, 116),  # and of 116 (copies of 4)
])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_network_layers(cp, n, hw, c, k, dtype):
    """Full-size layers, chosen automatically with and without bias, a residual and an activation, within
    the tolerance of the reference; two calls give the same bits."""
    rng = np.random.default_rng(c * k + hw)
    x = cp.asarray(random_array(rng, (n, hw, hw, c), dtype))
    w = cp.asarray(random_array(rng, (k, 1, 1, c), dtype, scale=1.0 / np.sqrt(c)))
    b = cp.asarray(random_array(rng, (k,), dtype))
    r = cp.asarray(random_array(rng, (n, hw, hw, k), dtype))
    assert cuconv.explain(x, w).kernel == KERNEL
    kw = dict(residual=r, activation="silu")
    assert cuconv.explain(x, w, b, **kw).kernel == KERNEL
    y = cuconv.conv2d(x, w, b, **kw)
    ref = cuconv.reference.conv2d(cp.asnumpy(x[:4]), cp.asnumpy(w), cp.asnumpy(b), residual=cp.asnumpy(r[:4]),
                                  activation="silu")
    assert_close(cp.asnumpy(y[:4]), ref, dtype)
    y2 = cuconv.conv2d(x, w, b, **kw)
    assert bool((y.view(cp.uint16) == y2.view(cp.uint16)).all())


@pytest.mark.gpu
def test_operands_off_the_16_byte_grid(cp):
    """x, w, bias, the residual and out 2 bytes past a 16-byte boundary (views into larger buffers): the
    kernel reads and writes aligned copies, and the result is the reference's."""
    dtype = "bfloat16"
    rng = np.random.default_rng(7)
    arrays = [random_array(rng, (2, 9, 13, 40), dtype), random_array(rng, (72, 1, 1, 40), dtype, scale=0.15),
              random_array(rng, (72,), dtype), random_array(rng, (2, 9, 13, 72), dtype)]
    views = []
    for a in arrays:
        buf = cp.empty(a.size + 1, a.dtype)[1:].reshape(a.shape)
        buf[...] = cp.asarray(a)
        assert buf.data.ptr % 16
        views.append(buf)
    x, w, b, r = views
    out = cp.empty(r.size + 1, r.dtype)[1:].reshape(r.shape)
    assert cuconv.explain(x, w, b, residual=r, kernel=KERNEL).kernel == KERNEL
    got = cuconv.conv2d(x, w, b, residual=r, out=out, kernel=KERNEL)
    assert got is out
    assert_close(cp.asnumpy(out), cuconv.reference.conv2d(*arrays[:3], residual=arrays[3]), dtype)
