"""The Hopper tile policy for halo tiles and ping-pong warpgroups (cuconv/backends/sm90/tiles.py), on the CPU.

Halo tiles (kernels_cu/sm90/halo_loader.cuh) serve H/W stride 1 and small filter reaches; the rule
that takes them, their heights and ring depths, the residual cases and the ping-pong tiles are
pinned through :func:`choose_tile_config` (``halo_geometry`` = (planes, P, Q, R*S)) and through the
plans and explanations of problems on a model Hopper. The im2col tile rules: tests/test_sm90_policy.py.
"""

from __future__ import annotations

import pytest

import cuconv
from cuconv import dispatch
from cuconv.backends.sm90 import tiles
from cuconv.backends.sm90.tiles import (choose_tile_config, halo_decline, halo_geometry, halo_why_not,
                                        pingpong_block_m, tile_config)
from cuconv.backends.sm90.variants import defines, kernel_name
from cuconv.backends.sm90.tiles import k_iters
from cuconv.overrides import Overrides, current_overrides

from geometry import H100, problem2d

#: 2 x 20 x 416, 64 -> 64, 3x3: 416 columns pad to 448 (7%), so halo tiles when automatic.
WIDE = problem2d(N=2, H=20, W=416, C=64, K=64)


@pytest.mark.parametrize("kwargs,reason", [
    (dict(stride=2), "stride"),
    (dict(stride=(1, 2)), "stride"),
    (dict(R=5, S=5, padding=2), "reach"),
    (dict(dilation=2, padding=2), "reach"),
])
def test_halo_declines_with_reason(kwargs, reason):
    p = problem2d(**kwargs)
    assert halo_geometry(p) is None and reason in halo_decline(p)
    assert reason in halo_why_not(p, Overrides())


@pytest.mark.parametrize("kwargs,taps", [(dict(), 9), (dict(R=1, S=3, padding=((0, 0), (1, 1))), 3),
                                         (dict(R=2, S=2, dilation=2), 4), (dict(R=1, S=1, padding=0), 1)])
def test_halo_geometry(kwargs, taps):
    p = problem2d(N=3, H=20, W=70, **kwargs)
    P, Q = p.out_spatial
    assert halo_decline(p) is None and halo_geometry(p) == (3, P, Q, taps)


@pytest.mark.parametrize("Q,taps,want", [
    (416, 9, True),    # 448 columns computed, 7.7% padding (conv3d 96->96 at 240x416)
    (56, 9, True),     # 14%: ResNet 3x3 64->64 at 56x56
    (64, 9, True), (512, 9, True),
    (208, 9, False),   # 23%: conv3d 192->192 at 120x208
    (104, 9, False),   # 23%: conv3d 384->384 at 60x104
    (28, 9, False), (7, 9, False),
    (512, 1, False),   # a 1x1 filter: nothing to share
])
def test_halo_rule(Q, taps, want):
    """Halo tiles where at most 1/8 of the padded columns are padding and there is more than one (r, s)
    tap (here with two channel blocks per tap, on 128 output channels)."""
    cfg = choose_tile_config(4 * 60 * Q, 128, 132, cluster=1, k_iters=2 * taps, halo_geometry=(4, 60, Q, taps))
    assert cfg.block_n > 64 and cfg.halo is want
    assert choose_tile_config(4 * 60 * Q, 128, 132, cluster=1, halo_geometry=(4, 60, Q, taps), halo=True).halo


@pytest.mark.parametrize("Q,k_iters_,want", [
    (160, 9, True),     # YOLOv8s 3x3 32->32 at 160x160: 17% padding, one channel block per tap
    (200, 9, True),     # 22%
    (160, 18, False),   # two channel blocks per tap: the 1/8 rule
    (80, 9, False),     # 37.5%
    (40, 9, False),
])
def test_halo_rule_one_channel_block(Q, k_iters_, want):
    """With one channel block per tap (C <= 64) halo tiles may pad up to 1/4 of the columns (T-halo-one-block;
    here on 128 output channels, where the 64-column tiles' bound does not apply)."""
    cfg = choose_tile_config(16 * 160 * Q, 128, 132, cluster=1, k_iters=k_iters_, halo_geometry=(16, 160, Q, 9))
    assert cfg.halo is want
    p = problem2d(N=16, H=Q, W=Q, C=64 * (k_iters_ // 9), K=128, R=3, S=3, padding=1)
    assert k_iters(p) == k_iters_ and tiles.tile_config(p, 132, Overrides()).halo is want
    if not want:
        assert "columns pad to" in halo_why_not(p, Overrides(), block_n=128)
        assert "1/8 of them padding" in halo_why_not(p, Overrides(), block_n=128) or k_iters_ == 9


@pytest.mark.parametrize("Q,k_iters_,want", [
    (80, 9, True),      # YOLOv8s 3x3 64->64 at 80x80: 37.5% padding
    (80, 18, True),     # YOLOv8s Detect 3x3 128->64 at 80x80
    (40, 36, True),     # YOLOv8s Detect 3x3 256->64 at 40x40: 37.5%
    (100, 18, True),    # 22%
    (20, 72, False),    # 69%: YOLOv8s Detect 3x3 512->64 at 20x20
    (28, 18, False),    # 56%
])
def test_halo_rule_narrow_n(Q, k_iters_, want):
    """Tiles 64 columns wide (N <= 64) take halo tiles with up to 3/8 of the columns padding, whatever the
    channel blocks per tap (T-halo-narrow-n); 128 output channels keep the other bounds."""
    geom = (16, Q, Q, 9)
    cfg = choose_tile_config(16 * Q * Q, 64, 132, cluster=1, k_iters=k_iters_, halo_geometry=geom)
    assert cfg.block_n == 64 and cfg.halo is want
    if Q in (80, 40):
        assert not choose_tile_config(16 * Q * Q, 128, 132, cluster=1, k_iters=k_iters_, halo_geometry=geom).halo
        assert not choose_tile_config(16 * Q * Q, 64, 132, cluster=1, k_iters=k_iters_, halo_geometry=geom,
                                      block_n=128).halo
    p = problem2d(N=16, H=Q, W=Q, C=64 * (k_iters_ // 9), K=64, R=3, S=3, padding=1)
    assert k_iters(p) == k_iters_ and tiles.tile_config(p, 132, Overrides()).halo is want
    if not want:
        assert "3/8 of them padding" in halo_why_not(p, Overrides(), block_n=64)


def test_narrow_n_halo_tiles_take_192_rows_on_ties():
    """Halo tiles 64 columns wide take 192 rows where they need as many tile-times as 128-row ones (their
    windows read 5 input rows per 3 output rows instead of 4 per 2); wider tiles keep 128 rows on ties."""
    geom = (16, 40, 40, 9)  # 320 tiles of 128 rows (3 waves), 224 of 192 (2 waves of 1.5 times the work)
    cfg = choose_tile_config(16 * 40 * 40, 64, 132, cluster=1, k_iters=36, halo_geometry=geom)
    assert cfg.halo and cfg.block_m == 192 and cfg.m_tiles == 16 * 14
    wide = choose_tile_config(16 * 40 * 40, 96, 132, cluster=1, k_iters=36, halo_geometry=geom, halo=True)
    assert wide.halo and wide.block_m == 128
    yolo = choose_tile_config(16 * 80 * 80, 64, 132, cluster=1, k_iters=9, halo_geometry=(16, 80, 80, 9))
    assert yolo.halo and yolo.block_m == 256, "640 tiles of 256 rows: 5 waves against 10 of 128"


def test_mid_tile_rule_on_halo_tiles():
    geom = (2, 512, 512, 9)  # 3x3 128->128 at 512x512, N = 2
    beta0 = choose_tile_config(2 * 512 * 512, 128, 132, cluster=1, k_iters=18, halo_geometry=geom, pingpong=False)
    assert beta0.halo and beta0.block_m == 256, "without a residual the 256-row cooperative halo tile wins"
    beta1 = choose_tile_config(2 * 512 * 512, 128, 132, cluster=1, k_iters=18, halo_geometry=geom, loads_residual=True)
    # 2 x 171 x 8 = 2736 tiles of 3 rows (21 waves) vs 4096 of 2 (32): 192 rows, 6 filter slots (exact-size windows)
    assert (beta1.halo, beta1.block_m, beta1.m_tiles, beta1.stages) == (True, 192, 2736, 6)
    vae = choose_tile_config(8 * 64 * 64, 320, 132, cluster=1, k_iters=45, halo_geometry=(8, 64, 64, 9),
                             loads_residual=True)
    assert vae.halo and vae.block_m == 128, "352 tiles of 192 (3 waves) vs 512 of 128 (4): not fewer tile-times"


def test_halo_tile_config(monkeypatch):
    geom = (4, 240, 416, 9)  # conv3d 96->96 at 240x416, D 6 -> 4 planes
    m = 4 * 240 * 416
    cfg = choose_tile_config(m, 96, 132, cluster=1, k_iters=54, halo_geometry=geom)
    assert cfg.halo and (cfg.block_m, cfg.block_n, cfg.split_tiles, cfg.cluster) == (256, 96, 0, 1)
    assert cfg.m_tiles == 4 * 60 * 7 and cfg.num_units == cfg.m_tiles and cfg.grid == 132
    assert cfg.stages == 8 and cfg.smem_bytes(False) <= 227 * 1024 and "_halo" in kernel_name(cfg, False, 3)
    res = choose_tile_config(m, 96, 132, cluster=1, k_iters=54, halo_geometry=geom, loads_residual=True)
    assert res.halo and res.stages >= 3 and res.smem_bytes(True) <= 227 * 1024
    assert kernel_name(res, True, 3).endswith("_halo_res")
    wide = choose_tile_config(2 * 512 * 512, 128, 132, cluster=1, halo_geometry=(2, 512, 512, 9), pingpong=False)
    assert wide.halo and wide.block_m == 256 and wide.m_tiles == 2 * 128 * 8, "BN 128: 256-row halo tiles"
    wide_res = choose_tile_config(2 * 512 * 512, 128, 132, cluster=1, halo_geometry=(2, 512, 512, 9),
                                  loads_residual=True)
    assert wide_res.halo and wide_res.block_m == 192, "with a residual BN 128 spills at 256 rows: 192"
    wider = choose_tile_config(4 * 64 * 64, 256, 132, cluster=1, halo_geometry=(4, 64, 64, 9), pingpong=False)
    assert wider.halo and wider.block_m == 128
    few = choose_tile_config(4 * 64, 64, 132, cluster=1, halo_geometry=(1, 4, 64, 9))
    assert few.halo and few.block_m == 128, "too few tiles for four row warpgroups"
    # declined by the rule, switched off, or CTA pairs: im2col boxes
    assert not choose_tile_config(m, 96, 132, cluster=1, halo_geometry=(4, 120, 208, 9)).halo
    assert not choose_tile_config(m, 96, 132, cluster=1, halo_geometry=geom, halo=False).halo
    pair = choose_tile_config(m, 96, 132, cluster=2, halo_geometry=geom)
    assert pair.halo and pair.cluster == 2 and pair.block_m == 128 and pair.num_units == -(-pair.m_tiles // 2)
    assert kernel_name(pair, False, 3).endswith("_c2_halo")
    # a residual at BN = 256 leaves 4 filter slots (the kernel's alignment slack is partial there):
    # halo tiles; beta = 0 gets 5
    big = (4, 64, 64, 9)
    plain = choose_tile_config(4 * 64 * 64, 512, 132, cluster=1, halo_geometry=big, pingpong=False)
    assert plain.halo and plain.block_n == 256 and plain.stages == 5 and plain.smem_bytes(False) == 227 * 1024
    with_res = choose_tile_config(4 * 64 * 64, 512, 132, cluster=1, halo_geometry=big, loads_residual=True)
    assert with_res.halo and (with_res.block_m, with_res.block_n, with_res.stages) == (128, 256, 4)
    assert with_res.smem_bytes(True) <= 227 * 1024
    # fewer slots than HALO_MIN_RES_STAGES: im2col tiles (unless forced)
    with monkeypatch.context() as mp:
        mp.setattr(tiles, "HALO_MIN_RES_STAGES", 5)
        assert not choose_tile_config(4 * 64 * 64, 512, 132, cluster=1, halo_geometry=big, loads_residual=True).halo
        assert choose_tile_config(4 * 64 * 64, 512, 132, cluster=1, halo_geometry=big, loads_residual=True,
                                  halo=True).halo
    assert choose_tile_config(m, 96, 132, cluster=1, halo_geometry=geom, loads_residual=True).halo
    # ... except N <= 256, where 192 x 128 halo tiles (five filter slots) take over
    vae = (4, 256, 256, 9)
    narrow = choose_tile_config(4 * 256 * 256, 256, 132, cluster=1, halo_geometry=vae, loads_residual=True)
    assert narrow.halo and (narrow.block_m, narrow.block_n) == (192, 128) and narrow.stages >= 4
    assert narrow.smem_bytes(True) <= 227 * 1024 and kernel_name(narrow, True, 2).endswith("_halo_res")
    assert "N <= 256" in narrow.note and "4 filter slots" in narrow.note
    beta0 = choose_tile_config(4 * 256 * 256, 256, 132, cluster=1, halo_geometry=vae)
    assert beta0.pingpong and beta0.block_n == 128, "beta = 0: 128 x 128 ping-pong tiles"
    assert choose_tile_config(4 * 256 * 256, 256, 132, cluster=1, halo_geometry=vae, pingpong=False).block_n == 256
    forced = choose_tile_config(4 * 256 * 256, 256, 132, cluster=1, halo_geometry=vae, loads_residual=True, block_n=256)
    assert forced.halo and (forced.block_m, forced.block_n) == (128, 256), "BN forced to 256: 128 x 256 halo tiles"
    assert choose_tile_config(4 * 256 * 256, 256, 132, cluster=2, halo_geometry=vae, loads_residual=True).block_n == 256
    assert not choose_tile_config(m, 96, 132, cluster=1, halo=True).halo, "no geometry: not eligible"
    assert choose_tile_config(m, 96, 132, cluster=1, halo_geometry=(4, 120, 208, 9), halo=True).halo


def test_halo_forced_and_env(cuconv_env):
    geom = (4, 120, 208, 9)
    assert not choose_tile_config(100000, 96, 132, cluster=1, halo_geometry=geom).halo
    assert choose_tile_config(100000, 96, 132, cluster=1, halo_geometry=geom, halo=True).halo
    narrow = problem2d(N=4, H=120, W=208, C=96, K=96)  # 208 columns pad to 256: im2col boxes when automatic
    assert halo_geometry(narrow) == geom and not tile_config(narrow, 132, Overrides()).halo
    with cuconv.overrides(halo=True) as on:
        assert tile_config(narrow, 132, on).halo
        with cuconv.overrides(block_n=192) as nested:  # nested blocks keep the outer halo setting
            assert nested.halo is True and tile_config(narrow, 132, nested).halo
    with pytest.raises(ValueError, match="halo"):
        with cuconv.overrides(halo="yes"):
            pass
    with cuconv_env("CUCONV_SM90_HALO", "maybe"):
        with pytest.raises(ValueError, match="CUCONV_SM90_HALO"):
            current_overrides()
    assert tile_config(WIDE, 132, Overrides()).halo
    with cuconv_env("CUCONV_SM90_HALO", "0"):
        assert not tile_config(WIDE, 132, current_overrides()).halo
        _, e = dispatch.select(WIDE, H100)
        assert "_halo" not in e.detail and "switched off" in e.detail, e.detail


def test_pingpong_tile_config():
    """Ping-pong halo tiles: each warpgroup holds a whole tile, so BM x BN / 128 <= 128 accumulators;
    only without a residual and without CTA pairs; automatic as 128 x 128 tiles where N % 128 == 0."""
    assert [pingpong_block_m(bn) for bn in (64, 96, 128, 160, 192, 256)] == [256, 128, 128, 64, 64, 64]
    c3d = (16, 64, 64, 9)  # conv3d N = 2, D = 10 -> 8 output planes, 64 x 64
    m = 16 * 64 * 64

    def pp(**kw):
        return choose_tile_config(m, 256, 132, cluster=kw.pop("cluster", 1), halo_geometry=c3d, pingpong=True, **kw)

    # the tile one warpgroup holds: a forced height that fits stays, one that does not gives the tallest
    assert (pp(block_n=128, block_m=128).block_m, pp(block_n=256, block_m=128).block_m) == (128, 64)
    assert pp(block_n=64, block_m=256).block_m == 256
    with pytest.raises(ValueError, match="block_m"):
        pp(block_n=64, block_m=96)
    cfg = pp(k_iters=108)
    assert cfg.pingpong and cfg.halo and (cfg.block_m, cfg.block_n, cfg.consumers, cfg.threads) == (64, 256, 2, 384)
    assert cfg.m_tiles == 16 * 64 and cfg.grid == 132 and kernel_name(cfg, False, 3).endswith("_halo_pp")
    assert defines(cfg, "bfloat16", False, 3)["SM90_PINGPONG"] == 1 and cfg.smem_bytes(False) <= 227 * 1024
    cfg = pp(k_iters=108, block_n=128)
    assert (cfg.block_m, cfg.block_n, cfg.m_tiles, cfg.n_tiles, cfg.stages) == (128, 128, 16 * 32, 2, 8)
    assert pp(block_n=128, block_m=256).block_m == 128  # too many accumulators for one warpgroup
    assert not pp(loads_residual=True).pingpong, "a residual keeps the cooperative warpgroups"
    assert not pp(cluster=2).pingpong
    assert not choose_tile_config(m, 256, 132, cluster=1, pingpong=True).pingpong, "not a halo problem"
    # 64-row tiles exist only in ping-pong
    assert choose_tile_config(m, 256, 132, cluster=1, halo_geometry=c3d, block_m=64, pingpong=False).block_m == 128
    # automatic: 128 x 128 ping-pong tiles where N is a multiple of 128, halo tiles, no residual, no pairs
    auto = choose_tile_config(m, 256, 132, cluster=1, k_iters=108, halo_geometry=c3d)
    assert auto.pingpong and (auto.block_m, auto.block_n, auto.m_tiles, auto.n_tiles) == (128, 128, 16 * 32, 2)
    assert choose_tile_config(2 * 512 * 512, 128, 132, cluster=1, halo_geometry=(2, 512, 512, 9)).pingpong
    assert not choose_tile_config(8 * 64 * 64, 320, 132, cluster=1, halo_geometry=(8, 64, 64, 9)).pingpong
    assert not choose_tile_config(4 * 240 * 416, 96, 132, cluster=1, halo_geometry=(4, 240, 416, 9)).pingpong
    assert not choose_tile_config(m, 256, 132, cluster=1, halo_geometry=c3d, loads_residual=True).pingpong
    assert not choose_tile_config(m, 256, 132, cluster=2, halo_geometry=c3d).pingpong
    assert not choose_tile_config(m, 256, 132, cluster=1, halo_geometry=c3d, block_n=256).pingpong, "BN forced"
    assert not choose_tile_config(m, 256, 132, cluster=1, halo_geometry=c3d, block_m=128).pingpong, "BM forced"
    assert not choose_tile_config(m, 256, 132, cluster=1, halo_geometry=c3d, pingpong=False).pingpong
    with pytest.raises(ValueError, match="pingpong"):
        with cuconv.overrides(pingpong="yes"):
            pass


def test_pingpong_through_overrides():
    """The same rules reached from a problem: ``cuconv.overrides(pingpong=...)`` and nested blocks."""
    p = problem2d(N=4, H=64, W=64, C=64, K=256)
    auto = tile_config(p, 132, Overrides())
    assert auto.pingpong and (auto.block_m, auto.block_n) == (128, 128)
    with cuconv.overrides(pingpong=True) as on:
        cfg = tile_config(p, 132, on)
        assert cfg.pingpong and cfg.block_n == 128
        with cuconv.overrides(block_n=256) as wide:
            cfg = tile_config(p, 132, wide)
            assert cfg.pingpong and (cfg.block_m, cfg.block_n) == (64, 256)
            with cuconv.overrides(block_m=64, pingpong=False) as off:  # 64-row tiles exist only in ping-pong
                cfg = tile_config(p, 132, off)
                assert not cfg.pingpong and cfg.block_m == 128
    with cuconv.overrides(pingpong=False) as off:
        assert not tile_config(p, 132, off).pingpong


def test_explain_names_halo_choice():
    _, e = dispatch.select(WIDE, H100)
    assert "_halo" in e.detail and "halo tiles" in e.detail
    _, e = dispatch.select(problem2d(N=2, H=20, W=208, C=128, K=128), H100)
    assert "_halo" not in e.detail and "pad to 256" in e.detail and "1/8 of them padding" in e.detail
    _, e = dispatch.select(problem2d(N=2, H=20, W=208, C=128, K=64), H100)  # 64 columns wide: up to 3/8
    assert "_halo" in e.detail
    _, e = dispatch.select(problem2d(N=2, H=20, W=28, C=128, K=64), H100)
    assert "_halo" not in e.detail and "3/8 of them padding" in e.detail
    _, e = dispatch.select(problem2d(N=2, H=20, W=208, C=64, K=64), H100)  # one channel block per tap
    assert "_halo" in e.detail
    _, e = dispatch.select(problem2d(N=2, H=20, W=416, C=64, K=64, stride=2), H100)
    assert "not halo tiles: H/W stride (2, 2)" in e.detail
    _, e = dispatch.select(problem2d(N=2, H=20, W=416, C=64, K=64, R=1, S=1, padding=0), H100)
    assert "_halo" not in e.detail and "one (r, s) tap" in e.detail
    _, e = dispatch.select(WIDE, H100, overrides=Overrides(halo=False))
    assert "_halo" not in e.detail and "switched off" in e.detail
