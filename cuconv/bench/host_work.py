"""Host work per call: how fast the host issues one convolution on each path.

``python -m cuconv.bench.host_work`` calls a tiny layer of each path (its GPU time is a few
microseconds, so the GPU never holds the host back) a few thousand times without synchronising, and
prints microseconds per call for:

* ``conv2d``: ``cuconv.conv2d(x, w, ...)`` (a new output each call);
* ``conv2d out=``: the same writing into a given output;
* ``plan``: a :func:`cuconv.plan_conv2d` plan called with ``out=``;
* ``plan.run``: the kernel plan's launch alone (what every path above ends with; channels-last cases).

The channels-first cases (``layout="NCHW"``) add the move of ``x`` and ``w`` to channels-last: one
launch for both (:func:`cuconv.layout.operands_to_channels_last`), none for a 1x1 filter.

Then the gradients (:data:`GRAD_CASES`): the input gradient at stride 1 and 2 (3x3, and a 1x1 filter),
the weight gradient and a transposed convolution, each a signature called again (cuconv.grad_replay).

A forward pass runs back to back at the host's pace wherever a layer's GPU time is shorter than its
host work. The figures depend on the host CPU: ``cupy.empty`` of a small array is printed as a yardstick.
Needs a GPU (exit 2 without one).

``--python-only`` needs no GPU: the channels-last cases on NumPy arrays of the same shapes, with the
plan's run replaced by a no-op, so what is timed is cuconv's own Python layer of a repeated call (the
signature, the memo lookup, the replay or the general repeat path, the output allocation with
``numpy.empty`` as the yardstick). CuPy's attribute reads, its allocator and the driver's launch are not
in it.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import List, Optional

#: (label, x shape, w shape, conv2d keywords): one small layer per path (NHWC unless a layout is given).
CASES = [
    ("depthwise 3x3 (depthwise_direct)", (1, 8, 8, 64), (64, 3, 3, 1), dict(padding=1, groups=64)),
    ("dense 3x3 (sm90_tma)", (1, 8, 8, 64), (64, 3, 3, 64), dict(padding=1)),
    ("dense 3x3, geometry as tuples (sm90_tma)", (1, 8, 8, 64), (64, 3, 3, 64),
     dict(stride=(1, 1), padding=((1, 1), (1, 1)), dilation=(1, 1))),
    ("1x1 (sm90_tma)", (1, 8, 8, 64), (64, 1, 1, 64), dict()),
    ("grouped 3x3, 4 channels per group (grouped_mma)", (1, 8, 8, 128), (128, 3, 3, 4), dict(padding=1, groups=32)),
    ("1x1 96 -> 4 (sm80 pointwise)", (1, 1, 1, 96), (4, 1, 1, 96), dict()),
    ("stem C=3 (sm80 pad_channels)", (1, 16, 16, 3), (32, 3, 3, 3), dict(padding=1, stride=2)),
    ("dense 3x3, NCHW (sm90_tma)", (1, 64, 8, 8), (64, 64, 3, 3), dict(padding=1, layout="NCHW")),
    ("1x1, NCHW (sm90_tma)", (1, 64, 8, 8), (64, 64, 1, 1), dict(layout="NCHW")),
]


#: (label, function, operand names, keywords): gradient calls of the same tiny size (NHWC fp16, 64
#: channels, 8x8 input), each signature repeated as a training step repeats it (cuconv.grad_replay).
GRAD_CASES = [
    ("input gradient 3x3 stride 1", "conv2d_input_grad", ("dy", "w", "x_shape"), dict(padding=1)),
    ("input gradient 3x3 stride 2", "conv2d_input_grad", ("dy2", "w", "x_shape"), dict(padding=1, stride=2)),
    ("input gradient 1x1 stride 2", "conv2d_input_grad", ("dy2", "w1", "x_shape"), dict(stride=2)),
    ("weight gradient 3x3", "conv2d_weight_grad", ("x", "dy", "w_shape"), dict(padding=1)),
    ("conv_transpose2d 2x2 stride 2", "conv_transpose2d", ("x", "wt"), dict(stride=2)),
]


def per_call_us(fn, calls: int, runs: int = 1, gpu: bool = True) -> float:
    """Microseconds per call of ``fn`` issued back to back, after a warm-up: the best of ``runs`` runs of
    ``calls`` calls (with ``gpu``, the device synchronised before and after each run)."""
    sync = None
    if gpu:
        import cupy as cp
        sync = cp.cuda.Device().synchronize
    for _ in range(50):
        fn()
    best = float("inf")
    for _ in range(runs):
        if sync:
            sync()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, time.perf_counter() - start)
        if sync:
            sync()
    return best / calls * 1e6


def measure(calls: int = 3000, log=print) -> List[dict]:
    """One record per case: its kernel and the four per-call figures (microseconds)."""
    import cupy as cp

    import cuconv
    log(f"cupy.empty (yardstick): {per_call_us(lambda: cp.empty((1, 8, 8, 64), cp.float16), calls):6.2f} us")
    log(f"{'layer':50s} {'kernel':18s} {'conv2d':>8s} {'out=':>8s} {'plan':>8s} {'plan.run':>9s}  (us per call)")
    records = []
    for label, xs, ws, kw in CASES:
        x, w = cp.zeros(xs, cp.float16), cp.zeros(ws, cp.float16)
        e = cuconv.explain(x, w, **kw)
        out = cp.empty_like(cuconv.conv2d(x, w, **kw))
        plan = cuconv.plan_conv2d(x, w, **kw)
        channels_last = "layout" not in kw
        rec = dict(label=label, kernel=e.kernel,
                   conv2d=per_call_us(lambda: cuconv.conv2d(x, w, **kw), calls),
                   conv2d_out=per_call_us(lambda: cuconv.conv2d(x, w, out=out, **kw), calls),
                   plan=per_call_us(lambda: plan(x, w, out=out), calls),
                   plan_run=per_call_us(lambda: e.plan.run(x, w, None, None, out), calls) if channels_last else None)
        run = f"{rec['plan_run']:9.2f}" if channels_last else f"{'-':>9s}"
        log(f"{label:50s} {e.kernel:18s} {rec['conv2d']:8.2f} {rec['conv2d_out']:8.2f} {rec['plan']:8.2f} {run}")
        records.append(rec)
    z = {name: cp.zeros(shape, cp.float16) for name, shape in (
        ("x", (1, 8, 8, 64)), ("dy", (1, 8, 8, 64)), ("dy2", (1, 4, 4, 64)), ("w", (64, 3, 3, 64)),
        ("w1", (64, 1, 1, 64)), ("wt", (64, 2, 2, 64)))}
    z.update(x_shape=(1, 8, 8, 64), w_shape=(64, 3, 3, 64))
    for label, fn, names, kw in GRAD_CASES:
        args = [z[n] for n in names]
        us = per_call_us(lambda: getattr(cuconv, fn)(*args, **kw), calls)
        log(f"{label:50s} {'(gradient)':18s} {us:8.2f}")
        records.append(dict(label=label, kernel="gradient", conv2d=us))
    return records


def measure_python_only(calls: int = 20000, log=print) -> List[dict]:
    """The ``--python-only`` figures (module docstring): microseconds per call, NumPy operands, the plan's
    run a no-op."""
    import numpy as np

    import cuconv
    from cuconv.backends.cpu import CPUPlan
    log(f"numpy.empty (yardstick): {per_call_us(lambda: np.empty((1, 8, 8, 64), np.float16), calls, 5, False):6.3f} us")
    log(f"{'layer (NumPy operands, the run a no-op)':50s} {'conv2d':>8s} {'out=':>8s} {'plan':>8s}  (us per call)")
    run, records = CPUPlan.run, []
    CPUPlan.run = lambda self, x, w, bias, residual, out: None
    try:
        for label, xs, ws, kw in CASES:
            if "layout" in kw:
                continue
            x, w = np.zeros(xs, np.float16), np.zeros(ws, np.float16)
            out = np.empty_like(cuconv.conv2d(x, w, **kw))
            plan = cuconv.plan_conv2d(x, w, **kw)
            rec = dict(label=label, conv2d=per_call_us(lambda: cuconv.conv2d(x, w, **kw), calls, 5, False),
                       conv2d_out=per_call_us(lambda: cuconv.conv2d(x, w, out=out, **kw), calls, 5, False),
                       plan=per_call_us(lambda: plan(x, w, out=out), calls, 5, False))
            log(f"{label:50s} {rec['conv2d']:8.3f} {rec['conv2d_out']:8.3f} {rec['plan']:8.3f}")
            records.append(rec)
    finally:
        CPUPlan.run = run
    return records


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m cuconv.bench.host_work", description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=3000, help="calls per figure (default 3000)")
    ap.add_argument("--python-only", action="store_true",
                    help="no GPU: time cuconv's Python layer of a repeated call on NumPy operands (the run a no-op)")
    args = ap.parse_args(argv)
    if args.calls < 100:
        ap.error(f"--calls: at least 100, got {args.calls}")
    if args.python_only:
        measure_python_only(max(args.calls, 1000))
        return 0
    from .environment import EXIT_UNAVAILABLE, Unavailable, require_gpu
    try:
        require_gpu()
    except Unavailable as e:
        print(f"cuconv.bench.host_work: {e}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    measure(args.calls)
    return 0


if __name__ == "__main__":
    sys.exit(main())
