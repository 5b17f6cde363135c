"""The conv2d suites: ResNet-50 and VAE/UNet layers, checked against the reference, then timed.

For every shape of :data:`SUITES` and every dtype, :func:`bench_shape`:

1. **checks** cuconv's automatic choice once against the float64 reference (:mod:`cuconv.reference`)
   by relative norm error (:data:`TOLERANCE`). The comparison covers the first image of the batch,
   and for large images only its first output rows (``check_scope`` says which). A shape that
   fails the check is reported, not timed.
2. **times** it (:mod:`.timing`): queued (the main number), isolated (host overhead included) and
   replayed from a CUDA graph; inputs rotated over enough copies to exceed twice the L2.
3. **compares** with cuDNN through ``torch.nn.functional.conv2d`` on channels_last views of the
   same arrays (when torch is usable) and with cuconv's ``generic_gpu`` path (forced; skipped with
   a note when its fp32 im2col matrix would exceed ``generic_max_gb``).
4. with ``residual``: times ``beta=1`` with a residual against ``beta=0``, the overhead being the
   median over :data:`RESIDUAL_ROUNDS` alternating pairs.

:func:`run_queued` runs the suites; :func:`run_sustained` is the sustained pass
(:func:`bench_sustained`, shapes of at least :data:`~.timing.SUSTAIN_MIN_MS`), which the command
line runs after every queued number of the run. :func:`host_overhead_us` is the
host time per call (printed in the header). Suites are module-level data: add a list to
:data:`SUITES` to extend the benchmark.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Dict, List, Optional

import numpy as np

from .ceilings import Ceilings
from .environment import np_dtype
from .timing import (L2_BYTES, SUSTAIN_MIN_MS, SUSTAIN_S, gpu_state_text, sustained_pair, time_calls,
                     time_graph)

__all__ = ["Shape", "SUITES", "RESIDUAL_SUITES", "RESIDUAL_ROUNDS", "TOLERANCE", "flops_bytes", "check_first_image",
           "shape_data", "cudnn_conv2d", "bench_shape", "bench_sustained", "host_overhead_us", "summary_line",
           "sustained_line", "geomean_lines", "run_queued", "run_sustained"]


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

#: Alternating (beta = 0, beta = 1) timing pairs per shape; the residual overhead is their median
#: (the two times drift together over seconds with clocks and heat, their ratio less so).
RESIDUAL_ROUNDS = 3
#: Suites whose shapes get the residual (beta=1 vs beta=0) comparison with ``--residual auto``.
RESIDUAL_SUITES = ("vae_unet",)
#: Relative norm error the check accepts, per dtype.
TOLERANCE = {"float16": 2e-3, "bfloat16": 1.5e-2, "float32": 1e-4, "float64": 1e-10}
#: The check's bound for float32 data at precision "tf32" (one TF32 product per term: operands keep 10
#: mantissa bits; about 1e-3 of a layer's result).
TF32_TOLERANCE = 5e-3


def check_bound(dtype: str, precision=None) -> float:
    """The relative error a checked result of ``dtype`` computed at ``precision`` may have."""
    return TF32_TOLERANCE if precision == "tf32" else TOLERANCE[dtype]
#: Reference work (output elements x reduction length) above which the check covers output rows only.
CHECK_BUDGET = 2e9


def flops_bytes(s: Shape, itemsize: int, residual: bool = False):
    """(FLOPs, minimum bytes moved: x, w, out and the residual once each, (P, Q)) of a shape."""
    P = (s.H + 2 * s.pad - s.filter) // s.stride + 1
    Q = (s.W + 2 * s.pad - s.filter) // s.stride + 1
    M = s.N * P * Q
    flops = 2 * M * s.K * s.filter * s.filter * s.C
    nbytes = (s.N * s.H * s.W * s.C + s.K * s.filter * s.filter * s.C + M * s.K * (2 if residual else 1)) * itemsize
    return flops, nbytes, (P, Q)


def check_first_image(s: Shape, x0, w, y0) -> tuple:
    """(relative error, scope) of cuconv's first image ``y0`` (or its first output rows) against the
    reference on ``x0`` (the matching input crop where only rows are checked)."""
    import cuconv.reference as reference
    _, _, (P, Q) = flops_bytes(s, 2)
    gemm_k = s.filter * s.filter * s.C
    if P * Q * s.K * gemm_k <= CHECK_BUDGET:
        ref = reference.conv2d(x0, w, stride=s.stride, padding=s.pad)
        got, scope = y0, "first image"
    else:  # first `rows` output rows of image 0, from the matching input crop
        rows = max(1, min(P, int(CHECK_BUDGET // (Q * s.K * gemm_k))))
        hc = min(s.H, (rows - 1) * s.stride + s.filter - s.pad)
        pad_hi = max(0, (rows - 1) * s.stride + s.filter - hc - s.pad)
        ref = reference.conv2d(x0[:, :hc], w, stride=s.stride, padding=((s.pad, pad_hi), (s.pad, s.pad)))[:, :rows]
        got, scope = y0[:, :rows], f"first image, output rows 0..{rows - 1} of {P}"
    got = np.asarray(got, dtype=np.float64)
    if not np.all(np.isfinite(got)):
        return float("inf"), scope
    return float(np.linalg.norm(got - ref) / max(np.linalg.norm(ref), 1e-30)), scope


def shape_data(s: Shape, dtype: str):
    """Inputs (rotated over enough copies that x + out exceed twice the L2), filter and outputs of a
    shape: random normal made on the GPU, the filter scaled so that outputs stay O(1)."""
    import cupy as cp
    dt = np_dtype(dtype)
    _, _, (P, Q) = flops_bytes(s, 2)
    x_bytes = s.N * s.H * s.W * s.C * 2
    sets = max(1, min(8, math.ceil(2 * L2_BYTES / max(1, x_bytes + s.N * P * Q * s.K * 2))))
    xs = [cp.random.standard_normal((s.N, s.H, s.W, s.C), dtype=cp.float32).astype(dt) for _ in range(sets)]
    w = (cp.random.standard_normal((s.K, s.filter, s.filter, s.C), dtype=cp.float32)
         / math.sqrt(s.filter * s.filter * s.C)).astype(dt)
    outs = [cp.empty((s.N, P, Q, s.K), dtype=dt) for _ in range(sets)]
    return xs, w, outs


def cudnn_conv2d(xs, w, dtype: str, **kw):
    """torch's conv2d (cuDNN, autotuned) on NCHW views of the same arrays (channels_last memory) as
    ``f(i)`` over the input copies; ImportError without torch."""
    import torch
    torch.backends.cudnn.benchmark = True
    txs = [torch.from_dlpack(x).permute(0, 3, 1, 2) for x in xs]
    tw = torch.from_dlpack(w).permute(0, 3, 1, 2)
    tdt = {"float16": torch.float16, "bfloat16": torch.bfloat16}[dtype]
    assert txs[0].dtype == tdt and txs[0].is_contiguous(memory_format=torch.channels_last)
    return lambda i: torch.nn.functional.conv2d(txs[i], tw, **kw)


def bench_shape(s: Shape, dtype: str, runs: int = 20, with_torch: bool = True, with_generic: bool = True,
                generic_max_gb: float = 2.0, residual: bool = False, log=print) -> dict:
    """Check, then time one shape (steps 1-4 of the module docstring); returns its JSON record."""
    import cupy as cp

    import cuconv
    flops, nbytes, (P, Q) = flops_bytes(s, 2)
    xs, w, outs = shape_data(s, dtype)
    sets = len(xs)
    kw = dict(stride=s.stride, padding=s.pad)
    rec = dict(name=s.name, shape=asdict(s), dtype=dtype, flops=flops, bytes=nbytes, ms={}, notes=[])
    explanation = cuconv.explain(xs[0], w, **kw)
    rec["kernel"], rec["detail"] = explanation.kernel, explanation.detail

    outs[0].fill(float("nan"))
    cuconv.conv2d(xs[0], w, out=outs[0], **kw)
    cp.cuda.Device().synchronize()
    err, scope = check_first_image(s, cp.asnumpy(xs[0][:1]), cp.asnumpy(w), cp.asnumpy(outs[0][:1]))
    rec.update(rel_error=err, check_scope=scope, check_ok=bool(err <= TOLERANCE[dtype]))
    if not rec["check_ok"]:
        log(f"  CHECK FAILED {s.name} {dtype}: rel error {err:.3g} ({scope})")
        return rec

    def call(i):
        return cuconv.conv2d(xs[i], w, out=outs[i], **kw)

    rec["ms"]["cuconv"] = time_calls(call, sets, runs)
    rec["ms"]["cuconv_isolated"] = time_calls(call, sets, runs, queued=False)
    try:
        rec["ms"]["cuconv_graph"] = time_graph(call, sets, runs)
    except Exception as e:
        rec["notes"].append(f"graph timing failed: {type(e).__name__}: {e}")
    if with_torch:
        _time_cudnn(rec, xs, w, outs, dtype, runs, kw)
    a_gb = s.N * P * Q * s.filter * s.filter * s.C * 4 / 2 ** 30
    if with_generic and a_gb <= generic_max_gb:
        rec["ms"]["generic"] = time_calls(lambda i: cuconv.conv2d(xs[i], w, out=outs[i], kernel="generic_gpu", **kw),
                                          sets, max(5, runs // 4), warmup=1)
    elif with_generic:
        rec["notes"].append(f"generic_gpu skipped: its fp32 im2col matrix would be {a_gb:.1f} GiB")
    if residual:
        _time_residual(rec, s, dtype, xs, w, outs, runs, kw)
    return rec


def _time_cudnn(rec, xs, w, outs, dtype, runs, kw):
    try:
        import torch
        f = cudnn_conv2d(xs, w, dtype, **kw)
        with torch.no_grad():
            ref_t = f(0)
            diff = (ref_t.permute(0, 2, 3, 1).float() - torch.from_dlpack(outs[0]).float()).norm()
            rec["rel_diff_vs_cudnn"] = float(diff / ref_t.float().norm())
            rec["ms"]["cudnn"] = time_calls(f, len(xs), runs, torch_events=True)
            rec["ms"]["cudnn_isolated"] = time_calls(f, len(xs), runs, torch_events=True, queued=False)
    except ImportError:
        rec["notes"].append("torch is not installed: no cuDNN comparison")
    except Exception as e:  # keep the benchmark going; say why
        rec["notes"].append(f"cuDNN comparison failed: {type(e).__name__}: {e}")


def _time_residual(rec, s, dtype, xs, w, outs, runs, kw):
    import cupy as cp

    import cuconv
    import cuconv.reference as reference
    sets = len(xs)
    _, _, (P, Q) = flops_bytes(s, 2)
    cp.get_default_memory_pool().free_all_blocks()
    res = [cp.random.standard_normal((s.N, P, Q, s.K), dtype=cp.float32).astype(np_dtype(dtype))
           for _ in range(sets)]

    def call0(i):
        return cuconv.conv2d(xs[i], w, residual=res[i], beta=0.0, out=outs[i], **kw)

    def call1(i):
        return cuconv.conv2d(xs[i], w, residual=res[i], beta=1.0, out=outs[i], **kw)

    for suffix, timer in (("", time_calls), ("_graph", time_graph)):
        try:
            pairs = [(timer(call0, sets, runs), timer(call1, sets, runs)) for _ in range(RESIDUAL_ROUNDS)]
        except Exception as e:
            rec["notes"].append(f"residual timing{suffix.replace('_', ' ')} failed: {type(e).__name__}: {e}")
            continue
        rec["ms"][f"cuconv{suffix}_beta0"] = float(np.median([b0 for b0, _ in pairs]))
        rec["ms"][f"cuconv{suffix}_beta1"] = float(np.median([b1 for _, b1 in pairs]))
        rec[f"residual_overhead{suffix}"] = float(np.median([b1 / b0 - 1.0 for b0, b1 in pairs]))
    if P * Q * s.K * s.filter * s.filter * s.C <= CHECK_BUDGET:  # the residual path on the first image
        y = cuconv.conv2d(xs[0][:1], w, residual=res[0][:1], beta=1.0, **kw)
        ref = reference.conv2d(cp.asnumpy(xs[0][:1]), cp.asnumpy(w), residual=cp.asnumpy(res[0][:1]), **kw)
        got = cp.asnumpy(y).astype(np.float64)
        rec["residual_rel_error"] = float(np.linalg.norm(got - ref) / np.linalg.norm(ref))


def bench_sustained(s: Shape, dtype: str, est_ms: float, with_torch: bool = True) -> Dict[str, object]:
    """The sustained numbers of one conv2d shape (:func:`~.timing.sustained_pair`), on fresh data."""
    import cuconv
    xs, w, outs = shape_data(s, dtype)
    kw = dict(stride=s.stride, padding=s.pad)
    cudnn_call = None
    if with_torch:
        try:
            cudnn_call = cudnn_conv2d(xs, w, dtype, **kw)
        except ImportError:
            pass
    return sustained_pair(lambda i: cuconv.conv2d(xs[i], w, out=outs[i], **kw), cudnn_call, len(xs), est_ms)


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
    for fn in fns.values():
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


def summary_line(rec: dict, ceilings: Optional[Ceilings] = None) -> str:
    """The printed lines of one record: queued time, TFLOP/s, TB/s, % of the roof it is bound by
    (named: datasheet, GEMM or copy), ratio to cuDNN; graph and isolated times; residual overhead."""
    nan = float("nan")
    t = rec["ms"].get("cuconv")
    if t is None:
        return f"{rec['name']:<34} {rec['dtype']:<8} check failed (rel error {rec.get('rel_error', nan):.3g})"
    tflops = rec["flops"] / (t * 1e-3) / 1e12
    tbps = rec["bytes"] / (t * 1e-3) / 1e12
    frac, roof = (ceilings or Ceilings()).fraction(rec["flops"], rec["bytes"], t)
    pct = f"{100 * frac:5.1f}% of {roof}" if frac is not None else "no roof known"
    cud, gen = rec["ms"].get("cudnn"), rec["ms"].get("generic")
    ratio = f"{cud / t:6.2f}x" if cud else "     -"
    line = (f"{rec['name']:<34} {rec['dtype']:<8} {t:8.3f} ms {tflops:7.1f} TF/s {tbps:5.2f} TB/s "
            f"{pct:<20} vs cuDNN {ratio}  cuDNN {cud or nan:7.3f} ms  generic {gen or nan:8.3f} ms")
    tg = rec["ms"].get("cuconv_graph")
    if tg:
        line += (f"\n{'':<43} kernel (graph) {tg:8.3f} ms {rec['flops'] / (tg * 1e-3) / 1e12:7.1f} TF/s "
                 f"{rec['bytes'] / (tg * 1e-3) / 1e12:5.2f} TB/s  vs cuDNN {(cud / tg if cud else nan):5.2f}x")
    ti, ci = rec["ms"].get("cuconv_isolated"), rec["ms"].get("cudnn_isolated")
    if ti:
        line += (f"\n{'':<43} isolated call {ti:8.3f} ms (host work not overlapped)  cuDNN {ci or nan:7.3f} ms"
                 f"  vs cuDNN {(ci / ti if ci else nan):5.2f}x")
    if "residual_overhead" in rec:
        line += f"  beta1/beta0 call {100 * rec['residual_overhead']:+.1f}%"
    if "residual_overhead_graph" in rec:
        line += f" graph {100 * rec['residual_overhead_graph']:+.1f}%"
    return line


def sustained_line(rec: dict) -> str:
    """The printed line of one record's sustained numbers, with clock and power where known."""
    t, c = rec["ms"]["cuconv_sustained"], rec["ms"].get("cudnn_sustained")
    gpu = rec.get("sustained_gpu", {})
    line = f"{rec['name']:<34} {rec['dtype']:<8} sustained {t:8.3f} ms{gpu_state_text(gpu, 'cuconv')}"
    if c:
        line += f"  cuDNN {c:8.3f} ms{gpu_state_text(gpu, 'cudnn')}  vs cuDNN {c / t:5.2f}x"
    return line


def geomean_lines(records: List[dict]) -> List[str]:
    """Geometric-mean speed relative to cuDNN of each timing kind (queued, graph, isolated, sustained)."""
    lines = []
    for key, ref in (("cuconv", "cudnn"), ("cuconv_graph", "cudnn"), ("cuconv_isolated", "cudnn_isolated"),
                     ("cuconv_sustained", "cudnn_sustained")):
        ratios = [r["ms"][ref] / r["ms"][key] for r in records if ref in r["ms"] and key in r["ms"]]
        if ratios:
            geo = math.exp(sum(math.log(v) for v in ratios) / len(ratios))
            lines.append(f"geomean speed vs cuDNN ({key}): {geo:.3f}x over {len(ratios)} shape/dtype pairs "
                         f"(min {min(ratios):.2f}x)")
    return lines


def run_queued(suites: List[str], dtypes: List[str], runs: int, *, with_torch: bool, with_generic: bool,
               generic_max_gb: float, residual: str, ceilings: Optional[Ceilings] = None, log=print) -> List[dict]:
    """Every shape of ``suites`` in every dtype (:func:`bench_shape`); the records, each with its
    ``suite``. ``residual``: ``"auto"`` (the :data:`RESIDUAL_SUITES`), ``"all"`` or ``"none"``."""
    import cupy as cp
    records = []
    for suite in suites:
        log(f"== suite {suite}")
        for s in SUITES[suite]:
            for dt in dtypes:
                with_res = residual == "all" or (residual == "auto" and suite in RESIDUAL_SUITES)
                rec = bench_shape(s, dt, runs=runs, with_torch=with_torch, with_generic=with_generic,
                                  generic_max_gb=generic_max_gb, residual=with_res, log=log)
                rec["suite"] = suite
                records.append(rec)
                log(summary_line(rec, ceilings))
                cp.get_default_memory_pool().free_all_blocks()
    return records


def run_sustained(records: List[dict], *, with_torch: bool, log=print) -> None:
    """The sustained pass over the records of at least :data:`~.timing.SUSTAIN_MIN_MS` (adds
    ``cuconv_sustained`` / ``cudnn_sustained`` and ``sustained_gpu`` to each). It runs after every
    queued number of the run: a GPU that just ran at its power limit for seconds is hot, and would
    slow the queued runs after it."""
    import cupy as cp
    long_ones = [r for r in records if r["ms"].get("cuconv", 0.0) >= SUSTAIN_MIN_MS]
    if long_ones:
        log(f"== sustained (back to back, {SUSTAIN_S:g} s per library and round, shapes >= {SUSTAIN_MIN_MS} ms)")
    for rec in long_ones:
        sus = bench_sustained(Shape(**rec["shape"]), rec["dtype"], rec["ms"]["cuconv"], with_torch=with_torch)
        rec["ms"]["cuconv_sustained"] = sus["cuconv"]
        if "cudnn" in sus:
            rec["ms"]["cudnn_sustained"] = sus["cudnn"]
        rec["sustained_gpu"] = sus["gpu"]
        log(sustained_line(rec))
        cp.get_default_memory_pool().free_all_blocks()
