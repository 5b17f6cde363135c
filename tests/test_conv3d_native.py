"""conv3d "native" strategy: the Hopper kernel over NDHWC with 5-D TMA im2col boxes (``conv3d_native``).

CPU part (CI): the kernel's plan declines with the rank-5 limits named; the strategy and priority
are wired into dispatch (``auto`` prefers native, ``strategy=`` restricts). The kernel's compile
check is in tests/test_sm90_compile.py (COMPILE_VARIANTS holds the SM90_NDIM=3 variants) and the
5-D box replay through the NumPy TMA model in tests/test_sm90_model.py.

GPU part (``gpu`` marker, Hopper only): forced onto the kernel, hypothesis vs the float64
reference over drawn 3-D geometry inside its coverage (any stride, dilation, padding including
temporal), one property test per tile setting (:data:`SETTINGS`), named edge cases, in-place
residual, and the auto choice; the same with halo tiles forced (any depth stride, dilation and
padding; H/W stride 1 and 3x3-or-smaller windows).
"""

from __future__ import annotations

import pytest

import cuconv
from cuconv import dispatch
from cuconv.backends.sm90 import Sm90TmaConv3d, Sm90TmaKernel
from cuconv.overrides import Overrides
from cuconv.plan import Declined

from conftest import needs_hopper
from geometry import H100, Case, Setting, case3d, check_case, coverage_cases, explain_detail, halo_cases, run_property
from geometry import problem3d as _problem


# ----------------------------------------------------------------------------------------- CPU
@pytest.mark.parametrize("kwargs,reason", [
    (dict(dtype="float32"), "dtype float32"),
    (dict(groups=2), "groups=2"),
    (dict(C=12), "C=12 is not a multiple of 8"),
    (dict(K=20), "K=20 is not a multiple of 8"),
    # rank-5 boxes: corners within [-16, 15], offsets within 31
    (dict(D=40, padding=((17, 17), (1, 1), (1, 1))), "rank-5 range"),
    (dict(D=40, T=3, dilation=(16, 1, 1), padding=((16, 16), (1, 1), (1, 1))), "rank-5 limit 31"),
])
def test_plan_declines_with_rank5_reasons(kwargs, reason):
    answer = Sm90TmaConv3d().plan(_problem(**kwargs), H100, Overrides())
    assert isinstance(answer, Declined) and reason in answer.reason, answer


def test_plan_accepts_temporal_padding_stride_dilation():
    p = _problem(D=9, C=24, K=40, stride=(2, 1, 2), dilation=(2, 1, 1), padding=((2, 1), (0, 3), (1, 1)))
    plan = Sm90TmaConv3d().plan(p, H100, Overrides())
    assert plan and "5-D boxes" in plan.reason, plan
    assert plan.describe().startswith("conv3d_fprop_sm90_tma_")
    # conv2d's kernel serves conv2d only
    assert "conv2d" in Sm90TmaKernel().plan(p, H100, Overrides()).reason


def test_auto_prefers_native_and_strategy_restricts():
    p = _problem(C=64, K=64, padding=((0, 0), (1, 1), (1, 1)))
    plan, e = dispatch.select(p, H100)
    assert plan.kernel.name == "conv3d_native", e
    assert "conv3d_fprop_sm90_tma_128x64x64" in e.detail
    plan, e = dispatch.select(p, H100, strategy="qslice")
    assert plan.kernel.name == "conv3d_qslice" and "'qslice' was asked for" in e.declined["conv3d_native"]
    # sm90_tma (conv2d only) never serves a 3-D problem
    plan, e = dispatch.select(p, H100, forced=None)
    assert "conv2d" in e.declined["sm90_tma"]


def test_forced_tiles_reach_the_conv3d_plan():
    """``cuconv.overrides`` reaches conv3d_native's plan as it does sm90_tma's (the same tile policy)."""
    p = _problem(C=64, K=96, padding=((0, 0), (1, 1), (1, 1)))
    _, e = dispatch.select(p, H100, overrides=Overrides(block_n=192, halo=False))
    assert "conv3d_fprop_sm90_tma_128x192x64" in e.detail and "_halo" not in e.detail, e.detail
    _, e = dispatch.select(p, H100, overrides=Overrides(halo=True, block_m=192, block_n=128))
    assert "conv3d_fprop_sm90_tma_192x128x64" in e.detail and "_halo" in e.detail, e.detail


# ----------------------------------------------------------------------------------------- GPU
gpu = pytest.mark.gpu


#: One property test per tile setting: (id, drawn cases, overrides, what explain must name, examples).
SETTINGS = [
    Setting("native", coverage_cases(nd=3), {}, max_examples=50),
    Setting("in_place_residual", coverage_cases(nd=3), {}, max_examples=15, in_place=True),
    Setting("halo", halo_cases(nd=3, max_width=100, max_channels=72), dict(halo=True)),
    Setting("halo_pingpong", halo_cases(nd=3, max_width=100, max_channels=72), dict(halo=True, pingpong=True),
            max_examples=20),
]


@gpu
@needs_hopper
@pytest.mark.parametrize("setting", SETTINGS, ids=[s.id for s in SETTINGS])
def test_native_property(cp, setting):
    run_property(cp, "conv3d_native", setting)


_case = case3d


EDGE_CASES = {
    # causal video VAE layer: time pre-padded, spatial pad 1
    "no_temporal_pad": _case(D=6, H=10, W=12, C=64, K=64, padding=((0, 0), (1, 1), (1, 1))),
    "temporal_pad_both": _case(D=5, C=32, K=32, padding=1),
    "causal_pad_front": _case(D=5, C=32, K=48, padding=((2, 0), (1, 1), (1, 1))),
    "stride2_all": _case(N=2, D=9, H=11, W=10, C=16, K=32, stride=2, padding=1),
    "stride_depth_only": _case(D=9, C=16, K=16, stride=(2, 1, 1), padding=((1, 1), (1, 1), (1, 1))),
    "dilation_depth": _case(D=9, C=16, K=16, dilation=(2, 1, 1), padding=((2, 2), (1, 1), (1, 1))),
    "filter_1x3x3": _case(C=32, K=32, T=1, padding=((0, 0), (1, 1), (1, 1))),
    "pointwise_3d": _case(N=2, D=4, H=8, W=8, C=128, K=64, T=1, R=1, S=1, padding=0),
    # M = 2*4*7*7 = 392, not a multiple of 128: the last tile crosses images and depth planes
    "tile_spans_planes_and_images": _case(N=2, D=6, H=7, W=7, C=24, K=24, padding=((0, 0), (1, 1), (1, 1))),
    "c_not_multiple_of_block": _case(C=72, K=40),
    "k192_bn256_heuristic": _case(N=1, D=5, H=8, W=8, C=64, K=192),
    "large_k_bn256": _case(N=2, D=5, H=12, W=12, C=64, K=512, padding=((0, 0), (1, 1), (1, 1))),
    "fp16_full_epilogue": _case(C=32, K=64, dtype="float16",
                                ep=dict(bias=True, residual=True, beta=0.5, alpha=-1.25, activation="silu")),
    "bf16_gelu_bias": _case(C=32, K=64, ep=dict(bias=True, activation="gelu")),
}


@gpu
@needs_hopper
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("name", list(EDGE_CASES))
def test_native_edge_cases(cp, name, dtype):
    case = EDGE_CASES[name]
    case = Case(**{**case.__dict__, "dtype": dtype})
    check_case(case, xp=cp, kernel="conv3d_native", poison=True)


@gpu
@needs_hopper
@pytest.mark.parametrize("name", ["no_temporal_pad", "stride2_all", "causal_pad_front", "c_not_multiple_of_block",
                                  "tile_spans_planes_and_images", "fp16_full_epilogue"])
def test_native_split_tail(cp, name):
    """Tiles split in two along the (t, r, s, channel block) reduction (forced: a half starts mid-tap,
    in the middle of the temporal filter axis); the finishing half runs the fused epilogue."""
    with cuconv.overrides(split=True):
        check_case(EDGE_CASES[name], xp=cp, kernel="conv3d_native", poison=True)


@gpu
@needs_hopper
@pytest.mark.parametrize("bn", [96, 192])
@pytest.mark.parametrize("name", ["no_temporal_pad", "c_not_multiple_of_block", "k192_bn256_heuristic",
                                  "fp16_full_epilogue"])
def test_native_tile_widths(cp, bn, name):
    """The BN = 96 and 192 variants, chosen for the video-VAE widths K = 96 / 192 (forced here)."""
    with cuconv.overrides(block_n=bn):
        check_case(EDGE_CASES[name], xp=cp, kernel="conv3d_native", poison=True)


@gpu
@needs_hopper
@pytest.mark.parametrize("bm,halo", [(256, None), (192, False), (192, True)])
@pytest.mark.parametrize("name", ["no_temporal_pad", "stride2_all", "causal_pad_front", "c_not_multiple_of_block",
                                  "tile_spans_planes_and_images", "fp16_full_epilogue", "bf16_gelu_bias"])
def test_native_taller_tiles(cp, name, bm, halo):
    """256-row tiles (BN 64/96; automatic for the conv3d K = 96 video-VAE layer) and 192-row tiles
    (BN 128; im2col boxes and, where the stride allows, halo tiles of three output rows), forced."""
    case = EDGE_CASES[name]
    bn = 128 if bm == 192 else 96 if case.out_channels > 64 else 64
    with cuconv.overrides(block_m=bm, block_n=bn, halo=halo):
        assert f"{bm}x{bn}x64" in explain_detail(cp, case, "conv3d_native")
        check_case(case, xp=cp, kernel="conv3d_native", poison=True)


HALO_NAMES = ["no_temporal_pad", "temporal_pad_both", "causal_pad_front", "stride_depth_only", "dilation_depth",
              "filter_1x3x3", "tile_spans_planes_and_images", "c_not_multiple_of_block", "k192_bn256_heuristic",
              "large_k_bn256", "fp16_full_epilogue", "bf16_gelu_bias"]


@gpu
@needs_hopper
@pytest.mark.parametrize("name", HALO_NAMES)
def test_native_halo_tiles(cp, name):
    """Halo tiles (forced): one window per (t, channel block), shared by the 3x3 (r, s) taps."""
    case = EDGE_CASES[name]
    with cuconv.overrides(halo=True):
        assert "_halo" in explain_detail(cp, case, "conv3d_native")
        check_case(case, xp=cp, kernel="conv3d_native", poison=True)


@gpu
@needs_hopper
@pytest.mark.parametrize("name", ["no_temporal_pad", "stride_depth_only", "tile_spans_planes_and_images",
                                  "fp16_full_epilogue"])
def test_native_halo_cta_pairs(cp, name):
    with cuconv.overrides(halo=True, cluster=2):
        check_case(EDGE_CASES[name], xp=cp, kernel="conv3d_native", poison=True)


@gpu
@needs_hopper
@pytest.mark.parametrize("name", HALO_NAMES + ["many_planes"])
def test_native_halo_pingpong(cp, name):
    """Ping-pong halo tiles (forced): two consumer warpgroups taking turns on whole tiles (many_planes:
    400 tiles of 128 x 128, so that both warpgroups of every CTA take several turns)."""
    case = EDGE_CASES.get(name) or _case(N=2, D=12, H=20, W=70, C=64, K=128, padding=((0, 0), (1, 1), (1, 1)),
                                         ep=dict(bias=True, activation="silu"))
    with cuconv.overrides(halo=True, pingpong=True):
        detail = explain_detail(cp, case, "conv3d_native")
        assert ("_halo_pp" in detail) != ("_res" in detail), detail
        check_case(case, xp=cp, kernel="conv3d_native", poison=True)


@gpu
@needs_hopper
def test_native_strategy_and_auto_choice(cp):
    x = cp.ones((1, 5, 8, 8, 64), dtype=cp.bfloat16 if hasattr(cp, "bfloat16") else cp.float16)
    w = cp.ones((64, 3, 3, 3, 64), dtype=x.dtype)
    e = cuconv.explain(x, w, padding=1)
    assert e.kernel == "conv3d_native", str(e)
    # temporal padding: qslice declines visibly, native serves
    assert "temporal padding" in e.declined["conv3d_qslice"]
    y = cuconv.conv3d(x, w, padding=1, strategy="native")
    ref = cuconv.reference.conv3d(x, w, padding=1)
    from conftest import assert_close
    assert_close(y, ref, "float16" if x.dtype == cp.float16 else "bfloat16")
