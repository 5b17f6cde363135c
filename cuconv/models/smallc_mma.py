"""NumPy model of the tensor-core few-channel kernel's addressing (kernels_cu/smallc/smallc_mma.cu).

The kernel never writes an im2col: the A element of output pixel m and reduction term kk is read from
the input tile in shared memory at ``base(m) + off(kk)``. This module computes those two tables as
the kernel does, for the tile shape the host picks (:func:`cuconv.backends.smallc.mma_variants.mma_config`):

* :func:`layout` -- the tile's row stride (``ROWST``: an even number of elements, one spare column when
  ``IN_COLS * C`` is odd; with span copies the words of ``SPAN`` elements covering the row's run, which
  starts ``SHIFT`` elements in), the run of terms per filter row (``KRUN``: ``LEAD + S * C`` rounded
  up to even, ``LEAD`` one spare term before the run where pairs read from odd starts) and the padded
  reduction (``KP``);
* :func:`term_offsets` -- the element each term reads, relative to a pixel's base: under ``PAIRS``
  an odd term is read with the term before it as one 32-bit word, so it reads that term's element
  + 1 (the spare term of an odd run reads the element after the window, a leading spare term the
  element before it);
* :func:`pixel_bases` -- the window origin of each of the tile's 128 pixels;
* :func:`filter_matrix` -- B as the kernel keeps it: ``[K][KP]``, zero for the spare and padding terms;
* :func:`weighted_terms` -- which terms carry a weight: the kernel masks the A values of the others
  to zero too, so that an Inf or NaN the tile holds there reaches no output.

:func:`tile_conv` composes them over every tile and filter depth slice into the whole convolution
(fp32 sums, no epilogue), which the CPU tests compare with :func:`cuconv.reference.conv_reference`;
they also check that every pair read is 32-bit aligned and that every read stays in the tile buffer.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..problem import ConvProblem

__all__ = ["MmaLayout", "layout", "term_offsets", "pixel_bases", "filter_matrix", "weighted_terms", "input_tile",
           "tile_conv"]


@dataclass(frozen=True)
class MmaLayout:
    """The compile-time shape of one variant (the constants of smallc_mma.cu)."""

    C: int
    R: int
    S: int
    SW: int
    DW: int
    TP: int
    TQ: int
    in_cols: int    # IN_COLS: columns the tile's pixels reach
    cols_st: int    # COLS_ST: stored columns
    rowst: int      # ROWST: row stride in elements
    krun: int       # KRUN: terms of one filter row
    kp: int         # KP: terms of one depth slice, padded to whole k16 steps
    pairs: bool     # PAIRS: A read as 32-bit pairs of terms
    span: int = 0   # SPAN: elements per copy of a row's run (0: copies of whole pixels)
    shift: int = 0  # SHIFT: where the run starts in the stored row
    lead: int = 0   # LEAD: spare terms before each run of terms
    planar: bool = False  # PLANAR: the tile stored [row][c][col] (span copies of channels-first x)
    rowc: int = 0   # ROWC: PLANAR, the stride of a tile row's channel runs
    runc: int = 0   # RUNC: PLANAR, terms of one channel's run
    cst: int = 0    # CST: elements per stored pixel of a tile copied pixel by pixel (C, or C padded); 0: C

    @property
    def pixel(self) -> int:
        """Elements per stored pixel of a channels-last tile (CST of the kernel)."""
        return self.cst or self.C


def _axes(p: ConvProblem):
    lead = 3 - p.nd
    D, H, W = (1,) * lead + tuple(p.in_spatial)
    O, P, Q = (1,) * lead + tuple(p.out_spatial)
    T, R, S = (1,) * lead + tuple(p.filter_spatial)
    sd, sh, sw = (1,) * lead + tuple(p.stride)
    dd, dh, dw = (1,) * lead + tuple(p.dilation)
    pd, ph, pw = (0,) * lead + tuple(p.pad_lo)
    return D, H, W, O, P, Q, T, R, S, sd, sh, sw, dd, dh, dw, pd, ph, pw


def layout(p: ConvProblem, cfg) -> MmaLayout:
    """The kernel's constants for ``p`` launched with ``cfg`` (an :class:`~cuconv.backends.smallc.mma_variants.MmaConfig`)."""
    _, _, _, _, _, _, _, R, S, _, _, sw, _, _, dw, _, _, _ = _axes(p)
    C, cst = p.channels, cfg.cst
    in_cols = (cfg.tq - 1) * sw + (S - 1) * dw + 1
    cols_st = in_cols + (in_cols * cst) % 2
    span, shift, planar = cfg.span, cfg.shift, cfg.planar
    pairs = (sw % 2 == 0 and dw == 1) if planar else (sw * C) % 2 == 0 and (dw == 1 or C % 2 == 0)
    lead = shift & 1 if pairs else 0
    if planar:
        runc = -(-(S + lead) // 2) * 2 if pairs else S
        krun = -(-(C * runc) // 2) * 2
        rowc = -(-(in_cols + shift) // span) * span
        rowst = C * rowc
    else:
        runc = rowc = 0
        krun = -(-(S * C + lead) // 2) * 2
        rowst = -(-(in_cols * C + shift) // span) * span if span else cols_st * cst
    kp = -(-(R * krun) // 16) * 16
    return MmaLayout(C=C, R=R, S=S, SW=sw, DW=dw, TP=cfg.tp, TQ=cfg.tq, in_cols=in_cols, cols_st=cols_st,
                     rowst=rowst, krun=krun, kp=kp, pairs=pairs, span=span, shift=shift, lead=lead, planar=planar,
                     rowc=rowc, runc=runc, cst=cst)


def _position(lay: MmaLayout, kk: int):
    """``term_position`` of the kernel: term kk as (r, c, s) and whether it carries a weight."""
    r, jj = divmod(kk, lay.krun)
    if lay.planar:
        c, s = divmod(jj, lay.runc)
        s -= lay.lead
        return r, c, s, r < lay.R and c < lay.C and 0 <= s < lay.S
    j = jj - lay.lead
    s = j // lay.C if j >= 0 else -1
    c = j - s * lay.C
    return r, c, s, r < lay.R and 0 <= j < lay.S * lay.C


def _term(lay: MmaLayout, kk: int, dil_h: int) -> int:
    """``term_offset`` of the kernel: term kk's element relative to a pixel's base (0 for the padding
    terms and the spare term after a run, the element before the run for a leading spare term)."""
    r, c, s, _ = _position(lay, kk)
    if r >= lay.R or c >= lay.C or s >= lay.S:
        return 0
    row = r * dil_h * lay.rowst + lay.shift
    if lay.planar:
        return row + c * lay.rowc + s * lay.DW
    return row - 1 if s < 0 else row + s * lay.DW * lay.pixel + c


def term_offsets(lay: MmaLayout, dil_h: int) -> np.ndarray:
    """The element each of the ``KP`` terms reads, relative to a pixel's base: under PAIRS an odd term
    reads the element after its even partner's (one 32-bit word), else its own offset."""
    offs = np.array([_term(lay, kk, dil_h) for kk in range(lay.kp)], dtype=np.int64)
    if lay.pairs:
        offs[1::2] = offs[0::2] + 1
    return offs


def weighted_terms(lay: MmaLayout) -> np.ndarray:
    """``[KP]`` bools: term kk is a filter term (not the spare term of an odd run, not padding)."""
    return np.array([_position(lay, kk)[3] for kk in range(lay.kp)], dtype=bool)


def pixel_bases(lay: MmaLayout, stride_h: int) -> np.ndarray:
    """The window origin (element index in the tile) of each tile pixel m = row * TQ + col."""
    m = np.arange(lay.TP * lay.TQ)
    return (m // lay.TQ) * stride_h * lay.rowst + (m % lay.TQ) * lay.SW * (1 if lay.planar else lay.pixel)


def filter_matrix(w_slice: np.ndarray, lay: MmaLayout) -> np.ndarray:
    """B of one filter depth slice, ``[K][KP]`` float32: ``w_slice`` is ``(K, R, S, C)``; term kk at
    (r, c, s) (:func:`_position`: ``r * KRUN + LEAD + s * C + c``, PLANAR ``r * KRUN + c * RUNC + LEAD +
    s``) holds ``w[k, r, s, c]``, the spare and padding terms zero."""
    K = w_slice.shape[0]
    b = np.zeros((K, lay.kp), dtype=np.float32)
    for kk in range(lay.kp):
        r, c, s, weighted = _position(lay, kk)
        if weighted:
            b[:, kk] = w_slice[:, r, s, c]
    return b


def input_tile(x5: np.ndarray, p: ConvProblem, lay: MmaLayout, in_rows: int, n: int, d: int, tile_p: int,
               tile_q: int) -> np.ndarray:
    """The tile buffer the kernel multiplies from, flat: ``in_rows`` rows of ``COLS_ST`` pixels x CST
    elements (C channels, then zero channels up to CST; zeros outside the image), then the zeroed tail
    word (two elements). With span copies a row is instead the ``ROWST`` elements of the image row's run
    of W x C elements from ``w0 x C - SHIFT`` on (zeros outside the image), whose words the kernel
    copies; PLANAR, C runs of ``ROWC`` elements, channel c's from ``w0 - SHIFT`` on in its plane."""
    _, H, W, _, _, _, _, _, _, _, sh, sw, _, _, _, _, ph, pw = _axes(p)
    h0, w0 = tile_p * lay.TP * sh - ph, tile_q * lay.TQ * sw - pw
    rows = np.arange(in_rows) + h0
    rv = (rows >= 0) & (rows < H)
    if lay.planar:
        e0 = w0 - lay.shift
        assert e0 % lay.span == 0 and W % lay.span == 0, "every copied word lies in or out of the row"
        tile = np.zeros((in_rows, lay.C, lay.rowc), dtype=np.float32)
        elems = np.arange(lay.rowc) + e0
        ev = (elems >= 0) & (elems < W)
        planes, chans = np.moveaxis(x5[n, d], -1, 0), np.arange(lay.C)  # planes: (C, H, W)
        tile[np.ix_(rv, chans, ev)] = np.moveaxis(planes[np.ix_(chans, rows[rv], elems[ev])], 0, 1)
    elif lay.span:
        e0 = w0 * lay.C - lay.shift
        assert e0 % lay.span == 0 and (W * lay.C) % lay.span == 0, "every copied word lies in or out of the row"
        tile = np.zeros((in_rows, lay.rowst), dtype=np.float32)
        elems = np.arange(lay.rowst) + e0
        ev = (elems >= 0) & (elems < W * lay.C)
        tile[np.ix_(rv, ev)] = x5[n, d].reshape(H, W * lay.C)[np.ix_(rows[rv], elems[ev])]
    else:
        tile = np.zeros((in_rows, lay.cols_st, lay.pixel), dtype=np.float32)
        cols = np.arange(lay.cols_st) + w0
        cv = (cols >= 0) & (cols < W)
        tile[np.ix_(rv, cv, np.arange(lay.C))] = x5[n, d][np.ix_(rows[rv], cols[cv])]
    return np.concatenate([tile.reshape(-1), np.zeros(2, dtype=np.float32)])


def tile_conv(x: np.ndarray, w: np.ndarray, p: ConvProblem, cfg) -> np.ndarray:
    """The convolution (no epilogue) as the kernel computes it: per tile and filter depth slice,
    ``A = tile[bases[:, None] + offsets[None, :]]`` times ``filter_matrix``; ``x`` NHWC / NDHWC, ``w``
    ``(K, [T,] R, S, C)``; float32 result of the output's shape."""
    D, H, W, O, P, Q, T, R, S, sd, sh, sw, dd, dh, dw, pd, ph, pw = _axes(p)
    lay = layout(p, cfg)
    K = p.out_channels
    x5 = (x if p.nd == 3 else x[:, None]).astype(np.float32)
    w5 = w.reshape(K, T, R, S, p.channels)
    offs, bases, weighted = term_offsets(lay, dh), pixel_bases(lay, sh), weighted_terms(lay)
    filters = [filter_matrix(w5[:, t], lay) for t in range(T)]
    out = np.zeros((p.batch, O, P, Q, K), dtype=np.float32)
    for n in range(p.batch):
        for o in range(O):
            for tile_p in range(cfg.tiles_p):
                for tile_q in range(cfg.tiles_q):
                    acc = np.zeros((lay.TP * lay.TQ, K), dtype=np.float32)
                    for t in range(T):
                        d = o * sd - pd + t * dd
                        if not 0 <= d < D:
                            continue
                        buf = input_tile(x5, p, lay, cfg.in_rows, n, d, tile_p, tile_q)
                        a = np.where(weighted[None, :], buf[bases[:, None] + offs[None, :]], np.float32(0))
                        with np.errstate(invalid="ignore"):
                            acc += a @ filters[t].T
                    m = np.arange(lay.TP * lay.TQ)
                    pp, qq = tile_p * lay.TP + m // lay.TQ, tile_q * lay.TQ + m % lay.TQ
                    keep = (pp < P) & (qq < Q)
                    out[n, o, pp[keep], qq[keep]] = acc[keep]
    return out if p.nd == 3 else out[:, 0]
