"""The pointwise kernel's launch policy, compiled variants and parameter struct
(kernels_cu/pointwise/pointwise_fprop.cu).

A pure function of the problem: :func:`pw_config` picks the reduction width KC (C rounded up to whole
k16 steps), the channels of one tile NT (all of K up to :data:`MAX_NT`, else chunks of 128), the warps
along the channels WN and so the tile's pixels BM, and the epilogue's access width (16-byte vectors, or
single channels where K is not a multiple of 8); :func:`pw_variant` names the compiled variant and
its ``-D`` defines; :func:`pw_geometry` packs the run-time ``PwGeometry``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

import numpy as np

from ...launch import c_struct, dtype_code, dtype_tag
from ...problem import ConvProblem

__all__ = ["PwConfig", "pw_config", "pw_variant", "pw_geometry", "pw_declined", "dense_pointwise_declined",
           "pointwise_index_declined", "PW_SOURCE", "MAX_C", "MAX_NT", "CHUNK_NT", "THREADS"]

PW_SOURCE = "pointwise/pointwise_fprop.cu"
#: Input channels the kernel takes at most: a tile's x rows (two buffers of BM x C) and the filter
#: live in shared memory.
MAX_C = 256
#: Output channels one tile covers at most (the kernel's NW <= 128 per warp, two warps along them);
#: wider outputs run in chunks of :data:`CHUNK_NT`.
MAX_NT = 256
CHUNK_NT = 128
#: Shared memory a tile may take (bytes): within an A100's 164 KB per CTA, so one choice serves sm_80+;
#: a wide output over a long reduction runs in narrower chunks to fit.
SMEM_BUDGET = 160 * 1024
#: Threads per CTA (8 warps).
THREADS = 256
#: Channels per epilogue staging block and its row stride in floats (the kernel's SUB and SLD).
_SUB, _SLD = 64, 72


@dataclass(frozen=True)
class PwConfig:
    """One launch shape of the pointwise kernel (field meanings: the kernel's constants and ``PwGeometry``)."""

    kc: int          # C rounded up to a multiple of 16 (the reduction's k16 steps)
    nt: int          # output channels of one tile (a multiple of 16 * wn)
    wn: int          # warps along the output channels (1 or 2); 8 / wn along the pixels
    chunks: int      # column chunks of nt channels covering K
    m_tiles: int     # tiles of bm pixels covering M
    min_blocks: int  # CTAs per SM the registers must allow (__launch_bounds__)
    ovec: int = 8    # channels per epilogue access of out, bias and the residual: 8 (16 bytes) or 1
    xvec: int = 8    # channels per copy of x's rows and load of w's: 8 (16 bytes), or 4 / 2 for C off that grid

    @property
    def bm(self) -> int:
        """Output pixels of one tile: 16 per warp along the pixels."""
        return 16 * (8 // self.wn)

    @property
    def nw(self) -> int:
        """Output channels of one warp."""
        return self.nt // self.wn

    @property
    def threads(self) -> int:
        return THREADS

    @property
    def vin(self) -> int:
        """Channels per copy of x (x, and w, must sit on the grid of ``2 * xvec`` bytes)."""
        return self.xvec

    @property
    def vec(self) -> int:
        """Channels per epilogue access of out, bias and the residual: 16-byte vectors where K is a multiple
        of 8 (each output row on the 16-byte grid), else single channels."""
        return self.ovec

    @property
    def smem(self) -> int:
        """Dynamic shared memory (bytes): the filter chunk, two x buffers and the warps' staging."""
        kcs = self.kc + 8
        return self.nt * kcs * 2 + 2 * self.bm * kcs * 2 + 8 * 16 * _SLD * 4

    def tiles(self, p: ConvProblem) -> int:
        return self.m_tiles * self.chunks


def dense_pointwise_declined(p: ConvProblem) -> Optional[str]:
    """Why ``p`` is not the layer both pointwise kernels take, or None: a dense 1x1 convolution of stride 1
    without padding (the GEMM ``out = x w^T`` over pixels)."""
    if not p.is_pointwise:
        return "not a pointwise layer: the kernel takes 1x1 filters of stride 1 without padding"
    if p.groups != 1:
        return f"grouped ({p.groups} groups): the kernel is for dense convolutions"
    return None


def pointwise_index_declined(p: ConvProblem) -> Optional[str]:
    """Why the pointwise kernels' 64-bit element offsets cannot index ``p``, or None."""
    if p.gemm_m * max(p.channels, p.out_channels) >= 2**62:
        return f"an extent exceeds the kernel's index range ({p.gemm_m} pixels)"
    return None


def pw_declined(p: ConvProblem) -> Optional[str]:
    """Why the pointwise kernel cannot take ``p``, or None: a dense 1x1 convolution of stride 1 without
    padding (the GEMM ``out = x w^T`` over pixels), channels-last, C even (copies of x's rows of 8, 4 or 2
    channels: 16, 8 or 4 bytes) and at most :data:`MAX_C`; any K (off the multiples of 8, the epilogue
    stores single channels)."""
    why = dense_pointwise_declined(p)
    if why:
        return why
    if not p.layout.endswith("C"):
        return (f"{p.layout} operands: the kernel reads x and writes out channels-last, and the Hopper kernel "
                f"reads and writes channels-first 1x1 layers without moving them")
    if p.channels % 2:
        return (f"C = {p.channels}: the kernel copies x's rows in words of 8, 4 or 2 channels (16, 8 or 4 bytes), "
                f"so C must be even")
    if p.channels > MAX_C:
        return (f"C = {p.channels}: the kernel keeps a tile's whole reduction in shared memory, at most "
                f"{MAX_C} channels")
    return pointwise_index_declined(p)


def _copy_channels(c: int) -> int:
    """Channels per copy of a row of ``c`` channels: the widest of 8, 4 and 2 that divides it."""
    return next(v for v in (8, 4, 2) if c % v == 0)


def pw_config(p: ConvProblem) -> Union[PwConfig, str]:
    """The launch shape for ``p``: one tile covers all of K (rounded up to 16, or to 32 with two warps
    along it) up to :data:`MAX_NT` channels, else chunks of :data:`CHUNK_NT` (or half that, whichever is
    the widest whose shared memory is within :data:`SMEM_BUDGET`); two warps share a tile's
    channels where they are more than 128 (a warp's accumulators: NW / 2 registers) or C is more than
    64 (then 64-pixel tiles keep the two x buffers small). Output rows off the 16-byte grid (K not a
    multiple of 8) are stored one channel per access; x's and w's rows off the 16-byte grid (C not a multiple
    of 8) are copied in words of 4 or 2 channels. The device's own limit is checked by the
    kernel's plan (:meth:`cuconv.backends.pointwise.kernel.PointwiseKernel.plan_for`)."""
    kc = -(-p.channels // 16) * 16
    k16 = -(-p.out_channels // 16) * 16
    # the widest chunk whose shared memory fits SMEM_BUDGET (outputs wider than MAX_NT: CHUNK_NT at most)
    for nt_max in ((MAX_NT,) if k16 <= MAX_NT else ()) + (CHUNK_NT, CHUNK_NT // 2):
        wn = 2 if min(k16, nt_max) > 128 or kc > 64 else 1
        if k16 <= nt_max:
            nt, chunks = -(-k16 // (16 * wn)) * 16 * wn, 1
        else:
            nt, chunks = nt_max, -(-p.out_channels // nt_max)
        bm = 16 * (8 // wn)
        m_tiles = -(-p.gemm_m // bm)
        cfg = PwConfig(kc=kc, nt=nt, wn=wn, chunks=chunks, m_tiles=m_tiles, min_blocks=2 if nt // wn > 64 else 3,
                       ovec=1 if p.out_channels % 8 else 8, xvec=_copy_channels(p.channels))
        if cfg.smem <= SMEM_BUDGET:
            break
    if m_tiles * chunks >= 2**31:
        return f"{m_tiles * chunks} tiles: over the 2**31 - 1 a CTA's tile index counts"
    return cfg


def pw_variant(p: ConvProblem, cfg: PwConfig):
    """``(kernel name, defines)`` of the compiled variant serving ``p`` with ``cfg``."""
    scalar = "_v1" if cfg.ovec == 1 else ""
    copies = f"_x{cfg.xvec}" if cfg.xvec != 8 else ""
    name = f"pointwise_fprop_{dtype_tag(p.dtype)}_kc{cfg.kc}_n{cfg.nt}_wn{cfg.wn}{scalar}{copies}_b{cfg.min_blocks}"
    defines = dict(CUCONV_DTYPE=dtype_code(p.dtype), PW_KC=cfg.kc, PW_NT=cfg.nt, PW_WN=cfg.wn,
                   PW_MIN_BLOCKS=cfg.min_blocks, CUCONV_KERNEL_NAME=name)
    if cfg.ovec == 1:
        defines["PW_OVEC"] = 1
    if cfg.xvec != 8:
        defines["PW_XVEC"] = cfg.xvec
    return name, defines


#: ``PwGeometry``'s members in declaration order.
PW_FIELDS = [("M", np.int64)] + [(n, np.int32) for n in ("C", "K", "m_tiles", "chunks", "tiles")]


def pw_geometry(p: ConvProblem, cfg: PwConfig) -> np.void:
    """The struct for ``p`` launched with ``cfg``."""
    return c_struct(PW_FIELDS, dict(M=p.gemm_m, C=p.channels, K=p.out_channels, m_tiles=cfg.m_tiles,
                                    chunks=cfg.chunks, tiles=cfg.m_tiles * cfg.chunks))


def _catalog():
    """Pointwise problems whose variants CI compiles: mobile networks' expansions (16 -> 96, 24 -> 144,
    32 -> 192, 40 -> 240) and projections (96 -> 24, 144 -> 24, 192 -> 32), a wide output in chunks
    (64 -> 384), a long reduction (256 -> 64), float16, a 1x1x1 conv3d, and outputs off the multiples of 8:
    a detection head's distribution-to-box map (16 -> 1), an RGB map (64 -> 3), a squeeze-excite
    reduction (96 -> 4) and a wide one (256 -> 100), and inputs off the multiples of 8 (ShuffleNetV2's
    58 -> 58, copies of 2 channels; 116 -> 116, copies of 4)."""
    def conv(c, k, hw=8, dtype="bfloat16", nd=2):
        return ConvProblem.create(nd=nd, batch=2, in_spatial=(hw,) * nd, channels=c, out_channels=k,
                                  filter_spatial=(1,) * nd, stride=1, dilation=1, padding=0, groups=1, dtype=dtype,
                                  layout="NHWC" if nd == 2 else "NDHWC")
    return dict(expand_16_96=conv(16, 96), expand_24_144=conv(24, 144), expand_32_192=conv(32, 192),
                expand_40_240=conv(40, 240), project_96_24=conv(96, 24), project_144_24=conv(144, 24),
                project_192_32=conv(192, 32), wide_64_384=conv(64, 384), long_256_64=conv(256, 64),
                fp16_24_144=conv(24, 144, dtype="float16"), conv3d_32_64=conv(32, 64, hw=4, nd=3),
                narrow_16_1=conv(16, 1), narrow_64_3=conv(64, 3), narrow_96_4=conv(96, 4),
                odd_256_100=conv(256, 100), shuffle_58_58=conv(58, 58), shuffle_116_116=conv(116, 116))


#: Named pointwise problems covering the compiled variants (tests/test_pointwise.py).
CATALOG = _catalog()
#: Every (source, defines, arch) of :data:`CATALOG`, for the CPU compile test (tests/test_compile.py).
COMPILE_VARIANTS = [(PW_SOURCE, pw_variant(p, pw_config(p))[1], arch) for p in CATALOG.values()
                    for arch in ("sm_80", "sm_90a")]
