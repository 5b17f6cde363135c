"""``ConvGeometryHip``: the CDNA3 kernel's parameter struct (kernels_hip/common/index_math.h)."""

from __future__ import annotations

import math
from typing import Tuple

import numpy as np

from ...launch import c_struct, fast_divisor, geometry3d
from .variants import padded_k

__all__ = ["fast_divmod_params", "hip_geometry", "x_bytes", "w_bytes", "GEOMETRY_FIELDS", "MAX_RESOURCE_BYTES"]

#: num_records of a buffer resource is a 32-bit byte count.
MAX_RESOURCE_BYTES = (1 << 32) - 1


def fast_divmod_params(divisor: int) -> Tuple[int, int, int]:
    """``(divisor, multiplier, shift)`` of ``FastDivmod`` (kernels_hip/common/index_math.h): the same
    rounded-up reciprocal as CUDA's ``FastDivisor`` (:func:`cuconv.launch.fast_divisor`), with the
    divisor kept for the remainder."""
    mul, shr = fast_divisor(int(divisor))
    return int(divisor), mul, shr


_I32 = [(n, np.int32) for n in ("N", "H", "W", "C", "P", "Q", "R", "S", "Cg", "G", "Kg", "K", "stride_h", "stride_w",
                                "dil_h", "dil_w", "pad_h", "pad_w", "M", "Kgemm", "Kpad")]
_DIVS = ("div_Q", "div_P", "div_Cg", "div_S")
#: Field list of ``ConvGeometryHip`` (a FastDivmod member is three consecutive uint32: same layout).
GEOMETRY_FIELDS = _I32 + [("x_bytes", np.uint32), ("w_bytes", np.uint32)] + \
    [(f"{d}_{part}", np.uint32) for d in _DIVS for part in ("divisor", "multiplier", "shift")]


def hip_geometry(problem) -> np.void:
    """The ``ConvGeometryHip`` kernel parameter for a 2-D problem (x and padded weights contiguous)."""
    g = geometry3d(problem)
    H, W, P, Q, R, S = g.H, g.W, g.P, g.Q, g.R, g.S
    kpad = padded_k(problem)
    vals = dict(N=problem.batch, H=H, W=W, C=problem.channels, P=P, Q=Q, R=R, S=S, Cg=problem.channels_per_group,
                G=problem.groups, Kg=problem.out_channels_per_group, K=problem.out_channels,
                stride_h=g.stride[1], stride_w=g.stride[2], dil_h=g.dilation[1],
                dil_w=g.dilation[2], pad_h=g.pad[1], pad_w=g.pad[2], M=problem.gemm_m,
                Kgemm=problem.gemm_k, Kpad=kpad, x_bytes=x_bytes(problem), w_bytes=w_bytes(problem))
    for name, d in zip(_DIVS, (Q, P, problem.channels_per_group, S)):
        for part, v in zip(("divisor", "multiplier", "shift"), fast_divmod_params(d)):
            vals[f"{name}_{part}"] = v
    return c_struct(GEOMETRY_FIELDS, vals)


def x_bytes(problem) -> int:
    return problem.batch * math.prod(problem.in_spatial) * problem.channels * problem.itemsize


def w_bytes(problem) -> int:
    return problem.out_channels * padded_k(problem) * problem.itemsize


