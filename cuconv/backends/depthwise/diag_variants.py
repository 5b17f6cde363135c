"""The tile policy and compiled variants of ``depthwise_diag`` (kernels_cu/depthwise/depthwise_diag.cu).

A pure function of the problem. :func:`diag_declined` says why the kernel's design cannot take a problem;
:func:`diag_config` picks the chunk (8-32 channels) and the output tile (2-32 rows x 8-64 columns) and
checks shared memory; :func:`diag_variant` names the compiled variant and its ``-D`` defines.
Compile-time: dtype, R, S, the W stride and dilation, the tile and the chunk.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

from ...launch import dtype_code
from ...problem import ConvProblem
from .variants import SMEM_LIMIT, depthwise_declined, plane_offsets_declined, problem_axes

__all__ = ["DwDiagConfig", "diag_config", "diag_declined", "diag_variant", "DIAG_SOURCE", "DIAG_CATALOG",
           "COMPILE_VARIANTS", "MAX_TAPS", "min_blocks", "smem_target"]

DIAG_SOURCE = "depthwise/depthwise_diag.cu"
#: Threads per CTA (8 warps; ``THREADS`` of the kernel).
THREADS = 256
#: Filter taps at most: each lane keeps two B registers and one address offset per pair of taps (a 5x5
#: filter: 39).
MAX_TAPS = 25
#: Taps of the filters compiled for 4 CTAs per SM (``__launch_bounds__``: at most 64 registers a
#: thread); more taps get 3 (80 registers: a 5x5 filter spills at 64).
FOUR_CTA_TAPS = 9


def min_blocks(taps: int) -> int:
    """CTAs per SM a variant is compiled for (``DWD_MIN_BLOCKS``)."""
    return 4 if taps <= FOUR_CTA_TAPS else 3


def smem_target(taps: int) -> int:
    """Shared memory a CTA aims at (its two input-tile buffers): :func:`min_blocks` CTAs per SM on the
    H100 (228 KiB an SM)."""
    return (224 // min_blocks(taps) - 1) * 1024
#: Channels per chunk, widest first: 16-byte units of a pixel, one n-tile (8 channels) each.
CHUNKS = (32, 16, 8)
#: Per-tile overhead of the cost model, in pixels of work: the item's decode, barrier and copy issue.
TILE_OVERHEAD = 48
_DTYPE_TAG = {"float16": "f16", "bfloat16": "bf16"}


@dataclass(frozen=True)
class DwDiagConfig:
    """One launch shape of ``depthwise_diag`` (fields shared with ``DwGeometry`` keep its names: ``tqg``
    = the tile's 8-column groups, ``cin`` = the tile's channels)."""

    tp: int         # output rows per tile (even)
    tq: int         # output columns per tile (a multiple of 8)
    cb: int         # channels per chunk (8, 16 or 32)
    in_rows: int    # the input tile (halo included)
    in_cols: int
    tiles_p: int
    tiles_q: int
    chunks: int
    smem: int       # dynamic shared memory (bytes): two input-tile buffers
    mult: int = 1
    vin: int = 8    # channels per input copy (16 bytes)
    vec: int = 2    # channels per epilogue access (a lane's pair)

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
    if p.channels % 8:
        return f"C = {p.channels} is not a multiple of 8: A's rows are 16-byte runs of 8 channels"
    _, R, S, (sh, sw), _, _ = problem_axes(p)
    if R * S > MAX_TAPS:
        return f"{R}x{S} filter: {R * S} taps > {MAX_TAPS} (two B registers a lane per pair of taps)"
    if sw > 2:
        return f"W stride {sw}: the kernel's variants take W strides 1 and 2"
    return None


def input_extent(tp: int, tq: int, R: int, S: int, stride, dilation):
    """``(in_rows, in_cols)`` of the input tile of a tp x tq output tile."""
    (sh, sw), (dh, dw) = stride, dilation
    return (tp - 1) * sh + (R - 1) * dh + 1, (tq - 1) * sw + (S - 1) * dw + 1


def chunk_channels(C: int) -> int:
    """Channels per chunk: the widest of :data:`CHUNKS` dividing C (C is a multiple of 8)."""
    return next(cb for cb in CHUNKS if C % cb == 0)


def diag_config(p: ConvProblem, smem_limit: int = SMEM_LIMIT) -> Union[DwDiagConfig, str]:
    """The launch shape for ``p`` (see :func:`diag_declined`), or the reason there is none.

    The chunk is the widest of :data:`CHUNKS` dividing C. Among the tiles of 2-32 rows x 8-64 columns
    whose two buffers fit :func:`smem_target`, the one of the least work per chunk: input tiles with their
    halos, the outputs computed (those past the plane included) and :data:`TILE_OVERHEAD` per tile."""
    _, R, S, stride, dilation, (P, Q) = problem_axes(p)
    cb = chunk_channels(p.channels)
    target = smem_target(R * S)
    best = None
    for tq in range(8, min(64, -(-Q // 8) * 8) + 1, 8):
        for tp in range(2, min(32, -(-P // 2) * 2) + 1, 2):
            rows, cols = input_extent(tp, tq, R, S, stride, dilation)
            smem = 2 * rows * cols * cb * 2
            if smem > target and not (tp == 2 and tq == 8):
                continue
            cost = -(-P // tp) * -(-Q // tq) * (rows * cols + tp * tq + TILE_OVERHEAD)
            if best is None or cost < best[0]:
                best = (cost, tp, tq, rows, cols, smem)
    _, tp, tq, rows, cols, smem = best
    if smem > smem_limit:
        return (f"the smallest tile (2 x 8 outputs) reads {rows} x {cols} input pixels with its halo: {smem} "
                f"bytes of shared memory, over the {smem_limit} the kernel uses")
    cfg = DwDiagConfig(tp=tp, tq=tq, cb=cb, in_rows=rows, in_cols=cols, tiles_p=-(-P // tp), tiles_q=-(-Q // tq),
                       chunks=p.channels // cb, smem=smem)
    if cfg.tiles(p) >= 2**31:
        return f"{cfg.tiles(p)} tiles: over the 2**31 - 1 of the item index"
    return cfg


def diag_variant(p: ConvProblem, cfg: DwDiagConfig):
    """``(kernel name, defines)`` of the compiled variant serving ``p`` with ``cfg``."""
    _, R, S, (_, sw), (_, dw), _ = problem_axes(p)
    name = f"depthwise_diag_{_DTYPE_TAG[p.dtype]}_r{R}s{S}_sw{sw}dw{dw}_t{cfg.tp}x{cfg.tq}_c{cfg.cb}"
    defines = dict(CUCONV_DTYPE=dtype_code(p.dtype), DWD_R=R, DWD_S=S, DWD_SW=sw, DWD_DW=dw, DWD_TP=cfg.tp,
                   DWD_TQ=cfg.tq, DWD_CB=cfg.cb, DWD_MIN_BLOCKS=min_blocks(R * S), CUCONV_KERNEL_NAME=name)
    return name, defines


def _catalog():
    """Problems whose variants CI compiles: MobileNetV2's and EfficientNet-B0's 3x3 layers (stride 1 and
    2) in both 16-bit dtypes, a 5x5 filter, a dilated one and 8-channel chunks."""
    def dw(c, hw, f, dtype="bfloat16", dil=1, stride=1):
        return ConvProblem.create(nd=2, batch=2, in_spatial=(hw, hw), channels=c, out_channels=c,
                                  filter_spatial=(f, f), stride=stride, dilation=dil, padding=dil * (f // 2),
                                  groups=c, dtype=dtype, layout="NHWC")
    out = {}
    for dtype in ("float16", "bfloat16"):
        for c, hw, s in ((32, 112, 1), (96, 112, 2), (144, 56, 1), (144, 56, 2), (192, 28, 1), (384, 14, 1),
                         (576, 14, 2), (960, 7, 1)):
            out[f"3x3_c{c}_{hw}_s{s}_{dtype}"] = dw(c, hw, 3, dtype, stride=s)
    out.update(f5=dw(240, 28, 5), dil2=dw(64, 20, 3, dil=2), c8=dw(40, 17, 3, "float16"))
    return out


#: Named problems covering the compiled variants (tests/test_depthwise_diag.py).
DIAG_CATALOG = _catalog()
#: Every (source, defines, arch) of :data:`DIAG_CATALOG`, for the CPU compile test (tests/test_compile.py).
COMPILE_VARIANTS = [(DIAG_SOURCE, diag_variant(p, diag_config(p))[1], arch) for p in DIAG_CATALOG.values()
                    for arch in ("sm_80", "sm_90a")]
