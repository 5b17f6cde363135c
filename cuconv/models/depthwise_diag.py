"""NumPy model of the tap-pair tensor-core depthwise kernel (kernels_cu/depthwise/depthwise_diag.cu).

The kernel's index math as functions, so a CPU test runs the whole kernel with the tile shapes the host
picks (:func:`cuconv.backends.depthwise.diag_variants.diag_config`):

* :func:`item_coordinates` -- a work item's (image, tile row, tile column, chunk), the chunk fastest;
* :func:`slot` -- the 16-byte shared-memory slot of unit ``u`` (8 channels) of tile pixel ``pix``, the
  swizzle that puts an ldmatrix block's 8 consecutive pixels on distinct bank groups;
* :func:`phys`, :func:`swizzled_tile` -- the input tile as the loader stores it (a row's columns in W
  stride phases), one row of 8 values per slot;
* :func:`lane_pixels` -- the tile pixel each lane's ldmatrix row address names, for one M block
  (2 output rows x 8 columns) and tap pair;
* :func:`b_fragment` -- the two 32-bit words lane ``lane`` holds of B = [diag(w_a); diag(w_b)] (mma.sync
  m16n8k16's B fragment), as the kernel's ``build_b`` forms them;
* :func:`diag_conv` -- the convolution item by item: per M block, channel group and tap pair, A's 16 rows
  read through the lanes' slots, the MMA with B reassembled from the lanes' fragments, fp32 accumulation;
* :func:`quad_transpose` -- the epilogue's exchange of 32-bit words within each quad of lanes (two
  rounds of two shuffles), and :func:`store_lanes`, which pixel and channels each lane then stores.
"""

from __future__ import annotations

import numpy as np

from ..problem import ConvProblem
from .depthwise import input_tile

__all__ = ["item_coordinates", "phys", "slot", "swizzled_tile", "lane_pixels", "tap_pixels", "b_fragment", "diag_conv",
           "quad_transpose", "store_lanes"]


def item_coordinates(item: int, p: ConvProblem, cfg):
    """``(n, tile_p, tile_q, chunk)`` of work item ``item``: the chunk runs fastest, then the tile column,
    the tile row and the image (the kernel's ``decode``)."""
    rest, chunk = divmod(item, cfg.chunks)
    tile_q = rest % cfg.tiles_q
    rest //= cfg.tiles_q
    tile_p = rest % cfg.tiles_p
    return rest // cfg.tiles_p, tile_p, tile_q, chunk


def slot(pix, u):
    """The slot of unit ``u`` (0 or 1) of tile pixel ``pix``: ``2 pix + (u ^ ((pix >> 2) & 1))``."""
    pix = np.asarray(pix)
    return 2 * pix + (u ^ ((pix >> 2) & 1))


def phys(c, cfg):
    """The pixel of input column ``c`` within its tile row: at W stride 2 the even columns come first,
    then the odd ones (the kernel's ``phys``)."""
    half = cfg.row_pixels // cfg.sw
    return (c % cfg.sw) * half + c // cfg.sw


def swizzled_tile(tile: np.ndarray, cfg) -> np.ndarray:
    """``[slots][8]``: the tile ``[in_rows][in_cols][16]`` stored slot by slot as the loader does (rows of
    ``cfg.row_pixels`` pixels)."""
    rows, cols, cb = tile.shape
    out = np.full((rows * cfg.row_pixels * 2, 8), np.nan, dtype=tile.dtype)
    for r in range(rows):
        for c in range(cols):
            pix = r * cfg.row_pixels + phys(c, cfg)
            for u in range(2):
                out[slot(pix, u)] = tile[r, c, 8 * u:8 * u + 8]
    return out


def tap_pixels(p: ConvProblem, cfg) -> np.ndarray:
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
            out[j, lane] = (tap // S) * dh * cfg.row_pixels + phys((tap % S) * dw, cfg)
    return out


def lane_pixels(p: ConvProblem, cfg, mr: int, mc: int, tap_pix: np.ndarray) -> np.ndarray:
    """``[32]``: the tile pixel lane ``lane`` addresses for M block (mr, mc) and one tap pair's
    ``tap_pix`` row: output row ``2 mr + (lane / 8) % 2``, column ``8 mc + lane % 8`` (input column
    ``sw`` times that, pixel ``phys`` of it: consecutive outputs, consecutive pixels)."""
    sh, _ = p.stride
    lanes = np.arange(32)
    lane_pix = ((lanes >> 3) & 1) * sh * cfg.row_pixels + (lanes & 7)
    return 2 * mr * sh * cfg.row_pixels + 8 * mc + lane_pix + tap_pix


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
    tap_pix = tap_pixels(p, cfg)
    out = np.zeros((p.batch, P, Q, K), dtype=np.float32)
    x5 = x[:, None]
    for item in range(cfg.tiles(p)):
        n, tile_p, tile_q, chunk = item_coordinates(item, p, cfg)
        slots = swizzled_tile(input_tile(x5, p, cfg, n, 0, tile_p, tile_q, chunk), cfg).astype(np.float32)
        for nt in range(2):
            k0 = chunk * cfg.cb + 8 * nt
            for mb in range(cfg.m_blocks):
                mr, mc = divmod(mb, cfg.tqg)
                acc = np.zeros((16, 8), dtype=np.float32)
                for j in range(tap_pix.shape[0]):
                    rows = slots[slot(lane_pixels(p, cfg, mr, mc, tap_pix[j]), nt)]  # [32][8]
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


def _shfl_xor(v: np.ndarray, mask: int) -> np.ndarray:
    """``__shfl_xor_sync`` over a warp: lane ``l`` gets ``v[l ^ mask]``."""
    return v[np.arange(32) ^ mask]


def quad_transpose(v: np.ndarray) -> np.ndarray:
    """The kernel's ``quad_transpose`` on the warp's words ``v`` ([32][4]: lane l's ``v[T]`` is meant for
    lane T of its quad), selects and shuffles as written there: lane l ends with ``out[s]`` = the word
    lane s of its quad held for it."""
    t = np.arange(32) & 3
    odd, hi = (t & 1).astype(bool), (t & 2).astype(bool)
    s = np.zeros_like(v)
    for b in range(2):
        keep = np.where(odd, v[:, 2 * b + 1], v[:, 2 * b])
        got = _shfl_xor(np.where(odd, v[:, 2 * b], v[:, 2 * b + 1]), 1)
        s[:, 2 * b] = np.where(odd, got, keep)
        s[:, 2 * b + 1] = np.where(odd, keep, got)
    out = np.zeros_like(v)
    for i in range(2):
        keep = np.where(hi, s[:, 2 + i], s[:, i])
        got = _shfl_xor(np.where(hi, s[:, i], s[:, 2 + i]), 2)
        out[:, i] = np.where(hi, got, keep)
        out[:, 2 + i] = np.where(hi, keep, got)
    return out


def store_lanes():
    """``[32]`` pairs ``(m, c0)``: after the transpose lane l stores pixel ``m`` of the M block (0-15)
    and channels ``c0 .. c0 + 7`` of the chunk (the kernel's ``st_row``, ``st_k``)."""
    return [((lane >> 2) + 8 * ((lane & 3) >> 1), 8 * (lane & 1)) for lane in range(32)]
