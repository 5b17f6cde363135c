"""The narrow pointwise kernel's launch policy, compiled variants and parameter struct
(kernels_cu/pointwise/pointwise_narrow.cu).

A pure function of the problem: :func:`pn_declined` says which 1x1 layers the design takes (a few
output channels from a few input channels: the filter lives in registers), :func:`pn_config` the
launch shape (one thread per output pixel at a time, a grid-stride loop), :func:`pn_variant` the
compiled variant (dtype, C and K) and :func:`pn_geometry` the run-time struct.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

import numpy as np

from ...launch import DTYPE_TAGS, c_struct, dtype_code, dtype_tag
from ...problem import ConvProblem
from .variants import dense_pointwise_declined, pointwise_index_declined

__all__ = ["PnConfig", "pn_config", "pn_declined", "pn_variant", "pn_geometry", "PN_SOURCE", "MAX_K",
           "MAX_WEIGHTS", "THREADS"]

PN_SOURCE = "pointwise/pointwise_narrow.cu"
#: Output channels the kernel takes at most.
MAX_K = 8
#: Filter values (C x K) at most: each thread holds the whole filter in fp32 registers.
MAX_WEIGHTS = 64
#: Threads per CTA (the kernel's THREADS).
THREADS = 256


@dataclass(frozen=True)
class PnConfig:
    """One launch shape of the narrow pointwise kernel."""

    vin: int          # channels per 16-byte load of x
    m_blocks: int     # CTAs that give every output pixel a thread of its own (the grid is at most this)

    @property
    def threads(self) -> int:
        return THREADS

    @property
    def smem(self) -> int:
        """Dynamic shared memory (bytes): none, the filter lives in registers."""
        return 0

    @property
    def vec(self) -> int:
        """Channels per epilogue access of out, bias and the residual: one."""
        return 1

    def tiles(self, p: ConvProblem) -> int:
        """Work items of the persistent grid (:meth:`cuconv.backends.depthwise.kernel.DirectPlan.grid`):
        blocks of :data:`THREADS` output pixels."""
        return self.m_blocks


def pn_declined(p: ConvProblem) -> Optional[str]:
    """Why the narrow pointwise kernel cannot take ``p``, or None: a dense 1x1 convolution of stride 1
    without padding, channels-last, K <= :data:`MAX_K`, C a multiple of one 16-byte vector and C x K
    <= :data:`MAX_WEIGHTS` (the filter in registers)."""
    why = dense_pointwise_declined(p)
    if why:
        return why
    if not p.layout.endswith("C"):
        return f"{p.layout} operands: the kernel reads x and writes out channels-last"
    if p.dtype not in DTYPE_TAGS:
        return f"dtype {p.dtype}: the source builds for float16, bfloat16 and float32"
    if p.out_channels > MAX_K:
        return f"K = {p.out_channels}: the kernel is for at most {MAX_K} output channels"
    vin = 16 // p.itemsize
    if p.channels % vin:
        return f"C = {p.channels}: the kernel loads x's rows in 16-byte vectors of {vin} channels"
    if p.channels * p.out_channels > MAX_WEIGHTS:
        return (f"C x K = {p.channels * p.out_channels} filter values: the kernel holds at most {MAX_WEIGHTS} in "
                f"each thread's registers")
    return pointwise_index_declined(p)


def pn_config(p: ConvProblem) -> Union[PnConfig, str]:
    """The launch shape for ``p``: 16-byte loads of x, blocks of :data:`THREADS` pixels."""
    blocks = -(-p.gemm_m // THREADS)
    return PnConfig(vin=16 // p.itemsize, m_blocks=min(blocks, 2**31 - 1))


def pn_variant(p: ConvProblem, cfg: PnConfig):
    """``(kernel name, defines)`` of the compiled variant serving ``p``."""
    name = f"pointwise_narrow_{dtype_tag(p.dtype)}_c{p.channels}_k{p.out_channels}"
    defines = dict(CUCONV_DTYPE=dtype_code(p.dtype), PN_C=p.channels, PN_K=p.out_channels, CUCONV_KERNEL_NAME=name)
    return name, defines


#: ``PnGeometry``'s members in declaration order.
PN_FIELDS = [("M", np.int64)]


def pn_geometry(p: ConvProblem, cfg: PnConfig) -> np.void:
    """The struct for ``p``."""
    return c_struct(PN_FIELDS, dict(M=p.gemm_m))


def _catalog():
    """Problems whose variants CI compiles: a detection head's 16 -> 1 map in each dtype, and the
    widest filters the registers hold."""
    def pw(c, k, dtype, nd=2):
        return ConvProblem.create(nd=nd, batch=2, in_spatial=(8,) * nd, channels=c, out_channels=k,
                                  filter_spatial=(1,) * nd, stride=1, dilation=1, padding=0, groups=1, dtype=dtype,
                                  layout="NHWC" if nd == 2 else "NDHWC")
    out = {f"c16_k1_{d}": pw(16, 1, d) for d in DTYPE_TAGS}
    out.update(c8_k8=pw(8, 8, "bfloat16"), c64_k1=pw(64, 1, "float16"), c16_k4_f32=pw(16, 4, "float32"),
               conv3d=pw(32, 2, "bfloat16", nd=3))
    return out


#: Named problems covering the compiled variants (tests/test_pointwise_narrow.py).
CATALOG = _catalog()
#: Every (source, defines, arch) of :data:`CATALOG`, for the CPU compile test (tests/test_compile.py).
COMPILE_VARIANTS = [(PN_SOURCE, pn_variant(p, pn_config(p))[1], arch) for p in CATALOG.values()
                    for arch in ("sm_80", "sm_90a")]
