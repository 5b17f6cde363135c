"""NumPy model of the Hopper kernel's halo tiles (kernels_cu/sm90/halo_loader.cuh).

A halo tile is ``rows`` output rows x 64 output columns of one (image, depth) plane of a convolution
with H and W stride 1. Per (depth tap ``t``, channel block) the device loads one *window*: the input
pixels ``[y0 - pad_h, + rows + (R-1) dil_h) x [x0 - pad_w, + 64 + (S-1) dil_w)`` of input depth
``z * stride_d - pad_d + t * dil_d``, zero outside the tensor (a tiled TMA box). Consumer row block
``g`` reads tap ``(r, s)`` as the 64 window pixels ``(g + r dil_h, s dil_w + j)``, j = 0..63: the rows
of the implicit-GEMM matrix A for output pixels ``(y0 + g, x0 + j)``. :func:`halo_window` and
:func:`halo_tap_rows` are those two steps; tests check them against :func:`cuconv.models.im2col_matrix`.

Channels-first x (NCHW / NCDHW, the ``_cf`` variants): a window per (depth tap, channel block, filter
column ``s``) holds input rows ``[y0 - pad_h, + rows + (R-1) dil_h)`` of columns
``[x0 - pad_w + s dil_w, + 64)``, per row a (channels x 64 pixels) block; row block ``g`` reads tap
``(r, s)`` as block ``g + r dil_h``, which is A's rows for output pixels ``(y0 + g, x0 + j)`` transposed
(MN-major). :func:`cf_window` and :func:`cf_tap_block` are those steps.
"""

from __future__ import annotations

import numpy as np

from ..problem import ConvProblem

__all__ = ["halo_window", "halo_tap_rows", "cf_window", "cf_tap_block"]


def _geometry(problem: ConvProblem):
    lead = 3 - problem.nd
    T, R, S = (1,) * lead + tuple(problem.filter_spatial)
    sd = ((1,) * lead + tuple(problem.stride))[0]
    dd, dh, dw = (1,) * lead + tuple(problem.dilation)
    pd, ph, pw = (0,) * lead + tuple(problem.pad_lo)
    return T, R, S, sd, dd, dh, dw, pd, ph, pw


def halo_window(x: np.ndarray, problem: ConvProblem, n: int, z: int, y0: int, x0: int, t: int, c0: int,
                rows: int, channels: int = 64) -> np.ndarray:
    """The window a halo tile loads for depth tap ``t`` and channels ``[c0, c0 + channels)``:
    shape (rows + (R-1) dil_h, 64 + (S-1) dil_w, channels), zeros outside ``x`` (NHWC / NDHWC)."""
    T, R, S, sd, dd, dh, dw, pd, ph, pw = _geometry(problem)
    x5 = x if problem.nd == 3 else x[:, None]
    _, D, H, W, C = x5.shape
    wh, ww = rows + (R - 1) * dh, 64 + (S - 1) * dw
    out = np.zeros((wh, ww, channels), dtype=x.dtype)
    d = z * sd - pd + t * dd
    if not 0 <= d < D or not 0 <= n < x5.shape[0]:
        return out
    h_lo, w_lo = y0 - ph, x0 - pw
    hs, ws = slice(max(h_lo, 0), min(h_lo + wh, H)), slice(max(w_lo, 0), min(w_lo + ww, W))
    cs = slice(c0, min(c0 + channels, C))
    block = x5[n, d, hs, ws, cs]
    out[hs.start - h_lo:hs.start - h_lo + block.shape[0], ws.start - w_lo:ws.start - w_lo + block.shape[1],
        :block.shape[2]] = block
    return out


def halo_tap_rows(window: np.ndarray, problem: ConvProblem, g: int, r: int, s: int) -> np.ndarray:
    """The 64 A rows consumer row block ``g`` reads for tap (r, s): window pixels
    ``(g + r dil_h, s dil_w + j)``, j = 0..63 (what its wgmma descriptor's start address selects)."""
    _, _, _, _, _, dh, dw, _, _, _ = _geometry(problem)
    return window[g + r * dh, s * dw: s * dw + 64]


def cf_window(x_cf: np.ndarray, problem: ConvProblem, n: int, z: int, y0: int, x0: int, t: int, c0: int, s: int,
              rows: int, channels: int = 64) -> np.ndarray:
    """The window a channels-first tile loads for depth tap ``t``, channels ``[c0, c0 + channels)`` and filter
    column ``s`` from ``x_cf`` (NCHW / NCDHW): shape (rows + (R-1) dil_h, channels, 64), zeros outside."""
    T, R, S, sd, dd, dh, dw, pd, ph, pw = _geometry(problem)
    window = halo_window(np.moveaxis(x_cf, 1, -1), problem, n, z, y0, x0 + s * dw, t, c0, rows, channels)
    # the channels-last window of the shifted columns: its first 64 columns, channel rows of pixels
    return np.ascontiguousarray(np.moveaxis(window[:, :64], 2, 1))


def cf_tap_block(window: np.ndarray, problem: ConvProblem, g: int, r: int) -> np.ndarray:
    """The (channels x 64 pixels) block consumer row block ``g`` reads for filter row ``r`` of a channels-first
    window: input row ``g + r dil_h`` (what its MN-major descriptor's start address selects)."""
    _, _, _, _, _, dh, _, _, _, _ = _geometry(problem)
    return window[g + r * dh]
