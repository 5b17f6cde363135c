"""The few-channel kernel's tile policy and compiled variants (kernels_cu/smallc/smallc_fprop.cu).

A pure function of the problem: :func:`sc_config` picks the output channels per thread (KV), the
CTA's channel chunk, the outputs per thread along W (PX) and the output tile, and checks that the
tile fits shared memory; :func:`sc_variant` names the compiled variant and its ``-D`` defines.
Compile-time: dtype, C, R, S, stride and dilation along W, KV, PX and the input copy width, so a
network's stem is one variant.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Union

from ...launch import dtype_code, dtype_tag
from ...problem import LAYOUTS, ConvProblem
from ..depthwise.variants import index_range_declined, plane_offsets_declined, pow2_divisor, problem_axes

__all__ = ["ScConfig", "sc_config", "sc_variant", "smallc_declined", "few_channels_declined", "max_taps", "SC_SOURCE",
           "MAX_C", "MAX_TAPS", "MAX_TAPS_F32"]

SC_SOURCE = "smallc/smallc_fprop.cu"
#: Input channels the kernel takes at most (each one is an unrolled pass over the window).
MAX_C = 8
#: Multiply-adds per output element (C x R x S x T) at most: beyond that a tensor-core GEMM is faster
#: than fp32 multiply-adds (a 7x7 RGB stem, 147, runs on the implicit GEMM kernels).
MAX_TAPS = 64
#: The same for float32 data at precision "float32", whose tensor-core path multiplies three bf16 parts
#: per term after a split pass: a 7x7 stem of up to 4 channels (196) runs here
#: (docs/tuning.md#T-smallc-taps).
MAX_TAPS_F32 = 196
#: Shared memory one CTA may use (bytes): the taps as fp32 and one input tile.
SMEM_LIMIT = 96 * 1024
#: Threads per CTA at most.
MAX_THREADS = 256
_MAX_KG = 8             # channel groups per CTA: chunks of up to 64 output channels
_MAX_TILE_COLS = 64     # output columns per tile


@dataclass(frozen=True)
class ScConfig:
    """One launch shape of the few-channel kernel (field meanings: the kernel's ``ScGeometry``)."""

    kv: int         # output channels per thread
    vin: int        # input channels per copy into shared memory
    kg: int         # channel groups per CTA: the chunk is cb = kv * kg output channels
    px: int         # consecutive output pixels per thread along W
    tqg: int        # column groups of px per tile
    tp: int         # output rows per tile
    in_rows: int    # the input tile (halo included), all C channels
    in_cols: int
    tiles_p: int
    tiles_q: int
    chunks: int
    smem: int       # dynamic shared memory (bytes): fp32 taps + the input tile

    @property
    def cb(self) -> int:
        return self.kv * self.kg

    @property
    def tq(self) -> int:
        return self.tqg * self.px

    @property
    def vec(self) -> int:
        """The epilogue's vector width (channels per access of out, bias and residual): KV."""
        return self.kv

    @property
    def threads(self) -> int:
        return self.kg * self.tp * self.tqg

    def tiles(self, p: ConvProblem) -> int:
        """CTAs of the 1-D grid: chunks x images x output depth x tiles per plane."""
        return p.batch * (p.out_spatial[0] if p.nd == 3 else 1) * self.tiles_p * self.tiles_q * self.chunks


def max_taps(dtype: str, precision: str) -> int:
    """Multiply-adds per output the kernel takes for ``dtype`` data at ``precision``: :data:`MAX_TAPS_F32`
    for float32 at precision "float32", else :data:`MAX_TAPS`."""
    return MAX_TAPS_F32 if (dtype, precision) == ("float32", "float32") else MAX_TAPS


def few_channels_declined(p: ConvProblem, max_c: int = MAX_C) -> Optional[str]:
    """Why ``p`` is not a dense convolution of few input channels (one group, at most ``max_c``
    channels: :data:`MAX_C` for this kernel, ``smallc_mma`` passes its own), or None."""
    if p.groups != 1:
        return f"grouped ({p.groups} groups): the kernel is for dense convolutions"
    if p.channels > max_c:
        return f"C = {p.channels}: the kernel is for at most {max_c} input channels"
    return None


def smallc_declined(p: ConvProblem) -> Optional[str]:
    """Why the few-channel kernel cannot take ``p``, or None: dense (one group), at most
    :data:`MAX_C` input channels and :func:`max_taps` multiply-adds per output."""
    why = few_channels_declined(p)
    if why:
        return why
    taps = p.channels * math.prod(p.filter_spatial)
    limit = max_taps(p.dtype, p.precision)
    if taps > limit:
        return (f"{taps} multiply-adds per output (C x filter): above {limit}, where tensor cores beat fp32 "
                f"multiply-adds")
    return index_range_declined(p) or plane_offsets_declined(p)


def _channel_groups(ngroups: int) -> int:
    """Channel groups per CTA: the fewest padded groups over the chunks, then the most per CTA."""
    best = None
    for kg in range(min(_MAX_KG, ngroups), 0, -1):
        waste = -(-ngroups // kg) * kg - ngroups
        if best is None or waste < best[0]:
            best = (waste, kg)
    return best[1]


def sc_config(p: ConvProblem, smem_limit: int = SMEM_LIMIT) -> Union[ScConfig, str]:
    """The launch shape for few-channel problem ``p``, or the reason there is none.

    KV: the largest power of two up to 8 dividing K (vector stores of a pixel's channels); chunks of
    up to 64 channels with the least padding. PX = 8 outputs along W for filters up to 3 wide at W
    stride 1, else 4 (PX x KV accumulators and S x KV weights live in registers), at most Q rounded up to a power of
    two. Tile: among those of at most 256 threads and 64 columns, the one with the least halo and
    padding work; rows are halved until the tile fits ``smem_limit``."""
    T, R, S, (sh, sw), (dh, dw), (P, Q) = problem_axes(p)
    C, K, esize = p.channels, p.out_channels, p.itemsize
    kv = pow2_divisor(K, 8)
    kg = _channel_groups(K // kv)
    cb = kv * kg
    vin = pow2_divisor(C, 16 // esize) if C * esize >= 4 else 1
    px = min(8 if S <= 3 and sw == 1 else 4, 1 << (Q - 1).bit_length())
    groups = MAX_THREADS // kg
    taps_bytes = -(-T * R * S * C * cb * 4 // 16) * 16

    def extent(tp_, tqg_):
        return (tp_ - 1) * sh + (R - 1) * dh + 1, (tqg_ * px - 1) * sw + (S - 1) * dw + 1

    def smem_of(tp_, tqg_):
        rows, cols = extent(tp_, tqg_)
        return taps_bytes + rows * cols * C * esize

    best = None
    for tqg in range(1, min(-(-Q // px), groups, _MAX_TILE_COLS // px) + 1):
        tp = min(P, groups // tqg)
        rows, cols = extent(tp, tqg)
        cost = -(-P // tp) * -(-Q // (tqg * px)) * (rows * cols * C / cb + tp * tqg * px)
        if best is None or cost < best[0]:
            best = (cost, tp, tqg)
    _, tp, tqg = best
    while smem_of(tp, tqg) > smem_limit:
        if tp > 1:
            tp = -(-tp // 2)
        elif tqg > 1:
            tqg = -(-tqg // 2)
        else:
            return (f"the smallest tile needs {smem_of(tp, tqg)} bytes of shared memory with this filter and "
                    f"dilation, over the {smem_limit} the kernel uses")
    in_rows, in_cols = extent(tp, tqg)
    cfg = ScConfig(kv=kv, vin=vin, kg=kg, px=px, tqg=tqg, tp=tp, in_rows=in_rows, in_cols=in_cols,
                   tiles_p=-(-P // tp), tiles_q=-(-Q // (tqg * px)), chunks=-(-K // cb), smem=smem_of(tp, tqg))
    if cfg.tiles(p) >= 2**31:
        return f"{cfg.tiles(p)} CTAs: over the 2**31 - 1 of a 1-D grid"
    return cfg


def min_blocks(dtype: str, px: int) -> int:
    """CTAs of 256 threads per SM the kernel's registers must allow (``__launch_bounds__``): 3 (<= 80
    registers) for the 16-bit 4-output window, where ptxas fits it without spilling; 2 for the
    8-output and the fp32 ones. A CTA waits on its tile's loads before it computes, so the third CTA per SM is what overlaps
    one CTA's loads with another's multiply-adds (docs/tuning.md#T-smallc-occupancy)."""
    return 3 if px <= 4 and dtype != "float32" else 2


def sc_variant(p: ConvProblem, cfg: ScConfig):
    """``(kernel name, defines)`` of the compiled variant serving ``p`` with ``cfg``."""
    T, R, S, (sh, sw), (dh, dw), _ = problem_axes(p)
    cf = not LAYOUTS[p.layout][1]  # channels-first operands (the variant reads and writes them so)
    name = (f"smallc_fprop_{dtype_tag(p.dtype)}_c{p.channels}_r{R}s{S}_sw{sw}dw{dw}_k{cfg.kv}_p{cfg.px}"
            f"_i{cfg.vin}_b{min_blocks(p.dtype, cfg.px)}" + ("_cf" if cf else ""))
    defines = dict(CUCONV_DTYPE=dtype_code(p.dtype), SC_C=p.channels, SC_R=R, SC_S=S, SC_SW=sw, SC_DW=dw,
                   SC_KV=cfg.kv, SC_PX=cfg.px, SC_VIN=cfg.vin, SC_MAX_THREADS=MAX_THREADS, SC_MIN_BLOCKS=min_blocks(p.dtype, cfg.px),
                   CUCONV_KERNEL_NAME=name)
    if cf:
        defines["SC_NCHW"] = 1
    return name, defines


def _catalog():
    """Few-channel problems whose variants CI compiles: the networks' stems in every dtype (the 7x7 RGB
    stem in float32), a 4-channel 3x3, a conv3d and a narrow output."""
    def stem(c, hw, f, s, k, dtype="bfloat16", nd=2, pad=None, layout=None):
        return ConvProblem.create(nd=nd, batch=2, in_spatial=(hw,) * nd, channels=c, out_channels=k,
                                  filter_spatial=(f,) * nd, stride=s, dilation=1,
                                  padding=f // 2 if pad is None else pad, groups=1, dtype=dtype,
                                  layout=layout or ("NHWC" if nd == 2 else "NDHWC"))
    out = {}
    for dtype in ("float16", "bfloat16", "float32"):
        out[f"3x3_s2_rgb_{dtype}"] = stem(3, 64, 3, 2, 32, dtype)
        out[f"4x4_s4_rgb_{dtype}"] = stem(3, 64, 4, 4, 96, dtype, pad=0)
    out["7x7_s2_rgb_float32"] = stem(3, 64, 7, 2, 64, "float32")  # float32 only (MAX_TAPS_F32)
    out.update(c3_3x3_s1=stem(3, 32, 3, 1, 64), c4_3x3=stem(4, 32, 3, 1, 320), c1_conv3d=stem(1, 12, 3, 1, 16, nd=3), narrow_k3=stem(3, 16, 3, 1, 3))
    # channels-first operands: a VAE's 1x1 post_quant_conv, an RGB stem in float32, a conv3d
    out.update(c4_1x1_nchw=stem(4, 64, 1, 1, 4, pad=0, layout="NCHW"),
               rgb_3x3_s2_nchw_float32=stem(3, 64, 3, 2, 32, "float32", layout="NCHW"),
               c1_conv3d_ncdhw=stem(1, 12, 3, 1, 16, nd=3, layout="NCDHW"))
    return out


#: Named few-channel problems covering the compiled variants (tests/test_smallc.py).
CATALOG = _catalog()
#: Every (source, defines, arch) of :data:`CATALOG`, for the CPU compile test (tests/test_compile.py).
COMPILE_VARIANTS = [(SC_SOURCE, sc_variant(p, sc_config(p))[1], arch) for p in CATALOG.values()
                    for arch in ("sm_80", "sm_90a")]
