"""NumPy model of the tap-pair tensor-core depthwise kernel (kernels_cu/depthwise/depthwise_diag.cu).

The kernel's index math as functions, so a CPU test runs the whole kernel with the tile shapes the host
picks (:func:`cuconv.backends.depthwise.diag_variants.diag_config`):

* :func:`slot` -- the 16-byte shared-memory slot of unit ``u`` (8 channels) of tile pixel ``pix``, the
  swizzle that puts an ldmatrix block's 8 consecutive pixels on distinct bank groups;
* :func:`swizzled_tile` -- the input tile as the loader stores it, one row of 8 values per slot;
* :func:`lane_pixels` -- the tile pixel each lane's ldmatrix row address names, for one M block
  (2 output rows x 8 columns) and tap pair;
* :func:`b_fragment` -- the two 32-bit words lane ``lane`` holds of B = [diag(w_a); diag(w_b)] (mma.sync
  m16n8k16's B fragment), as the kernel's ``build_b`` forms them;
* :func:`diag_conv` -- the convolution item by item: per M block, channel group and tap pair, A's 16 rows
  read through the lanes' slots, the MMA with B reassembled from the lanes' fragments, fp32 accumulation.
"""

from __future__ import annotations

import numpy as np

from ..problem import ConvProblem
from .depthwise import cta_coordinates, input_tile

__all__ = ["slot", "swizzled_tile", "lane_pixels", "tap_pixels", "b_fragment", "diag_conv"]


def slot(pix, u, upp: int):
    """The slot of unit ``u`` of tile pixel ``pix`` with ``upp`` units a pixel: ``pix * upp +
    (u ^ swz(pix))``, ``swz(pix) = (pix >> log2(8 / upp)) & (upp - 1)``."""
    shift = {1: 3, 2: 2, 4: 1, 8: 0}[upp]
    pix = np.asarray(pix)
    return pix * upp + (u ^ ((pix >> shift) & (upp - 1)))


def swizzled_tile(tile: np.ndarray) -> np.ndarray:
    """``[slots][8]``: the tile ``[in_rows][in_cols][cb]`` stored slot by slot as the loader does."""
    rows, cols, cb = tile.shape
    upp = cb // 8
    out = np.full((rows * cols * upp, 8), np.nan, dtype=tile.dtype)
    for pix in range(rows * cols):
        r, c = divmod(pix, cols)
        for u in range(upp):
            out[slot(pix, u, upp)] = tile[r, c, 8 * u:8 * u + 8]
    return out


def tap_pixels(p: ConvProblem, in_cols: int) -> np.ndarray:
    """``[PAIRS][32]``: the tile pixel offset of the tap each lane addresses per pair (lanes 0-15: tap
    2j, lanes 16-31: tap 2j + 1, or tap 2j again past the last tap), the kernel's ``tap_pix``."""
    R, S = p.filter_spatial
    dh, dw = p.dilation
    taps, pairs = R * S, -(-R * S // 2)
    out = np.zeros((pairs, 32), dtype=np.int64)
    for j in range(pairs):
        for lane in range(32):
            tap = 2 * j + lane // 16
            tap = tap if tap < taps else 2 * j
            out[j, lane] = (tap // S) * dh * in_cols + (tap % S) * dw
    return out


def lane_pixels(p: ConvProblem, cfg, mr: int, mc: int, tap_pix: np.ndarray) -> np.ndarray:
    """``[32]``: the tile pixel lane ``lane`` addresses for M block (mr, mc) and one tap pair's
    ``tap_pix`` row: output row ``2 mr + (lane / 8) % 2``, column ``8 mc + lane % 8``."""
    sh, sw = p.stride
    lanes = np.arange(32)
    lane_pix = ((lanes >> 3) & 1) * sh * cfg.in_cols + (lanes & 7) * sw
    return 2 * mr * sh * cfg.in_cols + 8 * mc * sw + lane_pix + tap_pix


def b_fragment(w_a: np.ndarray, w_b: np.ndarray, lane: int):
    """``((B[2t][g], B[2t+1][g]), (B[2t+8][g], B[2t+9][g]))`` of B = [diag(w_a); diag(w_b)] (8 channels
    each), as lane (g, t) = (lane / 4, lane % 4) holds them: nonzero only where g / 2 == t."""
    g, t = lane // 4, lane % 4
    lo, hi = (w_a[g], w_b[g]) if g // 2 == t else (0.0, 0.0)
    first = (lo, 0.0) if g % 2 == 0 else (0.0, lo)
    second = (hi, 0.0) if g % 2 == 0 else (0.0, hi)
    return first, second


def _b_matrix(w_a: np.ndarray, w_b: np.ndarray) -> np.ndarray:
    """B (16 x 8) put back together from the 32 lanes' fragments."""
    B = np.zeros((16, 8), dtype=np.float32)
    for lane in range(32):
        g, t = lane // 4, lane % 4
        (b0, b1), (b2, b3) = b_fragment(w_a, w_b, lane)
        B[2 * t, g], B[2 * t + 1, g], B[2 * t + 8, g], B[2 * t + 9, g] = b0, b1, b2, b3
    return B


def diag_conv(x: np.ndarray, w: np.ndarray, p: ConvProblem, cfg) -> np.ndarray:
    """The convolution (no epilogue) as the kernel computes it: ``x`` NHWC, ``w`` ``(K, R, S, 1)``;
    float32 result (N, P, Q, K)."""
    R, S = p.filter_spatial
    P, Q = p.out_spatial
    K = p.out_channels
    taps = R * S
    wt = np.zeros((K, taps + 1), dtype=np.float32)  # a zero tap pairs an odd last one
    wt[:, :taps] = w.reshape(K, taps)
    upp = cfg.cb // 8
    tap_pix = tap_pixels(p, cfg.in_cols)
    out = np.zeros((p.batch, P, Q, K), dtype=np.float32)
    x5 = x[:, None]
    for item in range(cfg.tiles(p)):
        n, _, tile_p, tile_q, chunk = cta_coordinates(item, p, cfg)
        slots = swizzled_tile(input_tile(x5, p, cfg, n, 0, tile_p, tile_q, chunk)).astype(np.float32)
        for nt in range(upp):
            k0 = chunk * cfg.cb + 8 * nt
            if k0 >= K:
                continue
            for mb in range(cfg.m_blocks):
                mr, mc = divmod(mb, cfg.tqg)
                acc = np.zeros((16, 8), dtype=np.float32)
                for j in range(tap_pix.shape[0]):
                    rows = slots[slot(lane_pixels(p, cfg, mr, mc, tap_pix[j]), nt, upp)]  # [32][8]
                    a = np.concatenate([rows[:16], rows[16:]], axis=1)  # A[m] = lane m's row, lane 16 + m's
                    if 2 * j + 1 >= taps:
                        a[:, 8:] = 0.0  # ldmatrix.x2: the unpaired tap's columns 8-15 are zeros
                    acc += a @ _b_matrix(wt[k0:k0 + 8, 2 * j], wt[k0:k0 + 8, 2 * j + 1])
                for m in range(16):
                    pp = tile_p * cfg.tp + 2 * mr + m // 8
                    qq = tile_q * cfg.tq + 8 * mc + m % 8
                    if pp < P and qq < Q:
                        out[n, pp, qq, k0:k0 + 8] = acc[m]
    return out
