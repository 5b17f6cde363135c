"""The tensor-core few-channel kernel's tile policy and compiled variants (kernels_cu/smallc/smallc_mma.cu).

A pure function of the problem: :func:`mma_config` picks the channel chunk (BN), the output tile's
shape (TP x TQ = 128 pixels) and checks that the filter and the input tile fit shared memory;
:func:`mma_variant` names the compiled variant and its ``-D`` defines. Compile-time: dtype, C, R, S,
stride and dilation along W, the tile shape, BN, the epilogue's access width and the input copy width,
so a network's stem is one variant.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

from ...launch import dtype_code, dtype_tag
from ...problem import LAYOUTS, ConvProblem
from ..depthwise.variants import index_range_declined, plane_offsets_declined, pow2_divisor, problem_axes
from .variants import few_channels_declined

__all__ = ["MmaConfig", "mma_config", "mma_terms", "span_copy", "pixel_stride", "mma_variant", "mma_declined",
           "min_blocks", "MMA_SOURCE", "MAX_TERMS", "MMA_MAX_C", "SMEM_LIMIT", "THREADS", "BM", "CF_MIN_TQ"]

MMA_SOURCE = "smallc/smallc_mma.cu"
#: Reduction terms (C x R x S) of one filter depth slice at most: the filter of a wider window and its
#: input tile outgrow shared memory (a 16x16 stride-16 patch embedding, 768 terms, is a GEMM over a
#: transposed input, not a stem).
MAX_TERMS = 512
#: Shared memory one CTA may use (bytes): the filter, the offset tables and the input tile buffers.
SMEM_LIMIT = 96 * 1024
#: Threads per CTA: four warps of 32 output pixels (``THREADS`` of the kernel).
THREADS = 128
#: Output pixels per CTA tile (TP x TQ).
BM = 128
#: Output channels per CTA at most (eight n8 fragments per warp).
MAX_BN = 64
_TILE_COLS = (8, 16, 32, 64, 128)
#: Input channels the kernel takes at most (the few-channel fp32 kernel keeps :data:`~.variants.MAX_C`):
#: the filter of 64 output channels over C x R x S terms and two input tiles of C channels per pixel must
#: fit :data:`SMEM_LIMIT`, which a 3x3 filter over 32 channels does.
MMA_MAX_C = 32
#: Output columns per tile at least, where the output is channels-first and at least this wide: the
#: epilogue stores each channel's 16 pixels of a half warp as one 32-byte run of a row only when the tile
#: row holds them (docs/tuning.md#T-smallc-span).
CF_MIN_TQ = 16


@dataclass(frozen=True)
class MmaConfig:
    """One launch shape of the tensor-core few-channel kernel (field meanings: the kernel's ``MmaGeometry``)."""

    bn: int         # output channels per CTA (whole n8 fragments)
    ev: int         # channels per epilogue access: the largest power of two up to 8 dividing K
    vin: int        # input channels per copy into shared memory
    tp: int         # output rows per tile
    tq: int         # output columns per tile
    in_rows: int    # the input tile (halo included), all C channels
    in_cols: int    # stored columns: one spare when the tile's row of elements is odd
    tiles_p: int
    tiles_q: int
    chunks: int
    kp: int         # reduction terms per filter depth slice, padded to whole k16 steps
    pairs: bool     # A read as 32-bit pairs of terms (PAIRS of the kernel)
    smem: int       # dynamic shared memory (bytes)
    rowst: int      # elements per stored tile row (ROWST of the kernel)
    cst: int        # elements per stored pixel of a channels-last tile (CST of the kernel: C, or C padded)
    span: int = 0   # span copies: elements per copy of a tile row's run (2, 4 or 8); 0: copies of vin channels
    shift: int = 0  # span copies: where the run starts in its first word (elements)
    planar: bool = False  # span copies of channels-first x: the tile stored [row][c][col]
    threads: int = THREADS

    @property
    def vec(self) -> int:
        """Channels per access of out, bias and residual (``aligned_operands``)."""
        return self.ev

    @property
    def copy_elems(self) -> int:
        """Elements per copy of x into the input tile (``aligned_operands`` aligns x to them)."""
        return self.span or self.vin

    @property
    def lead(self) -> int:
        """Spare terms before each filter row's run (LEAD of the kernel): 1 where pairs of terms read
        from runs that start on an odd element."""
        return self.shift & 1 if self.pairs else 0

    def tiles(self, p: ConvProblem) -> int:
        """Output tiles: chunks x images x output depth x tiles per plane (the persistent grid's work)."""
        return p.batch * (p.out_spatial[0] if p.nd == 3 else 1) * self.tiles_p * self.tiles_q * self.chunks


def mma_declined(p: ConvProblem) -> Optional[str]:
    """Why the tensor-core few-channel kernel cannot take ``p``, or None: dense, at most
    :data:`MMA_MAX_C` input channels and :data:`MAX_TERMS` reduction terms per filter depth slice."""
    why = few_channels_declined(p, MMA_MAX_C)
    if why:
        return why
    _, R, S, _, _, _ = problem_axes(p)
    terms = p.channels * R * S
    if terms > MAX_TERMS:
        return f"{terms} reduction terms per filter slice (C x R x S): above the kernel's {MAX_TERMS}"
    return index_range_declined(p) or plane_offsets_declined(p)


def mma_terms(p: ConvProblem, lead: int = 0, planar: bool = False, pairs: bool = True) -> int:
    """Reduction terms of one filter depth slice as the kernel lays them out (KTERMS of the kernel): R
    runs of ``lead`` spare terms and S x C terms, each padded to an even count; ``planar`` (span copies
    of channels-first x): R runs of C channel runs of ``lead`` + S terms (even under ``pairs``), each
    filter row's padded to an even count."""
    _, R, S, _, _, _ = problem_axes(p)
    C = p.channels
    if planar:
        runc = -(-(S + lead) // 2) * 2 if pairs else S
        return R * (-(-(C * runc) // 2) * 2)
    return R * (-(-(S * C + lead) // 2) * 2)


def span_copy(p: ConvProblem, tq: int, vin: int):
    """``(span, shift)``: the widest copy of V = 8, 4 or 2 elements (16, 8 or 4 bytes) with which tiles
    of ``tq`` columns can copy their rows' runs of x (kernels_cu/smallc/span_tile.cuh), and the element
    where each run starts in its first word; ``(0, 0)`` where none applies. V must divide a run's row of
    x (W x C elements channels-last, W channels-first: no word mixes image and padding) and a tile's
    step along it (tq x stride x C, or tq x stride: every tile's run starts at the same place in its
    word). Channels-last, V must also be wider than the ``vin`` channels a per-pixel copy moves."""
    channels_last = LAYOUTS[p.layout][1]
    W, C, sw, pad_w = p.in_spatial[-1], p.channels, p.stride[-1], p.pad_lo[-1]
    per = C if channels_last else 1  # elements per pixel along a run
    for v in (8, 4, 2):
        if (v > vin or not channels_last) and (W * per) % v == 0 and (tq * sw * per) % v == 0:
            return v, (-pad_w * per) % v
    return 0, 0


def pixel_stride(p: ConvProblem, vin: int, span: int) -> int:
    """Elements per stored pixel of the input tile (CST of the kernel): C, or for channels-last tiles
    copied pixel by pixel with C a multiple of 8, C plus the fewest zero channels (whole ``vin``-channel
    copies, at most 3 more) that make a pixel's window step ``stride_w`` x CST / 2 words 4 x an odd number:
    a quarter warp's A reads (8 neighbouring pixels x 4 consecutive words) then fall in 32 distinct banks,
    where 16 or 32 channels (8 or 16 words) put 2 or 4 pixels on each bank."""
    C, sw = p.channels, problem_axes(p)[3][1]
    if span or not LAYOUTS[p.layout][1] or C % 8:
        return C
    for cst in range(C, C + 4 * vin, vin):
        if (sw * cst // 2) % 8 == 4:
            return cst
    return C


def mma_config(p: ConvProblem, smem_limit: int = SMEM_LIMIT) -> Union[MmaConfig, str]:
    """The launch shape for ``p``, or the reason there is none.

    BN: the output channels in the fewest chunks of at most 64, each a whole number of n8 fragments;
    EV: the largest power of two up to 8 dividing K. Tile: the 128-pixel shape (TQ of 8-128 columns)
    with the least output padding plus input-tile reads (halo included, counted per output channel of
    the chunk) among the shapes whose shared memory fits, for channels-first output of at least
    :data:`CF_MIN_TQ` columns among those at least that wide where one fits. Input copies: span copies
    of the tile rows' runs (:func:`span_copy`) where they apply, else copies of ``vin`` channels per
    pixel. Shared memory (the kernel's layout): the filter slices, the offset table, the filter terms'
    places, two input tile buffers (an even row stride, a zeroed tail word) and four warps' staging
    rows."""
    T, R, S, (sh, sw), (dh, dw), (P, Q) = problem_axes(p)
    C, K, esize = p.channels, p.out_channels, p.itemsize
    chunks = -(-K // MAX_BN)
    bn = -(-(-(-K // chunks)) // 8) * 8
    channels_last = LAYOUTS[p.layout][1]
    vin = pow2_divisor(C, 16 // esize) if C * esize >= 4 else 1
    sld = bn + (8 if bn % 32 in (0, 16) else 0)

    def extent(tp_, tq_):
        return (tp_ - 1) * sh + (R - 1) * dh + 1, (tq_ - 1) * sw + (S - 1) * dw + 1

    best, smallest = None, None
    for tq in _TILE_COLS:
        tp = BM // tq
        rows, cols = extent(tp, tq)
        # span copies where they apply and fit, else copies of vin channels (channels-first: a gather)
        for span, shift in dict.fromkeys((span_copy(p, tq, vin), (0, 0))):
            cst = pixel_stride(p, vin, span)
            cols_st = cols + (cols * cst) % 2  # stored columns: an even number of words per row
            planar = bool(span) and not channels_last  # the tile stored [row][c][col]
            pairs = (sw % 2 == 0 and dw == 1) if planar else (sw * C) % 2 == 0 and (dw == 1 or C % 2 == 0)
            lead = shift & 1 if pairs else 0
            kp = -(-mma_terms(p, lead, planar, pairs) // 16) * 16
            # Shared memory besides the input tiles: the filter slices, the offset table, the filter terms'
            # places, four warps' staging rows.
            fixed = (-(-T * bn * (kp + 8) * 2 // 16) * 16 + (kp // 2 if pairs else kp) * 4 + kp * 4
                     + 4 * 16 * sld * 4)
            if planar:
                rowst = C * (-(-(cols + shift) // span) * span)
            else:
                rowst = -(-(cols * C + shift) // span) * span if span else cols_st * cst
            smem = fixed + 2 * (-(-(rows * rowst * esize + 4) // 16) * 16)  # two buffers, a zeroed tail word
            if smem <= smem_limit:
                break
        if smallest is None or smem < smallest[0]:
            smallest = (smem, rows, cols)
        if smem > smem_limit:
            continue
        # channels-first output: tiles narrower than a half warp's 16-pixel store runs only where no
        # wider one fits (or the output is narrower)
        narrow = not channels_last and tq < CF_MIN_TQ <= Q
        cost = (narrow, -(-P // tp) * -(-Q // tq) * (rows * cols * C / bn + BM))
        if best is None or cost < best[0]:
            best = (cost, dict(tp=tp, tq=tq, in_rows=rows, in_cols=cols_st, kp=kp, smem=smem, rowst=rowst, cst=cst,
                               span=span, shift=shift, pairs=pairs, planar=planar))
    if best is None:
        smem, rows, cols = smallest
        return (f"the filter ({T} slices) and the {rows}x{cols} input tile need {smem} bytes of shared "
                f"memory, over the {smem_limit} the kernel uses")
    tile = best[1]
    cfg = MmaConfig(bn=bn, ev=pow2_divisor(K, 8), vin=vin, tiles_p=-(-P // tile["tp"]), tiles_q=-(-Q // tile["tq"]),
                    chunks=chunks, **tile)
    if cfg.tiles(p) >= 2**31:
        return f"{cfg.tiles(p)} tiles: over the kernel's 32-bit tile index"
    return cfg


def min_blocks(bn: int, pairs: bool) -> int:
    """CTAs per SM the kernel's registers must allow (``__launch_bounds__``): 4 (128 registers) for up to
    16 channels, or 32 read as pairs; else 3, where the accumulators and a step's loads in flight need
    more than 128 registers on sm_80 and sm_90 without spilling."""
    return 4 if bn <= 16 or (bn <= 32 and pairs) else 3


def mma_variant(p: ConvProblem, cfg: MmaConfig):
    """``(kernel name, defines)`` of the compiled variant serving ``p`` with ``cfg``."""
    _, R, S, (_, sw), (_, dw), _ = problem_axes(p)
    blocks = min_blocks(cfg.bn, cfg.pairs)
    cf = not LAYOUTS[p.layout][1]  # channels-first output (the variant's epilogue stores it)
    if cfg.span:
        copies = f"_v{cfg.span}s{cfg.shift}"
    else:
        copies = f"_i{cfg.vin}" + (f"p{cfg.cst}" if cfg.cst != p.channels else "")
    name = (f"smallc_mma_{dtype_tag(p.dtype)}_c{p.channels}_r{R}s{S}_sw{sw}dw{dw}_t{cfg.tp}x{cfg.tq}_n{cfg.bn}"
            f"_e{cfg.ev}{copies}_b{blocks}" + ("_cf" if cf else ""))
    defines = dict(CUCONV_DTYPE=dtype_code(p.dtype), SC_C=p.channels, SC_R=R, SC_S=S, SC_SW=sw, SC_DW=dw,
                   SC_VIN=cfg.vin, MM_TP=cfg.tp, MM_TQ=cfg.tq, MM_BN=cfg.bn, MM_EV=cfg.ev, MM_MIN_BLOCKS=blocks,
                   CUCONV_KERNEL_NAME=name)
    if cf:
        defines["MM_NCHW"] = 1
    if cfg.span:
        defines.update(MM_SPAN=cfg.span, MM_SHIFT=cfg.shift)
    if cfg.cst != p.channels:
        defines["MM_CST"] = cfg.cst
    return name, defines


def _catalog():
    """Problems whose variants CI compiles: the networks' stems (7x7 and 3x3 RGB, 4x4 stride 4, a latent's
    3x3 of 4 channels, also channels-first) in both dtypes, an odd K, a 5x5 of one channel, a conv3d and
    3x3 filters over 16, 24 and 32 channels; between them span copies of every form (channels-last and
    -first, with and without a leading spare term), the per-pixel copies (with padded pixels too) and the
    gather."""
    def stem(c, hw, f, s, k, dtype="bfloat16", nd=2, pad=None, layout=None):
        return ConvProblem.create(nd=nd, batch=2, in_spatial=(hw,) * nd, channels=c, out_channels=k,
                                  filter_spatial=(f,) * nd, stride=s, dilation=1,
                                  padding=f // 2 if pad is None else pad, groups=1, dtype=dtype,
                                  layout=layout or ("NHWC" if nd == 2 else "NDHWC"))
    out = {}
    for dtype in ("float16", "bfloat16"):
        out[f"7x7_s2_rgb_{dtype}"] = stem(3, 64, 7, 2, 64, dtype)
        out[f"3x3_s2_rgb_{dtype}"] = stem(3, 64, 3, 2, 32, dtype)
    out["7x7_s2_rgb_nchw"] = stem(3, 64, 7, 2, 64, "float16", layout="NCHW")
    # rows of an odd number of elements: the per-pixel copies (2 bytes through registers) and the gather
    out["7x7_s2_rgb_odd_w"] = stem(3, 33, 7, 2, 64)
    out["c4_3x3_nchw_odd_w"] = stem(4, 33, 3, 1, 320, layout="NCHW")
    out.update(s4_rgb=stem(3, 64, 4, 4, 96, pad=0), c4_3x3=stem(4, 32, 3, 1, 320), narrow_k3=stem(3, 16, 7, 1, 3),
               c1_5x5=stem(1, 32, 5, 1, 32), c2_conv3d=stem(2, 12, 3, 1, 16, nd=3),
               c4_3x3_nchw=stem(4, 32, 3, 1, 320, layout="NCHW"), c2_conv3d_ncdhw=stem(2, 12, 3, 1, 16, nd=3, layout="NCDHW"))
    # more channels: padded pixels (16 and 32 channels, an odd width), 24 channels as they are
    out.update(c16_3x3=stem(16, 55, 3, 1, 64), c32_3x3_k32=stem(32, 33, 3, 1, 32, "float16", pad=0),
               c24_3x3=stem(24, 32, 3, 1, 64))
    return out


#: Named few-channel problems covering the compiled variants (tests/test_smallc_mma.py).
CATALOG = _catalog()
#: Every (source, defines, arch) of :data:`CATALOG`, for the CPU compile test (tests/test_compile.py).
COMPILE_VARIANTS = [(MMA_SOURCE, mma_variant(p, mma_config(p))[1], arch) for p in CATALOG.values()
                    for arch in ("sm_80", "sm_90a")]
