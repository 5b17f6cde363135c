"""First-call latency: a network's first forward pass from an empty kernel cache.

``python -m cuconv.bench.first_call [--network NAME] [--dtype DTYPE]`` runs, each in a fresh process
with its own empty ``CUCONV_CACHE_DIR``:

* ``as met``: every conv layer called once, in order; each new kernel variant compiles when its first
  layer runs;
* ``precompile``: a :func:`cuconv.plan_conv2d` plan per layer, :func:`cuconv.precompile` on them (the
  variants compile on a thread pool), then every layer once through its plan.

It prints the seconds from the moment the network's arrays exist to the end of the first pass (the
GPU synchronised), and how many distinct variants were compiled. Needs a GPU (exit 2 without one).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from typing import List, Optional

from .networks import NETWORKS

MODES = ("as met", "precompile")


def first_pass(network: str, dtype: str, precompile: bool) -> str:
    """One measurement in this process (its kernel cache must be empty): a line of results."""
    import cupy as cp

    import cuconv
    from .environment import np_dtype
    dt = np_dtype(dtype)
    layers = []
    for L in NETWORKS[network].layers:
        x = cp.zeros((L.N, L.H, L.W, L.C), dt)
        w = cp.zeros((L.K, L.R, L.S, L.C // L.groups), dt)
        layers.append((x, w, dict(stride=L.stride, padding=L.pad, dilation=L.dilation, groups=L.groups)))
    cp.cuda.Device().synchronize()
    start = time.perf_counter()
    variants = "-"
    if precompile:
        plans = [cuconv.plan_conv2d(x, w, **kw) for x, w, kw in layers]
        variants = cuconv.precompile(plans)
        for (x, w, _), plan in zip(layers, plans):
            plan(x, w)
    else:
        for x, w, kw in layers:
            cuconv.conv2d(x, w, **kw)
    cp.cuda.Device().synchronize()
    seconds = time.perf_counter() - start
    mode = MODES[precompile]
    return f"{network} {dtype} {mode:>10s}: first pass ready in {seconds:6.2f} s ({variants} variants precompiled)"


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m cuconv.bench.first_call", description=__doc__.split("\n\n")[0])
    ap.add_argument("--network", default="resnet50", choices=list(NETWORKS))
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    ap.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)  # one measurement, in a child process
    args = ap.parse_args(argv)
    if args.mode is not None:
        print(first_pass(args.network, args.dtype, args.mode == "precompile"), flush=True)
        return 0
    from .environment import EXIT_UNAVAILABLE, Unavailable, require_gpu
    try:
        require_gpu()
    except Unavailable as e:
        print(f"cuconv.bench.first_call: {e}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    print(f"{os.cpu_count()} CPUs; each mode in a fresh process with an empty kernel cache")
    for mode in MODES:
        with tempfile.TemporaryDirectory() as cache:
            env = dict(os.environ, CUCONV_CACHE_DIR=cache)
            rc = subprocess.run([sys.executable, "-m", "cuconv.bench.first_call", "--network", args.network,
                                 "--dtype", args.dtype, "--mode", mode], env=env).returncode
            if rc:
                return rc
    return 0


if __name__ == "__main__":
    sys.exit(main())
