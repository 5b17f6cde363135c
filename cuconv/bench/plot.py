"""Pictures: cuconv's NumPy loader models (docs/notebooks/01) and benchmark results (03, ``bench --plot``).

matplotlib is imported inside the functions, so ``import cuconv.plot`` costs nothing and works
without it (``pip install 'cuconv[docs]'`` or ``[bench]`` brings it). Every picture is drawn from
what the models in :mod:`cuconv.models` return; nothing here re-derives an address.

Benchmark records
-----------------
``python -m cuconv.bench --json FILE`` writes ``{"device": str, "ceilings": {"tflops", "tbps"},
"records": [...]}``, each record holding ``name``, ``dtype``, ``flops``, ``bytes`` (minimum traffic)
and ``ms`` = ``{"cuconv": median ms, "cudnn": ..., "generic": ...}`` (plus check and kernel details).
:func:`plot_bench` takes such a path, the parsed JSON, or a list of records; :func:`load_bench_records`
normalises all of them, and a few other spellings, to::

    {"name": str, "dtype": str, "flops": float, "bytes": float, "ms": {impl: median milliseconds}}

``impl`` is ``"cuconv"``, ``"cudnn"``, ``"generic"`` (or whatever the file names). Accepted record
spellings: ``"ms"`` / ``"median_ms"`` as ``{impl: ms}``; ``"<impl>_ms"`` / ``"<impl>_median_ms"``
keys; ``"results"`` / ``"impls"`` / ``"timings"`` as ``{impl: ms or {"median_ms": ms}}`` or a list of
``{"impl": ..., "median_ms": ...}``. The top level is a list of records or a dict holding one under
``"records"`` / ``"results"`` / ``"shapes"`` / ``"rows"`` (plus optional ``"device"``). ``"flops"`` may
be missing when ``"tflops"`` per impl is given instead; nothing is ever invented: a value that is
not in the file is not drawn.
"""

from __future__ import annotations

import json
import math
import os
from typing import Dict, Iterable, List, Optional, Sequence

import numpy as np

from .models import im2col_matrix, loader_addresses, tma_im2col_box_load
from .problem import ConvProblem

__all__ = ["H100_BF16_TFLOPS", "H100_COPY_TBPS", "load_bench_records", "plot_bench", "plot_roofline",
           "plot_im2col_rows", "plot_tma_box", "plot_loader_tile", "tma_box_positions"]

#: Measured ceilings of the H100 (SXM) cuconv is tuned on: dense bf16 matmul and device-to-device copy.
H100_BF16_TFLOPS = 760.0
H100_COPY_TBPS = 2.95

#: Drawing order and colours of the implementations a benchmark compares.
_IMPL_COLORS = {"cuconv": "tab:red", "cudnn": "tab:blue", "generic": "tab:gray"}
_PAD_COLOR = "#d9d9d9"


def _pyplot():
    try:
        import matplotlib.pyplot as plt
    except ImportError as e:  # pragma: no cover - depends on the install
        raise ImportError("cuconv.plot needs matplotlib: pip install 'cuconv[docs]'") from e
    return plt


def _finish(fig, png_path):
    if png_path is not None:
        os.makedirs(os.path.dirname(os.path.abspath(png_path)), exist_ok=True)
        fig.savefig(png_path, dpi=120, bbox_inches="tight")
    return fig


# ============================================================================ benchmark records
_LIST_KEYS = ("records", "results", "shapes", "rows")
_PER_IMPL_KEYS = ("ms", "median_ms", "results", "impls", "timings")
_MS_KEYS = ("median_ms", "ms", "time_ms")


def _impl_ms(value) -> Optional[float]:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, dict):
        for k in _MS_KEYS:
            if isinstance(value.get(k), (int, float)):
                return float(value[k])
    return None


def _record(raw: dict) -> dict:
    ms: Dict[str, float] = {}
    tflops: Dict[str, float] = {}
    for key in _PER_IMPL_KEYS:
        block = raw.get(key)
        if isinstance(block, dict):
            for impl, v in block.items():
                t = _impl_ms(v)
                if t is not None:
                    ms[impl] = t
                elif isinstance(v, dict) and isinstance(v.get("tflops"), (int, float)):
                    tflops[impl] = float(v["tflops"])
        elif isinstance(block, list):
            for item in block:
                if isinstance(item, dict):
                    impl = item.get("impl") or item.get("name") or item.get("kernel")
                    t = _impl_ms(item)
                    if impl is not None and t is not None:
                        ms[str(impl)] = t
    for key, v in raw.items():
        for suffix in ("_median_ms", "_ms"):
            if key.endswith(suffix) and key[: -len(suffix)] and isinstance(v, (int, float)) \
                    and key not in _MS_KEYS:
                ms.setdefault(key[: -len(suffix)], float(v))
                break
        if key.endswith("_tflops") and isinstance(v, (int, float)):
            tflops.setdefault(key[: -len("_tflops")], float(v))
    name = raw.get("name") or raw.get("shape") or raw.get("label") or "?"
    flops = raw.get("flops")
    nbytes = raw.get("bytes", raw.get("min_bytes"))
    rec = {"name": str(name), "dtype": str(raw.get("dtype", "")),
           "flops": float(flops) if isinstance(flops, (int, float)) else None,
           "bytes": float(nbytes) if isinstance(nbytes, (int, float)) else None,
           "ms": ms, "tflops": tflops}
    return rec


def load_bench_records(source) -> List[dict]:
    """Normalise a benchmark JSON (path, parsed object, or list of records) to a list of records.

    See the module docstring for the accepted spellings. Raises ValueError for a file that holds
    no records at all, naming what it found instead.
    """
    if isinstance(source, (str, os.PathLike)):
        with open(source) as f:
            source = json.load(f)
    if isinstance(source, dict):
        for key in _LIST_KEYS:
            if isinstance(source.get(key), list):
                source = source[key]
                break
        else:
            raise ValueError(f"records: expected a list of records or a dict with one of {_LIST_KEYS}, "
                             f"got a dict with keys {sorted(source)}")
    if not isinstance(source, list):
        raise TypeError(f"records: expected a list of records, got {type(source).__name__}")
    return [_record(r) for r in source if isinstance(r, dict)]


def _impls(records: Sequence[dict]) -> List[str]:
    seen: List[str] = []
    for r in records:
        for impl in list(r["ms"]) + list(r["tflops"]):
            if impl not in seen:
                seen.append(impl)
    known = [i for i in _IMPL_COLORS if i in seen]
    return known + [i for i in seen if i not in known]


def _tflops(rec: dict, impl: str) -> Optional[float]:
    """Achieved TFLOP/s of ``impl`` on ``rec``: from flops / median ms, else from the file's own figure."""
    t = rec["ms"].get(impl)
    if rec["flops"] and t:
        return rec["flops"] / (t * 1e-3) / 1e12
    return rec["tflops"].get(impl)


def plot_roofline(ax=None, peak_tflops: float = H100_BF16_TFLOPS, copy_tbps: float = H100_COPY_TBPS,
                  intensity_range=(1.0, 1e4), label: str = "H100"):
    """Draw the roofline ``min(peak, intensity * bandwidth)`` on log axes; return the axes.

    Intensity is FLOP per byte of the minimum traffic (x, w, out, residual once each).
    """
    plt = _pyplot()
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 4))
    ai = np.logspace(math.log10(intensity_range[0]), math.log10(intensity_range[1]), 200)
    roof = np.minimum(peak_tflops, ai * copy_tbps)  # TB/s * FLOP/B = TFLOP/s
    ax.plot(ai, roof, color="black", lw=1.5)
    ridge = peak_tflops / copy_tbps
    ax.axhline(peak_tflops, color="black", ls=":", lw=0.8)
    ax.text(intensity_range[1], peak_tflops * 1.05, f"{peak_tflops:g} TFLOP/s dense bf16",
            ha="right", va="bottom", fontsize=8)
    ax.text(intensity_range[0] * 1.3, intensity_range[0] * 1.3 * copy_tbps * 2.2,
            f"{copy_tbps:g} TB/s copy", rotation=0, fontsize=8, va="bottom")
    ax.axvline(ridge, color="black", ls=":", lw=0.8)
    ax.text(ridge * 1.05, peak_tflops * 0.02, f"ridge {ridge:.0f} FLOP/B", fontsize=8, rotation=90)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(*intensity_range)
    ax.set_ylim(max(0.05, intensity_range[0] * copy_tbps * 0.5), peak_tflops * 2)
    ax.set_xlabel("arithmetic intensity (FLOP / byte of minimum traffic)")
    ax.set_ylabel("TFLOP/s")
    ax.set_title(f"roofline ({label})")
    ax.grid(True, which="both", alpha=0.2)
    return ax


def plot_bench(records_or_json_path=None, png_path: Optional[str] = None, *, impls: Optional[Sequence[str]] = None,
               peak_tflops: Optional[float] = None, copy_tbps: Optional[float] = None, title: str = None):
    """Roofline + per-shape bar chart of a benchmark; saved to ``png_path`` when given.

    ``records_or_json_path``: a JSON path, the parsed JSON or a list of records (see
    :func:`load_bench_records`). ``None`` or an empty list draws the roofline with its ceilings
    only and says so in the title: no number is made up. ``impls``: which implementations to draw
    (default: those of cuconv / cudnn / generic present, else every one in the records; extra
    timings such as ``cuconv_beta1`` are only drawn when named). The ceilings default to the file's
    ``"ceilings"`` (``{"tflops": ..., "tbps": ...}``), else the H100's. Returns the matplotlib Figure.
    """
    plt = _pyplot()
    device = None
    raw = records_or_json_path
    if isinstance(raw, (str, os.PathLike)):
        with open(raw) as f:
            raw = json.load(f)
    ceilings = raw.get("ceilings") if isinstance(raw, dict) else None
    ceilings = ceilings if isinstance(ceilings, dict) else {}
    peak_tflops = peak_tflops or float(ceilings.get("tflops", H100_BF16_TFLOPS))
    copy_tbps = copy_tbps or float(ceilings.get("tbps", H100_COPY_TBPS))
    if isinstance(raw, dict):
        device = raw.get("device")
    records = [] if raw is None else load_bench_records(raw)
    if isinstance(device, dict):
        device = device.get("name") or str(device)
    present = _impls(records)
    if impls is None:
        impls = [i for i in _IMPL_COLORS if i in present] or present
    else:
        impls = [i for i in impls if i in present]
    if not records or not impls:
        fig, ax = plt.subplots(figsize=(6.5, 4.2))
        plot_roofline(ax, peak_tflops, copy_tbps)
        ax.set_title(title or "roofline and ceilings only: no benchmark records given")
        return _finish(fig, png_path)

    bar_width_in = max(7.0, 0.3 * len(records) * len(impls))
    fig, (ax_roof, ax_bar) = plt.subplots(1, 2, figsize=(6 + bar_width_in, 5),
                                          gridspec_kw={"width_ratios": [6, bar_width_in]})
    intensities = [r["flops"] / r["bytes"] for r in records if r["flops"] and r["bytes"]]
    lo = min(intensities + [10.0]) / 2
    hi = max(intensities + [1000.0]) * 2
    plot_roofline(ax_roof, peak_tflops, copy_tbps, intensity_range=(lo, hi))
    for impl in impls:
        pts = [(r["flops"] / r["bytes"], _tflops(r, impl)) for r in records
               if r["flops"] and r["bytes"] and _tflops(r, impl)]
        if pts:
            xs, ys = zip(*pts)
            ax_roof.scatter(xs, ys, s=22, label=impl, color=_IMPL_COLORS.get(impl), zorder=3)
    ax_roof.legend(fontsize=8, loc="lower right")

    x = np.arange(len(records))
    width = 0.8 / len(impls)
    for j, impl in enumerate(impls):
        vals = [_tflops(r, impl) for r in records]
        heights = [v if v is not None else 0.0 for v in vals]
        bars = ax_bar.bar(x + (j - (len(impls) - 1) / 2) * width, heights, width, label=impl,
                          color=_IMPL_COLORS.get(impl))
        for b, v in zip(bars, vals):
            if v is None:  # not measured: say so instead of drawing a zero-height bar silently
                ax_bar.text(b.get_x() + b.get_width() / 2, 0, "n/a", ha="center", va="bottom", fontsize=6,
                            rotation=90)
    # each shape's own ceiling: min(peak, intensity * bandwidth)
    for i, r in enumerate(records):
        if r["flops"] and r["bytes"]:
            cap = min(peak_tflops, r["flops"] / r["bytes"] * copy_tbps)
            ax_bar.hlines(cap, i - 0.45, i + 0.45, colors="black", linestyles="--", lw=1)
    ax_bar.plot([], [], "k--", lw=1, label="roofline ceiling of the shape")
    ax_bar.set_xticks(x)
    ax_bar.set_xticklabels([f"{r['name']}\n{r['dtype']}" if r["dtype"] else r["name"] for r in records],
                           rotation=45, ha="right", fontsize=7)
    ax_bar.set_ylabel("TFLOP/s (from median time)")
    ax_bar.legend(fontsize=8)
    ax_bar.grid(True, axis="y", alpha=0.2)
    fig.suptitle(title or f"cuconv benchmark{' on ' + str(device) if device else ''}")
    fig.tight_layout()
    return _finish(fig, png_path)


# ============================================================================ model pictures
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
    plt = _pyplot()
    from .models.im2col import pixel_coordinates
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
    return _finish(fig, png_path)


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
    plt = _pyplot()
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
    return _finish(fig, png_path)


def plot_loader_tile(problem: ConvProblem, m_offset: int, k_offset: int, tile_m: int, tile_k: int, subpath: str,
                     group: int = 0, ax=None, title: str = ""):
    """The A tile one software-loader sub-path stages, from :func:`cuconv.models.loader_addresses`.

    Each element is coloured by the filter tap its column reads and labelled with the input pixel
    ``h,w`` (``n:h,w`` when the tile spans images) and the channel ``c`` below it; hatched cells are
    zero-filled (halo, rows past M, columns past Kgemm) and issue no load. Returns the axes.
    """
    plt = _pyplot()
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
