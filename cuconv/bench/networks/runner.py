"""Check and time a network's conv layers on the GPU: cuconv and cuDNN, back to back and one call at a time.

For every network and dtype, :func:`bench_network`:

1. **prepares** each layer (:func:`prepare_layer`): random NHWC input, filter scaled so that the
   output stays O(1), output buffer; the kernel cuconv chooses (``cuconv.explain(...).kernel``);
   one cuconv call **checked** against the float64 reference (:func:`check_layer`: the first image,
   or its first output rows where the reference would take long); and, with torch, cuDNN's call
   (``torch.nn.functional.conv2d``, ``torch.backends.cudnn.benchmark``) on channels-last views of
   the same arrays (DLPack), its difference to cuconv's output recorded.
2. **times** each layer and then the whole network (:func:`measure`). *Back to back* (the main
   number): the calls queued one after the other :data:`PASSES` times between two CUDA events, the
   host running ahead of the GPU as in a forward pass; the network pass calls each layer ``count``
   times in network order. *One at a time*: the same with a device synchronisation after every
   call, so the GPU waits for the host's work on each call. Each is the median of :data:`REPEATS`
   measurements, cuconv and cuDNN alternating, after one warm-up pass (cuDNN's autotuning, cuconv's
   kernel compilation). Times are per call (layers) and per forward pass (networks).

Depthwise layers (``groups == C``) are memory-bound, so their records also carry the bandwidth
each library reaches (:func:`bandwidth`: TB/s of the least traffic, input + filter + output once
each, over the back-to-back ms per call), and a network with such layers a summary of them
(:func:`depthwise_summary`).

The layers of a network keep their buffers through the run, so a pass reads each layer's input
from wherever the previous layers left the caches, as a forward pass does (a layer run ``count``
times re-reads the same input; both libraries alike). CuPy and torch are imported inside the
functions: importing this module needs neither.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..conv2d import CHECK_BUDGET, check_bound
from ..environment import np_dtype
from ..timing import event_api
from . import NETWORKS
from .layers import Layer, Network

__all__ = ["PASSES", "REPEATS", "Prepared", "check_layer", "layer_record", "bandwidth", "depthwise_summary",
           "prepare_layer", "time_pass", "measure", "bench_network", "run"]

#: Passes between the two CUDA events of one measurement.
PASSES = 20
#: Measurements per number; the number is their median.
REPEATS = 5


@dataclass
class Prepared:
    """A layer ready to time: its JSON record, and one call of each library (None where it cannot run)."""

    layer: Layer
    record: dict
    cuconv: Optional[Callable[[], object]]
    cudnn: Optional[Callable[[], object]]


def check_layer(layer: Layer, x0, w, y0) -> Tuple[float, str]:
    """(relative norm error, scope) of cuconv's output ``y0`` for the first image ``x0`` (NumPy)
    against the float64 reference; above :data:`~..conv2d.CHECK_BUDGET` multiply-adds only the
    first output rows, from the input rows they read (any stride, dilation and groups)."""
    import cuconv.reference as reference
    kw = dict(stride=layer.stride, dilation=layer.dilation, groups=layer.groups)
    per_row = layer.Q * layer.K * layer.R * layer.S * (layer.C // layer.groups)
    if layer.P * per_row <= CHECK_BUDGET:
        ref = reference.conv2d(x0, w, padding=layer.pad, **kw)
        got, scope = y0, "first image"
    else:
        rows = max(1, min(layer.P, int(CHECK_BUDGET // per_row)))
        span = (rows - 1) * layer.stride + layer.dilation * (layer.R - 1) + 1  # padded input rows read
        hc = min(layer.H, span - layer.pad)
        pad_hi = max(0, span - layer.pad - hc)
        ref = reference.conv2d(x0[:, :hc], w, padding=((layer.pad, pad_hi), (layer.pad, layer.pad)), **kw)[:, :rows]
        got, scope = y0[:, :rows], f"first image, output rows 0..{rows - 1} of {layer.P}"
    got = np.asarray(got, dtype=np.float64)
    if got.shape != ref.shape or not np.all(np.isfinite(got)):
        return float("inf"), scope
    return float(np.linalg.norm(got - ref) / max(np.linalg.norm(ref), 1e-30)), scope


def layer_record(layer: Layer, dtype: str) -> dict:
    """The JSON record of a layer before it runs: name, geometry, count, MACs and least bytes per call."""
    return dict(name=layer.name, shape=layer.to_json(), describe=layer.describe(), kind=layer.kind, count=layer.count,
                dtype=dtype, macs=layer.macs, bytes=layer.min_bytes(np.dtype(np_dtype(dtype)).itemsize), kernel="-",
                detail="", ms={}, notes=[], check_ok=False)


def _tbps(nbytes: float, ms: Optional[float]) -> Optional[float]:
    return nbytes / ms / 1e9 if ms else None  # bytes per ms / 1e9 = TB/s


def bandwidth(record: dict) -> Dict[str, float]:
    """``{"tbps": cuconv TB/s, "tbps_cudnn": cuDNN TB/s}`` of a depthwise layer's timed record: its
    least bytes per call over each library's back-to-back ms per call (a library not timed is left
    out); ``{}`` for a layer that is not depthwise."""
    if record.get("kind") != "depthwise" or not record.get("bytes"):
        return {}
    out = {key: _tbps(record["bytes"], record.get("ms", {}).get(lib))
           for key, lib in (("tbps", "cuconv"), ("tbps_cudnn", "cudnn"))}
    return {k: v for k, v in out.items() if v is not None}


def depthwise_summary(layers: Sequence[dict]) -> Optional[dict]:
    """The depthwise layers of a network's timed layer records, together: ``convs`` (per forward
    pass), ``layers`` (distinct), ``ms`` (per library timed on all of them: the sum of ``count`` x
    back-to-back ms per call) and ``tbps`` / ``tbps_cudnn`` (their bytes over that time); None
    where the network has none."""
    dw = [r for r in layers if r.get("kind") == "depthwise"]
    if not dw:
        return None
    out = dict(convs=sum(r["count"] for r in dw), layers=len(dw), ms={})
    nbytes = sum(r["count"] * r.get("bytes", 0) for r in dw)
    for lib, key in (("cuconv", "tbps"), ("cudnn", "tbps_cudnn")):
        times = [r.get("ms", {}).get(lib) for r in dw]
        if all(times):
            out["ms"][lib] = sum(r["count"] * t for r, t in zip(dw, times))
            if nbytes:
                out[key] = _tbps(nbytes, out["ms"][lib])
    return out


def _conv_args(layer: Layer) -> dict:
    return dict(stride=layer.stride, padding=layer.pad, dilation=layer.dilation, groups=layer.groups)


def prepare_layer(layer: Layer, dtype: str, torch=None, layout: str = "NHWC", precision=None) -> Prepared:
    """Buffers, kernel choice, checked first call and the calls to time of one layer (step 1).

    ``layout="NCHW"``: the arrays are contiguous NCHW / KCRS (cuconv called with ``layout="NCHW"``,
    cuDNN on the same contiguous NCHW tensors); the check reads them channels-last."""
    import cupy as cp

    import cuconv
    rec = layer_record(layer, dtype)
    dt = np_dtype(dtype)
    x = cp.random.standard_normal((layer.N, layer.H, layer.W, layer.C), dtype=cp.float32).astype(dt)
    cg = layer.C // layer.groups
    w = (cp.random.standard_normal((layer.K, layer.R, layer.S, cg), dtype=cp.float32)
         / math.sqrt(layer.R * layer.S * cg)).astype(dt)
    out = cp.empty((layer.N, layer.P, layer.Q, layer.K), dtype=dt)
    kw = _conv_args(layer)
    if precision is not None:
        kw["precision"] = precision
    cf = layout == "NCHW"
    if cf:  # the same values, held channels-first; nhwc() reads one back channels-last
        x, w, out = (cp.ascontiguousarray(a.transpose(0, 3, 1, 2)) for a in (x, w, out))
        kw["layout"] = "NCHW"
    out.fill(float("nan"))  # a layer cuconv leaves unwritten fails its check

    def nhwc(a):
        return cp.asnumpy(a.transpose(0, 2, 3, 1) if cf else a)
    try:
        explanation = cuconv.explain(x, w, out=out, **kw)
        rec["kernel"], rec["detail"] = explanation.kernel, explanation.detail
        if explanation.tuning is not None:  # under cuconv.autotune: what it measured
            t = explanation.tuning
            rec["autotune"] = dict(kernel=t.chosen.kernel, overrides=t.chosen.overrides, us=t.chosen.us,
                                   automatic=t.automatic.kernel, automatic_us=t.automatic.us,
                                   candidates=len(t.candidates))
        cuconv.conv2d(x, w, out=out, **kw)
        cp.cuda.Device().synchronize()
    except Exception as e:  # a layer cuconv cannot run is reported, and the network is not timed
        rec["notes"].append(f"cuconv failed: {type(e).__name__}: {e}")
        return Prepared(layer, rec, None, None)
    err, scope = check_layer(layer, nhwc(x[:1]), nhwc(w), nhwc(out[:1]))
    rec.update(rel_error=err, check_scope=scope, check_ok=bool(err <= check_bound(dtype, precision)))

    def cuconv_call():
        return cuconv.conv2d(x, w, out=out, **kw)

    cudnn_call = None
    if torch is not None:
        # NCHW arrays as they are; an NHWC array's NCHW view is torch's channels_last
        tx, tw = (torch.from_dlpack(a) if cf else torch.from_dlpack(a).permute(0, 3, 1, 2) for a in (x, w))
        tkw = {k: v for k, v in kw.items() if k not in ("layout", "precision")}

        def cudnn_call():
            return torch.nn.functional.conv2d(tx, tw, **tkw)

        try:
            y = cudnn_call() if cf else cudnn_call().permute(0, 2, 3, 1)
            y = y.float()
        except Exception as e:  # keep the benchmark going without cuDNN on this layer; say why
            rec["notes"].append(f"cuDNN failed: {type(e).__name__}: {e}")
            return Prepared(layer, rec, cuconv_call, None)
        rec["rel_diff_vs_cudnn"] = float((y - torch.from_dlpack(out).float()).norm() / y.norm().clamp_min(1e-30))
    return Prepared(layer, rec, cuconv_call, cudnn_call)


def time_pass(calls: Sequence[Callable[[], object]], passes: int, sync_each: bool, torch_events: bool) -> float:
    """Milliseconds per pass of ``calls``, run ``passes`` times between two CUDA events, with a device
    synchronisation after every call when ``sync_each``. torch's events for cuDNN's calls."""
    ev, sync, elapsed = event_api(torch_events)
    a, b = ev(), ev()
    sync()
    a.record()
    for _ in range(passes):
        for call in calls:
            call()
            if sync_each:
                sync()
    b.record()
    b.synchronize()
    return elapsed(a, b) / passes


def measure(libs: Dict[str, Tuple[List[Callable[[], object]], bool]]) -> Dict[str, float]:
    """``{lib: back-to-back ms, lib + "_one_at_a_time": ms}`` per pass of each library's calls
    (``libs``: name -> (calls, torch events)): medians of :data:`REPEATS`, libraries alternating."""
    out: Dict[str, float] = {}
    for sync_each, suffix in ((False, ""), (True, "_one_at_a_time")):
        for calls, torch_events in libs.values():
            time_pass(calls, 1, sync_each, torch_events)  # warm-up
        samples: Dict[str, List[float]] = {name: [] for name in libs}
        for _ in range(REPEATS):
            for name, (calls, torch_events) in libs.items():
                samples[name].append(time_pass(calls, PASSES, sync_each, torch_events))
        out.update({name + suffix: statistics.median(v) for name, v in samples.items()})
    return out


def _libs(prepared: Sequence[Prepared], notes: List[str], counts: bool) -> Dict[str, Tuple[list, bool]]:
    """Each library's calls of a pass over ``prepared`` (with ``counts``: each layer ``count`` times,
    else once), for the libraries that can run every layer; a note for the others."""
    libs = {}
    for name, torch_events in (("cuconv", False), ("cudnn", True)):
        calls = [getattr(p, name) for p in prepared for _ in range(p.layer.count if counts else 1)]
        if all(c is not None for c in calls):
            libs[name] = (calls, torch_events)
        elif name == "cuconv":
            notes.append("cuconv not timed: " + ", ".join(p.layer.name for p in prepared if p.cuconv is None)
                         + " did not run")
    return libs


def _cudnn_without_tf32(torch, prepared: Sequence[Prepared], net_ms: dict) -> None:
    """float32: cuDNN timed again with TF32 off (``torch.backends.cudnn.allow_tf32 = False``), per layer
    and per pass, as ``cudnn_fp32`` (and ``cudnn_fp32_one_at_a_time``); the flag is put back after."""
    calls = [p.cudnn for p in prepared for _ in range(p.layer.count)]
    if torch is None or not all(calls):
        return
    before = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    try:
        for p in prepared:
            p.record["ms"].update(measure({"cudnn_fp32": ([p.cudnn], True)}))
        net_ms.update(measure({"cudnn_fp32": (calls, True)}))
    finally:
        torch.backends.cudnn.allow_tf32 = before


def bench_network(net: Network, dtype: str, torch=None, log=print, layout: str = "NHWC", precision=None) -> dict:
    """Prepare, check and time every layer of ``net`` on ``layout`` arrays, then the whole network;
    its JSON record. float32 (cuconv at ``precision``, None for its default): cuDNN with TF32 on (torch's
    default, ``cudnn``) and off (``cudnn_fp32``)."""
    from .output import layer_line
    rec = dict(network=net.name, title=net.title, source=net.source, batch=net.batch, input=list(net.input),
               dtype=dtype, layout=layout, conv_layers=net.conv_layers, unique_layers=len(net.layers), macs=net.macs,
               ms={}, notes=[], layers=[])
    if dtype == "float32":
        rec["precision"] = precision or "float32"
    t0 = time.perf_counter()
    prepared = [prepare_layer(layer, dtype, torch, layout, precision) for layer in net.layers]
    rec["prepare_s"] = time.perf_counter() - t0  # first calls and checks (under autotune, its measurements)
    for p in prepared:
        p.record["ms"].update(measure(_libs([p], p.record["notes"], counts=False)))  # ms per call
    rec["ms"].update(measure(_libs(prepared, rec["notes"], counts=True)))  # ms per forward pass
    if dtype == "float32":
        _cudnn_without_tf32(torch, prepared, rec["ms"])
    for p in prepared:
        p.record.update(bandwidth(p.record))
        rec["layers"].append(p.record)
        log(layer_line(p.record))
    for key in ("cuconv", "cudnn"):
        per_layer = [p.record["ms"].get(key) for p in prepared]
        if all(v is not None for v in per_layer):
            rec["ms"][key + "_sum_of_layers"] = sum(p.layer.count * v for p, v in zip(prepared, per_layer))
    depthwise = depthwise_summary(rec["layers"])
    if depthwise:
        rec["depthwise"] = depthwise
    failed = [p.layer.name for p in prepared if not p.record["check_ok"]]
    rec["check_ok"] = not failed
    if failed:
        rec["notes"].append("check failed: " + ", ".join(failed))
    return rec


def run(names: Sequence[str], dtypes: Sequence[str], torch=None, log=print, layout: str = "NHWC",
        precision=None) -> List[dict]:
    """Every network of ``names`` (keys of :data:`NETWORKS`) in every dtype (:func:`bench_network`) on
    ``layout`` ("NHWC" or "NCHW") arrays; the records. ``torch``: the module for the cuDNN comparison,
    or None for none."""
    import cupy as cp

    from .output import summary_lines
    if torch is not None:
        torch.backends.cudnn.benchmark = True
    records = []
    for name in names:
        for dtype in dtypes:
            net = NETWORKS[name]
            log(f"== network {net.title} ({net.name}), N={net.batch}, {dtype}, {layout}: {net.conv_layers} convs, "
                f"{len(net.layers)} distinct; {net.source}")
            rec = bench_network(net, dtype, torch=torch, log=log, layout=layout,
                                precision=precision if dtype == "float32" else None)
            records.append(rec)
            for line in summary_lines([rec], header=False):
                log(line)
            cp.get_default_memory_pool().free_all_blocks()
            if torch is not None:
                torch.cuda.empty_cache()
    return records
