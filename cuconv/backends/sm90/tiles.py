"""The Hopper kernel's tile policy: which compiled variant and grid serve a problem (pure functions).

:func:`tile_config` maps ``(problem, SM count, overrides)`` to a :class:`TileConfig`; nothing here
reads the environment or touches a device, so CPU tests pin every rule. The shared-memory budget
comes from the kernel's own header (kernels_cu/sm90/budget.cuh). The evidence behind each rule is in
docs/tuning.md under the ID its docstring names.

Vocabulary: a tile is BM output pixels (GEMM rows) x BN output channels; a ring slot holds one
filter tap's 64-channel block of A (BM x 64) and B (BN x 64); ``k_iters`` slots make one tile's
reduction. Halo tiles (stride-1 H/W, small filters) are BM/64 output rows x 64 columns of one
plane, whose input window is loaded once per (depth tap, channel block) and shared by every (r, s)
tap. Ping-pong tiles give each of two consumer warpgroups whole tiles in turn. Channels-first windows
(NCHW / NCDHW x read as it is, :func:`channels_first_x_decline`) are halo tiles whose window holds 64-pixel
channel rows: one per (depth tap, channel block, filter column), shared by the R taps of that column.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Optional, Tuple

from ...launch import header_constants

__all__ = ["TileConfig", "choose_tile_config", "tile_config", "halo_decline", "halo_why_not", "HALO_SWITCHED_OFF", "halo_window",
           "channels_first_x_decline", "channels_first_x_pays",
           "transposed_x_decline", "staging_row",
           "k_iters", "c_blocks", "last_k16", "stages_for", "halo_stages", "bm_fits", "pingpong_block_m",
           "narrow_tiles", "NARROW_BLOCK_N", "NARROW_MAX_K", "STAGES", "BLOCK_MS", "PINGPONG_BLOCK_MS", "BLOCK_K", "SPLIT_WAYS"]

_BUDGET = header_constants("sm90/budget.cuh")
BLOCK_K = _BUDGET["SM90_BLOCK_K"]
_SMEM_LIMIT = _BUDGET["SM90_SMEM_LIMIT"]
_BARRIER_BYTES = _BUDGET["SM90_BARRIER_BYTES"]
_ALIGN_SLACK = _BUDGET["SM90_SMEM_ALIGN_SLACK"]
_C_STAGES, _C_CHUNK = _BUDGET["SM90_C_STAGES"], _BUDGET["SM90_C_CHUNK"]
HALO_A_STAGES = _BUDGET["SM90_HALO_A_STAGES"]
HALO_REACH_MAX = _BUDGET["SM90_HALO_REACH_MAX"]
_MAX_STAGES = _BUDGET["SM90_MAX_STAGES"]
_XPOSE_ST_W_MAX = _BUDGET["SM90_XPOSE_ST_W_MAX"]
XPOSE_ST_STAGES = _BUDGET["SM90_XPOSE_ST_STAGES"]
#: The transposing variant transposes each window once per column tile; past this many column tiles moving x
#: first costs less (docs/tuning.md T-xpose-x).
XPOSE_MAX_N_TILES = 2
#: Shared memory of the transposing variant's staging ring, its barriers and scratch (cfg::ST_RING_BYTES +
#: cfg::XPOSE_EXTRA_BYTES): rows of 64 channels x SM90_XPOSE_ST_W_MAX pixels.
_XPOSE_BYTES = XPOSE_ST_STAGES * 64 * _XPOSE_ST_W_MAX * 2 + _BUDGET["SM90_XPOSE_EXTRA_BYTES"]

BLOCK_M = 128
#: Ring depth per BN at BM = 128: as many slots as fit next to a 2-slot C ring, at most 8 (docs/tuning.md T-ring-depth).
STAGES = {64: 8, 96: 6, 128: 6, 160: 5, 192: 4, 256: 4}
#: Tile heights: 64 rows per consumer warpgroup (two, three or four of them).
BLOCK_MS = (128, 192, 256)
#: Ping-pong tile heights (one warpgroup holds a whole tile: BM/64 x BN/2 <= 128 accumulators per thread).
PINGPONG_BLOCK_MS = (64, 128, 192, 256)
#: BN a 256-row tile (four consumer warpgroups) holds without spilling.
WIDE_M_BN = (64, 96)
#: BN a 192-row tile (three consumer warpgroups) holds without spilling.
MID_M_BN = (64, 96, 128, 160, 192)
#: BN of the base width rule; the others fit channel counts such as 96, 160 and 192 without padding.
_BASE_BN = (64, 128, 256)
#: Halo tiles with a residual need this many filter slots next to the C ring (docs/tuning.md T-halo-res-slots).
HALO_MIN_RES_STAGES = 4
#: The split tail needs this many reduction steps per tile unless forced (each half >= 4 slots).
_SPLIT_MIN_K_ITERS = 8
#: Parts a tile of a small problem may be split into along the reduction (overrides(split_ways=...)).
SPLIT_WAYS = tuple(range(2, 17))
#: The automatic split of small problems (docs/tuning.md T-split-small): at least this many reduction
#: steps per tile, and at least this many per part.
_SMALL_SPLIT_MIN_K_ITERS, _SMALL_SPLIT_PART_K_ITERS = 32, 10
#: :func:`_split_wider`: the widths it tries, the parts (two), the reduction steps a tile needs at least,
#: and the steps that the fp32 hand-over of a part costs on top of its own (its partial sums written to
#: and read back through L2) in its model (docs/tuning.md T-split-wider).
_SPLIT_WIDER_BN, _SPLIT_WIDER_WAYS, _SPLIT_WIDER_MIN_K_ITERS, _SPLIT_HANDOVER_K_ITERS = (128, 160), 2, 64, 4
#: 256-row tiles may take up to this many times the waves-times-rows of 128-row ones (docs/tuning.md
#: T-bm-tall): their rows run faster, which pays for a slightly emptier last wave.
_TALL_WAVE_SLACK = 1.125
#: The share of a halo tile's columns that may be padding where halo tiles pay (docs/tuning.md T-halo-rule).
_HALO_MAX_PAD = Fraction(1, 8)
#: Halo tiles of problems with one channel block per tap (k_iters <= R*S: C <= 64) may pad up to this
#: share of their columns (docs/tuning.md T-halo-one-block).
_HALO_ONE_BLOCK_MAX_PAD = Fraction(1, 4)
#: The width of the halo tiles that may carry :data:`_HALO_NARROW_N_MAX_PAD` of padding, and take 192 rows
#: on wave ties (N <= 64).
_HALO_NARROW_N_BN = 64
#: The padding those tiles may carry: their MMA work per input byte is the smallest, so the input rows
#: R x S im2col boxes move again per tap cost more than the padded columns' wgmmas (docs/tuning.md
#: T-halo-narrow-n).
_HALO_NARROW_N_MAX_PAD = Fraction(3, 8)
#: The padding the narrow variant's halo windows may carry (docs/tuning.md T-narrow-out).
_NARROW_HALO_MAX_PAD = Fraction(5, 8)
#: (BN, BM) of the halo tiles that replace BN = 256 with a residual (docs/tuning.md T-halo-narrow-res).
_NARROW_HALO_RES = (128, 192)
#: The ping-pong tile the automatic choice takes: two 64 x 128 wgmma row blocks per warpgroup.
_PINGPONG_AUTO = (128, 128)


# ------------------------------------------------------------------------------------ shared memory
def _c_ring_bytes(block_m: int) -> int:
    return _C_STAGES * block_m * _C_CHUNK * 2


def _halo_slot_bytes(block_m: int, a_cf: bool = False) -> int:
    """One window slot: (64 + reach) x (BM/64 + reach) pixel rows of 128 bytes (cfg::A_STAGE_BYTES), not
    rounded to the swizzle atom (docs/tuning.md T-halo-exact-slots); a channels-first window (``a_cf``):
    BM/64 + reach input rows of 64 channel rows of 128 bytes."""
    if a_cf:
        return 64 * (block_m // 64 + HALO_REACH_MAX) * 128
    return (64 + HALO_REACH_MAX) * (block_m // 64 + HALO_REACH_MAX) * 128


def halo_stages(block_m: int, block_n: int, loads_residual: bool, a_cf: bool = False, a_xpose: bool = False) -> int:
    """Filter-ring depth of halo tiles: what fits next to the window slots (and the C ring, or the
    transposing variant's staging ring)."""
    free = (_SMEM_LIMIT - _BARRIER_BYTES - HALO_A_STAGES * _halo_slot_bytes(block_m, a_cf)
            - (_c_ring_bytes(block_m) if loads_residual else 0) - (_XPOSE_BYTES if a_xpose else 0))
    return min(_MAX_STAGES, free // (block_n * BLOCK_K * 2))


def stages_for(block_m: int, block_n: int, loads_residual: bool) -> int:
    """Ring depth of im2col tiles: :data:`STAGES` at BM = 128; taller tiles take what fits next to the C ring."""
    if block_m == BLOCK_M and block_n in STAGES:
        return STAGES[block_n]
    free = _SMEM_LIMIT - _BARRIER_BYTES - (_c_ring_bytes(block_m) if loads_residual else 0)
    return min(_MAX_STAGES, free // ((block_m + block_n) * BLOCK_K * 2))


@dataclass(frozen=True)
class TileConfig:
    """One compiled variant of the kernel (BM x BN x BK tile, ring depth) and its grid."""

    block_m: int
    block_n: int
    block_k: int
    stages: int
    m_tiles: int
    n_tiles: int
    grid: int               # CTAs launched (persistent when grid / cluster < units)
    cluster: int = 1        # CTAs per cluster sharing the filter tile by multicast (1 or 2)
    split_tiles: int = 0    # tiles cut into split_ways parts along the reduction (scheduler.cuh)
    split_ways: int = 2     # parts of a split tile: 2 for the split tail, up to 16 for small problems
    k_iters: int = 0        # reduction steps (ring slots) of a whole tile
    halo: bool = False      # halo tiles: BM/64 output rows x 64 columns, one window per (t, c-block)
    pingpong: bool = False  # halo tiles only: two consumer warpgroups take turns, each owning a whole tile
    a_cf: bool = False      # halo tiles only: windows of channels-first x, one per (t, c-block, filter column)
    a_xpose: bool = False   # halo tiles only: channels-first x staged by rows, transposed into channels-last windows
    note: str = ""          # why the automatic choice departed from its usual rule (for explain)

    @property
    def consumers(self) -> int:
        """Consumer warpgroups (cfg::CONSUMERS): one per 64 tile rows, or two taking turns (ping-pong)."""
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
        """Scheduling units (scheduler.cuh): cluster tiles, each split tile counted once per part."""
        return -(-self.m_tiles // self.cluster) * self.n_tiles + self.split_tiles * (self.split_ways - 1)

    @property
    def dp_tiles(self) -> int:
        """Units that are whole tiles: the first ``num_units - split_ways * split_tiles``."""
        return self.num_units - self.split_ways * self.split_tiles

    @property
    def split_steps(self) -> tuple:
        """Reduction steps of each part of a split tile, in part order (scheduler.cuh's k_begin / k_end)."""
        w, k = self.split_ways, self.k_iters
        return tuple((j + 1) * k // w - j * k // w for j in range(w))

    @property
    def persistent(self) -> bool:
        return self.grid // self.cluster < self.num_units

    @property
    def threads(self) -> int:
        return 128 * (1 + self.consumers)

    def smem_bytes(self, loads_residual: bool) -> int:
        """Dynamic shared memory to launch with, as cfg::SMEM_BYTES: tiles, barriers and up to 1 KiB of
        alignment slack, capped at the limit (the dynamic area starts 1024-aligned)."""
        b_ring = self.stages * self.block_n * self.block_k * 2
        a_ring = (HALO_A_STAGES * _halo_slot_bytes(self.block_m, self.a_cf) if self.halo
                  else self.stages * self.block_m * self.block_k * 2)
        ring = _c_ring_bytes(self.block_m) if loads_residual else 0
        staging = _XPOSE_BYTES if self.a_xpose else 0
        return min(_SMEM_LIMIT, _ALIGN_SLACK + a_ring + b_ring + ring + staging + _BARRIER_BYTES)

    @property
    def variant(self) -> tuple:
        """What selects the compiled kernel: (BM, BN, stages, cluster, halo, ping-pong, channels-first x windows,
        transposed channels-first x)."""
        return (self.block_m, self.block_n, self.stages, self.cluster, self.halo, self.pingpong, self.a_cf,
                self.a_xpose)

    @property
    def reads_x_channels_first(self) -> bool:
        """Whether the kernel reads x channels-first itself (``a_cf`` or ``a_xpose``)."""
        return self.a_cf or self.a_xpose


# ------------------------------------------------------------------------------------ problem views
def c_blocks(channels: int) -> int:
    """64-channel blocks per filter tap (the last one possibly partial)."""
    return -(-channels // BLOCK_K)


def k_iters(problem) -> int:
    """Reduction steps (ring slots) of one tile: filter taps x 64-channel blocks."""
    return math.prod(problem.filter_spatial) * c_blocks(problem.channels)


def last_k16(channels: int) -> int:
    """k16 steps of the last channel block that hold real channels (C = 96 -> 2, 72 -> 1, 128 -> 4)."""
    return -(-(channels - (c_blocks(channels) - 1) * BLOCK_K) // 16)


def halo_decline(problem) -> Optional[str]:
    """Why halo tiles cannot serve ``problem`` (None when they can): H and W stride 1 and a window reach
    (filter extent - 1) x dilation of at most :data:`HALO_REACH_MAX` along H and W."""
    stride_hw = tuple(problem.stride[-2:])
    if stride_hw != (1, 1):
        return f"H/W stride {stride_hw}: halo tiles need stride 1"
    reach = tuple((f - 1) * d for f, d in zip(problem.filter_spatial[-2:], problem.dilation[-2:]))
    if max(reach) > HALO_REACH_MAX:
        return (f"filter reach (extent - 1) x dilation {reach} along H/W: halo windows hold at most "
                f"{HALO_REACH_MAX} extra rows/columns")
    return None


def halo_geometry(problem) -> Optional[tuple]:
    """(planes = N*O, P, Q, R*S) when halo tiles can serve ``problem``, else None."""
    return None if halo_decline(problem) is not None else _row_tile_geometry(problem)


def _row_tile_geometry(problem) -> tuple:
    """(planes = N*O, P, Q, R*S): what the tile policy needs of a problem run on tiles of output rows."""
    *planes, P, Q = problem.out_spatial
    return problem.batch * math.prod(planes), P, Q, math.prod(problem.filter_spatial[-2:])


def halo_window(problem, cfg: TileConfig) -> tuple:
    """(columns, rows) of a halo tile's input window: 64 + (S-1) dil_w by BM/64 + (R-1) dil_h; a
    channels-first window (one per filter column) is 64 columns wide."""
    R, S = problem.filter_spatial[-2:]
    dh, dw = problem.dilation[-2:]
    return 64 + (0 if cfg.a_cf else (S - 1) * dw), cfg.tile_rows + (R - 1) * dh


def channels_first_x_decline(problem) -> Optional[str]:
    """Why the Hopper kernel cannot read ``problem``'s x channels-first itself (None when it can): an
    NCHW / NCDHW problem with H and W stride 1, a window reach (R-1) dil_h of at most
    :data:`HALO_REACH_MAX` rows, a row of W pixels a multiple of 16 bytes (the tensor map's strides), and
    every window's first column (pad_w and each filter column's shift s dil_w) on a 16-byte boundary: a
    tiled TMA load whose innermost coordinate is not faults (``illegal instruction`` on the H200,
    docs/tuning.md N-cf-unaligned), so 1x1 and R x 1 filters with pad_w a multiple of 8 qualify."""
    if problem.layout not in ("NCHW", "NCDHW"):
        return f"layout {problem.layout} is channels-last"
    stride_hw = tuple(problem.stride[-2:])
    if stride_hw != (1, 1):
        return f"H/W stride {stride_hw}: windows of channels-first x need stride 1"
    reach = (problem.filter_spatial[-2] - 1) * problem.dilation[-2]
    if reach > HALO_REACH_MAX:
        return f"filter reach (R - 1) x dil_h = {reach} rows: windows hold at most {HALO_REACH_MAX} extra rows"
    W = problem.in_spatial[-1]
    if (W * problem.itemsize) % 16:
        return f"a row of W = {W} pixels is {W * problem.itemsize} bytes, not a multiple of 16 (TMA strides)"
    S, dw, pw = problem.filter_spatial[-1], problem.dilation[-1], problem.pad_lo[-1]
    unit = 16 // problem.itemsize
    if pw % unit or (S > 1 and dw % unit):
        return (f"window columns start at -pad_w + s x dil_w = -{pw} + s x {dw} (s < {S}): not all on a 16-byte "
                f"boundary ({unit} pixels), where TMA tile loads must start")
    return None


def transposed_x_decline(problem) -> Optional[str]:
    """Why the Hopper kernel cannot stage ``problem``'s channels-first x by rows and transpose it in shared
    memory into channels-last halo windows (None when it can; kernels_cu/sm90/transpose_loader.cuh): an NCHW /
    NCDHW problem that halo tiles serve (:func:`halo_decline`) whose rows of W pixels are a multiple of 16
    bytes (the tensor map's strides). Any padding and filter column: a staged row starts at the 16-byte
    boundary at or before the window's first column (:func:`staging_row`)."""
    if problem.layout not in ("NCHW", "NCDHW"):
        return f"layout {problem.layout} is channels-last"
    why = halo_decline(problem)
    if why is not None:
        return why
    W = problem.in_spatial[-1]
    if (W * problem.itemsize) % 16:
        return f"a row of W = {W} pixels is {W * problem.itemsize} bytes, not a multiple of 16 (TMA strides)"
    return None


def staging_row(problem) -> tuple:
    """``(st_w, st_shift)`` of the transposing variant: a staged row holds ``st_w`` pixels from window column
    ``-st_shift`` on, ``st_shift = -pad_w mod 8`` (the row starts on a 16-byte boundary: tile columns start at
    multiples of 64) and ``st_w`` the multiple of 8 covering the window whose count of 16-byte chunks is odd
    (an 8-row ldmatrix block then hits 8 different bank groups)."""
    S, dw = problem.filter_spatial[-1], problem.dilation[-1]
    shift = -problem.pad_lo[-1] % 8
    chunks = -(-(shift + 64 + (S - 1) * dw) // 8)
    chunks += 1 - chunks % 2
    if 8 * chunks > _XPOSE_ST_W_MAX:
        raise ValueError(f"staging_row: {8 * chunks} pixels exceed the staging slot's {_XPOSE_ST_W_MAX}")
    return 8 * chunks, shift


def channels_first_x_pays(problem) -> Optional[str]:
    """Why the automatic choice moves x rather than reading it channels-first although it could (None
    where reading it pays): more than 1/8 of the 64-column tiles' columns would be padding, the halo
    rule's bound (docs/tuning.md T-cf-windows)."""
    Q = problem.out_spatial[-1]
    padded = -(-Q // 64) * 64
    if 7 * padded > 8 * Q:
        return f"{Q} output columns pad to {padded} in 64-column tiles (more than 1/8 wasted)"
    return None


# ------------------------------------------------------------------------------------ the rules
def _split_tiles(tiles: int, sm_count: int, k_iters_: int, cluster: int, split: Optional[bool]) -> int:
    """Tiles of the last wave to cut in two along the reduction (scheduler.cuh; docs/tuning.md T-split-tail).

    The last wave holds ``tiles % sm_count`` tiles; when they leave at least half of the SMs idle,
    each is cut into two halves on two SMs, for one fp32 write and read of the tile through L2.
    Automatic only after a full wave and with ``k_iters >= 8``; ``split=True`` needs ``k_iters >= 2``.
    Never with clusters."""
    if split is False or cluster != 1 or k_iters_ < 2:
        return 0
    tail = tiles % sm_count
    if tail == 0 or 2 * tail > sm_count:
        return 0
    if split is None and (k_iters_ < _SPLIT_MIN_K_ITERS or tiles < sm_count):
        return 0
    return tail


def _small_split_ways(tiles: int, sm_count: int, k_iters_: int, cluster: int, split: Optional[bool],
                      split_ways: Optional[int]) -> int:
    """Parts to cut every tile of a small problem into along the reduction (scheduler.cuh), or 0 for none.

    Every part gets its own SM (``tiles * parts <= sm_count``: the whole grid resident, one round).
    ``split_ways`` (forced by overrides) is lowered to what fits, with at least one reduction step per
    part. Automatically (docs/tuning.md T-split-small): where at least half of the SMs would be idle and
    a tile takes at least 32 reduction steps, as many parts as fit, at most 16, each of at least 10
    steps. None with CTA pairs or with ``split=False``."""
    if split is False or cluster != 1:
        return 0
    if split_ways is not None:
        ways = min(split_ways, k_iters_, sm_count // max(tiles, 1))
    elif k_iters_ < _SMALL_SPLIT_MIN_K_ITERS:
        return 0
    else:
        ways = min(SPLIT_WAYS[-1], k_iters_ // _SMALL_SPLIT_PART_K_ITERS, sm_count // max(tiles, 1))
    return ways if ways >= 2 else 0


def _split_wider(m_tiles: int, gemm_n: int, sm_count: int, k_iters_: int, bn: int) -> Optional[Tuple[int, int]]:
    """``(BN, 2)``: wider tiles cut in two along the reduction, for a problem whose ``bn``-wide tiles of 128
    rows fill one partial wave (more than half of the SMs, at most all of them) with long reductions (at
    least 64 steps), or None to keep ``bn`` whole (docs/tuning.md T-split-wider).

    Such a wave takes one tile's time while some SMs idle; 128- or 160-wide tiles in two parts, each on an
    SM of its own, take a part's time instead. The model: a tile's step costs BN + 32
    (:func:`_modelled_cost`), a part ``ceil(k_iters / 2)`` steps plus :data:`_SPLIT_HANDOVER_K_ITERS` for
    its hand-over; the cheaper width is taken where it models at least 12% less time than ``bn`` whole.
    Wider tiles (192, 256) and more parts measure slower than the model says, and so do reductions of
    fewer steps."""
    tiles = m_tiles * -(-gemm_n // bn)
    if not sm_count // 2 < tiles <= sm_count or k_iters_ < _SPLIT_WIDER_MIN_K_ITERS:
        return None
    return _wider_in_parts(m_tiles, gemm_n, sm_count, k_iters_, _part_cost(bn, k_iters_, 1), _SPLIT_WIDER_WAYS)


def _part_cost(bn: int, k_iters_: int, ways: int) -> int:
    """The model's time of one part of a ``bn``-wide tile cut into ``ways`` parts (a whole tile: 1): its
    steps at BN + 32 each, plus :data:`_SPLIT_HANDOVER_K_ITERS` for a part's hand-over."""
    return (bn + 32) * (-(-k_iters_ // ways) + (_SPLIT_HANDOVER_K_ITERS if ways > 1 else 0))


def _wider_in_parts(m_tiles: int, gemm_n: int, sm_count: int, k_iters_: int, now: int, ways: int,
                    above: int = 0) -> Optional[Tuple[int, int]]:
    """``(BN, ways)`` for the cheapest width of :data:`_SPLIT_WIDER_BN` above ``above`` whose tiles in
    ``ways`` parts (each at least 10 steps) all have an SM of their own, where its part models at least 12%
    less time than ``now``; else None."""
    fits = [b for b in _SPLIT_WIDER_BN if b > above and m_tiles * -(-gemm_n // b) * ways <= sm_count
            and k_iters_ // ways >= _SMALL_SPLIT_PART_K_ITERS]
    best = min(fits, key=lambda b: _part_cost(b, k_iters_, ways), default=None)
    if best is None or _part_cost(best, k_iters_, ways) > 0.88 * now:
        return None
    return best, ways


#: :func:`_long_reduction_tile`: the reductions it serves (at least this many steps), the tiles it tries
#: besides the width rule's, the share of the modelled time a tile must save to replace it, and the model's
#: rates: a CTA's wgmma rate (FLOP per us) and what L2 delivers to all SMs together (bytes per us), both
#: from the DeepLab layers of docs/tuning.md T-long-k.
_LONG_K_ITERS, _LONG_K_TILES, _LONG_K_GAIN = 128, ((192, 128), (128, 256), (128, 128)), 0.85
_SM_FLOPS_PER_US, _L2_BYTES_PER_US = 7.0e6, 8.5e6


def _busiest_steps(tiles: int, sm_count: int, k_iters_: int) -> int:
    """Reduction steps of the busiest CTA for ``tiles`` tiles as the automatic split rules run them (every
    tile in parts for a small problem, the tail in halves, else whole waves), a hand-over included."""
    ways = _small_split_ways(tiles, sm_count, k_iters_, 1, None, None)
    if ways:
        return -(-k_iters_ // ways) + _SPLIT_HANDOVER_K_ITERS
    if _split_tiles(tiles, sm_count, k_iters_, 1, None):
        return (tiles // sm_count) * k_iters_ + -(-k_iters_ // 2) + _SPLIT_HANDOVER_K_ITERS
    return -(-tiles // sm_count) * k_iters_


def _tile_time_us(gemm_m: int, gemm_n: int, sm_count: int, k_iters_: int, bm: int, bn: int) -> float:
    """The modelled time of ``bm`` x ``bn`` im2col tiles: the busiest CTA's wgmmas, or the bytes all tiles
    read through L2 ((BM + BN) x 64 channels x 2 bytes a step), whichever takes longer."""
    tiles = -(-gemm_m // bm) * -(-gemm_n // bn)
    compute = _busiest_steps(tiles, sm_count, k_iters_) * bm * bn * 2 * BLOCK_K / _SM_FLOPS_PER_US
    l2 = tiles * k_iters_ * (bm + bn) * 2 * BLOCK_K / _L2_BYTES_PER_US
    return max(compute, l2)


def _long_reduction_tile(gemm_m: int, gemm_n: int, sm_count: int, k_iters_: int, bm: int, bn: int,
                         loads_residual: bool) -> Optional[Tuple[int, int]]:
    """``(BM, BN)`` of :data:`_LONG_K_TILES` for a reduction of at least :data:`_LONG_K_ITERS` steps where
    :func:`_tile_time_us` models at most :data:`_LONG_K_GAIN` of the time of ``bm`` x ``bn`` (the width and
    height rules' choice), else None (docs/tuning.md T-long-k). Over a long reduction a tile's time is its
    steps, and the narrow, short tiles the wave rules favour read the most bytes per multiply-add: L2
    bounds them."""
    if k_iters_ < _LONG_K_ITERS:
        return None

    def time_of(tile):
        return _tile_time_us(gemm_m, gemm_n, sm_count, k_iters_, *tile)

    fits = [t for t in _LONG_K_TILES if bm_fits(t[0], t[1], 1, loads_residual, halo=False)]
    best = min(fits, key=time_of, default=None)
    if best is None or best == (bm, bn) or time_of(best) > _LONG_K_GAIN * time_of((bm, bn)):
        return None
    return best


#: :func:`_split_wider_small`: the parts of its wider tiles.
_SPLIT_WIDER_SMALL_WAYS = 3


def _split_wider_small(m_tiles: int, gemm_n: int, sm_count: int, k_iters_: int, bn: int,
                       ways: int) -> Optional[Tuple[int, int]]:
    """``(BN, 3)``: for a small problem split into ``ways`` parts of ``bn``-wide tiles (:func:`_small_split_ways`)
    with a reduction of at least 64 steps, 128- or 160-wide tiles in three parts where every part still has
    an SM of its own and :func:`_split_wider`'s model predicts at least 12% less time for a part; else None
    (docs/tuning.md T-split-wider). A small problem's parts run in one round, so the slowest part sets the
    time: fewer, wider tiles in a few parts each beat many narrow ones in two (the SD UNet's 3x3 layers of
    1280 filters at 16x16)."""
    if k_iters_ < _SPLIT_WIDER_MIN_K_ITERS:
        return None
    return _wider_in_parts(m_tiles, gemm_n, sm_count, k_iters_, _part_cost(bn, k_iters_, ways),
                           _SPLIT_WIDER_SMALL_WAYS, above=bn)


def _bn_rule(m_tiles: int, gemm_n: int, sm_count: int) -> int:
    """The base rule over BN in {64, 128, 256} (docs/tuning.md T-bn-rule): the smallest BN covering N up
    to 128; above, 256 (twice the MMA work per A byte) unless it pads N more than 128 would or leaves
    fewer tiles than SMs."""
    if gemm_n <= 64:
        return 64
    if gemm_n <= 128:
        return 128
    pad256 = -(-gemm_n // 256) * 256
    pad128 = -(-gemm_n // 128) * 128
    return 256 if (pad256 <= pad128 and m_tiles * (pad256 // 256) >= sm_count) else 128


def _modelled_cost(m_tiles: int, gemm_n: int, bn: int, sm_count: int) -> int:
    """Relative time of a BN choice: waves x per-tile time, the latter taken as BN + 32 (docs/tuning.md T-bn-cost)."""
    return -(-(m_tiles * -(-gemm_n // bn)) // sm_count) * (bn + 32)


def _cheaper_bn(m_tiles: int, gemm_n: int, sm_count: int, bn: int, candidates) -> int:
    """``bn``, or the candidate for which :func:`_modelled_cost` predicts at least 12% less time (the
    cheapest of them; docs/tuning.md T-bn-cost)."""
    cost = functools.partial(_modelled_cost, m_tiles, gemm_n, sm_count=sm_count)
    best = min(candidates, key=cost, default=None)
    return best if best is not None and cost(best) <= 0.88 * cost(bn) else bn


def _tf32_bn(m_tiles: int, gemm_n: int, sm_count: int) -> int:
    """BN for tf32 products (docs/tuning.md T-tf32-bn): at most 128. A tf32 wgmma takes twice as long per
    operand byte as a 16-bit one, so the A re-reads that 256-wide tiles save matter less than the finer
    waves of 128-wide ones. 96, 160 or 192 replace 128 only where they pad N less and
    :func:`_cheaper_bn` takes them (N = 96, 144, 160, ...)."""
    bn = 64 if gemm_n <= 64 else 128
    padded = -(-gemm_n // bn) * bn
    fewer_pads = [b for b in STAGES if b not in _BASE_BN and -(-gemm_n // b) * b < padded]
    return _cheaper_bn(m_tiles, gemm_n, sm_count, bn, fewer_pads)


def bm_fits(block_m: int, block_n: int, cluster: int, loads_residual: bool, halo: bool) -> bool:
    """Whether a ``block_m`` x ``block_n`` tile is a variant the kernel builds without spilling: 128
    rows always; 192 for :data:`MID_M_BN`; 256 for :data:`WIDE_M_BN` (and BN 128 on halo tiles without
    a residual); every height for the narrow variant's :data:`NARROW_BLOCK_N`. Taller tiles never in CTA pairs (docs/tuning.md N-tall-pairs, N-mid-pairs)."""
    if block_m == BLOCK_M:
        return True
    if cluster != 1:
        return False
    if block_n == NARROW_BLOCK_N:  # the narrow variant: 8 accumulators per thread at any height
        return True
    if block_m == 192:
        return block_n in MID_M_BN
    wide = WIDE_M_BN + ((128,) if halo and not loads_residual else ())
    return block_n in wide


def _tall_pays(tall: int, short: int, sm_count: int) -> bool:
    """256-row tiles fill at least one wave and need no more than half the waves of 128-row ones, give
    or take :data:`_TALL_WAVE_SLACK` (docs/tuning.md T-bm-tall)."""
    return tall >= sm_count and 2 * -(-tall // sm_count) <= _TALL_WAVE_SLACK * -(-short // sm_count)


def _mid_pays(mid: int, short: int, sm_count: int, ties: bool = False) -> bool:
    """192-row tiles do 1.5x the work of 128-row ones, so they must take fewer tile-times: 3 x their
    waves < 2 x the 128-row waves; ties keep 128 rows (docs/tuning.md T-bm-mid) unless ``ties`` (halo
    tiles 64 columns wide, whose window rows per output row fall from 2 to 5/3: T-halo-narrow-n)."""
    mid_time, short_time = 3 * -(-mid // sm_count), 2 * -(-short // sm_count)
    return mid_time <= short_time if ties else mid_time < short_time


def _auto_block_m(tiles: dict, block_n: int, cluster: int, loads_residual: bool, sm_count: int, halo: bool) -> int:
    """The automatic height given ``tiles`` = {BM: tile count}: 256 where it fits and pays (on im2col
    tiles not with a residual: its C ring leaves 3-4 slots), else 192 where it fits and pays (halo tiles
    64 columns wide: on ties too), else 128."""
    tall_ok = _tall_pays(tiles[256], tiles[BLOCK_M], sm_count) and (halo or not loads_residual)
    if tall_ok and bm_fits(256, block_n, cluster, loads_residual, halo):
        return 256
    ties = halo and block_n == _HALO_NARROW_N_BN
    if bm_fits(192, block_n, cluster, loads_residual, halo) and _mid_pays(tiles[192], tiles[BLOCK_M], sm_count, ties):
        return 192
    return BLOCK_M


def _pingpong_fits(block_m: int, block_n: int) -> bool:
    """One warpgroup holds a whole tile: BM/64 x BN/2 fp32 accumulators per thread, at most 128."""
    return block_m in PINGPONG_BLOCK_MS and (block_m // 64) * (block_n // 2) <= 128


def pingpong_block_m(block_n: int) -> int:
    """The tallest ping-pong tile of width ``block_n`` (64 rows at BN 160..256, 128 at 96/128, 256 at 64)."""
    return max(b for b in PINGPONG_BLOCK_MS if _pingpong_fits(b, block_n))


def _pingpong_pays(pingpong: Optional[bool], auto_bn: bool, block_m: Optional[int], gemm_n: int,
                   loads_residual: bool, cluster: int) -> bool:
    """The automatic choice runs a halo problem as ping-pong 128 x 128 tiles where N is a multiple of
    128, without a residual or CTA pairs, and neither the tile nor ping-pong is forced (docs/tuning.md
    T-pingpong)."""
    return (pingpong is None and auto_bn and block_m is None and not loads_residual and cluster == 1
            and gemm_n % 128 == 0)


def _halo_rule(planes: int, P: int, Q: int, taps_hw: int, k_iters_: int = 0, block_n: int = 0) -> bool:
    """Halo tiles beat im2col boxes when at most 1/8 of the padded columns are padding (a tile covers 64
    columns) and the filter has more than one (r, s) tap to share (docs/tuning.md T-halo-rule); at most
    1/4 where a tile's reduction is one channel block per tap (``0 < k_iters <= R*S``: T-halo-one-block);
    at most 3/8 on tiles 64 columns wide (``block_n``: T-halo-narrow-n)."""
    return taps_hw > 1 and _padding_within(Q, _halo_max_pad(k_iters_, taps_hw, block_n))


def _halo_max_pad(k_iters_: int, taps_hw: int, block_n: int) -> Fraction:
    """The share of a halo tile's columns :func:`_halo_rule` lets be padding."""
    if block_n == _HALO_NARROW_N_BN:
        return _HALO_NARROW_N_MAX_PAD
    return _HALO_ONE_BLOCK_MAX_PAD if 0 < k_iters_ <= taps_hw else _HALO_MAX_PAD


def _padding_within(Q: int, share: Fraction) -> bool:
    """Whether at most ``share`` of the columns of 64-column tiles over ``Q`` output columns are padding."""
    padded = -(-Q // 64) * 64
    return padded - Q <= share * padded


def _narrow_halo_pays(planes: int, P: int, Q: int, taps_hw: int) -> bool:
    """Narrow tiles (:data:`NARROW_BLOCK_N` columns) take halo windows where the filter has more than one
    (r, s) tap and at most 5/8 of the padded columns are padding (docs/tuning.md T-narrow-out): their
    MMA work is small, so what bounds them is the bytes each tile reads from L2, R x S boxes of its rows
    against one window."""
    return taps_hw > 1 and _padding_within(Q, _NARROW_HALO_MAX_PAD)


def _narrow_halo_res_pays(auto_bn: bool, bn: int, gemm_n: int, block_m: Optional[int], cluster: int) -> bool:
    """With a residual, 192 x 128 halo tiles (five filter slots) replace 128 x 256 ones (four) where
    N <= 256 (docs/tuning.md T-halo-narrow-res)."""
    bn2, bm2 = _NARROW_HALO_RES
    return (auto_bn and bn == 256 and gemm_n <= 256 and cluster == 1 and block_m in (None, bm2)
            and bm_fits(bm2, bn2, cluster, True, halo=True) and halo_stages(bm2, bn2, True) >= HALO_MIN_RES_STAGES)


def choose_tile_config(gemm_m: int, gemm_n: int, sm_count: int = 132, cluster: Optional[int] = None,
                       block_n: Optional[int] = None, k_iters: int = 0, split: Optional[bool] = None,
                       split_ways: Optional[int] = None,
                       block_m: Optional[int] = None, loads_residual: bool = False,
                       halo_geometry: Optional[tuple] = None, halo: Optional[bool] = None,
                       pingpong: Optional[bool] = None, tf32: bool = False, a_cf: bool = False,
                       a_xpose: bool = False) -> TileConfig:
    """The tile configuration of a GEMM of ``gemm_m`` x ``gemm_n`` whose tiles take ``k_iters`` reduction
    steps. Pure; every keyword left None is chosen automatically.

    * BN: :func:`_bn_rule`, replaced by 96, 160 or 192 (or 128 where the rule says 256) where
      :func:`_modelled_cost` predicts at least 12% less time (less padding or a fuller last wave:
      docs/tuning.md T-bn-cost, T-bn-256-waves); ``block_n`` forces it.
    * ``tf32`` (float32 operands multiplied as tf32): :func:`_tf32_bn` instead.
    * Height: :func:`_auto_block_m`; ``block_m`` forces it where the variant exists (:func:`bm_fits`).
    * ``cluster`` = 2: pairs of CTAs multicasting the filter tile, when there are two row tiles.
    * The split tail (:func:`_split_tiles`); ``split`` forces it on or off.
    * Long reductions (:func:`_long_reduction_tile`): 192 x 128, 128 x 256 or 128 x 128 tiles where they
      model 15% less time than the width and height rules' tile (automatic choices of single CTAs only).
    * Small problems (at most half as many tiles as SMs, long reductions): every tile cut into parts
      along the reduction (:func:`_small_split_ways`); ``split_ways`` forces the count, ``split=False``
      switches it off. Where the tiles (or a small problem's parts) would fill one partial wave, wider
      tiles in two (three) parts where :func:`_split_wider` (:func:`_split_wider_small`) models them
      faster (automatic width, height and split only).
    * Halo tiles where ``halo_geometry`` = (planes, P, Q, R*S) is given (else the problem cannot use
      them) and :func:`_halo_rule` or ``halo`` says so; with a residual only where the filter ring keeps
      :data:`HALO_MIN_RES_STAGES` slots, or as 192 x 128 tiles (:func:`_narrow_halo_res_pays`).
    * Ping-pong on halo tiles where :func:`_pingpong_pays` (128 x 128) or ``pingpong`` forces it (the
      tallest tile one warpgroup holds, unless ``block_m`` fits).
    * ``a_cf``: halo tiles reading channels-first x (where :func:`channels_first_x_decline` allows them,
      ``halo`` True, no C ring: the channels-first epilogue's consumers read the residual); their heights
      are those the channels-first epilogue builds with a residual (:func:`bm_fits`), single CTAs.
    * ``a_xpose``: the same for halo tiles transposing staged rows of channels-first x into their windows
      (:func:`transposed_x_decline`); the staging ring takes its share of the filter ring's memory.
    The grid is persistent (as many clusters as fit, striding over the units) when there are more
    units than SMs; the launch lowers it to the clusters the device co-schedules.
    """
    if block_n is not None and block_n not in STAGES and block_n not in F32_BLOCK_NS:
        raise ValueError(f"block_n: expected one of {sorted(STAGES)}, got {block_n!r}")
    if block_m is not None and block_m not in PINGPONG_BLOCK_MS:
        raise ValueError(f"block_m: expected 64 (ping-pong), 128, 192 or 256, got {block_m!r}")
    bn, bm, cl = block_n, block_m, cluster or 1
    m_tiles = -(-gemm_m // BLOCK_M)
    auto_bn = bn is None
    note = ""
    if bn is None and tf32:
        bn = _tf32_bn(m_tiles, gemm_n, sm_count)
    elif bn is None:
        rule = _bn_rule(m_tiles, gemm_n, sm_count)
        candidates = [b for b in STAGES if b not in _BASE_BN or (b, rule) == (128, 256)]
        bn = _cheaper_bn(m_tiles, gemm_n, sm_count, rule, candidates)
    use_halo = halo_geometry is not None and (_halo_rule(*halo_geometry, k_iters, bn) if halo is None else halo)
    if use_halo and halo is None and loads_residual:
        if _narrow_halo_res_pays(auto_bn, bn, gemm_n, bm, cl):
            bn, bm = _NARROW_HALO_RES
            note = (f"BN {bn} instead of 256: with a residual and N <= 256, {bm}x{bn} halo tiles beat 128x256 "
                    f"ones (their C ring leaves {halo_stages(BLOCK_M, 256, True)} filter slots)")
        elif halo_stages(BLOCK_M, bn, True) < HALO_MIN_RES_STAGES:
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
                bm = pingpong_block_m(bn)
            m_tiles = row_tiles(bm)
            return TileConfig(block_m=bm, block_n=bn, block_k=BLOCK_K, stages=halo_stages(bm, bn, False, a_cf, a_xpose),
                              m_tiles=m_tiles, n_tiles=n_tiles, grid=max(1, min(m_tiles * n_tiles, sm_count)),
                              k_iters=k_iters, halo=True, pingpong=True, a_cf=a_cf, a_xpose=a_xpose, note=note)
        if bm == 64:
            bm = None  # 64-row tiles exist only in ping-pong
        rows_tiles = {b: row_tiles(b) * n_tiles for b in BLOCK_MS}
        fits_as = loads_residual or a_cf or a_xpose  # the channels-first epilogue holds a residual's registers
        if bm is None:
            bm = _auto_block_m(rows_tiles, bn, cl, fits_as, sm_count, halo=True)
        if not bm_fits(bm, bn, cl, fits_as, halo=True):
            bm = BLOCK_M
        m_tiles = rows_tiles[bm] // n_tiles
        cl = cl if m_tiles >= 2 else 1
        units = -(-m_tiles // cl) * n_tiles
        return TileConfig(block_m=bm, block_n=bn, block_k=BLOCK_K,
                          stages=halo_stages(bm, bn, loads_residual, a_cf, a_xpose), m_tiles=m_tiles,
                          n_tiles=n_tiles,
                          grid=cl * max(1, min(units, sm_count // cl)), cluster=cl, k_iters=k_iters, halo=True,
                          a_cf=a_cf, a_xpose=a_xpose, note=note)
    if bm == 64:
        bm = None  # 64-row tiles exist only in ping-pong
    if bm is None:
        bm = _auto_block_m({b: -(-gemm_m // b) * -(-gemm_n // bn) for b in BLOCK_MS}, bn, cl, loads_residual, sm_count,
                           halo=False)
    if not bm_fits(bm, bn, cl, loads_residual, halo=False):
        bm = BLOCK_M
    m_tiles = -(-gemm_m // bm)
    cl = cl if m_tiles >= 2 else 1
    n_tiles = -(-gemm_n // bn)
    ways = _small_split_ways(m_tiles * n_tiles, sm_count, k_iters, cl, split, split_ways)
    wider = None
    if auto_bn and not tf32 and block_m is None and bm == BLOCK_M and cl == 1 and split is None \
            and split_ways is None:
        wider = (_split_wider_small(m_tiles, gemm_n, sm_count, k_iters, bn, ways) if ways
                 else _split_wider(m_tiles, gemm_n, sm_count, k_iters, bn))
    if wider:
        bn, ways = wider
        n_tiles = -(-gemm_n // bn)
        note = (f"BN {bn} in {ways} parts along the reduction: narrower tiles would fill one partial wave "
                f"of the SMs (docs/tuning.md T-split-wider)")
    elif (not ways and auto_bn and not tf32 and block_m is None and cl == 1 and split is None
          and split_ways is None):
        long_tile = _long_reduction_tile(gemm_m, gemm_n, sm_count, k_iters, bm, bn, loads_residual)
        if long_tile:
            note = (f"{long_tile[0]}x{long_tile[1]} tiles instead of {bm}x{bn}: over {k_iters} reduction steps "
                    f"the bytes the tiles read through L2 bound the narrower ones (docs/tuning.md T-long-k)")
            bm, bn = long_tile
            m_tiles, n_tiles = -(-gemm_m // bm), -(-gemm_n // bn)
            ways = _small_split_ways(m_tiles * n_tiles, sm_count, k_iters, cl, split, split_ways)
    if ways:
        sp = m_tiles * n_tiles
    else:
        sp, ways = _split_tiles(m_tiles * n_tiles, sm_count, k_iters, cl, split), 2
    units = -(-m_tiles // cl) * n_tiles + sp * (ways - 1)
    return TileConfig(block_m=bm, block_n=bn, block_k=BLOCK_K, stages=stages_for(bm, bn, loads_residual),
                      m_tiles=m_tiles, n_tiles=n_tiles, grid=cl * max(1, min(units, sm_count // cl)), cluster=cl,
                      split_tiles=sp, split_ways=ways, k_iters=k_iters, note=note)


#: Tile widths of the float32-output variant: its promotion (kernels_cu/sm90/wgmma_mainloop.cuh)
#: keeps a second set of accumulators, which fits 128-row tiles up to 128 columns (no ping-pong); 16
#: for the narrow last layers of decoders (K = 3 or 4), whose 64-column tiles would multiply 16
#: times as many zero columns (docs/tuning.md#T-f32-narrow).
F32_BLOCK_NS = (16, 64, 96, 128)


#: Tile width of the narrow variant (``_nk``: 16-bit output stored value by value, any K): the last layers of
#: decoders and heads (K = 1-16), which 64-column tiles would run with 4-64 times the MMA work they need
#: (docs/tuning.md#T-narrow-out).
NARROW_BLOCK_N = 16
#: The widest output the automatic choice runs on the narrow variant.
NARROW_MAX_K = 16


def narrow_tiles(problem, overrides) -> bool:
    """Whether a 16-bit problem runs on the narrow variant: K <= :data:`NARROW_MAX_K` and a filter of more
    than one tap with the tile width automatic (one-tap maps to a few channels are the pointwise kernels'),
    or ``overrides.block_n`` = :data:`NARROW_BLOCK_N` (any K). Where K is a multiple of 8, a forced choice
    the narrow variant lacks (ping-pong warpgroups, x read channels-first) leaves the layer to the
    64-column tiles that have it."""
    o = overrides
    if o.block_n is not None:
        return o.block_n == NARROW_BLOCK_N
    lacks = o.pingpong or o.x_channels_first or o.x_transpose
    return (problem.out_channels <= NARROW_MAX_K and math.prod(problem.filter_spatial) > 1
            and not (lacks and problem.out_channels % 8 == 0))


def f32_block_n(gemm_n: int, forced: Optional[int] = None) -> int:
    """The float32-output variant's BN: ``forced`` where it is one of :data:`F32_BLOCK_NS`, else the
    narrowest that covers N, at most 128."""
    if forced in F32_BLOCK_NS:
        return forced
    return next((b for b in F32_BLOCK_NS if b >= gemm_n), F32_BLOCK_NS[-1])


def tile_config(problem, sm_count: int, overrides, out_f32: bool = False, tf32: bool = False,
                a_cf: bool = False, a_xpose: bool = False, narrow: bool = False) -> TileConfig:
    """The tile configuration of ``problem`` on ``sm_count`` SMs under ``overrides``
    (:class:`cuconv.overrides.Overrides`); ``out_f32``: for the float32-output variant with promotion
    (128-row tiles, :func:`f32_block_n`, no ping-pong); ``tf32``: for tf32 products (:func:`_tf32_bn`);
    ``a_cf``: halo tiles reading x channels-first (where :func:`channels_first_x_decline` allows them);
    ``a_xpose``: halo tiles transposing staged rows of channels-first x (where :func:`transposed_x_decline`
    allows them); ``narrow``: the narrow variant (:data:`NARROW_BLOCK_N` columns, cooperative warpgroups)."""
    o = overrides
    block_m, block_n, pingpong, halo = o.block_m, o.block_n, o.pingpong, o.halo
    if a_cf and a_xpose:
        raise ValueError("a_cf, a_xpose: a variant reads channels-first x one way")
    if a_cf or a_xpose:
        why = channels_first_x_decline(problem) if a_cf else transposed_x_decline(problem)
        if why is not None:
            raise ValueError(f"{'a_cf' if a_cf else 'a_xpose'}: {why}")
        return choose_tile_config(problem.gemm_m, problem.gemm_n, sm_count or 132, block_n=block_n,
                                  k_iters=k_iters(problem), block_m=block_m, loads_residual=False,
                                  halo_geometry=_row_tile_geometry(problem), halo=True, pingpong=pingpong,
                                  a_cf=a_cf, a_xpose=a_xpose)
    geometry = halo_geometry(problem)
    if out_f32:
        block_m, block_n, pingpong = BLOCK_M, f32_block_n(problem.gemm_n, o.block_n), False
    elif narrow:
        block_n, pingpong = NARROW_BLOCK_N, False
        if halo is None and geometry is not None:
            halo = _narrow_halo_pays(*geometry)
    return choose_tile_config(problem.gemm_m, problem.gemm_n, sm_count or 132, cluster=o.cluster, block_n=block_n,
                              k_iters=k_iters(problem), split=o.split, split_ways=o.split_ways, block_m=block_m,
                              loads_residual=problem.epilogue.loads_residual, halo_geometry=geometry,
                              halo=halo, pingpong=pingpong, tf32=tf32)


#: :func:`halo_why_not`'s answer where halo tiles are switched off.
HALO_SWITCHED_OFF = "switched off (overrides(halo=False) / CUCONV_SM90_HALO=0)"


def halo_why_not(problem, overrides, narrow: bool = False, block_n: int = 0) -> str:
    """Why a problem runs on im2col boxes rather than halo tiles (for ``explain``); ``narrow``: on the
    narrow variant's tiles (:func:`_narrow_halo_pays`); ``block_n``: the width of the tiles it runs."""
    why = halo_decline(problem)
    if why:
        return why
    if overrides.halo is False:
        return HALO_SWITCHED_OFF
    planes, P, Q, taps = halo_geometry(problem)
    if taps == 1:
        return "one (r, s) tap: no window to share"
    if narrow:
        return (f"{Q} output columns pad to {-(-Q // 64) * 64} in 64-column halo tiles (more than "
                f"{_NARROW_HALO_MAX_PAD} of them padding, the narrow tiles' bound)")
    if _halo_rule(planes, P, Q, taps, k_iters(problem), block_n):
        return (f"with a residual, halo tiles of this width keep fewer than {HALO_MIN_RES_STAGES} filter slots "
                f"next to the C ring")
    limit = _halo_max_pad(k_iters(problem), taps, block_n)
    return (f"{Q} output columns pad to {-(-Q // 64) * 64} in 64-column halo tiles (more than {limit} of them "
            f"padding)")
