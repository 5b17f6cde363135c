"""``sm90_wgrad``: the conv2d weight gradient on Hopper with wgmma (fp16 / bf16, NHWC).

The same GEMM as :mod:`cuconv.backends.sm80.wgrad` (``dw = dy^T @ im2col(x)``, the reduction over
the output pixels, split across CTAs and added in split order), with the tiles staged in wgmma's
MN-major layout and multiplied by ``wgmma`` with both operands transposed
(kernels_cu/sm90/conv_wgrad_sm90.cu). It takes 16-byte copies only: channel counts (per group) that
are multiples of 8 and 16-byte aligned operands; :func:`declines` says otherwise, and the sm80
kernel serves the rest.
"""

from __future__ import annotations

from typing import Optional

from ...launch import dtype_code
from ...problem import ConvProblem
from ..sm80.variants import _DTYPE_TAG
from ..sm80.wgrad import WgradVariant
from ..sm80.wgrad import declines as sm80_declines

__all__ = ["SOURCE", "STAGES", "declines", "variant", "tile_for", "COMPILE_VARIANTS"]

SOURCE = "sm90/conv_wgrad_sm90.cu"
#: Ring depth (tiles of 64 pixels); copies run STAGES - 2 tiles ahead of the wgmmas.
STAGES = 4
_BK = 64


def declines(p: ConvProblem, device, x_ptr: Optional[int] = None, dy_ptr: Optional[int] = None) -> Optional[str]:
    """Why the Hopper kernel cannot compute ``p``'s weight gradient (None: it can)."""
    why = sm80_declines(p, device)
    if why is not None:
        return why
    if device.cc != (9, 0):
        return f"needs sm_90a (wgmma), the GPU is sm_{device.cc[0]}{device.cc[1]}"
    if p.channels_per_group % 8 or p.gemm_n % 8:
        return (f"channels per group {p.channels_per_group} / filters per group {p.gemm_n}: 16-byte copies need "
                f"multiples of 8")
    if any(ptr is not None and ptr % 16 for ptr in (x_ptr, dy_ptr)):
        return "x or dy is not 16-byte aligned"
    return None


def variant(p: ConvProblem, bn: Optional[int] = None, bm: Optional[int] = None) -> WgradVariant:
    """The kernel for ``p``: ``bm`` filters x ``bn`` columns x 64 pixels per CTA, ``bm / 64``
    warpgroups (see :func:`tile_for`)."""
    auto_bm, auto_bn = tile_for(p)
    bm, bn = bm or auto_bm, bn or auto_bn
    name = f"conv2d_wgrad_sm90_{_DTYPE_TAG[p.dtype]}_{bm}x{bn}x{_BK}_s{STAGES}"
    defines = dict(CUCONV_DTYPE=dtype_code(p.dtype), CUCONV_BM=bm, CUCONV_BN=bn, CUCONV_BK=_BK,
                   CUCONV_STAGES=STAGES, CUCONV_KERNEL_NAME=name)
    smem = STAGES * (bm + bn) * _BK * 2 + 1024  # the kernel aligns the ring to 1024 bytes
    per_sm = 2 if bm == 64 else 1  # 97 KiB of ring and 128 threads: two fit an SM
    return WgradVariant("sm90_wgrad", SOURCE, name, tuple(sorted(defines.items())), bm, bn, _BK, 128 * (bm // 64),
                        smem, per_sm)


def tile_for(p: ConvProblem):
    """``(bm, bn)``: 256 x 128 where there are 256+ filters per group (each tile's copies feed twice the
    multiply-adds of a 128 x 128 tile); 64 x 128 (one warpgroup, two CTAs per SM) for 64 or fewer
    filters over 512+ columns (a 128-row tile would be half empty: ResNet-50's 3x3 64 -> 64 at 56x56,
    N=32, 39.8 us against 46.6 on an H200); else 128 x 128 (with few columns the 64-row tile's twice as
    many splits cost more than its empty rows: the 1x1 64 -> 64 layer 29.2 us against 23.9)."""
    if p.gemm_n >= 256:
        return 256, 128
    return (64, 128) if p.gemm_n <= 64 and p.gemm_k >= 512 else (128, 128)


def _compile_variants():
    def problem(c, k, dtype):
        return ConvProblem.create(nd=2, batch=2, in_spatial=(16, 16), channels=c, out_channels=k, filter_spatial=(3, 3),
                                  stride=1, dilation=1, padding=1, groups=1, dtype=dtype, layout="NHWC")
    return [(SOURCE, dict(variant(q).defines), "sm_90a")
            for q in (problem(64, 64, "bfloat16"), problem(64, 128, "bfloat16"), problem(256, 256, "bfloat16"),
                      problem(64, 256, "float16"))]


#: Variants for the CPU compile test: every tile, both dtypes.
COMPILE_VARIANTS = _compile_variants()
