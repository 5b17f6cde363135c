"""``python -m cuconv.bench``: the one benchmark. Checks each result, then times it.

For every shape of the chosen suites and every dtype (bf16 and fp16 by default):

1. **check**: run cuconv (auto dispatch) once and compare with the float64 reference
   (:mod:`cuconv.reference`, NumPy on the CPU) by relative norm error against the test tolerance.
   To keep the CPU side short the comparison covers the *first image* of the batch, and for large
   images only its first output rows (the reference runs on the matching crop of the input;
   ``check_scope`` in the JSON says which). A shape that fails the check is reported, not timed.
2. **time**: CUDA events around each call, warm-up first (and a second of GPU load before the first
   shape, :func:`_spin_up`), >= 20 timed runs (``--runs``), median.
   Before each timed run a 256 MiB memset is queued, so the events measure the GPU time of the call
   with L2 flushed while the host work of the call overlaps the memset (nvbench / Triton
   ``do_bench`` style; see :func:`_time`). Also measured: the *isolated* call (nothing queued
   first: the host overhead shows), the call replayed from a CUDA graph, and the host time per
   call itself (:func:`host_overhead_us`, printed in the header). Inputs are also rotated over
   enough copies that the set exceeds twice the L2 size.
3. **compare**: cuDNN through ``torch.nn.functional.conv2d`` on channels_last tensors (only when
   torch imports; same data, shared via DLPack), and cuconv's own ``generic_gpu`` path (forced; skipped
   with a note when its fp32 im2col matrix would exceed ``--generic-max-gb``).

4. **sustained** (shapes of at least :data:`SUSTAIN_MIN_MS`, in a last pass; ``--no-sustained``
   skips it): cuconv and cuDNN each called back to back for a second, alternating, after half a
   second to reach the board's power limit (:func:`_time_sustained`), with the SM clock and power
   that ``nvidia-smi`` reports meanwhile. The large layers are power-bound there: the clocks drop
   until the board's power fits, and the time follows the energy of a call rather than its cycles.

Printed per shape: time, TFLOP/s, % of the ceiling (760 TFLOP/s dense bf16 for compute-bound
shapes, 2.95 TB/s copy bandwidth for memory-bound ones, decided by arithmetic intensity vs the
ridge point), ratio to cuDNN. With ``--residual`` (default on the ``vae_unet`` suite's shapes) it
also times ``beta=1`` with a residual against ``beta=0`` and prints the overhead (the median over
:data:`RESIDUAL_ROUNDS` alternating pairs). ``--json FILE``
writes every number (the format :func:`cuconv.plot.plot_bench` reads); ``--plot FILE.png``
draws the roofline and per-shape chart (``--plot-from JSON``: of an earlier run, running nothing).

Suites are module-level data (:data:`SUITES`): add a list to extend the benchmark. Two suites run
their own module (:data:`MODULE_SUITES`): ``sm80`` (:mod:`cuconv.bench_sm80`: stem, ResNeXt grouped,
depthwise, ``cuconv.matmul``, dense ResNet-50 forced onto ``sm80_igemm``) and ``conv3d``
(:mod:`cuconv.bench_conv3d`: each conv3d strategy on the video-VAE shapes).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from typing import Dict, List, Optional

import numpy as np

__all__ = ["Shape", "SUITES", "CEILING_TFLOPS", "CEILING_TBPS", "bench_shape", "host_overhead_us", "main"]

#: Measured ceilings of the H100 we tune on (docs: GUIDE.md "Performance").
CEILING_TFLOPS = 760.0
CEILING_TBPS = 2.95
L2_BYTES = 50 * 2 ** 20


@dataclass(frozen=True)
class Shape:
    """One conv2d benchmark case (NHWC activations, square filter, symmetric padding)."""

    N: int
    C: int
    H: int
    W: int
    K: int
    filter: int
    stride: int
    pad: int

    @property
    def name(self) -> str:
        return (f"N{self.N} C{self.C} {self.H}x{self.W} K{self.K} {self.filter}x{self.filter}"
                f" s{self.stride} p{self.pad}")


#: Benchmark suites: name -> shapes (N, C, H, W, K, filter, stride, pad).
SUITES: Dict[str, List[Shape]] = {
    "resnet50": [Shape(*s) for s in [
        (64, 64, 56, 56, 64, 3, 1, 1), (64, 64, 56, 56, 256, 1, 1, 0), (64, 64, 56, 56, 64, 1, 1, 0),
        (64, 128, 28, 28, 128, 3, 1, 1), (64, 128, 56, 56, 128, 3, 2, 1), (64, 256, 14, 14, 256, 3, 1, 1),
        (64, 1024, 14, 14, 256, 1, 1, 0), (64, 512, 7, 7, 512, 3, 1, 1)]],
    "vae_unet": [Shape(*s) for s in [
        (4, 512, 64, 64, 512, 3, 1, 1), (4, 512, 128, 128, 512, 3, 1, 1), (4, 256, 256, 256, 256, 3, 1, 1),
        (2, 128, 512, 512, 128, 3, 1, 1), (8, 320, 64, 64, 320, 3, 1, 1), (8, 1280, 16, 16, 1280, 3, 1, 1)]],
}

#: Suites with their own module (own shapes, columns and JSON file), run by ``--suite NAME`` and in the
#: default run after the conv2d suites: the sm_80+ kernel's cases (ResNet stem, ResNeXt grouped 3x3,
#: depthwise, ``cuconv.matmul`` 8192^3, dense ResNet-50 forced onto it) and the conv3d strategies on the
#: video-VAE shapes. With ``--json FILE.json`` each writes ``FILE_<name>.json``.
MODULE_SUITES = {"sm80": "cuconv.bench_sm80", "conv3d": "cuconv.bench_conv3d"}

#: Alternating (beta = 0, beta = 1) timing pairs per shape; the residual overhead is their median.
RESIDUAL_ROUNDS = 3
#: Suites whose shapes also get the residual (beta=1 vs beta=0) comparison by default.
RESIDUAL_SUITES = ("vae_unet",)


def _flops_bytes(s: Shape, itemsize: int, residual: bool = False):
    P = (s.H + 2 * s.pad - s.filter) // s.stride + 1
    Q = (s.W + 2 * s.pad - s.filter) // s.stride + 1
    M = s.N * P * Q
    flops = 2 * M * s.K * s.filter * s.filter * s.C
    nbytes = (s.N * s.H * s.W * s.C + s.K * s.filter * s.filter * s.C + M * s.K * (2 if residual else 1)) * itemsize
    return flops, nbytes, (P, Q)


_FLUSH = []


def _flush_buffer():
    """A 256 MiB device buffer (five times the L2) whose memset precedes each queued timed run."""
    import cupy as cp
    if not _FLUSH:
        _FLUSH.append(cp.empty(256 * 2 ** 20, dtype=cp.uint8))
    return _FLUSH[0]


def _spin_up(seconds: float = 1.0) -> None:
    """Keep the GPU busy for ``seconds`` (back-to-back 256 MiB memsets) before the first measurement,
    so that the first shape does not meet a GPU still in its idle clock state: without it, the first
    shape of a run sometimes read a cold-start outlier for either library (once cuDNN 0.62 ms
    against its usual 0.10 ms on N=4 C=512 64x64)."""
    import cupy as cp
    flush = _flush_buffer()
    t0 = time.time()
    while time.time() - t0 < seconds:
        for _ in range(20):
            flush.fill(0)
        cp.cuda.Device().synchronize()


def _event_api(torch_events: bool):
    """(new timing event, device synchronize, elapsed ms between two recorded events): torch's CUDA
    events for calls that run on torch's stream (cuDNN's), CuPy's for ours."""
    if torch_events:
        import torch
        return (lambda: torch.cuda.Event(enable_timing=True)), torch.cuda.synchronize, (lambda a, b: a.elapsed_time(b))
    import cupy as cp
    return cp.cuda.Event, cp.cuda.Device().synchronize, cp.cuda.get_elapsed_time


def _time(fn, sets: int, runs: int, warmup: int = 3, torch_events: bool = False, queued: bool = True) -> float:
    """Median milliseconds of ``fn(i)`` (i = input set index, rotated), timed with CUDA events.

    ``queued`` (the default, the benchmark's main number): before each run a 256 MiB memset is
    queued on the stream, so the GPU is busy while the host prepares the call, and the events
    bracket the GPU time of the call alone, with L2 flushed - the method of NVIDIA's nvbench (a
    blocking kernel) and Triton's ``do_bench`` (an L2-clearing memset). It is what a call costs in a
    pipeline whose host stays ahead of the GPU, for cuconv and cuDNN alike.
    ``queued=False``: nothing is queued first, so the GPU idles while the host works and the time
    includes the host overhead of the call (the "isolated" number).
    """
    flush = _flush_buffer() if queued else None
    ev, sync, elapsed = _event_api(torch_events)
    for i in range(warmup if not queued else max(warmup, 10)):  # queued: also settles the clocks under load
        if flush is not None:
            flush.fill(0)
        fn(i % sets)
    sync()
    times = []
    for i in range(runs):
        a, b = ev(), ev()
        if flush is not None:
            flush.fill(0)
        a.record()
        fn(i % sets)
        b.record()
        b.synchronize()
        times.append(elapsed(a, b))
    return statistics.median(times)


def _time_graph(fn, sets: int, runs: int) -> float:
    """Median milliseconds of replaying a CUDA graph that captured ``fn(i)``: the GPU time alone.

    cuconv's per-call Python work (argument checks, dispatch, launch) is left out, which is what
    the call time above adds on shapes where it exceeds the kernel's time. Each replay is queued
    behind the 256 MiB memset of :func:`_time`, the same conditions as the queued numbers (cuDNN's
    included): L2 flushed, and the GPU busy right before, so its clocks are those of a GPU under
    load. (Replays that start on an idle GPU read up to ~15% slower on short multi-kernel calls
    such as the padded stem.)
    """
    import cupy as cp
    flush = _flush_buffer()
    stream = cp.cuda.Stream(non_blocking=True)
    graphs = []
    with stream:
        for i in range(sets):
            fn(i)
        stream.synchronize()
        for i in range(sets):
            stream.begin_capture()
            fn(i)
            graphs.append(stream.end_capture())
        for i in range(10):
            flush.fill(0)
            graphs[i % sets].launch(stream)
        stream.synchronize()
        times = []
        for i in range(runs):
            a, b = cp.cuda.Event(), cp.cuda.Event()
            flush.fill(0)
            a.record(stream)
            graphs[i % sets].launch(stream)
            b.record(stream)
            b.synchronize()
            times.append(cp.cuda.get_elapsed_time(a, b))
    return statistics.median(times)


#: Sustained timing (:func:`_time_sustained`): seconds of back-to-back calls first (long enough for
#: the clocks to settle at the board's power limit), then seconds timed.
SUSTAIN_WARM_S = 0.5
SUSTAIN_S = 1.0
#: Shapes whose queued time is shorter get no sustained number: a back-to-back loop of them runs at
#: the pace of the host (argument checks, dispatch, launch), not of the GPU.
SUSTAIN_MIN_MS = 0.1
#: Alternating (cuconv, cuDNN) sustained rounds per shape; each library's number is its median.
SUSTAIN_ROUNDS = 2


class _GpuMonitor:
    """SM clock and board power while a block runs, sampled by ``nvidia-smi`` every 50 ms.

    ``result`` holds the medians (``sm_mhz``, ``watts``) and the throttle-reason masks seen
    (``reasons``; 0x4 is the software power cap), or stays empty where ``nvidia-smi`` is missing
    or fails: the numbers explain a timing, none depends on them.
    """

    def __init__(self):
        self.result: Dict[str, object] = {}
        self._proc = None

    def __enter__(self):
        import shutil
        import subprocess
        exe = shutil.which("nvidia-smi")
        if exe:
            dev = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0] or "0"
            try:
                self._proc = subprocess.Popen(
                    [exe, "-i", dev, "--query-gpu=clocks.sm,power.draw,clocks_event_reasons.active",
                     "--format=csv,noheader,nounits", "-lms", "50"],
                    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            except OSError:
                self._proc = None
        return self

    def __exit__(self, *exc):
        if self._proc is None:
            return False
        self._proc.terminate()
        try:
            out = self._proc.communicate(timeout=5)[0]
        except Exception:  # a monitor that hangs must not stop the benchmark
            self._proc.kill()
            return False
        rows = []
        for line in out.strip().splitlines():
            parts = [p.strip() for p in line.split(",")]
            try:
                rows.append((float(parts[0]), float(parts[1]), parts[2] if len(parts) > 2 else ""))
            except (ValueError, IndexError):
                continue
        if rows:
            self.result = {"sm_mhz": statistics.median(r[0] for r in rows),
                           "watts": statistics.median(r[1] for r in rows),
                           "reasons": sorted({r[2] for r in rows if r[2]})}
        return False


def _time_sustained(fn, sets: int, est_ms: float, torch_events: bool = False) -> Dict[str, object]:
    """Milliseconds per call of ``fn(i)`` run back to back (inputs rotated, nothing in between).

    The queued number (:func:`_time`) is one call behind an L2-clearing memset, a burst after a
    memory-bound pause. A model that runs the same kind of layer over and over (a video VAE over
    hundreds of frames) instead keeps the GPU at its power limit, where the clocks drop until the
    board's power fits (on the H100 SXM: 700 W, 1.4-1.6 GHz on the large layers) and the time
    follows the energy a call costs more than its cycles. So: :data:`SUSTAIN_WARM_S` seconds of
    calls to reach that state, then CUDA events around :data:`SUSTAIN_S` seconds of calls (``est_ms``
    sizes the loops). Returns ``ms`` and, where ``nvidia-smi`` answers, the median SM clock
    (``sm_mhz``) and board power (``watts``) over the timed calls.
    """
    ev, sync, elapsed = _event_api(torch_events)
    a, b = ev(), ev()
    batch = max(1, int(50.0 / max(est_ms, 1e-3)))  # about 50 ms of GPU work between host syncs
    t0 = time.perf_counter()
    i = 0
    while time.perf_counter() - t0 < SUSTAIN_WARM_S:
        for _ in range(batch):
            fn(i % sets)
            i += 1
        sync()
    n = max(batch, int(SUSTAIN_S * 1e3 / max(est_ms, 1e-3)))
    with _GpuMonitor() as mon:
        a.record()
        for k in range(n):
            fn((i + k) % sets)
        b.record()
        b.synchronize()
    ms = elapsed(a, b) / n
    return {"ms": ms, **mon.result}


def _check(s: Shape, dtype: str, x0, w, y0) -> tuple:
    """Relative error of cuconv's first image (or its first output rows) against the reference."""
    import cuconv.reference as reference
    P = (s.H + 2 * s.pad - s.filter) // s.stride + 1
    Q = (s.W + 2 * s.pad - s.filter) // s.stride + 1
    gemm_k = s.filter * s.filter * s.C
    if P * Q * s.K * gemm_k <= 2e9:
        ref = reference.conv2d(x0, w, stride=s.stride, padding=s.pad)
        got = y0
        scope = "first image"
    else:  # first `rows` output rows of image 0, from the matching input crop
        rows = max(1, min(P, int(2e9 // (Q * s.K * gemm_k))))
        need = (rows - 1) * s.stride + s.filter - s.pad
        hc = min(s.H, need)
        pad_hi = max(0, (rows - 1) * s.stride + s.filter - hc - s.pad)
        ref = reference.conv2d(x0[:, :hc], w, stride=s.stride, padding=((s.pad, pad_hi), (s.pad, s.pad)))
        ref = ref[:, :rows]
        got = y0[:, :rows]
        scope = f"first image, output rows 0..{rows - 1} of {P}"
    got = np.asarray(got, dtype=np.float64)
    if not np.all(np.isfinite(got)):
        return float("inf"), scope
    return float(np.linalg.norm(got - ref) / max(np.linalg.norm(ref), 1e-30)), scope


def _np_dtype(dtype: str):
    if dtype == "bfloat16":
        import ml_dtypes
        return ml_dtypes.bfloat16
    return {"float16": np.float16}[dtype]


def _shape_data(s: Shape, np_dtype):
    """Inputs (rotated over enough copies that x + out exceed twice the L2), filter and outputs of a
    shape: random normal made on the GPU, the filter scaled so that outputs stay O(1)."""
    import cupy as cp
    _, _, (P, Q) = _flops_bytes(s, 2)
    x_bytes = s.N * s.H * s.W * s.C * 2
    sets = max(1, min(8, math.ceil(2 * L2_BYTES / max(1, x_bytes + s.N * P * Q * s.K * 2))))
    xs = [(cp.random.standard_normal((s.N, s.H, s.W, s.C), dtype=cp.float32)).astype(np_dtype) for _ in range(sets)]
    w = (cp.random.standard_normal((s.K, s.filter, s.filter, s.C), dtype=cp.float32)
         / math.sqrt(s.filter * s.filter * s.C)).astype(np_dtype)
    outs = [cp.empty((s.N, P, Q, s.K), dtype=np_dtype) for _ in range(sets)]
    return xs, w, outs


def _cudnn_conv2d(xs, w, dtype: str, **kw):
    """torch's conv2d (cuDNN, autotuned) on NCHW views of the same arrays (channels_last memory) as
    ``f(i)`` over the input copies; ImportError without torch."""
    import torch
    torch.backends.cudnn.benchmark = True
    txs = [torch.from_dlpack(x).permute(0, 3, 1, 2) for x in xs]
    tw = torch.from_dlpack(w).permute(0, 3, 1, 2)
    tdt = {"float16": torch.float16, "bfloat16": torch.bfloat16}[dtype]
    assert txs[0].dtype == tdt and txs[0].is_contiguous(memory_format=torch.channels_last)
    return lambda i: torch.nn.functional.conv2d(txs[i], tw, **kw)


def _gpu_state(gpu: Dict[str, dict], name: str) -> str:
    """' (SM clock, board power)' of one library's sustained run, or '' where nvidia-smi gave none."""
    g = gpu.get(name, {})
    return f" ({g['sm_mhz']:.0f} MHz, {g['watts']:.0f} W)" if "sm_mhz" in g else ""


def sustained_pair(cuconv_call, cudnn_call, sets: int, est_ms: float) -> Dict[str, object]:
    """cuconv and (when ``cudnn_call`` is given) cuDNN timed back to back (:func:`_time_sustained`),
    alternating over :data:`SUSTAIN_ROUNDS` rounds; the medians, and the clock and power of each
    library's last round. Keys: ``cuconv`` / ``cudnn`` (ms), ``gpu`` ({name: sm_mhz, watts, ...})."""
    out: Dict[str, object] = {"gpu": {}}
    times: Dict[str, list] = {}
    calls = {"cuconv": (cuconv_call, False)}
    if cudnn_call is not None:
        calls["cudnn"] = (cudnn_call, True)
    for _ in range(SUSTAIN_ROUNDS):
        for name, (fn, torch_events) in calls.items():
            r = _time_sustained(fn, sets, est_ms, torch_events=torch_events)
            times.setdefault(name, []).append(r.pop("ms"))
            out["gpu"][name] = r
    for name, v in times.items():
        out[name] = statistics.median(v)
    return out


def bench_sustained(s: Shape, dtype: str, est_ms: float, with_torch: bool = True) -> Dict[str, object]:
    """The sustained numbers of one conv2d shape (:func:`sustained_pair`), on fresh data."""
    import cuconv
    xs, w, outs = _shape_data(s, _np_dtype(dtype))
    kw = dict(stride=s.stride, padding=s.pad)
    cudnn_call = None
    if with_torch:
        try:
            cudnn_call = _cudnn_conv2d(xs, w, dtype, **kw)
        except ImportError:
            pass
    return sustained_pair(lambda i: cuconv.conv2d(xs[i], w, out=outs[i], **kw), cudnn_call, len(xs), est_ms)


def bench_shape(s: Shape, dtype: str, runs: int = 20, with_torch: bool = True, with_generic: bool = True,
                generic_max_gb: float = 2.0, residual: bool = False, tolerance: Optional[Dict[str, float]] = None,
                log=print) -> dict:
    import cupy as cp

    import cuconv
    tolerance = tolerance or {"float16": 2e-3, "bfloat16": 1.5e-2}
    np_dtype = _np_dtype(dtype)
    flops, nbytes, (P, Q) = _flops_bytes(s, 2)
    xs, w, outs = _shape_data(s, np_dtype)
    sets = len(xs)
    kw = dict(stride=s.stride, padding=s.pad)
    rec = dict(name=s.name, shape=asdict(s), dtype=dtype, flops=flops, bytes=nbytes, ms={}, notes=[])
    explanation = cuconv.explain(xs[0], w, **kw)
    rec["kernel"] = explanation.kernel
    rec["detail"] = explanation.detail

    # 1. check
    outs[0].fill(float("nan"))
    cuconv.conv2d(xs[0], w, out=outs[0], **kw)
    cp.cuda.Device().synchronize()
    err, scope = _check(s, dtype, cp.asnumpy(xs[0][:1]), cp.asnumpy(w), cp.asnumpy(outs[0][:1]))
    rec.update(rel_error=err, check_scope=scope, check_ok=bool(err <= tolerance[dtype]))
    if not rec["check_ok"]:
        log(f"  CHECK FAILED {s.name} {dtype}: rel error {err:.3g} ({scope})")
        return rec

    # 2. time cuconv (auto dispatch: the kernel explain() names)
    rec["ms"]["cuconv"] = _time(lambda i: cuconv.conv2d(xs[i], w, out=outs[i], **kw), sets, runs)
    rec["ms"]["cuconv_isolated"] = _time(lambda i: cuconv.conv2d(xs[i], w, out=outs[i], **kw), sets, runs,
                                         queued=False)
    try:  # the same call replayed from a CUDA graph: GPU time without cuconv's host overhead
        rec["ms"]["cuconv_graph"] = _time_graph(lambda i: cuconv.conv2d(xs[i], w, out=outs[i], **kw), sets, runs)
    except Exception as e:
        rec["notes"].append(f"graph timing failed: {type(e).__name__}: {e}")

    # 3a. cuDNN via torch (optional)
    if with_torch:
        try:
            import torch
            f = _cudnn_conv2d(xs, w, dtype, **kw)
            with torch.no_grad():
                ref_t = f(0)
                diff = (ref_t.permute(0, 2, 3, 1).float() - torch.from_dlpack(outs[0]).float()).norm()
                rec["rel_diff_vs_cudnn"] = float(diff / ref_t.float().norm())
                rec["ms"]["cudnn"] = _time(f, sets, runs, torch_events=True)
                rec["ms"]["cudnn_isolated"] = _time(f, sets, runs, torch_events=True, queued=False)
        except ImportError:
            rec["notes"].append("torch not importable: no cuDNN comparison")
        except Exception as e:  # keep the benchmark going; say why
            rec["notes"].append(f"cuDNN comparison failed: {type(e).__name__}: {e}")

    # 3b. cuconv generic path
    a_gb = s.N * P * Q * s.filter * s.filter * s.C * 4 / 2 ** 30
    if with_generic and a_gb <= generic_max_gb:
        rec["ms"]["generic"] = _time(lambda i: cuconv.conv2d(xs[i], w, out=outs[i], kernel="generic_gpu", **kw),
                                     sets, max(5, runs // 4), warmup=1)
    elif with_generic:
        rec["notes"].append(f"generic_gpu skipped: its fp32 im2col matrix would be {a_gb:.1f} GiB")

    # 4. residual beta=1 vs beta=0
    if residual:
        cp.get_default_memory_pool().free_all_blocks()
        res = [cp.random.standard_normal((s.N, P, Q, s.K), dtype=cp.float32).astype(np_dtype)
               for _ in range(sets)]
        # The overhead is a ratio of two times that drift together over seconds (clocks, heat), so it
        # is the median over RESIDUAL_ROUNDS alternating (beta = 0, beta = 1) pairs, not one pair.
        call0 = lambda i: cuconv.conv2d(xs[i], w, residual=res[i], beta=0.0, out=outs[i], **kw)
        call1 = lambda i: cuconv.conv2d(xs[i], w, residual=res[i], beta=1.0, out=outs[i], **kw)
        pairs = [(_time(call0, sets, runs), _time(call1, sets, runs)) for _ in range(RESIDUAL_ROUNDS)]
        rec["ms"]["cuconv_beta0"] = float(np.median([b0 for b0, _ in pairs]))
        rec["ms"]["cuconv_beta1"] = float(np.median([b1 for _, b1 in pairs]))
        rec["residual_overhead"] = float(np.median([b1 / b0 - 1.0 for b0, b1 in pairs]))
        try:
            pairs = [(_time_graph(call0, sets, runs), _time_graph(call1, sets, runs)) for _ in range(RESIDUAL_ROUNDS)]
            rec["ms"]["cuconv_graph_beta0"] = float(np.median([b0 for b0, _ in pairs]))
            rec["ms"]["cuconv_graph_beta1"] = float(np.median([b1 for _, b1 in pairs]))
            rec["residual_overhead_graph"] = float(np.median([b1 / b0 - 1.0 for b0, b1 in pairs]))
        except Exception as e:
            rec["notes"].append(f"graph timing (residual) failed: {type(e).__name__}: {e}")
        # in-place check of the residual path on the first image
        y = cuconv.conv2d(xs[0][:1], w, residual=res[0][:1], beta=1.0, **kw)
        import cuconv.reference as reference
        if P * Q * s.K * s.filter * s.filter * s.C <= 2e9:
            ref = reference.conv2d(cp.asnumpy(xs[0][:1]), cp.asnumpy(w), residual=cp.asnumpy(res[0][:1]), **kw)
            got = cp.asnumpy(y).astype(np.float64)
            rec["residual_rel_error"] = float(np.linalg.norm(got - ref) / np.linalg.norm(ref))
    return rec


def host_overhead_us(with_torch: bool = True, calls: int = 300, batches: int = 9) -> Dict[str, float]:
    """Host time per call of back-to-back calls on a tiny conv (1x8x8x64, 3x3, 64 filters, fp16).

    The kernel takes a few microseconds, so the loop runs at the speed of the host: what every call
    costs in argument checks, dispatch and launch before the GPU sees it. Measured for cuconv
    (with ``out=``) and, when torch imports, for ``torch.nn.functional.conv2d`` (cuDNN), as the
    median over ``batches`` loops of ``calls`` calls, the two interleaved (the host's speed drifts).
    """
    import cupy as cp

    import cuconv
    x = cp.random.standard_normal((1, 8, 8, 64), dtype=cp.float32).astype(cp.float16)
    w = cp.random.standard_normal((64, 3, 3, 64), dtype=cp.float32).astype(cp.float16)
    out = cp.empty((1, 8, 8, 64), dtype=cp.float16)
    fns = {"cuconv": lambda: cuconv.conv2d(x, w, padding=1, out=out)}
    if with_torch:
        try:
            import torch
            tx = torch.from_dlpack(x).permute(0, 3, 1, 2)
            tw = torch.from_dlpack(w).permute(0, 3, 1, 2)
            fns["torch (cuDNN)"] = lambda: torch.nn.functional.conv2d(tx, tw, padding=1)
        except ImportError:
            pass
    samples: Dict[str, list] = {name: [] for name in fns}
    for name, fn in fns.items():
        for _ in range(100):
            fn()
    for _ in range(batches):
        for name, fn in fns.items():
            cp.cuda.Device().synchronize()
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            samples[name].append((time.perf_counter() - t0) / calls * 1e6)
    cp.cuda.Device().synchronize()
    return {name: statistics.median(v) for name, v in samples.items()}


def _summary_line(rec: dict) -> str:
    t = rec["ms"].get("cuconv")
    if t is None:
        return f"{rec['name']:<34} {rec['dtype']:<8} check failed (rel error {rec.get('rel_error', float('nan')):.3g})"
    tflops = rec["flops"] / (t * 1e-3) / 1e12
    tbps = rec["bytes"] / (t * 1e-3) / 1e12
    intensity = rec["flops"] / rec["bytes"]
    memory_bound = intensity < CEILING_TFLOPS / CEILING_TBPS
    pct = (tbps / CEILING_TBPS if memory_bound else tflops / CEILING_TFLOPS) * 100
    cud = rec["ms"].get("cudnn")
    gen = rec["ms"].get("generic")
    ratio = f"{cud / t:6.2f}x" if cud else "     -"
    line = (f"{rec['name']:<34} {rec['dtype']:<8} {t:8.3f} ms {tflops:7.1f} TF/s {tbps:5.2f} TB/s "
            f"{pct:5.1f}% of {'copy' if memory_bound else 'mma '}  vs cuDNN {ratio}"
            f"  cuDNN {cud or float('nan'):7.3f} ms  generic {gen or float('nan'):8.3f} ms")
    tg = rec["ms"].get("cuconv_graph")
    if tg:
        line += f"\n{'':<43} kernel (graph) {tg:8.3f} ms {rec['flops'] / (tg * 1e-3) / 1e12:7.1f} TF/s " \
                f"{rec['bytes'] / (tg * 1e-3) / 1e12:5.2f} TB/s  vs cuDNN {(cud / tg if cud else float('nan')):5.2f}x"
    ti, ci = rec["ms"].get("cuconv_isolated"), rec["ms"].get("cudnn_isolated")
    if ti:
        line += f"\n{'':<43} isolated call {ti:8.3f} ms (host work not overlapped)  cuDNN {ci or float('nan'):7.3f} ms" \
                f"  vs cuDNN {(ci / ti if ci else float('nan')):5.2f}x"
    if "residual_overhead" in rec:
        line += f"  beta1/beta0 call {100 * rec['residual_overhead']:+.1f}%"
    if "residual_overhead_graph" in rec:
        line += f" graph {100 * rec['residual_overhead_graph']:+.1f}%"
    return line


def _sustained_line(rec: dict) -> str:
    t, c = rec["ms"]["cuconv_sustained"], rec["ms"].get("cudnn_sustained")
    gpu = rec.get("sustained_gpu", {})
    line = f"{rec['name']:<34} {rec['dtype']:<8} sustained {t:8.3f} ms{_gpu_state(gpu, 'cuconv')}"
    if c:
        line += f"  cuDNN {c:8.3f} ms{_gpu_state(gpu, 'cudnn')}  vs cuDNN {c / t:5.2f}x"
    return line


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m cuconv.bench", description=__doc__.split("\n")[0])
    ap.add_argument("--suite", action="append", choices=sorted(SUITES) + sorted(MODULE_SUITES),
                    help="suite(s) to run (default: all); sm80 and conv3d run cuconv.bench_sm80 / cuconv.bench_conv3d")
    ap.add_argument("--dtype", action="append", choices=["bfloat16", "float16"], help="dtype(s) (default: both)")
    ap.add_argument("--json", metavar="FILE", help="write every number to FILE")
    ap.add_argument("--quick", action="store_true", help="fewer timed runs (20) and no generic_gpu comparison")
    ap.add_argument("--runs", type=int, default=30, help="timed runs per measurement (>= 20; default 30)")
    ap.add_argument("--no-torch", action="store_true", help="skip the cuDNN comparison")
    ap.add_argument("--no-generic", action="store_true", help="skip the generic_gpu comparison")
    ap.add_argument("--generic-max-gb", type=float, default=2.0, help="skip generic_gpu above this im2col size")
    ap.add_argument("--residual", choices=["auto", "all", "none"], default="auto",
                    help="residual beta=1 vs beta=0 timing: auto = the vae_unet suite's shapes")
    ap.add_argument("--no-sustained", action="store_true",
                    help="skip the sustained (back-to-back, power-limited) timing of the shapes over 0.1 ms")
    ap.add_argument("--plot", metavar="FILE.png", help="draw the roofline + per-shape chart (cuconv.plot, matplotlib)")
    ap.add_argument("--plot-from", metavar="JSON", help="with --plot: draw an existing --json file, run nothing")
    args = ap.parse_args(argv)
    if args.plot:
        import matplotlib  # noqa: F401  (missing matplotlib fails now, not after the run)
    if args.plot_from:
        if not args.plot:
            ap.error("--plot-from needs --plot FILE.png")
        from cuconv.plot import plot_bench
        plot_bench(args.plot_from, args.plot)
        print(f"wrote {args.plot}")
        return 0
    suites = args.suite or list(SUITES) + list(MODULE_SUITES)
    dtypes = args.dtype or ["bfloat16", "float16"]
    runs = max(20, 20 if args.quick else args.runs)

    import cupy as cp

    from cuconv.device import current_gpu
    dev = current_gpu()
    if dev is None:
        print("cuconv.bench: no GPU visible to CuPy", file=sys.stderr)
        return 2
    print(f"device: {dev.describe()}; ceilings {CEILING_TFLOPS} TFLOP/s, {CEILING_TBPS} TB/s; {runs} runs, median")
    host = host_overhead_us(with_torch=not args.no_torch)
    print("host work per call (back-to-back calls of a tiny conv, microseconds): "
          + ", ".join(f"{k} {v:.1f}" for k, v in host.items()))
    records = []
    module_status = 0
    t0 = time.time()
    _spin_up()
    for suite in suites:
        print(f"== suite {suite}")
        if suite in MODULE_SUITES:
            module_status |= _run_module_suite(suite, args, dtypes, runs)
            continue
        for s in SUITES[suite]:
            for dt in dtypes:
                with_res = args.residual == "all" or (args.residual == "auto" and suite in RESIDUAL_SUITES)
                rec = bench_shape(s, dt, runs=runs, with_torch=not args.no_torch,
                                  with_generic=not (args.no_generic or args.quick),
                                  generic_max_gb=args.generic_max_gb, residual=with_res)
                rec["suite"] = suite
                records.append(rec)
                print(_summary_line(rec), flush=True)
                cp.get_default_memory_pool().free_all_blocks()
    if not args.no_sustained:
        # A pass of its own, after every queued number: a GPU that just ran at its power limit for
        # seconds is hot, and would slow the next shapes' queued runs.
        long_ones = [r for r in records if r["ms"].get("cuconv", 0.0) >= SUSTAIN_MIN_MS]
        if long_ones:
            print(f"== sustained (back to back, {SUSTAIN_S:g} s per library and round, shapes >= {SUSTAIN_MIN_MS} ms)")
        for rec in long_ones:
            s = Shape(**rec["shape"])
            sus = bench_sustained(s, rec["dtype"], rec["ms"]["cuconv"], with_torch=not args.no_torch)
            rec["ms"]["cuconv_sustained"] = sus["cuconv"]
            if "cudnn" in sus:
                rec["ms"]["cudnn_sustained"] = sus["cudnn"]
            rec["sustained_gpu"] = sus["gpu"]
            print(_sustained_line(rec), flush=True)
            cp.get_default_memory_pool().free_all_blocks()
    for key, ref in (("cuconv", "cudnn"), ("cuconv_graph", "cudnn"), ("cuconv_isolated", "cudnn_isolated"),
                     ("cuconv_sustained", "cudnn_sustained")):
        ratios = [r["ms"][ref] / r["ms"][key] for r in records if ref in r["ms"] and key in r["ms"]]
        if ratios:
            geo = math.exp(sum(math.log(v) for v in ratios) / len(ratios))
            print(f"geomean speed vs cuDNN ({key}): {geo:.3f}x over {len(ratios)} shape/dtype pairs "
                  f"(min {min(ratios):.2f}x)")
    print(f"{time.time() - t0:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": dev.describe(), "ceilings": {"tflops": CEILING_TFLOPS, "tbps": CEILING_TBPS},
                       "host_us_per_call": host, "records": records}, f, indent=1, default=float)
    if args.plot:
        from cuconv.plot import plot_bench
        plot_bench({"device": dev.describe(), "ceilings": {"tflops": CEILING_TFLOPS, "tbps": CEILING_TBPS},
                    "records": records}, args.plot)
        print(f"wrote {args.plot}")
    return 0 if all(r.get("check_ok") for r in records) and not module_status else 1


def _run_module_suite(name: str, args, dtypes, runs: int) -> int:
    """Run one of :data:`MODULE_SUITES` with this run's runs, dtypes, torch and JSON choices."""
    import importlib
    mod = importlib.import_module(MODULE_SUITES[name])
    root = os.path.splitext(args.json)[0] if args.json else None
    if name == "sm80":  # that module runs one dtype at a time (and finds torch by itself)
        status = 0
        for dt in dtypes:
            tag = f"_{name}" if len(dtypes) == 1 else f"_{name}_{dt}"
            status |= mod.main(["--runs", str(runs), "--dtype", dt] + (["--json", root + tag + ".json"] if root else []))
        return status
    argv = ["--runs", str(runs)] + [a for dt in dtypes for a in ("--dtype", dt)]
    argv += (["--no-torch"] if args.no_torch else []) + (["--json", f"{root}_{name}.json"] if root else [])
    argv += ["--no-sustained"] if args.no_sustained else []
    return mod.main(argv)


if __name__ == "__main__":
    sys.exit(main())
