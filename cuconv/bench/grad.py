"""The grad suite: the input and weight gradients of every conv layer of a network, and transposed
convolutions of decoder shapes, against cuDNN's backward kernels.

``python -m cuconv.bench --suite grad [--network NAME ...]`` (default networks: :data:`NETWORKS`).

For every layer (NHWC arrays, the layer's geometry; ``dy`` random): cuconv's
:func:`cuconv.conv2d_input_grad` and :func:`cuconv.conv2d_weight_grad` against cuDNN's
``convolution_backward`` for the input and for the weight alone (``torch.ops.aten.convolution_backward``
with one output asked for, what autograd runs for a conv whose other operand needs no gradient) on
channels-last views of the same arrays. Each result is **checked** against cuDNN's (relative norm
difference within :data:`~.conv2d.TOLERANCE`; ``tests/test_grad*.py`` check cuconv against the float64
reference). The times are taken as the networks suite takes them (:func:`.networks.runner.measure`):
back to back (the main number) and one call at a time, per call and per network pass (every layer
``count`` times, in forward order: a backward pass runs them in reverse, which does not change a sum).

The transposed convolutions (:data:`TRANSPOSED`: stride 2, 2x2 / 3x3 / 4x4 filters, 64-512 channels)
compare :func:`cuconv.conv_transpose2d` with ``torch.nn.functional.conv_transpose2d``.
"""

from __future__ import annotations

import math
from typing import Dict, List, Optional, Sequence

import numpy as np

from .conv2d import TOLERANCE
from .environment import np_dtype
from .networks import NETWORKS
from .networks.layers import Layer
from .networks.runner import measure

__all__ = ["NETWORKS_DEFAULT", "TRANSPOSED", "run", "summary_lines"]

#: The networks the suite runs when ``--network`` names none.
NETWORKS_DEFAULT = ("resnet50", "sd_vae_decoder")

#: Transposed convolutions of decoder shapes: (name, N, input side, C_in, C_out, filter, padding).
TRANSPOSED = (
    ("up2x2 512->256 @16", 16, 16, 512, 256, 2, 0),
    ("up2x2 256->128 @32", 16, 32, 256, 128, 2, 0),
    ("up2x2 128->64 @64", 16, 64, 128, 64, 2, 0),
    ("up4x4 512->256 @16", 16, 16, 512, 256, 4, 1),
    ("up4x4 256->128 @32", 16, 32, 256, 128, 4, 1),
    ("up4x4 128->64 @64", 16, 64, 128, 64, 4, 1),
    ("up3x3 256->128 @32", 16, 32, 256, 128, 3, 1),
    ("up3x3 128->64 @64", 16, 64, 128, 64, 3, 1),
)


def _rel(a, b) -> float:
    """Relative norm difference of two CuPy arrays, in float32."""
    diff = float(((a.astype(np.float32) - b.astype(np.float32)) ** 2).sum() ** 0.5)
    return diff / max(float((b.astype(np.float32) ** 2).sum() ** 0.5), 1e-30)


def _layer_calls(layer: Layer, dtype: str, torch) -> Dict[str, dict]:
    """``{"dx": ..., "dw": ...}``: each a record and the cuconv / cuDNN calls of one gradient of ``layer``."""
    import cupy as cp

    import cuconv
    dt = np_dtype(dtype)
    cg = layer.C // layer.groups
    x = cp.random.standard_normal((layer.N, layer.H, layer.W, layer.C), dtype=cp.float32).astype(dt)
    w = (cp.random.standard_normal((layer.K, layer.R, layer.S, cg), dtype=cp.float32)
         / math.sqrt(layer.R * layer.S * cg)).astype(dt)
    dy = cp.random.standard_normal((layer.N, layer.P, layer.Q, layer.K), dtype=cp.float32).astype(dt)
    kw = dict(stride=layer.stride, padding=layer.pad, dilation=layer.dilation, groups=layer.groups)
    calls = {
        "dx": lambda: cuconv.conv2d_input_grad(dy, w, x.shape, **kw),
        "dw": lambda: cuconv.conv2d_weight_grad(x, dy, w.shape, **kw),
    }
    explain = {"dx": lambda: cuconv.explain_input_grad(dy, w, x.shape, **kw),
               "dw": lambda: cuconv.explain_weight_grad(x, dy, w.shape, **kw)}
    out: Dict[str, dict] = {}
    for key, call in calls.items():
        rec = dict(name=layer.name, describe=layer.describe(), count=layer.count, grad=key, dtype=dtype,
                   macs=layer.macs, ms={}, notes=[], check_ok=False)
        try:
            rec["kernel"] = explain[key]().kernel
        except Exception as e:  # the explanation is informative only; the call below says whether it runs
            rec["notes"].append(f"explain failed: {type(e).__name__}: {e}")
        try:
            got = call()
            cp.cuda.Device().synchronize()
        except Exception as e:  # reported; the network pass is not timed without it
            rec["notes"].append(f"cuconv failed: {type(e).__name__}: {e}")
            out[key] = dict(record=rec, cuconv=None, cudnn=None)
            continue
        cudnn = None if torch is None else _cudnn_backward(torch, layer, x, w, dy, key)
        if cudnn is not None:
            ref = cp.from_dlpack(cudnn().permute(0, 2, 3, 1).contiguous())
            rec["rel_diff_vs_cudnn"] = _rel(got, ref)
            rec["check_ok"] = bool(rec["rel_diff_vs_cudnn"] <= TOLERANCE[dtype])
        else:
            rec["check_ok"] = bool(cp.isfinite(got).all())
        out[key] = dict(record=rec, cuconv=call, cudnn=cudnn)
    return out


def _cudnn_backward(torch, layer: Layer, x, w, dy, key: str):
    """cuDNN's gradient ``key`` ("dx" or "dw") of ``layer`` on channels-last views of the arrays:
    ``torch.ops.aten.convolution_backward`` asked for that one output."""
    tx, tw, tdy = (torch.from_dlpack(a).permute(0, 3, 1, 2) for a in (x, w, dy))
    mask = [key == "dx", key == "dw", False]
    args = ([layer.stride] * 2, [layer.pad] * 2, [layer.dilation] * 2, False, [0, 0], layer.groups, mask)
    index = 0 if key == "dx" else 1
    return lambda: torch.ops.aten.convolution_backward(tdy, tx, tw, None, *args)[index]


def _libs(items: Sequence[dict], counts: bool) -> Dict[str, tuple]:
    libs = {}
    for name, torch_events in (("cuconv", False), ("cudnn", True)):
        calls = [it[name] for it in items for _ in range(it["record"]["count"] if counts else 1)]
        if calls and all(c is not None for c in calls):
            libs[name] = (calls, torch_events)
    return libs


def bench_network(name: str, dtype: str, torch=None, log=print) -> List[dict]:
    """Both gradients of every layer of network ``name``: two records (``grad`` "dx" and "dw") with
    the per-layer records under ``layers`` and the pass's times under ``ms``."""
    net = NETWORKS[name]
    prepared = [_layer_calls(layer, dtype, torch) for layer in net.layers]
    recs = []
    for key in ("dx", "dw"):
        items = [p[key] for p in prepared]
        for it in items:
            it["record"]["ms"].update(measure(_libs([it], counts=False)))
            log(_line(it["record"]))
        rec = dict(network=net.name, title=net.title, batch=net.batch, grad=key, dtype=dtype, ms={},
                   layers=[it["record"] for it in items], macs=net.macs)
        rec["ms"].update(measure(_libs(items, counts=True)))
        rec["check_ok"] = all(it["record"]["check_ok"] for it in items)
        recs.append(rec)
        log(_summary(rec))
    return recs


def bench_transposed(dtype: str, torch=None, log=print) -> List[dict]:
    """The :data:`TRANSPOSED` shapes: cuconv's conv_transpose2d against torch's, per call."""
    import cupy as cp

    import cuconv
    dt = np_dtype(dtype)
    recs = []
    for name, N, side, cin, cout, f, pad in TRANSPOSED:
        x = cp.random.standard_normal((N, side, side, cin), dtype=cp.float32).astype(dt)
        w = (cp.random.standard_normal((cin, f, f, cout), dtype=cp.float32) / math.sqrt(cin * f * f / 4)).astype(dt)
        kw = dict(stride=2, padding=pad, output_padding=1 if f == 3 else 0)
        rec = dict(name=name, describe=f"C{cin} {side}x{side} -> C{cout} {f}x{f} s2 p{pad}", count=1, grad="transpose",
                   dtype=dtype, macs=N * side * side * cin * cout * f * f, ms={}, notes=[], check_ok=False)

        def ours(x=x, w=w, kw=kw):
            return cuconv.conv_transpose2d(x, w, **kw)
        got = ours()
        theirs = None if torch is None else _cudnn_transpose(torch, x, w, kw)
        if theirs is not None:
            ref = cp.from_dlpack(theirs().permute(0, 2, 3, 1).contiguous())
            rec["rel_diff_vs_cudnn"] = _rel(got, ref)
            rec["check_ok"] = bool(got.shape == ref.shape and rec["rel_diff_vs_cudnn"] <= TOLERANCE[dtype])
        else:
            rec["check_ok"] = bool(cp.isfinite(got).all())
        rec["ms"].update(measure(_libs([dict(record=rec, cuconv=ours, cudnn=theirs)], counts=False)))
        log(_line(rec))
        recs.append(rec)
    return recs


def _cudnn_transpose(torch, x, w, kw):
    """torch's ``conv_transpose2d`` on channels-last views of the arrays (the weight as
    ``(C_in, C_out, R, S)``)."""
    tx = torch.from_dlpack(x).permute(0, 3, 1, 2)
    tw = torch.from_dlpack(w).permute(0, 3, 1, 2)
    return lambda: torch.nn.functional.conv_transpose2d(tx, tw, **kw)


def _speed(ms: dict, suffix: str = "") -> str:
    a, b = ms.get("cuconv" + suffix), ms.get("cudnn" + suffix)
    return f"{b / a:.2f}x" if a and b else "-"


def _line(rec: dict) -> str:
    ms = rec["ms"]
    ours, theirs = ms.get("cuconv"), ms.get("cudnn")
    fmt = (lambda v: f"{v * 1e3:9.1f}" if v else "        -")
    diff = rec.get("rel_diff_vs_cudnn")
    return (f"  {rec['grad']:9s} {rec['name'][:34]:34s} {rec['describe']:32s} x{rec['count']:<2d} "
            f"cudnn {fmt(theirs)} us  cuconv {fmt(ours)} us  {_speed(ms):>6s}  one-at-a-time "
            f"{_speed(ms, '_one_at_a_time'):>6s}  diff {diff if diff is None else f'{diff:.1e}'}  {rec.get('kernel', '')}"
            + ("" if rec["check_ok"] else "  CHECK FAILED") + "".join(f"  [{n}]" for n in rec["notes"]))


def _summary(rec: dict) -> str:
    ms = rec["ms"]
    fmt = (lambda v: f"{v:.3f}" if v else "-")
    return (f"== {rec['title']} N={rec['batch']} {rec['dtype']} {rec['grad']}: cudnn {fmt(ms.get('cudnn'))} ms, "
            f"cuconv {fmt(ms.get('cuconv'))} ms per pass: {_speed(ms)} (one at a time {_speed(ms, '_one_at_a_time')})"
            + ("" if rec["check_ok"] else "; CHECK FAILED"))


def summary_lines(records: Sequence[dict]) -> List[str]:
    """One line per network gradient record, and one for the transposed convolutions together."""
    lines = [_summary(r) for r in records if "network" in r]
    tr = [r for r in records if r.get("grad") == "transpose"]
    if tr:
        ours = sum(r["ms"].get("cuconv") or math.nan for r in tr)
        theirs = sum(r["ms"].get("cudnn") or math.nan for r in tr)
        lines.append(f"== transposed convolutions ({len(tr)} shapes, sum of per-call ms): cudnn {theirs:.3f}, "
                     f"cuconv {ours:.3f}: {theirs / ours:.2f}x")
    return lines


def run(names: Optional[Sequence[str]], dtypes: Sequence[str], torch=None, log=print) -> List[dict]:
    """Every network of ``names`` (default :data:`NETWORKS_DEFAULT`) and the transposed shapes, in
    every dtype: the records (network passes carry their layers)."""
    import cupy as cp
    if torch is not None:
        torch.backends.cudnn.benchmark = True
    records: List[dict] = []
    for dtype in dtypes:
        for name in names or NETWORKS_DEFAULT:
            log(f"== grad: {NETWORKS[name].title} ({name}), N={NETWORKS[name].batch}, {dtype}")
            records.extend(bench_network(name, dtype, torch, log))
            cp.get_default_memory_pool().free_all_blocks()
        log(f"== transposed convolutions, {dtype}")
        records.extend(bench_transposed(dtype, torch, log))
    for line in summary_lines(records):
        log(line)
    return records
