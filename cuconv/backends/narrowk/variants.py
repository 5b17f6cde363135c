"""The narrow-output kernel's launch policy, compiled variants and parameter struct
(kernels_cu/narrowk/narrowk_fprop.cu).

A pure function of the problem: :func:`nk_config` picks the output channels per group (KV: 4 or 8,
covering K), the outputs per group along W (PX), the lanes sharing a group's reduction (UL) and the
grid; :func:`nk_variant` names the compiled variant and its ``-D`` defines; :func:`nk_geometry`
packs the run-time ``NkGeometry``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Union

import numpy as np

from ...launch import DTYPE_TAGS, c_struct, dtype_code, dtype_tag, geometry3d
from ...problem import ConvProblem
from ..depthwise.variants import index_range_declined, plane_offsets_declined

__all__ = ["NkConfig", "nk_config", "nk_variant", "nk_geometry", "nk_declined", "NK_SOURCE", "MAX_K", "MIN_UNITS"]

NK_SOURCE = "narrowk/narrowk_fprop.cu"
#: Output channels the kernel takes at most (a group's PX x KV sums live in registers).
MAX_K = 8
#: Channel vectors (16 bytes) per input pixel at least: fewer leave most of a group's lanes idle
#: (few-channel inputs are ``smallc_direct``'s).
MIN_UNITS = 4
#: Warps per CTA: one output row each.
WARPS = 8
#: The widest window (input vectors per channel vector) of a KV = 4 group that ptxas fits in 128
#: registers, for two CTAs per SM (tests/test_narrowk.py compiles the catalog without spills).
_WIN_TWO_CTAS = 6


@dataclass(frozen=True)
class NkConfig:
    """One launch shape of the narrow-output kernel (field meanings: the kernel's ``NkGeometry``)."""

    kv: int          # output channels per group (K <= kv; the others zero)
    px: int          # consecutive output pixels per group along W
    ul: int          # lanes per group, sharing its reduction
    vin: int         # channels per 16-byte vector of x and w
    units: int       # channel vectors per pixel: C / vin
    min_blocks: int  # CTAs per SM the registers must allow (__launch_bounds__)
    row_blocks: int  # CTAs per image along P (WARPS rows each)
    col_blocks: int  # CTAs per image along Q (32 / ul groups of px columns each)
    ctas: int

    @property
    def threads(self) -> int:
        return WARPS * 32

    @property
    def vec(self) -> int:
        """Channels per epilogue access of out, bias and the residual: one (scalar loads and stores)."""
        return 1

    @property
    def smem(self) -> int:
        """Dynamic shared memory (bytes): none, the kernel reads x and w from global memory."""
        return 0


def nk_declined(p: ConvProblem) -> Optional[str]:
    """Why the narrow-output kernel cannot take ``p``, or None: a dense float32 conv2d with K <=
    :data:`MAX_K`, a filter of more than one tap, and C a multiple of one 16-byte vector, at least
    :data:`MIN_UNITS` of them per pixel (docs/tuning.md#T-narrowk says where it is faster)."""
    if p.nd != 2:
        return "conv3d: the kernel is 2-D"
    if p.groups != 1:
        return f"grouped ({p.groups} groups): the kernel is for dense convolutions"
    if p.out_channels > MAX_K:
        return f"K = {p.out_channels}: the kernel is for at most {MAX_K} output channels"
    if p.dtype not in DTYPE_TAGS:  # the source builds for each
        return f"dtype {p.dtype}: the source builds for float16, bfloat16 and float32"
    if math.prod(p.filter_spatial) == 1:
        return ("a 1x1 filter: each input value meets only PX x K outputs, and the GEMM kernels run it faster "
                "(docs/tuning.md#T-narrowk)")
    vec = 16 // p.itemsize
    if p.channels % vec or p.channels // vec < MIN_UNITS:
        return (f"C = {p.channels}: the kernel reads 16-byte channel vectors ({vec} channels), at least "
                f"{MIN_UNITS} per pixel")
    return index_range_declined(p) or plane_offsets_declined(p)


def nk_config(p: ConvProblem) -> Union[NkConfig, str]:
    """The launch shape for ``p``. KV = 4 up to K = 4, else 8. PX: 4 outputs along W at KV = 4, whose
    window of at most :data:`_WIN_TWO_CTAS` vectors leaves room for two CTAs per SM (128 registers); at
    KV = 8, 8 outputs for filters up to 3 wide at W stride 1 (more sums per weight load), else 4; at
    most Q rounded up to a power of two (docs/tuning.md#T-narrowk). UL: the lanes of a group, the
    smallest power of two from 4 to 32 covering the channel vectors (fewer lanes leave none idle), at
    most PX x KV (the reduce-scatter leaves each lane whole sums)."""
    _, S = p.filter_spatial
    sh, sw = p.stride
    P, Q = p.out_spatial
    vec = 16 // p.itemsize
    units = p.channels // vec
    kv = 4 if p.out_channels <= 4 else 8
    px = 8 if kv == 8 and S <= 3 and sw == 1 else 4
    px = max(min(px, 1 << max(0, (Q - 1).bit_length())), 16 // kv)  # PX x KV >= 16: the smallest group's lanes
    win = (px - 1) * sw + (S - 1) * p.dilation[-1] + 1
    min_blocks = 2 if kv == 4 and win <= _WIN_TWO_CTAS else 1
    ul = min(32, px * kv, max(4, 1 << (units - 1).bit_length()))
    cols = px * (32 // ul)
    row_blocks, col_blocks = -(-P // WARPS), -(-Q // cols)
    ctas = p.batch * row_blocks * col_blocks
    if ctas >= 2**31:
        return f"{ctas} CTAs: over the 2**31 - 1 of a 1-D grid"
    return NkConfig(kv=kv, px=px, ul=ul, vin=vec, units=units, min_blocks=min_blocks, row_blocks=row_blocks,
                    col_blocks=col_blocks, ctas=ctas)


def nk_variant(p: ConvProblem, cfg: NkConfig):
    """``(kernel name, defines)`` of the compiled variant serving ``p`` with ``cfg``."""
    _, S = p.filter_spatial
    sw, dw = p.stride[-1], p.dilation[-1]
    name = f"narrowk_fprop_{dtype_tag(p.dtype)}_s{S}_sw{sw}dw{dw}_k{cfg.kv}_p{cfg.px}_u{cfg.ul}_b{cfg.min_blocks}"
    defines = dict(CUCONV_DTYPE=dtype_code(p.dtype), NK_S=S, NK_SW=sw, NK_DW=dw, NK_KV=cfg.kv, NK_PX=cfg.px,
                   NK_UL=cfg.ul, NK_WARPS=WARPS, NK_MIN_BLOCKS=cfg.min_blocks, CUCONV_KERNEL_NAME=name)
    return name, defines


#: ``NkGeometry``'s members in declaration order (32-bit ints).
NK_FIELDS = [(n, np.int32) for n in ("N", "H", "W", "C", "K", "P", "Q", "R", "stride_h", "dil_h", "pad_h", "pad_w",
                                     "units", "row_blocks", "col_blocks")]


def nk_geometry(p: ConvProblem, cfg: NkConfig) -> np.void:
    """The struct for ``p`` launched with ``cfg``."""
    g = geometry3d(p)
    return c_struct(NK_FIELDS, dict(N=p.batch, H=g.H, W=g.W, C=p.channels, K=p.out_channels, P=g.P, Q=g.Q, R=g.R,
                                    stride_h=g.stride[1], dil_h=g.dilation[1], pad_h=g.pad[1], pad_w=g.pad[2],
                                    units=cfg.units, row_blocks=cfg.row_blocks, col_blocks=cfg.col_blocks))


def _catalog():
    """Narrow-output problems whose variants CI compiles: the SD VAE's and UNet's last convolutions, a
    K = 8 head, a K = 1 map, a 2x2 filter, a strided and a dilated one (float32, the dtype the kernel
    serves)."""
    def conv(c, hw, f, k, s=1, d=1):
        return ConvProblem.create(nd=2, batch=1, in_spatial=(hw, hw), channels=c, out_channels=k,
                                  filter_spatial=(f, f), stride=s, dilation=d, padding=d * (f // 2), groups=1,
                                  dtype="float32", layout="NHWC")
    return dict(vae_conv_out=conv(128, 64, 3, 3), unet_conv_out=conv(320, 16, 3, 4), head_k8=conv(64, 16, 3, 8),
                map_k1=conv(64, 32, 3, 1), two_tap=conv(32, 16, 2, 4), strided=conv(32, 17, 3, 2, s=2),
                dilated=conv(16, 20, 3, 4, d=2))


#: Named narrow-output problems covering the compiled variants (tests/test_narrowk.py).
CATALOG = _catalog()
#: Every (source, defines, arch) of :data:`CATALOG`, for the CPU compile test (tests/test_compile.py).
COMPILE_VARIANTS = [(NK_SOURCE, nk_variant(p, nk_config(p))[1], arch) for p in CATALOG.values()
                    for arch in ("sm_80", "sm_90a")]
