"""The explicit im2col matrix ``A[M, Kgemm]`` of one group, in NumPy.

Row ``m`` is output pixel ``(n, *out)`` (row-major, ``M = N * prod(out_spatial)``); column ``kk``
is filter tap and channel ``((t * R + r) * S + s) * Cg + c``. ``A @ W_g^T`` (``W_g`` the group's
weights viewed as ``[Kg, Kgemm]``) is the group's convolution. Every loader model and every loader
kernel is checked against this matrix.
"""

from __future__ import annotations

import itertools

import numpy as np

from ..problem import ConvProblem

__all__ = ["im2col_matrix", "pixel_coordinates"]


def pixel_coordinates(problem: ConvProblem, m: np.ndarray):
    """Decompose GEMM rows ``m`` into ``(n, out_coords)``; ``out_coords`` has one array per spatial dim."""
    m = np.asarray(m)
    coords = []
    rest = m
    for o in reversed(problem.out_spatial):
        coords.append(rest % o)
        rest = rest // o
    return rest, tuple(reversed(coords))


def im2col_matrix(x: np.ndarray, problem: ConvProblem, group: int = 0) -> np.ndarray:
    """``A[M, Kgemm]`` for native-layout ``x`` (zero where a tap falls in the padding)."""
    M, Cg = problem.gemm_m, problem.channels_per_group
    taps = list(itertools.product(*[range(f) for f in problem.filter_spatial]))
    a = np.zeros((M, len(taps) * Cg), dtype=x.dtype)
    n, out = pixel_coordinates(problem, np.arange(M))
    for j, tap in enumerate(taps):
        inside = np.ones(M, dtype=bool)
        src = []
        for o, t, s, d, lo, size in zip(out, tap, problem.stride, problem.dilation, problem.pad_lo,
                                        problem.in_spatial):
            coord = o * s + t * d - lo
            inside &= (coord >= 0) & (coord < size)
            src.append(np.clip(coord, 0, size - 1))
        vals = x[(n, *src)][:, group * Cg:(group + 1) * Cg]
        a[:, j * Cg:(j + 1) * Cg] = np.where(inside[:, None], vals, 0)
    return a
