"""The sm80 kernels' parameter structs and launch arithmetic (mirrors of the structs in kernels_cu/sm80/)."""

from __future__ import annotations

import functools
from typing import Optional, Tuple

import numpy as np

from ...launch import c_struct, divisor_fields, divisor_values, geometry3d, operand_or
from ...problem import ConvProblem, Epilogue

__all__ = ["im2col_geometry", "grouped_geometry", "out_vec", "epilogue_operands", "m_grid", "MAX_LD",
           "INT32_MAX"]

_MAX_GRID_Y = 65535


def _plane_fields(p: ConvProblem) -> dict:
    """The fields both 2-D structs share, from the one 3-D geometry (depth 1)."""
    g = geometry3d(p)
    return dict(M=p.gemm_m, H=g.H, W=g.W, C=p.channels, P=g.P, Q=g.Q, R=g.R, S=g.S, Cg=p.channels_per_group,
                stride_h=g.stride[1], stride_w=g.stride[2], dil_h=g.dilation[1], dil_w=g.dilation[2], pad_h=g.pad[1],
                pad_w=g.pad[2])


_GEOMETRY_FIELDS = [("M", np.int64)] + [(n, np.int32) for n in (
    "H", "W", "C", "P", "Q", "R", "S", "Cg", "k_gemm", "stride_h", "stride_w", "dil_h", "dil_w", "pad_h", "pad_w")] + \
    divisor_fields("div_q", "div_p", "div_cg", "div_s")


@functools.lru_cache(maxsize=256)
def im2col_geometry(p: ConvProblem) -> np.void:
    """The ``Im2colGeometry`` struct of kernels_cu/sm80/loader_im2col.cuh (memoised: a pure function
    of the problem, built on every call otherwise; callers pass it by value and never modify it)."""
    return c_struct(_GEOMETRY_FIELDS, dict(_plane_fields(p), k_gemm=p.gemm_k, **divisor_values(
        div_q=p.out_spatial[1], div_p=p.out_spatial[0], div_cg=p.channels_per_group, div_s=p.filter_spatial[1])))


_GROUPED_FIELDS = [("M", np.int64)] + [(n, np.int32) for n in (
    "H", "W", "C", "P", "Q", "R", "S", "Cg", "stride_h", "stride_w", "dil_h", "dil_w", "pad_h", "pad_w", "out_vec")] + \
    divisor_fields("div_q", "div_p")


def grouped_geometry(p: ConvProblem, vec: int) -> np.void:
    """The ``GroupedGeometry`` struct of kernels_cu/sm80/grouped_mma_sm80.cu (``vec``: :func:`out_vec`)."""
    return c_struct(_GROUPED_FIELDS, dict(_plane_fields(p), out_vec=int(vec), **divisor_values(
        div_q=p.out_spatial[1], div_p=p.out_spatial[0])))


def m_grid(m_tiles: int) -> Tuple[int, int]:
    """m tiles folded into grid (y, z): y <= 65535."""
    y = min(m_tiles, _MAX_GRID_Y)
    return y, -(-m_tiles // y)


INT32_MAX = 2**31 - 1
#: Largest leading dimension (elements) of an operand the linear loader reads: its in-tile offset
#: row * ld + col (rows < 256) is a 32-bit int.
MAX_LD = INT32_MAX // 256


def out_vec(ld: int, col_step: int, *pointers: Optional[int], itemsize: int = 2) -> int:
    """Widest output access of the epilogue (``out_vec`` of ``kernels_cu/sm80/epilogue.cuh``): 8
    elements when the row pitch ``ld``, the group's column step and every pointer (out, and residual /
    bias when present) allow it, else 2, else 1. The accesses are at most 16 bytes: 8 16-bit elements
    are one, 8 float32 ones (``itemsize`` 4) two."""
    ptrs = [p for p in pointers if p is not None]
    for vec in (8, 2):
        if ld % vec == 0 and col_step % vec == 0 and all(p % min(16, itemsize * vec) == 0 for p in ptrs):
            return vec
    return 1


def epilogue_operands(out, bias, residual, ep: Epilogue):
    """``(bias_arg, residual_arg, residual_ptr)`` for a launch: absent operands are passed as ``out``
    (never read: the kernel checks ``has_bias`` / ``has_residual``); ``residual_ptr`` is the
    residual's address when the epilogue reads it, else None (for :func:`out_vec`)."""
    loads_res = residual is not None and ep.loads_residual
    return (operand_or(bias, out), residual if loads_res else out, residual.data.ptr if loads_res else None)


