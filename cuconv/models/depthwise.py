"""NumPy model of the depthwise kernel (kernels_cu/depthwise/): its CTAs, input tiles and thread windows.

The kernel's index math in three steps, each a function here, so a test can run the whole kernel on the
CPU with the tile shapes the host picks (:func:`cuconv.backends.depthwise.variants.dw_config`):

* :func:`cta_coordinates` -- work item (output tile) index -> (image, output depth, tile row, tile
  column, chunk), tile column fastest, channel chunk slowest: the HIP kernel's 1-D grid of one item per
  workgroup, and the order in which the CUDA kernel's persistent CTAs take runs of items;
* :func:`input_tile` -- the halo tile a CTA copies to shared memory for one filter depth slice:
  ``in_rows x in_cols x cin``, origin ``(p0 * stride_h - pad_h, q0 * stride_w - pad_w, k0 / mult)``,
  zeros outside the tensor (halo_tile.cuh);
* :func:`thread_outputs` -- what thread (cv, row, column group) accumulates from a tile: QT outputs
  along W x VEC channels, from a window of ``(QT - 1) * stride_w + (S - 1) * dil_w + 1`` tile columns
  per filter row (depthwise_fprop.cu, ``accumulate_slice``).

:func:`direct_conv` composes them into the whole convolution (fp32 accumulation), which the CPU tests
compare with :func:`cuconv.reference.conv_reference`.
"""

from __future__ import annotations

import numpy as np

from ..problem import ConvProblem

__all__ = ["cta_coordinates", "input_tile", "thread_outputs", "direct_conv"]


def _axes(p: ConvProblem):
    lead = 3 - p.nd
    D, H, W = (1,) * lead + tuple(p.in_spatial)
    O, P, Q = (1,) * lead + tuple(p.out_spatial)
    T, R, S = (1,) * lead + tuple(p.filter_spatial)
    sd, sh, sw = (1,) * lead + tuple(p.stride)
    dd, dh, dw = (1,) * lead + tuple(p.dilation)
    pd, ph, pw = (0,) * lead + tuple(p.pad_lo)
    return D, H, W, O, P, Q, T, R, S, sd, sh, sw, dd, dh, dw, pd, ph, pw


def cta_coordinates(block: int, p: ConvProblem, cfg):
    """``(n, o, tile_p, tile_q, chunk)`` of work item ``block``."""
    O = p.out_spatial[0] if p.nd == 3 else 1
    b = block
    tile_q = b % cfg.tiles_q; b //= cfg.tiles_q
    tile_p = b % cfg.tiles_p; b //= cfg.tiles_p
    o = b % O; b //= O
    n = b % p.batch
    chunk = b // p.batch
    return n, o, tile_p, tile_q, chunk


def input_tile(x5: np.ndarray, p: ConvProblem, cfg, n: int, d: int, tile_p: int, tile_q: int, chunk: int):
    """The tile ``[in_rows][in_cols][cin]`` of input depth slice ``d`` (``x5``: the input as NDHWC)."""
    D, H, W, O, P, Q, T, R, S, sd, sh, sw, dd, dh, dw, pd, ph, pw = _axes(p)
    C = p.channels
    h0 = tile_p * cfg.tp * sh - ph
    w0 = tile_q * cfg.tq * sw - pw
    c_lo = chunk * cfg.cb // cfg.mult
    tile = np.zeros((cfg.in_rows, cfg.in_cols, cfg.cin), dtype=x5.dtype)
    rows = np.arange(cfg.in_rows) + h0
    cols = np.arange(cfg.in_cols) + w0
    chans = np.arange(cfg.cin) + c_lo
    rv, cv_, kv = (rows >= 0) & (rows < H), (cols >= 0) & (cols < W), chans < C
    if 0 <= d < D:
        tile[np.ix_(rv, cv_, kv)] = x5[n, d][np.ix_(rows[rv], cols[cv_], chans[kv])]
    return tile


def thread_outputs(tile: np.ndarray, taps: np.ndarray, p: ConvProblem, cfg, cv: int, row: int, qg: int):
    """``[QT][VEC]`` float32 sums thread (cv, row, qg) adds for one slice: ``taps`` is ``[R][S][cb]``
    (the slice's filter taps of the CTA's channels, as the kernel keeps them in shared memory)."""
    D, H, W, O, P, Q, T, R, S, sd, sh, sw, dd, dh, dw, pd, ph, pw = _axes(p)
    win_cols = (cfg.qt - 1) * sw + (S - 1) * dw + 1
    chans = cv * cfg.vec + np.arange(cfg.vec)             # the thread's output channels in the chunk
    acc = np.zeros((cfg.qt, cfg.vec), dtype=np.float32)
    for r in range(R):
        src_row = row * sh + r * dh
        first = qg * cfg.qt * sw
        window = tile[src_row, first:first + win_cols][:, chans // cfg.mult].astype(np.float32)
        for s in range(S):
            for q in range(cfg.qt):
                acc[q] += window[q * sw + s * dw] * taps[r, s, chans]
    return acc


def direct_conv(x: np.ndarray, w: np.ndarray, p: ConvProblem, cfg) -> np.ndarray:
    """The convolution (no epilogue) as the kernel computes it, block by block and thread by thread:
    ``x`` NHWC / NDHWC, ``w`` ``(K, [T,] R, S, 1)``; float32 result of the output's shape."""
    D, H, W, O, P, Q, T, R, S, sd, sh, sw, dd, dh, dw, pd, ph, pw = _axes(p)
    x5 = x if p.nd == 3 else x[:, None]
    K = p.out_channels
    w5 = w.reshape(K, T, R, S).astype(np.float32)
    out = np.zeros((p.batch, O, P, Q, K), dtype=np.float32)
    blocks = cfg.tiles(p)
    for block in range(blocks):
        n, o, tile_p, tile_q, chunk = cta_coordinates(block, p, cfg)
        k0 = chunk * cfg.cb
        taps = np.zeros((T, R, S, cfg.cb), dtype=np.float32)
        kk = np.arange(k0, min(k0 + cfg.cb, K))
        taps[..., :len(kk)] = np.moveaxis(w5[kk], 0, -1)
        acc = {}
        for t in range(T):
            d = o * sd + t * dd - pd
            if not 0 <= d < D:
                continue
            tile = input_tile(x5, p, cfg, n, d, tile_p, tile_q, chunk)
            for cv in range(cfg.cv):
                for row in range(cfg.tp):
                    for qg in range(cfg.tqg):
                        part = thread_outputs(tile, taps[t], p, cfg, cv, row, qg)
                        acc[cv, row, qg] = acc.get((cv, row, qg), 0) + part
        for (cv, row, qg), a in acc.items():
            pp = tile_p * cfg.tp + row
            k = k0 + cv * cfg.vec
            if pp >= P or k >= K:
                continue
            for q in range(cfg.qt):
                qq = tile_q * cfg.tq + qg * cfg.qt + q
                if qq < Q:
                    out[n, o, pp, qq, k:k + cfg.vec] = a[q]
    return out if p.nd == 3 else out[:, 0]
