"""The tile policy and compiled variants of ``depthwise_diag`` (kernels_cu/depthwise/depthwise_diag.cu).

A pure function of the problem. :func:`diag_declined` says why the kernel's design cannot take a problem;
:func:`diag_config` picks the output tile (2-32 rows x 8-64 columns) of a 16-channel chunk by a cost
model of the GPU's CTAs and checks shared memory; :func:`diag_variant` names the compiled variant and
its ``-D`` defines.
Compile-time: dtype, R, S, the strides and dilations, the tile.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

from ...launch import dtype_code, dtype_tag
from ...problem import ConvProblem
from .variants import SMEM_LIMIT, depthwise_declined, plane_offsets_declined, problem_axes

__all__ = ["DwDiagConfig", "diag_config", "diag_declined", "diag_variant", "DIAG_SOURCE", "DIAG_CATALOG",
           "COMPILE_VARIANTS", "MAX_TAPS", "MIN_BLOCKS", "SMEM_TARGET", "CHUNK", "STAGES", "stage_bytes"]

DIAG_SOURCE = "depthwise/depthwise_diag.cu"
#: Threads per CTA (8 warps; ``THREADS`` of the kernel).
THREADS = 256
#: CTAs per SM the kernel is compiled for (``__launch_bounds__``: at most 80 registers a thread; at 64 the
#: 3x3 variants spill).
MIN_BLOCKS = 3
#: Stages of the CTA's ring in shared memory (``STAGES`` of the kernel): the item computed and the
#: ``STAGES - 1`` copied ahead of it. Three tiles in flight per CTA (nine per SM) keep DRAM busy where one
#: left each CTA waiting on its copy (docs/tuning.md#T-dw-diag).
STAGES = 4
#: Shared memory a CTA aims at (its ring of :data:`STAGES` stages): :data:`MIN_BLOCKS` CTAs per SM on the
#: H100 (228 KiB an SM, 1 KiB of it reserved per CTA).
SMEM_TARGET = (228 // MIN_BLOCKS - 1) * 1024
#: Filter taps at most: a lane keeps the B fragments of 2 channel groups x 5 tap pairs (20 registers).
MAX_TAPS = 9
#: Channels per chunk (``CB`` of the kernel): two 8-channel groups, a 32-byte pixel run.
CHUNK = 16
#: Input tile columns at most: a tile row's 16-byte copy units (2 a pixel) fit the CTA's threads.
MAX_IN_COLS = THREADS // 2
#: Per-tile overhead of the cost model, in pixels of work: the item's decode, barrier and copy issue.
TILE_OVERHEAD = 48
#: The cost model's time to the first tile of a CTA's run, in pixels of work (a DRAM latency, about a
#: microsecond, at the rate a CTA of a full H100 is fed: 32 bytes x 396 CTAs / 3 TB/s = 4 ns a pixel).
FILL = 256
#: SMs of the GPU the cost model assumes where the plan's device is not given (an H100 SXM).
NOMINAL_SMS = 132


def row_pixels(in_cols: int, sw: int) -> int:
    """Pixels a tile row takes in shared memory: ``in_cols`` rounded up to whole W-stride phases (the
    kernel's ``ROW_PIX``)."""
    return -(-in_cols // sw) * sw


def stage_bytes(in_rows: int, in_cols: int, sw: int, taps: int) -> int:
    """Shared memory of one stage of the ring: the input tile (16 channels, 2 bytes each, per pixel), then
    the chunk's weights (16 channels x ``taps``)."""
    return in_rows * row_pixels(in_cols, sw) * CHUNK * 2 + CHUNK * taps * 2


def ring_bytes(in_rows: int, in_cols: int, sw: int, taps: int) -> int:
    """Shared memory of the ring: :data:`STAGES` stages (:func:`stage_bytes`)."""
    return STAGES * stage_bytes(in_rows, in_cols, sw, taps)


@dataclass(frozen=True)
class DwDiagConfig:
    """One launch shape of ``depthwise_diag`` (fields shared with ``DwGeometry`` keep its names: ``tqg``
    = the tile's 8-column groups, ``cin`` = the tile's channels)."""

    tp: int         # output rows per tile (even)
    tq: int         # output columns per tile (a multiple of 8)
    in_rows: int    # the input tile (halo included)
    in_cols: int
    tiles_p: int
    tiles_q: int
    chunks: int
    taps: int = 9   # filter taps: the weights of a stage
    sw: int = 1     # W stride: the phases a tile row is stored in
    mult: int = 1
    cb: int = CHUNK  # channels per chunk
    vin: int = 8    # channels per input copy (16 bytes)
    vec: int = 8    # channels per epilogue store (16 bytes)

    @property
    def tqg(self) -> int:
        return self.tq // 8

    @property
    def cin(self) -> int:
        return self.cb

    @property
    def cv(self) -> int:
        return self.cb // self.vec

    @property
    def threads(self) -> int:
        return THREADS

    @property
    def row_pixels(self) -> int:
        """Pixels a tile row takes in shared memory (:func:`row_pixels`)."""
        return row_pixels(self.in_cols, self.sw)

    @property
    def smem(self) -> int:
        """Dynamic shared memory (bytes): the ring of :data:`STAGES` stages (:func:`ring_bytes`)."""
        return ring_bytes(self.in_rows, self.in_cols, self.sw, self.taps)

    @property
    def m_blocks(self) -> int:
        """MMA row blocks (2 output rows x 8 columns) per tile."""
        return self.tp // 2 * self.tqg

    def tiles(self, p: ConvProblem) -> int:
        """Output tiles of ``p``: chunks x images x tiles per plane."""
        return p.batch * self.tiles_p * self.tiles_q * self.chunks


def diag_declined(p: ConvProblem) -> Optional[str]:
    """Why ``depthwise_diag``'s design cannot take ``p``, or None."""
    why = depthwise_declined(p) or plane_offsets_declined(p)
    if why:
        return why
    if p.nd != 2:
        return "conv3d: the tap-pair tensor-core kernel is 2-D (depthwise_direct takes filter slices)"
    if p.out_channels != p.channels:
        return (f"channel multiplier {p.out_channels // p.channels}: B's diagonal blocks map each input "
                f"channel to itself (multiplier 1)")
    if p.channels % CHUNK:
        return (f"C = {p.channels} is not a multiple of {CHUNK}: a chunk is two 8-channel groups (16-byte A "
                f"rows)")
    _, R, S, (sh, sw), _, _ = problem_axes(p)
    if R * S > MAX_TAPS:
        return (f"{R}x{S} filter: {R * S} taps > {MAX_TAPS} (a lane keeps two B registers per pair of taps and "
                f"channel group)")
    if sw > 2 or sh > 2:
        return f"stride {(sh, sw)}: the kernel's variants take strides 1 and 2"
    if max(p.dilation) > 2:
        return f"dilation {p.dilation}: the kernel's variants take dilations 1 and 2"
    if p.gemm_m >= 2**31:
        return f"{p.gemm_m} output pixels: over the kernel's 32-bit pixel index"
    return None


def input_extent(tp: int, tq: int, R: int, S: int, stride, dilation):
    """``(in_rows, in_cols)`` of the input tile of a tp x tq output tile."""
    (sh, sw), (dh, dw) = stride, dilation
    return (tp - 1) * sh + (R - 1) * dh + 1, (tq - 1) * sw + (S - 1) * dw + 1


def diag_config(p: ConvProblem, smem_limit: int = SMEM_LIMIT, sm_count: int = NOMINAL_SMS) -> Union[DwDiagConfig, str]:
    """The launch shape for ``p`` (see :func:`diag_declined`) on a GPU of ``sm_count`` SMs, or the reason
    there is none.

    Among the tiles of 2-32 rows x 8-64 columns whose ring fits :data:`SMEM_TARGET` (and whose rows fit
    :data:`MAX_IN_COLS`), the one of the least time by the cost model: a CTA's run of items (the rounds
    of items over the ``sm_count`` x :data:`MIN_BLOCKS` CTAs, the longest run counted) times the work
    of an item -- its input tile with the halo, the outputs computed (those past the plane included, and
    the blocks of warps left idle when a tile's M blocks are not a multiple of 8) and
    :data:`TILE_OVERHEAD` -- plus :data:`FILL` for the first copy."""
    _, R, S, stride, dilation, (P, Q) = problem_axes(p)
    taps = R * S
    ctas = max(sm_count, 1) * MIN_BLOCKS
    items_per_tile = p.batch * (p.channels // CHUNK)  # a tile position's items: images x chunks
    best = None
    for tq in range(8, min(64, -(-Q // 8) * 8) + 1, 8):
        for tp in range(2, min(32, -(-P // 2) * 2) + 1, 2):
            rows, cols = input_extent(tp, tq, R, S, stride, dilation)
            smem = ring_bytes(rows, cols, stride[1], taps)
            if cols > MAX_IN_COLS or (smem > SMEM_TARGET and not (tp == 2 and tq == 8)):
                continue
            blocks = tp // 2 * tq // 8
            computed = -(-blocks // 8) * 8 * 16  # the warps' rounds of blocks, in pixels
            rounds = -(-(items_per_tile * -(-P // tp) * -(-Q // tq)) // ctas)
            cost = rounds * (rows * cols + computed + TILE_OVERHEAD) + FILL
            if best is None or cost < best[0]:
                best = (cost, tp, tq, rows, cols, smem)
    if best is None:
        return (f"input rows of {input_extent(2, 8, R, S, stride, dilation)[1]} pixels for 8 outputs exceed the "
                f"{MAX_IN_COLS} a tile row's copies take")
    _, tp, tq, rows, cols, smem = best
    if smem > smem_limit:
        return (f"the smallest tile (2 x 8 outputs) reads {rows} x {cols} input pixels with its halo: {smem} "
                f"bytes of shared memory in {STAGES} stages, over the {smem_limit} the kernel uses")
    cfg = DwDiagConfig(tp=tp, tq=tq, in_rows=rows, in_cols=cols, tiles_p=-(-P // tp), tiles_q=-(-Q // tq),
                       chunks=p.channels // CHUNK, taps=taps, sw=stride[1])
    if cfg.tiles(p) >= 2**31:
        return f"{cfg.tiles(p)} tiles: over the 2**31 - 1 of the item index"
    return cfg


def diag_variant(p: ConvProblem, cfg: DwDiagConfig):
    """``(kernel name, defines)`` of the compiled variant serving ``p`` with ``cfg``."""
    _, R, S, (sh, sw), (dh, dw), _ = problem_axes(p)
    name = f"depthwise_diag_{dtype_tag(p.dtype)}_r{R}s{S}_s{sh}x{sw}d{dh}x{dw}_t{cfg.tp}x{cfg.tq}"
    defines = dict(CUCONV_DTYPE=dtype_code(p.dtype), DWD_R=R, DWD_S=S, DWD_SH=sh, DWD_SW=sw, DWD_DH=dh, DWD_DW=dw,
                   DWD_TP=cfg.tp, DWD_TQ=cfg.tq, DWD_STAGES=STAGES, DWD_MIN_BLOCKS=MIN_BLOCKS, CUCONV_KERNEL_NAME=name)
    return name, defines


def _catalog():
    """Problems whose variants CI compiles: MobileNetV2's and EfficientNet-B0's 3x3 layers (stride 1 and
    2) in both 16-bit dtypes, a dilated filter, a 1x9 one and an odd-sized plane."""
    def dw(c, hw, f, dtype="bfloat16", dil=1, stride=1):
        return ConvProblem.create(nd=2, batch=2, in_spatial=(hw, hw), channels=c, out_channels=c,
                                  filter_spatial=(f, f), stride=stride, dilation=dil, padding=dil * (f // 2),
                                  groups=c, dtype=dtype, layout="NHWC")
    out = {}
    for dtype in ("float16", "bfloat16"):
        for c, hw, s in ((32, 112, 1), (96, 112, 2), (144, 56, 1), (144, 56, 2), (192, 28, 1), (384, 14, 1),
                         (576, 14, 2), (960, 7, 1)):
            out[f"3x3_c{c}_{hw}_s{s}_{dtype}"] = dw(c, hw, 3, dtype, stride=s)
    out.update(dil2=dw(64, 20, 3, dil=2), odd=dw(48, 17, 3, "float16"),
               f1x9=ConvProblem.create(nd=2, batch=1, in_spatial=(30, 40), channels=32, out_channels=32,
                                       filter_spatial=(1, 9), stride=1, dilation=1, padding=(0, 4), groups=32,
                                       dtype="bfloat16", layout="NHWC"))
    return out


#: Named problems covering the compiled variants (tests/test_depthwise_diag.py).
DIAG_CATALOG = _catalog()
#: Every (source, defines, arch) of :data:`DIAG_CATALOG`, for the CPU compile test (tests/test_compile.py).
COMPILE_VARIANTS = [(DIAG_SOURCE, diag_variant(p, diag_config(p))[1], arch) for p in DIAG_CATALOG.values()
                    for arch in ("sm_80", "sm_90a")]
