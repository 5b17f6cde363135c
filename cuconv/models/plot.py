"""Teaching pictures of the NumPy loader models (docs/notebooks/01): im2col rows, TMA box loads, loader tiles.

Every picture is drawn from what the models of :mod:`cuconv.models` return; nothing here re-derives
an address. matplotlib is imported inside the functions, so importing this module costs nothing and
works without it (``pip install 'cuconv[docs]'`` brings it).
"""

from __future__ import annotations

import math
import os
from typing import Iterable, Optional

import numpy as np

from ..problem import ConvProblem
from .im2col import im2col_matrix, pixel_coordinates
from .loader import loader_addresses
from .tma import tma_im2col_box_load

__all__ = ["plot_im2col_rows", "plot_tma_box", "plot_loader_tile", "tma_box_positions"]

_PAD_COLOR = "#d9d9d9"


def pyplot():
    """``matplotlib.pyplot``, imported on first use (an ImportError naming the extra without it)."""
    try:
        import matplotlib.pyplot as plt
    except ImportError as e:  # pragma: no cover - depends on the install
        raise ImportError("cuconv's plots need matplotlib: pip install 'cuconv[docs]'") from e
    return plt


def finish_figure(fig, png_path):
    """Save ``fig`` to ``png_path`` when given (creating its folder); return the figure."""
    if png_path is not None:
        os.makedirs(os.path.dirname(os.path.abspath(png_path)), exist_ok=True)
        fig.savefig(png_path, dpi=120, bbox_inches="tight")
    return fig


def _grid_axes(ax, rows: int, cols: int, row0: int, col0: int):
    ax.set_xlim(col0 - 0.5, col0 + cols - 0.5)
    ax.set_ylim(row0 + rows - 0.5, row0 - 0.5)
    ax.set_xticks(range(col0, col0 + cols))
    ax.set_yticks(range(row0, row0 + rows))
    ax.tick_params(labelsize=7)
    ax.set_aspect("equal")


def _cell(ax, r, c, color, text="", fontsize=8, edge="white", hatch=None):
    from matplotlib.patches import Rectangle
    ax.add_patch(Rectangle((c - 0.5, r - 0.5), 1, 1, facecolor=color, edgecolor=edge, hatch=hatch, lw=1))
    if text != "":
        ax.text(c, r, str(text), ha="center", va="center", fontsize=fontsize)


def _fmt(v) -> str:
    v = float(v)
    return str(int(v)) if v == int(v) else f"{v:.2g}"


def plot_im2col_rows(x: np.ndarray, problem: ConvProblem, rows: Iterable[int], group: int = 0,
                     channel: int = 0, png_path: Optional[str] = None):
    """Which input pixels feed rows ``rows`` of the im2col matrix (2-D problems).

    Left: ``A = im2col_matrix(x, problem)`` (channel ``channel`` of each tap), the chosen rows
    framed. Then one panel per row: the padded input image of that row's pixel, the cells its taps
    read numbered by tap (grey = padding, read as zero).
    """
    if problem.nd != 2:
        raise ValueError(f"problem: plot_im2col_rows draws 2-D problems, got conv{problem.nd}d")
    plt = pyplot()
    rows = list(rows)
    a = im2col_matrix(x, problem, group)
    Cg = problem.channels_per_group
    ntaps = a.shape[1] // Cg
    a_ch = a[:, channel::Cg].astype(np.float64)  # (M, taps), one channel
    fig, axes = plt.subplots(1, 1 + len(rows), figsize=(2.2 + 2.6 * len(rows) + 0.15 * ntaps, 4.2),
                             gridspec_kw={"width_ratios": [max(1.0, 0.09 * ntaps * 4)] + [1.3] * len(rows)})
    ax = axes[0]
    ax.imshow(a_ch, cmap="Blues", aspect="auto", interpolation="nearest")
    if a_ch.shape[0] * a_ch.shape[1] <= 400:
        for (i, j), v in np.ndenumerate(a_ch):
            ax.text(j, i, _fmt(v), ha="center", va="center", fontsize=6)
    for k, m in enumerate(rows):
        ax.add_patch(plt.Rectangle((-0.5, m - 0.5), ntaps, 1, fill=False, edgecolor=f"C{k + 1}", lw=2))
    ax.set_xlabel("A column = filter tap (channel %d)" % channel)
    ax.set_ylabel("A row m = output pixel")
    ax.set_title(f"im2col A: {problem.gemm_m} x {problem.gemm_k}", fontsize=9)
    (H, W), (plo, qlo), (phi, qhi) = problem.in_spatial, problem.pad_lo, problem.pad_hi
    n_of, out_of = pixel_coordinates(problem, np.asarray(rows))
    taps = [(r, s) for r in range(problem.filter_spatial[0]) for s in range(problem.filter_spatial[1])]
    for k, m in enumerate(rows):
        ax = axes[1 + k]
        n, p, q = int(n_of[k]), int(out_of[0][k]), int(out_of[1][k])
        _grid_axes(ax, H + plo + phi, W + qlo + qhi, -plo, -qlo)
        for h in range(-plo, H + phi):
            for w in range(-qlo, W + qhi):
                inside = 0 <= h < H and 0 <= w < W
                _cell(ax, h, w, "white" if inside else _PAD_COLOR,
                      _fmt(x[n, h, w, group * Cg + channel]) if inside else "", fontsize=7, edge="#999999")
        for t, (r, s) in enumerate(taps):
            h = p * problem.stride[0] + r * problem.dilation[0] - plo
            w = q * problem.stride[1] + s * problem.dilation[1] - qlo
            ax.add_patch(plt.Rectangle((w - 0.45, h - 0.45), 0.9, 0.9, fill=False, edgecolor=f"C{k + 1}", lw=2))
            ax.text(w + 0.4, h - 0.4, str(t), ha="right", va="top", fontsize=6, color=f"C{k + 1}")
        ax.set_title(f"row m={m}: n={n}, out=({p},{q})", fontsize=9)
    fig.tight_layout()
    return finish_figure(fig, png_path)


def tma_box_positions(x_shape, *, lower_corner, upper_corner, coord, offsets, pixels, element_strides=None):
    """The ``(n, *spatial)`` position each pixel of one im2col box load reads, padding included.

    Obtained from :func:`cuconv.models.tma_im2col_box_load` itself: the load runs on a larger
    tensor (a margin around every image, one extra image) whose values encode their own position,
    with the window moved by the margin, so even pixels that read zero in the real tensor report
    where they are. Returns an int array ``(pixels, 1 + nd)``.
    """
    N, *size, _ = x_shape
    nd = len(size)
    margin = max([abs(int(v)) for v in list(lower_corner) + list(upper_corner) + list(offsets)] + [0]) + 2
    big = [L + 2 * margin for L in size]
    n_big = N + 1 + -(-pixels // max(1, math.prod(size)))
    codes = np.arange(1, n_big * math.prod(big) + 1, dtype=np.float64).reshape(n_big, *big, 1)
    n0, *base, _c = (int(v) for v in coord)
    got = tma_im2col_box_load(codes, lower_corner=[lo + margin for lo in lower_corner],
                              upper_corner=[u - margin for u in upper_corner],
                              coord=(n0, *[b + margin for b in base], 0), offsets=offsets, pixels=pixels,
                              channels=1, element_strides=element_strides)[:, 0].astype(np.int64) - 1
    pos = np.stack(np.unravel_index(got, (n_big, *big)), axis=1)
    pos[:, 1:] -= margin
    return pos


def plot_tma_box(x: np.ndarray, *, lower_corner, upper_corner, coord, offsets, pixels, element_strides=None,
                 channel: int = 0, title: str = "", png_path: Optional[str] = None):
    """What one TMA im2col box load reads (2-D ``x``, channels-last) and what it returns.

    Top: each image touched, with a margin; the access window (the set of base coordinates,
    shifted by ``offsets``) shaded, the cells the load reads numbered in order (grey = outside the
    tensor, read as zero). Bottom: the ``pixels`` values returned for channel ``channel``.
    """
    plt = pyplot()
    if x.ndim != 4:
        raise ValueError(f"x: plot_tma_box draws 2-D images (N, H, W, C), got shape {x.shape}")
    N, H, W, _ = x.shape
    box = tma_im2col_box_load(x, lower_corner=lower_corner, upper_corner=upper_corner, coord=coord,
                              offsets=offsets, pixels=pixels, channels=channel + 1,
                              element_strides=element_strides)[:, channel]
    pos = tma_box_positions(x.shape, lower_corner=lower_corner, upper_corner=upper_corner, coord=coord,
                            offsets=offsets, pixels=pixels, element_strides=element_strides)
    images = sorted(set(int(n) for n in pos[:, 0]))
    win_h = (lower_corner[0] + offsets[0], H - 1 + upper_corner[0] + offsets[0])
    win_w = (lower_corner[1] + offsets[1], W - 1 + upper_corner[1] + offsets[1])
    r0 = min(0, win_h[0], int(pos[:, 1].min())) - 0
    r1 = max(H - 1, win_h[1], int(pos[:, 1].max()))
    c0 = min(0, win_w[0], int(pos[:, 2].min()))
    c1 = max(W - 1, win_w[1], int(pos[:, 2].max()))
    fig = plt.figure(figsize=(2.6 * len(images) + 1.5, 4.6))
    gs = fig.add_gridspec(2, len(images), height_ratios=[4, 1])
    for k, n in enumerate(images):
        ax = fig.add_subplot(gs[0, k])
        _grid_axes(ax, r1 - r0 + 1, c1 - c0 + 1, r0, c0)
        for h in range(r0, r1 + 1):
            for w in range(c0, c1 + 1):
                inside = 0 <= h < H and 0 <= w < W and n < N
                in_window = win_h[0] <= h <= win_h[1] and win_w[0] <= w <= win_w[1]
                color = ("#fff3c4" if in_window else "white") if inside else (
                    "#e8dca8" if in_window else _PAD_COLOR)
                _cell(ax, h, w, color, _fmt(x[n, h, w, channel]) if inside else "", fontsize=6, edge="#999999")
        for i, (pn, h, w) in enumerate(pos):
            if int(pn) == n:
                ax.add_patch(plt.Rectangle((w - 0.42, h - 0.42), 0.84, 0.84, fill=False, edgecolor="tab:red", lw=1.5))
                ax.text(w + 0.42, h + 0.42, str(i), ha="right", va="bottom", fontsize=6, color="tab:red")
        ax.set_title(f"image n={n}" + ("" if n < N else " (past the last image)"), fontsize=9)
    ax = fig.add_subplot(gs[1, :])
    ax.imshow(box[None, :].astype(np.float64), cmap="Reds", aspect="auto", vmin=0)
    for i, v in enumerate(box):
        ax.text(i, 0, _fmt(v), ha="center", va="center", fontsize=7)
    ax.set_yticks([])
    ax.set_xticks(range(pixels))
    ax.tick_params(labelsize=7)
    ax.set_xlabel(f"returned block, channel {channel} (pixel 0..{pixels - 1})", fontsize=8)
    fig.suptitle(title or f"box load: coord={tuple(coord)} offsets={tuple(offsets)} lower={tuple(lower_corner)} "
                 f"upper={tuple(upper_corner)}", fontsize=9)
    fig.tight_layout()
    return finish_figure(fig, png_path)


def plot_loader_tile(problem: ConvProblem, m_offset: int, k_offset: int, tile_m: int, tile_k: int, subpath: str,
                     group: int = 0, ax=None, title: str = ""):
    """The A tile one software-loader sub-path stages, from :func:`cuconv.models.loader_addresses`.

    Each element is coloured by the filter tap its column reads and labelled with the input pixel
    ``h,w`` (``n:h,w`` when the tile spans images) and the channel ``c`` below it; hatched cells are
    zero-filled (halo, rows past M, columns past Kgemm) and issue no load. Returns the axes.
    """
    plt = pyplot()
    if problem.nd != 2:
        raise ValueError(f"problem: plot_loader_tile draws 2-D problems, got conv{problem.nd}d")
    addr = loader_addresses(problem, m_offset, k_offset, tile_m, tile_k, subpath, group)
    if ax is None:
        _, ax = plt.subplots(figsize=(0.55 * tile_k + 1, 0.45 * tile_m + 1))
    C, Cg = problem.channels, problem.channels_per_group
    H, W = problem.in_spatial
    k = k_offset + np.arange(tile_k)
    tap = np.minimum(k // Cg, math.prod(problem.filter_spatial) - 1)
    _grid_axes(ax, tile_m, tile_k, 0, 0)
    cmap = plt.get_cmap("tab10")
    pix = np.where(addr >= 0, addr // C, 0)
    n_img, h_img, w_img = pix // (H * W), (pix // W) % H, pix % W
    images = sorted(set(int(v) for v in n_img[addr >= 0]))
    show_n = len(images) > 1  # label "n:h,w" when the tile spans images
    for (i, j), a in np.ndenumerate(addr):
        if a < 0:
            _cell(ax, i, j, "white", "0", fontsize=6, edge="#bbbbbb", hatch="///")
            continue
        _cell(ax, i, j, cmap(int(tap[j]) % 10), "", edge="white")
        where = f"{h_img[i, j]},{w_img[i, j]}"
        ax.text(j, i - 0.12, f"{n_img[i, j]}:{where}" if show_n else where, ha="center", va="center", fontsize=5)
        ax.text(j, i + 0.25, f"c{a % C - group * Cg}", ha="center", va="center", fontsize=4.5)
    ax.set_xticks(range(tile_k))
    ax.set_xticklabels([str(int(v)) for v in k], fontsize=6)
    ax.set_yticklabels([str(m_offset + i) for i in range(tile_m)], fontsize=6)
    ax.set_xlabel("GEMM column k (colour = filter tap)", fontsize=8)
    ax.set_ylabel("GEMM row m", fontsize=8)
    imgs = ",".join(map(str, sorted(images)))
    ax.set_title(title or f"{subpath}: m_offset={m_offset} k_offset={k_offset} (images {imgs})", fontsize=9)
    return ax
