"""How the benchmark times a call: CUDA events, an L2 flush, graph replay, and the sustained pass.

Every function takes ``fn(i)``, one call on input set ``i`` (the suites rotate their inputs over
enough copies that the set exceeds twice the L2), and returns milliseconds:

* :func:`time_calls` -- the median of single calls bracketed by CUDA events. ``queued=True`` (the
  main number) puts a 256 MiB memset in front of each call, so L2 is flushed and the host work of
  the call overlaps the memset: the events measure the GPU time of the call alone, the method of
  NVIDIA's nvbench (a blocking kernel) and Triton's ``do_bench`` (an L2-clearing memset).
  ``queued=False`` leaves the GPU idle while the host works: the "isolated" number, host overhead
  included.
* :func:`time_graph` -- the median of CUDA-graph replays of the call: GPU time without cuconv's
  per-call Python work.
* :func:`time_sustained` / :func:`sustained_pair` -- calls back to back for a second after half a
  second of warm-up, the state of a GPU running the same layer over and over, at its power limit;
  :class:`GpuMonitor` records the SM clock and board power meanwhile (``nvidia-smi``).

CuPy (and torch, for cuDNN's events) is imported inside the functions: importing this module
needs neither.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import time
from typing import Dict

__all__ = ["L2_BYTES", "SUSTAIN_WARM_S", "SUSTAIN_S", "SUSTAIN_MIN_MS", "SUSTAIN_ROUNDS", "flush_buffer",
           "spin_up", "time_calls", "time_graph", "GpuMonitor", "time_sustained", "sustained_pair",
           "gpu_state_text"]

#: The L2 size the input rotation is sized against (H100: 50 MiB).
L2_BYTES = 50 * 2 ** 20
#: Size of the memset queued before each timed call (five times the L2).
FLUSH_BYTES = 256 * 2 ** 20

#: Sustained timing: seconds of back-to-back calls first (long enough for the clocks to settle at the
#: board's power limit), then seconds timed.
SUSTAIN_WARM_S = 0.5
SUSTAIN_S = 1.0
#: Shapes whose queued time is shorter get no sustained number: a back-to-back loop of them runs at
#: the pace of the host (argument checks, dispatch, launch), not of the GPU.
SUSTAIN_MIN_MS = 0.1
#: Alternating (cuconv, cuDNN) sustained rounds per shape; each library's number is its median.
SUSTAIN_ROUNDS = 2

_FLUSH = []


def flush_buffer():
    """The device buffer whose memset precedes each queued timed call (allocated once)."""
    import cupy as cp
    if not _FLUSH:
        _FLUSH.append(cp.empty(FLUSH_BYTES, dtype=cp.uint8))
    return _FLUSH[0]


def spin_up(seconds: float = 1.0) -> None:
    """Keep the GPU busy for ``seconds`` (back-to-back memsets) before the first measurement, so the
    first shape of a run does not meet a GPU in its idle clock state, where a single cold reading of
    either library can come out several times too slow."""
    import cupy as cp
    flush = flush_buffer()
    t0 = time.time()
    while time.time() - t0 < seconds:
        for _ in range(20):
            flush.fill(0)
        cp.cuda.Device().synchronize()


def event_api(torch_events: bool):
    """(new timing event, device synchronize, elapsed ms between two recorded events): torch's CUDA
    events for calls that run on torch's stream (cuDNN's), CuPy's for cuconv's."""
    if torch_events:
        import torch
        return (lambda: torch.cuda.Event(enable_timing=True)), torch.cuda.synchronize, (lambda a, b: a.elapsed_time(b))
    import cupy as cp
    return cp.cuda.Event, cp.cuda.Device().synchronize, cp.cuda.get_elapsed_time


def time_calls(fn, sets: int, runs: int, warmup: int = 3, torch_events: bool = False, queued: bool = True) -> float:
    """Median milliseconds of ``fn(i)`` (i = input set index, rotated), timed with CUDA events.

    ``queued`` (default): a memset of :data:`FLUSH_BYTES` is queued before each call, so the GPU is
    busy while the host prepares the call, L2 is flushed, and the events bracket the GPU time of the
    call: what it costs in a pipeline whose host stays ahead of the GPU, for cuconv and cuDNN alike.
    Its warm-up is at least ten calls, which also settles the clocks under load.
    ``queued=False``: nothing is queued first; the time includes the host overhead of the call.
    """
    flush = flush_buffer() if queued else None
    ev, sync, elapsed = event_api(torch_events)
    for i in range(max(warmup, 10) if queued else warmup):
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


def time_graph(fn, sets: int, runs: int) -> float:
    """Median milliseconds of replaying a CUDA graph that captured ``fn(i)``: the GPU time alone.

    cuconv's per-call Python work (argument checks, dispatch, launch) is left out, which is what the
    per-call time adds on shapes where it exceeds the kernel's time. Each replay is queued behind the
    memset of :func:`time_calls`, the conditions of the queued numbers (cuDNN's included): L2
    flushed, and a GPU under load, whose clocks are those of a busy GPU (replays that start on an
    idle GPU read slower on short multi-kernel calls).
    """
    import cupy as cp
    flush = flush_buffer()
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


class GpuMonitor:
    """SM clock and board power while a block runs, sampled by ``nvidia-smi`` every 50 ms.

    ``result`` holds the medians (``sm_mhz``, ``watts``) and the throttle-reason masks seen
    (``reasons``; 0x4 is the software power cap), or stays empty where ``nvidia-smi`` is missing
    or fails: the numbers explain a timing, none depends on them.
    """

    def __init__(self):
        self.result: Dict[str, object] = {}
        self._proc = None

    def __enter__(self):
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


def time_sustained(fn, sets: int, est_ms: float, torch_events: bool = False) -> Dict[str, object]:
    """Milliseconds per call of ``fn(i)`` run back to back (inputs rotated, nothing in between).

    The queued number is one call behind an L2-clearing memset, a burst after a pause. A model that
    runs the same kind of layer over and over (a video VAE over hundreds of frames) keeps the GPU at
    its power limit instead (700 W on the H100 SXM), where the clocks drop until the board's power
    fits and the time follows the energy a call costs more than its cycles. So:
    :data:`SUSTAIN_WARM_S` seconds of calls to reach that state, then CUDA events around
    :data:`SUSTAIN_S` seconds of calls (``est_ms`` sizes the loops). Returns ``ms`` and, where
    ``nvidia-smi`` answers, the median SM clock (``sm_mhz``) and board power (``watts``).
    """
    ev, sync, elapsed = event_api(torch_events)
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
    with GpuMonitor() as mon:
        a.record()
        for k in range(n):
            fn((i + k) % sets)
        b.record()
        b.synchronize()
    return {"ms": elapsed(a, b) / n, **mon.result}


def sustained_pair(cuconv_call, cudnn_call, sets: int, est_ms: float) -> Dict[str, object]:
    """cuconv and (when ``cudnn_call`` is given) cuDNN timed back to back (:func:`time_sustained`),
    alternating over :data:`SUSTAIN_ROUNDS` rounds; the medians, and the clock and power of each
    library's last round. Keys: ``cuconv`` / ``cudnn`` (ms), ``gpu`` ({name: sm_mhz, watts, ...})."""
    out: Dict[str, object] = {"gpu": {}}
    times: Dict[str, list] = {}
    calls = {"cuconv": (cuconv_call, False)}
    if cudnn_call is not None:
        calls["cudnn"] = (cudnn_call, True)
    for _ in range(SUSTAIN_ROUNDS):
        for name, (fn, torch_events) in calls.items():
            r = time_sustained(fn, sets, est_ms, torch_events=torch_events)
            times.setdefault(name, []).append(r.pop("ms"))
            out["gpu"][name] = r
    for name, v in times.items():
        out[name] = statistics.median(v)
    return out


def gpu_state_text(gpu: Dict[str, dict], name: str) -> str:
    """' (SM clock, board power)' of one library's sustained run, or '' where nvidia-smi gave none."""
    g = gpu.get(name, {})
    return f" ({g['sm_mhz']:.0f} MHz, {g['watts']:.0f} W)" if "sm_mhz" in g else ""
