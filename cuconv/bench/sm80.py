"""Benchmark of the sm_80+ kernel (``sm80_igemm``) and ``cuconv.matmul``: ``python -m cuconv.bench_sm80``.

Cases (bf16 by default; each checked against the reference on its first image before timing):

* ResNet stem    N=64, C=3, 224x224 -> K=64, 7x7, stride 2, pad 3     (pad_channels: C 3 -> 4 pre-pass + per_lane)
* ResNeXt-50     N=64, C=K=128, groups=32, 56x56, 3x3, pad 1           (grouped_mma: direct block-diagonal mma)
* MobileNet dw   N=64, C=K=256, groups=256, 56x56, 3x3, pad 1          (grouped_mma, depthwise)
* matmul 8192^3  ``cuconv.matmul`` vs ``cupy.matmul`` (cuBLAS)
* ResNet-50      the dense shapes of ``cuconv.bench.SUITES["resnet50"]``, ``sm80_igemm`` forced, with its
                 ratio to the Hopper kernel ``sm90_tma`` (when that accepts) and to cuDNN (torch).

Timing is :mod:`cuconv.bench`'s: CUDA events, warm-up, median of >= 20 runs, inputs rotated past L2;
"kernel" is the median of CUDA-graph replays (GPU time without cuconv's per-call host work), each queued
behind the same L2-flushing memset as cuDNN's timed calls. Also run by ``python -m cuconv.bench --suite sm80``.
"""

from __future__ import annotations

import argparse
import math
import sys

import numpy as np

from .bench import SUITES, _time, _time_graph

__all__ = ["CONV_CASES", "main"]

#: (label, N, C, H, W, K, filter, stride, pad, groups)
CONV_CASES = [
    ("resnet stem", 64, 3, 224, 224, 64, 7, 2, 3, 1),
    ("resnext50 grouped 3x3", 64, 128, 56, 56, 128, 3, 1, 1, 32),
    ("depthwise 3x3", 64, 256, 56, 56, 256, 3, 1, 1, 256),
]

#: The sub-path each case runs as well as the automatic one, for the before/after comparison.
PREVIOUS_SUBPATH = {"resnet stem": "per_lane", "resnext50 grouped 3x3": "per_lane", "depthwise 3x3": "per_lane"}

L2_BYTES = 50 * 2 ** 20


def _np_dtype(dtype):
    import ml_dtypes
    return {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16}[dtype]


def _conv_case(label, N, C, H, W, K, f, stride, pad, groups, dtype, runs, kernels, log):
    import cupy as cp

    import cuconv
    ndt = _np_dtype(dtype)
    P = (H + 2 * pad - f) // stride + 1
    Q = (W + 2 * pad - f) // stride + 1
    flops = 2 * N * P * Q * K * f * f * (C // groups)
    nbytes = (N * H * W * C + K * f * f * (C // groups) + N * P * Q * K) * 2
    sets = max(1, min(4, math.ceil(2 * L2_BYTES / nbytes)))
    xs = [cp.random.standard_normal((N, H, W, C), dtype=cp.float32).astype(ndt) for _ in range(sets)]
    w = (cp.random.standard_normal((K, f, f, C // groups), dtype=cp.float32) / math.sqrt(f * f * C / groups)).astype(ndt)
    outs = [cp.empty((N, P, Q, K), dtype=ndt) for _ in range(sets)]
    kw = dict(stride=stride, padding=pad, groups=groups)
    row = dict(label=label, dtype=dtype, flops=flops, bytes=nbytes, ms={}, notes=[])
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
        tol = {"float16": 5e-3, "bfloat16": 2e-2}[dtype]
        if not err <= tol:
            row["notes"].append(f"{kern}: CHECK FAILED rel error {err:.3g}")
            continue
        row.setdefault("detail", {})[kern] = e.detail
        row["ms"][kern] = _time_graph(lambda i: cuconv.conv2d(xs[i], w, out=outs[i], kernel=kern, **kw), sets, runs)
        row["ms"][kern + " (call)"] = _time(lambda i: cuconv.conv2d(xs[i], w, out=outs[i], kernel=kern, **kw),
                                            sets, runs)
    try:
        import torch
        torch.backends.cudnn.benchmark = True
        F = torch.nn.functional.conv2d
        txs = [torch.from_dlpack(x).permute(0, 3, 1, 2) for x in xs]
        tw = torch.from_dlpack(w).permute(0, 3, 1, 2)
        with torch.no_grad():
            row["ms"]["cudnn"] = _time(lambda i: F(txs[i], tw, stride=stride, padding=pad, groups=groups), sets, runs,
                                       torch_events=True)
    except Exception as ex:  # torch is optional
        row["notes"].append(f"no cuDNN timing: {type(ex).__name__}: {ex}")
    log(_line(row))
    if "detail" in row:
        for kern, d in row["detail"].items():
            log(f"    {kern}: {d}")
    return row


def _line(row):
    parts = [f"{row['label']:<40} {row['dtype']:<8}"]
    for k, t in row["ms"].items():
        parts.append(f"{k} {t:.3f} ms ({row['flops'] / t / 1e9:.0f} TF/s, {row['bytes'] / t / 1e9:.2f} TB/s)")
    s80 = row["ms"].get("sm80_igemm")
    for other in ("cudnn", "sm90_tma", "cupy.matmul"):
        if s80 and other in row["ms"]:
            parts.append(f"sm80 vs {other}: {row['ms'][other] / s80:.2f}x")
    parts += row["notes"]
    return " | ".join(parts)


def _matmul_case(n, dtype, runs, log):
    import cupy as cp

    import cuconv
    ndt = _np_dtype(dtype)
    a = [cp.random.standard_normal((n, n), dtype=cp.float32).astype(ndt) for _ in range(2)]
    b = (cp.random.standard_normal((n, n), dtype=cp.float32) / math.sqrt(n)).astype(ndt)
    out = [cp.empty((n, n), dtype=ndt) for _ in range(2)]
    row = dict(label=f"matmul {n}^3", dtype=dtype, flops=2 * n ** 3, bytes=3 * n * n * 2, ms={}, notes=[])
    cuconv.matmul(a[0][:256], b, out=out[0][:256])
    ref = cp.asnumpy(a[0][:64]).astype(np.float64) @ cp.asnumpy(b).astype(np.float64)
    got = cp.asnumpy(cuconv.matmul(a[0][:64], b)).astype(np.float64)
    err = float(np.linalg.norm(got - ref) / np.linalg.norm(ref))
    if not err <= 2e-2:
        row["notes"].append(f"CHECK FAILED rel error {err:.3g}")
        log(_line(row))
        return row
    # cuBLAS cannot be captured in a CUDA graph by CuPy: both timed per call (host work is
    # negligible next to a 1+ ms product)
    row["ms"]["sm80_igemm"] = _time(lambda i: cuconv.matmul(a[i], b, out=out[i]), 2, runs)
    row["ms"]["cupy.matmul"] = _time(lambda i: cp.matmul(a[i], b, out=out[i]), 2, runs)
    log(_line(row))
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m cuconv.bench_sm80", description=__doc__.split("\n")[0])
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--skip-resnet", action="store_true", help="skip the forced ResNet-50 suite")
    ap.add_argument("--json", metavar="PATH", help="also write every row (times in ms, details, notes) as JSON")
    args = ap.parse_args(argv)
    runs = max(20, args.runs)
    import cupy as cp

    from .device import current_gpu
    dev = current_gpu()
    if dev is None:
        print("cuconv.bench_sm80: no GPU visible to CuPy", file=sys.stderr)
        return 2
    print(f"device: {dev.describe()}; {runs} runs, median; kernel times from CUDA-graph replays")
    rows = []
    from .backends.sm80 import forced_subpath
    for case in CONV_CASES:
        rows.append(_conv_case(*case, args.dtype, runs, ["sm80_igemm"], print))
        cp.get_default_memory_pool().free_all_blocks()
        old = PREVIOUS_SUBPATH.get(case[0])
        if old:  # the same shape on the sub-path it ran before the dedicated path existed
            with forced_subpath(old):
                r = _conv_case(f"{case[0]} [{old} forced]", *case[1:], args.dtype, runs, ["sm80_igemm"], print)
            rows.append(r)
            cp.get_default_memory_pool().free_all_blocks()
    rows.append(_matmul_case(8192, args.dtype, runs, print))
    cp.get_default_memory_pool().free_all_blocks()
    if not args.skip_resnet:
        print("== resnet50 (dense) forced: sm80_igemm vs sm90_tma vs cuDNN")
        ratios = []
        for s in SUITES["resnet50"]:
            r = _conv_case(s.name, s.N, s.C, s.H, s.W, s.K, s.filter, s.stride, s.pad, 1, args.dtype, runs,
                           ["sm80_igemm", "sm90_tma"], print)
            if "sm80_igemm" in r["ms"] and "sm90_tma" in r["ms"]:
                ratios.append(r["ms"]["sm90_tma"] / r["ms"]["sm80_igemm"])
            rows.append(r)
            cp.get_default_memory_pool().free_all_blocks()
        if ratios:
            geo = math.exp(sum(map(math.log, ratios)) / len(ratios))
            print(f"geomean sm80 speed relative to sm90_tma: {geo:.3f}x over {len(ratios)} shapes")
    if args.json:
        import json
        with open(args.json, "w") as f:
            json.dump({"device": dev.describe(), "rows": rows}, f, indent=1, default=str)
    return 0 if all("CHECK FAILED" not in " ".join(r["notes"]) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
