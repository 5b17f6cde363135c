"""The depthwise kernel's tile policy and compiled variants (kernels_cu/depthwise/depthwise_fprop.cu).

A pure function of the problem: :func:`dw_config` picks the channel vector, the CTA's channel chunk
and output tile, and checks that the tile fits shared memory; :func:`dw_variant` names the compiled
variant and its ``-D`` defines. What sizes register arrays or unrolls the window loop is compile-time
(dtype, R, S, stride and dilation along W, the vector widths, QT, multiplier 1 or not), and so are the
channel chunk and the tile's channels per pixel: the shared-memory loads of the multiply-adds then
take immediate offsets (docs/tuning.md#T-dw-static-chunk). A network's depthwise layers share a few
variants (MobileNetV2: five, 3x3 stride 1 and 2 over chunks of 32, 48 and 64 channels).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Union

from ...launch import dtype_code, dtype_tag
from ...problem import ConvProblem

__all__ = ["DwConfig", "dw_config", "dw_variant", "depthwise_declined", "index_range_declined",
           "plane_offsets_declined", "pow2_divisor", "DW_SOURCE", "SMEM_LIMIT", "MAX_THREADS",
           "problem_axes"]

DW_SOURCE = "depthwise/depthwise_fprop.cu"
#: Shared memory one CTA may use (bytes): under every sm_80+ GPU's per-block opt-in limit (99 KiB on
#: sm_86/89), so one variant runs everywhere.
SMEM_LIMIT = 96 * 1024
#: Shared memory a CTA aims at (the taps and its input-tile buffers): 3 CTAs of 256 threads per SM
#: (what their registers allow at most) on the H100 (228 KiB per SM), 2 on the A100 (164 KiB).
SMEM_TARGET = 72 * 1024
#: Input-tile buffers of the CUDA kernel: it copies the next slice into one while it computes from the
#: other.
CUDA_BUFFERS = 2
#: Threads per CTA at most (``MAX_THREADS`` of the kernel).
MAX_THREADS = 256
#: Channels per thread: one 8-byte (16-bit dtypes) or 16-byte (fp32) vector. Wider vectors cost
#: registers (QT x VEC accumulators, S x VEC weights) and with them the occupancy that hides the
#: memory latency.
_VEC = 4
_MAX_CV = 16            # channel vectors per CTA: chunks of up to 64 channels
#: Wide filters (docs/tuning.md#T-dw-wide-filter): 16-bit problems whose filter is at least this wide,
#: at W stride and dilation 1, take vectors of :data:`_WIDE_VEC` channels and 8-output windows (16
#: accumulators and S x 2 weights per thread, 3 CTAs per SM), in chunks of up to 64 channels
#: (:data:`_WIDE_MAX_CV` vectors). Per filter row a thread then reads 14 input vectors for 8 outputs
#: instead of 10 for 4, and widens 28 values instead of 40 for the same 112 multiply-adds.
WIDE_MIN_S = 7
_WIDE_VEC = 2
_WIDE_MAX_CV = _MAX_CV * _VEC // _WIDE_VEC  # the same 64-channel chunks
_MAX_TILE_COLS = 32     # output columns per tile


@dataclass(frozen=True)
class DwConfig:
    """One launch shape of the depthwise kernel for one problem (field meanings: the kernel's ``DwGeometry``)."""

    vec: int        # output channels per thread (one vector access)
    vin: int        # input channels per copy into shared memory
    cv: int         # channel vectors per CTA: the CTA's chunk is cb = vec * cv output channels
    qt: int         # consecutive output pixels per thread along W
    tqg: int        # column groups of qt per tile (tile width tq = tqg * qt)
    tp: int         # output rows per tile
    mult: int       # channel multiplier K / C
    in_rows: int    # the input tile (halo included)
    in_cols: int
    cin: int        # input channels per chunk: cb / mult
    tiles_p: int
    tiles_q: int
    chunks: int
    smem: int       # dynamic shared memory (bytes): fp32 taps + the input tile
    wide: bool = False  # the wide-filter shape (:data:`WIDE_MIN_S`): 2-channel vectors, 8-output windows

    @property
    def cb(self) -> int:
        return self.vec * self.cv

    @property
    def tq(self) -> int:
        return self.tqg * self.qt

    @property
    def threads(self) -> int:
        return self.cv * self.tp * self.tqg

    def tiles(self, p: ConvProblem) -> int:
        """Output tiles of ``p`` (the kernel's 1-D grid): chunks x images x output depth x tiles per plane."""
        return p.batch * (p.out_spatial[0] if p.nd == 3 else 1) * self.tiles_p * self.tiles_q * self.chunks


def depthwise_declined(p: ConvProblem) -> Optional[str]:
    """Why the depthwise kernel design (CUDA and HIP alike) cannot take ``p``, or None: it must be
    depthwise (groups == C) and its extents within the kernels' index range."""
    if p.groups != p.channels:
        return (f"not depthwise: groups {p.groups} != C {p.channels} ({p.channels_per_group} channels per "
                f"group)")
    return index_range_declined(p)


def index_range_declined(p: ConvProblem) -> Optional[str]:
    """Why the direct kernels of this design (depthwise, few-channel) cannot index ``p``, or None:
    extents within 32-bit ints, element counts within 2**62."""
    extent = max(p.batch * math.prod(p.in_spatial) * p.channels, p.gemm_m * p.out_channels)
    if max(*p.in_spatial, p.out_channels, p.batch) >= 2**31 or extent >= 2**62:
        return f"an extent exceeds the kernel's index range ({extent} elements)"
    return None


def plane_offsets_declined(p: ConvProblem) -> Optional[str]:
    """Why the CUDA kernel's loader cannot take ``p``, or None: it addresses one input plane (image,
    depth slice), tile margins included, with 32-bit element offsets."""
    margin = [(f - 1) * d + s + 1 for f, d, s in zip(p.filter_spatial[-2:], p.dilation[-2:], p.stride[-2:])]
    plane = (p.in_spatial[-2] + 2 * margin[0]) * (p.in_spatial[-1] + 2 * margin[1]) * p.channels
    if plane >= 2**31:
        return (f"an input plane of {plane} elements (with the tile margins) exceeds the loader's 32-bit "
                f"offsets")
    return None


def problem_axes(p: ConvProblem):
    """``(T, R, S, (stride_h, stride_w), (dil_h, dil_w), (P, Q))`` of a 2-D or 3-D problem."""
    t = p.filter_spatial[0] if p.nd == 3 else 1
    return t, p.filter_spatial[-2], p.filter_spatial[-1], p.stride[-2:], p.dilation[-2:], p.out_spatial[-2:]


def window_outputs(S: int, sw: int, Q: int, wide: bool = False) -> int:
    """QT, the consecutive output pixels along W one thread computes: 8 for filters up to 5 wide at W
    stride 1 and up to 3 wide at stride 2, and for the wide-filter shape (``wide``: 2-channel vectors),
    else 4 (QT x VEC accumulators and S x VEC weights live in registers: a wider window costs more
    occupancy than it saves in shared-memory reads), at most Q rounded up to a power of two
    (docs/tuning.md#T-dw-big-filter, #T-dw-wide-filter)."""
    eight = wide or (S <= 5 and sw == 1) or (S <= 3 and sw == 2)
    return min(8 if eight else 4, 1 << (Q - 1).bit_length())


def pow2_divisor(n: int, cap: int) -> int:
    """Largest power of two <= ``cap`` dividing ``n``."""
    v = cap
    while n % v:
        v //= 2
    return v


def _channel_vectors(nvec: int, vec: int, mult: int, max_cv: int = _MAX_CV) -> Optional[int]:
    """Channel vectors per CTA (at most ``max_cv``): the fewest padded vectors over the chunks, then the
    most per CTA; the chunk ``vec * cv`` must hold whole multiplier groups (``mult`` outputs of one input
    channel)."""
    best = None
    for cv in range(min(max_cv, nvec), 0, -1):
        if (vec * cv) % mult:
            continue
        waste = -(-nvec // cv) * cv - nvec
        if best is None or waste < best[0]:
            best = (waste, cv)
        if cv <= 4 and best is not None:  # below 4 vectors only when nothing larger fits
            break
    return None if best is None else best[1]


def _tile_cost(P: int, Q: int, tp: int, tq: int, rows: int, cols: int) -> int:
    """Pixels of work per channel over the plane: input tiles with their halos, plus the outputs the
    tiles compute (the ones past P or Q included)."""
    return -(-P // tp) * -(-Q // tq) * (rows * cols + tp * tq)


def dw_config(p: ConvProblem, smem_limit: int = SMEM_LIMIT, smem_target: int = SMEM_TARGET,
              buffers: int = CUDA_BUFFERS, wide_filters: bool = True) -> Union[DwConfig, str]:
    """The launch shape for depthwise problem ``p`` (``groups == C``), or the reason there is none.

    Channels: vectors of :data:`_VEC` (or fewer, dividing C), chunks of up to 64 channels with the least
    padding; wide filters (:data:`WIDE_MIN_S`, where ``wide_filters``) vectors of :data:`_WIDE_VEC`.
    Tile: each thread takes QT outputs along W (:func:`window_outputs`), and among the tiles of
    at most 256 threads, 32 columns and :data:`SMEM_TARGET` bytes the one with the least
    halo and padding work (:func:`_tile_cost`); one row over the target is shrunk until it fits
    :data:`SMEM_LIMIT`. ``smem_limit`` / ``smem_target`` are those two budgets and ``buffers`` the input
    tiles a CTA holds at once (another backend of the same kernel design passes its own: CDNA's LDS,
    one tile); ``wide_filters=False`` keeps wide filters on the 4-channel shape (a backend whose kernel
    was not measured with the other)."""
    T, R, S, (sh, sw), (dh, dw), (P, Q) = problem_axes(p)
    esize = p.itemsize
    C, K = p.channels, p.out_channels
    mult = K // C
    wide = wide_filters and S >= WIDE_MIN_S and sw == 1 and dw == 1 and esize == 2
    max_cv = _WIDE_MAX_CV if wide else _MAX_CV
    vec = pow2_divisor(C if mult == 1 else K, _WIDE_VEC if wide else _VEC)
    cv = _channel_vectors(K // vec, vec, mult, max_cv)
    while cv is None:                 # an odd multiplier and a wide vector: narrow the vector
        if vec == 1:
            return (f"channel multiplier {mult}: a CTA's chunk of at most {max_cv} channel vectors holds no whole "
                    f"group of {mult} outputs")
        vec //= 2
        cv = _channel_vectors(K // vec, vec, mult, max_cv)
    cb = vec * cv
    cin = cb // mult
    vin = pow2_divisor(math.gcd(cin, C), 16 // esize)
    qt = window_outputs(S, sw, Q, wide)
    groups = MAX_THREADS // cv        # pixel groups of qt outputs per CTA
    taps_bytes = -(-T * R * S * cb * 4 // 16) * 16

    def extent(tp_, tqg_):
        return (tp_ - 1) * sh + (R - 1) * dh + 1, (tqg_ * qt - 1) * sw + (S - 1) * dw + 1

    def smem_of(tp_, tqg_):
        rows, cols = extent(tp_, tqg_)
        tile = rows * cols * cin * esize
        return taps_bytes + (buffers - 1) * (-(-tile // 16) * 16) + tile  # buffers 16-byte aligned

    best = None
    for tqg in range(1, min(-(-Q // qt), groups, _MAX_TILE_COLS // qt) + 1):
        tp = min(P, groups // tqg)
        while tp > 1 and smem_of(tp, tqg) > smem_target:
            tp -= 1
        cost = _tile_cost(P, Q, tp, tqg * qt, *extent(tp, tqg))
        if best is None or cost < best[0]:
            best = (cost, tp, tqg)
    _, tp, tqg = best
    while True:
        in_rows, in_cols = extent(tp, tqg)
        smem = smem_of(tp, tqg)
        if smem <= smem_limit:
            break
        if tp > 1:
            tp = -(-tp // 2)
        elif tqg > 1:
            tqg = -(-tqg // 2)
        else:
            return (f"the smallest tile (one row of {qt} pixels, {cb} channels) needs {smem} bytes of shared "
                    f"memory with this filter and dilation, over the {smem_limit} the kernel uses")
    cfg = DwConfig(vec=vec, vin=vin, cv=cv, qt=qt, tqg=tqg, tp=tp, mult=mult, in_rows=in_rows, in_cols=in_cols,
                   cin=cin, tiles_p=-(-P // tp), tiles_q=-(-Q // (tqg * qt)), chunks=-(-K // cb), smem=smem,
                   wide=wide)
    if cfg.tiles(p) >= 2**31:
        return f"{cfg.tiles(p)} CTAs: over the 2**31 - 1 of a 1-D grid"
    return cfg


def min_blocks(dtype: str, qt: int, wide: bool = False) -> int:
    """CTAs of 256 threads per SM the kernel's registers must allow (``__launch_bounds__``): 3 (<= 80
    registers) where ptxas fits the variant there without spilling, else 2. fp32 windows and the
    8-output windows of 4-channel vectors do not fit; the wide-filter shape's (``wide``: 2-channel
    vectors) do. tests/test_depthwise_compile.py checks every catalog variant for spills."""
    return 3 if dtype != "float32" and (qt < 8 or wide) else 2


def dw_variant(p: ConvProblem, cfg: DwConfig):
    """``(kernel name, defines)`` of the compiled variant serving ``p`` with ``cfg``."""
    T, R, S, (sh, sw), (dh, dw), _ = problem_axes(p)
    mult1 = int(cfg.mult == 1)
    blocks = min_blocks(p.dtype, cfg.qt, cfg.wide)
    name = (f"depthwise_fprop_{dtype_tag(p.dtype)}_r{R}s{S}_sw{sw}dw{dw}_v{cfg.vec}i{cfg.vin}_q{cfg.qt}_b{blocks}"
            f"_c{cfg.cb}" + ("" if mult1 else f"_m{cfg.mult}"))
    defines = dict(CUCONV_DTYPE=dtype_code(p.dtype), DW_R=R, DW_S=S, DW_SW=sw, DW_DW=dw, DW_VEC=cfg.vec,
                   DW_VIN=cfg.vin, DW_QT=cfg.qt, DW_MULT1=mult1, DW_MIN_BLOCKS=blocks, DW_CB=cfg.cb, DW_CIN=cfg.cin,
                   CUCONV_KERNEL_NAME=name)
    return name, defines


def _catalog():
    """Depthwise problems whose variants CI compiles: the networks' filters and strides in every dtype,
    a channel multiplier, an odd C and a conv3d."""
    def dw(c, hw, f, s=1, dtype="bfloat16", mult=1, dil=1, nd=2):
        return ConvProblem.create(nd=nd, batch=2, in_spatial=(hw,) * nd, channels=c, out_channels=mult * c,
                                  filter_spatial=(f,) * nd, stride=s, dilation=dil, padding=dil * (f // 2), groups=c,
                                  dtype=dtype, layout="NHWC" if nd == 2 else "NDHWC")
    out = {}
    for dtype in ("float16", "bfloat16", "float32"):
        for f, s in ((3, 1), (3, 2), (5, 1), (5, 2), (7, 1)):
            out[f"{f}x{f}_s{s}_{dtype}"] = dw(144, 28, f, s, dtype)
    out.update(odd_c=dw(7, 11, 3), mult3_dil2=dw(16, 12, 3, mult=3, dil=2), conv3d=dw(64, 8, 3, nd=3))
    return out


#: Named depthwise problems covering the compiled variants (tests/test_depthwise_compile.py).
CATALOG = _catalog()
#: Every (source, defines, arch) of :data:`CATALOG`, for the CPU compile test (tests/test_compile.py).
COMPILE_VARIANTS = [(DW_SOURCE, dw_variant(p, dw_config(p))[1], arch) for p in CATALOG.values()
                    for arch in ("sm_80", "sm_90a")]
