"""The narrow-output kernel (``narrowk_direct``): its policy and dispatch on the CPU, its results on the GPU.

CPU: :func:`nk_config` keeps its invariants (PX x KV covers a whole number of sums per lane, the grid
covers the output), the dispatcher picks the kernel for K <= 8 on sm_80+ and says why it declines the
rest; every catalog variant compiles without spills (tests/test_compile.py compiles them too).
GPU (gpu-marked): drawn narrow-output float32 convolutions (C 16-96, filters up to 4x4, K 1-8,
strides, dilations, asymmetric padding, NHWC / NCHW, the whole epilogue) run
forced onto the kernel with a NaN-poisoned output, or written in place over the residual; the SD VAE's
and UNet's last convolutions run at full size, chosen automatically, at full fp32 accuracy at either
precision.
"""

import numpy as np
import pytest
from hypothesis import assume
from hypothesis import strategies as st

import cuconv
from cuconv import dispatch
from cuconv.backends.narrowk.kernel import NarrowkKernel
from cuconv.backends.narrowk.variants import CATALOG, MAX_K, NK_FIELDS, NK_SOURCE, WARPS, nk_config, nk_geometry, nk_variant
from cuconv.overrides import Overrides
from cuconv.problem import output_size

from conftest import DeviceBuf, assert_close, assert_compiles_without_spills, cupy_for_sm80, nvrtc_available, random_array
from geometry import A100, H100, Case, Setting, draw_epilogue, problem2d, run_property

KERNEL = "narrowk_direct"


# ------------------------------------------------------------------------------------------ CPU
@pytest.mark.parametrize("key", sorted(CATALOG))
def test_config_invariants(key):
    p = CATALOG[key]
    cfg = nk_config(p)
    assert p.out_channels <= cfg.kv <= MAX_K and cfg.ul in (4, 8, 16, 32)
    assert (cfg.px * cfg.kv) % cfg.ul == 0, "every lane ends with whole sums"
    assert cfg.units * cfg.vin == p.channels and cfg.vin * p.itemsize == 16
    P, Q = p.out_spatial
    assert cfg.row_blocks * WARPS >= P and cfg.col_blocks * cfg.px * (32 // cfg.ul) >= Q
    geo = nk_geometry(p, cfg)
    assert len(geo.dtype.names) == len(NK_FIELDS) and int(geo["units"]) == cfg.units


def test_dispatch_takes_narrow_outputs_and_declines_the_rest():
    for dev in (H100, A100):
        plan, why = dispatch.select(problem2d(N=1, H=512, W=512, C=128, K=3, dtype="float32"), dev)
        assert why.kernel == KERNEL and "few output channels" in why.reason, str(why)
    k = NarrowkKernel()
    assert "computes float32" in k.plan(problem2d(C=128, K=3, dtype="bfloat16"), H100, Overrides()).reason
    assert "1x1 filter" in k.plan(problem2d(C=128, K=3, R=1, S=1, padding=0, dtype="float32"), H100,
                                  Overrides()).reason
    assert "at most 8 output channels" in k.plan(problem2d(C=128, K=16, dtype="float32"), H100, Overrides()).reason
    assert "grouped" in k.plan(problem2d(C=64, K=4, groups=2, dtype="float32"), H100, Overrides()).reason
    assert "16-byte channel vectors" in k.plan(problem2d(C=14, K=4, dtype="float32"), H100, Overrides()).reason
    assert "16-byte channel vectors" in k.plan(problem2d(C=8, K=4, dtype="float32"), H100, Overrides()).reason


@pytest.mark.skipif(not nvrtc_available(), reason="needs NVRTC (cuda-bindings)")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("key", sorted(CATALOG))
def test_compiles_without_spills(key, arch):
    p = CATALOG[key]
    assert_compiles_without_spills(NK_SOURCE, arch, *nk_variant(p, nk_config(p)), no_stack=True)


# ------------------------------------------------------------------------------------------ GPU
@st.composite
def narrowk_cases(draw, max_spatial=24, epilogue=True):
    """A dense float32 conv2d the narrow-output kernel takes: C 16-96 (4-24 vectors of 4 channels), K 1-8,
    filters of 2-16 taps up to 4 a side, strides 1-3, dilations 1-2, asymmetric padding."""
    dtype = "float32"
    c = 4 * draw(st.integers(4, 24))
    spatial = tuple(draw(st.integers(1, max_spatial)) for _ in range(2))
    filt = tuple(draw(st.integers(1, 4)) for _ in range(2))
    assume(filt != (1, 1))
    stride = tuple(draw(st.integers(1, 3)) for _ in range(2))
    dilation = tuple(draw(st.integers(1, 2)) for _ in range(2))
    padding = tuple((draw(st.integers(0, 3)), draw(st.integers(0, 3))) for _ in range(2))
    for n, f, s, d, (lo, hi) in zip(spatial, filt, stride, dilation, padding):
        assume(output_size(n, f, s, d, lo, hi) >= 1)
    ep = draw_epilogue(draw) if epilogue else {}
    return Case(nd=2, batch=draw(st.integers(1, 3)), spatial=spatial, channels=c,
                out_channels=draw(st.integers(1, MAX_K)), filt=filt, stride=stride, dilation=dilation,
                padding=padding, groups=1, dtype=dtype, layout=draw(st.sampled_from(("NHWC", "NCHW"))),
                epilogue=ep, seed=draw(st.integers(0, 2**31 - 1)))


@pytest.fixture(scope="module")
def cp():
    return cupy_for_sm80("narrowk_direct")


SETTINGS = [
    Setting("2d", narrowk_cases(), max_examples=60),
    Setting("2d_wide", narrowk_cases(max_spatial=90, epilogue=False), max_examples=15),
    Setting("2d_in_place", narrowk_cases(), in_place=True, max_examples=20),
]


@pytest.mark.gpu
@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: s.id)
def test_drawn(cp, setting):
    run_property(cp, KERNEL, setting)


@pytest.mark.gpu
@pytest.mark.parametrize("n, c, hw, k", [
    (1, 128, 512, 3),   # SD VAE decoder conv_out
    (2, 320, 64, 4),    # SD UNet conv_out
])
@pytest.mark.parametrize("precision", ["float32", "tf32"])
def test_network_last_layers(cp, n, c, hw, k, precision):
    dtype = "float32"
    rng = np.random.default_rng(c + hw + k)
    x = random_array(rng, (n, hw, hw, c), dtype)
    w = random_array(rng, (k, 3, 3, c), dtype, scale=1.0 / np.sqrt(9 * c))
    b = random_array(rng, (k,), dtype)
    ref = cuconv.reference.conv2d(x.astype(np.float64), w.astype(np.float64), b.astype(np.float64), padding=1)
    e = cuconv.explain(cp.asarray(x), cp.asarray(w), cp.asarray(b), padding=1, precision=precision)
    assert e.kernel == KERNEL, str(e)
    y = cuconv.conv2d(cp.asarray(x), cp.asarray(w), cp.asarray(b), padding=1, precision=precision)
    err = np.linalg.norm(cp.asnumpy(y) - ref) / np.linalg.norm(ref)
    assert err < 1e-6, err  # fp32 multiply-adds at either precision


@pytest.mark.gpu
def test_operands_off_the_16_byte_grid(cp):
    """x and w starting 4 bytes past a 16-byte boundary (views into larger buffers): the kernel's 16-byte
    channel vectors read aligned copies, and the result is the reference's."""
    dtype = "float32"
    rng = np.random.default_rng(5)
    x = random_array(rng, (1, 20, 24, 32), dtype)
    w = random_array(rng, (3, 3, 3, 32), dtype, scale=1.0 / np.sqrt(9 * 32))
    xg = cp.empty(x.size + 1, dtype)[1:].reshape(x.shape)
    wg = cp.empty(w.size + 1, dtype)[1:].reshape(w.shape)
    xg[...], wg[...] = cp.asarray(x), cp.asarray(w)
    assert xg.data.ptr % 16 and wg.data.ptr % 16
    assert cuconv.explain(xg, wg, padding=1).kernel == KERNEL
    y = cuconv.conv2d(xg, wg, padding=1)
    assert_close(cp.asnumpy(y), cuconv.reference.conv2d(x, w, padding=1), dtype)


def test_run_passes_aligned_addresses():
    """``NarrowkPlan.run`` hands the launch x and w on the 16-byte grid of its channel vectors (aligned
    copies of operands off it), and out, bias and the residual as they are (scalar epilogue accesses);
    the output's address stands for absent operands."""
    from cuconv.problem import Epilogue
    p = problem2d(C=64, K=3, dtype="float32", epilogue=Epilogue(has_bias=True, has_residual=True))
    plan = dispatch.select(p, H100)[0]
    assert plan.kernel.name == KERNEL
    sent = []
    plan._launch = lambda *ptrs: sent.append(ptrs)
    x, w, out = DeviceBuf(), DeviceBuf(), DeviceBuf()
    plan.run(x, w, None, None, out)
    assert sent[-1] == (x.data.ptr, w.data.ptr, out.data.ptr, out.data.ptr, out.data.ptr)
    odd_x, odd_w, bias, res, odd_out = (DeviceBuf(b.data.ptr + 4) for b in (x, w, DeviceBuf(), DeviceBuf(), out))
    plan.run(odd_x, odd_w, bias, res, odd_out)
    xp, wp, bp, rp, op = sent[-1]
    assert xp % 16 == 0 and wp % 16 == 0 and xp != odd_x.data.ptr and wp != odd_w.data.ptr
    assert (bp, rp, op) == (bias.data.ptr, res.data.ptr, odd_out.data.ptr) and odd_out.assigned is None
    plan.run(x, w, None, odd_out, odd_out)  # in place
    assert sent[-1][3:] == (odd_out.data.ptr, odd_out.data.ptr)
