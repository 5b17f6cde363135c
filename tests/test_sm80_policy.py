"""The sm80 kernel's policy on the CPU: which path serves a problem (cuconv/backends/sm80/subpaths.py),
the variant each path compiles (tile, copy widths), the plans and their descriptions, and forcing a
path through ``cuconv.overrides(sm80_subpath=...)`` and ``CUCONV_SM80_SUBPATH``.

Plans are asked on a model Ampere (:data:`geometry.A100`). No GPU needed.
"""

from __future__ import annotations

import pytest

import cuconv
from cuconv import dispatch
from cuconv.backends.sm80 import SM80_SUBPATHS, Sm80IgemmKernel, choose_subpath
from cuconv.backends.sm80.pad import pad_plan
from cuconv.backends.sm80.params import grouped_geometry
from cuconv.backends.sm80.subpaths import sm80_subpath_ok
from cuconv.backends.sm80.variants import (CONFIGS, GROUPED_FRAG_BYTES, SHORT_K_CONFIG, SMEM_BUDGET, conv_variant,
                                           grouped_variant)
from cuconv.device import DeviceInfo
from cuconv.overrides import Overrides, current_overrides, env_overrides
from cuconv.plan import Declined
from cuconv.problem import ConvProblem

from geometry import A100, H100


def _problem(c, k, filt, pad, groups=1, stride=1, dtype="bfloat16", hw=(16, 16), batch=2):
    return ConvProblem.create(nd=2, batch=batch, in_spatial=hw, channels=c, out_channels=k, filter_spatial=filt,
                              stride=stride, dilation=1, padding=pad, groups=groups, dtype=dtype, layout="NHWC")


def test_subpath_choice_and_forcing():
    assert choose_subpath(_problem(64, 64, (1, 1), 0))[0] == "pointwise"
    assert choose_subpath(_problem(64, 64, (3, 3), 1))[0] == "uniform"
    assert choose_subpath(_problem(3, 64, (7, 7), 3, stride=2))[0] == "pad_channels"
    assert choose_subpath(_problem(6, 64, (3, 3), 1))[0] == "per_lane"          # even C: 4-byte copies
    assert choose_subpath(_problem(3, 64, (1, 1), 0))[0] == "pointwise"
    assert choose_subpath(_problem(128, 128, (3, 3), 1, groups=32))[0] == "grouped_mma"
    assert choose_subpath(_problem(64, 64, (3, 3), 1, groups=64))[0] == "grouped_mma"   # depthwise
    assert choose_subpath(_problem(128, 256, (3, 3), 1, groups=32))[0] == "per_lane"  # Cg != Kg
    assert choose_subpath(_problem(12, 12, (3, 3), 1, groups=3))[0] == "per_lane"     # C % 8 != 0
    assert choose_subpath(_problem(8, 8, (7, 7), 3, groups=8))[0] == "grouped_mma"
    sub, why = choose_subpath(_problem(64, 64, (3, 3), 1), forced="grouped_mma")
    assert sub is None and "grouped_mma" in why and "groups > 1" in why
    assert choose_subpath(_problem(64, 64, (3, 3), 1), forced="pad_channels")[0] is None
    assert choose_subpath(_problem(5, 8, (3, 3), 1), forced="pad_channels")[0] == "pad_channels"
    assert choose_subpath(_problem(64, 64, (1, 1), 0), forced="per_lane") == ("per_lane", "per_lane (forced)")
    sub, why = choose_subpath(_problem(3, 64, (3, 3), 1), forced="uniform")
    assert sub is None and "uniform" in why
    with pytest.raises(ValueError, match="subpath"):
        with cuconv.overrides(sm80_subpath="bogus"):
            pass
    with pytest.raises(ValueError, match="subpath"):
        choose_subpath(_problem(64, 64, (3, 3), 1), forced="bogus")


@pytest.mark.parametrize("subpath,kwargs,ok", [
    ("pointwise", dict(c=64, k=64, filt=(1, 1), pad=0), True), ("pointwise", dict(c=64, k=64, filt=(3, 3), pad=1), False),
    ("uniform", dict(c=64, k=64, filt=(3, 3), pad=1), True), ("uniform", dict(c=24, k=64, filt=(3, 3), pad=1), False),
    ("grouped_mma", dict(c=64, k=64, filt=(3, 3), pad=1, groups=16), True),
    ("pad_channels", dict(c=3, k=64, filt=(7, 7), pad=3), True), ("per_lane", dict(c=3, k=5, filt=(2, 2), pad=0), True),
])
def test_forced_subpath_reaches_the_plan(subpath, kwargs, ok):
    """``Overrides(sm80_subpath=...)`` forces the plan's path, or the plan declines with the path's needs."""
    p = _problem(**kwargs)
    assert sm80_subpath_ok(p, subpath) is ok
    answer = Sm80IgemmKernel().plan(p, A100, Overrides(sm80_subpath=subpath))
    if ok:
        assert answer and answer.subpath == subpath and "(forced)" in answer.reason, answer
        assert subpath in answer.describe()
    else:
        assert isinstance(answer, Declined) and f"forced sub-path {subpath!r} needs" in answer.reason, answer


@pytest.mark.parametrize("kwargs,device,reason", [
    (dict(c=64, k=64, filt=(3, 3), pad=1, dtype="float32"), A100, "float32"),
    (dict(c=64, k=64, filt=(3, 3), pad=1), DeviceInfo(kind="cuda", cc=(7, 5), arch="sm_75", name="T4"), "sm_80+"),
    (dict(c=64, k=64, filt=(3, 3), pad=1), DeviceInfo(kind="hip", arch="gfx942", name="MI300X"), "runs on cuda"),
    (dict(c=2 ** 24, k=8, filt=(1, 1), pad=0, hw=(1, 1), batch=1), A100, "exceeds"),
])
def test_plan_declines_with_reason(kwargs, device, reason):
    answer = Sm80IgemmKernel().plan(_problem(**kwargs), device, Overrides())
    assert isinstance(answer, Declined) and reason in answer.reason, answer


def test_copy_widths_follow_channels_and_alignment():
    assert conv_variant(_problem(3, 64, (7, 7), 3), "per_lane")[2]["CUCONV_VEC_A"] == 1
    assert conv_variant(_problem(6, 64, (3, 3), 1), "per_lane")[2]["CUCONV_VEC_A"] == 2
    assert conv_variant(_problem(128, 128, (3, 3), 1, groups=32), "per_lane")[2]["CUCONV_VEC_A"] == 4
    assert conv_variant(_problem(64, 64, (3, 3), 1), "uniform")[2]["CUCONV_VEC_A"] == 8
    # a base pointer only 2-byte aligned forces 2-byte copies
    assert conv_variant(_problem(64, 64, (3, 3), 1), "uniform", x_ptr=2)[2]["CUCONV_VEC_A"] == 1
    name = conv_variant(_problem(64, 256, (3, 3), 1), "uniform")[0]
    assert name == "conv2d_fprop_sm80_uniform_bf16_128x256x32_s4_w2x4_va8_vb8"


def test_paths_variants_and_explain_text():
    p = _problem(128, 128, (3, 3), 1, groups=32)
    name, sbs, d = grouped_variant(p)
    assert sbs == 1 and name == "conv2d_fprop_sm80_grouped_mma_bf16_sb1_o4" and d["CUCONV_OCTETS"] == 4
    assert d["CUCONV_GM_MIN_BLOCKS"] == 2
    assert 49 * sbs * GROUPED_FRAG_BYTES <= SMEM_BUDGET
    assert pad_plan(_problem(3, 64, (7, 7), 3)).cp == 4
    assert pad_plan(_problem(5, 64, (7, 7), 3)).cp == 8
    k = Sm80IgemmKernel()
    stem = k.plan(_problem(3, 64, (7, 7), 3, stride=2), A100, Overrides())
    assert stem.subpath == "pad_channels" and stem.pad == pad_plan(stem.problem)
    detail = stem.describe()
    assert "pad_channels" in detail and "3 -> 4" in detail and "per_lane" in detail and "va8" in detail
    assert "folded 2 pixels -> 1 of 8 channels" in detail
    assert f"tile {SHORT_K_CONFIG.bm}x{SHORT_K_CONFIG.bn}x{SHORT_K_CONFIG.bk}" in detail
    grouped = k.plan(p, A100, Overrides())
    assert grouped.subpath == "grouped_mma" and grouped.pad is None
    assert "grouped_mma" in grouped.describe() and "32 groups of 4" in grouped.describe()
    g = grouped_geometry(p, 8)
    assert g["C"] == 128 and g["Cg"] == 4 and g["out_vec"] == 8 and g["M"] == 2 * 16 * 16
    with pytest.raises(ValueError, match="subpath"):
        sm80_subpath_ok(p, "bogus")


def test_tile_budgets():
    for cfg in list(CONFIGS.values()) + [SHORT_K_CONFIG]:
        assert cfg.smem_bytes(row_table=True) <= 99 * 1024
        assert (cfg.bm // cfg.warps_m) % 16 == 0 and (cfg.bn // cfg.warps_n) % 16 == 0


def test_hopper_prefers_sm90_and_sm80_serves_what_it_declines():
    """On a Hopper the sm80 kernel is asked after sm90_tma and serves what sm90_tma declines."""
    plan, e = dispatch.select(_problem(64, 64, (3, 3), 1), H100)
    assert plan.kernel.name == "sm90_tma" and "sm80_igemm" in e.skipped
    plan, e = dispatch.select(_problem(128, 128, (3, 3), 1, groups=64), H100)  # 2 channels per group
    assert plan.kernel.name == "sm80_igemm" and "groups=64" in e.declined["sm90_tma"]
    assert "2 channel(s) per group" in e.declined["sm90_grouped"]


def test_forcing_a_subpath_never_shows_a_stale_explanation():
    """The plan memo's key carries the overrides (the forced sub-path), so an explanation memoised
    under one forced sub-path is not returned under another (or under none)."""
    p = _problem(64, 64, (1, 1), 0, hw=(4, 4), batch=1)
    with cuconv.overrides(sm80_subpath="per_lane"):
        _, forced = dispatch.select(p, A100, forced="sm80_igemm")
    _, auto = dispatch.select(p, A100, forced="sm80_igemm")
    assert "per_lane" in forced.detail and "pointwise" in auto.detail, (forced.detail, auto.detail)
    assert forced.overrides == Overrides(sm80_subpath="per_lane") and auto.overrides == current_overrides()
    with cuconv.overrides(sm80_subpath="uniform"), pytest.raises(cuconv.KernelDeclined, match="uniform"):
        dispatch.select(_problem(3, 8, (3, 3), 1), A100, forced="sm80_igemm")


def test_subpath_from_the_environment(cuconv_env):
    p = _problem(64, 64, (1, 1), 0, hw=(4, 4), batch=1)
    for sub in SM80_SUBPATHS:
        with cuconv_env("CUCONV_SM80_SUBPATH", sub):
            assert env_overrides() == Overrides(sm80_subpath=sub)
    with cuconv_env("CUCONV_SM80_SUBPATH", "per_lane"):
        _, e = dispatch.select(p, A100, forced="sm80_igemm")
        assert "per_lane (forced)" in e.detail and "sm80_subpath='per_lane'" in str(e), str(e)
        with cuconv.overrides(sm80_subpath=None):
            assert "pointwise" in dispatch.select(p, A100, forced="sm80_igemm")[1].detail
    with cuconv_env("CUCONV_SM80_SUBPATH", "auto"):
        assert env_overrides().sm80_subpath is None
    with cuconv_env("CUCONV_SM80_SUBPATH", "fastest"):
        with pytest.raises(ValueError, match="CUCONV_SM80_SUBPATH") as err:
            env_overrides()
        assert "'fastest'" in str(err.value)


def test_weight_gradient_splits_count_the_partial_sums_that_leave_l2():
    """The weight gradient's split count (``choose_splits``, shared by both GEMM kernels) weighs the splits'
    fp32 partial sums past what L2 holds: a 512 x 4608 gradient over 64x64 pixels (9.4 MB of sums per split)
    in 128 x 128 tiles takes 2 splits where the wave model alone takes 4; a small gradient over many pixels
    keeps its many splits; the splits always cover the reduction."""
    from cuconv.backends.sm80 import wgrad as w80
    from cuconv.backends.sm90 import wgrad as w90

    def splits(p, in_l2):
        saved = w80.PARTIALS_IN_L2
        w80.PARTIALS_IN_L2 = in_l2
        try:
            return w80.choose_splits(p, w90.variant(p, bm=128, bn=128), 132)
        finally:
            w80.PARTIALS_IN_L2 = saved

    vae = _problem(512, 512, (3, 3), 1, hw=(64, 64), batch=1)
    assert splits(vae, 10 ** 15).count == 4 and splits(vae, w80.PARTIALS_IN_L2).count == 2
    small = _problem(64, 64, (3, 3), 1, hw=(56, 56), batch=32)
    assert splits(small, w80.PARTIALS_IN_L2).count == splits(small, 10 ** 15).count > 16
    for p in (vae, small, _problem(256, 256, (3, 3), 1, hw=(256, 256), batch=1)):
        s = splits(p, w80.PARTIALS_IN_L2)
        assert s.count * s.length >= p.gemm_m > (s.count - 1) * s.length
