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

Channels-first x transposed in shared memory (the ``_xp`` variants, kernels_cu/sm90/transpose_loader.cuh):
each input row of a channels-last window is staged as a (64 channels x ``st_w`` pixels) box from column
``x0 - pad_w - st_shift`` on (:func:`cuconv.backends.sm90.tiles.staging_row`), and two warps move it into
the window slot by ldmatrix.trans / stmatrix with per-lane addresses. :func:`xpose_window` replays those
addresses on a byte image of the slot and reads it back as wgmma does (128B swizzle): the result is
:func:`halo_window`'s window.
"""

from __future__ import annotations

import numpy as np

from ..problem import ConvProblem

__all__ = ["halo_window", "halo_tap_rows", "cf_window", "cf_tap_block", "staged_row", "xpose_window"]


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
    h0, w0 = max(h_lo, 0), max(w_lo, 0)  # a window wholly above or left of x holds no pixel (no negative stop)
    hs, ws = slice(h0, max(h0, min(h_lo + wh, H))), slice(w0, max(w0, min(w_lo + ww, W)))
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


def staged_row(x_cf: np.ndarray, problem: ConvProblem, n: int, d: int, h: int, w0: int, c0: int,
               st_w: int) -> np.ndarray:
    """The staging box of input row ``h`` (depth ``d``) from column ``w0`` on: (64 channels from ``c0``, ``st_w``
    pixels) of ``x_cf`` (NCHW / NCDHW), zeros outside the tensor (TMA's fill)."""
    x5 = x_cf if problem.nd == 3 else x_cf[:, :, None]
    _, C, D, H, W = x5.shape
    out = np.zeros((64, st_w), dtype=x_cf.dtype)
    if not (0 <= d < D and 0 <= h < H):
        return out
    lo, hi = max(w0, 0), min(w0 + st_w, W)
    cs = slice(c0, min(c0 + 64, C))
    if lo < hi:
        out[:cs.stop - cs.start, lo - w0:hi - w0] = x5[n, cs, d, h, lo:hi]
    return out


def xpose_window(x_cf: np.ndarray, problem: ConvProblem, n: int, z: int, y0: int, x0: int, t: int, c0: int,
                 rows: int, slot_offset: int = 0) -> np.ndarray:
    """The channels-last window (as :func:`halo_window`, 64 channels from ``c0``) that the transposing warps
    write from staged rows of ``x_cf``: per staged row, warp ``xw`` takes the 8-pixel blocks ``pb = xw, xw + 2,
    ...``; per half (channel chunks ``half .. half + 3``) lane ``L``'s ldmatrix row is channel ``8 half + L`` at
    pixels ``8 pb ..``, and its stmatrix row is window pixel ``j = 8 pb + L % 8 - st_shift``, channel chunk
    ``q = half + L // 8``, at byte ``row + 16 (q XOR (row / 128 mod 8))`` with ``row = slot_offset +
    (i halo_w + j) 128`` (pixels outside ``[0, halo_w)`` go to scratch). The slot, ``slot_offset`` bytes past
    a 1024-byte atom (the second window slot's start), is read back through the same swizzle."""
    from ..backends.sm90.tiles import staging_row  # the host's geometry (a pure function)
    T, R, S, sd, dd, dh, dw, pd, ph, pw = _geometry(problem)
    st_w, shift = staging_row(problem)
    wh, ww = rows + (R - 1) * dh, 64 + (S - 1) * dw
    slot = np.full(((slot_offset + wh * ww * 128) // 2,), np.nan, dtype=np.float64)  # 16-bit element image
    d = z * sd - pd + t * dd
    for i in range(wh):
        staged = staged_row(x_cf, problem, n, d, y0 - ph + i, x0 - pw - shift, c0, st_w)
        for xw in (0, 1):
            for pb in range(xw, st_w // 8, 2):
                for half in (0, 4):
                    for lane in range(32):
                        q, r = half + lane // 8, lane % 8
                        block = staged[8 * q:8 * q + 8, 8 * pb:8 * pb + 8]  # ldmatrix.trans: matrix lane // 8
                        j = 8 * pb + r - shift
                        if 0 <= j < ww:
                            row = slot_offset + (i * ww + j) * 128
                            addr = row + 16 * (q ^ ((row >> 7) & 7))
                            slot[addr // 2:addr // 2 + 8] = block[:, r]  # stmatrix row r: pixel r, 8 channels
    out = np.zeros((wh, ww, 64), dtype=x_cf.dtype)
    for i in range(wh):
        for j in range(ww):
            row = slot_offset + (i * ww + j) * 128
            for q in range(8):
                addr = row + 16 * (q ^ ((row >> 7) & 7))
                out[i, j, 8 * q:8 * q + 8] = slot[addr // 2:addr // 2 + 8]
    return out
