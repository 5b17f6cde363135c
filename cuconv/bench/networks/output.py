"""The networks suite's printed tables and its chart.

* :func:`summary_lines` -- one row per network and dtype: cuDNN and cuconv milliseconds per forward
  pass and their ratio ("speed", cuDNN ms / cuconv ms: above 1 cuconv is faster), back to back (the
  main number) and one call at a time; the check; under a network with depthwise layers, a line
  on those layers together (:func:`depthwise_line`).
* :func:`layer_lines` -- one row per layer of a network: count, the kernel cuconv chose
  (``cuconv.explain``), milliseconds per call of both libraries and the speeds, the check; a
  depthwise layer's row ends with the bandwidth of both libraries in TB/s (memory-bound layers
  are judged by bytes per second, not by MACs).
* :func:`plot_networks` -- a bar chart of each network's speed, back to back and one at a time.

All take the records of :func:`.runner.bench_network` (or a ``--json`` file of the suite), so
printing and drawing need no GPU.
"""

from __future__ import annotations

import json
import os
from typing import List, Optional, Sequence

from ...models.plot import finish_figure, pyplot

__all__ = ["speed", "summary_lines", "depthwise_line", "layer_line", "layer_lines", "load_records", "plot_networks"]

_NAN = float("nan")


def speed(ms: dict, suffix: str = "", against: str = "cudnn") -> Optional[float]:
    """cuDNN ms / cuconv ms of one timing kind (``""`` back to back, ``"_one_at_a_time"``), or None;
    ``against="cudnn_fp32"``: cuDNN's float32 time with TF32 off."""
    cuconv, cudnn = ms.get("cuconv" + suffix), ms.get(against + suffix)
    return cudnn / cuconv if cuconv and cudnn else None


def _ms(v: Optional[float]) -> str:
    return f"{v:9.3f}" if v else f"{'-':>9}"


def _x(v: Optional[float]) -> str:
    return f"{v:6.2f}x" if v else f"{'-':>7}"


def _tb(v: Optional[float]) -> str:
    return f"{v:5.2f}" if v else f"{'-':>5}"


def _check(rec: dict) -> str:
    if rec.get("check_ok"):
        return "ok"
    return "FAILED" if "rel_error" in rec or rec.get("layers") else "not run"


_SUMMARY_HEAD = (f"{'network':<16} {'dtype':<9} {'convs':>5} {'GMAC':>8} | {'back to back':^35} | "
                 f"{'one call at a time':^35} | check")
_SUMMARY_SUB = (f"{'':<16} {'':<9} {'':>5} {'':>8} | {'cuDNN ms':>9} {'cuconv ms':>9}  {'speed':>7}   | "
                f"{'cuDNN ms':>9} {'cuconv ms':>9}  {'speed':>7}   |")


def summary_lines(records: Sequence[dict], header: bool = True) -> List[str]:
    """The summary table of network records (ms per forward pass of the conv layers)."""
    lines = [_SUMMARY_HEAD, _SUMMARY_SUB] if header else []
    for r in records:
        ms = r.get("ms", {})
        lines.append(f"{r['network']:<16} {r['dtype']:<9} {r['conv_layers']:>5} {r['macs'] / 1e9:>8.1f} | "
                     f"{_ms(ms.get('cudnn'))} {_ms(ms.get('cuconv'))}  {_x(speed(ms))}   | "
                     f"{_ms(ms.get('cudnn_one_at_a_time'))} {_ms(ms.get('cuconv_one_at_a_time'))}  "
                     f"{_x(speed(ms, '_one_at_a_time'))}   | {_check(r)}")
        if ms.get("cudnn_fp32"):
            lines.append(f"{'':<16} {'':<9} precision {r.get('precision', 'float32')}; cuDNN with TF32 off: "
                         f"{_ms(ms.get('cudnn_fp32')).strip()} ms, speed {_x(speed(ms, '', 'cudnn_fp32')).strip()} "
                         f"(one at a time {_x(speed(ms, '_one_at_a_time', 'cudnn_fp32')).strip()})")
        if r.get("depthwise"):
            lines.append(f"{'':<16} {depthwise_line(r)}")
        lines += [f"{'':<16} note: {n}" for n in r.get("notes", [])]
    return lines


def depthwise_line(rec: dict) -> str:
    """A network record's depthwise layers together (``rec["depthwise"]``, from
    :func:`.runner.depthwise_summary`): convs, the sum of count x ms per call of each library, the
    speed, their share of cuconv's sum over all layers, and the bandwidth of each library."""
    dw = rec["depthwise"]
    ms = dw.get("ms", {})
    total = rec.get("ms", {}).get("cuconv_sum_of_layers")
    share = f", {100 * ms['cuconv'] / total:.0f}% of cuconv's layer sum" if total and ms.get("cuconv") else ""
    return (f"depthwise: {dw['convs']} of {rec['conv_layers']} convs, count x ms per call: cuDNN "
            f"{_ms(ms.get('cudnn')).strip()} cuconv {_ms(ms.get('cuconv')).strip()} ({_x(speed(ms)).strip()}{share}); "
            f"TB/s cuDNN {_tb(dw.get('tbps_cudnn')).strip()} cuconv {_tb(dw.get('tbps')).strip()}")


def layer_line(rec: dict) -> str:
    """One layer's row: name, geometry, count, kernel, ms per call and speeds, check."""
    ms = rec.get("ms", {})
    err = rec.get("rel_error")
    check = f"{_check(rec)} ({err:.1e})" if err is not None else _check(rec)
    line = (f"  {rec['name'][:44]:<44} {rec['describe']:<36} x{rec['count']:<3} {rec['kernel']:<13} "
            f"{_ms(ms.get('cudnn'))} {_ms(ms.get('cuconv'))} {_x(speed(ms))}  one at a time "
            f"{_ms(ms.get('cudnn_one_at_a_time'))} {_ms(ms.get('cuconv_one_at_a_time'))} "
            f"{_x(speed(ms, '_one_at_a_time'))}  {check}")
    if ms.get("cudnn_fp32"):
        line += f"  cuDNN TF32 off {_ms(ms.get('cudnn_fp32'))} {_x(speed(ms, '', 'cudnn_fp32'))}"
    if rec.get("kind") == "depthwise":
        line += f"  TB/s cuDNN {_tb(rec.get('tbps_cudnn'))} cuconv {_tb(rec.get('tbps'))}"
    return "\n".join([line] + [f"      note: {n}" for n in rec.get("notes", [])])


def layer_lines(record: dict) -> List[str]:
    """The per-layer table of one network record (ms per call)."""
    title = (f"{record.get('title', record['network'])} ({record['network']}), N={record['batch']}, "
             f"{record['dtype']}: ms per call")
    head = (f"  {'layer':<44} {'geometry':<36} {'count':<4} {'kernel':<13} {'cuDNN ms':>9} {'cuconv ms':>9} "
            f"{'speed':>7}  {'':13} {'cuDNN ms':>9} {'cuconv ms':>9} {'speed':>7}  check  (depthwise: TB/s)")
    return [title, head] + [layer_line(layer) for layer in record.get("layers", [])]


def load_records(source) -> List[dict]:
    """The network records of a ``--json`` file (path or parsed), or of a list of records."""
    if isinstance(source, (str, os.PathLike)):
        with open(source) as f:
            source = json.load(f)
    recs = source.get("records", []) if isinstance(source, dict) else source
    return [r for r in recs if isinstance(r, dict) and "network" in r]


def plot_networks(source, png_path: Optional[str] = None, title: Optional[str] = None):
    """Bar chart of each network's speed vs cuDNN (back to back and one call at a time, per dtype);
    ``source``: a ``--json`` file of the suite (path or parsed) or a list of records. Records without
    a cuDNN time are left out; with none left the chart says so. Returns the matplotlib Figure."""
    plt = pyplot()
    device = source.get("device") if isinstance(source, dict) else None
    recs = [r for r in load_records(source) if speed(r.get("ms", {}))]
    fig, ax = plt.subplots(figsize=(max(6.0, 1.3 * len(recs) + 2.0), 4.2))
    if not recs:
        ax.set_title(title or "no network has both a cuconv and a cuDNN time: nothing to draw")
        return finish_figure(fig, png_path)
    xs = range(len(recs))
    width = 0.38
    for offset, suffix, label, color in ((-width / 2, "", "back to back", "tab:red"),
                                         (width / 2, "_one_at_a_time", "one call at a time", "tab:orange")):
        vals = [speed(r["ms"], suffix) or 0.0 for r in recs]
        bars = ax.bar([x + offset for x in xs], vals, width, label=label, color=color)
        for bar, v in zip(bars, vals):
            if v:
                ax.text(bar.get_x() + bar.get_width() / 2, v, f"{v:.2f}", ha="center", va="bottom", fontsize=7)
    ax.axhline(1.0, color="black", lw=0.8, ls="--")
    ax.set_xticks(list(xs))
    ax.set_xticklabels([f"{r.get('title', r['network'])}\nN={r['batch']} {r['dtype']}" for r in recs], fontsize=8)
    ax.set_ylabel("speed vs cuDNN (cuDNN ms / cuconv ms)")
    ax.set_title(title or f"conv layers of whole networks{f' on {device}' if device else ''}: above 1, cuconv "
                          f"is faster", fontsize=9)
    ax.legend(fontsize=8)
    return finish_figure(fig, png_path)
