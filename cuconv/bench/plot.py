"""Benchmark charts: the roofline and each shape's achieved TFLOP/s (``python -m cuconv.bench --plot``).

matplotlib is imported inside the functions, so importing this module costs nothing and works
without it (``pip install 'cuconv[bench]'`` brings it). Drawing needs no GPU: ``--plot-from JSON``
draws an earlier run's file.

Records
-------
``python -m cuconv.bench --json FILE`` writes ``{"device": str, "ceilings": {...}, "records": [...]}``
(:mod:`.ceilings` for the ceilings block), each record holding ``name``, ``dtype``, ``flops``,
``bytes`` (minimum traffic) and ``ms`` = ``{"cuconv": median ms, "cudnn": ..., "generic": ...}``
(plus check and kernel details). :func:`plot_bench` takes such a path, the parsed JSON, or a list of
records; :func:`load_bench_records` normalises all of them, and a few other spellings, to::

    {"name": str, "dtype": str, "flops": float, "bytes": float, "ms": {impl: median milliseconds}}

``impl`` is ``"cuconv"``, ``"cudnn"``, ``"generic"`` (or whatever the file names). Accepted record
spellings: ``"ms"`` / ``"median_ms"`` as ``{impl: ms}``; ``"<impl>_ms"`` / ``"<impl>_median_ms"``
keys; ``"results"`` / ``"impls"`` / ``"timings"`` as ``{impl: ms or {"median_ms": ms}}`` or a list of
``{"impl": ..., "median_ms": ...}``. The top level is a list of records or a dict holding one under
``"records"`` / ``"results"`` / ``"shapes"`` / ``"rows"`` (plus optional ``"device"``). ``"flops"`` may
be missing when ``"tflops"`` per impl is given instead; nothing is ever invented: a value that is
not in the file is not drawn.

Ceilings
--------
The roof is drawn from :class:`~.ceilings.Ceilings`, each line labelled with its source: the
datasheet's dense peak (the compute roof), the run's measured cuBLAS GEMM (dotted, for comparison)
and the run's measured copy bandwidth (the memory roof). Where a file names no ceilings the H100
SXM datasheet's are drawn, and the labels say so.
"""

from __future__ import annotations

import json
import math
import os
from typing import Dict, List, Optional, Sequence

import numpy as np

from ..models.plot import finish_figure, pyplot
from .ceilings import GEMM_N, Ceilings

__all__ = ["DEFAULT_CEILINGS", "load_bench_records", "plot_bench", "plot_roofline"]

#: The ceilings drawn where a file names none: the H100 SXM datasheet (dense bf16/fp16 peak, HBM3).
DEFAULT_CEILINGS = Ceilings.for_device("H100 SXM")

#: Drawing order and colours of the implementations a benchmark compares.
_IMPL_COLORS = {"cuconv": "tab:red", "cudnn": "tab:blue", "generic": "tab:gray"}


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


def _roof(c: Ceilings, which: str):
    """(value, its kind, the Ceilings it came from) of ``c``'s ``which`` roof ("compute" or "memory"),
    falling back to :data:`DEFAULT_CEILINGS` where ``c`` has none."""
    value, kind = getattr(c, which)()
    if value is None:
        return (*getattr(DEFAULT_CEILINGS, which)(), DEFAULT_CEILINGS)
    return value, kind, c


def _roofs(ceilings: Optional[Ceilings]):
    """(peak TFLOP/s, its label, bandwidth TB/s, its label, measured GEMM or None), each roof taken
    from ``ceilings`` where it has one, else from :data:`DEFAULT_CEILINGS`."""
    c = ceilings or Ceilings()
    peak, peak_name, src = _roof(c, "compute")
    peak_label = (f"{peak:g} TFLOP/s dense bf16/fp16 (datasheet, {src.datasheet_source})" if peak_name == "datasheet"
                  else f"{peak:.0f} TFLOP/s (measured cuBLAS GEMM)")
    bw, bw_name, src = _roof(c, "memory")
    bw_label = (f"{bw:.2f} TB/s (measured copy)" if bw_name == "copy"
                else f"{bw:g} TB/s (datasheet, {src.datasheet_source})")
    gemm = c.measured_gemm_tflops if peak_name == "datasheet" else None
    return peak, peak_label, bw, bw_label, gemm


def plot_roofline(ax=None, ceilings: Optional[Ceilings] = None, intensity_range=(1.0, 1e4)):
    """Draw the roofline ``min(peak, intensity * bandwidth)`` on log axes, each ceiling labelled with
    its source (and the measured GEMM dotted when there is one); return the axes.

    Intensity is FLOP per byte of the minimum traffic (x, w, out, residual once each).
    """
    plt = pyplot()
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 4))
    peak, peak_label, bw, bw_label, gemm = _roofs(ceilings)
    ai = np.logspace(math.log10(intensity_range[0]), math.log10(intensity_range[1]), 200)
    ax.plot(ai, np.minimum(peak, ai * bw), color="black", lw=1.5)  # TB/s * FLOP/B = TFLOP/s
    ridge = peak / bw
    ax.axhline(peak, color="black", ls=":", lw=0.8)
    ax.text(intensity_range[1], peak * 1.05, peak_label, ha="right", va="bottom", fontsize=8)
    if gemm:
        ax.axhline(gemm, color="tab:purple", ls=":", lw=1.0)
        ax.text(intensity_range[1], gemm * 0.93, f"cuBLAS GEMM {GEMM_N}^3: {gemm:.0f} TFLOP/s (measured)",
                ha="right", va="top", fontsize=7, color="tab:purple")
    ax.text(intensity_range[0] * 1.3, intensity_range[0] * 1.3 * bw * 2.2, bw_label, fontsize=8, va="bottom")
    ax.axvline(ridge, color="black", ls=":", lw=0.8)
    ax.text(ridge * 1.05, peak * 0.02, f"ridge {ridge:.0f} FLOP/B", fontsize=8, rotation=90)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(*intensity_range)
    ax.set_ylim(max(0.05, intensity_range[0] * bw * 0.5), peak * 2)
    ax.set_xlabel("arithmetic intensity (FLOP / byte of minimum traffic)")
    ax.set_ylabel("TFLOP/s")
    ax.set_title("roofline")
    ax.grid(True, which="both", alpha=0.2)
    return ax


def plot_bench(records_or_json_path=None, png_path: Optional[str] = None, *, impls: Optional[Sequence[str]] = None,
               ceilings: Optional[Ceilings] = None, title: Optional[str] = None):
    """Roofline + per-shape bar chart of a benchmark; saved to ``png_path`` when given.

    ``records_or_json_path``: a JSON path, the parsed JSON or a list of records (see
    :func:`load_bench_records`). ``None`` or an empty list draws the roofline with its ceilings
    only and says so in the title: no number is made up. ``impls``: which implementations to draw
    (default: those of cuconv / cudnn / generic present, else every one in the records; extra
    timings such as ``cuconv_beta1`` are only drawn when named). ``ceilings`` default to the file's
    (:meth:`~.ceilings.Ceilings.from_json`). Returns the matplotlib Figure.
    """
    plt = pyplot()
    raw = records_or_json_path
    if isinstance(raw, (str, os.PathLike)):
        with open(raw) as f:
            raw = json.load(f)
    device = raw.get("device") if isinstance(raw, dict) else None
    if ceilings is None and isinstance(raw, dict):
        ceilings = Ceilings.from_json(raw)
    records = [] if raw is None else load_bench_records(raw)
    present = _impls(records)
    if impls is None:
        impls = [i for i in _IMPL_COLORS if i in present] or present
    else:
        impls = [i for i in impls if i in present]
    if not records or not impls:
        fig, ax = plt.subplots(figsize=(6.5, 4.2))
        plot_roofline(ax, ceilings)
        ax.set_title(title or "roofline and ceilings only: no benchmark records given")
        return finish_figure(fig, png_path)

    bar_width_in = max(7.0, 0.3 * len(records) * len(impls))
    fig, (ax_roof, ax_bar) = plt.subplots(1, 2, figsize=(6 + bar_width_in, 5),
                                          gridspec_kw={"width_ratios": [6, bar_width_in]})
    intensities = [r["flops"] / r["bytes"] for r in records if r["flops"] and r["bytes"]]
    plot_roofline(ax_roof, ceilings, intensity_range=(min(intensities + [10.0]) / 2, max(intensities + [1000.0]) * 2))
    for impl in impls:
        pts = [(r["flops"] / r["bytes"], _tflops(r, impl)) for r in records
               if r["flops"] and r["bytes"] and _tflops(r, impl)]
        if pts:
            xs, ys = zip(*pts)
            ax_roof.scatter(xs, ys, s=22, label=impl, color=_IMPL_COLORS.get(impl), zorder=3)
    if ax_roof.collections:  # records without byte counts (conv3d) place no point on the roofline
        ax_roof.legend(fontsize=8, loc="lower right")
    _bars(ax_bar, records, impls, ceilings)
    fig.suptitle(title or f"cuconv benchmark{' on ' + str(device) if device else ''}")
    fig.tight_layout()
    return finish_figure(fig, png_path)


def _bars(ax, records, impls, ceilings):
    """One group of bars per record (TFLOP/s of each implementation) under its own roof (dashed)."""
    peak, _, bw, _, _ = _roofs(ceilings)
    x = np.arange(len(records))
    width = 0.8 / len(impls)
    for j, impl in enumerate(impls):
        vals = [_tflops(r, impl) for r in records]
        heights = [v if v is not None else 0.0 for v in vals]
        bars = ax.bar(x + (j - (len(impls) - 1) / 2) * width, heights, width, label=impl,
                      color=_IMPL_COLORS.get(impl))
        for b, v in zip(bars, vals):
            if v is None:  # not measured: say so instead of drawing a zero-height bar silently
                ax.text(b.get_x() + b.get_width() / 2, 0, "n/a", ha="center", va="bottom", fontsize=6, rotation=90)
    for i, r in enumerate(records):
        if r["flops"] and r["bytes"]:
            ax.hlines(min(peak, r["flops"] / r["bytes"] * bw), i - 0.45, i + 0.45, colors="black",
                      linestyles="--", lw=1)
    ax.plot([], [], "k--", lw=1, label="roofline ceiling of the shape")
    ax.set_xticks(x)
    ax.set_xticklabels([f"{r['name']}\n{r['dtype']}" if r["dtype"] else r["name"] for r in records],
                       rotation=45, ha="right", fontsize=7)
    ax.set_ylabel("TFLOP/s (from median time)")
    ax.legend(fontsize=8)
    ax.grid(True, axis="y", alpha=0.2)
