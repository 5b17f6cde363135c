"""``python -m cuconv.demo``: one ResNet-50-sized convolution, on the GPU when there is one.

Prints the backend and kernel that ran (with ``cuconv.explain``), the time, and the relative error
against the float64 reference (checked on the first image, to keep the reference quick).
"""

from __future__ import annotations

import argparse
import time

import ml_dtypes
import numpy as np

import cuconv
from cuconv.device import gpu_available


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--batch", type=int, default=None, help="batch size (default 32 on a GPU, 8 on the CPU)")
    ap.add_argument("--cpu", action="store_true", help="run on the CPU even when a GPU is present")
    args = ap.parse_args(argv)
    on_gpu = gpu_available() and not args.cpu
    n = args.batch or (32 if on_gpu else 8)
    dtype = ml_dtypes.bfloat16 if on_gpu else np.float32
    rng = np.random.default_rng(0)
    # ResNet-50 conv3_x 3x3: 128 -> 128 channels at 28x28, padding 1, bias + ReLU fused.
    x = rng.standard_normal((n, 28, 28, 128)).astype(dtype)
    w = (rng.standard_normal((128, 3, 3, 128)) / np.sqrt(9 * 128)).astype(dtype)
    b = rng.standard_normal(128).astype(dtype)
    if on_gpu:
        import cupy as cp
        x, w, b = cp.asarray(x), cp.asarray(w), cp.asarray(b)
    print(cuconv.explain(x, w, b, padding=1, activation="relu"))
    y = cuconv.conv2d(x, w, b, padding=1, activation="relu")  # warm-up: compiles and caches the kernel
    reps = 10 if on_gpu else 1
    if on_gpu:
        cp.cuda.Device().synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        y = cuconv.conv2d(x, w, b, padding=1, activation="relu")
    if on_gpu:
        cp.cuda.Device().synchronize()
    dt = (time.perf_counter() - t0) / reps
    flops = 2 * n * 28 * 28 * 128 * 9 * 128
    ref = cuconv.reference.conv2d(x[:1], w, b, padding=1, activation="relu")
    got = (y[:1].get() if on_gpu else y[:1]).astype(np.float64)
    err = np.linalg.norm(got - ref) / np.linalg.norm(ref)
    print(f"backend: {'GPU (CuPy)' if on_gpu else 'CPU (NumPy)'}; dtype {np.dtype(dtype).name}; batch {n}")
    print(f"time: {dt * 1e3:.3f} ms per call ({flops / dt / 1e12:.2f} TFLOP/s)")
    print(f"relative error vs float64 reference (image 0): {err:.2e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
