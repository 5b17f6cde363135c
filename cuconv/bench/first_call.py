"""First-call latency: a network's first forward pass from an empty kernel cache.

``python -m cuconv.bench.first_call [--network NAME] [--dtype DTYPE]`` runs, each in a fresh process
with its own empty ``CUCONV_CACHE_DIR`` (and an empty ``CUPY_CACHE_DIR``: CuPy compiles its own kernels on
first use too):

* ``as met``: every conv layer called once, in order; each new kernel variant is read from the prebuilt
  store (:mod:`cuconv.prebuilt`) or compiled when its first layer runs;
* ``precompile``: a :func:`cuconv.plan_conv2d` plan per layer, :func:`cuconv.precompile` on them (the
  variants compile on a thread pool), then every layer once through its plan.

Where a prebuilt store is in use, both run again with it off (``CUCONV_PREBUILT=0``), so the table shows
what the store saves. Each line gives the seconds from the moment the network's arrays exist to the end of
the first pass (the GPU synchronised after each layer), the variants used and how many came from the
store and from NVRTC (the child's ``CUCONV_COMPILE_LOG``), then its slowest steps (``--slowest N``). Needs a
GPU (exit 2 without one), except with ``--kernels-only ARCH``: the kernels' half of the pass alone (each
layer's variants read from the store or compiled, for the model GPU of ``ARCH``), with no GPU.
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


def _line(network: str, dtype: str, precompile: bool, seconds: float, what: str) -> str:
    """A result line: the variants this process used and where they came from (its compile log)."""
    import json

    from cuconv import prebuilt
    store = "store" if prebuilt.open_store() is not None else "no store"
    mode = f"{MODES[precompile]}, {store}"
    via = {"cache": 0, "store": 0, "nvrtc": 0}
    log = os.environ.get("CUCONV_COMPILE_LOG")
    if log and os.path.exists(log):
        with open(log) as f:
            for line in f:
                via[json.loads(line)["via"]] += 1
    return (f"{network} {dtype} {mode:>22s}: {what} in {seconds:6.2f} s ({sum(via.values())} variants: "
            f"{via['store']} from the store, {via['nvrtc']} compiled by NVRTC)")


def first_pass(network: str, dtype: str, precompile: bool, slowest_steps: int = 3) -> str:
    """One measurement in this process (its kernel cache must be empty): a line of results, then the
    ``slowest_steps`` slowest steps of the pass (a layer's call, with the GPU synchronised after it; the
    plans; the precompile), each with the variants it brought in."""
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
    steps = []  # (seconds, what, variants logged meanwhile): where the first pass spends its time
    if precompile:
        plans = [cuconv.plan_conv2d(x, w, **kw) for x, w, kw in layers]
        _step(steps, "plans", start)
        cuconv.precompile(plans)
        _step(steps, "precompile", start)
        for (x, w, _), plan, L in zip(layers, plans, NETWORKS[network].layers):
            plan(x, w)
            cp.cuda.Device().synchronize()
            _step(steps, L.name, start)
    else:
        for (x, w, kw), L in zip(layers, NETWORKS[network].layers):
            cuconv.conv2d(x, w, **kw)
            cp.cuda.Device().synchronize()
            _step(steps, L.name, start)
    cp.cuda.Device().synchronize()
    line = _line(network, dtype, precompile, time.perf_counter() - start, "first pass ready")
    slowest = sorted(steps, key=lambda st: -st[0])[:slowest_steps]
    return line + "".join(f"\n    {sec:6.3f} s  {what} ({n} new variants)" for sec, what, n in slowest)


def _step(steps: list, what: str, start: float) -> None:
    """Append (seconds since the previous step, ``what``, variants the compile log gained meanwhile)."""
    now = time.perf_counter()
    log = os.environ.get("CUCONV_COMPILE_LOG")
    logged = 0
    if log and os.path.exists(log):
        with open(log) as f:
            logged = sum(1 for _ in f)
    done = sum(st[0] for st in steps)
    steps.append((now - start - done, what, logged - sum(st[2] for st in steps)))


def kernels_of_first_pass(network: str, dtype: str, precompile: bool, arch: str) -> str:
    """The kernel half of a first pass, with no GPU: the variants the network's layers load on the first
    model GPU of ``arch`` (:data:`cuconv.prebuilt.build.MODEL_DEVICES`), read from the store or compiled,
    layer by layer (or all at once through :func:`cuconv.precompile`); nothing is loaded or launched."""
    import cuconv
    from cuconv.compiler import compile_cuda
    from cuconv.dispatch import select
    from cuconv.precompile import call_jobs
    from cuconv.prebuilt.build import MODEL_DEVICES

    from .layer_ab import problem_of
    device = MODEL_DEVICES[arch][0]
    plans = [select(problem_of(L, dtype), device)[0] for L in NETWORKS[network].layers]
    start = time.perf_counter()
    if precompile:
        cuconv.precompile(plans)
    else:
        for plan in plans:
            for source, defines in call_jobs(plan):
                compile_cuda(source, arch, defines)
    return _line(network, dtype, precompile, time.perf_counter() - start, f"kernels for {device.name} ready")


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m cuconv.bench.first_call", description=__doc__.split("\n\n")[0])
    ap.add_argument("--network", default="resnet50", choices=list(NETWORKS))
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    ap.add_argument("--kernels-only", metavar="ARCH", choices=["sm_90a", "sm_80"],
                    help="no GPU: time only the kernels' half of the pass (read from the store or compiled) "
                         "for the model GPU of ARCH")
    ap.add_argument("--slowest", type=int, default=3, metavar="N",
                    help="list the N slowest steps of each first pass (default 3)")
    ap.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)  # one measurement, in a child process
    args = ap.parse_args(argv)
    if args.mode is not None:
        precompile = args.mode == "precompile"
        print(first_pass(args.network, args.dtype, precompile, args.slowest) if args.kernels_only is None else
              kernels_of_first_pass(args.network, args.dtype, precompile, args.kernels_only), flush=True)
        return 0
    if args.kernels_only is None:
        from .environment import EXIT_UNAVAILABLE, Unavailable, require_gpu
        try:
            require_gpu()
        except Unavailable as e:
            print(f"cuconv.bench.first_call: {e}", file=sys.stderr)
            return EXIT_UNAVAILABLE
    from .. import prebuilt
    from ..compiler import tree_hash
    store = prebuilt.open_store()
    print(f"{os.cpu_count()} CPUs; each mode in a fresh process with empty kernel caches (cuconv's, CuPy's); "
          + (store.describe(tree_hash("cu")) if store is not None else "no prebuilt store"))
    for store_env in ((None, "0") if store is not None else (None,)):
        for mode in MODES:
            with tempfile.TemporaryDirectory() as work:
                # a fresh environment: cuconv's kernel cache and CuPy's own (its elementwise kernels) empty;
                # the compile log says where each variant came from
                env = dict(os.environ, CUCONV_CACHE_DIR=os.path.join(work, "cuconv"),
                           CUPY_CACHE_DIR=os.path.join(work, "cupy"),
                           CUCONV_COMPILE_LOG=os.path.join(work, "compile.jsonl"))
                if store_env is not None:
                    env["CUCONV_PREBUILT"] = store_env
                cmd = [sys.executable, "-m", "cuconv.bench.first_call", "--network", args.network,
                       "--dtype", args.dtype, "--mode", mode, "--slowest", str(args.slowest)]
                if args.kernels_only is not None:
                    cmd += ["--kernels-only", args.kernels_only]
                rc = subprocess.run(cmd, env=env).returncode
                if rc:
                    return rc
    return 0


if __name__ == "__main__":
    sys.exit(main())
