"""The sm80 suite: the sm_80+ kernel (``sm80_igemm``) and ``cuconv.matmul``, against cuDNN and cuBLAS.

Cases (each checked against the reference on its first image before it is timed):

* ResNet stem    N=64, C=3, 224x224 -> K=64, 7x7, stride 2, pad 3     (the pad_channels sub-path)
* ResNeXt-50     N=64, C=K=128, groups=32, 56x56, 3x3, pad 1           (grouped_mma: block-diagonal mma)
* MobileNet dw   N=64, C=K=256, groups=256, 56x56, 3x3, pad 1          (grouped_mma, depthwise)
* matmul 8192^3  ``cuconv.matmul`` against ``cupy.matmul`` (cuBLAS)
* ResNet-50      the dense shapes of ``SUITES["resnet50"]`` with ``sm80_igemm`` forced, next to the
                 Hopper kernel ``sm90_tma`` (where it accepts the shape) and cuDNN.

An A/B within the suite: each of the first three cases also runs with its sub-path forced to the
general ``per_lane`` loader (:data:`GENERAL_SUBPATH`, through ``cuconv.overrides(sm80_subpath=...)``),
which shows what the dedicated sub-path gains over the loader that serves any shape.

The kernel time (``sm80_igemm``) is the median of CUDA-graph replays (:func:`~.timing.time_graph`),
GPU time without cuconv's per-call host work; ``sm80_igemm (call)`` is the queued per-call time,
measured like cuDNN's. cuBLAS cannot be captured in a graph by CuPy, so the matmul case times both
libraries per call (host work is negligible next to a product of over a millisecond).
"""

from __future__ import annotations

import math
from typing import List

import numpy as np

from .conv2d import SUITES
from .environment import np_dtype
from .timing import L2_BYTES, time_calls, time_graph

__all__ = ["CONV_CASES", "GENERAL_SUBPATH", "TOLERANCE", "conv_case", "matmul_case", "result_line", "run", "check_ok"]

#: (label, N, C, H, W, K, filter, stride, pad, groups)
CONV_CASES = [
    ("resnet stem", 64, 3, 224, 224, 64, 7, 2, 3, 1),
    ("resnext50 grouped 3x3", 64, 128, 56, 56, 128, 3, 1, 1, 32),
    ("depthwise 3x3", 64, 256, 56, 56, 256, 3, 1, 1, 256),
]

#: The general sub-path each case also runs on (the A/B of the module docstring).
GENERAL_SUBPATH = {"resnet stem": "per_lane", "resnext50 grouped 3x3": "per_lane", "depthwise 3x3": "per_lane"}

#: Relative norm error the check accepts, per dtype.
TOLERANCE = {"float16": 5e-3, "bfloat16": 2e-2}


def conv_case(label, N, C, H, W, K, f, stride, pad, groups, dtype, runs, kernels, with_torch=True,
              log=print) -> dict:
    """Check, then time one conv2d case on each of ``kernels`` (forced) and cuDNN; returns its record."""
    import cupy as cp

    import cuconv
    ndt = np_dtype(dtype)
    P = (H + 2 * pad - f) // stride + 1
    Q = (W + 2 * pad - f) // stride + 1
    flops = 2 * N * P * Q * K * f * f * (C // groups)
    nbytes = (N * H * W * C + K * f * f * (C // groups) + N * P * Q * K) * 2
    sets = max(1, min(4, math.ceil(2 * L2_BYTES / nbytes)))
    xs = [cp.random.standard_normal((N, H, W, C), dtype=cp.float32).astype(ndt) for _ in range(sets)]
    w = cp.random.standard_normal((K, f, f, C // groups), dtype=cp.float32) / math.sqrt(f * f * C / groups)
    w = w.astype(ndt)
    outs = [cp.empty((N, P, Q, K), dtype=ndt) for _ in range(sets)]
    kw = dict(stride=stride, padding=pad, groups=groups)
    row = dict(name=label, dtype=dtype, flops=flops, bytes=nbytes, ms={}, notes=[], detail={})
    for kern in kernels:
        try:
            e = cuconv.explain(xs[0], w, kernel=kern, **kw)
        except cuconv.KernelDeclined as ex:
            row["notes"].append(f"{kern} declines: {str(ex)[:120]}")
            continue
        outs[0].fill(float("nan"))
        cuconv.conv2d(xs[0], w, out=outs[0], kernel=kern, **kw)
        ref = cuconv.reference.conv2d(cp.asnumpy(xs[0][:1]), cp.asnumpy(w), **kw)
        got = cp.asnumpy(outs[0][:1]).astype(np.float64)
        err = float(np.linalg.norm(got - ref) / np.linalg.norm(ref)) if np.all(np.isfinite(got)) else float("inf")
        if not err <= TOLERANCE[dtype]:
            row["notes"].append(f"{kern}: CHECK FAILED rel error {err:.3g}")
            continue
        row["detail"][kern] = e.detail
        row["ms"][kern] = time_graph(lambda i: cuconv.conv2d(xs[i], w, out=outs[i], kernel=kern, **kw), sets, runs)
        row["ms"][kern + " (call)"] = time_calls(lambda i: cuconv.conv2d(xs[i], w, out=outs[i], kernel=kern, **kw),
                                                 sets, runs)
    if with_torch:
        try:
            import torch
            torch.backends.cudnn.benchmark = True
            F = torch.nn.functional.conv2d
            txs = [torch.from_dlpack(x).permute(0, 3, 1, 2) for x in xs]
            tw = torch.from_dlpack(w).permute(0, 3, 1, 2)
            with torch.no_grad():
                row["ms"]["cudnn"] = time_calls(lambda i: F(txs[i], tw, stride=stride, padding=pad, groups=groups),
                                                sets, runs, torch_events=True)
        except Exception as ex:  # torch is optional
            row["notes"].append(f"no cuDNN timing: {type(ex).__name__}: {ex}")
    log(result_line(row))
    for kern, d in row["detail"].items():
        log(f"    {kern}: {d}")
    return row


def result_line(row) -> str:
    """The printed line of one record: each time with TFLOP/s and TB/s, the ratios of sm80_igemm."""
    parts = [f"{row['name']:<40} {row['dtype']:<8}"]
    for k, t in row["ms"].items():
        parts.append(f"{k} {t:.3f} ms ({row['flops'] / t / 1e9:.0f} TF/s, {row['bytes'] / t / 1e9:.2f} TB/s)")
    s80 = row["ms"].get("sm80_igemm")
    for other in ("cudnn", "sm90_tma", "cupy.matmul"):
        if s80 and other in row["ms"]:
            parts.append(f"sm80 vs {other}: {row['ms'][other] / s80:.2f}x")
    parts += row["notes"]
    return " | ".join(parts)


def matmul_case(n, dtype, runs, log=print) -> dict:
    """``cuconv.matmul`` against ``cupy.matmul`` (cuBLAS) on ``n x n`` matrices, checked on 64 rows."""
    import cupy as cp

    import cuconv
    ndt = np_dtype(dtype)
    a = [cp.random.standard_normal((n, n), dtype=cp.float32).astype(ndt) for _ in range(2)]
    b = (cp.random.standard_normal((n, n), dtype=cp.float32) / math.sqrt(n)).astype(ndt)
    out = [cp.empty((n, n), dtype=ndt) for _ in range(2)]
    row = dict(name=f"matmul {n}^3", dtype=dtype, flops=2 * n ** 3, bytes=3 * n * n * 2, ms={}, notes=[])
    ref = cp.asnumpy(a[0][:64]).astype(np.float64) @ cp.asnumpy(b).astype(np.float64)
    got = cp.asnumpy(cuconv.matmul(a[0][:64], b)).astype(np.float64)
    err = float(np.linalg.norm(got - ref) / np.linalg.norm(ref))
    if not err <= TOLERANCE["bfloat16"]:
        row["notes"].append(f"CHECK FAILED rel error {err:.3g}")
        log(result_line(row))
        return row
    row["ms"]["sm80_igemm"] = time_calls(lambda i: cuconv.matmul(a[i], b, out=out[i]), 2, runs)
    row["ms"]["cupy.matmul"] = time_calls(lambda i: cp.matmul(a[i], b, out=out[i]), 2, runs)
    log(result_line(row))
    return row


def run(dtypes: List[str], runs: int, *, with_torch: bool, resnet: bool = True, log=print) -> List[dict]:
    """Every case in every dtype: the three conv cases and their ``per_lane`` A/B, the matmul, and
    (``resnet``) the dense ResNet-50 shapes forced onto ``sm80_igemm``; the records."""
    import cupy as cp

    import cuconv
    log("== suite sm80 (kernel times from CUDA-graph replays)")
    rows = []
    for dtype in dtypes:
        for case in CONV_CASES:
            rows.append(conv_case(*case, dtype, runs, ["sm80_igemm"], with_torch, log))
            cp.get_default_memory_pool().free_all_blocks()
            general = GENERAL_SUBPATH.get(case[0])
            if general:
                with cuconv.overrides(sm80_subpath=general):
                    rows.append(conv_case(f"{case[0]} [{general} forced]", *case[1:], dtype, runs, ["sm80_igemm"],
                                          with_torch, log))
                cp.get_default_memory_pool().free_all_blocks()
        rows.append(matmul_case(8192, dtype, runs, log))
        cp.get_default_memory_pool().free_all_blocks()
        if not resnet:
            continue
        log(f"== resnet50 (dense) forced, {dtype}: sm80_igemm vs sm90_tma vs cuDNN")
        ratios = []
        for s in SUITES["resnet50"]:
            r = conv_case(s.name, s.N, s.C, s.H, s.W, s.K, s.filter, s.stride, s.pad, 1, dtype, runs,
                          ["sm80_igemm", "sm90_tma"], with_torch, log)
            if "sm80_igemm" in r["ms"] and "sm90_tma" in r["ms"]:
                ratios.append(r["ms"]["sm90_tma"] / r["ms"]["sm80_igemm"])
            rows.append(r)
            cp.get_default_memory_pool().free_all_blocks()
        if ratios:
            geo = math.exp(sum(map(math.log, ratios)) / len(ratios))
            log(f"geomean sm80 speed relative to sm90_tma: {geo:.3f}x over {len(ratios)} shapes")
    return rows


def check_ok(row: dict) -> bool:
    """False when any check of the record failed."""
    return "CHECK FAILED" not in " ".join(row["notes"])
