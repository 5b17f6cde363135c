"""The Hopper tile policy (cuconv/backends/sm90/tiles.py) and the sm90 kernels' plans, on the CPU.

The rules are pinned through the pure :func:`choose_tile_config` (every keyword left None is
automatic) and :func:`tile_config` (a problem under an :class:`~cuconv.Overrides`); the kernels'
plans are asked on a model Hopper (:data:`geometry.H100`): their declines carry the reason, their
descriptions (``cuconv.explain``) name the tile and why halo tiles are or are not taken. Forcing
goes through ``cuconv.overrides(...)`` and the ``CUCONV_SM90_*`` environment (read once per process,
re-read by the ``cuconv_env`` fixture). Halo and ping-pong rules: tests/test_sm90_halo_policy.py.
"""

from __future__ import annotations

import pytest

import cuconv
from cuconv import dispatch
from cuconv.backends.sm90 import Sm90TmaKernel
from cuconv.backends.sm90.tiles import choose_tile_config, k_iters, last_k16, tile_config
from cuconv.backends.sm90.variants import kernel_name
from cuconv.device import DeviceInfo
from cuconv.overrides import Overrides, current_overrides, env_overrides
from cuconv.plan import Declined

from geometry import H100, problem2d

#: GEMM 1000 x 64 with one reduction step: a 1x1 conv, so no halo tiles.
P1000 = problem2d(N=1, H=10, W=100, C=64, K=64, R=1, S=1, padding=0)
#: ResNet's 1x1 64 -> 64 at 56x56, N = 64 (GEMM 200704 x 64): 256-row tiles when automatic.
RESNET_1X1 = problem2d(N=64, H=56, W=56, C=64, K=64, R=1, S=1, padding=0)
#: 1x1 1024 -> 256 at 14x14, N = 64 (GEMM 12544 x 256, 16 reduction steps).
BOTTLENECK = problem2d(N=64, H=14, W=14, C=1024, K=256, R=1, S=1, padding=0)


def test_problem_views_match_the_gemms_used_below():
    assert (P1000.gemm_m, P1000.gemm_n, k_iters(P1000)) == (1000, 64, 1)
    assert (RESNET_1X1.gemm_m, RESNET_1X1.gemm_n) == (64 * 56 * 56, 64)
    assert (BOTTLENECK.gemm_m, BOTTLENECK.gemm_n, k_iters(BOTTLENECK)) == (64 * 14 * 14, 256, 16)


# ----------------------------------------------------------------------------------------- plans
@pytest.mark.parametrize("kwargs,device,reason", [
    (dict(), DeviceInfo(kind="cuda", cc=(8, 0), arch="sm_80", name="A100"), "needs a Hopper GPU"),
    (dict(dtype="float32"), H100, "dtype float32"),
    (dict(groups=2), H100, "groups=2"),
    (dict(C=12, K=16), H100, "C=12 is not a multiple of 8"),
    (dict(C=16, K=20), H100, "K=20 is not a multiple of 8"),
    (dict(H=400, padding=200), H100, "corner"),
    (dict(H=600, W=600, R=3, S=3, dilation=(130, 1), padding=((0, 200), (1, 1))), H100, "offsets"),
    (dict(H=50, W=50, R=1, S=1, stride=9, padding=0), H100, "stride"),
])
def test_plan_declines_with_reason(kwargs, device, reason):
    answer = Sm90TmaKernel().plan(problem2d(**kwargs), device, Overrides())
    assert isinstance(answer, Declined) and not answer and reason in answer.reason, answer


def test_plan_accepts_and_dispatch_prefers_it():
    p = problem2d(C=72, K=40, stride=2, dilation=2, padding=((0, 3), (2, 1)))
    plan = Sm90TmaKernel().plan(p, H100, Overrides())
    assert plan and "4-D boxes" in plan.reason, plan
    assert plan.cfg == tile_config(p, H100.sm_count, Overrides())
    chosen, e = dispatch.select(p, H100)
    assert chosen.kernel.name == "sm90_tma" and "128x64x64" in e.detail
    assert e.detail == chosen.describe() and e.detail.startswith(kernel_name(chosen.cfg, False))
    chosen, e = dispatch.select(problem2d(groups=2), H100)
    assert chosen.kernel.name != "sm90_tma" and "groups=2" in e.declined["sm90_tma"]


# ----------------------------------------------------------------------------------------- tile rules
@pytest.mark.parametrize("m,n,sms", [(1, 8, 132), (64 * 56 * 56, 64, 132), (4 * 64 * 64, 512, 132),
                                     (8 * 64 * 64, 320, 132), (64 * 196, 256, 132), (10 ** 7, 4096, 132)])
def test_tile_heuristic(m, n, sms):
    cfg = choose_tile_config(m, n, sms)
    assert cfg.block_n in (64, 96, 128, 160, 192, 256) and cfg.block_m in (128, 192, 256) and cfg.stages >= 3
    assert cfg.block_m == 128 or (cfg.block_n in (64, 96) and cfg.cluster == 1 and cfg.consumers == 4) or (
        cfg.block_m == 192 and cfg.block_n <= 192 and cfg.cluster == 1 and cfg.consumers == 3)
    assert cfg.n_tiles * cfg.block_n >= n and (cfg.n_tiles - 1) * cfg.block_n < n
    assert cfg.cluster in (1, 2) and cfg.grid % cfg.cluster == 0
    assert cfg.cluster == 1 or cfg.m_tiles >= 2, "a pair needs two row tiles"
    assert cfg.num_units * cfg.cluster >= cfg.num_tiles > (cfg.num_units - cfg.n_tiles) * cfg.cluster
    assert 1 <= cfg.grid <= min(sms, cfg.cluster * cfg.num_units)
    assert cfg.smem_bytes(False) <= 227 * 1024
    with_c = choose_tile_config(m, n, sms, loads_residual=True)  # a residual ring costs ring slots at BM 256
    assert with_c.smem_bytes(True) <= 227 * 1024 and with_c.stages >= 3
    assert choose_tile_config(m, n, sms) == cfg  # pure
    single = choose_tile_config(m, n, sms, cluster=1)
    assert single.cluster == 1 and single.grid == min(sms, single.num_tiles)
    pair = choose_tile_config(m, n, sms, cluster=2)
    assert pair.cluster == (2 if pair.m_tiles >= 2 else 1) and pair.grid % pair.cluster == 0
    assert pair.num_units * pair.cluster >= pair.num_tiles and pair.grid <= sms


@pytest.mark.parametrize("m,n,bn", [
    (8 * 64 * 64, 320, 160),      # 2 x 160 covers N = 320 exactly (3 x 128 pads 64 columns)
    (8 * 16 * 16, 1280, 160),     # 16 x 8 = 128 tiles: one wave on 132 SMs (BN = 128: 160 tiles, two)
    (4 * 120 * 208, 192, 192),    # no padded columns (BN = 256 would waste a quarter)
    (4 * 240 * 416, 96, 96),
    (4 * 128 * 128, 512, 256),    # large N, many tiles: the widest tile
    (64 * 56 * 56, 64, 64),
    (64 * 14 * 14, 256, 128),     # near tie in the model: the measured rule's choice stays
])
def test_tile_width_choice(m, n, bn):
    assert choose_tile_config(m, n, 132, cluster=1).block_n == bn


@pytest.mark.parametrize("m,n,bn16,bn_tf32", [
    (32 * 56 * 56, 256, 256, 128),    # ResNet-50 1x1 64->256: tf32 products favour the finer waves
    (32 * 14 * 14, 1024, 128, 128),   # 1x1 256->1024: 196 tiles of 256 are 1.5 waves, 392 of 128 three
    (32 * 7 * 7, 512, 96, 128),       # 3x3 512 at 7x7: 96 pads N, 128 does not
    (32 * 56 * 56, 64, 64, 64),
    (32 * 56 * 56, 144, 160, 160),    # 160 pads 144 less than 128 does (one tile instead of two)
])
def test_tf32_tile_width(m, n, bn16, bn_tf32):
    """tf32 (docs/tuning.md T-tf32-bn): BN at most 128; 96 / 160 / 192 only where they pad N less. 16-bit
    products take 128 over the rule's 256 where the finer waves pay (docs/tuning.md T-bn-256-waves)."""
    assert choose_tile_config(m, n, 132, cluster=1).block_n == bn16
    assert choose_tile_config(m, n, 132, cluster=1, tf32=True).block_n == bn_tf32


@pytest.mark.parametrize("m,n,bm,stages", [
    (64 * 56 * 56, 64, 256, 5),       # ResNet 64->64 at 56x56: 784 tiles of 256 rows, 6 waves (12 of 128)
    (4 * 240 * 416, 96, 256, 5),      # conv3d 96->96 at 240x416: B's share of L2->SM traffic halved
    (140 * 256, 64, 128, 8),          # 140 tiles of 256 = 2 waves; 280 of 128 = 3: the tall tile costs a wave
    (64 * 56 * 56, 128, 128, 6),      # BN = 128: too wide for four 112-register consumer warpgroups
    (2 * 512 * 512, 128, 192, 5),     # ... but 2731 tiles of 192 rows take fewer tile-times (21 waves vs 32)
    (1000, 64, 128, 8),               # one tile either way: keep two consumer warpgroups
    (4 * 64 * 68, 64, 192, 7),        # 68 tall tiles would leave half the SMs idle; 91 of 192 rows: one wave
    (16 * 160 * 160, 64, 256, 5),     # YOLOv8s 1x1 64->64 at 160x160: 13 waves of 256 against 25 of 128 (slack)
    (16 * 160 * 160, 32, 256, 5),     # ... and its 3x3 32->32 on im2col boxes
    (265 * 256, 64, 192, 7),          # 3 waves of 256 against 5 of 128: past the 1/8 slack (192: 3 waves)
])
def test_tall_tile_rule(m, n, bm, stages):
    cfg = choose_tile_config(m, n, 132, cluster=1)
    assert (cfg.block_m, cfg.stages, cfg.consumers, cfg.threads) == (bm, stages, bm // 64, 128 * (1 + bm // 64))
    assert cfg.m_tiles == -(-m // bm)
    if bm == 256:
        res = choose_tile_config(m, n, 132, cluster=1, loads_residual=True)
        assert res.block_m == 128, "a residual keeps 128-row tiles (the 256-row C ring leaves 3-4 slots)"
        res = choose_tile_config(m, n, 132, cluster=1, loads_residual=True, block_m=256)
        assert res.block_m == 256 and res.stages == {64: 4, 96: 3}[cfg.block_n] and res.smem_bytes(True) <= 227 * 1024
        assert choose_tile_config(m, n, 132, cluster=2).block_m == 128, "no 256-row tiles in CTA pairs"
        assert choose_tile_config(m, n, 132, cluster=1, block_m=128).block_m == 128


@pytest.mark.parametrize("m,n,k_iters_,res,bm,stages", [
    (64 * 14 * 14, 256, 16, False, 192, 5),   # 1x1 1024->256: 132 tiles of 192 (one wave), 196 of 128 (two)
    (64 * 14 * 14, 256, 36, False, 192, 5),   # 3x3 256->256 at 14x14: the same tiles
    (64 * 14 * 14, 256, 16, True, 192, 4),    # ... with a residual (C ring of 192-row chunks: 4 slots)
    (64 * 28 * 28, 128, 18, False, 128, 6),   # 262 tiles of 192 = 2 waves vs 392 of 128 = 3: a tie keeps 128
    (64 * 7 * 7, 512, 72, False, 128, 6),     # one wave either way: 1.5 times the work per tile would cost
    (64 * 28 * 28, 512, 16, False, 128, 4),   # BN = 256: too wide for 160-register consumers
])
def test_mid_tile_rule(m, n, k_iters_, res, bm, stages):
    cfg = choose_tile_config(m, n, 132, cluster=1, k_iters=k_iters_, loads_residual=res)
    assert (cfg.block_m, cfg.stages, cfg.consumers, cfg.threads) == (bm, stages, bm // 64, 128 * (1 + bm // 64))
    assert cfg.m_tiles == -(-m // bm) and cfg.smem_bytes(res) <= 227 * 1024
    if bm == 192:
        assert cfg.split_tiles == 0 and kernel_name(cfg, res).startswith("conv2d_fprop_sm90_tma_192x")
        assert choose_tile_config(m, n, 132, cluster=2, k_iters=k_iters_).block_m == 128, "no 192-row tiles in pairs"
        assert choose_tile_config(m, n, 132, cluster=1, k_iters=k_iters_, block_m=128).block_m == 128


@pytest.mark.parametrize("c,steps", [(8, 1), (16, 1), (24, 2), (64, 4), (72, 1), (96, 2), (128, 4), (200, 1), (320, 4)])
def test_last_channel_block_steps(c, steps):
    """The kernel issues only the k16 steps of the last channel block that hold real channels."""
    assert last_k16(c) == steps


def test_tall_tile_forced(cuconv_env):
    assert choose_tile_config(1000, 64, 132, cluster=1, block_m=256).block_m == 256
    assert choose_tile_config(1000, 64, 132, cluster=1, block_m=256).m_tiles == 4
    assert choose_tile_config(1000, 128, 132, cluster=1, block_m=256, block_n=128).block_m == 128  # too wide
    assert tile_config(P1000, 132, Overrides()).block_m == 128
    with cuconv.overrides(block_m=256) as outer:
        assert outer == Overrides(block_m=256) and current_overrides() == outer
        cfg = tile_config(P1000, 132, current_overrides())
        assert (cfg.block_m, cfg.m_tiles) == (256, 4)
        with cuconv.overrides(block_n=128) as wide:
            assert tile_config(P1000, 132, wide).block_m == 128  # too wide for 256 rows
        with cuconv.overrides(block_n=96) as inner:  # nested blocks keep the outer block_m
            assert inner == Overrides(block_m=256, block_n=96)
            assert tile_config(P1000, 132, inner).block_m == 256
    assert current_overrides() == env_overrides()
    with pytest.raises(ValueError, match="block_m"):
        with cuconv.overrides(block_m=320):
            pass
    with pytest.raises(ValueError, match="block_m"):
        choose_tile_config(1000, 64, 132, block_m=96)
    assert choose_tile_config(1000, 64, 132, block_m=64).block_m == 128, "64 rows only in ping-pong halo tiles"
    with cuconv_env("CUCONV_SM90_BM", "512"):
        with pytest.raises(ValueError, match="CUCONV_SM90_BM"):
            current_overrides()
        with pytest.raises(ValueError, match="CUCONV_SM90_BM"):
            dispatch.select(P1000, H100)
    assert tile_config(RESNET_1X1, 132, Overrides()).block_m == 256
    with cuconv_env("CUCONV_SM90_BM", "128"):
        assert env_overrides() == Overrides(block_m=128)
        assert tile_config(RESNET_1X1, 132, current_overrides()).block_m == 128
        _, e = dispatch.select(RESNET_1X1, H100)
        assert "_128x64x64" in e.detail and "block_m=128" in str(e), str(e)


def test_tile_width_forced(cuconv_env):
    assert choose_tile_config(1000, 64, 132, cluster=1, block_n=192).block_n == 192
    with cuconv.overrides(block_n=192) as o:
        assert tile_config(P1000, 132, o).block_n == 192
        with cuconv.overrides(block_n=96) as inner:  # the innermost block wins
            assert tile_config(P1000, 132, inner).block_n == 96
        with cuconv.overrides(cluster=2) as pair:  # ... and keeps what it does not set
            assert pair == Overrides(block_n=192, cluster=2)
            assert tile_config(P1000, 132, pair) == choose_tile_config(1000, 64, 132, 2, 192, k_iters=1)
    assert choose_tile_config(1000, 64, 132, cluster=1).block_n == 64
    assert tile_config(P1000, 132, current_overrides()).block_n == 64
    with pytest.raises(ValueError, match="block_n"):
        with cuconv.overrides(block_n=100):
            pass
    with pytest.raises(ValueError, match="block_n"):
        choose_tile_config(1000, 64, 132, block_n=100)
    # the environment's defaults, read once per process
    with cuconv_env("CUCONV_SM90_BN", "100"):
        with pytest.raises(ValueError, match="CUCONV_SM90_BN"):
            current_overrides()
    with cuconv_env("CUCONV_SM90_BN", "160"):
        assert tile_config(P1000, 132, current_overrides()).block_n == 160
        with cuconv.overrides(block_n=None) as auto:  # None makes a field automatic again
            assert auto.block_n is None and tile_config(P1000, 132, auto).block_n == 64


@pytest.mark.parametrize("m,n,k_iters_,split,bn,units,grid", [
    (64 * 14 * 14, 256, 16, 64, 128, 196 + 64, 132),  # 1x1 1024->256: 196 tiles = 132 + a tail of 64
    (64 * 14 * 14, 256, 36, 64, 128, 196 + 64, 132),  # 3x3 256->256: the same tiles, longer reduction
    (64 * 7 * 7, 256, 36, 0, 96, 75, 75),              # no full wave before the tail: not split
    (64 * 7 * 7, 512, 72, 0, 128, 100, 100),           # 512->512 at 7x7: 100 tiles, more than half the SMs
    (64 * 14 * 14, 256, 4, 0, 128, 196, 132),          # too short a reduction to halve
    (64 * 28 * 28, 128, 18, 0, 128, 392, 132),         # tail of 128 tiles: splitting would need 256 SMs
    (4 * 64 * 64, 512, 72, 0, 256, 256, 132),          # tail of 124 tiles
    (132 * 128, 64, 9, 0, 64, 132, 132),               # exactly one full wave: no tail
])
def test_split_tail_rule(m, n, k_iters_, split, bn, units, grid):
    """The split rule on 128-row tiles (the first two shapes run 132 tiles of 192 rows when left
    automatic, see test_mid_tile_rule)."""
    cfg = choose_tile_config(m, n, 132, cluster=1, k_iters=k_iters_, block_m=128)
    assert (cfg.block_n, cfg.split_tiles, cfg.num_units, cfg.grid) == (bn, split, units, grid)
    assert cfg.dp_tiles == cfg.num_tiles - split and cfg.split_ways == 2
    if split:
        assert cfg.split_steps == (k_iters_ // 2, k_iters_ - k_iters_ // 2)
    # the split halves are the last 2 * split units, after every whole tile
    assert cfg.dp_tiles + 2 * cfg.split_tiles == cfg.num_units
    assert choose_tile_config(m, n, 132, cluster=1, k_iters=k_iters_, block_m=128, split=False).split_tiles == 0
    assert choose_tile_config(m, n, 132, cluster=2, k_iters=k_iters_).split_tiles == 0, "no split with CTA pairs"


@pytest.mark.parametrize("m,n,k_iters_,ways,want", [
    (2 * 8 * 8, 1280, 180, 8, 8),      # UNet 3x3 1280 at 8x8, N=2: 10 tiles of 128 x 128 -> 80 units
    (2 * 8 * 8, 1280, 180, 16, 13),    # 16 asked, 132 // 10 = 13 fit
    (1 * 7 * 7, 512, 72, 4, 4),        # ResNet 7x7 at batch 1: 4 tiles
    (1 * 7 * 7, 512, 3, 16, 3),        # at most one part per reduction step
    (64 * 14 * 14, 256, 16, 4, 0),     # 196 tiles: no room for a second part (the tail rule applies)
])
def test_small_problem_split_ways(m, n, k_iters_, ways, want):
    """overrides(split_ways=N): every tile of a small problem cut into N parts (fewer where fewer fit),
    each part its own unit on its own SM, all in one round."""
    cfg = choose_tile_config(m, n, 132, cluster=1, k_iters=k_iters_, block_m=128, block_n=128, split_ways=ways)
    if not want:
        assert cfg.split_ways == 2 and cfg.split_tiles in (0, cfg.num_tiles % 132)
        return
    tiles = cfg.num_tiles
    assert (cfg.split_tiles, cfg.split_ways, cfg.dp_tiles) == (tiles, want, 0)
    assert cfg.num_units == tiles * want == cfg.grid and cfg.grid <= 132 and not cfg.persistent
    steps = cfg.split_steps
    assert len(steps) == want and sum(steps) == k_iters_ and min(steps) >= 1 and max(steps) - min(steps) <= 1
    # the scheduler's k ranges (scheduler.cuh: part * k_iters / ways) tile [0, k_iters) in part order
    bounds = [j * k_iters_ // want for j in range(want + 1)]
    assert [b - a for a, b in zip(bounds[:-1], bounds[1:])] == list(steps)
    assert choose_tile_config(m, n, 132, cluster=1, k_iters=k_iters_, block_m=128, split_ways=ways,
                              split=False).split_tiles == 0
    paired = choose_tile_config(m, n, 132, cluster=2, k_iters=k_iters_, split_ways=ways)
    assert paired.cluster == 1 or paired.split_ways == 2  # CTA pairs (where two row tiles allow them) never split


@pytest.mark.parametrize("m,n,bn,k_iters_,want", [
    (2 * 8 * 8, 1280, 96, 360, 9),     # UNet 3x3 2560->1280 at 8x8: 14 tiles, 132 // 14 = 9 parts of 40 steps
    (2 * 16 * 16, 640, 96, 90, 4),     # UNet 3x3 640 at 16x16: 28 tiles -> 4 parts
    (2 * 16 * 16, 1280, 96, 180, 2),   # 56 tiles: room for two parts only
    (2 * 8 * 8, 1280, 96, 40, 4),      # 40 steps: at least 10 per part
    (16 * 20 * 20, 64, 64, 72, 2),     # YOLO head 3x3 64->64 at 20x20: 50 tiles
    (2 * 8 * 8, 1280, 96, 20, 0),      # a 1x1 1280->1280: too short a reduction (splitting costs more)
    (2 * 32 * 32, 320, 96, 45, 2),     # UNet 3x3 s2 320 at 64x64: 64 tiles, two parts
    (2 * 32 * 32, 320, 96, 31, 0),     # the same with 31 steps
    (64 * 7 * 7, 512, 128, 72, 0),     # 100 tiles: more than half of the SMs busy
])
def test_small_problem_split_automatic(m, n, bn, k_iters_, want):
    """The automatic split of small problems (docs/tuning.md T-split-small): every tile in as many parts
    as have SMs of their own, at most 16, each of at least 10 reduction steps, for tiles of at least 32
    steps; never with split=False or CTA pairs."""
    cfg = choose_tile_config(m, n, 132, cluster=1, k_iters=k_iters_, block_m=128, block_n=bn)
    if want:
        assert (cfg.split_tiles, cfg.split_ways) == (cfg.num_tiles, want)
        assert cfg.num_units == cfg.grid == cfg.num_tiles * want <= 132 and min(cfg.split_steps) >= 10
    else:
        assert cfg.split_tiles == 0 and cfg.num_units == cfg.num_tiles  # (no full wave: no split tail either)
    off = choose_tile_config(m, n, 132, cluster=1, k_iters=k_iters_, block_m=128, block_n=bn, split=False)
    assert off.split_tiles == 0 and off.num_units == off.num_tiles


def test_split_ways_override_and_env(cuconv_env):
    with cuconv.overrides(split_ways=4) as o:
        assert o.split_ways == 4
        assert "split_ways=4" in o.describe()
    for bad in (1, 17, "4", True):
        with pytest.raises(ValueError, match="split_ways"):
            with cuconv.overrides(split_ways=bad):
                pass
    with cuconv_env("CUCONV_SM90_SPLIT_WAYS", "6"):
        assert current_overrides().split_ways == 6
    with cuconv_env("CUCONV_SM90_SPLIT_WAYS", "40"):
        with pytest.raises(ValueError, match="CUCONV_SM90_SPLIT_WAYS"):
            current_overrides()


def test_split_tail_forced_and_env(cuconv_env):
    # forced: even a 2-step reduction is halved (1 + 1), and a problem with no full wave, but never
    # past what the SMs take at once
    assert choose_tile_config(64 * 14 * 14, 256, 132, cluster=1, k_iters=2, split=True, block_m=128).split_tiles == 64
    assert choose_tile_config(64 * 7 * 7, 256, 132, cluster=1, k_iters=36, block_n=128, split=True).split_tiles == 50
    assert choose_tile_config(64 * 14 * 14, 256, 132, cluster=1, k_iters=1, split=True).split_tiles == 0
    assert choose_tile_config(64 * 28 * 28, 128, 132, cluster=1, k_iters=18, split=True).split_tiles == 0
    assert choose_tile_config(64 * 14 * 14, 256, 132, cluster=1, k_iters=16, split=False).split_tiles == 0
    with cuconv.overrides(block_m=128) as short:
        assert tile_config(BOTTLENECK, 132, short).split_tiles == 64  # automatic on 128-row tiles
        with cuconv.overrides(split=False) as off:
            assert tile_config(BOTTLENECK, 132, off).split_tiles == 0
            with cuconv.overrides(block_n=64) as nested:  # nested blocks keep the outer split setting
                assert nested.split is False and tile_config(BOTTLENECK, 132, nested).split_tiles == 0
    with pytest.raises(ValueError, match="split"):
        with cuconv.overrides(split="yes"):
            pass
    with cuconv_env("CUCONV_SM90_SPLIT", "maybe"):
        with pytest.raises(ValueError, match="CUCONV_SM90_SPLIT"):
            current_overrides()
    with cuconv_env("CUCONV_SM90_SPLIT", "0"):
        assert current_overrides() == Overrides(split=False)
        with cuconv.overrides(block_m=128) as o:
            assert o == Overrides(split=False, block_m=128) and tile_config(BOTTLENECK, 132, o).split_tiles == 0


@pytest.mark.parametrize("name,value,field,want", [
    ("CUCONV_SM90_BN", "auto", "block_n", None), ("CUCONV_SM90_BN", "96", "block_n", 96),
    ("CUCONV_SM90_BM", "192", "block_m", 192), ("CUCONV_SM90_CLUSTER", "2", "cluster", 2),
    ("CUCONV_SM90_CLUSTER", "1", "cluster", None), ("CUCONV_SM90_SPLIT", "1", "split", True),
    ("CUCONV_SM90_HALO", "0", "halo", False), ("CUCONV_SM90_HALO", "auto", "halo", None),
    ("CUCONV_SM90_PINGPONG", "1", "pingpong", True), ("CUCONV_SM90_PINGPONG", "", "pingpong", None),
])
def test_env_defaults(cuconv_env, name, value, field, want):
    with cuconv_env(name, value):
        assert getattr(env_overrides(), field) == want
        assert getattr(current_overrides(), field) == want
        with cuconv.overrides(**{field: None}) as o:  # a block makes it automatic again
            assert getattr(o, field) is None


@pytest.mark.parametrize("name,value", [("CUCONV_SM90_CLUSTER", "4"), ("CUCONV_SM90_CLUSTER", "two"),
                                        ("CUCONV_SM90_PINGPONG", "yes"), ("CUCONV_SM90_BM", "64x")])
def test_env_rejects_bad_values(cuconv_env, name, value):
    with cuconv_env(name, value):
        with pytest.raises(ValueError, match=name) as err:
            env_overrides()
        assert repr(value) in str(err.value)


@pytest.mark.parametrize("m,n,k_iters_,want", [
    (32 * 7 * 7, 512, 72, (128, 2)),     # ResNet-50 layer4 3x3 512 at 7x7: 78 tiles of 96 -> 52 of 128 in 2 parts
    (16 * 20 * 20, 128, 72, (128, 2)),   # YOLOv8s head 3x3 512->128 at 20x20: 100 tiles of 96 -> 50 of 128 in 2
    (2 * 32 * 32, 640, 270, (160, 2)),   # UNet 3x3 1920->640 at 32x32: 112 tiles of 96 -> 64 of 160 in 2
    (1 * 32 * 32, 1280, 180, (160, 2)),  # UNet 3x3 1280 at 32x32, batch 1: 112 tiles of 96 -> 64 of 160
    (32 * 14 * 14, 256, 36, None),       # ResNet-50 layer3 3x3 256 at 14x14: 98 tiles, 36 steps
    (32 * 7 * 7, 512, 32, None),         # ResNet-50 layer4 1x1 2048->512: 32 steps (the hand-over costs more)
    (2 * 32 * 32, 640, 45, None),        # UNet 3x3 320->640 at 32x32: 45 steps
    (64 * 56 * 56, 256, 72, None),       # many waves
])
def test_partial_wave_split_wider(m, n, k_iters_, want):
    """Tiles that fill one partial wave with a long reduction become wider tiles in parts where the model
    says so (docs/tuning.md T-split-wider); only with the width, height and split left automatic."""
    cfg = choose_tile_config(m, n, 132, k_iters=k_iters_)
    if want is None:
        assert "T-split-wider" not in cfg.note
        return
    assert (cfg.block_n, cfg.split_ways, cfg.block_m) == (*want, 128) and "T-split-wider" in cfg.note
    assert cfg.split_tiles == cfg.num_tiles and cfg.num_units == cfg.grid <= 132 and min(cfg.split_steps) >= 10
    for forced in (dict(block_n=96), dict(block_m=128), dict(split=False), dict(split_ways=2), dict(tf32=True)):
        assert "T-split-wider" not in choose_tile_config(m, n, 132, k_iters=k_iters_, **forced).note, forced


@pytest.mark.parametrize("m,n,k_iters_,want", [
    (2 * 16 * 16, 1280, 360, (128, 3)),  # UNet 3x3 2560->1280 at 16x16: 56 tiles of 96 in 2 -> 40 of 128 in 3
    (2 * 16 * 16, 1280, 90, (128, 3)),   # UNet 3x3 640->1280 at 16x16
    (2 * 16 * 16, 640, 90, None),        # UNet 3x3 s2 640 at 32x32: 28 tiles of 96 in 4 parts stay
    (2 * 8 * 8, 1280, 180, None),        # UNet 3x3 1280 at 8x8: 14 tiles of 96 in 9 parts stay
    (2 * 16 * 16, 1280, 40, None),       # a 1x1 2560->1280: too short a reduction
])
def test_small_problem_split_wider(m, n, k_iters_, want):
    """A small problem's split (every part on its own SM) takes 128- or 160-wide tiles in three parts where
    the model says a part is at least 12% faster (docs/tuning.md T-split-wider)."""
    cfg = choose_tile_config(m, n, 132, k_iters=k_iters_)
    if want is None:
        assert "T-split-wider" not in cfg.note
        return
    assert (cfg.block_n, cfg.split_ways) == want and "T-split-wider" in cfg.note
    assert cfg.split_tiles == cfg.num_tiles and cfg.num_units == cfg.grid <= 132
    assert "T-split-wider" not in choose_tile_config(m, n, 132, k_iters=k_iters_, block_n=96).note


@pytest.mark.parametrize("m,n,k_iters_,want", [
    (8 * 33 * 33, 256, 288, (192, 128)),   # DeepLabv3's ASPP 3x3 2048 -> 256 at 33x33, N = 8: 207 tiles of 128 x 96
    (4 * 33 * 33, 256, 288, (128, 256)),   # the same at N = 4
    (8 * 33 * 33, 256, 32, None),          # its 1x1 2048 -> 256: a short reduction
    (8 * 65 * 65, 256, 288, None),         # 265 tiles of 128 x 256 already
    (2 * 32 * 32, 640, 270, None),         # UNet 3x3 1920 -> 640 at 32x32: the wider tiles in two parts stay
    (32 * 7 * 7, 512, 72, None),           # ResNet-50 layer4 3x3: 72 steps
])
def test_long_reduction_tiles(m, n, k_iters_, want):
    """Over long reductions the tile with the least modelled time of the busiest CTA's wgmmas and the L2
    bytes of all tiles replaces the width rule's (docs/tuning.md T-long-k); automatic choices only."""
    cfg = choose_tile_config(m, n, 132, k_iters=k_iters_)
    if want is None:
        assert "T-long-k" not in cfg.note, cfg
        return
    assert (cfg.block_m, cfg.block_n) == want and "T-long-k" in cfg.note, cfg
    for forced in (dict(block_n=96), dict(block_m=128), dict(split=False), dict(split_ways=2), dict(tf32=True),
                   dict(cluster=2)):
        assert "T-long-k" not in choose_tile_config(m, n, 132, k_iters=k_iters_, **forced).note, forced
