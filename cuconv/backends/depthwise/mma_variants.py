"""The tile policy and compiled variants of ``depthwise_mma`` (kernels_cu/depthwise/depthwise_mma.cu).

A pure function of the problem. :func:`mma_declined` says why the kernel's design cannot take a problem;
:func:`mma_config` picks the output tile (16 rows x 8-32 columns x 16 channels) and checks shared
memory; :func:`mma_variant` names the compiled variant and its ``-D`` defines. Compile-time: dtype,
R, S, the dilation along W, the tile's 8-column blocks (NB) and 16-row blocks (MB), the chunk width,
the copy and epilogue vector widths, and the epilogue's pixels per thread.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Union

from ...launch import dtype_code, dtype_tag
from ...models.depthwise_mma import plane_cols
from ...problem import ConvProblem
from .variants import SMEM_LIMIT, depthwise_declined, plane_offsets_declined, pow2_divisor, problem_axes

__all__ = ["DwMmaConfig", "mma_config", "mma_declined", "mma_variant", "MMA_SOURCE", "MMA_CATALOG",
           "COMPILE_VARIANTS"]

MMA_SOURCE = "depthwise/depthwise_mma.cu"
#: Threads per CTA (8 warps; ``THREADS`` of the kernel).
THREADS = 256
#: Channels per chunk (``DWM_CB``): two per warp. Each warp keeps R x 2 B fragments per channel in
#: registers, and the CTA's shared memory (planes, two raw / staging buffers) grows with the chunk.
CHUNK = 16
#: The chunk of tiles too tall for :data:`CHUNK` within the shared-memory limit: one channel per warp.
MIN_CHUNK = 8
#: Shared memory a CTA aims at: 3 CTAs (24 warps) per SM on the H100, 2 on the A100.
SMEM_TARGET = 72 * 1024
#: The MMA's reduction: 16 input columns per 8 outputs, so (S - 1) x dilation_w <= 8.
MMA_K = 16


@dataclass(frozen=True)
class DwMmaConfig:
    """One launch shape of ``depthwise_mma`` (fields as in the kernel's ``DwGeometry`` where they share
    a name: ``cv`` channel vectors of ``vec``, ``tqg`` = NB blocks of ``qt`` = 8 columns)."""

    nb: int         # 8-column output blocks per tile (TQ = 8 * nb)
    mb: int         # 16-row output blocks per tile (TP = 16 * mb)
    cb: int         # channels per chunk
    vin: int        # input channels per copy into shared memory
    vec: int        # output channels per epilogue access
    qte: int        # output pixels per epilogue thread
    in_rows: int    # the input tile (halo included)
    in_cols: int
    tiles_p: int
    tiles_q: int
    chunks: int
    smem: int       # dynamic shared memory (bytes): planes + two raw / staging buffers
    mult: int = 1
    qt: int = 8

    @property
    def tp(self) -> int:
        return 16 * self.mb

    @property
    def tq(self) -> int:
        return 8 * self.nb

    @property
    def tqg(self) -> int:
        return self.nb

    @property
    def cv(self) -> int:
        return self.cb // self.vec

    @property
    def cin(self) -> int:
        return self.cb

    @property
    def threads(self) -> int:
        return THREADS

    def tiles(self, p: ConvProblem) -> int:
        """Output tiles of ``p``: chunks x images x tiles per plane."""
        return p.batch * self.tiles_p * self.tiles_q * self.chunks


def mma_declined(p: ConvProblem) -> Optional[str]:
    """Why ``depthwise_mma``'s design cannot take ``p``, or None."""
    why = depthwise_declined(p) or plane_offsets_declined(p)
    if why:
        return why
    if p.nd != 2:
        return "conv3d: the tensor-core depthwise kernel is 2-D (depthwise_direct takes filter slices)"
    if p.out_channels != p.channels:
        return (f"channel multiplier {p.out_channels // p.channels}: the tensor-core kernel's planes are its "
                f"output channels (multiplier 1)")
    _, R, S, (sh, sw), (dh, dw), _ = problem_axes(p)
    if sw != 1:
        return f"W stride {sw}: the banded filter matrix of one MMA covers stride-1 windows along W"
    if 8 + (S - 1) * dw > MMA_K:
        return (f"filter width {S} at W dilation {dw} spans {(S - 1) * dw + 1} input columns: 8 outputs' windows "
                f"exceed the MMA's {MMA_K} reduction columns")
    return None


def _stage_bytes(tp: int, tq: int, cb: int) -> int:
    """The kernel's STAGE_BYTES: fp32 [tp][cb][tq + 2], rows padded to 8 mod 32 floats."""
    rsp = cb * (tq + 2)
    rsp += (8 - rsp % 32) % 32
    return tp * rsp * 4


#: The kernel's PLANE_GAP: bytes between the planes of consecutive 8-channel groups.
_PLANE_GAP = 64


def _smem(in_rows: int, in_cols: int, tp: int, tq: int, cb: int) -> int:
    planes = -(-(cb * in_rows * plane_cols(tq) * 2 + cb // 8 * _PLANE_GAP) // 16) * 16
    raw = -(-in_rows * in_cols * cb * 2 // 16) * 16
    return planes + 2 * max(raw, _stage_bytes(tp, tq, cb))


def mma_config(p: ConvProblem, smem_limit: int = SMEM_LIMIT) -> Union[DwMmaConfig, str]:
    """The launch shape for ``p`` (see :func:`mma_declined`), or the reason there is none.

    One 16-row block (tiles of 16 output rows) and, among the numbers of 8-column blocks (1-4) whose
    CTA stays within :data:`SMEM_TARGET`, the one whose tiles do the least work per channel: input tiles
    with their halos plus the outputs computed, those past the plane included."""
    _, R, S, (sh, _), (dh, dw), (P, Q) = problem_axes(p)
    mb, cb = 1, CHUNK
    tp = 16 * mb
    in_rows = (tp - 1) * sh + (R - 1) * dh + 1
    best = None
    for nb in range(1, 5):
        tq = 8 * nb
        cols = tq + (S - 1) * dw
        cost = -(-P // tp) * -(-Q // tq) * (in_rows * cols + tp * tq)
        if nb > 1 and _smem(in_rows, cols, tp, tq, cb) > SMEM_TARGET:
            break
        if best is None or cost < best[0]:
            best = (cost, nb)
        if tq >= Q:
            break
    nb = best[1]
    tq = 8 * nb
    in_cols = tq + (S - 1) * dw
    smem = _smem(in_rows, in_cols, tp, tq, cb)
    if smem > smem_limit:  # tall input tiles (H strides, dilations): one channel per warp
        cb = MIN_CHUNK
        smem = _smem(in_rows, in_cols, tp, tq, cb)
    if smem > smem_limit:
        return (f"a tile of {tp} rows with its halo ({in_rows} input rows at H stride {sh}, dilation {dh}) needs "
                f"{smem} bytes of shared memory, over the {smem_limit} the kernel uses")
    C = p.channels
    vin = pow2_divisor(math.gcd(cb, C), 8)
    vec = pow2_divisor(C, 8)
    # One pixel per epilogue thread: a warp then stores 16 pixels' chunk runs, whole sectors, and the
    # kernel fits 80 registers (3 CTAs per SM); two pixels per thread spill at that bound.
    qte = 1
    cfg = DwMmaConfig(nb=nb, mb=mb, cb=cb, vin=vin, vec=vec, qte=qte, in_rows=in_rows, in_cols=in_cols,
                      tiles_p=-(-P // tp), tiles_q=-(-Q // tq), chunks=-(-C // cb), smem=smem)
    if cfg.tiles(p) >= 2**31:
        return f"{cfg.tiles(p)} tiles: over the 2**31 - 1 of the item index"
    return cfg


def mma_variant(p: ConvProblem, cfg: DwMmaConfig):
    """``(kernel name, defines)`` of the compiled variant serving ``p`` with ``cfg``."""
    _, R, S, _, (_, dw), _ = problem_axes(p)
    name = (f"depthwise_mma_{dtype_tag(p.dtype)}_r{R}s{S}_dw{dw}_n{cfg.nb}m{cfg.mb}_c{cfg.cb}"
            f"_i{cfg.vin}v{cfg.vec}e{cfg.qte}")
    defines = dict(CUCONV_DTYPE=dtype_code(p.dtype), DWM_R=R, DWM_S=S, DWM_DW=dw, DWM_NB=cfg.nb, DWM_MB=cfg.mb,
                   DWM_CB=cfg.cb, DWM_VIN=cfg.vin, DWM_VEC=cfg.vec, DWM_QTE=cfg.qte, DWM_MIN_BLOCKS=3,
                   CUCONV_KERNEL_NAME=name)
    return name, defines


def _catalog():
    """Problems whose variants CI compiles: the networks' wide filters (ConvNeXt 7x7 at 56-7 pixels,
    EfficientNet 5x5, MobileNetV2 3x3) in both 16-bit dtypes, an odd C and a dilated filter."""
    def dw(c, hw, f, dtype="bfloat16", dil=1, stride=1):
        return ConvProblem.create(nd=2, batch=2, in_spatial=(hw, hw), channels=c, out_channels=c,
                                  filter_spatial=(f, f), stride=(stride, 1), dilation=dil, padding=dil * (f // 2),
                                  groups=c, dtype=dtype, layout="NHWC")
    out = {}
    for dtype in ("float16", "bfloat16"):
        for c, hw, f in ((96, 56, 7), (192, 28, 7), (384, 14, 7), (768, 7, 7), (240, 28, 5), (144, 56, 3)):
            out[f"{f}x{f}_c{c}_{hw}_{dtype}"] = dw(c, hw, f, dtype)
    out.update(odd_c=dw(100, 23, 5), dil2=dw(64, 20, 5, dil=2), stride_h2=dw(64, 20, 3, stride=2),
               tall=ConvProblem.create(nd=2, batch=1, in_spatial=(80, 20), channels=32, out_channels=32,
                                       filter_spatial=(9, 5), stride=(3, 1), dilation=(3, 1), padding=2, groups=32,
                                       dtype="float16", layout="NHWC"))  # 8-channel chunks
    return out


#: Named problems covering the compiled variants (tests/test_depthwise_mma.py).
MMA_CATALOG = _catalog()
#: Every (source, defines, arch) of :data:`MMA_CATALOG`, for the CPU compile test (tests/test_compile.py).
COMPILE_VARIANTS = [(MMA_SOURCE, mma_variant(p, mma_config(p))[1], arch) for p in MMA_CATALOG.values()
                    for arch in ("sm_80", "sm_90a")]
