"""The few-channel kernel (``smallc_direct``): its policy and dispatch on the CPU, its results on the GPU.

CPU: :func:`sc_config` keeps its invariants (tile within shared memory and 256 threads, KV dividing K),
the dispatcher picks the kernel for stems on sm_80+ and says why it declines the rest; every catalog
variant compiles without spills (tests/test_compile.py compiles them too).
GPU (gpu-marked): drawn few-channel convolutions (C 1-4, filters up to 4x4, K up to 80, strides,
dilations, asymmetric padding, every dtype, NHWC / NCHW, conv2d and conv3d, the whole epilogue) run
forced onto the kernel with a NaN-poisoned output, or written in place over the residual; the
networks' stems run at full size, chosen automatically.
"""

import numpy as np
import pytest
from hypothesis import assume
from hypothesis import strategies as st

import cuconv
from cuconv import dispatch
from cuconv.backends.smallc.kernel import SmallcKernel
from cuconv.backends.smallc.params import SC_FIELDS, sc_geometry
from cuconv.backends.smallc.variants import CATALOG, MAX_THREADS, SC_SOURCE, SMEM_LIMIT, sc_config, sc_variant
from cuconv.overrides import Overrides
from cuconv.problem import output_size

from conftest import assert_close, assert_compiles_without_spills, cupy_for_sm80, nvrtc_available, random_array
from geometry import A100, H100, Case, Setting, draw_epilogue, problem2d, problem3d, run_property

KERNEL = "smallc_direct"


# ------------------------------------------------------------------------------------------ CPU
@pytest.mark.parametrize("key", sorted(CATALOG))
def test_config_invariants(key):
    p = CATALOG[key]
    cfg = sc_config(p)
    assert cfg.threads <= MAX_THREADS and cfg.smem <= SMEM_LIMIT
    assert p.out_channels % cfg.kv == 0 and cfg.kv in (1, 2, 4, 8) and cfg.cb <= 64
    assert p.channels % cfg.vin == 0
    P, Q = p.out_spatial[-2:]
    assert cfg.tiles_p * cfg.tp >= P and cfg.tiles_q * cfg.tq >= Q and cfg.chunks * cfg.cb >= p.out_channels
    geo = sc_geometry(p, cfg)
    assert len(geo.dtype.names) == len(SC_FIELDS) and int(geo["kg"]) == cfg.kg


def test_dispatch_takes_stems_and_declines_the_rest():
    # float32 stems (16-bit ones go to smallc_mma, tests/test_smallc_mma.py)
    stem = problem2d(N=32, H=224, W=224, C=3, K=32, stride=2, padding=1, dtype="float32")
    for dev in (H100, A100):
        plan, why = dispatch.select(stem, dev)
        assert why.kernel == KERNEL and "few input channels" in why.reason, str(why)
    resnet_stem = problem2d(N=32, H=224, W=224, C=3, K=64, R=7, S=7, stride=2, padding=3)
    assert "147 multiply-adds" in SmallcKernel().plan(resnet_stem, H100, Overrides()).reason
    assert "at most 8 input channels" in SmallcKernel().plan(problem2d(C=16), H100, Overrides()).reason
    assert "grouped" in SmallcKernel().plan(problem2d(C=4, K=4, groups=2), H100, Overrides()).reason
    conv3d = problem3d(C=1, K=16, T=3, R=3, S=3)
    assert dispatch.select(conv3d, H100, strategy="native")[1].kernel == KERNEL


@pytest.mark.skipif(not nvrtc_available(), reason="needs NVRTC (cuda-bindings)")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("key", sorted(CATALOG))
def test_compiles_without_spills(key, arch):
    p = CATALOG[key]
    assert_compiles_without_spills(SC_SOURCE, arch, *sc_variant(p, sc_config(p)))


def test_channels_first_problems_get_the_channels_first_variant():
    """NCHW / NCDHW problems compile the variant that reads x and w and writes the result channels-first,
    and the layout's explain line says no operand moves."""
    import dataclasses
    from cuconv.layout import describe
    for cf in ("c4_1x1_nchw", "rgb_3x3_s2_nchw_float32", "c1_conv3d_ncdhw"):
        plan = SmallcKernel().plan(CATALOG[cf], H100, Overrides())
        assert plan.writes_channels_first and plan.reads_channels_first and plan.defines["SC_NCHW"] == 1
        assert plan.name.endswith("_cf") and "x and w read channels-first" in plan.describe()
        last = SmallcKernel().plan(dataclasses.replace(CATALOG[cf], layout="NDHWC" if CATALOG[cf].nd == 3 else "NHWC"),
                                   H100, Overrides())
        assert not (last.writes_channels_first or last.reads_channels_first) and "SC_NCHW" not in last.defines
    p = CATALOG["c4_1x1_nchw"]
    line = describe(p, H100, SmallcKernel().plan(p, H100, Overrides()))
    assert "read and written by the kernel itself" in line and "no operand is moved" in line, line


# ------------------------------------------------------------------------------------------ GPU
@st.composite
def smallc_cases(draw, nd=2, dtypes=("float16", "bfloat16", "float32"), max_spatial=20, epilogue=True):
    """A dense convolution the few-channel kernel takes: C 1-4 (1-2 for conv3d), filters up to 4 a side
    (3 for conv3d), K 1-80, strides 1-4, dilations 1-2, asymmetric padding."""
    layouts = ("NHWC", "NCHW") if nd == 2 else ("NDHWC", "NCDHW")
    c = draw(st.integers(1, 4 if nd == 2 else 2))
    k = draw(st.sampled_from([1, 3, 4, 8, 16, 24, 32, 48, 64, 80]))
    spatial = tuple(draw(st.integers(1, max_spatial if nd == 2 else max(4, max_spatial // 2))) for _ in range(nd))
    filt = tuple(draw(st.integers(1, 4 if nd == 2 else 3)) for _ in range(nd))
    stride = tuple(draw(st.integers(1, 4)) for _ in range(nd))
    dilation = tuple(draw(st.integers(1, 2)) for _ in range(nd))
    padding = tuple((draw(st.integers(0, 3)), draw(st.integers(0, 3))) for _ in range(nd))
    for n, f, s, d, (lo, hi) in zip(spatial, filt, stride, dilation, padding):
        assume(output_size(n, f, s, d, lo, hi) >= 1)
    ep = draw_epilogue(draw) if epilogue else {}
    return Case(nd=nd, batch=draw(st.integers(1, 3)), spatial=spatial, channels=c, out_channels=k, filt=filt,
                stride=stride, dilation=dilation, padding=padding, groups=1, dtype=draw(st.sampled_from(dtypes)),
                layout=draw(st.sampled_from(layouts)), epilogue=ep, seed=draw(st.integers(0, 2**31 - 1)))


@pytest.fixture(scope="module")
def cp():
    return cupy_for_sm80("smallc_direct")


SETTINGS = [
    Setting("2d", smallc_cases(nd=2), max_examples=60),
    Setting("2d_wide", smallc_cases(nd=2, max_spatial=90, epilogue=False), max_examples=15),
    Setting("2d_in_place", smallc_cases(nd=2), in_place=True, max_examples=20),
    Setting("3d", smallc_cases(nd=3, max_spatial=12), max_examples=25),
]


@pytest.mark.gpu
@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: s.id)
def test_drawn(cp, setting):
    run_property(cp, KERNEL, setting)


@pytest.mark.gpu
@pytest.mark.parametrize("c, hw, filt, stride, k", [
    (3, 224, 3, 2, 32),    # MobileNetV2 / EfficientNet-B0 stem
    (3, 224, 4, 4, 96),    # ConvNeXt-T stem (padding 0)
    (3, 320, 3, 2, 32),    # YOLOv8s stem at half resolution
    (4, 64, 3, 1, 320),    # SD UNet conv_in
    (4, 64, 1, 1, 4),      # SD VAE post_quant_conv
])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
def test_network_stems(cp, c, hw, filt, stride, k, dtype, layout):
    rng = np.random.default_rng(c + hw + k)
    x = random_array(rng, (2, hw, hw, c), dtype)
    w = random_array(rng, (k, filt, filt, c), dtype, scale=1.0 / filt)
    b = random_array(rng, (k,), dtype)
    kw = dict(stride=stride, padding=0 if filt == stride else filt // 2, activation="silu")
    ref = cuconv.reference.conv2d(x, w, b, **kw)
    if layout == "NCHW":  # the same convolution on channels-first arrays: read and written so by the kernel
        x, w, ref = (np.ascontiguousarray(a.transpose(0, 3, 1, 2)) for a in (x, w, ref))
        kw["layout"] = "NCHW"
    e = cuconv.explain(cp.asarray(x), cp.asarray(w), cp.asarray(b), **kw)
    # 16-bit stems of 16 terms or more run on tensor cores (smallc_mma) unless forced here
    assert e.kernel == (KERNEL if dtype == "float32" or c * filt * filt < 16 else "smallc_mma"), str(e)
    assert_close(cuconv.conv2d(cp.asarray(x), cp.asarray(w), cp.asarray(b), kernel=KERNEL, **kw), ref, dtype)
