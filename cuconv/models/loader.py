"""NumPy model of the software im2col loader (cp.async on sm_80+, buffer_load ... lds on CDNA).

A loader fills one ``(tile_m, tile_k)`` A tile for GEMM coordinates ``(m_offset, k_offset)`` of one
group. It computes flat NHWC element addresses exactly as the kernels do, on one of three
compile-time sub-paths:

``pointwise``
    1x1(x1) filter, stride 1, no padding: the im2col matrix is the input itself, so the address is
    ``m * C + group * Cg + k`` -- the linear (matmul) loader's address stream.
``uniform``
    ``Cg % tile_k == 0``: a K tile never straddles two filter taps, so ``(tap, c_base)`` is computed
    once per tile from ``k_offset``; only the rows ``(n, *out)`` vary per lane.
``per_lane``
    anything (e.g. a stem with C = 3): every column decomposes its own ``k`` into ``(tap, c)``.

Elements outside the input (halo), rows ``>= M`` and columns ``>= Kgemm`` are zero and produce no
address (:func:`loader_addresses` returns -1 there): kernels must never touch memory outside the
tensor. The models are the oracle for the CUDA and HIP loaders.
"""

from __future__ import annotations

import numpy as np

from ..problem import ConvProblem
from .im2col import pixel_coordinates

__all__ = ["SUBPATHS", "subpath_ok", "loader_addresses", "loader_tile"]

SUBPATHS = ("pointwise", "uniform", "per_lane")


def subpath_ok(problem: ConvProblem, subpath: str, tile_k: int) -> bool:
    """Whether ``subpath`` may serve ``problem`` with K tiles of ``tile_k`` columns."""
    if subpath == "pointwise":
        return problem.is_pointwise and all(d >= 1 for d in problem.dilation)
    if subpath == "uniform":
        return problem.channels_per_group % tile_k == 0
    if subpath == "per_lane":
        return True
    raise ValueError(f"subpath: expected one of {SUBPATHS}, got {subpath!r}")


def _tap_decompose(problem: ConvProblem, tap: np.ndarray):
    """Flat tap index -> per-dim filter coordinates (outermost first)."""
    coords, rest = [], tap
    for f in reversed(problem.filter_spatial):
        coords.append(rest % f)
        rest = rest // f
    return tuple(reversed(coords))


def loader_addresses(problem: ConvProblem, m_offset: int, k_offset: int, tile_m: int, tile_k: int,
                     subpath: str, group: int = 0) -> np.ndarray:
    """Flat element index into native-layout x for each tile element, -1 where the tile reads zero."""
    if not subpath_ok(problem, subpath, tile_k):
        raise ValueError(f"subpath: {subpath!r} cannot serve {problem.describe()} with tile_k={tile_k}")
    C, Cg, M, Kgemm = problem.channels, problem.channels_per_group, problem.gemm_m, problem.gemm_k
    m = m_offset + np.arange(tile_m)[:, None]            # (tile_m, 1)
    k = k_offset + np.arange(tile_k)[None, :]            # (1, tile_k)
    valid = (m < M) & (k < Kgemm)
    if subpath == "pointwise":
        addr = m * C + group * Cg + k
        return np.where(valid, addr, -1)
    if subpath == "uniform":
        tap0, c_base = divmod(k_offset, Cg)               # once per tile
        tap = np.full_like(k, tap0)
        c = c_base + np.arange(tile_k)[None, :]
    else:                                                # per_lane: each column on its own
        tap, c = np.divmod(k, Cg)
    n, out = pixel_coordinates(problem, np.minimum(m, M - 1))
    filt = _tap_decompose(problem, np.minimum(tap, np.prod(problem.filter_spatial) - 1))
    addr = n
    for o, f, s, d, lo, L in zip(out, filt, problem.stride, problem.dilation, problem.pad_lo,
                                 problem.in_spatial):
        coord = o * s + f * d - lo
        valid = valid & (coord >= 0) & (coord < L)
        addr = addr * L + coord
    addr = addr * C + group * Cg + c
    return np.where(valid, addr, -1)


def loader_tile(x: np.ndarray, problem: ConvProblem, m_offset: int, k_offset: int, tile_m: int, tile_k: int,
                subpath: str, group: int = 0) -> np.ndarray:
    """The A tile the loader stages: ``x.ravel()`` at :func:`loader_addresses`, zero at -1."""
    addr = loader_addresses(problem, m_offset, k_offset, tile_m, tile_k, subpath, group)
    flat = np.ascontiguousarray(x).reshape(-1)
    return np.where(addr >= 0, flat[np.maximum(addr, 0)], 0).astype(x.dtype)
