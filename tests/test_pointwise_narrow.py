"""The narrow pointwise kernel (``pointwise_narrow``): its policy and dispatch on the CPU, its results on
the GPU.

CPU: the kernel declines what it cannot take and says why; the automatic choice takes every 1x1 map
it accepts (a detection head's 16 -> 1) on sm_80+, with any epilogue; every catalog variant compiles
without spills (tests/test_compile.py compiles them too).
GPU (gpu-marked): drawn narrow pointwise convolutions (K 1-8, C x K <= 64, fp16 / bf16 / fp32, conv2d
and conv3d, any number of pixels, the whole epilogue) run forced onto the kernel with a NaN-poisoned
output, or written in place over the residual; YOLOv8's Detect.dfl map at full size, chosen
automatically, two runs giving the same bits; operands off the 16-byte grid.
"""

import numpy as np
import pytest
from hypothesis import strategies as st

import cuconv
from cuconv import dispatch
from cuconv.backends.pointwise.narrow_variants import CATALOG, MAX_WEIGHTS, pn_config, pn_declined, pn_variant

from conftest import assert_close, assert_compiles_without_spills, cupy_for_sm80, nvrtc_available, random_array
from geometry import A100, H100, Case, Setting, draw_epilogue, problem2d, problem3d, run_property

KERNEL = "pointwise_narrow"


# ------------------------------------------------------------------------------------------ CPU
def test_declines_name_the_reason():
    cases = [
        (problem2d(C=16, K=1, R=3, S=3), "not a pointwise layer"),
        (problem2d(C=16, K=1, R=1, S=1, padding=0, stride=2), "not a pointwise layer"),
        (problem2d(C=16, K=2, R=1, S=1, padding=0, groups=2), "grouped"),
        (problem2d(C=16, K=9, R=1, S=1, padding=0), "at most 8 output channels"),
        (problem2d(C=12, K=1, R=1, S=1, padding=0), "16-byte vectors of 8 channels"),
        (problem2d(C=72, K=1, R=1, S=1, padding=0), f"at most {MAX_WEIGHTS}"),
        (problem2d(C=32, K=4, R=1, S=1, padding=0), f"at most {MAX_WEIGHTS}"),
    ]
    for p, words in cases:
        why = pn_declined(p)
        assert why is not None and words in why, (p, why)
    assert pn_declined(problem2d(C=12, K=1, R=1, S=1, padding=0, dtype="float32")) is None  # 4-channel vectors
    assert pn_declined(problem3d(C=16, K=4, T=1, R=1, S=1, padding=0)) is None


def test_variant_names_dtype_and_channels():
    p = problem2d(N=16, H=4, W=8400, C=16, K=1, R=1, S=1, padding=0)
    cfg = pn_config(p)
    name, defines = pn_variant(p, cfg)
    assert name == "pointwise_narrow_bf16_c16_k1" and (defines["PN_C"], defines["PN_K"]) == (16, 1)
    assert cfg.vin == 8 and cfg.vec == 1 and cfg.smem == 0 and cfg.tiles(p) == -(-p.gemm_m // cfg.threads)


@pytest.mark.parametrize("dev", [H100, A100], ids=["h100", "a100"])
def test_automatic_choice_takes_every_layer_it_accepts(dev):
    """YOLOv8's Detect.dfl (16 -> 1 over 4 x 8400 anchors) and other maps to a few channels from up to 64
    (C x K <= 64), with the epilogue, conv2d and conv3d, every dtype; inputs of 8 channels or fewer are
    smallc_direct's."""
    from cuconv.problem import Epilogue
    ep = Epilogue(has_bias=True, has_residual=True, activation="relu")
    for p in (problem2d(N=16, H=4, W=8400, C=16, K=1, R=1, S=1, padding=0),
              problem2d(N=2, H=64, W=64, C=16, K=3, R=1, S=1, padding=0, epilogue=ep),
              problem2d(N=8, H=128, W=128, C=64, K=1, R=1, S=1, padding=0),
              problem2d(N=16, H=80, W=80, C=32, K=1, R=1, S=1, padding=0),  # a mask logit
              problem2d(N=8, H=128, W=128, C=24, K=2, R=1, S=1, padding=0, dtype="float16"),
              problem2d(N=2, H=64, W=64, C=16, K=4, R=1, S=1, padding=0, dtype="float32"),
              problem3d(C=16, K=2, T=1, R=1, S=1, padding=0, dtype="float16")):
        _, why = dispatch.select(p, dev)
        assert why.kernel == KERNEL, str(why)


def test_layers_over_its_registers_go_to_the_tensor_core_kernels():
    """16 -> 5: C x K over 64 filter values; pointwise_mma leaves it to sm80_igemm's pointwise loader."""
    _, why = dispatch.select(problem2d(N=8, H=32, W=32, C=16, K=5, R=1, S=1, padding=0), H100)
    assert why.kernel == "sm80_igemm" and "at most 64" in why.declined[KERNEL], str(why)


@pytest.mark.skipif(not nvrtc_available(), reason="needs NVRTC (cuda-bindings)")
@pytest.mark.parametrize("key", sorted(CATALOG))
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_compiles_without_spills(key, arch):
    p = CATALOG[key]
    name, defines = pn_variant(p, pn_config(p))
    assert_compiles_without_spills("pointwise/pointwise_narrow.cu", arch, name, defines)


# ------------------------------------------------------------------------------------------ GPU
@st.composite
def narrow_cases(draw, nd=2, max_spatial=20, epilogue=True):
    """A dense narrow pointwise convolution the kernel takes: K 1-8, C whole 16-byte vectors with C x K
    <= 64, any number of pixels, conv2d or conv3d, every dtype."""
    dtype = draw(st.sampled_from(("bfloat16", "float16", "float32")))
    vin = 4 if dtype == "float32" else 8
    k = draw(st.integers(1, 8))
    c = vin * draw(st.integers(1, max(1, 64 // k // vin)))
    spatial = tuple(draw(st.integers(1, max_spatial if nd == 2 else 6)) for _ in range(nd))
    ep = draw_epilogue(draw) if epilogue else {}
    return Case(nd=nd, batch=draw(st.integers(1, 3)), spatial=spatial, channels=c, out_channels=k,
                filt=(1,) * nd, stride=(1,) * nd, dilation=(1,) * nd, padding=0, groups=1, dtype=dtype,
                layout="NHWC" if nd == 2 else "NDHWC", epilogue=ep, seed=draw(st.integers(0, 2**31 - 1)))


@pytest.fixture(scope="module")
def cp():
    return cupy_for_sm80(KERNEL)


SETTINGS = [
    Setting("2d", narrow_cases(), max_examples=50),
    Setting("2d_large", narrow_cases(max_spatial=90, epilogue=False), max_examples=10),
    Setting("3d", narrow_cases(nd=3), max_examples=20),
    Setting("2d_in_place", narrow_cases(), in_place=True, max_examples=20),
]


@pytest.mark.gpu
@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: s.id)
def test_drawn(cp, setting):
    run_property(cp, KERNEL, setting)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_detection_head_map(cp, dtype):
    """YOLOv8s Detect.dfl at full size (N = 16, 4 x 8400 anchors, 16 -> 1), chosen automatically, with a
    bias and a residual; within the reference's tolerance, the same bits on a second call."""
    rng = np.random.default_rng(11)
    x = cp.asarray(random_array(rng, (16, 4, 8400, 16), dtype))
    w = cp.asarray(random_array(rng, (1, 1, 1, 16), dtype, scale=0.25))
    b = cp.asarray(random_array(rng, (1,), dtype))
    r = cp.asarray(random_array(rng, (16, 4, 8400, 1), dtype))
    assert cuconv.explain(x, w, b, residual=r).kernel == KERNEL
    y = cuconv.conv2d(x, w, b, residual=r)
    ref = cuconv.reference.conv2d(cp.asnumpy(x[:2]), cp.asnumpy(w), cp.asnumpy(b), residual=cp.asnumpy(r[:2]))
    assert_close(cp.asnumpy(y[:2]), ref, dtype)
    y2 = cuconv.conv2d(x, w, b, residual=r)
    assert bool((y == y2).all())


@pytest.mark.gpu
def test_operands_off_the_16_byte_grid(cp):
    """x, the residual and out 2 bytes past a 16-byte boundary: x is read through an aligned copy, and
    the result is the reference's."""
    dtype = "bfloat16"
    rng = np.random.default_rng(3)
    arrays = [random_array(rng, (2, 9, 13, 16), dtype), random_array(rng, (3, 1, 1, 16), dtype, scale=0.25),
              random_array(rng, (3,), dtype), random_array(rng, (2, 9, 13, 3), dtype)]
    views = []
    for a in arrays:
        buf = cp.empty(a.size + 1, a.dtype)[1:].reshape(a.shape)
        buf[...] = cp.asarray(a)
        views.append(buf)
    x, w, b, r = views
    assert x.data.ptr % 16
    out = cp.empty(r.size + 1, r.dtype)[1:].reshape(r.shape)
    got = cuconv.conv2d(x, w, b, residual=r, out=out, kernel=KERNEL)
    assert got is out
    ref = cuconv.reference.conv2d(*arrays[:3], residual=arrays[3])
    assert_close(cp.asnumpy(out), ref, dtype)
