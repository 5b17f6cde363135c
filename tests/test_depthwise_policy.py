"""The depthwise kernel's policy and index math on the CPU (cuconv/backends/depthwise/,
cuconv/models/depthwise.py).

* :func:`dw_config` keeps its invariants on drawn depthwise problems (tile fits shared memory, at
  most 256 threads, whole multiplier groups per chunk, copy widths that divide the channel runs);
* the NumPy model of the kernel (its CTAs, halo tiles and thread windows, with the tile shapes the
  host picks) equals the float64 reference, so the kernel's index math is right before it runs;
* the dispatcher picks ``depthwise_direct`` for depthwise problems on sm_80+ and says why it declines
  the others.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import cuconv
from cuconv import dispatch
from cuconv.backends.depthwise.kernel import DepthwiseKernel
from cuconv.backends.depthwise.params import DW_FIELDS, dw_geometry
from cuconv.backends.depthwise.variants import MAX_THREADS, SMEM_LIMIT, DwConfig, dw_config, dw_variant
from cuconv.device import DeviceInfo
from cuconv.models.depthwise import cta_coordinates, direct_conv
from cuconv.overrides import Overrides
from cuconv.problem import ConvProblem

from conftest import DeviceBuf, random_array
from geometry import A100, H100, depthwise_cases, problem2d, problem3d

V100 = DeviceInfo(kind="cuda", index=0, name="V100", cc=(7, 0), arch="sm_70", sm_count=80,
                  smem_per_block_optin=98304)


def _problem(case) -> ConvProblem:
    return ConvProblem.create(nd=case.nd, batch=case.batch, in_spatial=case.spatial, channels=case.channels,
                              out_channels=case.out_channels, filter_spatial=case.filt, stride=case.stride,
                              dilation=case.dilation, padding=case.padding, groups=case.groups, dtype=case.dtype,
                              layout="NHWC" if case.nd == 2 else "NDHWC")


def _check_invariants(p: ConvProblem, cfg: DwConfig):
    mult = p.out_channels // p.channels
    assert cfg.mult == mult
    assert 1 <= cfg.threads <= MAX_THREADS and cfg.smem <= SMEM_LIMIT
    assert cfg.vec <= 4 and (p.out_channels % cfg.vec == 0)
    assert cfg.cb % mult == 0 and cfg.cin == cfg.cb // mult
    assert cfg.cin % cfg.vin == 0 and p.channels % cfg.vin == 0 and cfg.vin * p.itemsize <= 16
    T, R, S = ((1,) + p.filter_spatial)[-3:] if p.nd == 2 else p.filter_spatial
    sh, sw = p.stride[-2:]
    dh, dw = p.dilation[-2:]
    assert cfg.in_rows == (cfg.tp - 1) * sh + (R - 1) * dh + 1
    assert cfg.in_cols == (cfg.tq - 1) * sw + (S - 1) * dw + 1
    P, Q = p.out_spatial[-2:]
    assert cfg.tiles_p * cfg.tp >= P > (cfg.tiles_p - 1) * cfg.tp
    assert cfg.tiles_q * cfg.tq >= Q > (cfg.tiles_q - 1) * cfg.tq
    assert cfg.chunks * cfg.cb >= p.out_channels > (cfg.chunks - 1) * cfg.cb


@settings(max_examples=200)
@given(case=st.one_of(depthwise_cases(nd=2, max_channels=1100, max_spatial=80),
                      depthwise_cases(nd=3, max_channels=300, max_spatial=40)))
def test_config_invariants(case):
    p = _problem(case)
    cfg = dw_config(p)
    if isinstance(cfg, str):  # a filter and dilation whose smallest tile's window does not fit: declined, saying so
        assert cfg.startswith("the smallest tile") and "bytes of shared memory" in cfg, cfg
        return
    _check_invariants(p, cfg)
    name, defines = dw_variant(p, cfg)
    assert defines["CUCONV_KERNEL_NAME"] == name and defines["DW_VEC"] == cfg.vec
    # the chunk and the tile's channels per pixel are compile-time, so the name tells variants apart by them
    assert (defines["DW_CB"], defines["DW_CIN"]) == (cfg.cb, cfg.cin) and f"_c{cfg.cb}" in name
    geo = dw_geometry(p, cfg)
    assert geo.dtype.itemsize == 4 * len(DW_FIELDS) and int(geo["cin"]) == cfg.cin


@pytest.mark.parametrize("c, hw, filt, stride, vec, cv", [
    (144, 56, 3, 1, 4, 12),   # MobileNetV2: 36 vectors as 3 chunks of 12
    (96, 56, 7, 1, 2, 24),    # ConvNeXt-T stage 1: a wide filter, 2-channel vectors
    (384, 14, 7, 1, 2, 32),   # ConvNeXt-T stage 3: chunks of 64 channels
    (960, 7, 3, 1, 4, 16),
    (32, 112, 3, 1, 4, 8),
    (3, 16, 3, 1, 1, 3),      # odd C: one-channel vectors
])
def test_config_of_network_layers(c, hw, filt, stride, vec, cv):
    p = problem2d(N=32, H=hw, W=hw, C=c, K=c, R=filt, S=filt, stride=stride, padding=filt // 2, groups=c)
    cfg = dw_config(p)
    assert (cfg.vec, cfg.cv) == (vec, cv)
    _check_invariants(p, cfg)


@pytest.mark.parametrize("dtype, filt, stride, dilation, wide", [
    ("bfloat16", 7, 1, 1, True),
    ("float16", 9, 1, 1, True),
    ("bfloat16", 5, 1, 1, False),   # below WIDE_MIN_S
    ("bfloat16", 7, 2, 1, False),   # W stride 2: not measured with the wide shape
    ("bfloat16", 7, 1, 2, False),   # dilated
    ("float32", 7, 1, 1, False),    # fp32 windows keep 4-channel vectors
])
def test_wide_filters_take_two_channel_vectors_and_eight_output_windows(dtype, filt, stride, dilation, wide):
    p = problem2d(N=8, H=28, W=28, C=192, K=192, R=filt, S=filt, stride=stride, dilation=dilation,
                  padding=dilation * (filt // 2), groups=192, dtype=dtype)
    cfg = dw_config(p)
    assert cfg.wide is wide
    if wide:
        assert (cfg.vec, cfg.qt, cfg.cb) == (2, 8, 64)
        assert "_v2i8_q8_b3_" in dw_variant(p, cfg)[0]  # 3 CTAs per SM: 16 accumulators, S x 2 weights
    else:
        assert cfg.vec == 4
    # a backend that keeps the 4-channel shape (the CDNA kernel) asks for it
    assert dw_config(p, wide_filters=False).wide is False and dw_config(p, wide_filters=False).vec == 4
    _check_invariants(p, cfg)


def test_config_declines_a_tile_too_big():
    p = problem2d(N=1, H=300, W=300, C=64, K=64, R=31, S=31, dilation=9, padding=135, groups=64)
    assert isinstance(dw_config(p), str) and "shared memory" in dw_config(p)


@pytest.mark.parametrize("c,k", [(1, 17), (1, 34), (2, 38), (3, 51)])
def test_config_declines_multiplier_groups_wider_than_a_chunk(c, k):
    """A multiplier (K / C) whose groups fit no channel chunk is declined with the reason (the kernel
    that serves it next runs), every chunk-fitting multiplier is planned."""
    p = problem2d(N=1, H=8, W=8, C=c, K=k, groups=c)
    assert isinstance(dw_config(p), str) and f"channel multiplier {k // c}" in dw_config(p)
    assert not isinstance(dw_config(problem2d(N=1, H=8, W=8, C=c, K=16 * c, groups=c)), str)


def test_cta_coordinates_cover_the_grid_once():
    p = problem3d(N=2, D=5, H=9, W=13, C=40, K=80, T=3, R=3, S=3, padding=1, groups=40, dtype="float16")
    cfg = dw_config(p)
    blocks = p.batch * p.out_spatial[0] * cfg.tiles_p * cfg.tiles_q * cfg.chunks
    seen = {cta_coordinates(b, p, cfg) for b in range(blocks)}
    assert len(seen) == blocks
    assert {s[4] for s in seen} == set(range(cfg.chunks)) and {s[0] for s in seen} == {0, 1}


@settings(max_examples=30)
@given(case=st.one_of(depthwise_cases(nd=2, max_spatial=11, max_channels=20, epilogue=False),
                      depthwise_cases(nd=3, max_spatial=8, max_channels=12, max_filter=3, epilogue=False)))
def test_model_matches_reference(case):
    p = _problem(case)
    cfg = dw_config(p)
    rng = np.random.default_rng(case.seed)
    x = random_array(rng, p.x_shape, "float32")
    w = random_array(rng, p.w_shape, "float32")
    got = direct_conv(x, w, p, cfg)
    ref = cuconv.reference.convnd(x, w, stride=case.stride, padding=case.padding, dilation=case.dilation,
                                  groups=case.groups, layout=p.layout)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


def test_dispatch_picks_depthwise_on_sm80_and_later():
    p = problem2d(N=2, H=14, W=14, C=40, K=40, groups=40)  # C off the 16-channel chunks of depthwise_diag
    for dev in (H100, A100):
        plan, why = dispatch.select(p, dev)
        assert why.kernel == "depthwise_direct", str(why)
        assert "memory-bound" in why.reason and "shared memory" in why.detail
    plan, why = dispatch.select(p, V100)
    assert why.kernel != "depthwise_direct" and "sm_80" in why.declined["depthwise_direct"]
    dense = problem2d(C=64, K=64)
    assert "not depthwise" in DepthwiseKernel().plan(dense, H100, Overrides()).reason
    grouped = problem2d(C=64, K=64, groups=16)
    assert "4 channels per group" in DepthwiseKernel().plan(grouped, H100, Overrides()).reason


def test_persistent_grid_and_plane_offsets():
    """The CUDA launch is a persistent grid (no more CTAs than the GPU holds at once, none without an
    item), and a plane beyond the loader's 32-bit offsets is declined with the reason."""
    p = problem2d(N=32, H=56, W=56, C=144, K=144, groups=144)
    plan = DepthwiseKernel().plan(p, H100, Overrides())
    tiles = plan.cfg.tiles(p)
    assert plan.grid(3) == min(tiles, 3 * H100.sm_count) and plan.grid(10**6) == tiles
    assert "persistent grid" in plan.describe()
    huge = problem2d(N=1, H=32768, W=32768, C=4096, K=4096, groups=4096)
    reason = DepthwiseKernel().plan(huge, H100, Overrides()).reason
    assert "32-bit offsets" in reason


def test_conv3d_depthwise_is_a_native_strategy():
    p = problem3d(C=32, K=32, groups=32)
    plan, why = dispatch.select(p, H100, strategy="native")
    assert why.kernel == "depthwise_direct" and "3 filter slices" in why.detail


def test_run_passes_aligned_addresses_and_copies_back():
    """``DepthwisePlan.run`` hands the launch aligned operands (copies of misaligned ones), the output's
    address for absent ones, and writes an aligned copy of a misaligned ``out`` back into it."""
    from cuconv.problem import Epilogue
    p = problem2d(C=64, K=64, groups=64, epilogue=Epilogue(has_bias=True, has_residual=True))
    plan = dispatch.select(p, H100)[0]
    sent = []
    plan._launch = lambda *ptrs: sent.append(ptrs)
    x, w, out = DeviceBuf(), DeviceBuf(), DeviceBuf()
    plan.run(x, w, None, None, out)
    assert sent[-1] == (x.data.ptr, w.data.ptr, out.data.ptr, out.data.ptr, out.data.ptr)
    bias, res = DeviceBuf(), DeviceBuf()
    plan.run(x, w, bias, res, out)
    assert sent[-1] == (x.data.ptr, w.data.ptr, bias.data.ptr, res.data.ptr, out.data.ptr)
    odd_x, odd_out = DeviceBuf(x.data.ptr + 2), DeviceBuf(out.data.ptr + 2)
    plan.run(odd_x, w, None, None, out)  # no residual, x misaligned: copied
    xp_sent, *rest = sent[-1]
    assert xp_sent % 16 == 0 and xp_sent != odd_x.data.ptr and rest == [w.data.ptr] + [out.data.ptr] * 3
    plan.run(x, w, DeviceBuf(bias.data.ptr + 2), None, out)  # a misaligned bias: copied
    assert sent[-1][2] % 16 == 0 and sent[-1][2] != bias.data.ptr + 2
    plan.run(odd_x, w, bias, odd_out, odd_out)  # misaligned x and out; the residual is out (in place)
    xp, _, _, rp, op = sent[-1]
    assert xp % 16 == 0 and xp != odd_x.data.ptr and op % 16 == 0 and rp == op != odd_out.data.ptr
    assert odd_out.assigned is not None
    unread = dispatch.select(problem2d(C=64, K=64, groups=64, epilogue=Epilogue(has_residual=True, beta=0.0)),
                             H100)[0]
    unread._launch = lambda *ptrs: sent.append(ptrs)
    unread.run(x, w, None, res, out)
    assert sent[-1][3] == out.data.ptr  # beta == 0: the residual is not read


def test_direct_plans_pack_their_launch(monkeypatch):
    """``DirectPlan._build`` (depthwise direct and both MMA kernels, smallc, narrowk): the variant loaded with the tile's shared memory,
    five pointer slots, the plan's geometry struct and the epilogue's parameters, each kind's grid (the
    persistent one from the occupancy, one CTA per tile, the narrow kernel's own count)."""
    import cuconv.backends.depthwise.kernel as direct
    from cuconv.launch import epilogue_params
    from cuconv.problem import Epilogue

    loads, launches = [], []
    monkeypatch.setattr(direct, "load_cuda_function", lambda *a: loads.append(a) or "fn")
    monkeypatch.setattr(direct, "resident_blocks", lambda fn, threads, smem: 2)
    monkeypatch.setattr(direct, "PackedLaunch", lambda *a, **k: launches.append((a, k)))
    ep = Epilogue(has_bias=True, has_residual=True, activation="silu")
    for p, kernel in ((problem2d(H=32, W=32, C=96, K=96, groups=96, R=5, S=5, padding=2, epilogue=ep), "depthwise_mma"),
                      (problem2d(C=96, K=96, groups=96, epilogue=ep), "depthwise_diag"),
                      (problem2d(C=40, K=40, groups=40, epilogue=ep), "depthwise_direct"),
                      (problem2d(C=3, K=32, stride=2, dtype="float32", epilogue=ep), "smallc_direct"),
                      (problem2d(C=64, K=3, dtype="float32", epilogue=ep), "narrowk_direct")):
        plan = dispatch.select(p, H100, kernel)[0]
        assert plan.kernel.name == kernel
        plan._build()
        c = plan.cfg
        assert loads[-1] == (plan.source, H100, plan.defines, plan.name, c.smem)
        (fn, grid, block, smem, args), kw = launches[-1]
        if kernel in ("depthwise_direct", "depthwise_mma", "depthwise_diag"):
            want_grid = min(c.tiles(p), 2 * H100.sm_count)  # two CTAs per SM (the faked occupancy)
        elif kernel == "smallc_direct":
            want_grid = c.tiles(p)
        else:
            want_grid = c.ctas
        assert (fn, grid, block, smem, kw) == ("fn", want_grid, c.threads, c.smem, {"slots": (0, 1, 2, 3, 4)})
        assert [a.tobytes() for a in args[:5]] == [np.uint64(0).tobytes()] * 5
        assert args[5].tobytes() == plan.geometry().tobytes()
        assert args[6].tobytes() == epilogue_params(p.epilogue).tobytes()
