"""Hopper (sm_90a) conv2d / conv3d kernel: TMA im2col + warp-specialized wgmma, fused epilogue.

Kernel source: kernels_cu/hopper/conv_fprop_sm90.cu (its opening comment lists the warp roles
and barriers). Two registered kernels share it: ``sm90_tma`` (conv2d, 4-D im2col boxes) and
``conv3d_native`` (conv3d's "native" strategy: one implicit GEMM over NDHWC with 5-D im2col boxes,
the K-loop walking (t, r, s, channel block); any stride, dilation and padding, temporal included). This module decides whether the kernel serves a problem (:meth:`check`, with a
precise reason when it does not), picks a tile config (:func:`choose_tile_config`, a pure
function of the problem and the SM count), encodes the TMA descriptors (:mod:`cuconv.tensormap`)
and launches.

Data flow of one call::

    x (N, [D,] H, W, C)  --TMA im2col box per (tile, [t,] r, s, c-block)-->  smem ring  --wgmma-->  fp32 regs
    w (K, [T,] R, S, C)  --TMA tile box (K, taps, C) per (tile, tap, c-block)-->  smem ring
    residual (M, K)  --epilogue-load warp, TMA 64-channel chunks-->  smem C ring  (beta != 0 only)
    regs --act(alpha*acc + bias + beta*C), cast--> out (M, K)
    (split tail: the first half of a split tile's reduction --fp32--> workspace --> added by the second half)

Clusters (opt-in): with ``CUCONV_SM90_CLUSTER=2`` in the environment (read once per process) or
inside ``tile_settings(cluster=2)`` and at least two row tiles, the kernel runs as pairs of CTAs (``__cluster_dims__(2, 1, 1)``)
on vertically adjacent tiles; each CTA loads half of the shared filter tile and multicasts it to
both, cutting L2->SM traffic per ring slot from (BM + BN) to (BM + BN/2) rows of 64 channels. It
is correct (GPU-tested) but measured no faster than single CTAs on the H100 benchmark (the kernel
is not L2-bandwidth bound yet; see docs/bench/README.md), so the default is 1.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
from collections import OrderedDict
from dataclasses import dataclass
from typing import Optional

from ..compiler import load_cuda_module
from ..dispatch import Kernel, register
from ..launch import PackedLaunch, c_struct, divisor_fields, divisor_values, dtype_code, epilogue_params
from ..tensormap import tma_box_params, tma_limits_violation  # noqa: F401  (re-exported for tests)

__all__ = ["TileConfig", "choose_tile_config", "tile_settings", "Sm90TmaKernel", "Sm90TmaConv3d", "COMPILE_VARIANTS",
           "tma_box_params"]

_SOURCE = "hopper/conv_fprop_sm90.cu"
_ARCH = "sm_90a"
BLOCK_M = 128
BLOCK_K = 64
#: Ring depth per BN at BM = 128: as many slots as fit next to a 2-slot C ring in 227 KiB (at most 8).
STAGES = {64: 8, 96: 6, 128: 6, 160: 5, 192: 4, 256: 4}
#: Tile heights: 64 rows per consumer warpgroup (two, three or four of them).
BLOCK_MS = (128, 192, 256)
#: Tile heights of ping-pong halo tiles (each warpgroup holds a whole tile: BM / 64 x BN / 2 <= 128
#: accumulators per thread).
PINGPONG_BLOCK_MS = (64, 128, 192, 256)
#: BN that a 256-row tile (four consumer warpgroups of 112 registers) can hold: wider accumulators
#: spill (ptxas, BN = 128 with a residual).
WIDE_M_BN = (64, 96)
#: BN that a 192-row tile (three consumer warpgroups of 160 registers) can hold: the accumulators
#: (BN / 2 registers) plus 48 for the rest.
MID_M_BN = (64, 96, 128, 160, 192)
#: BN of the long-standing rule (see :func:`choose_tile_config`); the others fit channel counts
#: such as 96, 160 (320 = 2 x 160), 192 and 1280 (8 x 160) without padding.
_BASE_BN = (64, 128, 256)
_BARRIER_BYTES = 256
_ALIGN_SLACK = 1024
_SMEM_LIMIT = 227 * 1024


def _c_ring_bytes(block_m: int) -> int:
    """The residual ring: two slots of BM rows x 64 channels."""
    return 2 * block_m * 64 * 2


#: Halo tiles: window-ring slots, and the window's extra columns/rows the kernel's slot holds
#: ((S-1) dil_w and (R-1) dil_h at most 2: 3x3 and smaller filters at dilation 1).
HALO_A_STAGES = 2
HALO_REACH_MAX = 2


def _halo_wide_m_bn(loads_residual: bool) -> tuple:
    """BN that a 256-row halo tile can hold: those of :data:`WIDE_M_BN`, and 128 without a residual
    (the halo mainloop leaves room for 64 accumulators in 112 registers; with the residual's C
    reads it spills). Measured: 3x3 128->128 at 512x512, N = 2, 246.7 -> 234.4 us (H100, bf16)."""
    return WIDE_M_BN if loads_residual else WIDE_M_BN + (128,)


#: With a residual the C ring takes filter slots: automatic halo tiles need at least this many. With
#: 3 (BN = 256 before the alignment slack became partial, see TileConfig.smem_bytes) the VAE/UNet
#: layers measured beta = 1 at +14-21% over beta = 0 on halo tiles (H100), against +4-11% on im2col
#: tiles; with 4, 128 x 256 halo tiles beat the im2col ones (3x3 512->512 at 64x64 106.6 vs 109.6 us,
#: at 128x128 398 vs 408 us, bf16).
HALO_MIN_RES_STAGES = 4


def _halo_slot_bytes(block_m: int) -> int:
    """One window slot: (64 + 2) x (BM/64 + 2) pixel rows of 128 bytes (cfg::A_STAGE_BYTES; not rounded
    to the 1024-byte swizzle atom, which gives the 192 x 128 halo tile with a residual a sixth filter slot)."""
    return (64 + HALO_REACH_MAX) * (block_m // 64 + HALO_REACH_MAX) * 128


def _halo_stages(block_m: int, block_n: int, loads_residual: bool) -> int:
    """Filter-ring depth next to the two window slots (and the C ring), at most 8."""
    free = (_SMEM_LIMIT - _BARRIER_BYTES - HALO_A_STAGES * _halo_slot_bytes(block_m)
            - (_c_ring_bytes(block_m) if loads_residual else 0))
    return min(8, free // (block_n * BLOCK_K * 2))


def _stages(block_m: int, block_n: int, loads_residual: bool) -> int:
    """Ring depth: :data:`STAGES` at BM = 128 (the same with or without a residual, as measured);
    at BM = 256 as many slots as fit next to the C ring when there is one (3 or 5 of 40-44 KiB)."""
    if block_m == BLOCK_M:
        return STAGES[block_n]
    free = _SMEM_LIMIT - _BARRIER_BYTES - (_c_ring_bytes(block_m) if loads_residual else 0)
    return min(8, free // ((block_m + block_n) * BLOCK_K * 2))


@dataclass(frozen=True)
class TileConfig:
    """One compiled variant of the kernel: BM x BN x BK tile, ring depth, grid shape."""

    block_m: int
    block_n: int
    block_k: int
    stages: int
    m_tiles: int
    n_tiles: int
    grid: int               # CTAs launched (persistent when grid / cluster < units)
    cluster: int = 1        # CTAs per cluster sharing the filter tile by multicast (1 or 2)
    split_tiles: int = 0    # tiles of the last wave cut in two along the reduction (scheduler.cuh)
    k_iters: int = 0        # reduction steps (ring slots) of a whole tile, when known
    halo: bool = False      # halo tiles: BM/64 output rows x 64 columns, one window per (t, c-block)
    pingpong: bool = False  # halo tiles only: two consumer warpgroups take turns, each owning a whole tile
    note: str = ""          # why the automatic choice departed from its usual rule (for explain)

    @property
    def consumers(self) -> int:
        """Consumer warpgroups (cfg::CONSUMERS in the kernel): one per 64 tile rows, or two taking
        turns on whole tiles (ping-pong)."""
        return 2 if self.pingpong else self.block_m // 64

    @property
    def tile_rows(self) -> int:
        """64-row blocks of a tile: a halo tile's output rows."""
        return self.block_m // 64

    @property
    def num_tiles(self) -> int:
        return self.m_tiles * self.n_tiles

    @property
    def num_units(self) -> int:
        """Scheduling units (cluster tiles: ``cluster`` vertically adjacent tiles; each split tile
        counts twice, once per half), scheduler.cuh."""
        return -(-self.m_tiles // self.cluster) * self.n_tiles + self.split_tiles

    @property
    def dp_tiles(self) -> int:
        """Units that are whole tiles: the first ``num_units - 2 * split_tiles``."""
        return self.num_units - 2 * self.split_tiles

    @property
    def k_split(self) -> int:
        """Reduction steps of the first (PARTIAL) half of a split tile."""
        return self.k_iters // 2

    @property
    def persistent(self) -> bool:
        return self.grid // self.cluster < self.num_units

    @property
    def threads(self) -> int:
        return 128 * (1 + self.consumers)

    def smem_bytes(self, loads_residual: bool) -> int:
        """Dynamic shared memory to launch with, as cfg::SMEM_BYTES in the kernel source: what the
        tiles and barriers use plus up to 1 KiB of alignment slack, capped at the 227 KiB limit (the
        dynamic area starts 1024-aligned, so a variant that fills the limit needs no slack; the
        kernel traps if its aligned layout does not fit)."""
        b_ring = self.stages * self.block_n * self.block_k * 2
        a_ring = (HALO_A_STAGES * _halo_slot_bytes(self.block_m) if self.halo
                  else self.stages * self.block_m * self.block_k * 2)
        ring = _c_ring_bytes(self.block_m) if loads_residual else 0
        return min(_SMEM_LIMIT, _ALIGN_SLACK + a_ring + b_ring + ring + _BARRIER_BYTES)

    def kernel_name(self, loads_residual: bool, nd: int = 2) -> str:
        return (f"conv{nd}d_fprop_sm90_tma_{self.block_m}x{self.block_n}x{self.block_k}_s{self.stages}"
                + (f"_c{self.cluster}" if self.cluster > 1 else "") + ("_halo" if self.halo else "")
                + ("_pp" if self.pingpong else "") + ("_res" if loads_residual else ""))

    def defines(self, dtype: str, loads_residual: bool, nd: int = 2) -> dict:
        return {"CUCONV_DTYPE": dtype_code(dtype), "SM90_NDIM": nd, "SM90_BM": self.block_m, "SM90_BN": self.block_n,
                "SM90_STAGES": self.stages, "SM90_HAS_RESIDUAL": int(loads_residual), "SM90_CLUSTER": self.cluster,
                "SM90_HALO": int(self.halo), "SM90_PINGPONG": int(self.pingpong)}


_SPLIT_WORDS = {"auto": None, "": None, "0": False, "1": True}


@functools.lru_cache(maxsize=None)
def _env_settings() -> tuple:
    """(cluster, BN, split, BM, halo) from ``CUCONV_SM90_CLUSTER`` / ``CUCONV_SM90_BN`` / ``CUCONV_SM90_SPLIT``
    / ``CUCONV_SM90_BM`` / ``CUCONV_SM90_HALO``, read once per process (the hot path must not pay for environment lookups on every call);
    :func:`tile_settings` overrides."""
    c = os.environ.get("CUCONV_SM90_CLUSTER", "1").strip()
    if c not in ("1", "2"):
        raise ValueError(f"CUCONV_SM90_CLUSTER: expected 1 or 2, got {c!r}")
    b = os.environ.get("CUCONV_SM90_BN", "auto").strip()
    if b in ("", "auto"):
        bn = None
    elif b.isdigit() and int(b) in STAGES:
        bn = int(b)
    else:
        raise ValueError(f"CUCONV_SM90_BN: expected 'auto' or one of {sorted(STAGES)}, got {b!r}")
    sp = os.environ.get("CUCONV_SM90_SPLIT", "auto").strip()
    if sp not in _SPLIT_WORDS:
        raise ValueError(f"CUCONV_SM90_SPLIT: expected 'auto', '0' or '1', got {sp!r}")
    m = os.environ.get("CUCONV_SM90_BM", "auto").strip()
    if m not in ("", "auto") and not (m.isdigit() and int(m) in PINGPONG_BLOCK_MS):
        raise ValueError(f"CUCONV_SM90_BM: expected 'auto', '64' (ping-pong), '128', '192' or '256', got {m!r}")
    h = os.environ.get("CUCONV_SM90_HALO", "auto").strip()
    if h not in _SPLIT_WORDS:
        raise ValueError(f"CUCONV_SM90_HALO: expected 'auto', '0' or '1', got {h!r}")
    pp = os.environ.get("CUCONV_SM90_PINGPONG", "auto").strip()
    if pp not in _SPLIT_WORDS:
        raise ValueError(f"CUCONV_SM90_PINGPONG: expected 'auto', '0' or '1', got {pp!r}")
    return int(c), bn, _SPLIT_WORDS[sp], (int(m) if m.isdigit() else None), _SPLIT_WORDS[h], _SPLIT_WORDS[pp]


_override: list = []  # the stack of tile_settings() blocks: (cluster, bn, split, bm, halo, pingpong) tuples


@contextlib.contextmanager
def tile_settings(block_n: Optional[int] = None, cluster: Optional[int] = None, split: Optional[bool] = None,
                  block_m: Optional[int] = None, halo: Optional[bool] = None, pingpong: Optional[bool] = None):
    """Force the Hopper kernels' tile width (``block_n``: one of :data:`STAGES`' keys), tile height
    (``block_m``: 128, 192 or 256 where :func:`_bm_fits` allows it, else 128), CTA cluster size (1 or 2) and/or
    the split tail (``split``: True = split every tile of the last wave that the SMs can take twice,
    False = never; see :func:`choose_tile_config`) and/or halo tiles (``halo``: True = wherever the
    problem allows them, False = never; see :func:`_halo_geometry`) and/or ping-pong warpgroups on halo
    tiles (``pingpong``: True = wherever halo tiles run without a residual, False = never; ``block_m``
    64 then exists too; see :func:`_pingpong_block_m`) inside a ``with`` block; None keeps the
    current value. For tests and tuning; the process-wide defaults come from
    ``CUCONV_SM90_BN`` / ``CUCONV_SM90_BM`` / ``CUCONV_SM90_CLUSTER`` / ``CUCONV_SM90_SPLIT`` /
    ``CUCONV_SM90_HALO`` / ``CUCONV_SM90_PINGPONG`` (auto, 0 or 1)."""
    if block_n is not None and block_n not in STAGES:
        raise ValueError(f"block_n: expected one of {sorted(STAGES)} or None, got {block_n!r}")
    if block_m is not None and block_m not in PINGPONG_BLOCK_MS:
        raise ValueError(f"block_m: expected 64 (ping-pong only), 128, 192, 256 or None, got {block_m!r}")
    if cluster is not None and cluster not in (1, 2):
        raise ValueError(f"cluster: expected 1, 2 or None, got {cluster!r}")
    if split not in (None, True, False):
        raise ValueError(f"split: expected True, False or None, got {split!r}")
    if halo not in (None, True, False):
        raise ValueError(f"halo: expected True, False or None, got {halo!r}")
    if pingpong not in (None, True, False):
        raise ValueError(f"pingpong: expected True, False or None, got {pingpong!r}")
    cur_cluster, cur_bn, cur_split, cur_bm, cur_halo, cur_pp = _current_settings()
    _override.append((cluster or cur_cluster, block_n or cur_bn, cur_split if split is None else split,
                      block_m or cur_bm, cur_halo if halo is None else halo, cur_pp if pingpong is None else pingpong))
    try:
        yield
    finally:
        _override.pop()


def _current_settings() -> tuple:
    return _override[-1] if _override else _env_settings()


def _cluster_setting() -> int:
    return _current_settings()[0]


def _bn_setting() -> Optional[int]:
    return _current_settings()[1]


def _split_setting() -> Optional[bool]:
    return _current_settings()[2]


def _bm_setting() -> Optional[int]:
    return _current_settings()[3]


def _halo_setting() -> Optional[bool]:
    return _current_settings()[4]


def _pingpong_setting() -> Optional[bool]:
    return _current_settings()[5]


#: The split tail needs this many reduction steps per tile (each half >= 4 slots) unless forced.
_SPLIT_MIN_K_ITERS = 8


def _split_tiles(tiles: int, sm_count: int, k_iters: int, cluster: int, split: Optional[bool]) -> int:
    """How many tiles of the last wave to cut in two along the reduction (kernels_cu/hopper/scheduler.cuh).

    The last wave holds ``tail = tiles % sm_count`` tiles (all of them when there are fewer tiles
    than SMs). When ``2 * tail <= sm_count`` at least half of the SMs would idle through it; cutting
    each tail tile into two halves on two SMs makes that wave take half a tile's time, for one fp32
    write and read of the tile through L2. E.g. 196 tiles on 132 SMs: 2 tile-times -> 1.5.

    Automatic (``split=None``) only after at least one full wave and with ``k_iters >= 8``; measured
    on an H100 (docs/bench/README.md): 3x3 256->256 at 14x14, N=64 (196 tiles of 128) 33.7 -> 31.5 us;
    with no full wave (3x3 256->256 at 7x7: 50 tiles -> 100 halves) it gained nothing (16.0 -> 16.4 us),
    the halves being bound by L2->SM traffic like the whole tiles. ``split=True`` needs only
    ``k_iters >= 2``. Never with clusters.
    """
    if split is False or cluster != 1 or k_iters < 2:
        return 0
    tail = tiles % sm_count
    if tail == 0 or 2 * tail > sm_count:
        return 0
    if split is None and (k_iters < _SPLIT_MIN_K_ITERS or tiles < sm_count):
        return 0
    return tail


def _bn_rule(m_tiles: int, gemm_n: int, sm_count: int) -> int:
    """The measured-good rule over BN in {64, 128, 256}.

    N <= 64 or N <= 128: the smallest BN covering N. Larger N: 256 (twice the MMA work per A byte
    loaded) unless it pads N more than 128 would (e.g. N = 320, 384) or leaves fewer tiles than SMs.
    """
    if gemm_n <= 64:
        return 64
    if gemm_n <= 128:
        return 128
    pad256 = -(-gemm_n // 256) * 256
    pad128 = -(-gemm_n // 128) * 128
    tiles256 = m_tiles * (pad256 // 256)
    return 256 if (pad256 <= pad128 and tiles256 >= sm_count) else 128


def _auto_block_m(tiles: dict, block_n: int, cluster: int, loads_residual: bool, sm_count: int, halo: bool) -> int:
    """The automatic tile height, given ``tiles`` = {BM: tile count} (im2col or halo tiles): 256 rows
    where they fit (:func:`_bm_fits`) and :func:`_tall_pays`, else 192 where they fit and
    :func:`_mid_pays`, else 128.

    256 rows: a tall tile loads each filter slot once for twice the rows, which halves the filter's
    share of the L2->SM traffic; narrow tiles are where that share is large (BN = 96: B is 43% of a
    128-row slot). Measured on the H100 (bf16, queued GPU time): conv3d 3x3x3 96->96 at 240x416
    632 -> 500 us, 1x1 64->64 at 56x56 (N=64) 26.0 -> 24.6 us, 3x3 64->64 there 48.0 -> 46.7 us.
    On im2col tiles not with a residual: the 256-row C ring leaves 3-4 slots (3x3 64->64 with
    beta = 1: 53.2 us at BM 256 vs 50.9 at BM 128)."""
    tall_ok = _tall_pays(tiles[256], tiles[BLOCK_M], sm_count) and (halo or not loads_residual)
    if tall_ok and _bm_fits(256, block_n, cluster, loads_residual, halo):
        return 256
    if _bm_fits(192, block_n, cluster, loads_residual, halo) and _mid_pays(tiles[192], tiles[BLOCK_M], sm_count):
        return 192
    return BLOCK_M


def _pingpong_fits(block_m: int, block_n: int) -> bool:
    """Whether one warpgroup can hold a whole ``block_m`` x ``block_n`` tile: BM / 64 x BN / 2 fp32
    accumulators per thread, at most 128 (the consumers' 232 registers keep room for the rest)."""
    return block_m in PINGPONG_BLOCK_MS and (block_m // 64) * (block_n // 2) <= 128


def _pingpong_block_m(block_n: int) -> int:
    """The tallest ping-pong tile of width ``block_n``: 64 rows at BN 160..256, 128 at BN 96 and 128,
    256 at BN 64."""
    return max(b for b in PINGPONG_BLOCK_MS if _pingpong_fits(b, block_n))


#: The ping-pong tile the automatic choice takes: two 64 x 128 wgmma row blocks per warpgroup.
_PINGPONG_AUTO = (128, 128)


def _pingpong_pays(pingpong: Optional[bool], auto_bn: bool, block_m: Optional[int], gemm_n: int,
                   loads_residual: bool, cluster: int) -> bool:
    """Whether the automatic choice runs a halo problem as ping-pong 128 x 128 tiles: N a multiple of 128
    (no padded columns), no residual (its loader warp and C ring are cooperative-only), no CTA pairs,
    and neither the tile nor ping-pong forced. Measured on the H100 against the cooperative halo tiles
    (bf16, queued GPU time): 3x3 256->256 at 256x256 392 -> 375 us, 128->128 at 512x512 205 -> 199.5,
    conv3d N = 2 256->256 278 -> 276; narrower tiles lost (3x3 320->320 at 64x64 with 64 x 160 ones 80
    -> 81 us, conv3d 96->96 with 128 x 96 ones 287 -> 378), hence the multiple of 128."""
    return (pingpong is None and auto_bn and block_m is None and not loads_residual and cluster == 1
            and gemm_n % 128 == 0)


def _mid_pays(mid: int, short: int, sm_count: int) -> bool:
    """Whether ``mid`` 192-row tiles beat ``short`` 128-row ones: each does 1.5 times the work, so
    they must take fewer tile-times (3 x their waves < 2 x the 128-row waves). Ties keep 128 rows.

    Measured on the H100 (bf16, queued GPU time, 128 -> 192 rows): 1x1 1024->256 at 14x14, N = 64
    (196 -> 132 tiles: 2 waves -> 1) 23.6 -> 20.6 us; 3x3 256->256 there 31.4 -> 27.1 us (with the
    split tail at 128 rows); 3x3 128->128 at 512x512 with a residual, halo tiles (4096 -> 2736
    tiles) 272 -> 257-261 us. Ties and losses the rule leaves alone: 3x3 128->128 at 28x28 (3 waves
    -> 2) 31.6 -> 30.8 us, conv3d 192->192 at 120x208 270.7 -> 264.0 us, conv3d 384->384 at 60x104
    259.2 -> 263.9 us; 3x3 512->512 at 7x7 (one wave either way) 30.9 -> 41.6 us; 3x3 320->320 at
    64x64, N = 8 (halo tiles, 4 waves -> 3) 86.8 -> 94.7 us."""
    return 3 * -(-mid // sm_count) < 2 * -(-short // sm_count)


def _bm_fits(block_m: int, block_n: int, cluster: int, loads_residual: bool, halo: bool) -> bool:
    """Whether a ``block_m``-row tile of width ``block_n`` is a variant the kernel builds without
    spilling: 128 rows always; 192 (three consumer warpgroups) for :data:`MID_M_BN`; 256 (four) for
    :data:`WIDE_M_BN` (and BN 128 on halo tiles without a residual, :func:`_halo_wide_m_bn`). Taller
    tiles never in CTA pairs, as measured: 256-row pairs lost everywhere but the conv3d C = 96 layer,
    192-row pairs on the 1x1 layers (1024->256: 23.4 vs 21.0 us) (docs/architecture.md). They would
    compile: CI's NVRTC 13 builds them without spills or C7519."""
    if block_m == BLOCK_M:
        return True
    if cluster != 1:
        return False
    if block_m == 192:
        return block_n in MID_M_BN
    return block_n in (_halo_wide_m_bn(loads_residual) if halo else WIDE_M_BN)


def _tall_pays(tall: int, short: int, sm_count: int) -> bool:
    """The wave test of 256-row tiles (``tall`` of them) against 128-row ones (``short``): the tall
    tiles fill at least one wave and need no more than half the waves (im2col and halo tiles alike)."""
    return tall >= sm_count and 2 * -(-tall // sm_count) <= -(-short // sm_count)


def _modelled_cost(m_tiles: int, gemm_n: int, bn: int, sm_count: int) -> int:
    """Relative time of a BN choice: waves of tiles x per-tile time, the latter taken as
    proportional to BN + 32 (the MMA columns plus a fixed share per k-block: the A box load and
    the issue overhead that a wider tile amortises)."""
    tiles = m_tiles * -(-gemm_n // bn)
    return -(-tiles // sm_count) * (bn + 32)


def _halo_rule(planes: int, P: int, Q: int, taps_hw: int) -> bool:
    """Whether halo tiles beat im2col boxes on an eligible problem (the automatic choice).

    A halo tile covers 64 output columns, so a row of Q columns costs ceil(Q / 64) * 64 columns of
    MMA work; in exchange the activations cross L2->SM once per (depth tap, channel block) instead
    of once per tap. Measured on the H100 (bf16, queued GPU time, im2col -> halo): conv3d 96->96 at
    240x416 (7.7% padded columns) 502 -> 317 us; 3x3 64->64 at 56x56, N = 64 (14%) 45.6 -> 40.7 us;
    the VAE/UNet 3x3 layers at 64..512 columns (none) 1-3% faster; but conv3d 192->192 at 120x208
    and 384->384 at 60x104 (23%) 266 -> 322 and 254 -> 314 us. Hence: at most 1/7 of the columns
    padded, and a filter with more than one (r, s) tap (a 1x1 layer has nothing to share).
    """
    padded = -(-Q // 64) * 64
    return taps_hw > 1 and 7 * padded <= 8 * Q


#: (BN, BM) of the halo tiles that replace BN = 256 with a residual where :func:`_narrow_halo_res_pays`.
_NARROW_HALO_RES = (128, 192)


def _narrow_halo_res_pays(auto_bn: bool, bn: int, gemm_n: int, block_m: Optional[int], cluster: int) -> bool:
    """With a residual, a halo-eligible problem whose automatic BN is 256 keeps only four filter slots
    next to the C ring in 128 x 256 halo tiles; where N <= 256 (each window read by at most two
    column tiles) 192 x 128 halo tiles (five slots) beat them. Measured on the H100 (queued GPU time,
    beta = 1): 3x3 256->256 at 256x256, N = 4: 192 x 128 halo 416-420 us (bf16) / 430-439 us (fp16),
    128 x 256 halo 428-429 / 441-443, 128 x 256 im2col 449-451 / 464-468. With N = 512 (four column
    tiles) 192 x 128 halo tiles lose: 3x3 512->512 at 64x64 119 us against 106.6 (128 x 256 halo) and
    109.6 (im2col); at 128x128 411-424 against 398 and 408 us (bf16)."""
    bn2, bm2 = _NARROW_HALO_RES
    return (auto_bn and bn == 256 and gemm_n <= 256 and cluster == 1 and block_m in (None, bm2)
            and _bm_fits(bm2, bn2, cluster, True, halo=True) and _halo_stages(bm2, bn2, True) >= HALO_MIN_RES_STAGES)


def choose_tile_config(gemm_m: int, gemm_n: int, sm_count: int = 132, cluster: Optional[int] = None,
                       block_n: Optional[int] = None, k_iters: int = 0, split: Optional[bool] = None,
                       block_m: Optional[int] = None, loads_residual: bool = False,
                       halo_geometry: Optional[tuple] = None, halo: Optional[bool] = None,
                       pingpong: Optional[bool] = None) -> TileConfig:
    """Pick BN, the tile height, the cluster size and the split tail for a GEMM of ``gemm_m`` x ``gemm_n`` whose tiles
    take ``k_iters`` reduction steps (pure: no device access).

    * BN starts from :func:`_bn_rule` (64, 128 or 256). A BN of 96, 160 or 192 replaces it when
      :func:`_modelled_cost` (waves x per-tile time) predicts at least 12% less time: it covers N
      with less padding or fills the last wave better, e.g. N = 320 (2 x 160 instead of 3 x 128),
      N = 1280 over 16 row tiles (128 tiles of 160: one wave on 132 SMs, instead of two of 128),
      N = 96 and 192 (no padded columns). The model is coarse, hence the margin: near ties keep the
      rule that the benchmark confirmed.
    * ``block_n`` (default: :func:`tile_settings` / ``CUCONV_SM90_BN``, unset = automatic) forces BN.
    * The tile height (:func:`_auto_block_m`): 256 rows, then 192, where the variant exists
      (:func:`_bm_fits`) and its rule says it pays, else 128; ``block_m`` (default: :func:`tile_settings`
      / ``CUCONV_SM90_BM``) forces it where the variant exists.
    * Pairs of CTAs sharing the filter tile (cluster 2) when asked for and there are at least two
      row tiles (``cluster`` overrides; default: :func:`tile_settings` / ``CUCONV_SM90_CLUSTER``, 1).
    * The split tail (:func:`_split_tiles`) when the last wave would leave half of the SMs idle
      (``split`` overrides; default: :func:`tile_settings` / ``CUCONV_SM90_SPLIT``, automatic).
    * Halo tiles when the problem allows them (with a residual, only where the filter ring keeps
      :data:`HALO_MIN_RES_STAGES` slots, or as 192 x 128 tiles where :func:`_narrow_halo_res_pays`) (``halo_geometry`` = (planes, P, Q, R*S) from
      :func:`_halo_geometry`, else None) and :func:`_halo_rule` or ``halo`` (default:
      :func:`tile_settings` / ``CUCONV_SM90_HALO``) says so: no split (CTA pairs when asked); a tile is BM/64
      output rows x 64 columns of one plane (BM/64 rows: two, three or four).
    * Ping-pong warpgroups on halo tiles (each consumer warpgroup owns whole tiles, taking turns with the
      other) where :func:`_pingpong_pays`, as 128 x 128 tiles; ``pingpong`` (default: :func:`tile_settings`
      / ``CUCONV_SM90_PINGPONG``, automatic) forces them on or off (forced on: the tallest tile of BN
      that one warpgroup holds, :func:`_pingpong_block_m`, unless ``block_m`` fits).
    The grid is persistent (as many clusters as fit, striding over the units) whenever there are more
    units than that; :meth:`Sm90TmaKernel.run` lowers it to the clusters the device can co-schedule.
    """
    bn = _bn_setting() if block_n is None else block_n
    if bn not in STAGES and bn is not None:
        raise ValueError(f"block_n: expected one of {sorted(STAGES)}, got {bn!r}")
    bm = _bm_setting() if block_m is None else block_m
    if bm is not None and bm not in PINGPONG_BLOCK_MS:
        raise ValueError(f"block_m: expected 64 (ping-pong), 128, 192 or 256, got {bm!r}")
    m_tiles = -(-gemm_m // BLOCK_M)
    cl = _cluster_setting() if cluster is None else cluster
    split = _split_setting() if split is None else split
    halo = _halo_setting() if halo is None else halo
    pingpong = _pingpong_setting() if pingpong is None else pingpong
    auto_bn = bn is None
    note = ""
    if bn is None:
        bn = _bn_rule(m_tiles, gemm_n, sm_count)
        base_cost = _modelled_cost(m_tiles, gemm_n, bn, sm_count)
        best = min((b for b in STAGES if b not in _BASE_BN),
                   key=lambda b: _modelled_cost(m_tiles, gemm_n, b, sm_count))
        if _modelled_cost(m_tiles, gemm_n, best, sm_count) <= 0.88 * base_cost:
            bn = best
    use_halo = halo_geometry is not None and (_halo_rule(*halo_geometry) if halo is None else halo)
    if use_halo and halo is None and loads_residual:
        if _narrow_halo_res_pays(auto_bn, bn, gemm_n, bm, cl):
            bn, bm = _NARROW_HALO_RES
            note = (f"BN {bn} instead of 256: with a residual and N <= 256, {bm}x{bn} halo tiles beat 128x256 "
                    f"ones (their C ring leaves {_halo_stages(BLOCK_M, 256, True)} filter slots)")
        elif _halo_stages(BLOCK_M, bn, True) < HALO_MIN_RES_STAGES:
            use_halo = False
    if use_halo:
        planes, P, Q, _ = halo_geometry

        def row_tiles(rows_bm: int) -> int:  # tiles of rows_bm / 64 output rows x 64 columns
            return planes * -(-P // (rows_bm // 64)) * -(-Q // 64)

        if _pingpong_pays(pingpong, auto_bn, bm, gemm_n, loads_residual, cl):
            pingpong, (bm, bn) = True, _PINGPONG_AUTO
        n_tiles = -(-gemm_n // bn)
        if pingpong and not loads_residual and cl == 1:
            if bm is None or not _pingpong_fits(bm, bn):
                bm = _pingpong_block_m(bn)
            m_tiles = row_tiles(bm)
            units = m_tiles * n_tiles
            return TileConfig(block_m=bm, block_n=bn, block_k=BLOCK_K, stages=_halo_stages(bm, bn, False),
                              m_tiles=m_tiles, n_tiles=n_tiles, grid=max(1, min(units, sm_count)), k_iters=k_iters,
                              halo=True, pingpong=True, note=note)
        if bm == 64:
            bm = None  # 64-row tiles exist only in ping-pong
        rows_tiles = {b: row_tiles(b) * n_tiles for b in BLOCK_MS}
        if bm is None:  # four row warpgroups when they fill a wave and cost no extra one, else three when they save waves
            bm = _auto_block_m(rows_tiles, bn, cl, loads_residual, sm_count, halo=True)
        if not _bm_fits(bm, bn, cl, loads_residual, halo=True):
            bm = BLOCK_M
        m_tiles = rows_tiles[bm] // n_tiles
        cl = cl if m_tiles >= 2 else 1
        units = -(-m_tiles // cl) * n_tiles
        return TileConfig(block_m=bm, block_n=bn, block_k=BLOCK_K, stages=_halo_stages(bm, bn, loads_residual),
                          m_tiles=m_tiles, n_tiles=n_tiles, grid=cl * max(1, min(units, sm_count // cl)), cluster=cl,
                          k_iters=k_iters, halo=True, note=note)
    if bm == 64:
        bm = None  # 64-row tiles exist only in ping-pong
    if bm is None:
        bm = _auto_block_m({b: -(-gemm_m // b) * -(-gemm_n // bn) for b in BLOCK_MS}, bn, cl, loads_residual, sm_count,
                           halo=False)
    if not _bm_fits(bm, bn, cl, loads_residual, halo=False):
        bm = BLOCK_M
    m_tiles = -(-gemm_m // bm)
    cl = cl if m_tiles >= 2 else 1
    n_tiles = -(-gemm_n // bn)
    sp = _split_tiles(m_tiles * n_tiles, sm_count, k_iters, cl, split)
    units = -(-m_tiles // cl) * n_tiles + sp
    return TileConfig(block_m=bm, block_n=bn, block_k=BLOCK_K, stages=_stages(bm, bn, loads_residual),
                      m_tiles=m_tiles, n_tiles=n_tiles,
                      grid=cl * max(1, min(units, sm_count // cl)), cluster=cl, split_tiles=sp, k_iters=k_iters)


#: Every (source, defines, arch) this module may launch, for the CPU compile test.
COMPILE_VARIANTS = [
    (_SOURCE, {"CUCONV_DTYPE": dt, "SM90_NDIM": nd, "SM90_BM": bm, "SM90_BN": bn,
               "SM90_STAGES": _stages(bm, bn, bool(res)), "SM90_HAS_RESIDUAL": res, "SM90_CLUSTER": cl,
               "SM90_HALO": 0}, _ARCH)
    for nd in (2, 3) for cl in (1, 2) for dt in (0, 1) for bm in BLOCK_MS for bn in STAGES for res in (0, 1)
    if _bm_fits(bm, bn, cl, bool(res), halo=False)
] + [
    (_SOURCE, {"CUCONV_DTYPE": dt, "SM90_NDIM": nd, "SM90_BM": bm, "SM90_BN": bn,
               "SM90_STAGES": _halo_stages(bm, bn, bool(res)), "SM90_HAS_RESIDUAL": res, "SM90_CLUSTER": cl,
               "SM90_HALO": 1}, _ARCH)
    for nd in (2, 3) for cl in (1, 2) for dt in (0, 1) for bm in BLOCK_MS for bn in STAGES for res in (0, 1)
    if _bm_fits(bm, bn, cl, bool(res), halo=True)
] + [
    (_SOURCE, {"CUCONV_DTYPE": dt, "SM90_NDIM": nd, "SM90_BM": _pingpong_block_m(bn), "SM90_BN": bn,
               "SM90_STAGES": _halo_stages(_pingpong_block_m(bn), bn, False), "SM90_HAS_RESIDUAL": 0, "SM90_CLUSTER": 1,
               "SM90_HALO": 1, "SM90_PINGPONG": 1}, _ARCH)
    for nd in (2, 3) for dt in (0, 1) for bn in STAGES
]

_PARAM_FIELDS = [("M", "i8")] + [(n, "i4") for n in (
    "K", "O", "P", "Q", "T", "R", "S", "stride_d", "stride_h", "stride_w", "dil_d", "dil_h", "dil_w", "pad_d",
    "pad_h", "pad_w", "c_blocks", "last_k16", "n_tiles", "num_units", "dp_tiles", "k_iters", "k_split", "x_tiles",
    "y_tiles", "halo_w", "halo_tx")] + [(n, "u4") for n, _ in divisor_fields(
        "n_tiles_div", "opq_div", "pq_div", "q_div", "x_tiles_div", "y_tiles_div", "o_div")]


def _c_blocks(channels: int) -> int:
    """64-channel blocks per filter tap (the last one possibly partial)."""
    return -(-channels // BLOCK_K)


def _k_iters(problem) -> int:
    """Reduction steps (ring slots) of one tile: filter taps x 64-channel blocks."""
    return math.prod(problem.filter_spatial) * _c_blocks(problem.channels)


def _halo_decline(problem) -> Optional[str]:
    """Why halo tiles cannot serve ``problem`` (None when they can): they need H and W stride 1 and a
    window reach (filter extent - 1) x dilation of at most 2 along H and W."""
    stride_hw = tuple(problem.stride[-2:])
    if stride_hw != (1, 1):
        return f"H/W stride {stride_hw}: halo tiles need stride 1"
    reach = tuple((f - 1) * d for f, d in zip(problem.filter_spatial[-2:], problem.dilation[-2:]))
    if max(reach) > HALO_REACH_MAX:
        return (f"filter reach (extent - 1) x dilation {reach} along H/W: halo windows hold at most "
                f"{HALO_REACH_MAX} extra rows/columns")
    return None


def _halo_why_not(problem) -> str:
    """Why a problem runs on im2col boxes rather than halo tiles (for ``explain``)."""
    why = _halo_decline(problem)
    if why:
        return why
    if _halo_setting() is False:
        return "switched off (tile_settings(halo=False) / CUCONV_SM90_HALO=0)"
    planes, P, Q, taps = _halo_geometry(problem)
    if taps == 1:
        return "one (r, s) tap: no window to share"
    if _halo_rule(planes, P, Q, taps):
        return (f"with a residual, halo tiles of this width keep fewer than {HALO_MIN_RES_STAGES} filter slots "
                f"next to the C ring")
    return f"{Q} output columns pad to {-(-Q // 64) * 64} in 64-column halo tiles (more than 1/7 wasted)"


def _halo_window(problem, cfg: TileConfig) -> tuple:
    """(columns, rows) of a halo tile's input window: 64 + (S-1) dil_w by BM/64 + (R-1) dil_h."""
    R, S = problem.filter_spatial[-2:]
    dh, dw = problem.dilation[-2:]
    return 64 + (S - 1) * dw, cfg.tile_rows + (R - 1) * dh


def _halo_geometry(problem) -> Optional[tuple]:
    """(planes = N*O, P, Q, R*S) when halo tiles can serve ``problem``, else None."""
    if _halo_decline(problem) is not None:
        return None
    *planes, P, Q = problem.out_spatial
    return problem.batch * math.prod(planes), P, Q, math.prod(problem.filter_spatial[-2:])


def _tile_config(problem, sm_count: int) -> TileConfig:
    return choose_tile_config(problem.gemm_m, problem.gemm_n, sm_count or 132, k_iters=_k_iters(problem),
                              loads_residual=problem.epilogue.loads_residual, halo_geometry=_halo_geometry(problem))


def _last_k16(channels: int) -> int:
    """k16 steps of the last channel block that hold real channels (the kernel skips the others:
    their A and B columns are TMA's zero fill). C = 96 -> 2, C = 72 -> 1, C = 128 -> 4."""
    rest = channels - (_c_blocks(channels) - 1) * BLOCK_K
    return -(-rest // 16)


def _params(problem, cfg: TileConfig):
    """Sm90ConvParams of the kernel source; a 2-D problem is a 3-D one of depth 1 (O = T = 1, no pad)."""
    import numpy as np
    fields = [(n, np.dtype(t).type) for n, t in _PARAM_FIELDS]
    lead = 3 - problem.nd
    O, P, Q = (1,) * lead + tuple(problem.out_spatial)
    T, R, S = (1,) * lead + tuple(problem.filter_spatial)
    sd, sh, sw = (1,) * lead + tuple(problem.stride)
    dd, dh, dw = (1,) * lead + tuple(problem.dilation)
    pd, ph, pw = (0,) * lead + tuple(problem.pad_lo)
    rows = cfg.tile_rows
    halo_w, halo_h = _halo_window(problem, cfg)
    vals = dict(M=problem.gemm_m, K=problem.out_channels, O=O, P=P, Q=Q, T=T, R=R, S=S, stride_d=sd, stride_h=sh,
                stride_w=sw, dil_d=dd, dil_h=dh, dil_w=dw, pad_d=pd, pad_h=ph, pad_w=pw,
                c_blocks=_c_blocks(problem.channels), last_k16=_last_k16(problem.channels),
                n_tiles=cfg.n_tiles, num_units=cfg.num_units, dp_tiles=cfg.dp_tiles, k_iters=cfg.k_iters,
                k_split=cfg.k_split, x_tiles=-(-Q // 64), y_tiles=-(-P // rows), halo_w=halo_w,
                halo_tx=halo_w * halo_h * 128 if cfg.halo else 0)
    vals.update(divisor_values(n_tiles_div=cfg.n_tiles, opq_div=O * P * Q, pq_div=P * Q, q_div=Q,
                               x_tiles_div=vals["x_tiles"], y_tiles_div=vals["y_tiles"], o_div=O))
    return c_struct(fields, vals)


def _aligned(a, align: int = 16):
    """``a`` itself when its device address is ``align``-byte aligned, else an aligned copy."""
    return a if a.data.ptr % align == 0 else a.copy()


class Sm90TmaKernel(Kernel):
    name = "sm90_tma"
    backend = "cuda"
    priority = 100
    spatial_dims = (2,)

    def check(self, problem, device):
        return _check_cached(problem, device)

    def describe(self, problem, device):
        return _describe_cached(problem, device, self.settings())

    def settings(self):
        """The run-time tile overrides (cluster, BN, split, BM): :func:`tile_settings` or the environment."""
        return _current_settings()

    @staticmethod
    def _check_uncached(problem, device):
        if not device.is_hopper:
            return False, (f"needs a Hopper GPU (compute capability 9.0, sm_90a: TMA im2col + wgmma); "
                           f"this one is cc {device.cc[0]}.{device.cc[1]} ({device.name})")
        if problem.dtype not in ("float16", "bfloat16"):
            return False, f"dtype {problem.dtype}: wgmma path serves float16 and bfloat16 only"
        if problem.groups != 1:
            return False, f"groups={problem.groups}: grouped/depthwise convolution is not covered (groups == 1 only)"
        if problem.channels % 8:
            return False, f"C={problem.channels} is not a multiple of 8 (TMA needs 16-byte pixel strides)"
        if problem.out_channels % 8:
            return False, f"K={problem.out_channels} is not a multiple of 8 (16-byte filter/output rows)"
        why = tma_limits_violation(problem)
        if why:
            return False, why
        cfg = _tile_config(problem, device.sm_count)
        need = cfg.smem_bytes(problem.epilogue.loads_residual)
        if device.smem_per_block_optin and need > device.smem_per_block_optin:
            return False, f"needs {need} bytes of shared memory per block, the device allows {device.smem_per_block_optin}"
        return True, f"Hopper TMA im2col ({problem.nd + 2}-D boxes) + wgmma kernel covers this problem"

    @staticmethod
    def _describe_uncached(problem, device):
        cfg = _tile_config(problem, device.sm_count)
        res = problem.epilogue.loads_residual
        unit = "tile" if cfg.cluster == 1 else "pair of tiles (CTA pairs multicast the filter tile)"
        grid = (f"persistent grid {cfg.grid} CTAs over {cfg.num_units} units of one {unit}" if cfg.persistent
                else f"grid {cfg.grid} CTAs, one {unit} per {'CTA' if cfg.cluster == 1 else 'pair'}")
        split = (f", last wave's {cfg.split_tiles} tiles split in two along the reduction "
                 f"({cfg.k_split} + {cfg.k_iters - cfg.k_split} steps)" if cfg.split_tiles else "")
        if cfg.halo:
            loads = (f"halo tiles ({cfg.tile_rows} output rows x 64 columns; one input window per depth tap and "
                     f"channel block, {HALO_A_STAGES} window slots, shared by every (r, s) tap; {cfg.stages}-slot filter ring)")
        else:
            why = _halo_why_not(problem)
            loads = f"TMA im2col boxes per tap ({cfg.stages}-stage ring; not halo tiles: {why})"
        if cfg.note:
            loads += f" ({cfg.note})"
        return (f"{cfg.kernel_name(res, problem.nd)}: tile {cfg.block_m}x{cfg.block_n}x{cfg.block_k}, {loads}, "
                + ("2 consumer warpgroups taking turns on whole tiles (ping-pong: one's epilogue runs beside "
                   "the other's mainloop), " if cfg.pingpong else f"{cfg.consumers} consumer warpgroups, ")
                + f"{grid}{split}, "
                f"{'epilogue-load warp prefetches the residual' if res else 'no residual load'}")

    def run(self, problem, x, w, bias, residual, out):
        """Launch; the launch record (descriptors, params, function, grid) is cached per problem and inputs.

        A TMA descriptor depends only on the geometry and the base address, so a record keyed by
        (problem, device, x/w/bias/residual addresses, tile settings) stays valid for any arrays at those
        addresses. The output is a plain pointer argument, not part of the key: a call that writes a
        fresh output array (no ``out=``) still reuses the record. Records hold raw addresses only (no
        array references: nothing is kept alive).
        """
        import cupy as cp

        dev_id = cp.cuda.runtime.getDevice()
        # The stream is in the key because a split-tail launch owns a workspace per (device, stream).
        key = (problem, dev_id, x.data.ptr, w.data.ptr, 0 if bias is None else bias.data.ptr,
               0 if residual is None else residual.data.ptr, self.settings(), cp.cuda.get_current_stream().ptr)
        launch = _LAUNCHES.get(key)
        keep = None
        if launch is not None:
            _LAUNCHES.move_to_end(key)
        else:
            launch, cacheable, keep = self._build_launch(problem, x, w, bias, residual)
            if cacheable:
                _LAUNCHES[key] = launch
                while len(_LAUNCHES) > _LAUNCH_CACHE_SIZE:
                    _LAUNCHES.popitem(last=False)
        if out.data.ptr % 16 == 0:          # the epilogue stores 16-byte vectors
            launch(out.data.ptr)
        else:
            target = cp.empty_like(out)
            launch(target.data.ptr)
            out[...] = target
        del keep  # aligned input copies (if any) live until the launch above has been queued

    def _build_launch(self, problem, x, w, bias, residual):
        import numpy as np

        from ..device import device_of
        from ..tensormap import (encode_halo_c, encode_halo_x, encode_im2col_x, encode_tiled_c, encode_tiled_w,
                                 placeholder_descriptor)
        dev = device_of(x)
        cfg = _tile_config(problem, dev.sm_count)
        res = problem.epilogue.loads_residual
        fn, smem = _function(dev, cfg, problem.dtype, res, problem.nd)
        grid_ctas = min(cfg.grid, cfg.cluster * _max_active_clusters(fn, cfg, smem, dev))

        # TMA needs 16-byte aligned bases; a misaligned view (rare) goes through an aligned copy,
        # and such a record is not cached (the copy's address is new every call).
        xa, wa = _aligned(x), _aligned(w)
        ra = residual
        if res:
            ra = _aligned(residual)
            tmap_c = (encode_halo_c(problem, ra.data.ptr, cfg.tile_rows) if cfg.halo
                      else encode_tiled_c(problem, ra.data.ptr, cfg.block_m))
        else:
            tmap_c = placeholder_descriptor()
        ba = _aligned(bias, 4) if bias is not None else None
        cacheable = xa is x and wa is w and ra is residual and ba is bias
        if cfg.halo:
            tmap_x = encode_halo_x(problem, xa.data.ptr, *_halo_window(problem, cfg))
        else:
            tmap_x = encode_im2col_x(problem, xa.data.ptr, tma_box_params(problem, pixels_per_column=cfg.block_m))
        tmap_w = encode_tiled_w(problem, wa.data.ptr, cfg.block_n // cfg.cluster, BLOCK_K)  # one CTA's share
        bias_ptr = np.uint64(ba.data.ptr if ba is not None else xa.data.ptr)  # unread without a bias
        partials, flags = _split_workspace(cfg)
        args = (tmap_x, tmap_w, tmap_c, np.uint64(0), bias_ptr, _params(problem, cfg), epilogue_params(problem.epilogue),
                np.uint64(partials.data.ptr), np.uint64(flags.data.ptr))
        launch = PackedLaunch(fn, grid_ctas, cfg.threads, smem, args, slot=3)  # slot 3: the output pointer
        launch.workspace = (partials, flags)  # lives as long as the launch record
        return launch, cacheable, (xa, wa, ra, ba)


def _split_workspace(cfg: TileConfig):
    """(partials, flags) for a split-tail launch on the current device and stream (small placeholders
    when nothing is split).

    ``partials`` holds one fp32 accumulator tile per split tile; ``flags`` one int per consumer
    warp per split tile, zero between launches (each finishing warp puts its flag back, see
    kernels_cu/hopper/split_reduce.cuh), so its buffer starts zeroed. Both are
    :mod:`cuconv.scratch` buffers, one per (device, stream): launches on one stream run in order, so
    they can share them; a launch record keeps the views it was built with (and so their buffers)
    alive, so a record made before a buffer was grown or dropped stays valid.
    """
    from ..scratch import scratch
    nflt = cfg.split_tiles * cfg.block_m * cfg.block_n
    nflag = cfg.split_tiles * 4 * cfg.consumers
    return (scratch("sm90_split_partials", (max(nflt, 4),), "float32"),
            scratch("sm90_split_flags", (max(nflag, 1),), "int32", zeroed=True))


@functools.lru_cache(maxsize=1024)
def _check_cached(problem, device):
    """``check`` is a pure function of (problem, device): answered once per pair (dispatch asks every call)."""
    return Sm90TmaKernel._check_uncached(problem, device)


@functools.lru_cache(maxsize=1024)
def _describe_cached(problem, device, settings):
    """``describe`` memoised; ``settings`` (the :func:`tile_settings` / ``CUCONV_SM90_*`` overrides) are
    in the key because the description names the tile config, which depends on them."""
    return Sm90TmaKernel._describe_uncached(problem, device)


_LAUNCH_CACHE_SIZE = 256
_LAUNCHES: "OrderedDict" = OrderedDict()


@functools.lru_cache(maxsize=None)
def _function_cached(dev_index: int, arch: str, cfg_key: tuple, dtype: str, res: bool, nd: int):
    from ..device import _gpu_info
    dev = _gpu_info(dev_index)
    bm, bn, stages, cluster, halo, pingpong = cfg_key
    cfg = TileConfig(block_m=bm, block_n=bn, block_k=BLOCK_K, stages=stages, m_tiles=1, n_tiles=1, grid=1,
                     cluster=cluster, halo=halo, pingpong=pingpong)
    mod = load_cuda_module(_SOURCE, dev, cfg.defines(dtype, res, nd))
    fn = mod.get_function(cfg.kernel_name(res, nd))
    smem = cfg.smem_bytes(res)
    fn.max_dynamic_shared_size_bytes = smem
    return fn, smem


def _function(dev, cfg: TileConfig, dtype: str, res: bool, nd: int):
    """The loaded kernel of a variant with its dynamic shared-memory limit raised (once per device)."""
    return _function_cached(dev.index, dev.arch, (cfg.block_m, cfg.block_n, cfg.stages, cfg.cluster, cfg.halo, cfg.pingpong),
                            dtype,
                            res, nd)


_ACTIVE_CLUSTERS: dict = {}


def _max_active_clusters(fn, cfg: TileConfig, smem: int, dev) -> int:
    """Clusters of ``cfg.cluster`` CTAs the device can run at once (the persistent grid's cap).

    With one CTA per SM that is the SM count for single CTAs, but pairs must sit in one GPC, so an
    odd SM left in a GPC idles; a persistent grid larger than what fits would run a second, mostly
    empty wave. Asked of the driver once per variant (cuOccupancyMaxActiveClusters).
    """
    sms = dev.sm_count or 132
    if cfg.cluster == 1:
        return sms
    handle = fn.kernel.ptr  # RawKernel -> its loaded cupy.cuda.Function -> CUfunction address
    key = (dev.index, handle, smem)
    hit = _ACTIVE_CLUSTERS.get(key)
    if hit is None:
        from ..tensormap import _driver
        drv = _driver()
        conf = drv.CUlaunchConfig()
        conf.gridDimX, conf.gridDimY, conf.gridDimZ = cfg.cluster * (sms // cfg.cluster), 1, 1
        conf.blockDimX, conf.blockDimY, conf.blockDimZ = cfg.threads, 1, 1
        conf.sharedMemBytes = smem
        conf.numAttrs = 0
        err, n = drv.cuOccupancyMaxActiveClusters(drv.CUfunction(handle), conf)
        if int(err) != 0 or int(n) < 1:
            raise RuntimeError(f"cuconv: cuOccupancyMaxActiveClusters failed for {cfg.kernel_name(False)}: {err}")
        hit = _ACTIVE_CLUSTERS[key] = int(n)
    return hit


class Sm90TmaConv3d(Sm90TmaKernel):
    """conv3d's "native" strategy: the Hopper kernel compiled for NDHWC (5-D im2col boxes).

    One launch, no temporaries: the K-loop walks (t, r, s, channel block), so temporal padding,
    stride and dilation cost nothing extra. Preferred over the Q-slice strategy by ``auto`` (see
    docs/bench/h100_conv3d.log for the side-by-side measurements).
    """

    name = "conv3d_native"
    priority = 95
    spatial_dims = (3,)
    strategy = "native"


register(Sm90TmaKernel())
register(Sm90TmaConv3d())
