"""The conv3d suite: each conv3d strategy side by side with cuDNN on video-VAE layers, checked first.

For every shape of :data:`SUITE_3D` (3x3x3 filters, spatial padding 1, no temporal padding, as
causal VAEs pre-pad time) and dtype, :func:`bench_shape3d` checks cuconv's automatic choice against
the float64 reference on a crop (the first output depth plane's first rows), then times every
strategy that accepts the shape (``qslice``, ``native`` where a kernel implements it, ``generic``)
and cuDNN (torch's conv3d on channels_last_3d views, when torch is usable), queued as in
:mod:`.timing`. Each strategy's peak extra device memory (bytes the CuPy pool hands out during one
call beyond the output) is recorded too.

These layers run at the board's power limit, where the order of the passes moves the clocks. So the
ratio to cuDNN is also the median of :data:`RATIO_ROUNDS` alternating (cuconv auto, cuDNN) pairs,
which no order favours, and :func:`run` ends with a sustained pass (:func:`sustained3d`): both
back to back for a second each, the state of a GPU decoding a long video.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Dict, List, Optional

import numpy as np

from .ceilings import Ceilings
from .environment import np_dtype
from .timing import L2_BYTES, SUSTAIN_MIN_MS, gpu_state_text, sustained_pair, time_calls

__all__ = ["Shape3d", "SUITE_3D", "PADDING", "STRATEGIES", "RATIO_ROUNDS", "extra_memory", "bench_shape3d",
           "sustained3d", "result_line", "sustained_line", "run"]


@dataclass(frozen=True)
class Shape3d:
    """NDHWC input (N, D, H, W, C), K filters of 3x3x3, stride 1, spatial pad 1, no temporal pad."""

    N: int
    C: int
    D: int
    H: int
    W: int
    K: int

    @property
    def name(self) -> str:
        return f"N{self.N} C{self.C} D{self.D} {self.H}x{self.W} K{self.K} 3x3x3"

    @property
    def out(self):
        return (self.D - 2, self.H, self.W)

    @property
    def flops(self) -> int:
        Z, P, Q = self.out
        return 2 * self.N * Z * P * Q * self.K * 27 * self.C


#: Video-VAE layers: WAN-like (C = 384, 192, 96 at growing resolution) and LTX-like (N = 2, C = 256).
SUITE_3D: List[Shape3d] = [Shape3d(1, 384, 6, 60, 104, 384), Shape3d(1, 192, 6, 120, 208, 192),
                           Shape3d(1, 96, 6, 240, 416, 96), Shape3d(2, 256, 10, 64, 64, 256)]

PADDING = ((0, 0), (1, 1), (1, 1))
STRATEGIES = ("qslice", "native", "generic")
#: Alternating (cuconv auto, cuDNN) queued timing pairs per shape after the strategies' pass; the
#: ratio to cuDNN is their median. Within one pass the library timed last runs on a GPU that the
#: strategies before it left hotter, and at the board's power limit that moves the clocks.
RATIO_ROUNDS = 3


def extra_memory(fn, out_bytes: int) -> int:
    """Peak bytes the CuPy memory pool hands out during ``fn()`` beyond the output itself."""
    import cupy as cp
    pool = cp.get_default_memory_pool()
    cp.cuda.Device().synchronize()
    base = pool.used_bytes()
    peak = [base]

    class _Peak(cp.cuda.MemoryHook):  # the pool keeps no high-water mark: sample after each malloc
        name = "cuconv_peak"

        def malloc_postprocess(self, **kwargs):
            peak[0] = max(peak[0], pool.used_bytes())

    with _Peak():
        y = fn()
        cp.cuda.Device().synchronize()
    del y
    return max(0, peak[0] - base - out_bytes)


def _data(s: Shape3d, dtype: str):
    """Host input and filter (seeded), and device copies: the input rotated over enough copies to
    exceed twice the L2."""
    import cupy as cp
    dt = np_dtype(dtype)
    rng = np.random.default_rng(0)
    x_host = rng.standard_normal((s.N, s.D, s.H, s.W, s.C)).astype(dt)
    w_host = (rng.standard_normal((s.K, 3, 3, 3, s.C)) / math.sqrt(27 * s.C)).astype(dt)
    sets = max(1, min(4, math.ceil(2 * L2_BYTES / max(1, x_host.nbytes))))
    return x_host, w_host, [cp.asarray(x_host) for _ in range(sets)], cp.asarray(w_host)


def _cudnn_call(xs, w):
    """torch's conv3d (cuDNN) on channels_last_3d views of the same arrays, or None without torch."""
    try:
        import torch
    except ImportError:
        return None
    torch.backends.cudnn.benchmark = True  # let cuDNN time its algorithms, as in the conv2d suite
    tx = [torch.from_dlpack(x).permute(0, 4, 1, 2, 3) for x in xs]  # NCDHW view, channels_last_3d
    tw = torch.from_dlpack(w).permute(0, 4, 1, 2, 3)
    return lambda i: torch.nn.functional.conv3d(tx[i], tw, padding=(0, 1, 1))


def bench_shape3d(s: Shape3d, dtype: str, runs: int = 20, with_torch: bool = True) -> dict:
    """Check, then time every strategy of one shape and cuDNN; returns its JSON record."""
    import cupy as cp

    import cuconv
    x_host, w_host, xs, w = _data(s, dtype)
    sets = len(xs)
    rec: Dict[str, object] = {"name": s.name, "shape": asdict(s), "dtype": dtype, "flops": s.flops, "ms": {},
                              "extra_mib": {}, "declined": {}}
    e = cuconv.explain(xs[0], w, padding=PADDING)
    rec["kernel"] = e.kernel
    # check the auto choice on a crop: image 0, first output plane, first 8 rows
    y = cuconv.conv3d(xs[0], w, padding=PADDING)
    rows = min(8, s.H)
    crop = x_host[:1, :3, :rows + 1]
    ref = cuconv.reference.conv3d(crop, w_host, padding=((0, 0), (1, 0), (1, 1)))[:, :1, :rows]
    got = cp.asnumpy(y[:1, :1, :rows]).astype(np.float64)
    rec["rel_error"] = float(np.linalg.norm(got - ref) / np.linalg.norm(ref))
    rec["check_ok"] = bool(rec["rel_error"] <= 1.5e-2)
    del y
    out_bytes = s.N * math.prod(s.out) * s.K * 2
    for strat in STRATEGIES:
        try:
            cuconv.explain(xs[0], w, padding=PADDING, strategy=strat)
        except cuconv.KernelDeclined as err:
            rec["declined"][strat] = str(err)
            continue
        fn = lambda i, st=strat: cuconv.conv3d(xs[i], w, padding=PADDING, strategy=st)  # noqa: E731
        rec["ms"][strat] = time_calls(fn, sets, runs)
        rec["extra_mib"][strat] = extra_memory(lambda st=strat: cuconv.conv3d(xs[0], w, padding=PADDING,
                                                                              strategy=st), out_bytes) / 2**20
    f = _cudnn_call(xs, w) if with_torch else None
    if f is not None:
        rec["ms"]["cudnn"] = time_calls(f, sets, runs, torch_events=True)
        auto = lambda i: cuconv.conv3d(xs[i], w, padding=PADDING)  # noqa: E731
        pairs = [(time_calls(auto, sets, runs), time_calls(f, sets, runs, torch_events=True))
                 for _ in range(RATIO_ROUNDS)]
        rec["ms"]["auto_paired"] = float(np.median([a for a, _ in pairs]))
        rec["ms"]["cudnn_paired"] = float(np.median([c for _, c in pairs]))
        rec["vs_cudnn_paired"] = float(np.median([c / a for a, c in pairs]))
    for k, ms in rec["ms"].items():
        rec.setdefault("tflops", {})[k] = s.flops / (ms * 1e-3) / 1e12
    return rec


def sustained3d(s: Shape3d, dtype: str, est_ms: float, with_torch: bool = True) -> dict:
    """cuconv's auto choice and cuDNN back to back at the power limit (:func:`~.timing.sustained_pair`)."""
    import cuconv
    _, _, xs, w = _data(s, dtype)
    return sustained_pair(lambda i: cuconv.conv3d(xs[i], w, padding=PADDING),
                          _cudnn_call(xs, w) if with_torch else None, len(xs), est_ms)


def result_line(rec, ceilings: Optional[Ceilings] = None) -> str:
    """The printed lines of one record: per strategy the time, TFLOP/s, % of the compute roof (named),
    ratio to cuDNN and extra memory; then the paired ratio."""
    peak, peak_name = (ceilings or Ceilings()).compute()
    parts = [f"{rec['name']:<36} {rec['dtype']:<8} err {rec['rel_error']:.1e} auto={rec['kernel']}"]
    cud = rec["ms"].get("cudnn")
    for k, ms in rec["ms"].items():
        if k in ("auto_paired", "cudnn_paired"):
            continue  # printed as the paired ratio below
        tf = rec["tflops"][k]
        pct = f" ({100 * tf / peak:.0f}% of {peak_name})" if peak else ""
        ratio = f" {cud / ms:.2f}x cuDNN" if cud and k != "cudnn" else ""
        mem = f" +{rec['extra_mib'][k]:.0f} MiB" if k in rec["extra_mib"] else ""
        parts.append(f"  {k}: {ms:.3f} ms {tf:.0f} TFLOP/s{pct}{ratio}{mem}")
    if "vs_cudnn_paired" in rec:
        parts.append(f"  auto vs cuDNN over {RATIO_ROUNDS} alternating pairs: {rec['vs_cudnn_paired']:.3f}x (median; "
                     f"{rec['ms']['auto_paired']:.3f} vs {rec['ms']['cudnn_paired']:.3f} ms)")
    return "\n".join(parts)


def sustained_line(rec) -> str:
    """The printed line of one record's sustained numbers, with clock and power where known."""
    sus = rec["sustained"]
    gpu = sus.get("gpu", {})
    line = f"{rec['name']:<36} {rec['dtype']:<8} sustained auto {sus['cuconv']:.3f} ms{gpu_state_text(gpu, 'cuconv')}"
    if "cudnn" in sus:
        line += (f"  cuDNN {sus['cudnn']:.3f} ms{gpu_state_text(gpu, 'cudnn')}"
                 f"  {sus['cudnn'] / sus['cuconv']:.2f}x cuDNN")
    return line


def run(dtypes: List[str], runs: int, *, with_torch: bool, sustained: bool, ceilings: Optional[Ceilings] = None,
        log=print) -> List[dict]:
    """Every shape of :data:`SUITE_3D` in every dtype, then (``sustained``) the sustained pass over the
    checked shapes of at least :data:`~.timing.SUSTAIN_MIN_MS`; the records."""
    import cupy as cp
    log("== suite conv3d")
    recs = []
    for s in SUITE_3D:
        for dt in dtypes:
            rec = bench_shape3d(s, dt, runs=runs, with_torch=with_torch)
            log(result_line(rec, ceilings))
            recs.append(rec)
            cp.get_default_memory_pool().free_all_blocks()
    for rec in recs if sustained else []:
        est = rec["ms"].get("auto_paired") or min(rec["ms"].values(), default=0.0)
        if rec["check_ok"] and est >= SUSTAIN_MIN_MS:
            rec["sustained"] = sustained3d(Shape3d(**rec["shape"]), rec["dtype"], est, with_torch=with_torch)
            log(sustained_line(rec))
    return recs
