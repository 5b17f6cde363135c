"""NumPy model of the tensor-core depthwise kernel (kernels_cu/depthwise/depthwise_mma.cu).

The kernel's index math as functions, so a CPU test runs the whole kernel with the tile shapes the host
picks (:func:`cuconv.backends.depthwise.mma_variants.mma_config`):

* :func:`banded_filter` -- one filter row of one channel as the 16 x 8 matrix ``T[i][j] = w[s]`` where
  ``i - j == s * dil_w``: 8 outputs of a row are 16 input columns times it;
* :func:`b_fragment` -- the two 32-bit words lane ``lane`` holds of ``T`` (mma.sync m16n8k16's B
  fragment: ``(T[2t][g], T[2t+1][g])`` and ``(T[2t+8][g], T[2t+9][g])``, ``g = lane / 4``,
  ``t = lane % 4``), as the kernel's ``build_b`` forms them;
* :func:`channel_planes` -- the transposed input tile, one ``[in_rows][PLANE_COLS]`` plane per channel
  with zero columns past the tile (``transpose_tile``);
* :func:`mma_conv` -- the convolution tile by tile, channel by channel, 16 output rows x 8 columns per
  MMA and filter row, the A block of columns ``8 nb .. 8 nb + 15`` of the rows
  ``out_row * stride_h + r * dil_h`` (``mma_tile``), fp32 accumulation.
"""

from __future__ import annotations

import numpy as np

from ..problem import ConvProblem
from .depthwise import cta_coordinates, input_tile

__all__ = ["banded_filter", "b_fragment", "channel_planes", "plane_cols", "mma_conv"]


def plane_cols(tq: int) -> int:
    """Elements per plane row (the kernel's PLANE_COLS; the host sizes shared memory with it): ``tq + 8``
    rounded to an odd number of 8-element (16-byte) units."""
    c = tq + 8
    return c if (c // 8) % 2 else c + 8


def banded_filter(w_row: np.ndarray, dil_w: int) -> np.ndarray:
    """The 16 x 8 banded matrix of one filter row ``w_row`` (S taps) at W dilation ``dil_w``."""
    T = np.zeros((16, 8), dtype=np.float32)
    for j in range(8):
        for s, v in enumerate(w_row):
            i = j + s * dil_w
            if i < 16:
                T[i, j] = v
    return T


def b_fragment(T: np.ndarray, lane: int):
    """The pairs ``((T[2t][g], T[2t+1][g]), (T[2t+8][g], T[2t+9][g]))`` lane ``lane`` holds."""
    g, t = lane // 4, lane % 4
    return (T[2 * t, g], T[2 * t + 1, g]), (T[2 * t + 8, g], T[2 * t + 9, g])


def channel_planes(tile: np.ndarray, tq: int) -> np.ndarray:
    """``[cb][in_rows][plane_cols(tq)]``: the tile ``[in_rows][in_cols][cb]`` transposed, zero past it."""
    rows, cols, cb = tile.shape
    planes = np.zeros((cb, rows, plane_cols(tq)), dtype=tile.dtype)
    planes[:, :, :cols] = np.moveaxis(tile, -1, 0)
    return planes


def mma_conv(x: np.ndarray, w: np.ndarray, p: ConvProblem, cfg) -> np.ndarray:
    """The convolution (no epilogue) as the kernel computes it: ``x`` NHWC, ``w`` ``(K, R, S, 1)``;
    float32 result (N, P, Q, K)."""
    R, S = p.filter_spatial
    sh, _ = p.stride
    dh, dw = p.dilation
    P, Q = p.out_spatial
    K = p.out_channels
    w4 = w.reshape(K, R, S).astype(np.float32)
    out = np.zeros((p.batch, P, Q, K), dtype=np.float32)
    x5 = x[:, None]
    for item in range(cfg.tiles(p)):
        n, _, tile_p, tile_q, chunk = cta_coordinates(item, p, cfg)
        planes = channel_planes(input_tile(x5, p, cfg, n, 0, tile_p, tile_q, chunk), cfg.tq).astype(np.float32)
        for c in range(cfg.cb):
            k = chunk * cfg.cb + c
            if k >= K:
                continue
            bands = [banded_filter(w4[k, r], dw) for r in range(R)]
            for mb in range(cfg.mb):
                out_rows = 16 * mb + np.arange(16)
                for nb in range(cfg.nb):
                    acc = np.zeros((16, 8), dtype=np.float32)
                    for r in range(R):
                        a = planes[c][np.ix_(out_rows * sh + r * dh, 8 * nb + np.arange(16))]
                        acc += a @ bands[r]
                    pp = tile_p * cfg.tp + out_rows
                    qq = tile_q * cfg.tq + 8 * nb + np.arange(8)
                    keep_p, keep_q = pp < P, qq < Q
                    out[n][np.ix_(pp[keep_p], qq[keep_q], [k])] = acc[np.ix_(keep_p, keep_q)][..., None]
    return out
